"""Dry run: the HLO reader on a program whose collectives and FLOPs are known, the dry run's memory figures
against the live buffers of a real step, and ``train.py --dry-run`` on a device count of its own."""

import math

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from models import registry
from parallel.dry_run import dry_run, report
from parallel.estimate import ACCELERATORS, collective_seconds
from parallel.hlo_stats import parse_hlo, replica_groups
from parallel.layout import Layout
from parallel.mesh import make_mesh
from parallel.state import create_train_state
from parallel.steps import batch_shapes, batch_shardings, make_train_step
from tests.common import random_batches, run_cli, tiny_config
from training.objectives import objective_for
from training.optimizer import learning_rate_schedule, make_optimizer

TRIPS = 5


def test_hlo_reader_counts_loop_trips_groups_and_flops():
    mesh = make_mesh("x:4,y:2")

    def block(a, w):  # per device: a (2, 8), w (8, 8)
        def body(_, c):
            return c + jax.lax.psum(c @ w, "x")  # one all-reduce over the 4 devices of x and one dot per trip
        return jax.lax.fori_loop(0, TRIPS, body, a)

    f = jax.jit(jax.shard_map(block, mesh=mesh, in_specs=(P("x", "y"), P()), out_specs=P("x", "y")))
    compiled = f.lower(jax.ShapeDtypeStruct((8, 16), jnp.float32), jax.ShapeDtypeStruct((8, 8), jnp.float32)).compile()
    stats = parse_hlo(compiled.as_text(), 8)
    [row] = stats.by_kind().values()
    assert list(stats.by_kind()) == ["all-reduce"]
    assert row["executions"] == TRIPS and row["bytes"] == TRIPS * 2 * 8 * 4
    groups = {frozenset(g) for c in stats.collectives for g in c.groups}
    assert groups == {frozenset(int(d.id) for d in mesh.devices[:, j]) for j in range(2)}  # x varies, y fixed
    assert stats.matmul_flops == TRIPS * 2 * 2 * 8 * 8
    # all-reduce over 4: 2 * 3/4 of 64 bytes sent per trip, inside one node of 8 on NVLink
    assert collective_seconds(stats, ACCELERATORS["h100"]) == pytest.approx(TRIPS * 1.5 * 64 / 450e9)


def test_replica_group_spellings():
    assert replica_groups("replica_groups={{0,2},{1,3}}, x", 4) == ((0, 2), (1, 3))
    assert replica_groups("replica_groups=[2,2]<=[2,2]T(1,0), x", 4) == ((0, 2), (1, 3))
    assert replica_groups("replica_groups=mesh['a'=2,'b'=2] {'a'}, x", 4) == ((0, 2), (1, 3))


def test_dry_run_memory_matches_a_real_step():
    """Parameters and optimizer state per device from the dry run equal the buffers a real step leaves on a
    device (margin 0.1%: the step counter), and XLA's argument size equals them plus the batch (margin 1%)."""
    cfg = tiny_config(tokens_per_mb_per_replica=32)  # 2 microbatches: the loop's collectives are counted twice
    layout = Layout.from_config(make_mesh("x:4,y:2"), "batch:x,embd:x,heads:y,intermediate_expanded:y")
    make_model = lambda rngs: registry.build(cfg, rngs)  # noqa: E731
    run = dry_run(cfg, layout, make_model)

    tx, objective = make_optimizer(cfg), objective_for(cfg)
    graphdef, state, shardings = create_train_state(make_model, tx, layout, cfg.seed)
    data = batch_shardings(layout, objective, batch_shapes(objective, cfg, cfg.train_batch_size))
    step = make_train_step(graphdef, objective, tx, learning_rate_schedule(cfg), layout, shardings, data,
                           precision=cfg.precision, microbatches=2, seed=cfg.seed)
    state, _ = step(state, jax.device_put(random_batches(cfg, 1)[0], data))
    device = jax.devices()[0]
    live = {name: sum(s.data.nbytes for leaf in jax.tree.leaves(tree) for s in leaf.addressable_shards
                      if s.device == device) for name, tree in (("params", state.params), ("opt", state.opt_state))}
    assert run.parameter_bytes == live["params"]
    assert math.isclose(run.optimizer_bytes, live["opt"], rel_tol=1e-3)
    assert math.isclose(run.argument_bytes, live["params"] + live["opt"] + run.batch_bytes, rel_tol=0.01)
    logits = cfg.train_batch_size // 4 // 2 * cfg.n_ctx * cfg.n_vocab * 4  # one microbatch's f32 logits
    assert run.temp_bytes >= logits
    assert run.microbatches == 2
    kinds = run.hlo.by_kind()
    assert kinds["all-reduce"]["executions"] > kinds["all-reduce"]["ops"]  # collectives in the microbatch loop
    # FSDP gradients: all-reduce + slice on CPU, counted as the reduce-scatter GPUs and TPUs run
    assert kinds["reduce-scatter"]["bytes"] > 0 and run.hlo.whole_before_scatter > 0
    text = report(run, cfg, layout)
    assert "| optimizer state |" in text and "| TPU v5e |" in text


@pytest.mark.slow
def test_dry_run_command_simulates_its_own_devices():
    result = run_cli("train.py", "--config", "configs/quickstart.json", "--dry-run", "--devices", "16",
                     "--set", "mesh_shape=x:8,y:2", "--set", "layout=batch:x,heads:y", "--set", "n_layer=2",
                     "--set", 'attention_types=[[["global","local"],1]]', timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mesh {'x': 8, 'y': 2} (16 simulated devices)" in result.stdout
    assert "| all-reduce |" in result.stdout and "| H100 |" in result.stdout
    result = run_cli("train.py", "--config", "configs/gpt_neo_13B.json", "--dry-run", "--devices", "8")
    assert result.returncode == 2 and "needs 256 devices but 8 are available" in result.stderr
    assert "Traceback" not in result.stderr
