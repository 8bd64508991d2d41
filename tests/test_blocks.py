"""The block spec against a plain-numpy block: norm kinds and placement, ReZero, macaron, gated MLPs, causal and
bidirectional self-attention with padding, cross-attention, and GPT-Neo's axial positions."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from flax import nnx

from models.block import Block
from models.layers import ACTIVATIONS
from models.mlp import Mlp
from models.gpt_neo import AxialPositions
from models.spec import AttentionSpec, BlockSpec, MlpSpec
from tests import references as ref

D, N, H, F = 16, 2, 8, 24


def make_spec(*, causal=True, window=None, norm="layernorm", position="pre", rezero=False, macaron=False,
              mlp="dense", cross=False, scale=1.0) -> BlockSpec:
    attention = AttentionSpec(kind="global" if window is None else "local", causal=causal, n_embd=D, n_head=N,
                              head_dim=H, window=window, scale=scale, qkv_bias=True)
    return BlockSpec(attention=attention, mlp=MlpSpec(kind=mlp, n_embd=D, d_ff=F, activation="gelu"),
                     cross_attention=AttentionSpec(kind="global", causal=False, n_embd=D, n_head=N, head_dim=H)
                     if cross else None, norm=norm, norm_position=position, norm_epsilon=1e-5, rezero=rezero,
                     macaron=macaron)


def randomized(block: Block, seed: int = 0) -> dict:
    """Sets every parameter to noise (norm scales and ReZero gates around 1), so each one matters; returns them."""
    rng = np.random.default_rng(seed)
    state = nnx.state(block, nnx.Param)
    noisy = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape) * 0.15 + (1.0 if x.ndim <= 1 else 0.0),
                                               jnp.float32), nnx.to_pure_dict(state))
    nnx.replace_by_pure_dict(state, noisy)
    nnx.update(block, state)
    return jax.tree.map(np.asarray, noisy)


def numpy_norm(kind, x, p):
    if kind == "layernorm":
        return ref.layer_norm(x, p["scale"], p["bias"], 1e-5)
    if kind == "rmsnorm":
        return ref.rms_norm(x, p["scale"], 1e-5)
    return ref.scale_norm(x, p["g"], 1e-5)


def numpy_mlp(spec, x, p):
    if spec.mlp.kind == "glu":
        h = ref.gelu(ref.dense(x, p["c_gate"])) * ref.dense(x, p["c_fc"])
    else:
        h = ref.gelu(ref.dense(x, p["c_fc"]))
    return ref.dense(h, p["c_proj"])


def numpy_attention(spec, x, p, allowed, context=None, context_allowed=None):
    source = x if context is None else context
    q, k, v = ref.dense(x, p["q"]), ref.dense(source, p["k"]), ref.dense(source, p["v"])
    return ref.dense(ref.attention(q, k, v, allowed if context is None else context_allowed, spec.scale), p["out"])


def numpy_block(spec: BlockSpec, p: dict, x, allowed, context=None, context_allowed=None):
    def residual(x, f, norm_name, gate_name, factor=1.0):
        if spec.rezero:
            return x + p[gate_name] * factor * f(x)
        if spec.norm_position == "post":
            return numpy_norm(spec.norm, x + factor * f(x), p[norm_name])
        return x + factor * f(numpy_norm(spec.norm, x, p[norm_name]))

    half = 0.5 if spec.macaron else 1.0
    x = np.asarray(x, np.float64)
    if spec.macaron:
        x = x + half * numpy_mlp(spec, x, p["mlp_macaron"])
    x = residual(x, lambda h: numpy_attention(spec.attention, h, p["attn"], allowed), "ln_1", "rezero_1")
    if spec.cross_attention:
        x = residual(x, lambda h: numpy_attention(spec.cross_attention, h, p["crossattention"], None, context,
                                                  context_allowed), "ln_cross", "rezero_cross")
    return residual(x, lambda h: numpy_mlp(spec, h, p["mlp"]), "ln_2", "rezero_2", half)


SPECS = {
    "pre-layernorm-causal": dict(),
    "post-layernorm-bidirectional": dict(causal=False, position="post", scale=H ** -0.5),
    "rmsnorm": dict(norm="rmsnorm"),
    "scalenorm": dict(norm="scalenorm"),
    "rezero": dict(rezero=True),
    "macaron-glu": dict(macaron=True, mlp="glu"),
    "rezero-macaron": dict(rezero=True, macaron=True),
    "glu-local": dict(mlp="glu", window=3),
    "bidirectional-local": dict(causal=False, window=3),
    "cross-attention": dict(cross=True),
}


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("padded", [False, True])
def test_block_matches_numpy(name, padded):
    spec = make_spec(**SPECS[name])
    block = Block(spec, rngs=nnx.Rngs(0))
    p = randomized(block)
    rng = np.random.default_rng(1)
    b, t = 2, 9
    x = rng.normal(size=(b, t, D)).astype(np.float32)
    seg = np.ones((b, t), np.int32)
    if padded:
        seg[1, 6:] = 0
    window = spec.attention.window
    allowed = ref.mask(t, t, window, spec.attention.causal, seg, seg)
    kwargs, context, context_allowed = {}, None, None
    if spec.cross_attention:
        context = rng.normal(size=(b, 5, D)).astype(np.float32)
        context_seg = np.array([[1] * 5, [1] * 3 + [0] * 2], np.int32)
        context_allowed = np.broadcast_to((context_seg != 0)[:, None, :], (b, t, 5))
        kwargs = dict(context=jnp.asarray(context), context_segment_ids=jnp.asarray(context_seg))
    positions = jnp.broadcast_to(jnp.arange(t), (b, t))
    got, _ = block(jnp.asarray(x), positions, jnp.asarray(seg) if padded else None, **kwargs)
    want = numpy_block(spec, p, x, allowed, context, context_allowed)
    real = seg != 0
    np.testing.assert_allclose(np.asarray(got)[real], want[real], atol=2e-4, rtol=2e-4)


def test_rezero_starts_as_the_identity():
    block = Block(make_spec(rezero=True), rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(2).normal(size=(1, 5, D)), jnp.float32)
    out, _ = block(x, jnp.arange(5)[None])
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x))  # the gates start at 0
    params = nnx.to_pure_dict(nnx.state(block, nnx.Param))
    assert {"ln_1", "ln_2"}.isdisjoint(params) and params["rezero_1"].shape == ()


def test_bidirectional_sees_the_future_and_causal_does_not():
    x = np.random.default_rng(3).normal(size=(1, 6, D)).astype(np.float32)
    changed = x.copy()
    changed[0, 4, 0] += 1.0  # one feature: LayerNorm would remove a shift of all of them
    for causal in (True, False):
        block = Block(make_spec(causal=causal), rngs=nnx.Rngs(0))
        randomized(block)
        a, _ = block(jnp.asarray(x), jnp.arange(6)[None])
        b, _ = block(jnp.asarray(changed), jnp.arange(6)[None])
        early = np.abs(np.asarray(a)[0, :4] - np.asarray(b)[0, :4]).max()
        assert (early == 0.0) if causal else (early > 1e-4)


def test_axial_positions_average_a_row_and_a_column():
    axial = AxialPositions([4, 8], D, nnx.Rngs(0))
    rows, columns = np.asarray(axial.axial_wpe_1[...]), np.asarray(axial.axial_wpe_2[...])
    positions = np.array([[0, 1, 8, 31]])
    got = np.asarray(axial(jnp.asarray(positions)))
    want = np.stack([(rows[p // 8] + columns[p % 8]) / 2 for p in positions[0]])[None]
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("kind, kept", [("dense", 2), ("glu", 4)])
@pytest.mark.parametrize("activation", ["gelu", "silu"])
def test_feed_forward_keeps_no_intermediate_of_its_activation(kind, kept, activation):
    """What the backward pass keeps at the size of the (B, T, F) intermediate: the activation's input and what the
    matmuls read (dense: its output; glu: the value half, the activation's output and their product), not the
    activation's own intermediates (tanh gelu: five arrays in all), and the same gradients."""
    mlp = Mlp(MlpSpec(kind=kind, n_embd=D, d_ff=F, activation=activation), rngs=nnx.Rngs(0))
    randomized(mlp)
    x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 5, D)), jnp.float32)

    def backward(mlp):
        graph, params = nnx.split(mlp)
        _, vjp = jax.vjp(lambda p: nnx.merge(graph, p)(x), params)
        intermediates = [leaf for leaf in jax.tree.leaves(vjp) if leaf.size == 2 * 5 * F]
        return len(intermediates), vjp(jnp.ones_like(x))[0]

    count, grads = backward(mlp)
    mlp.activation = ACTIVATIONS[activation]  # what autodiff keeps of the plain function
    plain_count, plain_grads = backward(mlp)
    assert count == kept < plain_count
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), grads, plain_grads)
