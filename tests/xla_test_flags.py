"""XLA flags of the test processes (kept free of jax imports: conftest sets them before jax starts).

Tests compile hundreds of tiny programs and run each a few times. With XLA's optimisations mostly off
(``JAX_DISABLE_MOST_OPTIMIZATIONS``), the CPU backend's fusion emitters and its split of one program's LLVM
codegen over threads cost more than they save: a tiny sharded train step compiles in 1.65 s without them against
2.8 s with them (same losses, bit for bit). Programs are timed in benchmarks/, never here."""

FAST_COMPILE = "--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"


def xla_flags_for(devices: int) -> str:
    """XLA_FLAGS for a process the tests start: ``devices`` simulated CPU devices, compiled as the suite's own."""
    return f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE}"
