"""Attention kinds against plain numpy: linear attention, blocked local attention, memory key/values, rotary,
causality of every kind inside a model, and the kernel choice."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from flax import nnx

from config import ConfigError
from models import attention
from models.gpt_neo import GPTNeo
from models.linear_attention import causal_linear_attention
from models.rotary import apply_rotary
from tests.common import tiny_config
from tests.test_model import numpy_attention, numpy_mask, random_qkv


def numpy_linear_attention(q, k, v, eps=1e-6):
    """GPT-Neo's linear attention written as the quadratic sum it factorises: w[t, s] = softmax(q_t) . exp(k_s)
    for s <= t, out_t = sum_s w[t, s] v_s / (sum_s w[t, s] + eps), in float64."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    q = np.exp(q - q.max(-1, keepdims=True))
    q /= q.sum(-1, keepdims=True)
    weights = np.einsum("btnh,bsnh->bnts", q, np.exp(k)) * np.tril(np.ones((q.shape[1], k.shape[1])))
    # The running key sum carries eps in every feature; softmax(q) sums to 1, so the normaliser gains eps.
    return np.einsum("bnts,bsnh->btnh", weights, v) / (weights.sum(-1) + eps).transpose(0, 2, 1)[..., None]


def test_linear_attention_equals_quadratic_reference():
    q, k, v = random_qkv(t=13)
    got = np.asarray(causal_linear_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)))
    np.testing.assert_allclose(got, numpy_linear_attention(q, k, v), atol=1e-5, rtol=1e-5)


def test_linear_attention_has_no_quadratic_matrix():
    t, h = 512, 8
    q = jnp.zeros((1, t, 2, h))
    jaxpr = jax.make_jaxpr(causal_linear_attention)(q, q, q)
    largest = max(np.prod(v.aval.shape) for eqn in jaxpr.eqns for v in eqn.outvars)
    assert largest == t * 2 * h * h  # the running k (x) v sums, O(T H^2), and nothing with T x T


@pytest.mark.parametrize("t,window", [(16, 4), (13, 4), (10, 1), (7, 9), (32, 8), (40, 3)])
def test_blocked_local_equals_unblocked_and_band_masked_global(t, window):
    q, k, v = (jnp.asarray(x) for x in random_qkv(t=t, seed=t + window))
    attend = jax.jit(attention.dot_product_attention, static_argnums=3, static_argnames="blocked")
    blocked = attend(q, k, v, window, blocked=True)
    unblocked = attend(q, k, v, window, blocked=False)
    band = jax.jit(jax.nn.dot_product_attention)(q, k, v, mask=attention.attention_mask(t, t, window)[None, None],
                                                 scale=1.0)
    np.testing.assert_allclose(np.asarray(blocked), np.asarray(unblocked), atol=1e-6, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(unblocked), np.asarray(band), atol=1e-6, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(blocked), numpy_attention(q, k, v, window), atol=1e-5, rtol=1e-5)


def test_blocked_local_dropout_path(monkeypatch):
    """Training with attn_dropout takes the blocked path with materialised probabilities; with the dropout itself
    taken out it computes the same attention, and with it in it really drops."""
    q, k, v = (jnp.asarray(x) for x in random_qkv(t=16, seed=5))

    def attend():  # traced afresh after the monkeypatch
        return np.asarray(jax.jit(lambda q, k, v: attention.dot_product_attention(
            q, k, v, 4, 0.5, jax.random.key(0), blocked=True))(q, k, v))

    dropped = attend()
    assert not np.allclose(dropped, numpy_attention(q, k, v, 4), atol=1e-3)
    monkeypatch.setattr(attention, "dropout", lambda rate, x, key: x)
    kept = attend()
    np.testing.assert_allclose(kept, numpy_attention(q, k, v, 4), atol=1e-5, rtol=1e-5)


def test_long_local_layers_never_build_the_full_matrix():
    t, window = 1024, 32
    q = jnp.zeros((1, t, 1, 8))
    jaxpr = jax.make_jaxpr(lambda q: attention.dot_product_attention(q, q, q, window))(q)  # automatic choice
    largest = max(np.prod(v.aval.shape) for eqn in jaxpr.eqns for v in eqn.outvars)
    assert largest <= t * 2 * window, largest  # O(T x window), while the full matrix would be T x T
    full = jax.make_jaxpr(lambda q: attention.dot_product_attention(q, q, q, window, blocked=False))(q)
    assert max(np.prod(v.aval.shape) for eqn in full.eqns for v in eqn.outvars) >= t * t  # the check can fail


def test_memory_key_values_are_seen_by_every_query():
    q, k, v = random_qkv(t=9, seed=2)
    mem_k, mem_v = random_qkv(b=1, t=3, seed=3)[:2]
    mem_k, mem_v = np.repeat(mem_k, 2, 0), np.repeat(mem_v, 2, 0)
    keys, values = np.concatenate([mem_k, k], 1), np.concatenate([mem_v, v], 1)
    got = attention.dot_product_attention(jnp.asarray(q), jnp.asarray(keys), jnp.asarray(values), None)
    # Reference: softmax over the 3 memory slots plus the causal keys, written out position by position.
    want = np.zeros_like(q, dtype=np.float64)
    for t in range(9):
        visible = np.r_[0:3, 3:3 + t + 1]
        logits = np.einsum("bnh,bsnh->bns", q[:, t], keys[:, visible])
        p = np.exp(logits - logits.max(-1, keepdims=True))
        want[:, t] = np.einsum("bns,bsnh->bnh", p / p.sum(-1, keepdims=True), values[:, visible])
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)
    assert numpy_mask(9, 12, None)[0, :3].all()


def numpy_rotary(x, positions, rotary_dim):
    """GPT-J's apply_rotary_pos_emb: interleaved pairs (2i, 2i+1) rotated by position / 10000^(2i/rotary_dim)."""
    x = np.asarray(x, np.float64).copy()
    freqs = 10000.0 ** -(np.arange(0, rotary_dim, 2) / rotary_dim)
    angle = positions[:, :, None, None] * freqs  # (B, T, 1, R/2)
    even, odd = x[..., 0:rotary_dim:2].copy(), x[..., 1:rotary_dim:2].copy()
    x[..., 0:rotary_dim:2] = even * np.cos(angle) - odd * np.sin(angle)
    x[..., 1:rotary_dim:2] = odd * np.cos(angle) + even * np.sin(angle)
    return x


@pytest.mark.parametrize("rotary_dim", [8, 4, 2])
def test_rotary_matches_gpt_j_and_is_relative(rotary_dim):
    q, k, _ = random_qkv(t=6, seed=4)
    positions = np.broadcast_to(np.arange(6), (2, 6))
    got = np.asarray(apply_rotary(jnp.asarray(q), jnp.asarray(positions), rotary_dim))
    np.testing.assert_allclose(got, numpy_rotary(q, positions, rotary_dim), atol=1e-5)
    np.testing.assert_array_equal(got[..., rotary_dim:], q[..., rotary_dim:])  # the rest passes through
    # Attention logits depend only on the distance between positions: shifting both by 11 changes nothing.
    rq, rk = (np.asarray(apply_rotary(jnp.asarray(x), jnp.asarray(positions + s), rotary_dim))
              for x, s in ((q, 0), (k, 0)))
    sq, sk = (np.asarray(apply_rotary(jnp.asarray(x), jnp.asarray(positions + 11), rotary_dim)) for x in (q, k))
    np.testing.assert_allclose(np.einsum("btnh,bsnh->bnts", rq, rk), np.einsum("btnh,bsnh->bnts", sq, sk),
                               atol=1e-4)
    assert not np.allclose(got, q, atol=1e-3)


def random_params(cfg, seed=3):
    """Weights large enough that every layer matters (LayerNorm scales near 1)."""
    rng = np.random.default_rng(seed)
    shapes = nnx.to_pure_dict(nnx.state(nnx.eval_shape(lambda: GPTNeo(cfg, rngs=nnx.Rngs(0)))))
    return jax.tree_util.tree_map_with_path(
        lambda path, x: (path[-1].key == "scale") + 0.1 * rng.standard_normal(x.shape).astype(np.float32), shapes)


def logits_of(cfg, params, tokens):
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: GPTNeo(cfg, rngs=nnx.Rngs(0))))
    forward = jax.jit(lambda p, t: nnx.capture(nnx.merge(graphdef, nnx.State(p)), nnx.Intermediate)(t)[0])
    return np.asarray(forward(params, jnp.asarray(tokens)))


KIND_MODELS = {
    "global": dict(attention_types=[[["global"], 2]]),
    "global+memory": dict(attention_types=[[["global"], 2]], num_mem_kv=3),
    "local-blocked": dict(attention_types=[[["local"], 2]], local_attention_radius=4),
    "linear": dict(attention_types=[[["linear"], 2]]),
    "none": dict(attention_types=[[["none", "global"], 1]]),
    # Top-1 routing places tokens in order, so even with tokens dropped a later token never displaces an earlier.
    "experts-top1-dropping": dict(attention_types=[[["global"], 2]], moe_layers=[0, 1],
                                  moe_params={"num_experts": 4, "top_k": 1, "capacity_factor": 0.5}),
    "rotary-every-kind": dict(n_layer=4, attention_types=[[["global", "local", "linear", "none"], 1]],
                              rotary_emb=True, rotary_emb_fraction=0.5, num_mem_kv=2, local_attention_radius=4),
}


@pytest.mark.parametrize("name", list(KIND_MODELS))
def test_future_tokens_never_change_past_logits(name):
    cfg = tiny_config(**KIND_MODELS[name])
    params = random_params(cfg)
    seq, changed_at = 24, (0, 7, 23)
    tokens = np.random.default_rng(1).integers(0, cfg.n_vocab, size=(1, seq))
    batch = np.repeat(tokens, 1 + len(changed_at), axis=0)  # row 0 unchanged, row r+1 changed at changed_at[r]
    for r, t in enumerate(changed_at):
        batch[r + 1, t] = (batch[r + 1, t] + 1) % cfg.n_vocab
    logits = logits_of(cfg, params, batch)
    for r, t in enumerate(changed_at):
        np.testing.assert_array_equal(logits[r + 1, :t], logits[0, :t])
        assert np.abs(logits[r + 1, t:] - logits[0, t:]).max() > 1e-6  # the change is seen from position t on
    if name != "none" and changed_at[1] + 1 < seq:  # attention carries the change to later positions
        assert np.abs(logits[2, changed_at[1] + 1:] - logits[0, changed_at[1] + 1:]).max() > 1e-6


def test_none_layers_have_no_attention_parameters():
    cfg = tiny_config(n_layer=3, attention_types=[[["global", "none", "none"], 1]])
    def params_of(cfg):
        return nnx.to_pure_dict(nnx.state(nnx.eval_shape(lambda: GPTNeo(cfg, rngs=nnx.Rngs(0)))))

    params = params_of(cfg)
    assert set(params["blocks"][0]) == {"attn", "ln_1", "ln_2", "mlp"}
    assert set(params["blocks"][1]) == set(params["blocks"][2]) == {"ln_2", "mlp"}
    rotary = params_of(cfg.replace(rotary_emb=True))
    assert "wpe" in params and "wpe" not in rotary  # rotary replaces learned positions
    memory = params_of(cfg.replace(num_mem_kv=5))
    assert memory["blocks"][0]["attn"]["mem_k"].shape == (5, cfg.n_head, cfg.head_dim)


def test_kernel_choice():
    bf16, f32 = jnp.bfloat16, jnp.float32
    assert attention.choose_kernel("auto", "gpu", bf16, 64) == "cudnn"
    assert attention.choose_kernel("auto", "gpu", bf16, 128) == "cudnn"
    assert attention.choose_kernel("cudnn", "gpu", jnp.float16, 64) == "cudnn"
    assert attention.choose_kernel("xla", "gpu", bf16, 64) == "xla"
    for platform, dtype, head_dim in [("cpu", bf16, 64), ("tpu", bf16, 64), ("gpu", f32, 64), ("gpu", bf16, 60),
                                      ("gpu", bf16, 256)]:
        assert attention.choose_kernel("auto", platform, dtype, head_dim) == "xla"
        with pytest.raises(ConfigError, match="attention_kernel: 'cudnn' cannot run here"):
            attention.choose_kernel("cudnn", platform, dtype, head_dim)
    assert attention.choose_kernel("auto", "gpu", bf16, 64, explicit_mask=True) == "xla"
    with pytest.raises(ConfigError, match="the platform is cpu, not a CUDA GPU; the compute dtype is float32"):
        GPTNeo(tiny_config(attention_kernel="cudnn"), rngs=nnx.Rngs(0))  # forced where it cannot run: at start-up
