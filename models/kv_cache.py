"""KV caches for incremental decoding.

Tokens live at *buffer indices*: a batch of left-padded prompts fills indices 0..P-1 (row b's first ``pad[b]``
indices are padding), generated tokens follow. A token's position is its buffer index minus its row's padding.
Global layers cache every index; local layers keep a ring of their last ``window`` indices, so a long generation
never holds more than the window for them; linear layers keep two running sums; ``none`` layers keep nothing.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class LayerCache:
    k: jax.Array  # (B, L, N, H): L = cache length (global) or window (local ring)
    v: jax.Array  # (B, L, N, H)


@flax.struct.dataclass
class LinearCache:
    """A linear layer's running sums over every token so far: its whole state, whatever the length."""

    k_sum: jax.Array  # (B, N, H) float32: sum of exp(k)
    kv_sum: jax.Array  # (B, N, H, I) float32: sum of exp(k) (x) v


@flax.struct.dataclass
class DecodeState:
    index: jax.Array  # () int32: buffer index of the first token of the next call
    pad: jax.Array  # (B,) int32: left padding per row
    layers: tuple  # one entry per block: LayerCache, LinearCache, or None (layers without attention)

    def positions(self, t: int) -> jax.Array:
        """(B, t) positions of the next ``t`` tokens."""
        return jnp.maximum(self.index + jnp.arange(t)[None, :] - self.pad[:, None], 0)


def empty(batch: int, length: int, heads: int, head_dim: int, dtype) -> LayerCache:
    zeros = jnp.zeros((batch, length, heads, head_dim), dtype)
    return LayerCache(k=zeros, v=zeros)


def ring_indices(index: jax.Array, window: int) -> jax.Array:
    """(W,) buffer index held by each ring slot before the call at ``index``: the latest i < index with
    i % W == slot (negative when that slot was never written)."""
    slots = jnp.arange(window)
    last = index - 1
    return last - jnp.mod(last - slots, window)


def visible(query_index: jax.Array, key_index: jax.Array, pad: jax.Array, window: int | None) -> jax.Array:
    """(B, T, S) mask: query (T,) at buffer indices sees key (S,) if causal, within the window, and not padding."""
    q = query_index[None, :, None]
    k = key_index[None, None, :]
    ok = (k <= q) & (k >= pad[:, None, None]) & (k >= 0)
    if window is not None:
        ok &= k > q - window
    return ok
