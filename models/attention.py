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
        self.q = projection("BTD,DNH->BTNH", (d, n, h), qkv_axes, (d * h) ** -0.5, rngs)
        self.k = projection("BTD,DNH->BTNH", (d, n, h), qkv_axes, d ** -0.5, rngs)
        self.v = projection("BTD,DNH->BTNH", (d, n, h), qkv_axes, d ** -0.5, rngs)
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


# The attention slot of a block: each kind of layer maps to the module that implements it.
ATTENTION_LAYERS = {"global": SelfAttention, "local": SelfAttention}


def make_attention(cfg: Config, kind: str, *, rngs: nnx.Rngs) -> nnx.Module:
    return ATTENTION_LAYERS[kind](cfg, kind, rngs=rngs)
