"""Accelerators described to their compilers without being attached: the devices of a TPU slice or of a GPU
node, for ``train.py --dry-run --topology`` (parallel/dry_run.py) to compile the train step for, ahead of time,
on any machine (``jax.experimental.topologies``, as MaxText's ``train_compile`` does for TPUs).

TPUs: libtpu describes a slice by name ("v5e:2x2"). GPUs: jax's CUDA plugin compiles for a GPU it is given as a
``GpuTargetConfigProto`` (the device facts XLA's GPU compiler reads: compute capability, cores, shared memory,
memory, cuDNN version), which ``gpu_target_config`` writes for the GPUs in ``GPUS``; cuDNN's flash attention is
compiled where the cuDNN library is installed (jax checks its version before emitting the kernel).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

from config import ConfigError

LIBTPU = 'pip install "jax[tpu]==0.10.2"'
CUDA_PLUGIN = 'pip install "jax[cuda12-local]==0.10.2" "nvidia-cudnn-cu12>=9.8,<10"'


def devices_per_host(devices) -> int:
    """How many of ``devices`` share the first one's host (process)."""
    return sum(d.process_index == devices[0].process_index for d in devices)


def tpu_topology(name: str) -> list:
    """The devices of the TPU slice ``name`` ("v5e:2x2", "v4:2x2x1", "v5p:2x2x2"), as libtpu describes them to
    compile for: no TPU needs to be attached."""
    if not re.fullmatch(r"v\d+[a-z]*:\d+(x\d+)*", name):
        raise ConfigError(f"--topology: '{name}' is not a TPU slice such as v5e:2x2, v4:2x2x1 or v5p:2x2x2, "
                          f"nor a GPU node such as {', '.join(f'{g}:8' for g in GPUS)}")
    try:
        import libtpu  # noqa: F401
    except ImportError:
        raise ConfigError(f"--topology: compiling for TPUs needs libtpu ({LIBTPU}); it is not installed") from None
    # libtpu looks for the TPU VM it runs on unless told, and takes a machine-wide lock that would make two dry
    # runs exclude each other; this process drives no TPU, it only compiles for one.
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    chips = [int(n) for n in name.split(":")[1].split("x")]
    options = {}
    if math.prod(chips) < 4:  # below libtpu's default host of 2x2x1 chips: one host of the slice's own size
        options["chips_per_host_bounds"] = tuple(chips + [1] * (3 - len(chips)))
    if name.startswith("v4:"):
        options["chip_config_name"] = "megacore"  # one device per chip, as jax runs a TPU v4 VM (not per core)
    try:
        return list(topologies.get_topology_desc(topology_name=name, platform="tpu", **options).devices)
    except Exception as e:  # libtpu's message names what it did not accept
        raise ConfigError(f"--topology: libtpu cannot describe '{name}': {str(e).splitlines()[0]}") from None


@dataclasses.dataclass(frozen=True)
class Gpu:
    """The facts of one GPU model that XLA's GPU compiler reads (its ``GpuDeviceInfoProto``)."""

    name: str  # what CUDA calls it: jax's device_kind
    memory: int  # bytes CUDA reports as the device's total
    memory_bandwidth: float  # bytes/s
    compute_capability: tuple[int, int] = (9, 0)
    cores: int = 132  # streaming multiprocessors
    clock_ghz: float = 1.98
    l2_bytes: int = 50 * 2**20
    shared_memory_per_core: int = 228 * 2**10
    shared_memory_per_block_optin: int = 227 * 2**10


# Hopper SXM parts as CUDA describes them (H100 SXM 80 GB: 79.1 GiB reported; H200: 141 GiB), under the names
# parallel/estimate.ACCELERATORS gives their datasheets.
GPUS = {
    "h100": Gpu("NVIDIA H100 80GB HBM3", memory=84_942_979_072, memory_bandwidth=3.35e12),
    "h200": Gpu("NVIDIA H200 141GB HBM3e", memory=151_397_597_184, memory_bandwidth=4.8e12),
}


def installed_cudnn_version() -> tuple[int, int, int] | None:
    """(major, minor, patch) of the cuDNN library jax loads, or None where there is none."""
    try:
        from jax_plugins.xla_cuda12 import _load_nvidia_libraries  # loads the pip-installed libraries, if any
        from jax_cuda12_plugin import _versions

        _load_nvidia_libraries()
        version = _versions.cudnn_get_version()
    except (ImportError, AttributeError, RuntimeError):
        return None
    return version // 10000, version // 100 % 100, version % 100


def gpu_target_config(gpu: Gpu, cudnn: tuple[int, int, int]) -> str:
    """``gpu`` as the text-format ``GpuTargetConfigProto`` jax's CUDA plugin compiles for."""
    major, minor = gpu.compute_capability
    info = {
        "threads_per_block_limit": 1024, "threads_per_warp": 32, "shared_memory_per_block": 48 * 2**10,
        "shared_memory_per_core": gpu.shared_memory_per_core, "threads_per_core_limit": 2048,
        "core_count": gpu.cores, "fpus_per_core": 128, "block_dim_limit_x": 2**31 - 1,
        "block_dim_limit_y": 65535, "block_dim_limit_z": 65535, "memory_bandwidth": int(gpu.memory_bandwidth),
        "l2_cache_size": gpu.l2_bytes, "clock_rate_ghz": gpu.clock_ghz, "device_memory_size": gpu.memory,
        "shared_memory_per_block_optin": gpu.shared_memory_per_block_optin,
        "registers_per_core_limit": 65536, "registers_per_block_limit": 65536,
    }
    fields = "\n".join(f"  {key}: {value}" for key, value in info.items())
    return (f"gpu_device_info {{\n{fields}\n  cuda_compute_capability {{ major: {major} minor: {minor} }}\n}}\n"
            f'platform_name: "CUDA"\n'
            f"dnn_version_info {{ major: {cudnn[0]} minor: {cudnn[1]} patch: {cudnn[2]} }}\n"
            f'device_description_str: "{gpu.name}"\n')


def gpu_topology(name: str) -> list:
    """The devices of the GPU node or cluster ``name``: "h100" (one GPU), "h100:8" (one host of 8), "h100:4x8"
    (4 hosts of 8), as jax's CUDA plugin describes them to compile for: no GPU needs to be attached."""
    match = re.fullmatch(r"([a-z]\d+)(?::(?:(\d+)x)?(\d+))?", name)
    if not match or match.group(1) not in GPUS:
        raise ConfigError(f"--topology: '{name}' is not a GPU node such as "
                          f"{', '.join(f'{g}:8' for g in GPUS)} (hosts x GPUs: h100:4x8)")
    gpu, hosts, per_host = GPUS[match.group(1)], int(match.group(2) or 1), int(match.group(3) or 1)
    if hosts < 1 or per_host < 1:
        raise ConfigError(f"--topology: '{name}' names no GPU")
    try:
        import jax_plugins.xla_cuda12  # noqa: F401
    except ImportError:
        raise ConfigError(f"--topology: compiling for GPUs needs jax's CUDA plugin ({CUDA_PLUGIN}); it is not "
                          "installed") from None
    from jax.experimental import topologies

    cudnn = installed_cudnn_version() or (9, 8, 0)  # without the library jax compiles attention without cuDNN
    try:
        description = topologies.get_topology_desc(name, "cuda", target_config=gpu_target_config(gpu, cudnn),
                                                   topology=f"1x{hosts}x{per_host}")
    except Exception as e:  # the plugin's message names what it did not accept
        raise ConfigError(f"--topology: jax's CUDA plugin cannot describe '{name}': {str(e).splitlines()[0]}") from None
    return list(description.devices)


def topology_devices(name: str) -> list:
    """The devices of ``name``, a GPU node ("h100:8") or a TPU slice ("v5e:2x2")."""
    return gpu_topology(name) if name.split(":")[0] in GPUS else tpu_topology(name)
