"""Process defaults NeoMesh sets before jax starts (train.py, predict.py, eval.py): XLA flags and a persistent
compilation cache.

The flags matter on GPUs and are inert elsewhere (XLA accepts every backend's flags on every backend). A flag the
user already gives in ``XLA_FLAGS`` keeps the user's value; ``NEOMESH_XLA_DEFAULTS=0`` turns the defaults off.

    --xla_gpu_enable_latency_hiding_scheduler=true   schedule collectives (FSDP all-gathers, gradient
                                                     reduce-scatters) to overlap with compute
    --xla_gpu_enable_while_loop_double_buffering=true  overlap a scanned loop's next-iteration collectives
                                                     (not the decode loop: models/generate.LOOP_OPTIONS)

The train and eval steps (parallel/steps.py) compile on GPUs with ``GPU_STEP_OPTIONS`` as their own options
(``step_options``): cuBLAS rather than XLA's Triton kernels for their matmuls, which decoding keeps.

On GPUs jax's allocator also takes ``GPU_MEMORY_FRACTION`` (90%) of the device's memory instead of XLA's 75%
(``XLA_CLIENT_MEM_FRACTION``, unless it or its deprecated name ``XLA_PYTHON_CLIENT_MEM_FRACTION`` is set; the
rest is left to CUDA, cuDNN and NCCL outside it): an 80 GB H100 gives a job 76 GB rather than 64.

Compiled programs are kept between runs in ``$XDG_CACHE_HOME/neomesh/jax`` (``~/.cache/neomesh/jax``, at most
``CACHE_MAX_BYTES``, least recently used out first): a resumed run or a second run of a config skips XLA's
compile of the programs that took it over a second (jax's threshold). ``JAX_COMPILATION_CACHE_DIR`` chooses
another directory; ``NEOMESH_COMPILATION_CACHE=0`` turns it off. The benchmarks, which time compiles, run without
it.
"""

from __future__ import annotations

import importlib.util
import os
import sys

DEFAULT_XLA_FLAGS = {
    "xla_gpu_enable_latency_hiding_scheduler": "true",
    "xla_gpu_enable_while_loop_double_buffering": "true",
}

# XLA:GPU's Triton matmuls lose to cuBLAS on a train step's large ones and win on decoding's matmuls of one or two
# rows, so cuBLAS is the steps' own compile option rather than an XLA_FLAGS default. One H100, bf16, T=2048,
# 2026-11-27, with against without: 1.3B at batch 4 50.5/50.6% MFU against 48.2/49.2%, compiled in 22/27 s against
# 32/35; 125M level (34.7% against 33.8% at batch 8, 38.3 against 38.4 at 16); decoding 1.3B at batch 1 with it
# everywhere took 2.35 ms per token against 1.65.
GPU_STEP_OPTIONS = {"xla_gpu_enable_triton_gemm": False}

GPU_MEMORY_FRACTION = 0.9
MEMORY_FRACTION_VARIABLES = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")  # jax's name, its old one

CACHE_MAX_BYTES = 4 * 2**30


def known_flags(flags) -> list[str]:
    """The entries of ``flags`` that the installed XLA starts with, tried in a subprocess (all at once first). XLA
    ends a process whose ``XLA_FLAGS`` names a flag it does not know (exit 1), and backend-specific flags come and
    go between versions: jaxlib 0.11.2 refused one of the test suite's CPU flags that 0.10.2 takes."""
    import subprocess

    def starts(some) -> bool:
        env = {**os.environ, "XLA_FLAGS": " ".join(some), "JAX_PLATFORMS": "cpu"}
        return subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env,
                              capture_output=True).returncode == 0

    flags = list(flags)
    return flags if starts(flags) else [flag for flag in flags if starts([flag])]


def flag_names(flags: str) -> set[str]:
    """The names of the flags an XLA_FLAGS value sets (``--name=value`` -> ``name``)."""
    return {part.lstrip("-").split("=", 1)[0] for part in flags.split()}


def with_defaults(flags: str) -> str:
    """``flags`` (an XLA_FLAGS value) with every default flag it does not set appended."""
    given = flag_names(flags)
    extra = [f"--{name}={value}" for name, value in DEFAULT_XLA_FLAGS.items() if name not in given]
    return " ".join([flags.strip(), *extra]).strip()


def step_options(platform: str, environ=os.environ) -> dict:
    """The XLA options a train or eval step compiles with on ``platform``'s devices: ``GPU_STEP_OPTIONS`` on GPUs,
    less those the user's ``XLA_FLAGS`` sets (a program's option would override it); none with
    ``NEOMESH_XLA_DEFAULTS=0``."""
    if platform != "gpu" or environ.get("NEOMESH_XLA_DEFAULTS", "1") == "0":
        return {}
    given = flag_names(environ.get("XLA_FLAGS", ""))
    return {name: value for name, value in GPU_STEP_OPTIONS.items() if name not in given}


def compilation_cache_dir(environ=os.environ) -> str:
    """Where compiled programs are kept between runs unless ``JAX_COMPILATION_CACHE_DIR`` says otherwise."""
    from neomesh.paths import cache_home

    return os.path.join(cache_home(environ), "neomesh", "jax")


def apply_defaults(environ=os.environ, compilation_cache: bool = True) -> None:
    """Adds the default flags to ``environ["XLA_FLAGS"]`` and the GPU memory fraction (only effective before jax
    initialises its backends) and, with ``compilation_cache``, points jax's persistent compilation cache at
    ``compilation_cache_dir``."""
    if environ.get("NEOMESH_XLA_DEFAULTS", "1") != "0":
        environ["XLA_FLAGS"] = with_defaults(environ.get("XLA_FLAGS", ""))
        if not any(name in environ for name in MEMORY_FRACTION_VARIABLES):  # jax refuses both names at once
            environ[MEMORY_FRACTION_VARIABLES[0]] = str(GPU_MEMORY_FRACTION)
    if (not compilation_cache or "JAX_COMPILATION_CACHE_DIR" in environ
            or environ.get("NEOMESH_COMPILATION_CACHE", "1") == "0"):
        return
    directory = compilation_cache_dir(environ)
    try:  # a home that cannot be written (a read-only cluster home) means no cache, not a warning per compile
        os.makedirs(directory, exist_ok=True)
    except OSError:
        return
    if not os.access(directory, os.W_OK):
        return
    environ["JAX_COMPILATION_CACHE_DIR"] = directory
    # every program, not only those compiling for over a second (jax's default): a run's start is many small
    # programs (parameter inits, checkpoint checksums, the first decode steps), each compiled anew by every run
    environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    if importlib.util.find_spec("filelock"):  # jax bounds the cache only with it (a requirement; a bare jax lacks it)
        environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(CACHE_MAX_BYTES))
    if environ is os.environ and "jax" in sys.modules:  # a notebook: jax read its environment at import already
        import jax

        jax.config.update("jax_compilation_cache_dir", environ["JAX_COMPILATION_CACHE_DIR"])
        jax.config.update("jax_compilation_cache_max_size", int(environ.get("JAX_COMPILATION_CACHE_MAX_SIZE", -1)))
        jax.config.update("jax_persistent_cache_min_compile_time_secs",
                          float(environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))
