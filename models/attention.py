"""Multi-head attention of every kind, with one call path for training, prefill and decoding.

``Attention.__call__(x, positions, segment_ids, cache)`` serves all three: ``cache=None`` is training/eval over
the whole sequence; with a cache the new tokens' keys join the cached ones first. Masking is one rule for every
case: a query sees a key if both are in the same segment (segment 0 is padding and sees nothing), if the key is
not after the query (causal layers), and if it is within ``window`` (local layers). Without segment ids, in
training, no mask is built at all: the kernels take "causal" and the window as flags.

Kinds: ``global`` (softmax over every key), ``local`` (a sliding window: token i sees i-window+1..i, both ways for
bidirectional layers), ``linear`` (models/linear_attention.py). ``num_mem_kv`` > 0 adds learned key/value slots
that every query of a global layer sees, whatever its position (GPT-Neo's memory_key_values). Cross-attention
(encoder-decoder blocks) takes its keys and values from a ``context`` instead of ``x``, or, when decoding, from a
``CrossCache`` that holds them computed once. An optional additive ``bias`` on the logits (T5's relative position
bias) goes through the same path to every kernel.

Two seams for pluggable parts (training/peft/ fills them; the model knows none of them): ``prefix``, a module whose
call gives learned (P, N, H) keys and values that every query sees, like the memory slots (prefix tuning, P-tuning
v2), and ``attention_fn``, a function with ``softmax_attention``'s signature that replaces it (a custom attention).

Logits are ``scale * q.k``: GPT-Neo and T5 use scale 1 (mesh-tensorflow folds 1/sqrt(head_dim) into the query
init), GPT-2 and BERT 1/sqrt(head_dim).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from config import ConfigError
from models.axes import HEADS, axes, constrain, per_device, target_platform
from models.kv_cache import CrossCache, LayerCache, LinearCache, heads_first
from models.layers import dropout, over_flat_positions, projection
from models.linear_attention import bidirectional_linear_attention, causal_linear_attention
from models.rotary import apply_rotary
from models.spec import AttentionSpec

KEY_VALUE = ("batch", "memory_length", "heads", "features_per_head")
COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

# A causal local layer whose sequence spans at least this many windows attends block by block (O(T x window)
# memory) instead of through a masked T x T matrix. Below it the full matrix is small and one fused op is faster.
BLOCKED_MIN_WINDOWS = 4
# cuDNN flash attention (jax.nn.dot_product_attention(implementation="cudnn")): half-precision inputs and a head
# dim that is a multiple of 8 up to the limit of the installed cuDNN on this GPU (cudnn_head_dim_limit).
CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)


@functools.cache
def cudnn_head_dim_limit() -> int | None:
    """The largest head dim the installed cuDNN's flash attention takes on this GPU, asked of jax's own check (256
    from Hopper on with a recent cuDNN, else 128); None where no cuDNN is found."""
    try:
        from jax._src.cudnn import fused_attention_stablehlo as fused

        version = fused.check_cudnn_version()
    except (ImportError, AttributeError, RuntimeError):
        return None
    for head_dim in (256, 128):
        x = jax.ShapeDtypeStruct((1, 128, 1, head_dim), jnp.bfloat16)
        try:
            fused.check_is_flash_attention(x, x, x, fused.AttentionLayout.BTNH.value, version, has_bias=False,
                                           is_training=True)
            return head_dim
        except NotImplementedError:
            continue
        except (AttributeError, TypeError):  # jax's internal check moved: the limit every supported GPU meets
            return 128
    return None


def cudnn_obstacles(platform: str, dtype, head_dim: int, explicit_mask: bool = False,
                    max_head_dim: int | None = None) -> list[str]:
    """Why the cuDNN kernel cannot run for these inputs (empty when it can). ``max_head_dim``: the installed
    cuDNN's limit (default: asked of it on a GPU)."""
    reasons = []
    on_gpu = platform in ("gpu", "cuda")
    if not on_gpu:
        reasons.append(f"the platform is {platform}, not a CUDA GPU")
    if jnp.dtype(dtype) not in [jnp.dtype(d) for d in CUDNN_DTYPES]:
        reasons.append(f"the compute dtype is {jnp.dtype(dtype).name}, not bfloat16/float16")
    if on_gpu:
        limit = max_head_dim if max_head_dim is not None else cudnn_head_dim_limit()
        if limit is None:
            reasons.append("no cuDNN with flash attention was found")
        elif head_dim % 8 or head_dim > limit:
            reasons.append(f"head_dim {head_dim} is not a multiple of 8 up to {limit} (the installed cuDNN's limit "
                           "on this GPU)")
    if explicit_mask:
        reasons.append("memory key/values need an explicit mask")
    return reasons


def choose_kernel(requested: str, platform: str, dtype, head_dim: int, explicit_mask: bool = False,
                  max_head_dim: int | None = None) -> str:
    """``attention_kernel`` ("auto" | "xla" | "cudnn" | "splash") -> the kernel to run: on a TPU "splash" (Pallas;
    models/splash.py), on a GPU "cudnn" where it applies, else "xla". Forcing a kernel where it cannot run is a
    ``ConfigError``. Per call, a splash layer still takes the XLA path where the kernel cannot (an explicit mask,
    a bias, dropout, lengths that are not a multiple of 128)."""
    if requested == "splash" or (requested == "auto" and platform == "tpu"):
        if platform != "tpu":
            raise ConfigError(f"attention_kernel: 'splash' cannot run here (the platform is {platform}, not a TPU); "
                              "use 'auto' or 'xla'")
        return "xla" if explicit_mask else "splash"
    obstacles = cudnn_obstacles(platform, dtype, head_dim, explicit_mask, max_head_dim)
    if requested == "cudnn" and obstacles:
        raise ConfigError(f"attention_kernel: 'cudnn' cannot run here ({'; '.join(obstacles)}); use 'auto' or 'xla'")
    if requested == "xla" or obstacles:
        return "xla"
    return "cudnn"


def visible(query_index: jax.Array, key_index: jax.Array, causal: bool, window: int | None) -> jax.Array:
    """(T, S): may the query at buffer index ``query_index`` (T,) see the key at ``key_index`` (S,)? Not if the key
    comes after it (causal layers), nor if it is ``window`` or more away (local layers)."""
    q, k = query_index[:, None], key_index[None, :]
    allowed = jnp.ones((q.shape[0], k.shape[1]), bool)
    if causal:
        allowed &= k <= q
    if window is not None:
        allowed &= (k > q - window) & (k < q + window)
    return allowed


def same_segment(query_segments: jax.Array, key_segments: jax.Array) -> jax.Array:
    """(B, T) x (B, S) segment ids -> (B, T, S): a query sees keys of its own segment; segment 0 is padding."""
    return (query_segments[:, :, None] == key_segments[:, None, :]) & (key_segments[:, None, :] != 0)


def self_attention_mask(t: int, causal: bool, window: int | None, segment_ids: jax.Array | None) -> jax.Array:
    """The (T, T) or (B, T, T) mask of T tokens attending to each other."""
    index = jnp.arange(t)
    mask = visible(index, index, causal, window)
    return mask if segment_ids is None else mask[None] & same_segment(segment_ids, segment_ids)


@jax.custom_vjp
def attention_logits(q: jax.Array, k: jax.Array) -> jax.Array:
    """(..., T, N, H) x (..., S, N, H) -> (..., N, T, S) logits accumulated in float32. Their gradient is
    rounded to the inputs' dtype before its two matmuls, as flash kernels do: autodiff alone would run them
    with a float32 operand, in float32, on bfloat16 inputs."""
    return jnp.einsum("...TNH,...SNH->...NTS", q, k, preferred_element_type=jnp.float32)


def _attention_logits_forward(q, k):
    return attention_logits(q, k), (q, k)


def _attention_logits_backward(residuals, grad):
    q, k = residuals
    grad = grad.astype(q.dtype)
    return (jnp.einsum("...NTS,...SNH->...TNH", grad, k), jnp.einsum("...NTS,...TNH->...SNH", grad, q))


attention_logits.defvjp(_attention_logits_forward, _attention_logits_backward)


def masked_softmax_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float = 1.0,
                             dropout_rate: float = 0.0, dropout_key: jax.Array | None = None,
                             bias: jax.Array | None = None) -> jax.Array:
    """Attention with the probabilities materialised (so they can be dropped out).
    (..., T, N, H) x (..., S, N, H) x (..., S, N, H), mask and ``bias`` broadcastable to (..., N, T, S)
    -> (..., T, N, H)."""
    logits = scale * attention_logits(q, k)
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)
    probs = jax.nn.softmax(jnp.where(mask, logits, jnp.finfo(jnp.float32).min), axis=-1)
    probs = dropout(dropout_rate, probs, dropout_key).astype(v.dtype)
    return jnp.einsum("...NTS,...SNH->...TNH", probs, v)


def blocked_local_attention(q: jax.Array, k: jax.Array, v: jax.Array, window: int,
                            segment_ids: jax.Array | None = None, scale: float = 1.0, dropout_rate: float = 0.0,
                            dropout_key: jax.Array | None = None) -> jax.Array:
    """Causal sliding-window attention in O(T x window) memory. (B,T,N,H) x3 -> (B,T,N,H).

    The sequence is cut into C blocks of ``window`` queries; a query sees at most ``window`` keys back, all in
    its own block or the one before, so each block attends to 2*window keys and no T x T matrix exists."""
    b, t, n, h = q.shape
    c = -(-t // window)

    def blocks(x):  # (B, T, ...) -> (B, C, W, ...); padded queries are dropped, padded keys come after them
        x = jnp.pad(x, [(0, 0), (0, c * window - t)] + [(0, 0)] * (x.ndim - 2))
        return x.reshape(b, c, window, *x.shape[2:])

    def with_previous(x):  # (B, C, W, ...) -> (B, C, 2W, ...): block c-1 (zeros before block 0), then block c
        previous = jnp.pad(x, [(0, 0), (1, 0)] + [(0, 0)] * (x.ndim - 2))[:, :-1]
        return jnp.concatenate([previous, x], axis=2)

    mask = visible(jnp.arange(window) + window, jnp.arange(2 * window), True, window)  # (W, 2W)
    first = jnp.arange(c)[:, None, None] == 0  # block 0 has no previous block
    mask = mask & ~(first & (jnp.arange(2 * window) < window))  # (C, W, 2W)
    mask = mask[None]  # (1, C, W, 2W)
    if segment_ids is not None:
        query_segments, key_segments = blocks(segment_ids), with_previous(blocks(segment_ids))  # (B, C, W|2W)
        mask = mask & (query_segments[..., :, None] == key_segments[..., None, :]) & (key_segments[..., None, :] != 0)
    out = masked_softmax_attention(blocks(q), with_previous(blocks(k)), with_previous(blocks(v)),
                                   mask[:, :, None], scale, dropout_rate, dropout_key)  # (B, C, W, N, H)
    return out.reshape(b, c * window, n, h)[:, :t]


# What an attention layer passes its attention function (below, in Attention): q, k, v and these keywords.
CALL_KEYWORDS = ("causal", "window", "scale", "segment_ids", "mask", "dropout_rate", "dropout_key", "kernel", "bias")


def softmax_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool, window: int | None,
                      scale: float = 1.0, segment_ids: jax.Array | None = None, mask: jax.Array | None = None,
                      dropout_rate: float = 0.0, dropout_key: jax.Array | None = None, kernel: str = "xla",
                      blocked: bool | None = None, bias: jax.Array | None = None) -> jax.Array:
    """(B,T,N,H), (B,S,N,H), (B,S,N,H) -> (B,T,N,H); softmax in float32.

    With an explicit ``mask`` (B, T, S) (decoding, memory slots, cross-attention) that mask is the rule. Otherwise
    keys are the queries' own positions (S = T), masked by ``causal``, ``window`` and ``segment_ids`` (B, T).
    ``bias`` (B or 1, N, T, S) is added to the logits before the mask (T5's relative position bias).
    ``kernel`` is "xla", "cudnn" or "splash" (see ``choose_kernel``; "cudnn" with an explicit mask: the
    ``decode_kernel``, the mask handed to cuDNN as a bias, forward only, in bfloat16 or float16); ``blocked``
    (default: automatic, see ``BLOCKED_MIN_WINDOWS``) computes a causal local layer block by block on the XLA path
    (never with a bias, which spans the whole T x S grid)."""
    t, s = q.shape[1], k.shape[1]
    dropping = dropout_key is not None and dropout_rate > 0.0
    explicit_mask = mask is not None
    if kernel == "splash":
        from models.splash import splash_attention, splash_obstacles

        if mask is None and bias is None and not dropping and not splash_obstacles(t, s):
            return splash_attention(q, k, v, causal=causal, window=window, scale=scale, segment_ids=segment_ids)
        kernel = "xla"
    if mask is None:
        if window is not None and causal and kernel == "xla" and bias is None and (
                blocked if blocked is not None else t >= BLOCKED_MIN_WINDOWS * window):
            return blocked_local_attention(q, k, v, window, segment_ids, scale, dropout_rate, dropout_key)
        if kernel == "cudnn" and (t % 2 or s % 2):
            # cuDNN's backward pass with a bias needs even lengths, and jax hands the kernel an empty bias when
            # there is none, so its check refuses odd lengths always (ViT: 16 patches and the class token).
            kernel = "xla"
        if kernel == "cudnn" and not dropping and segment_ids is None:
            # No mask materialised: the kernel takes causality and the window as flags (and a bias in its dtype).
            local = None if window is None else (window - 1, 0 if causal else window - 1)
            return cudnn_attention(q, k, v, bias=None if bias is None else bias.astype(q.dtype), scale=scale,
                                   is_causal=causal, local_window_size=local)
        mask = self_attention_mask(t, causal, window, segment_ids) if s == t else jnp.ones((1, t, s), bool)
    if mask.ndim == 2:
        mask = mask[None]
    if explicit_mask and kernel == "cudnn" and bias is None and not dropping and q.dtype in CUDNN_DTYPES:
        return cudnn_attention(q, k, v, mask=mask[:, None], scale=scale)
    # The XLA path spells the softmax out: two einsums with float32 logits, which XLA fuses into fewer, faster
    # loops than jax.nn.dot_product_attention's XLA implementation (1.3x forward and backward on a 2-core CPU at
    # B=8, T=256, 8 heads of 32, causal or local).
    return masked_softmax_attention(q, k, v, mask[:, None], scale, dropout_rate, dropout_key, bias)


def cudnn_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, bias: jax.Array | None = None,
                    mask: jax.Array | None = None, **options) -> jax.Array:
    """jax's cuDNN flash attention (``jax.nn.dot_product_attention``): (B, T, N, H) -> (B, T, N, H). GSPMD splits
    it over the mesh by jax's partitioning rule for it, which cannot run inside a shard_map (a train step that
    accumulates each device's gradients, parallel/steps.py): there each device calls it on its own share."""
    extras = {name: x for name, x in (("bias", bias), ("mask", mask)) if x is not None}  # (B or 1, N or 1, T, S)

    def attend(q, k, v, *extra):
        return jax.nn.dot_product_attention(q, k, v, **dict(zip(extras, extra)), **options, implementation="cudnn")

    if not jax.sharding.get_abstract_mesh().manual_axes:
        return attend(q, k, v, *extras.values())
    extra_names = [("batch" if x.shape[0] > 1 else None, "heads" if x.shape[1] > 1 else None, None, None)
                   for x in extras.values()]
    return per_device(attend, (HEADS, HEADS, HEADS, *extra_names), HEADS, whole=("sequence",))(
        q, k, v, *extras.values())


def checked_attention_output(fn, out, like: jax.Array) -> jax.Array:
    """A custom attention function's result as softmax_attention gives it: a (B, T, N, H) array of ``like``'s
    shape, in its dtype. Another shape would fail deep in the output projection, or (a size-1 dimension) broadcast
    there without a word; a float32 result under bfloat16 compute (softmax in float32 for stability) would carry
    float32 through the projection and the residual stream: it is cast back, as softmax_attention casts its own."""
    got, dtype = getattr(out, "shape", None), getattr(out, "dtype", None)
    if got is None or tuple(got) != tuple(like.shape) or not jnp.issubdtype(dtype, jnp.floating):
        name = getattr(fn, "__name__", repr(fn))
        what = (f"a {type(out).__name__}" if got is None else f"shape {tuple(got)}" if tuple(got) != like.shape
                else f"an array of {dtype}")
        raise ConfigError(f"attention_fn: {name} returned {what}, not the (B, T, N, H) = {tuple(like.shape)} "
                          "float array softmax_attention returns")
    return out.astype(like.dtype)


class Attention(nnx.Module):
    """Multi-head attention of one ``AttentionSpec``: q/k/v projections (einsum, ``DNH`` kernels), optional rotary
    and memory slots, the attention kind, and the output projection."""

    def __init__(self, spec: AttentionSpec, *, rngs: nnx.Rngs):
        d, n, h = spec.n_embd, spec.n_head, spec.head_dim
        qkv_axes = ("embd", "heads", "features_per_head")
        bias = qkv_axes[1:] if spec.qkv_bias else None
        q_std, k_std, v_std, out_std = spec.init
        # Einsums over flattened positions P (models/layers.over_flat_positions).
        self.q = projection("PD,DNH->PNH", (d, n, h), qkv_axes, q_std, rngs, bias=bias)
        self.k = projection("PD,DNH->PNH", (d, n, h), qkv_axes, k_std, rngs, bias=bias)
        self.v = projection("PD,DNH->PNH", (d, n, h), qkv_axes, v_std, rngs, bias=bias)
        self.out = projection("PNH,NHD->PD", (n, h, d), ("heads", "features_per_head", "embd"), out_std, rngs,
                              bias=("embd",) if spec.out_bias else None)
        if spec.num_mem_kv:
            # GPT-Neo's memory_key_values: learned slots shared by the whole batch, never rotated (no position).
            init = jax.nn.initializers.normal(0.02)
            meta = axes("memory_length", "heads", "features_per_head")
            self.mem_k = nnx.Param(init(rngs.params(), (spec.num_mem_kv, n, h)), **meta)  # (S, N, H)
            self.mem_v = nnx.Param(init(rngs.params(), (spec.num_mem_kv, n, h)), **meta)  # (S, N, H)
        else:
            self.mem_k = self.mem_v = None
        self.prefix = nnx.data(None)  # pluggable: () -> ((P, N, H) keys, (P, N, H) values) every query sees
        self.attention_fn = None  # pluggable: a function with softmax_attention's signature used instead of it
        self.spec = spec
        self.kernel = "xla"
        self.decode_kernel = "xla"
        if spec.kind != "linear":  # a forced kernel that cannot run is an error at start-up, not mid-run
            self.kernel = choose_kernel(spec.kernel, target_platform(), COMPUTE_DTYPES[spec.precision], h,
                                        spec.num_mem_kv > 0)
            if spec.decode_kernel == "cudnn":
                # the dtype is the decoding's own (bfloat16 weights decode in bfloat16): checked per call
                obstacles = cudnn_obstacles(target_platform(), jnp.bfloat16, h)
                if obstacles:
                    raise ConfigError(f"decode_kernel: 'cudnn' cannot run here ({'; '.join(obstacles)}); use 'xla'")
                self.decode_kernel = "cudnn"

    def init_cache(self, batch: int, length: int, dtype, pad: jax.Array | None = None) -> LayerCache | LinearCache:
        """An empty decoding cache for ``batch`` rows of up to ``length`` tokens, left-padded by ``pad`` (B,)
        (default: none)."""
        s = self.spec
        if s.kind == "linear":
            return LinearCache.empty(batch, s.n_head, s.head_dim)
        return LayerCache.empty(batch, length if self._ring_window is None else min(s.window, length), s.n_head,
                                s.head_dim, dtype, pad)

    @property
    def _ring_window(self) -> int | None:
        """The window of a local layer's ring cache; None: a cache of every position. A custom attention function
        gets a local layer's keys in position order, as a global layer's (ALiBi's distances read them so), not a
        ring's slot order."""
        return self.spec.window if self.attention_fn is None else None

    def cross_cache(self, context: jax.Array, context_segment_ids: jax.Array) -> CrossCache:
        """The keys and values of an encoder output (B, S, D) with its (B, S) segment ids, for decoding: computed
        once, then every decoding step's cross-attention reads them."""
        k = constrain(over_flat_positions(self.k, context), KEY_VALUE)  # (B, S, N, H)
        v = constrain(over_flat_positions(self.v, context), KEY_VALUE)  # (B, S, N, H)
        return CrossCache(k=heads_first(k), v=heads_first(v), segment_ids=context_segment_ids.astype(jnp.int32))

    def __call__(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array | None = None,
                 cache: LayerCache | LinearCache | CrossCache | None = None, dropout_key: jax.Array | None = None,
                 context: jax.Array | None = None, context_segment_ids: jax.Array | None = None,
                 bias: jax.Array | None = None) -> tuple[jax.Array, LayerCache | LinearCache | CrossCache | None]:
        """(B, T, D) tokens at (B, T) ``positions`` -> (B, T, D) and the updated cache (None without one).

        ``segment_ids`` (B, T): tokens attend within their segment; 0 marks padding. ``cache``: decoding state of
        this layer; the new tokens continue it. ``context`` (B, S, D) with ``context_segment_ids`` (B, S): keys and
        values come from it (cross-attention; no rotary, no causality); a ``CrossCache`` holds them precomputed.
        ``bias`` (B or 1, N, T, S): added to the logits, S being every key this call attends to (the sequence,
        or a global layer's whole cache buffer when decoding)."""
        s = self.spec
        cross = context is not None or isinstance(cache, CrossCache)
        q = constrain(over_flat_positions(self.q, x), HEADS)  # (B, T, N, H)
        if isinstance(cache, CrossCache):
            k, v, context_segment_ids = heads_first(cache.k), heads_first(cache.v), cache.segment_ids  # (B, S, N, H)
        else:
            source = x if context is None else context
            k = constrain(over_flat_positions(self.k, source), KEY_VALUE)  # (B, S, N, H)
            v = constrain(over_flat_positions(self.v, source), KEY_VALUE)  # (B, S, N, H)
        if not cross:
            q, k = (apply_rotary(t, positions, s.rotary_dim, s.rotary_style) for t in (q, k))
        if s.kind == "linear":
            if bias is not None:
                raise ValueError("linear attention has no logits to add a bias to")
            a, cache = self._linear(q, k, v, segment_ids, cache)
        elif cross:
            mask = None
            if context_segment_ids is not None:
                queries = segment_ids if segment_ids is not None else jnp.ones(q.shape[:2], jnp.int32)
                mask = same_segment(queries, context_segment_ids)
            a = self._softmax(q, k, v, mask, None, dropout_key, cross=True, bias=bias)
        else:
            mask = None
            if cache is not None:
                query_index = cache.end + jnp.arange(q.shape[1])
                (k, v, key_segments, key_index), cache = cache.extend(k, v, self._ring_window)
                mask = visible(query_index, key_index, s.causal, s.window)[None] & same_segment(segment_ids,
                                                                                               key_segments)
            a = self._softmax(q, k, v, mask, segment_ids, dropout_key, bias=bias, decoding=cache is not None)
        return over_flat_positions(self.out, constrain(a, HEADS), feature_dims=2), cache  # (B, T, D)

    def memory(self) -> tuple[jax.Array, jax.Array] | None:
        """The (S, N, H) keys and values every query sees before the sequence's own: the memory slots, then a
        pluggable ``prefix``'s (None when there are neither)."""
        parts = [] if self.mem_k is None else [(self.mem_k[...], self.mem_v[...])]
        if self.prefix is not None:
            parts.append(self.prefix())
        if not parts:
            return None
        return tuple(jnp.concatenate(kv, axis=0) for kv in zip(*parts))

    def _softmax(self, q, k, v, mask, segment_ids, dropout_key, cross: bool = False, bias=None,
                 decoding: bool = False) -> jax.Array:
        s = self.spec
        memory = self.memory()
        if memory is not None:  # the memory slots come first and every query sees them
            b, t, slots = q.shape[0], q.shape[1], memory[0].shape[0]
            memory = [jnp.broadcast_to(m[None], (b, *m.shape)).astype(k.dtype) for m in memory]
            k, v = jnp.concatenate([memory[0], k], 1), jnp.concatenate([memory[1], v], 1)
            if mask is None:
                mask = self_attention_mask(t, s.causal, s.window, segment_ids)
            mask = jnp.broadcast_to(mask, (b, t, mask.shape[-1]))
            mask = jnp.concatenate([jnp.ones((b, t, slots), bool), mask], axis=2)
            if bias is not None:  # the slots have no position: no bias for them
                bias = jnp.pad(bias, [(0, 0), (0, 0), (0, 0), (slots, 0)])
        attend = self.attention_fn or softmax_attention  # called with q, k, v and CALL_KEYWORDS
        # Named by kind, so that a profile tells global layers' attention kernels from local ones'.
        with jax.named_scope("cross_attention" if cross else f"{s.kind}_attention"):
            a = attend(q, k.astype(q.dtype), v.astype(q.dtype), causal=s.causal and not cross,
                       window=None if cross else s.window, scale=s.scale, segment_ids=segment_ids,
                       mask=mask, dropout_rate=s.dropout, dropout_key=dropout_key,
                       kernel=self.kernel if mask is None else self.decode_kernel if decoding else "xla",
                       bias=bias)
        if self.attention_fn is not None:
            a = checked_attention_output(self.attention_fn, a, q)
        return a  # (B, T, N, H)

    def _linear(self, q, k, v, segment_ids, cache):
        real = None if segment_ids is None else segment_ids != 0
        if not self.spec.causal:
            return bidirectional_linear_attention(q, k, v, real), cache
        a, sums = causal_linear_attention(q, k, v, real, cache)
        return a, (sums if cache is not None else None)
