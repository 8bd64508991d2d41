"""The GPT-Neo decoder against Hugging Face's PyTorch GPTNeoForCausalLM, plus attention and init checks (causality
of every attention kind is tested in test_attention_kinds.py).

The reference model is built locally from a config with random weights (no downloads); its weights are copied into
the NeoMesh parameter tree and both models must produce the same logits in float32.
"""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from flax import nnx

import config
from models import attention, hf
from tests import hf_fixtures
from models.gpt_neo import GPTNeo

import torch  # noqa: F401  (test requirement: the reference implementation)


def make_cfg(**kw):
    base = dict(n_ctx=64, n_embd=64, n_head=2, n_layer=2, n_vocab=97, local_attention_radius=8,
                attention_types=[[["global", "local"], 1]], activation_function="gelu", no_weight_tie=False)
    base.update(kw)
    cfg, _ = config.from_dict(base)
    return cfg


def hf_model(cfg):
    """A randomly initialised GPTNeoForCausalLM with the same shape and semantics as ``cfg``, in eval mode."""
    model = hf_fixtures.gpt_neo(n_embd=cfg.n_embd, n_head=cfg.n_head, n_layer=cfg.n_layer, n_ctx=cfg.n_ctx,
                                window=cfg.local_attention_radius,
                                attention_types=cfg.attention_types or [[["global"], cfg.n_layer]],
                                tied=not cfg.no_weight_tie, vocab=cfg.n_vocab)
    assert (model.lm_head.weight is model.transformer.wte.weight) == (not cfg.no_weight_tie)
    return model


def hf_to_neomesh(model, cfg):
    """The library's import mapping applied to the live torch model's weights."""
    tensors = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    return jax.tree.map(jnp.asarray, hf.params_from_hf(cfg, model.config.to_dict(), tensors))


def abstract(cfg):
    graphdef, state = nnx.split(nnx.eval_shape(lambda: GPTNeo(cfg, rngs=nnx.Rngs(0))))
    return graphdef, nnx.to_pure_dict(state)


def neomesh_logits(cfg, params, tokens):
    graphdef, shapes = abstract(cfg)
    assert jax.tree.map(lambda x: (x.shape, x.dtype), params) == jax.tree.map(lambda x: (x.shape, x.dtype), shapes)
    forward = jax.jit(lambda p, tok: nnx.merge(graphdef, nnx.State(p))(tok))
    return np.asarray(forward(params, jnp.asarray(tokens)))


PARITY_CONFIGS = {
    "longer-than-window": dict(n_ctx=64, local_attention_radius=8, attention_types=[[["global", "local"], 1]],
                               seq=40),
    "global-local-x2-untied": dict(n_layer=4, attention_types=[[["global", "local"], 2]], no_weight_tie=True,
                                   seq=32),
    "local-then-global-8-heads": dict(n_layer=3, n_head=8, attention_types=[[["local"], 1], [["global"], 2]],
                                      local_attention_radius=5, seq=24),
    "8-heads-untied-all-global": dict(n_head=8, attention_types=None, no_weight_tie=True, seq=64),
}


@pytest.mark.parametrize("name", list(PARITY_CONFIGS))
def test_logits_match_hugging_face(name):
    kw = dict(PARITY_CONFIGS[name])
    seq = kw.pop("seq")
    cfg = make_cfg(**kw)
    reference = hf_model(cfg)
    tokens = np.random.default_rng(0).integers(0, cfg.n_vocab, size=(2, seq))
    with torch.no_grad():
        want = reference(torch.from_numpy(tokens)).logits.numpy()
    got = neomesh_logits(cfg, hf_to_neomesh(reference, cfg), tokens)
    assert got.shape == want.shape == (2, seq, cfg.n_vocab)
    diff = float(np.max(np.abs(got - want)))
    print(f"{name}: max abs logit diff {diff:.3g}")
    assert diff <= 1e-4, f"{name}: max abs logit diff {diff}"


# --- attention against plain numpy -----------------------------------------------------------------------------


def numpy_mask(t, s, window):
    """GPT-Neo's mask: queries are the last t of s positions; causal, and a local layer keeps the last window."""
    i = np.arange(t)[:, None] + (s - t)
    j = np.arange(s)[None, :]
    return (j <= i) & ((window is None) | (i - j < (window or 0)))


def numpy_attention(q, k, v, window):
    """Unscaled causal softmax attention, (B,T,N,H) x (B,S,N,H) x (B,S,N,H) -> (B,T,N,H), in float64."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    logits = np.einsum("btnh,bsnh->bnts", q, k)
    logits = np.where(numpy_mask(q.shape[1], k.shape[1], window), logits, -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("bnts,bsnh->btnh", probs, v)


def random_qkv(b=2, t=11, n=3, h=8, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.normal(size=(b, t, n, h)).astype(np.float32) for _ in range(3))


@pytest.mark.parametrize("t,s", [(1, 1), (7, 7), (3, 9), (1, 9)])
@pytest.mark.parametrize("window", [None, 1, 3, 8, 20])
def test_attention_mask_matches_numpy(t, s, window):
    np.testing.assert_array_equal(np.asarray(attention.attention_mask(t, s, window)), numpy_mask(t, s, window))


def test_attention_mask_is_gpt_neo_local_band():
    # Hugging Face GPT-Neo: tril(ones) xor tril(ones, -window), i.e. query i sees keys i-window+1 .. i.
    full = np.tril(np.ones((10, 10), bool))
    np.testing.assert_array_equal(np.asarray(attention.attention_mask(10, 10, 4)), full ^ np.tril(full, -4))
    np.testing.assert_array_equal(np.asarray(attention.attention_mask(10, 10, None)), full)


@pytest.mark.parametrize("window", [None, 3])
def test_dot_product_attention_matches_numpy(window):
    q, k, v = random_qkv()
    got = np.asarray(attention.dot_product_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), window))
    np.testing.assert_allclose(got, numpy_attention(q, k, v, window), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 3])
def test_explicit_attention_path_matches_numpy(window, monkeypatch):
    """The materialised-probabilities path (taken for attention dropout) computes the same attention once the
    dropout itself is taken out."""
    monkeypatch.setattr(attention, "dropout", lambda rate, x, key: x)
    q, k, v = random_qkv(seed=1)
    got = np.asarray(attention.dot_product_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), window,
                                                     dropout_rate=0.5, dropout_key=jax.random.key(0)))
    np.testing.assert_allclose(got, numpy_attention(q, k, v, window), atol=1e-5, rtol=1e-5)


def test_attention_is_not_scaled():
    # One query, two keys: with unscaled logits the weights are softmax(q.k) exactly.
    q = np.zeros((1, 2, 1, 4), np.float32)
    q[0, 1, 0] = [1.0, 1.0, 1.0, 1.0]
    k = np.zeros((1, 2, 1, 4), np.float32)
    k[0, 0, 0] = [1.0, 0.0, 0.0, 0.0]
    v = np.eye(2, 4, dtype=np.float32).reshape(1, 2, 1, 4)
    out = np.asarray(attention.dot_product_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), None))
    e = np.exp(1.0)
    np.testing.assert_allclose(out[0, 1, 0, :2], [e / (e + 1), 1 / (e + 1)], rtol=1e-6)


# --- init statistics ---------------------------------------------------------------------------------------------


def within(x, target, rel=0.05):
    std = float(np.std(np.asarray(x)))
    assert abs(std - target) <= rel * target, f"std {std} vs target {target}"


@pytest.mark.parametrize("scale_by_depth", [True, False])
def test_init_follows_gpt_neo(scale_by_depth):
    n_embd, n_head, n_layer = 256, 4, 2
    cfg = make_cfg(n_ctx=128, n_embd=n_embd, n_head=n_head, n_layer=n_layer, n_vocab=512,
                   attention_types=[[["global", "local"], 1]], scale_by_depth=scale_by_depth, no_weight_tie=True)
    params = nnx.to_pure_dict(nnx.state(GPTNeo(cfg, rngs=nnx.Rngs(0))))
    head_dim = n_embd // n_head
    block = params["blocks"][1]
    within(block["attn"]["q"]["kernel"], (n_embd * head_dim) ** -0.5)
    within(block["attn"]["k"]["kernel"], n_embd ** -0.5)
    within(block["attn"]["v"]["kernel"], n_embd ** -0.5)
    within(block["attn"]["out"]["kernel"], (n_head * head_dim) ** -0.5)
    within(block["mlp"]["c_fc"]["kernel"], 0.02)
    within(block["mlp"]["c_proj"]["kernel"], 0.02 / np.sqrt(n_layer) if scale_by_depth else 0.02)
    within(params["wte"]["embedding"], 0.02)
    within(params["wpe"]["embedding"], 0.01)
    within(params["lm_head"]["kernel"], 0.02)
    np.testing.assert_array_equal(block["attn"]["out"]["bias"], 0.0)
    for name in ("c_fc", "c_proj"):
        np.testing.assert_array_equal(block["mlp"][name]["bias"], 0.0)
    for norm in (block["ln_1"], block["ln_2"], params["ln_f"]):
        np.testing.assert_array_equal(norm["scale"], 1.0)
        np.testing.assert_array_equal(norm["bias"], 0.0)
    # Layers are initialised independently.
    assert not np.allclose(params["blocks"][0]["attn"]["q"]["kernel"], block["attn"]["q"]["kernel"])
