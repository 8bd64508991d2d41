"""Caches for incremental decoding, one per attention layer, carried in a model-level ``DecodeState``.

Tokens live at *buffer indices*: a batch of left-padded prompts fills indices 0..P-1 (row b's first ``pad[b]``
indices are padding), generated tokens follow. A token's position is its buffer index minus its row's padding.
A cached key's segment id (1 for a real token, 0 for padding or a slot never written) follows from its buffer
index and its row's padding, so the one attention path masks cached keys exactly as it masks keys in training;
no layer stores them (a (B, L) array per layer, written again every token, was two more kernels per layer and
token on a GPU, 9% of GPT-Neo 125M's decode step as XLA:GPU plans it). Global layers cache every index; local
layers keep a ring of their last ``window`` indices, so a long generation never holds more than the window for
them; linear layers keep two running sums; ``none`` layers keep nothing. Encoder-decoder models (T5) also keep a
``CrossCache`` per decoder layer: the keys and values of the encoder output, computed once when decoding starts.

Cached keys and values are stored heads first, (B, N, L, H), and handed to attention as the (B, L, N, H) view it
takes. A decode step's logits then come out (B, N, L), the keys' axis minor, and XLA:GPU computes the softmax and
the sum of the values in one kernel: stored (B, L, N, H), the logits' max, their sum and the normalisation were
kernels of their own (GPT-Neo 1.3B at batch 1 as XLA plans it for an H100: 444 kernels per new token, 370 heads
first).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class LayerCache:
    """Keys and values of a softmax layer: all L buffer indices (global) or a ring of the last L (local)."""

    k: jax.Array  # (B, N, L, H)
    v: jax.Array  # (B, N, L, H)
    pad: jax.Array  # (B,) int32: each row's left padding (its buffer indices below it are padding)
    end: jax.Array  # () int32: buffer index of the next token

    @classmethod
    def empty(cls, batch: int, length: int, heads: int, head_dim: int, dtype,
              pad: jax.Array | None = None) -> "LayerCache":
        zeros = jnp.zeros((batch, heads, length, head_dim), dtype)
        pad = jnp.zeros((batch,), jnp.int32) if pad is None else pad.astype(jnp.int32)
        return cls(k=zeros, v=zeros, pad=pad, end=jnp.zeros((), jnp.int32))

    @property
    def length(self) -> int:
        return self.k.shape[2]

    def segment_ids(self, index: jax.Array) -> jax.Array:
        """(S,) buffer indices (negative: a slot never written) -> (B, S) int32: 1 for a real token's."""
        return (index[None, :] >= self.pad[:, None]).astype(jnp.int32)  # pad >= 0: never-written slots are 0

    def extend(self, k: jax.Array, v: jax.Array, window: int | None
               ) -> tuple[tuple[jax.Array, jax.Array, jax.Array, jax.Array], "LayerCache"]:
        """Adds T new keys/values (B, T, N, H) at buffer indices end..end+T-1.

        Returns the keys the new queries attend to as (k, v, segment_ids, buffer index of each key) and the
        updated cache. A global cache is written in place and attended whole (its slots from end+T on are not
        written yet); a local ring is attended together with the new keys (a query needs up to window-1 keys
        back, some of which the new keys overwrite), then the newest keys take the ring slots of their indices; a
        single new key is written first and the ring attended alone (on a GPU, the ring's concatenation and the
        old values XLA saved from the slots it overwrote in place were 3 of a local layer's 19 kernels per token)."""
        t, length = k.shape[1], self.length
        k, v = heads_first(k.astype(self.k.dtype)), heads_first(v.astype(self.v.dtype))  # (B, N, T, H)
        new_index = self.end + jnp.arange(t)

        def written_at(slot: jax.Array) -> "LayerCache":
            def write(buffer, new):
                return jax.lax.dynamic_update_slice_in_dim(buffer, new, slot, axis=2)
            return self.replace(k=write(self.k, k), v=write(self.v, v), end=self.end + t)

        if window is None:
            cache = written_at(self.end)
            index = jnp.arange(length)
            written = jnp.where(index < cache.end, index, -1)
            return (heads_first(cache.k), heads_first(cache.v), self.segment_ids(written), index), cache
        if t == 1:  # a decode step: its slot held the key a window back, which it does not see, or none
            cache = written_at(jnp.mod(self.end, length))
            index = ring_indices(cache.end, length)
            return (heads_first(cache.k), heads_first(cache.v), self.segment_ids(index), index), cache
        index = jnp.concatenate([ring_indices(self.end, length), new_index])
        keys = (heads_first(jnp.concatenate([self.k, k], 2)), heads_first(jnp.concatenate([self.v, v], 2)),
                self.segment_ids(index), index)
        kept = min(t, length)  # the newest tokens overwrite the ring slots of their indices
        slots = jnp.mod(new_index[t - kept:], length)
        cache = self.replace(k=self.k.at[:, :, slots].set(k[:, :, t - kept:]),
                             v=self.v.at[:, :, slots].set(v[:, :, t - kept:]), end=self.end + t)
        return keys, cache


@flax.struct.dataclass
class LinearCache:
    """A linear layer's running sums over every token so far: its whole state, whatever the length."""

    k_sum: jax.Array  # (B, N, H) float32: sum of exp(k)
    kv_sum: jax.Array  # (B, N, H, I) float32: sum of exp(k) (x) v

    @classmethod
    def empty(cls, batch: int, heads: int, head_dim: int) -> "LinearCache":
        return cls(k_sum=jnp.zeros((batch, heads, head_dim), jnp.float32),
                   kv_sum=jnp.zeros((batch, heads, head_dim, head_dim), jnp.float32))


@flax.struct.dataclass
class CrossCache:
    """A cross-attention layer's keys and values of the encoder output: written once, read at every step."""

    k: jax.Array  # (B, N, S, H), heads first as in LayerCache
    v: jax.Array  # (B, N, S, H)
    segment_ids: jax.Array  # (B, S) int32: the encoder tokens' segments, 0 for padding


@flax.struct.dataclass
class DecodeState:
    index: jax.Array  # () int32: buffer index of the first token of the next call
    pad: jax.Array  # (B,) int32: left padding per row
    layers: tuple  # one entry per block: LayerCache, LinearCache, or None (layers without attention)
    cross: tuple | None = None  # encoder-decoder models: one CrossCache per decoder block

    def positions(self, t: int) -> jax.Array:
        """(B, t) positions of the next ``t`` tokens."""
        return jnp.maximum(self.index + jnp.arange(t)[None, :] - self.pad[:, None], 0)

    def segment_ids(self, t: int) -> jax.Array:
        """(B, t) segment ids of the next ``t`` tokens: 0 for left padding, 1 for real tokens."""
        return (self.index + jnp.arange(t)[None, :] >= self.pad[:, None]).astype(jnp.int32)


def heads_first(x: jax.Array) -> jax.Array:
    """(B, S, N, H) <-> (B, N, S, H): between attention's layout and the cache's."""
    return jnp.swapaxes(x, 1, 2)


def ring_indices(index: jax.Array, window: int) -> jax.Array:
    """(W,) buffer index held by each ring slot before the call at ``index``: the latest i < index with
    i % W == slot (negative when that slot was never written)."""
    slots = jnp.arange(window)
    last = index - 1
    return last - jnp.mod(last - slots, window)
