"""Parameter-efficient fine-tuning (training/peft/): LoRA, prefixes, adapters, the trainable filter, adapter-only
files, merged export, and the custom attention hook, on tiny models."""

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from config import ConfigError, from_dict
from models import registry
from models.attention import Attention
from models.layers import over_flat_positions
from models.spec import AttentionSpec
from parallel.layout import Layout
from parallel.mesh import make_mesh
from parallel.state import create_train_state, path_name
from parallel.steps import batch_shapes, batch_shardings, make_train_step
from tests.common import random_batches, tiny_config
from training.objectives import objective_for
from training.optimizer import learning_rate_schedule, make_optimizer
from training.peft import apply_peft, build_model, trainable_filter
from training.peft.hooks import alibi_attention, set_attention_fn
from training.peft.lora import merge, unmerge
from training.peft.weights import export_merged, load_adapter, merged_params, save_adapter

EVERY_PROJECTION = {"targets": ["q", "k", "v", "out", "c_fc", "c_proj"], "rank": 4, "alpha": 8.0}
TRAINED = {"lora": {"targets": ["q", "v", "c_fc"], "rank": 4, "dropout": 0.1}, "prefix": {"length": 3, "hidden": 16},
           "adapter": {"size": 8, "after": ["mlp"]}}


def params_of(model):
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def flat(params):
    return {path_name(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(params)[0]}


TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 128, (2, 32)), jnp.int32)


@pytest.mark.parametrize("peft, message", [
    ({"lora": {"rnk": 4}}, "peft.lora: unknown key 'rnk'; did you mean 'peft.lora.rank'?"),
    ({"lorra": {}}, "peft: unknown key 'lorra'; did you mean 'peft.lora'?"),
    ({"lora": {"rank": 0}}, "peft.lora.rank: 0 is outside its range"),
    ({"lora": {"dropout": 1.0}}, "peft.lora.dropout: 1 drops every input, so LoRA would learn nothing"),
    ({"trainable": ["biass"]}, "did you mean 'bias'?"),
    ({"checkpoint": "some"}, "peft.checkpoint: \"some\" is not one of all, trainable"),
])
def test_peft_config_errors_name_the_sub_key(peft, message):
    with pytest.raises(ConfigError) as e:
        from_dict({"peft": peft})
    assert message in str(e.value) and "\n" not in str(e.value)


def test_lora_target_that_matches_nothing_suggests_the_closest_projection():
    model = nnx.eval_shape(lambda: registry.build(tiny_config(), nnx.Rngs(0)))  # abstract: nothing to compute
    with pytest.raises(ConfigError, match="'qq' matches no projection; did you mean 'q'"):
        apply_peft(model, {"lora": {"targets": ["qq"]}})
    # a path pattern: the closest path outside the blocks (a ViT's head is 'classifier', a BERT's 'classifier/out')
    vit = nnx.eval_shape(lambda: registry.build(tiny_config(model="vit", image_size=8, patch_size=2, num_channels=1,
                                                            n_ctx=17, attention_types=None), nnx.Rngs(0)))
    with pytest.raises(ConfigError, match=r"'classifier/out' matches no projection; did you mean 'classifier'\? "
                       r"\(outside the blocks: classifier, patch_embed; in every block: c_fc, c_proj, k, out, q, v\)"):
        apply_peft(vit, {"lora": {"targets": ["classifier/out"]}})


def test_lora_rank_above_a_projections_input_width_is_one_line_naming_it():
    """Rank 1000 on a 64-wide model is a full update with more parameters (it was accepted); a rank above the
    classes of a head it adapts is fine: only the input width bounds it."""
    model = nnx.eval_shape(lambda: registry.build(tiny_config(), nnx.Rngs(0)))
    with pytest.raises(ConfigError, match="peft.lora.rank: 1000 is larger than blocks/0/attn/q's input width 64"):
        apply_peft(model, {"lora": {"rank": 1000}})
    with pytest.raises(ConfigError, match="blocks/0/mlp/c_proj's input width 256"):
        apply_peft(model, {"lora": {"targets": ["c_proj"], "rank": 257}})
    apply_peft(model, {"lora": {"targets": ["c_proj"], "rank": 256}})
    classifier = nnx.eval_shape(lambda: registry.build(tiny_config(task="sequence_classification", num_labels=2),
                                                       nnx.Rngs(0)))
    apply_peft(classifier, {"lora": {"targets": ["score/out"], "rank": 8}})  # (64, 2): rank 8 > 2 classes


def test_fresh_lora_and_adapters_equal_the_base_and_merged_equals_unmerged():
    base = registry.build(tiny_config(), nnx.Rngs(0))
    model = apply_peft(registry.build(tiny_config(), nnx.Rngs(0)), {"lora": EVERY_PROJECTION, "adapter": {}}, 1)
    call = nnx.jit(lambda m: m(TOKENS)[0])
    reference = np.asarray(call(base))
    np.testing.assert_array_equal(call(model), reference)  # B = 0 and up = 0: exactly the base
    names = flat(params_of(model))
    assert names["blocks/0/attn/q/lora_a"].shape == (64, 4) and names["blocks/0/attn/q/lora_b"].shape == (4, 4, 16)
    assert names["blocks/1/mlp/c_proj/lora_a"].shape == (256, 4) and "blocks/1/mlp_adapter/down/kernel" in names
    for path, module in nnx.iter_graph(model):
        if hasattr(module, "lora_b"):
            module.lora_b[...] = 0.2 * jax.random.normal(jax.random.key(len(path)), module.lora_b.shape)
    kernel = np.asarray(model.blocks[0].attn.q.kernel[...])
    unmerged = np.asarray(call(model))
    assert np.abs(unmerged - reference).max() > 1e-2  # the updates matter
    merged = np.asarray(call(merge(model)))
    np.testing.assert_allclose(merged, unmerged, atol=2e-5, rtol=0)
    assert np.abs(np.asarray(model.blocks[0].attn.q.kernel[...]) - kernel).max() > 1e-3  # really in the kernel
    unmerge(model)
    np.testing.assert_allclose(np.asarray(model.blocks[0].attn.q.kernel[...]), kernel, atol=1e-6, rtol=0)


def test_lora_factors_shard_like_their_weight_with_the_rank_whole():
    from parallel.state import abstract_model, param_shardings

    cfg = tiny_config(peft={"lora": EVERY_PROJECTION})
    layout = Layout.from_config(make_mesh("x:4,y:2"), "batch:x,heads:y,embd:x")
    _, abstract, logical = abstract_model(lambda rngs: build_model(cfg, rngs))
    specs = {path_name(p): tuple(s.spec) for p, s in jax.tree_util.tree_flatten_with_path(
        param_shardings(layout, abstract, logical))[0]}
    assert specs["blocks/0/attn/q/kernel"] == ("x", "y", None)
    assert specs["blocks/0/attn/q/lora_a"] == ("x", None) and specs["blocks/0/attn/q/lora_b"] == (None, "y", None)
    assert specs["blocks/0/attn/out/lora_a"] == ("y", None, None) and specs["blocks/0/attn/out/lora_b"] == (None, "x")


def train(cfg, batches, mesh_shape, layout, devices=None):
    """(initial parameters as numpy, final state, per-step losses) of ``cfg`` with its peft setting."""
    layout = Layout.from_config(make_mesh(mesh_shape, devices), layout)
    tx, objective, trainable = make_optimizer(cfg), objective_for(cfg), trainable_filter(cfg.peft_settings)
    graphdef, state, shardings = create_train_state(lambda rngs: build_model(cfg, rngs), tx, layout, cfg.seed,
                                                    trainable=trainable)
    first = jax.device_get(state.params)
    data = batch_shardings(layout, objective, batch_shapes(objective, cfg, cfg.train_batch_size))
    step = make_train_step(graphdef, objective, tx, learning_rate_schedule(cfg), layout, shardings, data,
                           precision=cfg.precision, seed=cfg.seed, trainable=trainable)
    losses = []
    for batch in batches:
        state, metrics = step(state, jax.device_put(batch, data))
        losses.append(float(metrics["loss"]))
    return first, state, losses


@pytest.fixture(scope="module")
def one_device_run():
    cfg = tiny_config(warmup_steps=0, lr=1e-2, num_mem_kv=2, n_layer=1, attention_types=None, peft=TRAINED)
    batches = random_batches(cfg, 1) * 3  # one batch thrice: the loss must fall
    return cfg, batches, train(cfg, batches, "x:1", "batch:x", jax.devices()[:1])


def test_only_adapter_parameters_change_and_only_they_have_optimizer_state(one_device_run):
    cfg, _, (first, state, losses) = one_device_run
    before, after = flat(first), flat(jax.device_get(state.params))
    trains = trainable_filter(cfg.peft_settings)
    trained = sorted(n for n in before if trains(n))
    assert trained and all("lora_" in n or "/prefix/" in n or "_adapter/" in n for n in trained)
    for name in before:
        if trains(name):
            assert not np.array_equal(before[name], after[name]), name
        else:
            np.testing.assert_array_equal(before[name], after[name], err_msg=name)  # frozen: bit-identical
    slots = {path_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(state.opt_state)[0]}
    moments = {name for name in slots if ".mu/" in name or "mu/" in name.split("inner_state")[-1]}
    assert moments and all(trains(name.split("mu/", 1)[1]) for name in moments), sorted(moments)[:3]
    n_opt = sum(x.size for x in jax.tree.leaves(state.opt_state))
    assert n_opt < 2.1 * sum(before[n].size for n in trained) + 100  # two Adam moments of the trained ones only
    assert losses[-1] < losses[0]


def test_lora_and_prefixes_sharded_over_8_devices_equal_one_device(one_device_run):
    cfg, batches, (_, single, losses) = one_device_run
    _, sharded, sharded_losses = train(cfg, batches, "x:4,y:2", "batch:x,heads:y,embd:y")
    np.testing.assert_allclose(sharded_losses, losses, rtol=0, atol=1e-5)
    for name, value in flat(jax.device_get(single.params)).items():
        np.testing.assert_allclose(flat(jax.device_get(sharded.params))[name], value, atol=2e-5, rtol=0,
                                   err_msg=name)


def test_prefix_cached_decoding_equals_full_recomputation():
    cfg = tiny_config(n_layer=2, attention_types=[[["global", "local"], 1]], local_attention_radius=4,
                      num_mem_kv=2, peft={"prefix": {"length": 3}})
    model = build_model(cfg, nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    call = jax.jit(lambda params, tokens, cache: nnx.merge(graphdef, params)(tokens, cache=cache))
    rng = np.random.default_rng(0)
    lengths, new = [5, 9], 8
    width = max(lengths)
    rows = rng.integers(1, cfg.n_vocab, (2, width + new))
    pad = np.array([width - n for n in lengths], np.int32)
    prompts = np.stack([np.concatenate([np.zeros(p, int), r[:n]]) for p, r, n in zip(pad, rows, lengths)])
    logits, cache = call(params, jnp.asarray(prompts), model.init_cache(2, width + new, jnp.asarray(pad)))
    got = [[np.asarray(logits[b, -1])] for b in range(2)]
    for i in range(new - 1):
        logits, cache = call(params, jnp.asarray([[r[n + i]] for r, n in zip(rows, lengths)]), cache)
        for b in range(2):
            got[b].append(np.asarray(logits[b, 0]))
    full = np.asarray(call(params, jnp.asarray(rows), None)[0])  # causal: a longer row predicts the same
    for b, n in enumerate(lengths):
        np.testing.assert_allclose(np.stack(got[b]), full[b, n - 1:n + new - 1], atol=2e-5, rtol=0)
    without = registry.build(tiny_config(**{k: getattr(cfg, k) for k in ("attention_types", "local_attention_radius",
                                                                         "num_mem_kv")}), nnx.Rngs(0))
    logits = nnx.jit(lambda model: model(TOKENS)[0])
    assert np.abs(np.asarray(logits(without)) - np.asarray(logits(model))).max() > 1e-4  # prefixes matter


def test_adapter_file_round_trip_and_merged_export(tmp_path):
    from convert.hf import load_hf

    cfg = tiny_config(model="gpt2", attention_types=None, peft={"lora": EVERY_PROJECTION})
    model = build_model(cfg, nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    params = nnx.to_pure_dict(state)
    params = jax.tree_util.tree_map_with_path(
        lambda p, v: v + 0.1 * jax.random.normal(jax.random.key(3), v.shape) if "lora_b" in path_name(p) else v, params)
    names = save_adapter(str(tmp_path / "adapter.safetensors"), params, cfg.peft)
    assert names and all("lora_" in n for n in names)  # the base weights stay out of the file
    with pytest.raises(ConfigError, match="save_adapter: settings name adapter, but params hold no adapter"):
        save_adapter(str(tmp_path / "none.safetensors"), params, {"adapter": {}})  # it wrote an empty file
    with pytest.raises(ConfigError, match=f"{tmp_path}: cannot write the adapter file"):  # a SafetensorError
        save_adapter(str(tmp_path), params, cfg.peft)
    fresh = nnx.to_pure_dict(state)
    restored = load_adapter(str(tmp_path / "adapter.safetensors"), fresh)
    for name, value in flat(params).items():
        np.testing.assert_array_equal(flat(restored)[name], value, err_msg=name)
    logits = nnx.merge(graphdef, nnx.State(params))(TOKENS)[0]
    base_cfg = cfg.replace(peft=None)
    merged = merged_params(graphdef, params)
    assert not any("lora" in n for n in flat(merged))
    export_merged(cfg, graphdef, params, str(tmp_path / "hf"))
    hf_cfg, hf_params = load_hf(str(tmp_path / "hf"))
    assert hf_cfg.model == "gpt2" and hf_cfg.n_embd == cfg.n_embd
    base_graph, _ = nnx.split(registry.build(base_cfg, nnx.Rngs(0)))
    exported = nnx.merge(base_graph, nnx.State(jax.tree.map(jnp.asarray, hf_params)))(TOKENS)[0]
    np.testing.assert_allclose(exported, logits, atol=5e-5, rtol=0)



def test_a_model_with_a_custom_attention_does_not_export_without_it():
    """The exported Hugging Face directory computed with its family's own attention: ALiBi was dropped without a
    word (logits off by 1e-2 on a tiny GPT-2)."""
    model = registry.build(tiny_config(model="gpt2"), nnx.Rngs(0))
    set_attention_fn(model, alibi_attention, layers=[1])
    graphdef, state = nnx.split(model)
    with pytest.raises(ConfigError, match=r"^merge: blocks/1/attn computes with a custom attention function "
                                          r"\(alibi_attention\), which base weights cannot hold; "
                                          r"set_attention_fn\(model, None\) first"):
        merged_params(graphdef, nnx.to_pure_dict(state))
    set_attention_fn(model, None)
    graphdef, state = nnx.split(model)
    assert merged_params(graphdef, nnx.to_pure_dict(state))

def test_an_adapter_file_loaded_into_a_model_of_another_alpha_is_one_line_not_another_update(tmp_path):
    """Saved from the model, an adapter file records each LoRA's scale (alpha / rank): loaded into a model whose
    LoRA has the same shapes but another alpha (the factors would compute another update, without a word), or is
    merged into its kernel, it is a one-line error; into the same setting it gives the saved model's outputs."""
    from training.peft.lora import lora_modules

    def tuned(alpha):
        model = build_model(tiny_config(peft={"lora": {"rank": 4, "alpha": alpha}}), nnx.Rngs(0))
        for _, m in lora_modules(model):
            m.lora_b[...] = 0.1 * jax.random.normal(jax.random.key(3), m.lora_b.shape)
        return model

    model = tuned(8.0)
    file = str(tmp_path / "adapter.safetensors")
    save_adapter(file, model, {"lora": {}})
    fresh = build_model(tiny_config(peft={"lora": {"rank": 4, "alpha": 8.0}}), nnx.Rngs(0))  # B still 0
    assert np.abs(np.asarray(fresh(TOKENS)[0]) - np.asarray(model(TOKENS)[0])).max() > 1e-3
    assert load_adapter(file, fresh) is fresh
    np.testing.assert_array_equal(np.asarray(fresh(TOKENS)[0]), np.asarray(model(TOKENS)[0]))
    other = build_model(tiny_config(peft={"lora": {"rank": 4, "alpha": 16.0}}), nnx.Rngs(0))
    with pytest.raises(ConfigError) as e:
        load_adapter(file, other)
    assert str(e.value) == (f"{file}: blocks/0/attn/q's LoRA was saved with scale alpha/rank 2, the model's is 4; "
                            "apply_peft with the alpha and rank it was trained with")
    with pytest.raises(ConfigError, match="blocks/0/attn/q's LoRA is merged into its kernel; load the factors"):
        load_adapter(file, merge(tuned(8.0)))


def test_bitfit_trains_biases_and_the_head_only():
    trains = trainable_filter(from_dict({"peft": {"bitfit": True}})[0].peft_settings)
    assert trains("blocks/0/attn/out/bias") and trains("blocks/1/ln_2/bias") and trains("score/out/kernel")
    assert not trains("blocks/0/attn/q/kernel") and not trains("wte/embedding")


def test_custom_attention_hook_adds_exactly_the_alibi_bias():
    spec = AttentionSpec(kind="global", causal=True, n_embd=32, n_head=4, head_dim=8, scale=8 ** -0.5)
    attn = Attention(spec, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (2, 12, 32))
    positions = jnp.broadcast_to(jnp.arange(12)[None], (2, 12))
    plain = np.asarray(attn(x, positions)[0])
    set_attention_fn(attn, alibi_attention)
    hooked = np.asarray(attn(x, positions)[0])
    # Reference in numpy: softmax(scale q.k - slope_h (i - j)) v over the causal keys, then the output projection.
    q, k, v = (np.asarray(over_flat_positions(p, x)) for p in (attn.q, attn.k, attn.v))  # (B, T, N, H)
    slopes = 2.0 ** (-8.0 * np.arange(1, 5) / 4)
    i, j = np.arange(12)[:, None], np.arange(12)[None, :]
    logits = np.einsum("btnh,bsnh->bnts", q, k) * 8 ** -0.5 - slopes[:, None, None] * (i - j)
    logits = np.where(j <= i, logits, -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    expected = np.asarray(over_flat_positions(attn.out, jnp.asarray(np.einsum("bnts,bsnh->btnh", probs, v)), 2))
    np.testing.assert_allclose(hooked, expected, atol=2e-5, rtol=0)
    assert np.abs(hooked - plain).max() > 1e-3


def test_attention_hook_on_chosen_layers_of_a_model():
    cfg = tiny_config()
    base = registry.build(cfg, nnx.Rngs(0))
    model = registry.build(cfg, nnx.Rngs(0))
    assert set_attention_fn(model, alibi_attention, layers=[1]) == ["blocks/1/attn"]
    assert model.blocks[0].attn.attention_fn is None
    assert np.abs(np.asarray(model(TOKENS)[0]) - np.asarray(base(TOKENS)[0])).max() > 1e-4
    set_attention_fn(model, None)
    np.testing.assert_array_equal(model(TOKENS)[0], base(TOKENS)[0])
    with pytest.raises(ConfigError, match="attention_fn: 'alibi' is not a function"):  # it failed only when run
        set_attention_fn(model, "alibi")
    with pytest.raises(ConfigError, match=r"^attention_fn: two_inputs\(q, k\) cannot be called as the layers call "
                                          r"attention, fn\(q, k, v, causal=\.\.\."):  # their TypeError, on first run
        set_attention_fn(model, two_inputs)
    set_attention_fn(model, lambda q, k, v, **options: v)  # what it does not use, it takes as **options


def test_a_configs_attention_fn_builds_the_model_set_attention_fn_makes_and_does_not_export(tmp_path):
    """A custom attention was reachable only from Python (set_attention_fn), so train.py could not train with one:
    the config's attention_fn names it, every entry point's build_model puts it in (scanned layers too), and the
    export a Hugging Face family would compute without it is refused."""
    from convert.hf import export_params

    for layers, scan in ((None, False), ([1], False), ([1], True)):
        cfg = tiny_config(attention_fn="training.peft.hooks:alibi_attention", attention_fn_layers=layers,
                          scan_layers=scan)
        by_hand = registry.build(cfg, nnx.Rngs(0))
        set_attention_fn(by_hand, alibi_attention, layers)
        np.testing.assert_allclose(build_model(cfg, nnx.Rngs(0))(TOKENS)[0], by_hand(TOKENS)[0], atol=1e-6, rtol=0)
    with pytest.raises(ConfigError, match=r"^export: attention_fn training\.peft\.hooks:alibi_attention: Hugging "
                                          r"Face's gpt_neo computes with its built-in attention"):
        export_params(cfg, params_of(by_hand), str(tmp_path / "hf"))
    for changes, message in (
            (dict(attention_fn="alibi"), r"attention_fn: \"alibi\" is not 'module:function'"),
            (dict(attention_fn="a.b:c", attention_fn_layers=[2]), r"attention_fn_layers: 2 is not a block number "
                                                                  r"\(0 to 1\)"),
            (dict(attention_fn_layers=[0]), "attention_fn_layers: chooses the layers of attention_fn, which is null")):
        with pytest.raises(ConfigError, match="^" + message):
            tiny_config(**changes)
    for name, message in (("no_such_module:f", r"cannot import no_such_module \(No module named"),
                          ("training.peft.hooks:alibi", "training.peft.hooks has no alibi$")):
        with pytest.raises(ConfigError, match=rf"^attention_fn: {name}: {message}"):
            build_model(tiny_config(attention_fn=name), nnx.Rngs(0))


def two_inputs(q, k):
    return q


def test_a_custom_attention_of_the_wrong_shape_or_layers_is_one_line_naming_it():
    model = registry.build(tiny_config(), nnx.Rngs(0))
    with pytest.raises(ConfigError, match=r"^attention_fn: layers \[5\]: no softmax self-attention layer there "
                                          r"\(this model's are blocks 0, 1\)"):  # block 0 was hooked, 5 ignored
        set_attention_fn(model, alibi_attention, layers=[0, 5])
    assert model.blocks[0].attn.attention_fn is None

    def one_feature(q, k, v, **options):  # (B, T, N, 1) broadcast through the output projection, silently
        return alibi_attention(q, k, v, **options)[..., :1]

    def with_weights(q, k, v, **options):  # Hugging Face's attention functions return (output, weights)
        return alibi_attention(q, k, v, **options), None

    def rounded(q, k, v, **options):  # an integer array passed on into the output projection
        return jnp.round(alibi_attention(q, k, v, **options)).astype(jnp.int32)

    for fn, got in ((one_feature, r"shape \(2, 32, 4, 1\)"), (with_weights, "a tuple"), (rounded, "an array of int32")):
        set_attention_fn(model, fn)
        with pytest.raises(ConfigError, match=rf"^attention_fn: {fn.__name__} returned {got}, not the "
                                              r"\(B, T, N, H\) = \(2, 32, 4, 16\) float array"):
            model(TOKENS)


def test_a_custom_attention_computed_in_float32_is_cast_back_to_the_compute_dtype():
    """Softmax in float32 for stability under bfloat16 compute carried float32 on through the output projection and
    the residual stream; the result is cast back, as softmax_attention casts its own."""
    from models.attention import checked_attention_output

    q = jnp.zeros((2, 8, 4, 16), jnp.bfloat16)
    assert checked_attention_output(alibi_attention, q.astype(jnp.float32), q).dtype == jnp.bfloat16


def test_a_part_the_model_already_holds_is_refused_not_replaced():
    """apply_peft on a loaded peft model (Pretrained.from_pretrained of a prefix-tuned run, say) naming a part it
    already has: a second prefix or adapter silently replaced the trained one; LoRA again said 'q' matches no
    projection. New parts still plug in beside the old."""
    model = nnx.eval_shape(lambda: build_model(tiny_config(peft=TRAINED), nnx.Rngs(0)))
    for part, message in [({"lora": {}}, "peft.lora: blocks/0/attn/q already has LoRA factors"),
                          ({"prefix": {}}, "peft.prefix: blocks/0/attn already has a prefix"),
                          ({"adapter": {}}, "peft.adapter: blocks/0 already has adapters")]:
        with pytest.raises(ConfigError, match=message):
            apply_peft(model, part)
    apply_peft(model, {"lora": {"targets": ["k"]}})  # not adapted yet
    assert type(model.blocks[0].attn.k).__name__ == "LoraEinsum"


@pytest.mark.e2e
def test_lora_fine_tuning_of_a_hugging_face_gpt2_as_the_readme_shows(tmp_path, monkeypatch):
    """The README's commands on a tiny local GPT-2: LoRA fine-tuning from --init-from on a text file with
    configs/finetune_lora_gpt2.json (checkpoints hold the LoRA factors only), a resume, merged export; the run
    loads as predict.py loads it (base weights from init_from) and gives the merged export's logits."""
    import neomesh.paths
    import torch
    import transformers
    from pydoc_data.topics import topics

    from pretrained import Pretrained
    from tests import hf_fixtures
    from tests.common import metrics_rows, run_command

    monkeypatch.setattr(neomesh.paths, "work_root", lambda: str(tmp_path))  # data_cache/ under tmp_path
    gpt2 = hf_fixtures.save(hf_fixtures.gpt2(n_embd=32, n_head=2, n_layer=2, n_ctx=64), tmp_path / "gpt2")
    text = tmp_path / "my_text.txt"
    text.write_text("\n".join(topics[k] for k in sorted(topics)[:12]))
    run = tmp_path / "lora_run"
    train = ["train.py", "--config", "configs/finetune_lora_gpt2.json", "--init-from", gpt2, "--data", str(text),
             "--model-path", str(run), "--no-progress", "--set", "train_steps=2", "--set", "eval_steps=1",
             "--set", "sample_tokens=0"]
    first = run_command(*train, "--stop-at-step", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "the model's shape is" in first.stdout and "n_embd 32" in first.stdout
    assert "parameters train" in first.stdout and "frozen" in first.stdout  # the peft line
    second = run_command(*train)  # resumes: the base from --init-from, the LoRA factors from the checkpoint
    assert second.returncode == 0 and "resumed from" in second.stdout, second.stderr[-3000:]
    assert [r["step"] for r in metrics_rows(str(run))] == [1, 2]
    assert metrics_rows(str(run), "eval")[0]["loss"] > 0
    export = run_command("-m", "convert", "export", str(run), str(tmp_path / "merged"))
    assert export.returncode == 0, export.stderr[-3000:]
    tokens = np.arange(1, 17)[None]
    tuned = Pretrained.from_pretrained(str(run))
    ours = np.asarray(tuned({"inputs": tokens, "segment_ids": np.ones_like(tokens)}))
    merged = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "merged")).eval()
    with torch.no_grad():
        theirs = merged(torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)
    lora_b = flat(tuned.params)["blocks/0/attn/q/lora_b"]
    assert np.abs(lora_b).max() > 0  # the factors trained (B starts at zero)


@pytest.mark.e2e
def test_a_trained_only_run_whose_base_was_swapped_for_another_is_one_line_everywhere(tmp_path, monkeypatch, capsys):
    """A LoRA run that checkpoints only its factors records which model its init_from was; another model of the same
    shape put at that path (it fit, and outputs moved without a word) is one line on resume, in predict.py,
    Pretrained and export. The original put back works again, and a run without the record (older) still loads."""
    import json
    import shutil

    import neomesh.paths
    import predict
    import torch
    import train
    from pydoc_data.topics import topics

    from convert.__main__ import main as convert_main
    from pretrained import Pretrained
    from tests import hf_fixtures
    from tests.common import ROOT
    from training.base_identity import FILE

    monkeypatch.setattr(neomesh.paths, "work_root", lambda: str(tmp_path))  # data_cache/ under tmp_path
    original = hf_fixtures.gpt2(n_embd=32, n_head=2, n_layer=2, n_ctx=64)
    base = hf_fixtures.save(original, tmp_path / "gpt2")
    text = tmp_path / "my_text.txt"
    text.write_text("\n".join(topics[k] for k in sorted(topics)[:12]))
    run = str(tmp_path / "lora_run")
    training = ["--config", os.path.join(ROOT, "configs/finetune_lora_gpt2.json"), "--init-from", base, "--data",
                str(text), "--model-path", run, "--no-progress", "--set", "train_steps=2", "--set", "eval_steps=0",
                "--set", "sample_tokens=0"]
    assert train.main(training + ["--stop-at-step", "1"]) == 0, capsys.readouterr().err[-3000:]
    assert sorted(json.loads(open(f"{run}/{FILE}").read())["fingerprint"]["files"]) == ["config.json",
                                                                                     "model.safetensors"]
    tokens = {"inputs": np.arange(1, 17)[None], "segment_ids": np.ones((1, 16), np.int32)}
    logits = np.asarray(Pretrained.from_pretrained(run)(tokens))

    other = hf_fixtures.gpt2(n_embd=32, n_head=2, n_layer=2, n_ctx=64)  # the same shape, one weight moved
    with torch.no_grad():
        other.transformer.h[0].mlp.c_fc.weight.add_(0.1)
    shutil.rmtree(base)
    hf_fixtures.save(other, tmp_path / "gpt2")
    swapped = (f"init_from {base}: not the model the run in {run} started from (model.safetensors has other "
               "contents), and its checkpoints hold only the trained parameters")
    capsys.readouterr()
    for main, argv in ((train.main, training), (predict.main, ["--model-path", run, "--prompt", "def "]),
                       (convert_main, ["export", run, str(tmp_path / "merged")])):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {swapped}") and err.count("\n") == 1, err
        assert "put the original back there" in err
    assert not os.path.exists(tmp_path / "merged")
    with pytest.raises(ConfigError, match=f"^{re.escape(swapped)}"):
        Pretrained.from_pretrained(run)

    shutil.rmtree(base)
    hf_fixtures.save(original, tmp_path / "gpt2")  # put back: the same files again
    np.testing.assert_array_equal(np.asarray(Pretrained.from_pretrained(run)(tokens)), logits)
    assert train.main(training) == 0 and "resumed from" in capsys.readouterr().out
    os.remove(f"{run}/{FILE}")  # a run from before the record was kept: read unchecked, as then
    assert np.asarray(Pretrained.from_pretrained(run)(tokens)).shape == logits.shape
    assert train.main(training + ["--set", "train_steps=3"]) == 0  # resumes, saying it cannot check the base
    assert "records no fingerprint of its init_from" in capsys.readouterr().out


def test_a_trained_only_run_whose_base_model_is_gone_is_one_line_naming_the_run(tmp_path):
    """A LoRA run that checkpoints only its factors reads the rest from init_from again (predict.py, export): a
    base moved or deleted since is an error naming the run and why that model is read, not a bare 'no such
    directory' about a path the user never typed in this command."""
    from pretrained import _with_base, default_layout
    from parallel.state import sharded_abstract_params, split_params

    gone = str(tmp_path / "gpt2_moved")
    cfg = tiny_config(model="gpt2", attention_types=None, peft={"lora": {}, "checkpoint": "trainable"},
                      init_from=gone)
    make_model = lambda rngs: build_model(cfg, rngs)  # noqa: E731
    _, abstract = sharded_abstract_params(make_model, default_layout())
    trained = split_params(abstract, trainable_filter(cfg.peft_settings))[0]
    with pytest.raises(ConfigError) as e:
        _with_base(cfg, make_model, abstract, trained, "runs/lora_gpt2")
    message = str(e.value)
    assert message.startswith("runs/lora_gpt2 holds only its trained parameters (peft checkpoint 'trainable')")
    assert f"init_from {gone}: no such directory" in message and "\n" not in message


@pytest.mark.parametrize("model", ["bert", "gpt_neo"])
def test_token_classification_with_an_mlp_head_on_any_backbone(model):
    from training.objectives import objective_for

    extra = {"causal": False} if model == "bert" else {}
    cfg = tiny_config(model=model, task="token_classification", num_labels=5, head_hidden=[16], attention_types=None,
                      n_layer=1, peft={"lora": {"targets": ["q", "v"]}}, **extra)
    net = build_model(cfg, nnx.Rngs(0))
    labels = np.where(np.arange(32) % 4 == 3, -1, np.arange(32) % 5)[None].repeat(2, 0)  # -1: does not count
    batch = {"inputs": TOKENS, "segment_ids": jnp.ones_like(TOKENS).at[1, 20:].set(0), "labels": jnp.asarray(labels)}
    objective = objective_for(cfg)
    losses, metrics = objective(net, batch)
    weights = np.asarray(objective.weights(batch))
    assert losses.shape == (2, 32) and metrics["accuracy"].shape == (2, 32) and np.isfinite(losses).all()
    assert weights[0].sum() == 24 and weights[1].sum() == 15  # ignored labels and padding weigh nothing
    names = flat(params_of(net))
    assert names["token_classifier/mlp/layers/1/kernel"].shape == (16, 5)  # the MLP head: D -> 16 -> 5
    trains = trainable_filter(cfg.peft_settings)
    assert trains("token_classifier/mlp/layers/0/kernel") and not trains("blocks/0/mlp/c_fc/kernel")


def test_lora_dropout_draws_from_the_block_scope_and_only_in_training():
    from models.layers import dropout_scope, projection
    from training.peft.lora import LoraEinsum

    base = projection("BTD,DF->BTF", (8, 6), ("embd", "intermediate_expanded"), 0.1, nnx.Rngs(0))
    lora = LoraEinsum(base, 2, 4.0, 0.5, 0, rngs=nnx.Rngs(1))
    lora.lora_b[...] = jnp.ones((2, 6))
    x = jax.random.normal(jax.random.key(2), (1, 4, 8))
    plain = np.asarray(lora(x))  # no scope: not training, no dropout
    expected = np.asarray(base(x)) + 2.0 * np.asarray(x) @ np.asarray(lora.lora_a[...]) @ np.ones((2, 6))
    np.testing.assert_allclose(plain, expected, atol=1e-5, rtol=0)
    with dropout_scope(jax.random.key(3)):
        first, again = np.asarray(lora(x)), np.asarray(lora(x))
    with dropout_scope(jax.random.key(4)):
        other = np.asarray(lora(x))
    assert not np.allclose(first, plain) and np.array_equal(first, again) and not np.allclose(first, other)


def test_lora_with_scan_layers_keeps_parameters_per_layer_and_trains_as_unrolled():
    cfg = tiny_config(warmup_steps=0, lr=1e-2, n_layer=2, attention_types=[[["global", "local"], 1]],
                      peft={"lora": {"targets": ["q", "v"], "rank": 4}})
    batches = random_batches(cfg, 2)
    _, unrolled, losses = train(cfg, batches, "x:1", "batch:x", jax.devices()[:1])
    _, scanned, scanned_losses = train(cfg.replace(scan_layers=True), batches, "x:1", "batch:x", jax.devices()[:1])
    np.testing.assert_allclose(scanned_losses, losses, rtol=0, atol=1e-5)
    assert jax.tree.structure(scanned.params) == jax.tree.structure(unrolled.params)  # a filter may pick one layer
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=2e-5), jax.device_get(scanned.params),
                 jax.device_get(unrolled.params))


def test_export_of_a_prefix_or_adapter_run_is_one_line_naming_the_export(tmp_path, monkeypatch):
    """It said 'merge: blocks/0/attn/prefix/... belongs to a prefix or an adapter', a step the user never named;
    and it said so only after restoring the weights (minutes for a big run): now from the checkpoint's config."""
    from convert.hf import export_hf
    from training.checkpoint import Checkpoints

    run = tmp_path / "run"
    cfg = tiny_config(peft={"prefix": {"length": 2}, "adapter": {}}, model_path=str(run))
    layout = Layout.from_config(make_mesh("x:1", jax.devices()[:1]), "batch:x")
    _, state, _ = create_train_state(lambda rngs: build_model(cfg, rngs), make_optimizer(cfg), layout, cfg.seed)
    with Checkpoints(str(run), cfg.keep_checkpoints) as checkpoints:
        checkpoints.save(0, state, cfg.to_dict())

    def restore(*args, **kwargs):
        raise AssertionError("the weights were restored")

    monkeypatch.setattr(Checkpoints, "restore_params_verified", restore)
    with pytest.raises(ConfigError, match=f"^export: {run} trains peft.prefix and peft.adapter, which change the "
                                          "computation rather than a weight"):
        export_hf(str(run), str(tmp_path / "hf"))
    assert not (tmp_path / "hf").exists()
