"""XLA flags of the test processes (kept free of jax imports: conftest sets them before jax starts).

Tests compile hundreds of tiny programs and run each a few times. With XLA's optimisations mostly off
(``JAX_DISABLE_MOST_OPTIMIZATIONS``), the CPU backend's fusion emitters and its split of one program's LLVM
codegen over threads cost more than they save: a tiny sharded train step compiles in 1.65 s without them against
2.8 s with them (same losses, bit for bit). Programs are timed in benchmarks/, never here.

XLA ends a process whose ``XLA_FLAGS`` names a flag it does not know (exit 1; under pytest's output capture with
no word at all), and CPU flags come and go between versions: jaxlib 0.11.2 (a GPU image's) refused one of these.
So each is tried once (``parallel.xla_flags.known_flags``), and what this XLA accepts is kept in the environment
(``CHECKED``) for xdist's workers and the tests' own subprocesses."""

import os

from parallel.xla_flags import known_flags

FAST_COMPILE_FLAGS = ("--xla_cpu_use_fusion_emitters=false", "--xla_cpu_parallel_codegen_split_count=1")
CHECKED = "NEOMESH_TEST_FAST_COMPILE"


def fast_compile() -> str:
    """FAST_COMPILE_FLAGS that this XLA knows, found once per test session."""
    if CHECKED not in os.environ:
        os.environ[CHECKED] = " ".join(known_flags(FAST_COMPILE_FLAGS))
    return os.environ[CHECKED]


def refused() -> list[str]:
    """FAST_COMPILE_FLAGS this XLA does not know (left out; the session header names them)."""
    return [flag for flag in FAST_COMPILE_FLAGS if flag not in fast_compile().split()]


def xla_flags_for(devices: int) -> str:
    """XLA_FLAGS for a process the tests start: ``devices`` simulated CPU devices, compiled as the suite's own."""
    return f"--xla_force_host_platform_device_count={devices} {fast_compile()}".strip()
