"""LoRA on mixture-of-experts layers: per-expert factors beside the router and expert weights (their paths
unchanged), a fresh model equal to its base, merge exact, split over experts like the weights, adapter files."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from config import ConfigError
from models import registry
from parallel.state import path_name
from tests.common import random_batches, tiny_config, train_step_for
from training.peft import apply_peft, build_model, trainable_filter
from training.peft.lora import merge, unmerge
from training.peft.weights import load_adapter, save_adapter

EXPERTS = {"targets": ["q", "router", "w_in", "w_out"], "rank": 4, "alpha": 8.0}
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 128, (2, 32)), jnp.int32)


def moe_config(**changes):
    return tiny_config(**{"moe_layers": [1], "moe_params": {"num_experts": 4, "top_k": 2, "capacity_factor": 2.0},
                          **changes})


def flat(model_or_params) -> dict[str, np.ndarray]:
    params = model_or_params
    if isinstance(params, nnx.Module):
        params = nnx.to_pure_dict(nnx.state(params, nnx.Param))
    return {path_name(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(params)[0]}


def randomise_lora_b(model, seed: int = 0):
    """Nonzero B factors: a LoRA that changes the model, as after training."""
    for i, (path, m) in enumerate(nnx.iter_graph(model)):
        if hasattr(m, "lora_b"):
            m.lora_b[...] = 0.3 * jax.random.normal(jax.random.key(seed + i), m.lora_b.shape)
    return model


def test_fresh_expert_lora_equals_the_base_and_merged_equals_unmerged():
    base = registry.build(moe_config(), nnx.Rngs(0))
    model = apply_peft(registry.build(moe_config(), nnx.Rngs(0)), {"lora": EXPERTS}, 1)
    call = nnx.jit(lambda m: m(TOKENS)[0])
    reference = np.asarray(call(base))
    np.testing.assert_array_equal(call(model), reference)  # B = 0: exactly the base
    names = flat(model)
    assert {n for n in flat(base)} <= set(names)  # the base weights keep their paths (checkpoints, conversions)
    shapes = {n: v.shape for n, v in names.items() if "/mlp/" in n and "lora" in n}
    assert shapes == {"blocks/1/mlp/w_in_lora/lora_a": (4, 64, 4), "blocks/1/mlp/w_in_lora/lora_b": (4, 4, 256),
                      "blocks/1/mlp/w_out_lora/lora_a": (4, 256, 4), "blocks/1/mlp/w_out_lora/lora_b": (4, 4, 64),
                      "blocks/1/mlp/router_lora/lora_a": (64, 4), "blocks/1/mlp/router_lora/lora_b": (4, 4)}
    experts = model.blocks[1].mlp
    assert experts.w_in_lora.lora_a.get_metadata()["logical_axes"] == ("experts", "embd", "lora_rank")
    assert experts.w_out_lora.lora_b.get_metadata()["logical_axes"] == ("experts", "lora_rank", "embd")
    w_in, router = np.asarray(experts.w_in[...]), np.asarray(experts.router[...])
    unmerged = np.asarray(call(randomise_lora_b(model)))
    assert np.abs(unmerged - reference).max() > 1e-2  # the updates matter
    merged = np.asarray(call(merge(model)))
    np.testing.assert_allclose(merged, unmerged, atol=2e-5, rtol=0)
    assert np.abs(np.asarray(experts.w_in[...]) - w_in).max() > 1e-3  # really in the weights
    assert np.abs(np.asarray(experts.router[...]) - router).max() > 1e-3
    unmerge(model)
    np.testing.assert_allclose(np.asarray(experts.w_in[...]), w_in, atol=1e-6, rtol=0)
    np.testing.assert_allclose(np.asarray(call(model)), unmerged, atol=2e-5, rtol=0)


def test_each_expert_gets_its_own_update():
    """Expert e's weight moves by scale * A[e] B[e] and by nothing of another expert's factors."""
    model = randomise_lora_b(apply_peft(registry.build(moe_config(), nnx.Rngs(0)),
                                        {"lora": {"targets": ["w_in"], "rank": 2, "alpha": 4.0}}, 1))
    lora = model.blocks[1].mlp.w_in_lora
    a, b = np.asarray(lora.lora_a[...]), np.asarray(lora.lora_b[...])  # (E, D, R), (E, R, F)
    want = np.stack([2.0 * a[e] @ b[e] for e in range(4)])  # scale = alpha / rank
    np.testing.assert_allclose(np.asarray(lora.update()), want, atol=1e-5, rtol=0)


def test_expert_targets_on_a_model_without_experts_are_one_line_naming_the_target():
    model = nnx.eval_shape(lambda: registry.build(tiny_config(), nnx.Rngs(0)))
    with pytest.raises(ConfigError) as e:
        apply_peft(model, {"lora": {"targets": ["q", "w_in"]}})
    assert str(e.value) == ("peft.lora.targets: 'w_in' is a mixture-of-experts weight, and this model has no "
                            "moe_layers (projections: c_fc, c_proj, k, out, q, v)")
    moe = nnx.eval_shape(lambda: registry.build(moe_config(), nnx.Rngs(0)))
    with pytest.raises(ConfigError, match=r"^peft.lora.targets: 'w_inn' matches no projection; did you mean 'w_in'"):
        apply_peft(moe, {"lora": {"targets": ["w_inn"]}})
    with pytest.raises(ConfigError, match=r"\(projections: c_fc, c_proj, k, out, q, v; mixture-of-experts weights: "
                       r"router, w_in, w_out\)$"):
        apply_peft(moe, {"lora": {"targets": ["zzz"]}})
    with pytest.raises(ConfigError, match="peft.lora.rank: 65 is larger than blocks/1/mlp/w_in's input width 64"):
        apply_peft(moe, {"lora": {"targets": ["w_in"], "rank": 65}})
    apply_peft(moe, {"lora": {"targets": ["c_proj", "w_out"], "rank": 256}})  # their input is d_ff: 256
    with pytest.raises(ConfigError, match="blocks/1/mlp/w_out already has LoRA factors"):
        apply_peft(moe, {"lora": {"targets": ["w_out"]}})


def test_merging_loras_of_a_weight_the_layers_share_is_one_line_not_a_sum():
    """With share_parameters the MoE layers use one set of experts but each layer trains its own factors: merging
    added both layers' updates into the one weight (outputs changed without a word)."""
    cfg = moe_config(share_parameters=True, attention_types=None, moe_layers=[0, 1])
    model = randomise_lora_b(apply_peft(registry.build(cfg, nnx.Rngs(0)), {"lora": {"targets": ["w_in"]}}, 1))
    assert model.blocks[0].mlp.w_in is model.blocks[1].mlp.w_in
    before = np.asarray(model.blocks[0].mlp.w_in[...])
    with pytest.raises(ConfigError, match="^merge: blocks/1/mlp/w_in_lora and blocks/0/mlp/w_in_lora adapt one shared "
                       "weight"):
        merge(model)
    np.testing.assert_array_equal(np.asarray(model.blocks[0].mlp.w_in[...]), before)  # nothing half-merged

def test_c_fc_and_c_proj_still_adapt_the_dense_layers_only():
    model = apply_peft(nnx.eval_shape(lambda: registry.build(moe_config(), nnx.Rngs(0))),
                       {"lora": {"targets": ["c_fc", "c_proj"]}})
    assert sorted(n for n in flat(model) if "lora_a" in n) == ["blocks/0/mlp/c_fc/lora_a", "blocks/0/mlp/c_proj/lora_a"]


def test_expert_lora_sharded_over_experts_trains_equal_to_one_device():
    # Adam divides by sqrt(v) + epsilon: a few expert factors get first gradients near 1e-8 (features few tokens
    # reach), where the default epsilon 1e-8 turns float rounding of the sharded sums into 10% update differences.
    cfg = moe_config(warmup_steps=0, lr=1e-2, epsilon=1e-6, peft={"lora": {**EXPERTS, "dropout": 0.1}})
    batches = random_batches(cfg, 1, seed=3) * 2  # the second step sees the first step's update

    def run(mesh_shape, layout, devices=None):
        step, state, data, _ = train_step_for(cfg, mesh_shape, layout, devices)
        first, rows = flat(jax.device_get(state.params)), []
        for batch in batches:
            state, metrics = step(state, jax.device_put(batch, data))
            rows.append({k: float(v) for k, v in jax.device_get(metrics).items()})
        return first, state, rows

    first, single, rows = run("x:1", "batch:x", jax.devices()[:1])
    _, sharded, sharded_rows = run("x:4,y:2", "batch:x,experts:x,heads:y")
    for key in ("loss", "aux_loss", "grad_norm"):
        np.testing.assert_allclose([r[key] for r in sharded_rows], [r[key] for r in rows], rtol=0, atol=1e-5)
    assert rows[1]["loss"] < rows[0]["loss"]
    specs = {path_name(p): tuple(v.sharding.spec) for p, v in jax.tree_util.tree_flatten_with_path(sharded.params)[0]}
    assert specs["blocks/1/mlp/w_in"][0] == "x"  # the experts split as their weights are
    assert specs["blocks/1/mlp/w_in_lora/lora_a"] == ("x", None, None)
    assert specs["blocks/1/mlp/w_out_lora/lora_b"][:2] == ("x", None)
    after, sharded_after = flat(jax.device_get(single.params)), flat(jax.device_get(sharded.params))
    trains = trainable_filter(cfg.peft_settings)
    for name, value in after.items():
        np.testing.assert_allclose(sharded_after[name], value, atol=2e-5, rtol=0, err_msg=name)
        if trains(name):
            assert "lora_" in name and not np.array_equal(first[name], value), name
        else:
            np.testing.assert_array_equal(first[name], value, err_msg=name)  # frozen: w_in and w_out too
    assert trains("blocks/1/mlp/w_in_lora/lora_b") and not trains("blocks/1/mlp/w_in")


def test_expert_lora_adapter_file_round_trip(tmp_path):
    cfg = moe_config(peft={"lora": {**EXPERTS, "targets": ["router", "w_in", "w_out"]}})
    model = randomise_lora_b(build_model(cfg, nnx.Rngs(0)))
    call = nnx.jit(lambda m: m(TOKENS)[0])  # one compile for both models (op by op, the MoE was most of the test)
    logits = np.asarray(call(model))
    names = save_adapter(str(tmp_path / "adapter.safetensors"), model, cfg.peft)
    assert "blocks/1/mlp/w_in_lora/lora_b" in names and "blocks/1/mlp/router_lora/lora_a" in names
    assert all("lora_" in n for n in names)  # the base weights stay out of the file
    fresh = build_model(cfg, nnx.Rngs(0))
    assert np.abs(np.asarray(call(fresh)) - logits).max() > 1e-2
    load_adapter(str(tmp_path / "adapter.safetensors"), fresh)
    np.testing.assert_array_equal(np.asarray(call(fresh)), logits)
    merge(fresh)
    with pytest.raises(ConfigError, match="blocks/1/mlp/router_lora's LoRA is merged into its kernel"):
        load_adapter(str(tmp_path / "adapter.safetensors"), fresh)


@pytest.mark.e2e
def test_an_expert_lora_run_checkpoints_its_factors_only_and_resumes(tmp_path):
    """configs/moe.json, tiny: a base run, then LoRA on its experts from --init-from with checkpoint 'trainable'
    (stopped and resumed); the run loads as predict.py loads it, base weights from init_from, experts moved."""
    from pretrained import Pretrained
    from tests.common import metrics_rows, run_command

    sets = ["n_embd=32", "n_head=2", "n_ctx=32", "local_attention_radius=8", "train_batch_size=8",
            "eval_batch_size=8", "warmup_steps=0", "eval_steps=0", "sample_tokens=0", "n_layer=2",
            'attention_types=[[["global", "local"], 1]]', "moe_layers=[1]"]
    sets = [arg for s in sets for arg in ("--set", s)]
    base = str(tmp_path / "base")
    result = run_command("train.py", "--config", "configs/moe.json", "--model-path", base, "--no-progress", *sets,
                         "--set", "train_steps=1")
    assert result.returncode == 0, result.stderr[-3000:]
    run = str(tmp_path / "lora")
    peft = '{"lora": {"targets": ["w_in", "w_out"], "rank": 4}, "checkpoint": "trainable"}'
    lora = ["train.py", "--config", "configs/moe.json", "--init-from", base, "--model-path", run, "--no-progress",
            *sets, "--set", "train_steps=2", "--set", f"peft={peft}"]
    first = run_command(*lora, "--stop-at-step", "1")
    assert first.returncode == 0 and "parameters train" in first.stdout, first.stderr[-3000:]
    second = run_command(*lora)
    assert second.returncode == 0 and "resumed from" in second.stdout, second.stderr[-3000:]
    assert [r["step"] for r in metrics_rows(run)] == [1, 2] and "aux_loss" in metrics_rows(run)[0]
    tuned, start = flat(Pretrained.from_pretrained(run).params), flat(Pretrained.from_pretrained(base).params)
    np.testing.assert_array_equal(tuned["blocks/1/mlp/w_in"], start["blocks/1/mlp/w_in"])  # frozen, from the base
    assert np.abs(tuned["blocks/1/mlp/w_out_lora/lora_b"]).max() > 0  # trained (B starts at zero)
    assert not any("lora" in n for n in start)
