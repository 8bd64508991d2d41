"""Shared test helpers: a tiny config, a sharded trainer, and the command-line runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np

from config import from_dict
from parallel.layout import Layout
from parallel.mesh import make_mesh
from parallel.state import create_train_state
from parallel.steps import batch_shapes, batch_shardings, make_train_step
from training.objectives import objective_for
from training.optimizer import learning_rate_schedule, make_optimizer
from training.peft import build_model, trainable_filter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY = dict(n_ctx=32, n_embd=64, n_head=4, n_layer=2, n_vocab=128, attention_types=[[["global", "local"], 1]],
            local_attention_radius=8, train_batch_size=8, eval_batch_size=8, warmup_steps=2, train_steps=10,
            lr=1e-3)


def tiny_config(**changes):
    return from_dict({**TINY, **changes})[0]


def jaxpr_equations(jaxpr):
    """Every equation of ``jaxpr`` and of the jaxprs nested in it (scans, conds, remat, custom vjps, kernels)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for inner in value if isinstance(value, (tuple, list)) else [value]:
                inner = getattr(inner, "jaxpr", inner)
                if hasattr(inner, "eqns"):
                    yield from jaxpr_equations(inner)


class _FakeTpu:
    platform = "tpu"

    def __init__(self, kind: str):
        self.device_kind = kind


class _OnOneTpu:  # what a layout over one TPU answers (its devices, its mesh); here without any TPU
    def __init__(self, kind: str):
        self.device_set = {_FakeTpu(kind)}
        self.mesh = jax.sharding.AbstractMesh((1,), ("x",))


def on_a_tpu(kind: str = "TPU v5 lite"):
    """A placer (``models.axes.placing``) for a layout over one TPU of ``kind``, on a machine without TPUs: what
    makes the code being traced choose the TPU's kernels and generators, as in a dry run compiled for a slice."""
    return lambda names, prefer: _OnOneTpu(kind)


def random_batches(cfg, steps: int, seed: int = 0) -> list[dict]:
    """``steps`` causal-LM batches {"tokens": (B, n_ctx+1)} of random token ids."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, cfg.n_vocab, (steps, cfg.train_batch_size, cfg.n_ctx + 1)).astype(np.int32)
    return [{"tokens": t} for t in tokens]


def train_losses(cfg, batches, mesh_shape="x:8", layout="batch:x", devices=None, microbatches=1,
                 accumulate_unreduced=False) -> list[float]:
    """Per-step losses of ``cfg`` trained on ``batches`` with the given mesh and layout."""
    return [m["loss"] for m in train_metrics(cfg, batches, mesh_shape, layout, devices, microbatches,
                                             accumulate_unreduced)]


def train_metrics(cfg, batches, mesh_shape="x:8", layout="batch:x", devices=None, microbatches=1,
                  accumulate_unreduced=False) -> list[dict]:
    """Per-step metrics dicts (floats) of ``cfg`` trained on ``batches`` with the given mesh and layout."""
    step, state, data, _ = train_step_for(cfg, mesh_shape, layout, devices, microbatches=microbatches,
                                          accumulate_unreduced=accumulate_unreduced)
    rows = []
    for batch in batches:
        state, metrics = step(state, jax.device_put(batch, data))
        rows.append({k: float(v) for k, v in jax.device_get(metrics).items()})
    return rows


def text_batches(cfg, steps: int, labels, seed: int = 0) -> list[dict]:
    """Sequence-classifier batches of random texts of varied lengths, ``labels(rng, rows)`` as their labels, and
    weight-0 filler in the last two rows."""
    rng = np.random.default_rng(seed)
    out = []
    b, t = cfg.train_batch_size, cfg.n_ctx
    for _ in range(steps):
        lengths = rng.integers(3, t + 1, b)
        segment_ids = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
        out.append({"inputs": np.where(segment_ids, rng.integers(0, cfg.n_vocab, (b, t)), 0).astype(np.int32),
                    "segment_ids": segment_ids, "token_types": np.zeros((b, t), np.int32), "labels": labels(rng, b),
                    "weights": (np.arange(b) < b - 2).astype(np.float32)})
    return out


def eval_row_and_kept(cfg, batches, kept: str) -> tuple[dict, np.ndarray, np.ndarray]:
    """(the reported eval row of ``cfg``'s freshly initialised model over ``batches`` on a 4-device mesh, the
    objective's per-row metric ``kept`` of the rows that count, those rows' labels), the rows computed apart."""
    import jax.numpy as jnp

    from parallel.steps import make_eval_step, mean_of, objective_sums
    from training.objectives import report

    objective = objective_for(cfg)
    layout = Layout.from_config(make_mesh("x:4", jax.devices()[:4]), "batch:x")
    graphdef, state, shardings = create_train_state(lambda rngs: build_model(cfg, rngs), make_optimizer(cfg),
                                                    layout, cfg.seed)
    data = batch_shardings(layout, objective, batch_shapes(objective, cfg, cfg.train_batch_size))
    step = make_eval_step(graphdef, objective, layout, shardings.params, data)
    row = report(objective, mean_of([step(state.params, jax.device_put(b, data)) for b in batches]))
    params = jax.device_get(state.params)
    values = np.concatenate([np.asarray(objective_sums(graphdef, objective, params, b, jnp.float32,
                                                       keep_rows=True)[0][kept]) for b in batches])
    counted = np.concatenate([b["weights"] for b in batches]) > 0
    return row, values[counted], np.concatenate([b["labels"] for b in batches])[counted]


def assert_trains_sharded_as_one_device(cfg, batches, keys=("loss", "grad_norm")) -> list[dict]:
    """``cfg`` trained on ``batches`` on a 4x2 mesh (batch, heads, MLP split) and with 2 microbatches gives one
    device's ``keys`` (atol 1e-5); returns the one device's metric rows."""
    single = train_metrics(cfg, batches, "x:1", "batch:x", devices=jax.devices()[:1])
    sharded = train_metrics(cfg, batches, "x:4,y:2", "batch:x,heads:y,intermediate_expanded:y")
    accumulated = train_metrics(cfg, batches, "x:1", "batch:x", devices=jax.devices()[:1], microbatches=2)
    for key in keys:
        for run in (sharded, accumulated):
            np.testing.assert_allclose([m[key] for m in run], [m[key] for m in single], rtol=0, atol=1e-5)
    return single


def train_step_for(cfg, mesh_shape: str, layout: str, devices=None, **options):
    """(the jitted train step, the initial state, the batch fields' shardings, their shapes) of ``cfg`` on the
    mesh and layout, with the parts its ``peft`` key names and only what trains under it trained; ``options``:
    ``make_train_step``'s."""
    layout = Layout.from_config(make_mesh(mesh_shape, devices), layout)
    tx = make_optimizer(cfg)
    objective = objective_for(cfg)
    trainable = trainable_filter(cfg.peft_settings)
    graphdef, state, shardings = create_train_state(lambda rngs: build_model(cfg, rngs), tx, layout, cfg.seed,
                                                    trainable=trainable)
    shapes = batch_shapes(objective, cfg, cfg.train_batch_size)
    data = batch_shardings(layout, objective, shapes)
    step = make_train_step(graphdef, objective, tx, learning_rate_schedule(cfg), layout, shardings, data,
                           precision=cfg.precision, seed=cfg.seed, trainable=trainable, **options)
    return step, state, data, shapes


def run_cli(*args: str, timeout: int = 600, as_shipped: bool = False, cache_home: str | None = None
            ) -> subprocess.CompletedProcess:
    """Runs ``python <args>`` from the repository root as a user would. ``as_shipped``: without the suite's
    settings (conftest's simulated devices, XLA flags and compilation cache), as on a user's machine whose
    ``XDG_CACHE_HOME`` is ``cache_home`` (where NeoMesh keeps compiled programs)."""
    env = None
    if as_shipped:
        suite_only = ("XLA_FLAGS", "JAX_DISABLE_MOST_OPTIMIZATIONS", "JAX_COMPILATION_CACHE_DIR",
                      "JAX_PERSISTENT_CACHE_", "XDG_CACHE_HOME")
        env = {k: v for k, v in os.environ.items() if not k.startswith(suite_only)}
        if cache_home is None:
            raise ValueError("as_shipped runs need a cache_home: a user's run writes its compiled programs there")
        env["XDG_CACHE_HOME"] = cache_home
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=env)


def run_command(*args: str) -> subprocess.CompletedProcess:
    """``run_cli`` for ``train.py``, ``predict.py`` and ``-m convert``, but in this process: the same ``main(argv)``
    a user's command runs, without an interpreter start and the TensorFlow and JAX imports (seconds each), which
    is most of a tiny run's time. Process-level behaviour (signals, exit codes of a dying process, several
    processes) stays with ``run_cli``."""
    import contextlib
    import io

    import importlib

    if args[0] == "-m":  # a package runs its __main__, a module itself
        module = args[1] + ".__main__" if os.path.isdir(os.path.join(ROOT, args[1])) else args[1]
        argv = args[2:]
    else:
        module, argv = args[0].removesuffix(".py"), args[1:]
    main = importlib.import_module(module).main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return subprocess.CompletedProcess(list(args), code or 0, out.getvalue(), err.getvalue())


def metrics_lines(model_path) -> int:
    """How many complete lines ``model_path/metrics.jsonl`` holds (0 before it exists): a running train.py's
    progress, read from outside."""
    try:
        with open(os.path.join(model_path, "metrics.jsonl")) as f:
            return sum(1 for line in f if line.endswith("\n"))
    except FileNotFoundError:
        return 0


def metrics_rows(model_path: str, kind: str = "train") -> list[dict]:
    with open(os.path.join(model_path, "metrics.jsonl")) as f:
        return [row for row in map(json.loads, f) if row["kind"] == kind]
