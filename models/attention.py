"""GPT-Neo self-attention: ``global`` (causal) and ``local`` (causal sliding window) layers, the kernel choice,
and the registry that fills a block's attention slot with any kind (``linear`` lives in linear_attention.py,
``none`` layers have no attention at all).

GPT-Neo does not scale logits by 1/sqrt(head_dim): mesh-tensorflow folds that factor into the query init
(stddev (embd*head_dim)^-0.5 for q, embd^-0.5 for k and v, (heads*head_dim)^-0.5 for the output), so the trained
weights expect unscaled dot products. A ``local`` layer lets token i see tokens i-window+1 .. i. With
``num_mem_kv`` > 0 a global layer also has that many learned key/value slots (GPT-Neo's memory_key_values) that
every query sees, whatever its position.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from config import Config, ConfigError
from models import kv_cache
from models.layers import axes, dropout, dropout_keys, projection
from models.rotary import apply_rotary
from parallel.layout import constrain

QUERY = ("batch", "sequence", "heads", "features_per_head")
KEY_VALUE = ("batch", "memory_length", "heads", "features_per_head")
COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

# A local layer whose sequence spans at least this many windows attends block by block (O(T x window) memory)
# instead of through a masked T x T matrix. Below it the full matrix is small and one fused op is faster.
BLOCKED_MIN_WINDOWS = 4
# cuDNN flash attention (jax.nn.dot_product_attention(implementation="cudnn")): half-precision inputs and a head
# dim that is a multiple of 8 and at most 128 (256 on Hopper; 128 is the rule every supported GPU meets).
CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
CUDNN_MAX_HEAD_DIM = 128


def cudnn_obstacles(platform: str, dtype, head_dim: int, explicit_mask: bool = False) -> list[str]:
    """Why the cuDNN kernel cannot run for these inputs (empty when it can)."""
    reasons = []
    if platform not in ("gpu", "cuda"):
        reasons.append(f"the platform is {platform}, not a CUDA GPU")
    if jnp.dtype(dtype) not in [jnp.dtype(d) for d in CUDNN_DTYPES]:
        reasons.append(f"the compute dtype is {jnp.dtype(dtype).name}, not bfloat16/float16")
    if head_dim % 8 or head_dim > CUDNN_MAX_HEAD_DIM:
        reasons.append(f"head_dim {head_dim} is not a multiple of 8 up to {CUDNN_MAX_HEAD_DIM}")
    if explicit_mask:
        reasons.append("memory key/values need an explicit mask")
    return reasons


def choose_kernel(requested: str, platform: str, dtype, head_dim: int, explicit_mask: bool = False) -> str:
    """``attention_kernel`` ("auto" | "xla" | "cudnn") -> the kernel to run: "cudnn" where it applies and was not
    ruled out, else "xla". Forcing "cudnn" where it cannot run is a ``ConfigError``."""
    obstacles = cudnn_obstacles(platform, dtype, head_dim, explicit_mask)
    if requested == "cudnn" and obstacles:
        raise ConfigError(f"attention_kernel: 'cudnn' cannot run here ({'; '.join(obstacles)}); use 'auto' or 'xla'")
    if requested == "xla" or obstacles:
        return "xla"
    return "cudnn"


def attention_mask(t: int, s: int, window: int | None) -> jax.Array:
    """(T, S) boolean mask, queries aligned to the last T keys: causal, and within the window if given.

    The alignment is what memory key/values need too: with M memory slots in front of T keys (S = M + T), query i
    sits at key position M + i and sees every slot."""
    i = jnp.arange(t)[:, None] + (s - t)
    j = jnp.arange(s)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= j > i - window
    return allowed


def masked_softmax_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, dropout_rate: float = 0.0,
                             dropout_key: jax.Array | None = None) -> jax.Array:
    """Unscaled attention with the probabilities materialised (so they can be dropped out).
    (..., T, N, H) x (..., S, N, H) x (..., S, N, H), mask broadcastable to (..., N, T, S) -> (..., T, N, H)."""
    logits = jnp.einsum("...TNH,...SNH->...NTS", q, k, preferred_element_type=jnp.float32)
    probs = jax.nn.softmax(jnp.where(mask, logits, jnp.finfo(jnp.float32).min), axis=-1)
    probs = dropout(dropout_rate, probs, dropout_key).astype(v.dtype)
    return jnp.einsum("...NTS,...SNH->...TNH", probs, v)


def blocked_local_attention(q: jax.Array, k: jax.Array, v: jax.Array, window: int, dropout_rate: float = 0.0,
                            dropout_key: jax.Array | None = None) -> jax.Array:
    """Causal sliding-window attention in O(T x window) memory. (B,T,N,H) x3 -> (B,T,N,H).

    The sequence is cut into C blocks of ``window`` queries; a query sees at most ``window`` keys back, all in
    its own block or the one before, so each block attends to 2*window keys and no T x T matrix exists."""
    b, t, n, h = q.shape
    c = -(-t // window)
    pad = [(0, 0), (0, c * window - t), (0, 0), (0, 0)]  # padded queries are dropped; padded keys come after them

    def blocks(x):  # (B, T, N, H) -> (B, C, W, N, H)
        return jnp.pad(x, pad).reshape(b, c, window, n, h)

    def with_previous(x):  # (B, C, W, N, H) -> (B, C, 2W, N, H): block c-1 (zeros before block 0), then block c
        previous = jnp.pad(x, [(0, 0), (1, 0), (0, 0), (0, 0), (0, 0)])[:, :-1]
        return jnp.concatenate([previous, x], axis=2)

    mask = attention_mask(window, 2 * window, window)  # (W, 2W): query r sits at key position W + r
    first = jnp.arange(c)[:, None, None] == 0  # block 0 has no previous block
    mask = mask & ~(first & (jnp.arange(2 * window) < window))  # (C, W, 2W)
    out = masked_softmax_attention(blocks(q), with_previous(blocks(k)), with_previous(blocks(v)),
                                   mask[None, :, None], dropout_rate, dropout_key)  # (B, C, W, N, H)
    return out.reshape(b, c * window, n, h)[:, :t]


def dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array, window: int | None,
                          dropout_rate: float = 0.0, dropout_key: jax.Array | None = None, *,
                          kernel: str = "xla", blocked: bool | None = None) -> jax.Array:
    """Unscaled causal attention. (B,T,N,H), (B,S,N,H), (B,S,N,H) -> (B,T,N,H); softmax in float32.

    Queries are the last T of the S key positions (S > T when memory slots come first). ``kernel`` is "xla" or
    "cudnn" (see ``choose_kernel``). ``blocked`` (default: automatic, see ``BLOCKED_MIN_WINDOWS``) computes a
    local layer block by block on the XLA path; cuDNN's own sliding window never builds the T x T matrix."""
    t, s = q.shape[1], k.shape[1]
    training_dropout = dropout_key is not None and dropout_rate > 0.0
    if window is not None and t == s and kernel == "xla":
        if blocked if blocked is not None else t >= BLOCKED_MIN_WINDOWS * window:
            return blocked_local_attention(q, k, v, window, dropout_rate, dropout_key)
    if training_dropout:  # dropout on the probabilities needs them materialised
        return masked_softmax_attention(q, k, v, attention_mask(t, s, window), dropout_rate, dropout_key)
    if t != s:  # memory slots in front of the keys: jax's is_causal aligns queries to the first keys, not the last
        return jax.nn.dot_product_attention(q, k, v, mask=attention_mask(t, s, window)[None, None], scale=1.0,
                                            implementation="xla")
    local = None if window is None else (window - 1, 0)
    return jax.nn.dot_product_attention(q, k, v, scale=1.0, is_causal=True, local_window_size=local,
                                        implementation=kernel)


class SelfAttention(nnx.Module):
    """Multi-head self-attention of one kind (``global`` or ``local``), GPT-Neo parameterisation.

    Subclasses (linear attention) keep the projections, rotary and dropout and replace ``attend``."""

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
        self.rotary_dim = cfg.rotary_dim
        if kind == "global" and cfg.num_mem_kv:
            # GPT-Neo's memory_key_values: learned slots shared by the whole batch, never rotated (no position).
            init = jax.nn.initializers.normal(0.02)
            meta = axes("memory_length", "heads", "features_per_head")
            self.mem_k = nnx.Param(init(rngs.params(), (cfg.num_mem_kv, n, h)), **meta)  # (S, N, H)
            self.mem_v = nnx.Param(init(rngs.params(), (cfg.num_mem_kv, n, h)), **meta)  # (S, N, H)
        else:
            self.mem_k = self.mem_v = None
        self.kernel = cfg.attention_kernel
        if kind in ("global", "local"):  # a forced kernel that cannot run is an error at start-up, not mid-run
            choose_kernel(self.kernel, jax.default_backend(), COMPUTE_DTYPES[cfg.precision], h,
                          self.mem_k is not None)

    def attend(self, q: jax.Array, k: jax.Array, v: jax.Array, dropout_key: jax.Array | None) -> jax.Array:
        """(B,T,N,H) x3 -> (B,T,N,H): the attention kind itself."""
        if self.mem_k is not None:
            b = k.shape[0]
            k = jnp.concatenate([jnp.broadcast_to(self.mem_k[None], (b, *self.mem_k.shape)).astype(k.dtype), k], 1)
            v = jnp.concatenate([jnp.broadcast_to(self.mem_v[None], (b, *self.mem_v.shape)).astype(v.dtype), v], 1)
            k, v = constrain(k, KEY_VALUE), constrain(v, KEY_VALUE)  # (B, S+T, N, H)
        # The call's dtype decides (sampling runs float32 masters even when training ran in bf16).
        kernel = "xla" if self.kernel == "xla" else choose_kernel(
            "auto", jax.default_backend(), q.dtype, q.shape[-1], self.mem_k is not None)
        return dot_product_attention(q, k, v, self.window, self.attn_dropout, dropout_key, kernel=kernel)

    def __call__(self, x: jax.Array, positions: jax.Array, dropout_key: jax.Array | None = None) -> jax.Array:
        """(B, T, D) inputs at (B, T) positions -> (B, T, D)."""
        attn_key, res_key = dropout_keys(dropout_key, 2)
        q = apply_rotary(constrain(self.q(x), QUERY), positions, self.rotary_dim)  # (B, T, N, H)
        k = apply_rotary(constrain(self.k(x), KEY_VALUE), positions, self.rotary_dim)  # (B, S, N, H)
        v = constrain(self.v(x), KEY_VALUE)  # (B, S, N, H)
        a = self.attend(q, k, v, attn_key)  # (B, T, N, H)
        y = self.out(constrain(a, QUERY))  # (B, T, D)
        return dropout(self.res_dropout, y, res_key)

    def init_cache(self, batch: int, length: int, dtype) -> kv_cache.LayerCache:
        n, h = self.k.kernel.shape[1:]
        return kv_cache.empty(batch, length if self.window is None else min(self.window, length), n, h, dtype)

    def decode(self, x: jax.Array, cache: kv_cache.LayerCache, state: kv_cache.DecodeState):
        """Attention for T new tokens at buffer indices state.index..+T-1 against the cache; returns the output
        and the updated cache. Global layers write first and attend over the whole buffer (and the memory slots);
        local layers attend over the ring (older tokens) plus the new tokens, then keep the newest ``window``."""
        t = x.shape[1]
        positions = state.positions(t)
        q = apply_rotary(self.q(x), positions, self.rotary_dim)  # (B, T, N, H)
        k = apply_rotary(self.k(x), positions, self.rotary_dim).astype(cache.k.dtype)
        v = self.v(x).astype(cache.v.dtype)
        query_index = state.index + jnp.arange(t)
        if self.window is None:
            cache = kv_cache.LayerCache(k=jax.lax.dynamic_update_slice_in_dim(cache.k, k, state.index, axis=1),
                                        v=jax.lax.dynamic_update_slice_in_dim(cache.v, v, state.index, axis=1))
            keys, values, key_index = cache.k, cache.v, jnp.arange(cache.k.shape[1])
        else:
            w = cache.k.shape[1]
            keys = jnp.concatenate([cache.k, k], axis=1)  # (B, W+T, N, H)
            values = jnp.concatenate([cache.v, v], axis=1)
            key_index = jnp.concatenate([kv_cache.ring_indices(state.index, w), query_index])
            kept = min(t, w)  # the newest tokens overwrite the ring slots of their indices
            slots = jnp.mod(query_index[t - kept:], w)
            cache = kv_cache.LayerCache(k=cache.k.at[:, slots].set(k[:, t - kept:]),
                                        v=cache.v.at[:, slots].set(v[:, t - kept:]))
        mask = kv_cache.visible(query_index, key_index, state.pad, self.window)  # (B, T, S)
        if self.mem_k is not None:  # the memory slots come first and every query sees them
            b = x.shape[0]
            keys = jnp.concatenate([jnp.broadcast_to(self.mem_k[None], (b, *self.mem_k.shape)).astype(keys.dtype),
                                    keys], axis=1)
            values = jnp.concatenate([jnp.broadcast_to(self.mem_v[None], (b, *self.mem_v.shape))
                                      .astype(values.dtype), values], axis=1)
            mask = jnp.concatenate([jnp.ones((b, t, self.mem_k.shape[0]), bool), mask], axis=2)
        a = jax.nn.dot_product_attention(q, keys.astype(q.dtype), values.astype(q.dtype), mask=mask[:, None],
                                         scale=1.0)
        return self.out(a), cache


def make_attention(cfg: Config, kind: str, *, rngs: nnx.Rngs) -> nnx.Module | None:
    """The attention slot of a block for a layer of ``kind``; None for ``none`` layers (feed-forward only)."""
    from models.linear_attention import LinearAttention  # it subclasses SelfAttention, so it imports this file

    layers = {"global": SelfAttention, "local": SelfAttention, "linear": LinearAttention, "none": None}
    layer = layers[kind]
    return None if layer is None else layer(cfg, kind, rngs=rngs)
