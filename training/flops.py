"""Model FLOPs per token and peak device FLOP/s, for tokens/s -> MFU."""

from __future__ import annotations

import jax

from config import Config

# Dense bf16 peak FLOP/s per device (datasheets), keyed by a prefix of jax's device_kind.
PEAK_FLOPS = {
    "TPU v2": 45e12, "TPU v3": 123e12, "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12,
    "TPU v5p": 459e12, "TPU v5": 459e12, "TPU v6": 918e12,
    "NVIDIA H200": 989e12, "NVIDIA H100": 989e12, "NVIDIA A100": 312e12, "NVIDIA L4": 121e12,
    "NVIDIA A10": 125e12, "NVIDIA V100": 125e12,
}


def train_flops_per_token(cfg: Config) -> float:
    """6 x (matmul parameters) + attention score/value FLOPs (PaLM appendix B), per trained token.

    Global layers count the full context (PaLM's convention, so MFU compares with other reports); local layers
    count their window."""
    d, f, v = cfg.n_embd, 4 * cfg.n_embd, cfg.n_vocab
    matmul_params = cfg.n_layer * (4 * d * d + 2 * d * f) + d * v
    attention = sum(12 * d * (min(cfg.n_ctx, cfg.local_attention_radius) if kind == "local" else cfg.n_ctx)
                    for kind in cfg.attention_layers)
    return 6 * matmul_params + attention


def peak_flops_per_second() -> float | None:
    """Sum over all devices of their peak, or None where it is unknown (CPUs)."""
    total = 0.0
    for device in jax.devices():
        peak = next((p for kind, p in PEAK_FLOPS.items() if device.device_kind.startswith(kind)), None)
        if peak is None:
            return None
        total += peak
    return total
