"""Attention against plain numpy (tests/references.py): masks (causal, windows both ways, segments), every
softmax path (flag-only, explicit mask, dropout, blocked local), linear attention (causal, bidirectional, carried
sums), memory key/values, rotary, the kernel choice, and cached decoding of one layer."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from flax import nnx

from config import ConfigError
from models import attention
from models.attention import Attention, softmax_attention
from models.kv_cache import LayerCache
from models.linear_attention import bidirectional_linear_attention, causal_linear_attention
from models.rotary import apply_rotary
from models.spec import AttentionSpec
from tests import references as ref
from tests.references import random_qkv


def segments(b, t, seed=0, padding=True):
    """(B, T) segment ids: two or three packed segments per row, with trailing padding (0) if ``padding``."""
    rng = np.random.default_rng(seed)
    out = np.zeros((b, t), np.int32)
    for row in range(b):
        cuts = np.sort(rng.choice(np.arange(1, t - 2), 2, replace=False))
        out[row] = np.searchsorted(cuts, np.arange(t), side="right") + 1
        if padding:
            out[row, t - 1 - row:] = 0
    return out


@pytest.mark.parametrize("t,s", [(1, 1), (7, 7), (3, 9), (1, 9)])
@pytest.mark.parametrize("window", [None, 1, 3, 8, 20])
@pytest.mark.parametrize("causal", [True, False])
def test_position_mask_matches_numpy(t, s, window, causal):
    got = attention.visible(jnp.arange(t) + (s - t), jnp.arange(s), causal, window)
    np.testing.assert_array_equal(np.asarray(got), ref.mask(t, s, window, causal))


def test_causal_local_mask_is_gpt_neo_band():
    # Hugging Face GPT-Neo: tril(ones) xor tril(ones, -window), i.e. query i sees keys i-window+1 .. i.
    full = np.tril(np.ones((10, 10), bool))
    got = attention.self_attention_mask(10, True, 4, None)
    np.testing.assert_array_equal(np.asarray(got), full ^ np.tril(full, -4))


PATHS = {  # name: (causal, window, segments?, dropout taken out?)
    "causal-flags": (True, None, False, False),
    "bidirectional-flags": (False, None, False, False),
    "local-flags": (True, 3, False, False),
    "bidirectional-local": (False, 3, False, False),
    "causal-segments": (True, None, True, False),
    "bidirectional-padding": (False, None, True, False),
    "local-segments": (True, 4, True, False),
    "causal-dropout-path": (True, None, False, True),
    "local-segments-dropout-path": (True, 3, True, True),
}


@pytest.mark.parametrize("name", list(PATHS))
@pytest.mark.parametrize("scale", [1.0, 8 ** -0.5])
def test_softmax_attention_matches_numpy(name, scale, monkeypatch):
    causal, window, with_segments, dropout_path = PATHS[name]
    q, k, v = random_qkv(t=13, seed=len(name))
    seg = segments(2, 13) if with_segments else None
    kwargs = {}
    if dropout_path:  # the materialised-probabilities path, with the dropout itself taken out
        monkeypatch.setattr(attention, "dropout", lambda rate, x, key: x)
        kwargs = dict(dropout_rate=0.5, dropout_key=jax.random.key(0))
    got = softmax_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), causal=causal, window=window, scale=scale,
                            segment_ids=None if seg is None else jnp.asarray(seg), blocked=False, **kwargs)
    allowed = ref.mask(13, 13, window, causal, seg, seg)
    want = ref.attention(q, k, v, allowed, scale)
    if seg is not None:  # padding queries see nothing; their outputs are never used
        got, want = np.asarray(got)[seg != 0], want[seg != 0]
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)


def test_attention_scale_multiplies_the_logits():
    # One query, two keys: the weights are softmax(scale * q.k) exactly.
    q = np.zeros((1, 2, 1, 4), np.float32)
    q[0, 1, 0] = [1.0, 1.0, 1.0, 1.0]
    k = np.zeros((1, 2, 1, 4), np.float32)
    k[0, 0, 0] = [1.0, 0.0, 0.0, 0.0]
    v = np.eye(2, 4, dtype=np.float32).reshape(1, 2, 1, 4)
    for scale in (1.0, 0.5):
        out = np.asarray(softmax_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), causal=True, window=None,
                                           scale=scale))
        e = np.exp(scale)
        np.testing.assert_allclose(out[0, 1, 0, :2], [e / (e + 1), 1 / (e + 1)], rtol=1e-6)


@pytest.mark.parametrize("t,window", [(16, 4), (13, 4), (10, 1), (7, 9), (40, 3)])
@pytest.mark.parametrize("with_segments", [False, True])
def test_blocked_local_equals_unblocked_and_numpy(t, window, with_segments):
    q, k, v = (jnp.asarray(x) for x in random_qkv(t=t, seed=t + window))
    seg = jnp.asarray(segments(2, t, seed=t)) if with_segments and t > 4 else None

    def attend(blocked):
        return np.asarray(softmax_attention(q, k, v, causal=True, window=window, segment_ids=seg, blocked=blocked))

    blocked, unblocked = attend(True), attend(False)
    want = ref.attention(q, k, v, ref.mask(t, t, window, True, seg, seg) if seg is not None else ref.mask(t, t, window))
    keep = np.asarray(seg) != 0 if seg is not None else np.ones((2, t), bool)
    np.testing.assert_allclose(blocked[keep], unblocked[keep], atol=1e-6, rtol=1e-6)
    np.testing.assert_allclose(blocked[keep], want[keep], atol=1e-5, rtol=1e-5)


def test_blocked_local_dropout_really_drops():
    q, k, v = (jnp.asarray(x) for x in random_qkv(t=16, seed=5))
    dropped = softmax_attention(q, k, v, causal=True, window=4, dropout_rate=0.5, dropout_key=jax.random.key(0),
                                blocked=True)
    assert not np.allclose(np.asarray(dropped), ref.attention(q, k, v, ref.mask(16, 16, 4)), atol=1e-3)


def largest_intermediate(fn, *args) -> int:
    jaxpr = jax.make_jaxpr(fn)(*args)
    return max(int(np.prod(v.aval.shape)) for eqn in jaxpr.eqns for v in eqn.outvars)


def test_long_local_layers_never_build_the_full_matrix():
    t, window = 1024, 32
    q = jnp.zeros((1, t, 1, 8))
    automatic = largest_intermediate(lambda q: softmax_attention(q, q, q, causal=True, window=window), q)
    assert automatic <= t * 2 * window, automatic  # O(T x window), while the full matrix would be T x T
    full = largest_intermediate(lambda q: softmax_attention(q, q, q, causal=True, window=window, blocked=False), q)
    assert full >= t * t  # the check can fail


def test_causal_linear_attention_equals_quadratic_reference():
    q, k, v = random_qkv(t=13)
    got, _ = causal_linear_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))
    np.testing.assert_allclose(np.asarray(got), ref.causal_linear_attention(q, k, v), atol=1e-5, rtol=1e-5)


def test_causal_linear_attention_carries_its_sums_across_chunks():
    q, k, v = (jnp.asarray(x) for x in random_qkv(t=13, seed=4))
    whole, sums = causal_linear_attention(q, k, v)
    first, carry = causal_linear_attention(q[:, :5], k[:, :5], v[:, :5])
    second, after = causal_linear_attention(q[:, 5:], k[:, 5:], v[:, 5:], carry=carry)
    np.testing.assert_allclose(np.concatenate([first, second], 1), np.asarray(whole), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(after.kv_sum), np.asarray(sums.kv_sum), rtol=1e-5)
    # Tokens marked not real add nothing: dropping them from the input changes no later output.
    real = jnp.asarray(np.arange(13)[None, :] != 4).repeat(2, 0)
    masked, _ = causal_linear_attention(q, k, v, real)
    without = ref.causal_linear_attention(np.delete(np.asarray(q), 4, 1), np.delete(np.asarray(k), 4, 1),
                                          np.delete(np.asarray(v), 4, 1))
    np.testing.assert_allclose(np.delete(np.asarray(masked), 4, 1), without, atol=1e-5, rtol=1e-5)


def test_causal_linear_attention_has_no_quadratic_matrix():
    t, h = 512, 8
    q = jnp.zeros((1, t, 2, h))
    assert largest_intermediate(lambda q: causal_linear_attention(q, q, q)[0], q) == t * 2 * h * h


def test_bidirectional_linear_attention_matches_numpy():
    q, k, v = random_qkv(t=9, seed=6)
    got = bidirectional_linear_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))
    np.testing.assert_allclose(np.asarray(got), ref.bidirectional_linear_attention(q, k, v), atol=1e-5, rtol=1e-5)


def spec(**changes) -> AttentionSpec:
    return AttentionSpec(**{**dict(kind="global", causal=True, n_embd=32, n_head=4, head_dim=8), **changes})


def layer_params(layer: Attention) -> dict:
    return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(layer, nnx.Param)))


def numpy_layer(p, x, allowed, scale=1.0, memory=False):
    """The Attention module in numpy: projections, optional memory slots in front, attention, output."""
    q, k, v = (ref.dense(x, p[name]) for name in "qkv")
    if memory:
        b = x.shape[0]
        k = np.concatenate([np.repeat(p["mem_k"][None], b, 0), k], 1)
        v = np.concatenate([np.repeat(p["mem_v"][None], b, 0), v], 1)
        m = p["mem_k"].shape[0]
        allowed = np.concatenate([np.ones(allowed.shape[:-1] + (m,), bool), allowed], -1)
    return ref.dense(ref.attention(q, k, v, allowed, scale), p["out"])


def test_memory_key_values_are_seen_by_every_query():
    layer = Attention(spec(num_mem_kv=3), rngs=nnx.Rngs(0))
    x = np.random.default_rng(2).normal(size=(2, 9, 32)).astype(np.float32)
    got, _ = layer(jnp.asarray(x), jnp.broadcast_to(jnp.arange(9), (2, 9)))
    want = numpy_layer(layer_params(layer), x, ref.mask(9, 9), memory=True)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind,window,memory", [("global", None, 0), ("global", None, 2), ("local", 3, 0),
                                                 ("linear", None, 0)])
def test_cached_calls_equal_one_call(kind, window, memory):
    """One call path: prefill then token-by-token with a cache gives the training call's outputs, left padding
    included (padded rows compare on their real tokens)."""
    layer = Attention(spec(kind=kind, window=window, num_mem_kv=memory, qkv_bias=True), rngs=nnx.Rngs(1))
    x = jnp.asarray(np.random.default_rng(3).normal(size=(2, 10, 32)).astype(np.float32))
    pad = np.array([0, 3])
    positions = np.maximum(np.arange(10)[None] - pad[:, None], 0)
    seg = (np.arange(10)[None] >= pad[:, None]).astype(np.int32)
    call = nnx.jit(lambda layer, *args: layer(*args))  # one program per length, not one per primitive
    whole, _ = call(layer, x, jnp.asarray(positions), jnp.asarray(seg))
    cache = layer.init_cache(2, 10, jnp.float32, jnp.asarray(pad))
    outs = []
    for start, stop in ((0, 6), (6, 7), (7, 8), (8, 10)):
        out, cache = call(layer, x[:, start:stop], jnp.asarray(positions[:, start:stop]),
                          jnp.asarray(seg[:, start:stop]), cache)
        outs.append(np.asarray(out))
    np.testing.assert_allclose(np.concatenate(outs, 1)[seg != 0], np.asarray(whole)[seg != 0], atol=1e-5)


def test_local_cache_is_a_ring_of_the_window():
    layer = Attention(spec(kind="local", window=3), rngs=nnx.Rngs(0))
    cache = layer.init_cache(1, 100, jnp.float32)
    assert isinstance(cache, LayerCache) and cache.length == 3 and cache.k.shape == (1, 4, 3, 8)  # (B, N, L, H)


def test_cross_attention_reads_the_context_within_its_segments():
    layer = Attention(spec(causal=False), rngs=nnx.Rngs(2))
    rng = np.random.default_rng(5)
    x, context = rng.normal(size=(2, 5, 32)).astype(np.float32), rng.normal(size=(2, 7, 32)).astype(np.float32)
    context_seg = np.array([[1] * 7, [1] * 4 + [0] * 3], np.int32)
    got, _ = layer(jnp.asarray(x), None, context=jnp.asarray(context), context_segment_ids=jnp.asarray(context_seg))
    p = layer_params(layer)
    q, k, v = ref.dense(x, p["q"]), ref.dense(context, p["k"]), ref.dense(context, p["v"])
    allowed = np.broadcast_to((context_seg != 0)[:, None, :], (2, 5, 7))
    want = ref.dense(ref.attention(q, k, v, allowed), p["out"])
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)


def numpy_rotary(x, positions, rotary_dim):
    """GPT-J's apply_rotary_pos_emb: interleaved pairs (2i, 2i+1) rotated by position / 10000^(2i/rotary_dim)."""
    x = np.asarray(x, np.float64).copy()
    freqs = 10000.0 ** -(np.arange(0, rotary_dim, 2) / rotary_dim)
    angle = positions[:, :, None, None] * freqs  # (B, T, 1, R/2)
    even, odd = x[..., 0:rotary_dim:2].copy(), x[..., 1:rotary_dim:2].copy()
    x[..., 0:rotary_dim:2] = even * np.cos(angle) - odd * np.sin(angle)
    x[..., 1:rotary_dim:2] = odd * np.cos(angle) + even * np.sin(angle)
    return x


@pytest.mark.parametrize("rotary_dim", [8, 4, 2])
def test_rotary_matches_gpt_j_and_is_relative(rotary_dim):
    q, k, _ = random_qkv(t=6, seed=4)
    positions = np.broadcast_to(np.arange(6), (2, 6))
    got = np.asarray(apply_rotary(jnp.asarray(q), jnp.asarray(positions), rotary_dim))
    np.testing.assert_allclose(got, numpy_rotary(q, positions, rotary_dim), atol=1e-5)
    np.testing.assert_array_equal(got[..., rotary_dim:], q[..., rotary_dim:])  # the rest passes through
    # Attention logits depend only on the distance between positions: shifting both by 11 changes nothing.
    rq, rk = (np.asarray(apply_rotary(jnp.asarray(x), jnp.asarray(positions), rotary_dim)) for x in (q, k))
    sq, sk = (np.asarray(apply_rotary(jnp.asarray(x), jnp.asarray(positions + 11), rotary_dim)) for x in (q, k))
    np.testing.assert_allclose(np.einsum("btnh,bsnh->bnts", rq, rk), np.einsum("btnh,bsnh->bnts", sq, sk),
                               atol=1e-4)
    assert not np.allclose(got, q, atol=1e-3)


def test_kernel_choice():
    bf16, f32 = jnp.bfloat16, jnp.float32
    hopper, ampere = {"max_head_dim": 256}, {"max_head_dim": 128}  # what cudnn_head_dim_limit finds on each
    assert attention.choose_kernel("auto", "gpu", bf16, 64, **ampere) == "cudnn"
    assert attention.choose_kernel("auto", "gpu", bf16, 128, **ampere) == "cudnn"
    assert attention.choose_kernel("auto", "gpu", bf16, 256, **hopper) == "cudnn"
    assert attention.choose_kernel("cudnn", "gpu", jnp.float16, 64, **ampere) == "cudnn"
    assert attention.choose_kernel("xla", "gpu", bf16, 64, **ampere) == "xla"
    for platform, dtype, head_dim in [("cpu", bf16, 64), ("gpu", f32, 64), ("gpu", bf16, 60),
                                      ("gpu", bf16, 256)]:
        assert attention.choose_kernel("auto", platform, dtype, head_dim, **ampere) == "xla"
        with pytest.raises(ConfigError, match="attention_kernel: 'cudnn' cannot run here"):
            attention.choose_kernel("cudnn", platform, dtype, head_dim, **ampere)
    with pytest.raises(ConfigError, match="head_dim 264 is not a multiple of 8 up to 256"):
        attention.choose_kernel("cudnn", "gpu", bf16, 264, **hopper)
    assert attention.choose_kernel("auto", "gpu", bf16, 64, explicit_mask=True, **ampere) == "xla"
    with pytest.raises(ConfigError, match="the platform is cpu, not a CUDA GPU; the compute dtype is float32"):
        Attention(spec(kernel="cudnn"), rngs=nnx.Rngs(0))  # forced where it cannot run: at start-up


def test_cudnn_layers_take_the_xla_path_at_odd_lengths():
    """jax's cuDNN training kernel refuses odd sequence lengths, bias or not (ViT: 16 patches and the class token
    make 17): a cuDNN layer computes those on the XLA path. Here on a CPU, where a call into cuDNN would fail."""
    q, k, v = (jax.random.normal(key, (2, 17, 2, 16), jnp.bfloat16) for key in jax.random.split(jax.random.key(0), 3))

    def attend(kernel):
        return softmax_attention(q, k, v, causal=False, window=None, scale=0.25, kernel=kernel)

    np.testing.assert_array_equal(np.asarray(attend("cudnn"), np.float32), np.asarray(attend("xla"), np.float32))


def test_decoding_through_cudnn_where_it_cannot_run_is_one_line_at_start():
    """decode_kernel 'cudnn' on a CPU: a ConfigError when the model is built, not a failure mid-generation."""
    from flax import nnx

    from config import ConfigError
    from models import registry
    from tests.common import tiny_config

    with pytest.raises(ConfigError, match=r"^decode_kernel: 'cudnn' cannot run here \(the platform is cpu, not a CUDA "
                                          r"GPU\); use 'xla'$"):
        registry.build(tiny_config(decode_kernel="cudnn"), nnx.Rngs(0))
