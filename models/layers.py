"""Small shared pieces: initialisers, projections and norms carrying logical-axis metadata, activations."""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

# GPT-Neo (mesh-tensorflow) LayerNorm epsilon, as in Hugging Face's GPTNeoConfig.layer_norm_epsilon.
LAYER_NORM_EPSILON = 1e-5

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


def axes(*names: str | None) -> dict:
    """Variable metadata naming each dimension; ``parallel.layout`` turns it into a PartitionSpec."""
    return {"logical_axes": tuple(names)}


def projection(einsum: str, shape: Sequence[int], logical: Sequence[str | None], stddev: float,
               rngs: nnx.Rngs, bias: Sequence[str] | None = None) -> nnx.Einsum:
    """An einsum projection with normal(stddev) init and an optional zero bias over the trailing dims ``bias``."""
    bias_shape = tuple(shape[-len(bias):]) if bias else None
    return nnx.Einsum(einsum, tuple(shape), bias_shape, kernel_init=jax.nn.initializers.normal(stddev),
                      kernel_metadata=axes(*logical), bias_metadata=axes(*bias) if bias else {}, rngs=rngs)


def layer_norm(features: int, rngs: nnx.Rngs) -> nnx.LayerNorm:
    """LayerNorm over ``embd``; statistics are computed in float32 whatever the compute dtype."""
    return nnx.LayerNorm(features, epsilon=LAYER_NORM_EPSILON, scale_metadata=axes("embd"),
                         bias_metadata=axes("embd"), rngs=rngs)


def dropout_keys(key: jax.Array | None, n: int) -> list[jax.Array | None]:
    """``n`` independent dropout keys, or ``n`` Nones when not training."""
    return [None] * n if key is None else list(jax.random.split(key, n))


def dropout(rate: float, x: jax.Array, key: jax.Array | None) -> jax.Array:
    if key is None or rate == 0.0:
        return x
    return nnx.Dropout(rate)(x, deterministic=False, rngs=key)
