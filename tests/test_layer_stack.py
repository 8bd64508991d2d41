"""scan_layers' optimizer on stacked layers (training/layer_stack.py): the same updates as per layer, a state whose
size in leaves does not grow with depth, sharded like the weights it shadows."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import registry
from parallel.layout import Layout
from parallel.mesh import make_mesh
from parallel.state import abstract_model, abstract_train_state, create_train_state
from pretrained import load_run
from tests.common import tiny_config
from training.checkpoint import Checkpoints
from training.layer_stack import as_stored, convert_opt_state, layer_plan, optimizer_step, stack_layers, unstack_layers
from training.optimizer import bad_step_counts, make_optimizer

# 128 wide: Adafactor factors the matrices (its minimum is 128), its block RMS and AdamW's decay mask both act.
WIDE = dict(n_layer=4, n_embd=128, n_head=4, attention_types=[[["global", "local"], 2]], warmup_steps=0, lr=0.05)


def random_params(cfg, seed=0):
    _, abstract, _ = abstract_model(lambda rngs: registry.build(cfg, rngs))
    leaves, treedef = jax.tree.flatten(abstract)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return treedef.unflatten([jax.random.normal(k, a.shape, a.dtype) for k, a in zip(keys, leaves)])


def stack_of(cfg):
    """Stacked blocks only: the rest (embeddings, final norm) is what the per-layer optimizer sees anyway."""
    return {"blocks": random_params(cfg)["blocks"]}


def test_stacking_is_undone_exactly():
    params = random_params(tiny_config(**WIDE))
    plan = layer_plan(params)
    assert plan == {("blocks",): 1}  # global and local layers have the same weights' shapes
    stacked = stack_layers(params, plan)
    assert stacked["blocks"].layers[0]["attn"]["q"]["kernel"].shape == (4, 128, 4, 32)
    np.testing.assert_array_equal(stacked["blocks"].layers[0]["mlp"]["c_fc"]["bias"][2],
                                  params["blocks"][2]["mlp"]["c_fc"]["bias"])
    jax.tree.map(np.testing.assert_array_equal, unstack_layers(stacked), params)
    # a period of 2 when every other layer differs (here: only a pair's first layer has a bias)
    layers = {i: {"w": jnp.full((3,), i)} | ({"b": jnp.zeros(2)} if i % 2 == 0 else {}) for i in range(6)}
    plan = layer_plan({"h": layers})
    assert plan == {("h",): 2}
    stacked = stack_layers({"h": layers}, plan)
    np.testing.assert_array_equal(stacked["h"].layers[1]["w"][:, 0], [1, 3, 5])
    jax.tree.map(np.testing.assert_array_equal, unstack_layers(stacked), {"h": layers})


@pytest.mark.parametrize("opt", [dict(opt_name="adamw", weight_decay=0.1, gradient_clipping=0.5),
                                 dict(opt_name="adafactor", weight_decay=None, beta1=0.9, gradient_clipping=1.0)])
def test_stacked_updates_equal_per_layer_updates(opt):
    cfg = tiny_config(**{**WIDE, "n_layer": 2, "attention_types": [[["global", "local"], 1]]}, **opt)
    params = random_params(cfg)

    def run(cfg):
        tx = make_optimizer(cfg)
        update = jax.jit(tx.update)
        state, p = tx.init(params), params
        for step in range(3):
            grads = jax.tree.map(lambda x: x * (step + 1.0) * 0.1, random_params(cfg, seed=step + 1))
            updates, state = update(grads, state, p)
            p = jax.tree.map(jnp.add, p, updates)
        return p, [int(c) for c in bad_step_counts(state)], state

    per_layer, bad, _ = run(cfg)
    stacked, stacked_bad, state = run(cfg.replace(scan_layers=True))
    assert stacked_bad == bad == [0, 0]
    assert jax.tree.structure(stacked) == jax.tree.structure(params)  # updates come back per layer
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6), stacked, per_layer)
    moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), per_layer, params)
    assert min(jax.tree.leaves(moved)) > 0  # every weight took a step, the biases' and norms' too


def test_stacked_state_does_not_grow_with_depth_and_is_sharded_like_its_weight():
    mesh = make_mesh("x:4,y:2")
    layout = Layout.from_config(mesh, "batch:x,heads:y,embd:y")

    def state_of(n_layer, scan):
        cfg = tiny_config(**{**WIDE, "n_layer": n_layer, "attention_types": [[["global", "local"], n_layer // 2]]},
                          scan_layers=scan)
        return abstract_train_state(lambda rngs: registry.build(cfg, rngs), make_optimizer(cfg), layout)

    leaves = {(n, scan): len(jax.tree.leaves(state_of(n, scan)[1])) for n in (2, 8) for scan in (False, True)}
    assert leaves[(2, True)] == leaves[(8, True)] < leaves[(8, False)]  # parameters and optimizer state
    _, abstract, shardings = state_of(8, True)
    q = shardings.params["blocks"].layers[0]["attn"]["q"]["kernel"].spec
    # grouped by the stack's own period (global, local), so the scan reads each layer's weights straight from them
    assert len(abstract.params["blocks"].layers) == 2
    assert abstract.params["blocks"].layers[0]["attn"]["q"]["kernel"].shape == (4, 128, 4, 32)
    assert q[0] is None and "y" in tuple(q)  # the layers axis whole, the weight itself split over y
    mu = jax.tree_util.tree_flatten_with_path(shardings.opt_state)[0]
    stacked_q = [sh.spec for path, sh in mu if "layers" in jax.tree_util.keystr(path)
                 and jax.tree_util.keystr(path).endswith("['attn']['q']['kernel']")]
    assert stacked_q and all(spec == q for spec in stacked_q)


def test_a_stacked_sharded_state_goes_through_a_checkpoint(tmp_path):
    cfg = tiny_config(scan_layers=True, warmup_steps=0)
    layout = Layout.from_config(make_mesh("x:4,y:2"), "batch:x,heads:y,embd:y")
    make = lambda rngs: registry.build(cfg, rngs)  # noqa: E731
    tx = make_optimizer(cfg)
    _, state, shardings = create_train_state(make, tx, layout, 0)
    grads = as_stored(jax.tree.map(lambda x: 0.01 * x, random_params(cfg, seed=5)), state.params)
    params, opt_state, _ = jax.jit(lambda g, s, p: optimizer_step(tx, g, s, p))(grads, state.opt_state, state.params)
    state = state.replace(params=params, opt_state=opt_state)
    with Checkpoints(str(tmp_path), keep=1) as checkpoints:
        checkpoints.save(1, state, cfg.to_dict())
    _, abstract, _ = abstract_train_state(make, tx, layout)
    with Checkpoints(str(tmp_path), keep=1, read_only=True) as checkpoints:
        restored = checkpoints.restore(abstract, 1)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), restored, state)
    assert jax.tree.map(lambda a: a.sharding, restored) == shardings
    # what generation and export load: the layers one by one, as the model's own parameters
    _, graphdef, loaded = load_run(str(tmp_path))
    assert jax.tree.structure(loaded) == jax.tree.structure(random_params(cfg))
    jax.tree.map(np.testing.assert_array_equal, loaded, unstack_layers(jax.device_get(state.params)))


@pytest.mark.parametrize("opt", [dict(opt_name="adamw", weight_decay=0.1, gradient_clipping=0.5),
                                 dict(opt_name="adafactor", weight_decay=None, beta1=0.9, gradient_clipping=1.0)])
def test_the_optimizer_state_moves_between_per_layer_and_stacked_storage(opt):
    cfg = tiny_config(**WIDE, num_mem_kv=2, **opt)  # memory slots in global layers only: a period of 2
    params = random_params(cfg)
    assert layer_plan(params) == {("blocks",): 2}
    per_layer, stacked = make_optimizer(cfg), make_optimizer(cfg.replace(scan_layers=True))
    step = {tx: jax.jit(lambda g, s, p, tx=tx: optimizer_step(tx, g, s, p)) for tx in (per_layer, stacked)}
    state = per_layer.init(params)
    for seed in (1, 2):  # moments and counts that are not the init's
        params, state, _ = step[per_layer](random_params(cfg, seed=seed), state, params)
    moved = jax.jit(convert_opt_state)(state, jax.eval_shape(stacked.init, params))
    assert jax.tree.structure(moved) == jax.tree.structure(jax.eval_shape(stacked.init, params))
    back = jax.jit(convert_opt_state)(moved, jax.eval_shape(per_layer.init, params))
    jax.tree.map(np.testing.assert_array_equal, back, state)
    grads = random_params(cfg, seed=9)  # the next step is the same from either storage
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6),
                 step[stacked](grads, moved, params)[0], step[per_layer](grads, state, params)[0])


@pytest.mark.e2e
def test_a_run_resumes_with_scan_layers_flipped_or_its_parameters_stored_per_layer(tmp_path, capsys, monkeypatch):
    """A scan_layers run of the storage before the train state stored the parameters stacked (per-layer parameters
    beside a stacked optimizer state) resumes, then resumes again with scan_layers flipped: the losses of a run
    that was never interrupted."""
    import json

    import train
    import training.layer_stack

    tiny = {"n_layer": 2, "n_embd": 32, "n_head": 2, "n_ctx": 16, "attention_types": [[["global", "local"], 1]],
            "train_batch_size": 8, "eval_steps": 0, "sample_tokens": 0, "n_vocab": 257, "warmup_steps": 1,
            "datasets": [["embedded", None, None, None]], "lr_decay_end": 4, "steps_per_checkpoint": 2}

    def run(path, steps, scan):
        args = ["--config", "configs/quickstart.json", "--model-path", str(path), "--no-progress"]
        for key, value in {**tiny, "train_steps": steps, "scan_layers": scan}.items():
            args += ["--set", f"{key}={json.dumps(value)}"]
        assert train.main(args) == 0, capsys.readouterr().err

    def losses(path):
        rows = [json.loads(line) for line in open(path / "metrics.jsonl")]
        return [r["loss"] for r in rows if r["kind"] == "train"]

    run(tmp_path / "straight", 4, False)
    with monkeypatch.context() as patch:  # the earlier storage: parameters per layer, the step stacking them
        patch.setattr(training.layer_stack, "stores_params_stacked", lambda tx, trainable: False)
        run(tmp_path / "earlier", 2, True)
    run(tmp_path / "earlier", 3, True)
    assert "stored the parameters per layer and the optimizer state stacked (scan_layers=true); moved to this " \
        "run's storage (scan_layers=true)" in capsys.readouterr().out
    run(tmp_path / "earlier", 4, False)
    assert "stored the parameters stacked and the optimizer state stacked (scan_layers=true); moved to this run's " \
        "storage (scan_layers=false)" in capsys.readouterr().out
    np.testing.assert_allclose(losses(tmp_path / "earlier"), losses(tmp_path / "straight"), rtol=0, atol=1e-5)
