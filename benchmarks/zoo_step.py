"""What the zoo's train-step comparisons share (``mlm_train_step.py``, ``t5_train_step.py``,
``vit_train_step.py``): NeoMesh's jitted train step on one device and a transformers model's step, timed alike,
and the one table each prints. GPT-Neo's (``train_step.py``) times its PyTorch peer the same way."""

from __future__ import annotations

import os
import statistics
import time


def timed(step, steps: int) -> tuple[float, float]:
    """(median seconds of ``steps`` calls after the first, seconds of the first call, compile or warm-up
    included): ``step()`` must return only when its work is done."""
    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times), first


def neomesh(settings: dict, batch: dict, steps: int) -> tuple[float, float]:
    """``timed`` for NeoMesh's train step of the config ``settings`` (a dict as a config file holds it) on one
    device, on the numpy ``batch``: (median seconds per step, compile seconds)."""
    import jax

    from config import from_dict
    from models import registry
    from parallel.layout import Layout
    from parallel.mesh import make_mesh
    from parallel.state import create_train_state
    from parallel.steps import batch_shapes, batch_shardings, make_train_step
    from training.objectives import objective_for
    from training.optimizer import learning_rate_schedule, make_optimizer

    cfg, _ = from_dict({**settings, "mesh_shape": "x:1", "warmup_steps": 0})
    layout = Layout.from_config(make_mesh("x:1", jax.devices()[:1]), "batch:x")
    objective, tx = objective_for(cfg), make_optimizer(cfg)
    graphdef, state, shardings = create_train_state(lambda rngs: registry.build(cfg, rngs), tx, layout, 0)
    data = batch_shardings(layout, objective, batch_shapes(objective, cfg, cfg.train_batch_size))
    train_step = make_train_step(graphdef, objective, tx, learning_rate_schedule(cfg), layout, shardings, data,
                                 precision=cfg.precision)
    batch = jax.device_put(batch, data)
    carried = [state]

    def step():
        carried[0], metrics = train_step(carried[0], batch)
        jax.block_until_ready(metrics)

    return timed(step, steps)


def require_pytorch_peer() -> None:
    """A one-line error (``ConfigError``) where torch or transformers is not installed."""
    from config import ConfigError

    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"the PyTorch peer needs the test requirements ({e.name} is missing): "
                          "pip install -r requirements-test.txt") from None


def torch_threads() -> None:
    """PyTorch computes on as many threads as JAX has CPU cores to use."""
    import torch

    torch.set_num_threads(os.cpu_count() or 1)


def print_table(title: str, unit: str, per_step: float, rows: list[tuple[str, float, float]]) -> None:
    """``title``, where it ran, then a row per (implementation, median seconds per step, first-step seconds):
    ``per_step`` ``unit`` (tokens, images) are done in a step."""
    import jax

    print(f"\n{title}; {jax.devices()[0].platform} ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})")
    print(f"| implementation | {unit}/s | ms/step | compile / first step s |")
    print("|---|---|---|---|")
    for name, seconds, first in rows:
        rate = per_step / seconds
        shown = f"{rate:,.0f}" if rate >= 100 else f"{rate:,.1f}"  # a few images/s keep a decimal
        print(f"| {name} | {shown} | {1000 * seconds:,.0f} | {first:.1f} |")
