"""Splash attention: the Pallas flash-attention kernel for TPUs (jax.experimental.pallas.ops.tpu), for global and
local (sliding-window) layers, causal or not, with packed-sequence segment ids.

The kernel never materialises the (T, S) scores and skips the blocks a causal or local mask rules out entirely,
so a local layer costs its window, not its sequence. Under a layout it runs per device through ``shard_map``
(a Pallas kernel is one device's program; models/axes.py ``per_device``): batch and heads may be split, the
sequence stays whole. Off a TPU it
runs in Pallas' interpret mode, which is how the tests check it against the XLA path on CPU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from models.axes import HEADS, per_device, target_device

BLOCK = 512  # the kernel's query and key block: the largest that divides the sequence, down to MIN_BLOCK
MIN_BLOCK = 128
FLOAT32_ONLY = ("TPU v2", "TPU v3")  # device kinds whose kernels take float32 operands only


def splash_obstacles(t: int, s: int) -> list[str]:
    """Why the kernel cannot take these sequence lengths (empty when it can)."""
    if t != s or t % MIN_BLOCK:
        return [f"splash attention needs self-attention over a multiple of {MIN_BLOCK} positions (T={t}, S={s})"]
    return []


def _block(t: int) -> int:
    return next(b for b in (BLOCK, 256, MIN_BLOCK) if t % b == 0)


@functools.cache
def _kernel(t: int, heads: int, causal: bool, window: int | None, interpret: bool):
    """The kernel for (heads, t, head_dim) inputs of one example (built once per shape and mask)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernels
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    if window is not None:
        mask = masks.LocalMask((t, t), (window - 1, 0 if causal else window - 1), 0)
    else:
        mask = masks.CausalMask((t, t)) if causal else masks.FullMask((t, t))
    b = _block(t)
    sizes = kernels.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b, block_q_dkv=b, block_kv_dkv=b,
                               block_kv_dkv_compute=b, block_q_dq=b, block_kv_dq=b)
    return kernels.make_splash_mha(masks.MultiHeadMask([mask] * heads), head_shards=1, q_seq_shards=1,
                                   block_sizes=sizes, interpret=interpret)


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool, window: int | None,
                     scale: float = 1.0, segment_ids: jax.Array | None = None) -> jax.Array:
    """(B, T, N, H) queries, keys, values -> (B, T, N, H); ``segment_ids`` (B, T): packed sequences (0 padding)."""
    device = target_device()
    interpret = device.platform != "tpu"
    # The Mosaic compiler of TPU v2 and v3 takes no bfloat16 matmul operands (error E2001): the kernel computes in
    # float32 there, its inputs cast on the way in.
    dtype = jnp.float32 if device.device_kind in FLOAT32_ONLY else q.dtype
    segments = jnp.ones(q.shape[:2], jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)

    def local(q, k, v, segments):  # one device's share: (b, T, n, H)
        # Built eagerly: made inside a shard_map's trace, the kernel's mask arrays would be that trace's values,
        # and the cached kernel would leak them into the next program that uses it (a train step's eval step).
        with jax.ensure_compile_time_eval():
            kernel = _kernel(q.shape[1], q.shape[2], causal, window, interpret)

        from jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_kernel import SegmentIds

        def example(q, k, v, ids):  # (T, n, H) -> (T, n, H); the kernel takes (n, T, H) and does not scale
            q, k, v = (x.astype(dtype).swapaxes(0, 1) for x in (q * scale, k, v))
            out = kernel(q, k, v, segment_ids=SegmentIds(q=ids, kv=ids))
            return out.swapaxes(0, 1)

        return jax.vmap(example)(q, k, v, segments).astype(q.dtype)

    return per_device(local, (HEADS, HEADS, HEADS, HEADS[:2]), HEADS, whole=("sequence",))(q, k, v, segments)
