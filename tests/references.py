"""Plain-numpy references (float64) for attention, norms, MLPs and blocks. No jax, no torch: each function is the
formula written out, so a test compares the library against arithmetic it can read."""

from __future__ import annotations

import math

import numpy as np


def random_qkv(b=2, t=11, n=3, h=8, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.normal(size=(b, t, n, h)).astype(np.float32) for _ in range(3))


def mask(t, s, window=None, causal=True, query_segments=None, key_segments=None):
    """(T, S) or (B, T, S): queries are the last t of s positions; causal keeps keys at or before the query, a
    window keeps keys less than ``window`` away (both sides when not causal), segments keep keys of the query's
    non-zero segment."""
    i = np.arange(t)[:, None] + (s - t)
    j = np.arange(s)[None, :]
    allowed = np.ones((t, s), bool)
    if causal:
        allowed &= j <= i
    if window is not None:
        allowed &= np.abs(i - j) < window
    if query_segments is None:
        return allowed
    same = (query_segments[:, :, None] == key_segments[:, None, :]) & (key_segments[:, None, :] != 0)
    return allowed[None] & same


def softmax(x, axis=-1):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def attention(q, k, v, allowed, scale=1.0):
    """Softmax attention (B,T,N,H) x (B,S,N,H) x (B,S,N,H) -> (B,T,N,H); ``allowed`` (T, S) or (B, T, S). Rows that
    see nothing get zeros."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    logits = scale * np.einsum("btnh,bsnh->bnts", q, k)
    allowed = allowed[None, None] if allowed.ndim == 2 else allowed[:, None]
    logits = np.where(allowed, logits, -np.inf)
    top = np.max(np.where(allowed, logits, -1e300), -1, keepdims=True)
    p = np.where(allowed, np.exp(logits - top), 0.0)
    p = p / np.maximum(p.sum(-1, keepdims=True), 1e-300)
    return np.einsum("bnts,bsnh->btnh", p, v)


def causal_linear_attention(q, k, v, eps=1e-6):
    """GPT-Neo's linear attention as the quadratic sum it factorises: w[t, s] = softmax(q_t) . exp(k_s) for s <= t,
    out_t = sum_s w[t, s] v_s / (sum_s w[t, s] + eps)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    weights = np.einsum("btnh,bsnh->bnts", softmax(q), np.exp(k)) * np.tril(np.ones((q.shape[1], k.shape[1])))
    # The running key sum carries eps in every feature; softmax(q) sums to 1, so the normaliser gains eps.
    return np.einsum("bnts,bsnh->btnh", weights, v) / (weights.sum(-1) + eps).transpose(0, 2, 1)[..., None]


def bidirectional_linear_attention(q, k, v):
    """GPT-Neo's non-causal linear attention: softmax(q) over features times sum_s softmax_s(k)[s] v[s]^T."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    context = np.einsum("bsnh,bsni->bnhi", softmax(k, axis=1), v)
    return np.einsum("btnh,bnhi->btni", softmax(q), context)


def layer_norm(x, scale, bias, eps):
    x = np.asarray(x, np.float64)
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def rms_norm(x, scale, eps):
    x = np.asarray(x, np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * scale


def scale_norm(x, g, eps):
    """GPT-Neo's scale_norm: mean-centred, unit-variance x times one scalar g."""
    return layer_norm(x, g, 0.0, eps)


def gelu(x):  # the tanh approximation (mesh-tensorflow, GPT-2's gelu_new)
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def dense(x, p):
    """An einsum projection's parameters {"kernel", optional "bias"} applied over the last dims of x."""
    kernel = np.asarray(p["kernel"], np.float64)
    x = np.asarray(x, np.float64)
    if kernel.ndim == 2:
        y = x @ kernel
    elif kernel.shape[0] == x.shape[-1]:  # (D, N, H)
        y = np.einsum("...d,dnh->...nh", x, kernel)
    else:  # (N, H, D)
        y = np.einsum("...nh,nhd->...d", x, kernel)
    return y + np.asarray(p["bias"], np.float64) if "bias" in p else y
