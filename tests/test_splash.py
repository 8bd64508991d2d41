"""Splash attention (the TPU's Pallas kernel, models/splash.py) in Pallas' interpret mode on CPU against the XLA
path: causal global and local layers with packed segments, a bidirectional local layer, and on 8 devices with
batch and heads split (the kernel runs per device under shard_map)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec

from config import ConfigError
from models.attention import Attention, choose_kernel, softmax_attention
from models.axes import placing, target_platform
from models.spec import AttentionSpec
from parallel.layout import Layout
from parallel.mesh import make_mesh
from tests.common import jaxpr_equations, on_a_tpu

B, T, N, H = 2, 128, 4, 32


def inputs():
    q, k, v = (jax.random.normal(key, (B, T, N, H)) for key in jax.random.split(jax.random.key(0), 3))
    segments = jnp.asarray(np.repeat([[1] * 80 + [2] * 40 + [0] * 8], B, axis=0), jnp.int32)
    return q, k, v, segments


def attend(kernel, causal, window, segments=None):
    def f(q, k, v):
        return softmax_attention(q, k, v, causal=causal, window=window, scale=H ** -0.5, segment_ids=segments,
                                 kernel=kernel, blocked=False)
    return f


@pytest.mark.parametrize("causal, window, packed", [(True, None, True), (True, 48, False), (False, 32, False)],
                         ids=["causal-global-packed", "causal-local", "bidirectional-local"])
def test_splash_equals_xla_outputs_and_gradients(causal, window, packed):
    q, k, v, segments = inputs()
    segments = segments if packed else None
    real = np.asarray(segments if packed else np.ones((B, T)))[..., None, None] != 0
    # padding rows count for nothing (a loss gives them weight 0): their outputs are free, their cotangents 0
    cotangent = jnp.where(real, jax.random.normal(jax.random.key(1), q.shape), 0.0)
    results = []
    for kernel in ("splash", "xla"):
        f = attend(kernel, causal, window, segments)
        out, pullback = jax.vjp(f, q, k, v)
        results.append([out, *pullback(cotangent)])
    for got, want, name in zip(*results, ("out", "dq", "dk", "dv")):
        np.testing.assert_allclose(np.where(real, got, 0), np.where(real, want, 0), atol=2e-5, err_msg=name)


def test_splash_per_device_on_a_mesh_equals_one_device():
    """Also in a second program with the same shapes (a run's eval step after its train step), which reuses the
    cached kernel: built inside the first program's shard_map, its mask arrays were that trace's values and the
    second program failed with an UnexpectedTracerError."""
    q, k, v, segments = inputs()
    f = attend("splash", True, 48, segments)
    want = f(q, k, v)
    layout = Layout.from_config(make_mesh("x:2,y:4"), "batch:x,heads:y")
    with layout.active():
        got = jax.jit(f)(q, k, v)
        doubled = jax.jit(lambda q, k, v: 2 * f(q, k, v))(q, k, v)
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(doubled, 2 * want, atol=2e-6)


def test_splash_per_device_inside_a_shard_map_over_the_batch_axis_equals_one_device():
    """accumulate_unreduced traces the model under a shard_map manual over the batch axes (parallel/steps.py):
    the kernel's own shard_map then takes the mesh's other axes."""
    q, k, v, segments = inputs()

    def f(q, k, v, segments):
        return softmax_attention(q, k, v, causal=True, window=48, scale=H ** -0.5, segment_ids=segments,
                                 kernel="splash", blocked=False)

    layout = Layout.from_config(make_mesh("x:2,y:4"), "batch:x,heads:y")

    def rows(*args):  # one device's rows, heads still split over y
        with layout.without(("x",)).active():
            return f(*args)

    rows_of = PartitionSpec("x")
    got = jax.jit(jax.shard_map(rows, mesh=layout.mesh, in_specs=rows_of, out_specs=rows_of, axis_names={"x"},
                                check_vma=False))(q, k, v, segments)
    np.testing.assert_allclose(got, f(q, k, v, segments), atol=1e-6)


def test_kernel_choice_on_tpus():
    assert choose_kernel("auto", "tpu", jnp.bfloat16, 64) == "splash"
    assert choose_kernel("auto", "tpu", jnp.float32, 64, explicit_mask=True) == "xla"  # memory slots: a mask
    assert choose_kernel("xla", "tpu", jnp.bfloat16, 64) == "xla"
    with pytest.raises(ConfigError, match="attention_kernel: 'splash' cannot run here .the platform is cpu"):
        choose_kernel("splash", "cpu", jnp.float32, 64)


def test_the_kernel_is_chosen_for_the_layouts_devices():
    """A dry run compiles for TPUs from a CPU process (parallel/dry_run.py --topology): built under a layout over
    TPU devices, a layer takes the TPU's kernel, whatever jax's default backend is."""
    spec = AttentionSpec(kind="local", causal=True, n_embd=64, n_head=4, head_dim=16, window=32)
    assert target_platform() == jax.default_backend() == "cpu"
    assert Attention(spec, rngs=nnx.Rngs(0)).kernel == "xla"
    with placing(on_a_tpu()):
        assert target_platform() == "tpu"
        assert Attention(spec, rngs=nnx.Rngs(0)).kernel == "splash"
    with Layout.from_config(make_mesh("x:-1"), "batch:x").active():
        assert target_platform() == "cpu"


def kernel_operand_dtypes(jaxpr) -> set[str]:
    """The float dtypes going into every Pallas kernel in ``jaxpr`` and the jaxprs nested in it."""
    return {v.aval.dtype.name for eqn in jaxpr_equations(jaxpr) if eqn.primitive.name == "pallas_call"
            for v in eqn.invars if jnp.issubdtype(v.aval.dtype, jnp.floating)}


@pytest.mark.parametrize("kind, dtype", [("TPU v3", "float32"), ("TPU v5 lite", "bfloat16")])
def test_splash_computes_in_float32_on_tpus_without_bfloat16_matmuls(kind, dtype):
    """The Mosaic compiler of TPU v2 and v3 rejects bfloat16 matmul operands inside a kernel (E2001, seen when
    compiling for Colab's v2-8 and v3-8): there the kernels take float32, forward and backward; elsewhere the
    inputs' bfloat16. The result keeps the inputs' dtype."""
    from models.splash import splash_attention

    q = jnp.zeros((1, 128, 2, 64), jnp.bfloat16)

    def loss(q):
        return splash_attention(q, q, q, causal=True, window=None).astype(jnp.float32).sum()

    with placing(on_a_tpu(kind)):
        forward = jax.make_jaxpr(lambda q: splash_attention(q, q, q, causal=True, window=None))(q)
        backward = jax.make_jaxpr(jax.grad(loss))(q)
    assert forward.out_avals[0].dtype == jnp.bfloat16
    assert kernel_operand_dtypes(forward.jaxpr) == {dtype}
    # the backward kernels also take the forward's float32 log-sum-exp
    assert ("bfloat16" in kernel_operand_dtypes(backward.jaxpr)) == (dtype == "bfloat16")
