"""GPT-Neo's ``linear`` attention layers: causal linear attention (Katharopoulos et al.) in mesh-tensorflow's form.

Queries go through a softmax over their features and keys through exp, so every query-key weight is positive and
the causal sum over keys factorises into running sums: of the keys (for the normaliser) and of the outer products
k (x) v (for the output). Memory is O(T x H x H) per head and no T x T matrix is formed. The formula is GPT-Neo's
``causal_linear_attention`` (eps 1e-6 added to the running key sum); there is no attention dropout, as there are
no attention probabilities to drop.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from models import kv_cache
from models.attention import SelfAttention
from models.rotary import apply_rotary

LINEAR_EPSILON = 1e-6


def causal_linear_attention(q: jax.Array, k: jax.Array, v: jax.Array, eps: float = LINEAR_EPSILON) -> jax.Array:
    """(B,T,N,H) x3 -> (B,T,N,H) in float32 internally.

    out[t] = sum_{s<=t} (q'[t].k'[s]) v[s] / q'[t].(sum_{s<=t} k'[s] + eps), q' = softmax(q), k' = exp(k).
    Letters: I is the value feature axis (size H), kept apart from the key feature axis H in the k (x) v sums."""
    q = jax.nn.softmax(q.astype(jnp.float32), axis=-1)  # (B, T, N, H)
    k = jnp.exp(k.astype(jnp.float32))  # (B, T, N, H)
    cumulative_k = jnp.cumsum(k, axis=1) + eps  # (B, T, N, H)
    d_inv = 1.0 / jnp.einsum("BTNH,BTNH->BTN", q, cumulative_k)  # (B, T, N)
    context = jnp.einsum("BTNH,BTNI->BTNHI", k, v.astype(jnp.float32))  # (B, T, N, H, H)
    cumulative_context = jnp.cumsum(context, axis=1)  # (B, T, N, H, H)
    out = jnp.einsum("BTNH,BTNHI,BTN->BTNI", q, cumulative_context, d_inv)  # (B, T, N, H)
    return out.astype(v.dtype)


class LinearAttention(SelfAttention):
    """A ``linear`` layer: GPT-Neo's projections (and rotary, if on) around causal linear attention."""

    def attend(self, q: jax.Array, k: jax.Array, v: jax.Array, dropout_key: jax.Array | None) -> jax.Array:
        del dropout_key  # no probabilities to drop out
        return causal_linear_attention(q, k, v)

    def init_cache(self, batch: int, length: int, dtype) -> kv_cache.LinearCache:
        del length, dtype  # the running sums are all there is, in float32
        n, h = self.k.kernel.shape[1:]
        return kv_cache.LinearCache(k_sum=jnp.zeros((batch, n, h), jnp.float32),
                                    kv_sum=jnp.zeros((batch, n, h, h), jnp.float32))

    def decode(self, x: jax.Array, cache: kv_cache.LinearCache, state: kv_cache.DecodeState):
        """T new tokens continuing the running sums: the same formula as ``causal_linear_attention`` with the
        sums carried in; left-padding tokens add nothing to them."""
        t = x.shape[1]
        positions = state.positions(t)
        q = jax.nn.softmax(apply_rotary(self.q(x), positions, self.rotary_dim).astype(jnp.float32), axis=-1)
        k = jnp.exp(apply_rotary(self.k(x), positions, self.rotary_dim).astype(jnp.float32))  # (B, T, N, H)
        real = (state.index + jnp.arange(t))[None, :] >= state.pad[:, None]  # (B, T)
        k = k * real[:, :, None, None]
        context = jnp.einsum("BTNH,BTNI->BTNHI", k, self.v(x).astype(jnp.float32))  # (B, T, N, H, I)
        cumulative_k = cache.k_sum[:, None] + jnp.cumsum(k, axis=1) + LINEAR_EPSILON  # (B, T, N, H)
        cumulative_context = cache.kv_sum[:, None] + jnp.cumsum(context, axis=1)  # (B, T, N, H, I)
        d_inv = 1.0 / jnp.einsum("BTNH,BTNH->BTN", q, cumulative_k)
        out = jnp.einsum("BTNH,BTNHI,BTN->BTNI", q, cumulative_context, d_inv).astype(x.dtype)
        cache = kv_cache.LinearCache(k_sum=cache.k_sum + k.sum(axis=1), kv_sum=cache.kv_sum + context.sum(axis=1))
        return self.out(out), cache
