"""The GPT-Neo decoder against Hugging Face's PyTorch GPTNeoForCausalLM, GPT-Neo's init, and causality of every
attention kind inside a model (the kinds themselves are tested against numpy in test_attention.py).

The reference model is built locally from a config with random weights (no downloads); its weights are copied into
the NeoMesh parameter tree and both models must produce the same logits in float32.
"""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from flax import nnx

import config
from convert import gpt_neo
from models.gpt_neo import GPTNeo
from tests import hf_fixtures
from tests.common import tiny_config

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
    return jax.tree.map(jnp.asarray, gpt_neo.params_from_hf(cfg, tensors))


def abstract(cfg):
    graphdef, state = nnx.split(nnx.eval_shape(lambda: GPTNeo(cfg, rngs=nnx.Rngs(0))))
    return graphdef, nnx.to_pure_dict(state)


def neomesh_logits(cfg, params, tokens):
    graphdef, shapes = abstract(cfg)
    assert jax.tree.map(lambda x: (x.shape, x.dtype), params) == jax.tree.map(lambda x: (x.shape, x.dtype), shapes)
    forward = jax.jit(lambda p, tok: nnx.merge(graphdef, nnx.State(p))(tok)[0])
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


# --- causality of every kind inside a model ----------------------------------------------------------------------


def random_params(cfg, seed=3):
    """Weights large enough that every layer matters (LayerNorm scales near 1)."""
    rng = np.random.default_rng(seed)
    _, shapes = abstract(cfg)
    return jax.tree_util.tree_map_with_path(
        lambda path, x: (path[-1].key == "scale") + 0.1 * rng.standard_normal(x.shape).astype(np.float32), shapes)


def logits_of(cfg, params, tokens):
    graphdef, _ = abstract(cfg)
    forward = jax.jit(lambda p, t: nnx.merge(graphdef, nnx.State(p))(t)[0])
    return np.asarray(forward(params, jnp.asarray(tokens)))


KIND_MODELS = {
    "global+memory": dict(attention_types=[[["global"], 2]], num_mem_kv=3),
    "local-blocked": dict(attention_types=[[["local"], 2]], local_attention_radius=4),
    "linear": dict(attention_types=[[["linear"], 2]]),
    "none": dict(attention_types=[[["none", "global"], 1]]),
    # Top-1 routing places tokens in order, so even with tokens dropped a later token never displaces an earlier.
    "experts-top1-dropping": dict(attention_types=[[["global"], 2]], moe_layers=[0, 1],
                                  moe_params={"num_experts": 4, "top_k": 1, "capacity_factor": 0.5}),
    "rotary-every-kind-glu-macaron": dict(n_layer=4, attention_types=[[["global", "local", "linear", "none"], 1]],
                                          rotary_emb=True, rotary_emb_fraction=0.5, num_mem_kv=2,
                                          local_attention_radius=4, mlp_glu=True, macaron=True),
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


def test_parameters_follow_the_options():
    cfg = tiny_config(n_layer=3, attention_types=[[["global", "none", "none"], 1]])

    def params_of(cfg):
        return abstract(cfg)[1]

    params = params_of(cfg)
    assert set(params["blocks"][0]) == {"attn", "ln_1", "ln_2", "mlp"}
    assert set(params["blocks"][1]) == set(params["blocks"][2]) == {"ln_2", "mlp"}  # none layers: no attention
    rotary = params_of(cfg.replace(rotary_emb=True))
    assert "wpe" in params and "wpe" not in rotary  # rotary replaces learned positions
    axial = params_of(cfg.replace(axial_pos_emb=[4, 8]))
    assert "wpe" not in axial and axial["axial_wpe"]["axial_wpe_1"].shape == (4, cfg.n_embd)
    memory = params_of(cfg.replace(num_mem_kv=5))
    assert memory["blocks"][0]["attn"]["mem_k"].shape == (5, cfg.n_head, cfg.head_dim)
    glu = params_of(cfg.replace(mlp_glu=True, d_ff=48))
    assert glu["blocks"][0]["mlp"]["c_gate"]["kernel"].shape == glu["blocks"][0]["mlp"]["c_fc"]["kernel"].shape \
        == (cfg.n_embd, 48)
    macaron = params_of(cfg.replace(macaron=True))
    assert set(macaron["blocks"][0]["mlp_macaron"]) == {"c_fc", "c_proj"}
    rezero = params_of(cfg.replace(rezero=True))
    assert set(rezero["blocks"][0]) == {"attn", "rezero_1", "rezero_2", "mlp"}
    assert set(params_of(cfg.replace(scalenorm=True))["blocks"][0]["ln_1"]) == {"g"}
    assert set(params_of(cfg.replace(norm="rmsnorm"))["blocks"][0]["ln_1"]) == {"scale"}


@pytest.mark.parametrize("kind", ["gpt2", "gpt_neo"])
@pytest.mark.parametrize("task", ["sequence_classification", "token_classification"])
def test_classifiers_import_and_export_with_hugging_face(kind, task, tmp_path):
    """GPT2/GPTNeo ForSequenceClassification (last real token, bias-free score) and ForTokenClassification load
    with their heads (they loaded as causal LMs, the classifier dropped without a word), match transformers on a
    right-padded batch, and export back as the same class, tensors unchanged."""
    import transformers
    from safetensors.numpy import load_file

    from convert.hf import export_params, load_hf
    from models import registry

    head = "ForSequenceClassification" if task == "sequence_classification" else "ForTokenClassification"
    vocab = hf_fixtures.VOCAB
    if kind == "gpt2":
        hf_cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                         num_labels=3, pad_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                                         attn_pdrop=0.0)
        reference = getattr(transformers, "GPT2" + head)
    else:
        hf_cfg = transformers.GPTNeoConfig(vocab_size=vocab, max_position_embeddings=32, hidden_size=32, num_layers=2,
                                           num_heads=4, attention_types=[[["global", "local"], 1]], window_size=4,
                                           num_labels=3, pad_token_id=0, resid_dropout=0.0, embed_dropout=0.0,
                                           attention_dropout=0.0)
        reference = getattr(transformers, "GPTNeo" + head)
    hf_cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = reference(hf_cfg).eval()
    hf_fixtures.randomize(model)
    model.save_pretrained(str(tmp_path / "in"))
    cfg, params = load_hf(str(tmp_path / "in"))
    assert (cfg.model, cfg.task, cfg.num_labels) == (kind, task, 3)
    lengths = np.array([12, 7])
    tokens = np.random.default_rng(0).integers(1, vocab, (2, 12))
    mask = (np.arange(12)[None] < lengths[:, None]).astype(np.int64)
    tokens = np.where(mask == 1, tokens, 0)  # padded with pad_token_id, as transformers finds the last token
    with torch.no_grad():
        want = model(torch.from_numpy(tokens), attention_mask=torch.from_numpy(mask)).logits.numpy()
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: registry.build(cfg, nnx.Rngs(0))))
    got = np.asarray(nnx.merge(graphdef, nnx.State(jax.tree.map(jnp.asarray, params)))(
        jnp.asarray(tokens, jnp.int32), segment_ids=jnp.asarray(mask, jnp.int32))[0])
    real = mask == 1 if task == "token_classification" else slice(None)
    assert got.shape == want.shape
    np.testing.assert_allclose(got[real], want[real], atol=1e-4, rtol=0)
    (tmp_path / "tokenizer").mkdir()
    hf_fixtures.tokenizer().save(str(tmp_path / "tokenizer/tokenizer.json"))  # pads with end-of-text
    export_params(cfg, params, str(tmp_path / "out"), str(tmp_path / "tokenizer"))
    original = load_file(str(tmp_path / "in/model.safetensors"))
    exported = load_file(str(tmp_path / "out/model.safetensors"))
    unused = {k for k in original if k.endswith((".attn.bias", ".attn.masked_bias", ".attention.bias"))}
    assert set(original) - unused == set(exported)
    for name in exported:
        assert np.array_equal(original[name], exported[name]), name
    again = transformers.AutoConfig.from_pretrained(str(tmp_path / "out"))
    assert again.architectures == [reference.__name__] and again.num_labels == 3
    # with the end-of-text id as pad_token_id, transformers would pool the token before a row's end-of-text
    assert again.pad_token_id is None


def test_a_gpt2_multi_label_classifier_imports_and_exports_as_one(tmp_path):
    """GPT2ForSequenceClassification with problem_type multi_label_classification: the same import path as a BERT's
    makes it multi_label, with transformers' logits; export writes the problem_type back."""
    import json

    import transformers

    from convert.hf import export_params, load_hf
    from models import registry

    hf_cfg = transformers.GPT2Config(vocab_size=hf_fixtures.VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                     num_labels=3, pad_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     problem_type="multi_label_classification")
    hf_cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.GPT2ForSequenceClassification(hf_cfg).eval()
    hf_fixtures.randomize(model)
    model.save_pretrained(str(tmp_path / "in"))
    cfg, params = load_hf(str(tmp_path / "in"))
    assert (cfg.task, cfg.num_labels, cfg.multi_label) == ("sequence_classification", 3, True)
    mask = (np.arange(12)[None] < np.array([12, 5])[:, None]).astype(np.int64)
    tokens = np.where(mask == 1, np.random.default_rng(1).integers(1, hf_fixtures.VOCAB, (2, 12)), 0)
    with torch.no_grad():
        want = model(torch.from_numpy(tokens), attention_mask=torch.from_numpy(mask)).logits.numpy()
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: registry.build(cfg, nnx.Rngs(0))))
    got = np.asarray(nnx.merge(graphdef, nnx.State(jax.tree.map(jnp.asarray, params)))(
        jnp.asarray(tokens, jnp.int32), segment_ids=jnp.asarray(mask, jnp.int32))[0])
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    export_params(cfg, params, str(tmp_path / "out"))
    assert json.loads((tmp_path / "out" / "config.json").read_text())["problem_type"] == "multi_label_classification"


def test_weights_of_another_shape_than_config_json_are_one_line(tmp_path):
    """config.json edited (or weights copied from another model): the mapping's reshape was a ValueError traceback."""
    import json

    from config import ConfigError
    from convert.hf import load_hf

    path = hf_fixtures.save(hf_fixtures.gpt_neo(n_embd=64, n_head=2), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_size": 48}))
    with pytest.raises(ConfigError, match=rf"^{path}: the weights do not have the shapes its config.json gives "
                       r"\(n_embd 48, n_head 2, n_layer 2\): cannot reshape"):
        load_hf(path)
