"""GPT-Neo's ``linear`` attention layers: linear attention (Katharopoulos et al.) in mesh-tensorflow's form.

Causal: queries go through a softmax over their features and keys through exp, so every query-key weight is
positive and the causal sum over keys factorises into running sums: of the keys (for the normaliser) and of the
outer products k (x) v (for the output). Memory is O(T x H x H) per head and no T x T matrix is formed. The formula
is GPT-Neo's ``causal_linear_attention`` (eps 1e-6 added to the running key sum). Training starts the sums at zero;
decoding carries them in a ``LinearCache``, so one function serves both.

Bidirectional (GPT-Neo's ``linear_attention``, for ``causal: false``): keys go through a softmax over the sequence
instead, and every query reads the one context sum_s k'[s] (x) v[s].

There is no attention dropout: there are no attention probabilities to drop. Segment ids only mark padding here
(keys of segment 0 add nothing); linear layers do not separate packed documents.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from models.kv_cache import LinearCache

LINEAR_EPSILON = 1e-6


def causal_linear_attention(q: jax.Array, k: jax.Array, v: jax.Array, real: jax.Array | None = None,
                            carry: LinearCache | None = None, eps: float = LINEAR_EPSILON
                            ) -> tuple[jax.Array, LinearCache]:
    """(B,T,N,H) x3 -> (B,T,N,H) and the running sums after the last token; float32 inside.

    out[t] = sum_{s<=t} (q'[t].k'[s]) v[s] / q'[t].(sum_{s<=t} k'[s] + eps), q' = softmax(q), k' = exp(k); sums
    continue from ``carry``, and tokens where ``real`` (B, T) is False add nothing to them.
    Letters: I is the value feature axis (size H), kept apart from the key feature axis H in the k (x) v sums."""
    b, _, n, h = k.shape
    carry = carry if carry is not None else LinearCache.empty(b, n, h)
    q = jax.nn.softmax(q.astype(jnp.float32), axis=-1)  # (B, T, N, H)
    k = jnp.exp(k.astype(jnp.float32))  # (B, T, N, H)
    if real is not None:
        k = k * real[:, :, None, None]
    context = jnp.einsum("BTNH,BTNI->BTNHI", k, v.astype(jnp.float32))  # (B, T, N, H, I)
    cumulative_k = carry.k_sum[:, None] + jnp.cumsum(k, axis=1) + eps  # (B, T, N, H)
    cumulative_context = carry.kv_sum[:, None] + jnp.cumsum(context, axis=1)  # (B, T, N, H, I)
    d_inv = 1.0 / jnp.einsum("BTNH,BTNH->BTN", q, cumulative_k)  # (B, T, N)
    out = jnp.einsum("BTNH,BTNHI,BTN->BTNI", q, cumulative_context, d_inv)  # (B, T, N, I)
    sums = LinearCache(k_sum=carry.k_sum + k.sum(axis=1), kv_sum=carry.kv_sum + context.sum(axis=1))
    return out.astype(v.dtype), sums


def bidirectional_linear_attention(q: jax.Array, k: jax.Array, v: jax.Array, real: jax.Array | None = None
                                   ) -> jax.Array:
    """(B,T,N,H) x3 -> (B,T,N,H): softmax(q) over features reads sum_s softmax_s(k)[s] (x) v[s]; keys where
    ``real`` (B, T) is False are left out of the softmax over the sequence."""
    q = jax.nn.softmax(q.astype(jnp.float32), axis=-1)
    k = k.astype(jnp.float32)
    if real is not None:
        k = jnp.where(real[:, :, None, None], k, -jnp.inf)
    k = jax.nn.softmax(k, axis=1)  # over the sequence
    context = jnp.einsum("BSNH,BSNI->BNHI", k, v.astype(jnp.float32))  # (B, N, H, I)
    return jnp.einsum("BTNH,BNHI->BTNI", q, context).astype(v.dtype)
