"""cuDNN flash attention on a real GPU against the XLA path, in bf16: global (causal) and local (sliding window)
layers, outputs and gradients. Runs where jax sees a CUDA GPU with cuDNN (the benchmarks' machine); a CPU-only
machine has no cuDNN kernel to compare, and the kernel choice itself is tested in test_attention.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import attention

on_gpu = jax.default_backend() == "gpu" and attention.cudnn_head_dim_limit() is not None
pytestmark = pytest.mark.skipif(not on_gpu, reason=f"needs a CUDA GPU with cuDNN flash attention; jax runs on "
                                f"{jax.default_backend()} (the suite sets JAX_PLATFORMS=cpu unless given: "
                                "JAX_PLATFORMS=cuda on a GPU)")


@pytest.mark.parametrize("window", [None, 64], ids=["global", "local"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_cudnn_matches_xla_in_bf16(window, head_dim):
    b, t, n = 2, 256, 4
    q, k, v, cotangent = (jax.random.normal(key, (b, t, n, head_dim), jnp.bfloat16)
                          for key in jax.random.split(jax.random.key(0), 4))

    def run(kernel):
        def f(q, k, v):
            out = attention.softmax_attention(q, k, v, causal=True, window=window, scale=head_dim ** -0.5,
                                              kernel=kernel, blocked=False)
            return jnp.sum(out.astype(jnp.float32) * cotangent.astype(jnp.float32)), out

        (_, out), grads = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))(q, k, v)
        return [np.asarray(x, np.float32) for x in (out, *grads)]

    assert "cudnn" in jax.jit(lambda q, k, v: attention.softmax_attention(
        q, k, v, causal=True, window=window, kernel="cudnn", blocked=False)).lower(q, k, v).as_text().lower()
    for got, want, name in zip(run("cudnn"), run("xla"), ("out", "dq", "dk", "dv")):
        scale = np.abs(want).max()
        # bf16 carries 8 bits of mantissa: the two kernels' sums may differ by a few units of its last place
        np.testing.assert_allclose(got / scale, want / scale, atol=2 ** -6, err_msg=name)


def test_cudnn_decoding_computes_what_the_xla_path_computes():
    """decode_kernel 'cudnn': each cached call's attention (a left-padded prefill, then one token at a time through
    a global layer and a local window the run wraps) runs cuDNN's flash attention with the cache's mask as a bias,
    and gives the XLA path's logits within bf16's range (teacher-forced: the same tokens go in on both sides)."""
    from flax import nnx

    from models import registry
    from tests.common import tiny_config

    cfg = tiny_config(n_layer=2, n_embd=256, n_head=4, local_attention_radius=16, precision="bfloat16")
    params = nnx.state(registry.build(cfg, nnx.Rngs(0)), nnx.Param)
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), nnx.to_pure_dict(params))
    tokens = np.random.default_rng(0).integers(1, cfg.n_vocab, (2, cfg.n_ctx))
    prompt, pad = 12, jnp.asarray([4, 0], jnp.int32)
    logits = {}
    for kernel in ("xla", "cudnn"):
        graphdef = nnx.graphdef(registry.build(cfg.replace(decode_kernel=kernel), nnx.Rngs(0)))
        model = nnx.merge(graphdef, nnx.State(params))
        call = jax.jit(lambda params, tokens, cache, g=graphdef: nnx.merge(g, nnx.State(params))(tokens, cache=cache))
        cache = model.init_cache(2, cfg.n_ctx, pad, jnp.bfloat16)
        assert ("cudnn" in call.lower(params, jnp.asarray(tokens[:, :1]), cache).as_text().lower()) == (
            kernel == "cudnn"), kernel
        out, cache = call(params, jnp.asarray(tokens[:, :prompt]), cache)
        steps = [out[:, -1]]
        for i in range(prompt, cfg.n_ctx):  # 20 more: the local window of 16 wraps
            out, cache = call(params, jnp.asarray(tokens[:, i:i + 1]), cache)
            steps.append(out[:, 0])
        logits[kernel] = np.asarray(jnp.stack(steps, 1), np.float32)
    scale = np.abs(logits["xla"]).max()
    np.testing.assert_allclose(logits["cudnn"] / scale, logits["xla"] / scale, atol=2 ** -6)
