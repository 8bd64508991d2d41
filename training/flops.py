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
    """6 x (matmul parameters a token passes through) + attention score/value FLOPs (PaLM appendix B), per
    trained token.

    Global layers count the full context (PaLM's convention, so MFU compares with other reports) plus their memory
    slots; local layers count their window; linear layers their running k (x) v sums (head_dim per head, like a
    window of head_dim); ``none`` layers have no attention. A mixture-of-experts layer counts top_k expert MLPs and
    its router. An encoder-decoder (T5) counts both stacks per encoder token (see ``t5_flops_per_token``)."""
    if cfg.model == "t5":
        return t5_flops_per_token(cfg)
    d, f, v = cfg.n_embd, 4 * cfg.n_embd, cfg.n_vocab
    moe_layers = set(cfg.moe_layers or ())
    matmul_params = d * v
    for layer, kind in enumerate(cfg.attention_layers):
        if kind != "none":
            matmul_params += 4 * d * d
        mlp = 2 * d * f
        matmul_params += mlp * cfg.moe["top_k"] + d * cfg.moe["num_experts"] if layer in moe_layers else mlp
    return 6 * matmul_params + attention_flops_per_token(cfg)


def attention_flops_per_token(cfg: Config) -> float:
    """The attention score/value part of ``train_flops_per_token`` (a decoder stack): 12 x n_embd x the span a
    layer's queries see, summed over the layers."""
    span = {"global": cfg.n_ctx + cfg.num_mem_kv, "local": min(cfg.n_ctx, cfg.local_attention_radius),
            "linear": cfg.head_dim, "none": 0}
    return sum(12 * cfg.n_embd * span[kind] for kind in cfg.attention_layers)


def t5_flops_per_token(cfg: Config) -> float:
    """T5's training FLOPs per encoder token (train.py counts n_ctx tokens per example): an example's n_ctx
    encoder tokens through the encoder, its decoder_ctx target tokens through decoder blocks (self- and
    cross-attention projections, MLP) and the output layer, plus attention scores over the encoder's and the
    decoder's full lengths, all divided by n_ctx."""
    d, inner, v = cfg.n_embd, cfg.n_head * cfg.head_dim, cfg.n_vocab
    mlp = (3 if cfg.mlp_glu else 2) * d * cfg.intermediate
    source, target = cfg.n_ctx, cfg.decoder_ctx
    encoder = cfg.n_layer * source * (6 * (4 * d * inner + mlp) + 12 * inner * source)
    decoder = cfg.decoder_layers * target * (6 * (8 * d * inner + mlp) + 12 * inner * (target + source))
    return (encoder + decoder + (6 * target * d * v if cfg.decoder_layers else 0)) / source


def peak_flops_per_second() -> float | None:
    """Sum over all devices of their peak, or None where it is unknown (CPUs)."""
    total = 0.0
    for device in jax.devices():
        peak = next((p for kind, p in PEAK_FLOPS.items() if device.device_kind.startswith(kind)), None)
        if peak is None:
            return None
        total += peak
    return total
