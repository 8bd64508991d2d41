"""XLA flags NeoMesh sets by default, before jax starts (train.py, predict.py, the benchmarks).

They matter on GPUs and are inert elsewhere (XLA accepts every backend's flags on every backend). A flag the user
already gives in ``XLA_FLAGS`` keeps the user's value; ``NEOMESH_XLA_DEFAULTS=0`` turns the defaults off.

    --xla_gpu_enable_latency_hiding_scheduler=true   schedule collectives (FSDP all-gathers, gradient
                                                     reduce-scatters) to overlap with compute
    --xla_gpu_enable_while_loop_double_buffering=true  overlap a scanned loop's next-iteration collectives
"""

from __future__ import annotations

import os

DEFAULT_XLA_FLAGS = {
    "xla_gpu_enable_latency_hiding_scheduler": "true",
    "xla_gpu_enable_while_loop_double_buffering": "true",
}


def with_defaults(flags: str) -> str:
    """``flags`` (an XLA_FLAGS value) with every default flag it does not set appended."""
    given = {part.lstrip("-").split("=", 1)[0] for part in flags.split()}
    extra = [f"--{name}={value}" for name, value in DEFAULT_XLA_FLAGS.items() if name not in given]
    return " ".join([flags.strip(), *extra]).strip()


def apply_defaults(environ=os.environ) -> None:
    """Adds the defaults to ``environ["XLA_FLAGS"]``; only effective before jax initialises its backends."""
    if environ.get("NEOMESH_XLA_DEFAULTS", "1") != "0":
        environ["XLA_FLAGS"] = with_defaults(environ.get("XLA_FLAGS", ""))
