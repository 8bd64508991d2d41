"""GPT-Neo self-attention: ``global`` (causal) and ``local`` (causal sliding window) layers.

GPT-Neo does not scale logits by 1/sqrt(head_dim): mesh-tensorflow folds that factor into the query init
(stddev (embd*head_dim)^-0.5 for q, embd^-0.5 for k and v, (heads*head_dim)^-0.5 for the output), so the trained
weights expect unscaled dot products. A ``local`` layer lets token i see tokens i-window+1 .. i.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from config import Config
from models import kv_cache
from models.layers import dropout, dropout_keys, projection
from parallel.layout import constrain

QUERY = ("batch", "sequence", "heads", "features_per_head")
KEY_VALUE = ("batch", "memory_length", "heads", "features_per_head")


def attention_mask(t: int, s: int, window: int | None) -> jax.Array:
    """(T, S) boolean mask, queries aligned to the last T keys: causal, and within the window if given."""
    i = jnp.arange(t)[:, None] + (s - t)
    j = jnp.arange(s)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= j > i - window
    return allowed


def dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array, window: int | None,
                          dropout_rate: float = 0.0, dropout_key: jax.Array | None = None) -> jax.Array:
    """Unscaled causal attention. (B,T,N,H), (B,S,N,H), (B,S,N,H) -> (B,T,N,H); softmax in float32."""
    if dropout_key is None or dropout_rate == 0.0:
        local = None if window is None else (window - 1, 0)
        return jax.nn.dot_product_attention(q, k, v, scale=1.0, is_causal=True, local_window_size=local)
    # Dropout on the probabilities needs them materialised, so training with attn_dropout takes this path.
    logits = jnp.einsum("BTNH,BSNH->BNTS", q, k, preferred_element_type=jnp.float32)
    mask = attention_mask(q.shape[1], k.shape[1], window)
    probs = jax.nn.softmax(jnp.where(mask, logits, jnp.finfo(jnp.float32).min), axis=-1)
    probs = dropout(dropout_rate, probs, dropout_key).astype(v.dtype)
    return jnp.einsum("BNTS,BSNH->BTNH", probs, v)


class SelfAttention(nnx.Module):
    """Multi-head self-attention of one kind (``global`` or ``local``), GPT-Neo parameterisation."""

    def __init__(self, cfg: Config, kind: str, *, rngs: nnx.Rngs):
        d, n, h = cfg.n_embd, cfg.n_head, cfg.head_dim
        qkv_axes = ("embd", "heads", "features_per_head")
        bias = qkv_axes[1:] if cfg.qkv_bias else None
        self.q = projection("BTD,DNH->BTNH", (d, n, h), qkv_axes, (d * h) ** -0.5, rngs, bias=bias)
        self.k = projection("BTD,DNH->BTNH", (d, n, h), qkv_axes, d ** -0.5, rngs, bias=bias)
        self.v = projection("BTD,DNH->BTNH", (d, n, h), qkv_axes, d ** -0.5, rngs, bias=bias)
        self.out = projection("BTNH,NHD->BTD", (n, h, d), ("heads", "features_per_head", "embd"), (n * h) ** -0.5,
                              rngs, bias=("embd",))
        self.window = cfg.local_attention_radius if kind == "local" else None
        self.attn_dropout = cfg.attn_dropout
        self.res_dropout = cfg.res_dropout

    def __call__(self, x: jax.Array, dropout_key: jax.Array | None = None) -> jax.Array:
        attn_key, res_key = dropout_keys(dropout_key, 2)
        q = constrain(self.q(x), QUERY)  # (B, T, N, H)
        k = constrain(self.k(x), KEY_VALUE)  # (B, S, N, H)
        v = constrain(self.v(x), KEY_VALUE)  # (B, S, N, H)
        a = dot_product_attention(q, k, v, self.window, self.attn_dropout, attn_key)  # (B, T, N, H)
        y = self.out(constrain(a, QUERY))  # (B, T, D)
        return dropout(self.res_dropout, y, res_key)

    def init_cache(self, batch: int, length: int, dtype) -> kv_cache.LayerCache:
        n, h = self.k.kernel.shape[1:]
        return kv_cache.empty(batch, length if self.window is None else min(self.window, length), n, h, dtype)

    def decode(self, x: jax.Array, cache: kv_cache.LayerCache, state: kv_cache.DecodeState):
        """Attention for T new tokens at buffer indices state.index..+T-1 against the cache; returns the output
        and the updated cache. Global layers write first and attend over the whole buffer; local layers attend
        over the ring (older tokens) plus the new tokens, then keep the newest ``window`` of them."""
        t = x.shape[1]
        q, k, v = self.q(x), self.k(x), self.v(x)  # (B, T, N, H)
        query_index = state.index + jnp.arange(t)
        if self.window is None:
            cache = kv_cache.LayerCache(k=jax.lax.dynamic_update_slice_in_dim(cache.k, k.astype(cache.k.dtype),
                                                                              state.index, axis=1),
                                        v=jax.lax.dynamic_update_slice_in_dim(cache.v, v.astype(cache.v.dtype),
                                                                              state.index, axis=1))
            keys, values, key_index = cache.k, cache.v, jnp.arange(cache.k.shape[1])
        else:
            w = cache.k.shape[1]
            keys = jnp.concatenate([cache.k, k.astype(cache.k.dtype)], axis=1)  # (B, W+T, N, H)
            values = jnp.concatenate([cache.v, v.astype(cache.v.dtype)], axis=1)
            key_index = jnp.concatenate([kv_cache.ring_indices(state.index, w), query_index])
            kept = min(t, w)  # the newest tokens overwrite the ring slots of their indices
            slots = jnp.mod(query_index[t - kept:], w)
            cache = kv_cache.LayerCache(k=cache.k.at[:, slots].set(k[:, t - kept:].astype(cache.k.dtype)),
                                        v=cache.v.at[:, slots].set(v[:, t - kept:].astype(cache.v.dtype)))
        mask = kv_cache.visible(query_index, key_index, state.pad, self.window)[:, None]  # (B, 1, T, S)
        a = jax.nn.dot_product_attention(q, keys.astype(q.dtype), values.astype(q.dtype), mask=mask, scale=1.0)
        return self.out(a), cache


# The attention slot of a block: each kind of layer maps to the module that implements it.
ATTENTION_LAYERS = {"global": SelfAttention, "local": SelfAttention}


def make_attention(cfg: Config, kind: str, *, rngs: nnx.Rngs) -> nnx.Module:
    return ATTENTION_LAYERS[kind](cfg, kind, rngs=rngs)
