"""Small shared pieces: projections and norms carrying logical-axis metadata, activations, dropout."""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from models.axes import axes

# GPT-Neo's `linear` layer init (mesh-tensorflow); also BERT's and GPT-2's initializer_range.
BASE_STDDEV = 0.02

ACTIVATIONS = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=True),  # mesh-tensorflow's gelu is the tanh form
    "gelu_exact": lambda x: jax.nn.gelu(x, approximate=False),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "selu": jax.nn.selu,
    "elu": jax.nn.elu,
    "softplus": jax.nn.softplus,
    "tanh": jnp.tanh,
    "sigmoid": jax.nn.sigmoid,
}


def projection(einsum: str, shape: Sequence[int], logical: Sequence[str | None], stddev: float,
               rngs: nnx.Rngs, bias: Sequence[str] | None = None) -> nnx.Einsum:
    """An einsum projection with normal(stddev) init and an optional zero bias over the trailing dims ``bias``."""
    bias_shape = tuple(shape[-len(bias):]) if bias else None
    return nnx.Einsum(einsum, tuple(shape), bias_shape, kernel_init=jax.nn.initializers.normal(stddev),
                      kernel_metadata=axes(*logical), bias_metadata=axes(*bias) if bias else {}, rngs=rngs)


class ScaleNorm(nnx.Module):
    """GPT-Neo's ``scalenorm``: x normalised to zero mean and unit variance over ``embd``, times one learned scalar
    ``g`` (init 1). Statistics in float32."""

    def __init__(self, epsilon: float, rngs: nnx.Rngs):
        del rngs  # nothing random to initialise
        self.g = nnx.Param(jnp.ones(()), **axes())
        self.epsilon = epsilon

    def __call__(self, x: jax.Array) -> jax.Array:
        y = x.astype(jnp.float32)
        y = y - y.mean(-1, keepdims=True)
        y = y * jax.lax.rsqrt(jnp.mean(y * y, -1, keepdims=True) + self.epsilon)
        return (y * self.g[...]).astype(x.dtype)


def norm(kind: str, features: int, epsilon: float, rngs: nnx.Rngs) -> nnx.Module:
    """A norm over ``embd``: "layernorm" (scale and bias), "rmsnorm" (scale only, T5) or "scalenorm" (GPT-Neo).
    Statistics are computed in float32 whatever the compute dtype."""
    if kind == "layernorm":
        return nnx.LayerNorm(features, epsilon=epsilon, scale_metadata=axes("embd"), bias_metadata=axes("embd"),
                             rngs=rngs)
    if kind == "rmsnorm":
        return nnx.RMSNorm(features, epsilon=epsilon, scale_metadata=axes("embd"), rngs=rngs)
    if kind == "scalenorm":
        return ScaleNorm(epsilon, rngs)
    raise ValueError(f"unknown norm kind {kind!r}")


def dropout_keys(key: jax.Array | None, n: int) -> list[jax.Array | None]:
    """``n`` independent dropout keys, or ``n`` Nones when not training."""
    return [None] * n if key is None else list(jax.random.split(key, n))


def dropout(rate: float, x: jax.Array, key: jax.Array | None) -> jax.Array:
    if key is None or rate == 0.0:
        return x
    return nnx.Dropout(rate)(x, deterministic=False, rngs=key)
