"""Small shared pieces: projections and norms carrying logical-axis metadata, activations, dropout."""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from typing import Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from models.axes import axes, constrain, splits, target_platform

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


def _elish(x):  # GPT-Neo's formula: x/(1+e^x) above 0, (e^x-1)/(e^-x+1) below
    e = jnp.exp(jnp.minimum(x, 0.0))  # where() picks one branch; clamping keeps the other finite
    return jnp.where(x > 0, x / (1 + jnp.exp(x)), (e - 1) / (1 / e + 1))


# GPT-Neo's parameter-free activations (its models/activations.py). rrelu drew its slope from U(0, 1) when
# building each layer there; here it is the mean slope 0.5, so runs are reproducible.
ACTIVATIONS.update({
    "abs": jnp.abs, "sin": jnp.sin, "cos": jnp.cos, "sign": jnp.sign,
    "lrelu001": lambda x: jax.nn.leaky_relu(x, 0.01),
    "lrelu020": lambda x: jax.nn.leaky_relu(x, 0.20),
    "id": lambda x: x,
    "triangle_relax": lambda x: jnp.sin(x) - jnp.sin(3 * x) / 9 + jnp.sin(5 * x) / 25 - jnp.sin(7 * x) / 49,
    "square_relax": lambda x: jnp.cos(x) - jnp.cos(3 * x) / 3 + jnp.cos(5 * x) / 5 - jnp.cos(7 * x) / 7,
    "spike": lambda x: 1 / (1 + x ** 2),
    "spike2": lambda x: jnp.exp(-x ** 2),
    "tanhshrink": lambda x: x - jnp.tanh(x),
    "softsign": jax.nn.soft_sign,
    "softmax": lambda x: jax.nn.softmax(x, axis=-1),  # over the intermediate features
    "logsoftmax": lambda x: jax.nn.log_softmax(x, axis=-1),
    "bipolarsigmoid": lambda x: 2 * jax.nn.sigmoid(x) - 1,
    "rrelu": lambda x: (0.5 * jnp.abs(x) + x) / 1.5,
    "elish": _elish,
    "arcsinh": jnp.arcsinh,
    "maxsig": lambda x: jnp.maximum(x, jax.nn.sigmoid(x)),
    "cosid": lambda x: jnp.cos(x) - x,
    "minsin": lambda x: jnp.minimum(x, jnp.sin(x)),
    "maxtanh": lambda x: jnp.maximum(x, jnp.tanh(x)),
    "mish": lambda x: x * jnp.tanh(jax.nn.softplus(x)),
    "tanhexp": lambda x: x * jnp.tanh(jnp.exp(x)),
    "lisht": lambda x: x * jnp.tanh(x),
    "seagull": lambda x: jnp.log1p(x ** 2),
    "snake": lambda x: x + jnp.sin(x) ** 2,
    "roottanh": lambda x: jnp.cbrt(x ** 2 + 1) * jnp.tanh(x),
    "softplusmone": lambda x: jax.nn.softplus(x) - 1,
})


@functools.cache  # one function per name: a layer's graph compares it, and the stacked layers must be equal
def feed_forward_activation(name: str) -> Callable[[jax.Array], jax.Array]:
    """``ACTIVATIONS[name]`` for a feed-forward layer's (B, T, F) intermediate, its gradient computed from its input
    alone (``jax.checkpoint``) rather than from what autodiff keeps of its forward pass (for tanh gelu, the tanh: one
    more (B, T, F) array written and read per layer). The matmul before it then ends in the activation for XLA:GPU,
    which runs bias and gelu in cuBLAS's epilogue (BIAS_GELU_AUX) instead of a kernel of their own: on one H100
    (2026-11-27, T=2048, bf16, in one run) the 125M train step went from 419,257 to 423,494 tokens/s at batch 8
    (10.35 -> 9.22 GiB peak) and from 466,375 to 478,500 at batch 16 (19.12 -> 16.87 GiB)."""
    return jax.checkpoint(ACTIVATIONS[name])


def over_flat_positions(project: Callable[[jax.Array], jax.Array], x: jax.Array, feature_dims: int = 1
                        ) -> jax.Array:
    """``project`` ((P, *features) -> (P, *out): a projection whose einsum takes one positions axis P, an output
    head, a tied embedding's ``attend``) applied to x (..., *features), its leading dims (batch, sequence)
    flattened into P and restored after. For a (B, T, ...) einsum's weight gradient XLA:CPU copies the gradient
    transposed: forward and backward of GPT-Neo's tied head and loss at 2048 x 256 x 50,257 took 986 ms against
    844 flattened, an untied (D, V) kernel 1,956 ms against 938, the 125M train step at T=512 ran 3-5% faster with
    the blocks' projections flattened too. Elsewhere the reshapes are free."""
    lead, features = x.shape[:x.ndim - feature_dims], x.shape[x.ndim - feature_dims:]
    y = project(x.reshape(-1, *features))
    return y.reshape(*lead, *y.shape[1:])


def projection(einsum: str, shape: Sequence[int], logical: Sequence[str | None], stddev: float,
               rngs: nnx.Rngs, bias: Sequence[str] | None = None) -> nnx.Einsum:
    """An einsum projection with normal(stddev) init and an optional zero bias over the trailing dims ``bias``."""
    bias_shape = tuple(shape[-len(bias):]) if bias else None
    return nnx.Einsum(einsum, tuple(shape), bias_shape, kernel_init=jax.nn.initializers.normal(stddev),
                      kernel_metadata=axes(*logical), bias_metadata=axes(*bias) if bias else {}, rngs=rngs)


# logits_pad_multiple null pads the output head's matmul to this on GPUs: on one H200 (2026-11-27, T=2048, bf16)
# it made the 125M train step 14.6% faster (376,191 -> 430,947 tokens/s: XLA ran the 50257-wide matmuls far below
# the blocks' rate) and the 1.3B step 6.4%. Not on CPUs, where the same step ran up to 20% slower padded.
GPU_LOGITS_MULTIPLE = 128

# A logits matmul over fewer positions than this (a decode step: one per row) is bound by reading the weight,
# whatever its shape; padding it would only add a copy of the weight to every step.
PAD_MIN_POSITIONS = 128


def logits_pad_multiple(setting: int | None) -> int:
    """``logits_pad_multiple`` for the device the model is built for: as set, or for null GPU_LOGITS_MULTIPLE on a
    GPU and 0 (no padding) elsewhere."""
    if setting is not None:
        return setting
    return GPU_LOGITS_MULTIPLE if target_platform() == "gpu" else 0


def pad_vocab(weight: jax.Array, axis: int, multiple: int, positions: int) -> jax.Array:
    """An output head's ``weight`` with zero rows appended along its vocabulary ``axis`` up to a multiple of
    ``multiple`` (``logits_pad_multiple``), for a matmul over ``positions`` rows; as it is for 0, an aligned size,
    fewer than PAD_MIN_POSITIONS positions, or a layout that splits the vocabulary (whose size the split divides
    already: padding the whole would move rows between devices)."""
    rows = weight.shape[axis]
    extra = -rows % multiple if multiple else 0
    if not extra or positions < PAD_MIN_POSITIONS or splits("vocab") or splits("activation_vocab"):
        return weight
    pads = [(0, 0)] * weight.ndim
    pads[axis] = (0, extra)
    return jnp.pad(weight, pads)


class Embed(nnx.Embed):
    """``nnx.Embed`` computing in its table's dtype. flax fixes an Embed's compute dtype at the table's dtype when
    created (float32), so the train step's bfloat16 copy of the table would come out as float32 activations and
    promote every matmul after it (and the tied logits) back to float32. As a tied output head (``attend``) its
    matmul runs over the table padded to ``logits_multiple`` rows (``pad_vocab``), the padding's logits dropped."""

    def __init__(self, *args, logits_multiple: int | None = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.dtype = None  # follow the table: promote_dtype then keeps the inputs' common dtype
        self.logits_multiple = logits_pad_multiple(logits_multiple)

    def __call__(self, inputs: jax.Array) -> jax.Array:
        """(...) ids -> (..., D) rows. The rows come out placed like the table's columns, so the table is first
        placed like the residual stream on the model dimension (``activation_embd``): with ``embd`` split and the
        residual stream whole (``activation_embd:none``) it is gathered whole for the lookup, as FSDP gathers
        every weight, where XLA's partitioner would look the rows up split and then replicate them whole to split
        them over the batch ("Involuntary full rematerialization")."""
        names = tuple("activation_embd" if n == "embd" else n for n in self.embedding.get_metadata()["logical_axes"])
        table = constrain(self.embedding[...], names)  # (V, D)
        return jnp.take(table, inputs, axis=0)  # flax's lookup, on the placed table

    def attend(self, query: jax.Array) -> jax.Array:
        table = self.embedding[...]  # (V, D)
        padded = pad_vocab(table, 0, self.logits_multiple, math.prod(query.shape[:-1]))
        return jnp.dot(query, padded.T)[..., :table.shape[0]]  # in the operands' common dtype, as flax's


class VocabEinsum(nnx.Einsum):
    """An untied output head ``PD,DV->PV`` (no bias) whose matmul runs over its kernel padded to
    ``logits_multiple`` columns (``pad_vocab``), the padding's logits dropped."""

    def __init__(self, n_embd: int, n_vocab: int, stddev: float, rngs: nnx.Rngs, logits_multiple: int | None = 0):
        super().__init__("PD,DV->PV", (n_embd, n_vocab), kernel_init=jax.nn.initializers.normal(stddev),
                         kernel_metadata=axes("embd", "vocab"), rngs=rngs)
        self.logits_multiple = logits_pad_multiple(logits_multiple)

    def __call__(self, inputs: jax.Array) -> jax.Array:
        kernel = self.kernel[...]  # (D, V)
        padded = pad_vocab(kernel, 1, self.logits_multiple, math.prod(inputs.shape[:-1]))
        return jnp.einsum(self.einsum_str, inputs, padded, precision=self.precision)[..., :kernel.shape[1]]


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


_scope = threading.local()


@contextlib.contextmanager
def dropout_scope(key: jax.Array | None) -> Iterator[None]:
    """While active, ``scoped_dropout_key`` derives keys from ``key`` (None: not training). A block opens one, so
    parts plugged into it (LoRA, adapters) drop out without a key in their call signature."""
    previous = getattr(_scope, "key", None)
    _scope.key = key
    try:
        yield
    finally:
        _scope.key = previous


def scoped_dropout_key(salt: int) -> jax.Array | None:
    """The enclosing ``dropout_scope``'s key folded with ``salt`` (each part its own), or None outside training."""
    key = getattr(_scope, "key", None)
    return None if key is None else jax.random.fold_in(key, salt)
