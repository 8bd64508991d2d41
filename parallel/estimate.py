"""Step time of a compiled step on a named accelerator, from its FLOPs, bytes and collectives.

The model (stated wherever a number is printed):
- compute: the compiled matmul FLOPs per device at ``UTILISATION`` of the accelerator's dense bf16 peak;
- memory: every byte the step holds live (arguments, outputs, temporaries) read or written once at HBM bandwidth,
  a lower bound that matters only for small, memory-bound steps;
- collectives: each collective's per-device wire bytes (ring algorithms, see ``hlo_stats.Collective``) over the
  bandwidth of the links its group spans: on GPUs NVLink inside a node of 8, the network between nodes; on TPUs
  the ICI ring along one torus axis (both directions of two links);
- step = max(compute, memory) + collectives (nothing overlapped: an upper estimate); the lower estimate overlaps
  all three. MFU = model FLOPs / (devices x peak x step).
Peak and bandwidths are datasheet numbers.
"""

from __future__ import annotations

import dataclasses

from parallel.hlo_stats import HloStats
from parallel.topologies import GPUS, devices_per_host
from parallel.xla_flags import GPU_MEMORY_FRACTION

UTILISATION = 0.5  # of peak, on the compiled matmul FLOPs (recomputation included)


@dataclasses.dataclass(frozen=True)
class Accelerator:
    name: str
    peak_flops: float  # dense bf16 FLOP/s per device
    memory: float  # bytes of HBM per device
    memory_bandwidth: float  # bytes/s
    link_bandwidth: float  # bytes/s each device sends inside its fast domain (NVLink node, ICI torus axis)
    node_size: int | None = None  # devices per fast domain; None: the whole slice is one (TPU ICI)
    network_bandwidth: float = 0.0  # bytes/s per device between nodes


ACCELERATORS = {
    # H100 SXM: 989 TFLOP/s bf16 dense, 80 GB HBM3 at 3.35 TB/s; NVLink 4 at 450 GB/s per direction inside a node
    # of 8; between nodes one 400 Gb/s InfiniBand NIC per GPU (50 GB/s). Memory: the share of the 79.1 GiB CUDA
    # reports that jax's allocator takes (GPU_MEMORY_FRACTION, parallel/xla_flags.py).
    "h100": Accelerator("H100", 989e12, GPU_MEMORY_FRACTION * GPUS["h100"].memory, 3.35e12, 450e9, node_size=8,
                        network_bandwidth=50e9),
    # H200 SXM: the H100's compute with 141 GiB of HBM3e at 4.8 TB/s.
    "h200": Accelerator("H200", 989e12, GPU_MEMORY_FRACTION * GPUS["h200"].memory, 4.8e12, 450e9, node_size=8,
                        network_bandwidth=50e9),
    # TPU v4: 275 TFLOP/s, 32 GiB HBM2 at 1.2 TB/s; 3-D torus, ICI links at 50 GB/s per direction.
    "tpu-v4": Accelerator("TPU v4", 275e12, 32 * 2**30, 1.2e12, 100e9),
    # TPU v5e: 197 TFLOP/s, 16 GB HBM2 at 819 GB/s; 2-D torus, 400 GB/s bidirectional ICI over 4 ports.
    "tpu-v5e": Accelerator("TPU v5e", 197e12, 16e9, 819e9, 100e9),
    # TPU v5p: 459 TFLOP/s, 95 GiB HBM2e at 2.765 TB/s; 3-D torus, 1,200 GB/s bidirectional ICI over 6 ports.
    "tpu-v5p": Accelerator("TPU v5p", 459e12, 95 * 2**30, 2.765e12, 200e9),
    # TPU v6e (Trillium): 918 TFLOP/s, 32 GB HBM at 1.638 TB/s; 2-D torus, 800 GB/s bidirectional ICI over 4 ports.
    "tpu-v6e": Accelerator("TPU v6e", 918e12, 32e9, 1.638e12, 200e9),
}

# What jax calls each device (``device.device_kind``, as libtpu and CUDA describe them) -> its entry above.
DEVICE_KINDS = {"TPU v4": "tpu-v4", "TPU v5 lite": "tpu-v5e", "TPU v5": "tpu-v5p", "TPU v6 lite": "tpu-v6e",
                **{gpu.name: name for name, gpu in GPUS.items()}}


@dataclasses.dataclass(frozen=True)
class StepEstimate:
    accelerator: Accelerator
    compute_s: float
    memory_s: float
    collectives_s: float
    model_flops: float  # the whole step's model FLOPs (6N + attention per token)
    devices: int

    @property
    def step_s(self) -> float:
        return max(self.compute_s, self.memory_s) + self.collectives_s

    @property
    def overlapped_s(self) -> float:
        return max(self.compute_s, self.memory_s, self.collectives_s)

    @property
    def mfu(self) -> float:
        return self.model_flops / (self.devices * self.accelerator.peak_flops * self.step_s)


def on_hosts(accelerator: Accelerator, devices) -> Accelerator:
    """``accelerator`` with its fast domain no larger than one host of ``devices`` (NVLink joins one host's GPUs:
    four hosts of 4 GPUs are not two nodes of 8)."""
    if accelerator.node_size is None:
        return accelerator
    return dataclasses.replace(accelerator, node_size=min(accelerator.node_size, devices_per_host(devices)))


def collective_seconds(stats: HloStats, accelerator: Accelerator) -> float:
    total = 0.0
    for c in stats.collectives:
        bandwidth = accelerator.link_bandwidth
        if accelerator.node_size and any(len({d // accelerator.node_size for d in g}) > 1 for g in c.groups):
            bandwidth = accelerator.network_bandwidth  # the group leaves the node: the network is the bottleneck
        total += c.wire_bytes * c.count / bandwidth
    return total


def estimate(stats: HloStats, live_bytes: float, model_flops: float, devices: int,
             accelerator: Accelerator, kernel_flops: float = 0.0) -> StepEstimate:
    """The step time of a compiled step (its HLO stats and live bytes per device) on ``accelerator``;
    ``kernel_flops`` per device: what runs inside kernels the HLO does not show (Pallas attention)."""
    flops = stats.matmul_flops + kernel_flops
    return StepEstimate(accelerator, compute_s=flops / (accelerator.peak_flops * UTILISATION),
                        memory_s=live_bytes / accelerator.memory_bandwidth,
                        collectives_s=collective_seconds(stats, accelerator), model_flops=model_flops,
                        devices=devices)
