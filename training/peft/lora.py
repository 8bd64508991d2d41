"""LoRA: a low-rank update ``scale * (x A) B`` added to any einsum projection (q/k/v/out, the MLP, a head) and to the
weights a module uses in its own einsums (a mixture of experts' router and expert weights).

``LoraEinsum`` is the projection it replaces, with the same ``kernel`` and ``bias`` (their parameter paths do not
change, so base weights load and export as before) plus ``lora_a`` and ``lora_b``. A weight ``W`` that a module
lists in its ``EINSUMS`` gets a ``LoraUpdate`` beside it, ``W_lora``, which the module adds to that einsum's output
(models/moe.py); ``W`` stays where it was. For a kernel of the einsum ``in,kernel->out`` the kernel's dimensions split
into those contracted with the input (A's, then the rank) and the output ones (the rank, then B's): q's (D, N, H)
kernel gets A (D, R) and B (R, N, H). A dimension the input, the kernel and the output share (the experts E of
``BECD,EDF->BECF``) is in both factors, one low-rank update per expert: A (E, D, R), B (E, R, F). Each factor carries
the logical names of the kernel dimensions it shares, so it is split like the weight it adapts; the rank dimension
(``lora_rank``) is never split. B starts at zero, so a fresh LoRA model computes exactly what its base does.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from config import ConfigError
from models.axes import LORA_RANK, axes
from models.layers import dropout, scoped_dropout_key

SEAM = "{}_lora"  # where the LoRA of a module's weight W sits: W_lora, beside W


def _rank_letter(einsum: str) -> str:
    return next(c for c in "rRzZ" if c not in einsum)


class FactorEinsums(NamedTuple):
    down: str  # input, A -> (..., R)
    up: str  # (..., R), B -> output
    delta: str  # A, B -> the kernel's update
    a_dims: list[int]  # the kernel dimensions A carries before the rank: shared, then contracted
    b_dims: list[int]  # the kernel dimensions B carries: shared, then (after the rank) produced
    contracted: list[int]  # the kernel dimensions summed with the input: their product bounds the rank


def factor_einsums(einsum: str) -> FactorEinsums:
    """``"BTD,DNH->BTNH"`` -> down ``BTD,Dr->BTr``, up ``BTr,rNH->BTNH``, delta ``Dr,rNH->DNH``; with a dimension
    in the input, the kernel and the output, ``"BECD,EDF->BECF"`` -> ``BECD,EDr->BECr``, ``BECr,ErF->BECF``,
    ``EDr,ErF->EDF``."""
    spec = einsum.replace(" ", "")
    inputs, rest = spec.split(",")
    kernel, out = rest.split("->")
    r = _rank_letter(spec)
    shared = [i for i, c in enumerate(kernel) if c in inputs and c in out]
    contracted = [i for i, c in enumerate(kernel) if c in inputs and c not in out]
    produced = [i for i, c in enumerate(kernel) if c not in inputs]
    s, a, b = ("".join(kernel[i] for i in dims) for dims in (shared, contracted, produced))
    kept = "".join(c for c in inputs if c not in a)
    return FactorEinsums(f"{inputs},{s}{a}{r}->{kept}{r}", f"{kept}{r},{s}{r}{b}->{out}",
                         f"{s}{a}{r},{s}{r}{b}->{kernel}", shared + contracted, shared + produced, contracted)


class LoraUpdate(nnx.Module):
    """The factors of one weight's update, ``scale * dropout(x) A B`` (scale = alpha / rank), added to the output
    ``y`` of the weight's einsum ``einsum`` by ``lora(x, y)``; ``merged`` means the update is already in the weight
    (see ``merge``/``unmerge``)."""

    def __init__(self, kernel: nnx.Param, einsum: str, rank: int, alpha: float, dropout_rate: float, salt: int, *,
                 rngs: nnx.Rngs):
        self.init_factors(kernel, einsum, rank, alpha, dropout_rate, salt, rngs)

    def init_factors(self, kernel: nnx.Param, einsum: str, rank: int, alpha: float, dropout_rate: float, salt: int,
                     rngs: nnx.Rngs) -> None:
        factors = factor_einsums(einsum)
        self.down, self.up, self.delta = factors.down, factors.up, factors.delta
        shape, names = kernel.shape, kernel.get_metadata().get("logical_axes") or (None,) * kernel.ndim
        a_shape = tuple(shape[i] for i in factors.a_dims) + (rank,)
        fan_in = math.prod(shape[i] for i in factors.contracted)
        bound = fan_in ** -0.5  # kaiming-uniform with a=sqrt(5), as PyTorch's Linear and peft's LoRA A
        self.lora_a = nnx.Param(jax.random.uniform(rngs.params(), a_shape, minval=-bound, maxval=bound),
                                **axes(*(names[i] for i in factors.a_dims), LORA_RANK))
        shared = len(factors.a_dims) - len(factors.contracted)  # the dimensions A and B both carry come first
        b_names = [names[i] for i in factors.b_dims]
        self.lora_b = nnx.Param(jnp.zeros(tuple(shape[i] for i in factors.b_dims[:shared]) + (rank,)
                                          + tuple(shape[i] for i in factors.b_dims[shared:])),
                                **axes(*b_names[:shared], LORA_RANK, *b_names[shared:]))
        self.scale, self.dropout_rate, self.salt, self.merged = alpha / rank, dropout_rate, salt, False

    def update(self) -> jax.Array:
        """The low-rank update of the kernel: ``scale * A B``, shaped like the kernel."""
        return self.scale * jnp.einsum(self.delta, self.lora_a[...], self.lora_b[...])

    def __call__(self, inputs: jax.Array, y: jax.Array) -> jax.Array:
        """``y`` (the weight's einsum of ``inputs``) plus the update's share, unless merged into the weight."""
        if self.merged:
            return y
        x = dropout(self.dropout_rate, inputs, scoped_dropout_key(self.salt))
        h = jnp.einsum(self.down, x, self.lora_a[...].astype(x.dtype))  # (..., R)
        return y + (self.scale * jnp.einsum(self.up, h, self.lora_b[...].astype(x.dtype))).astype(y.dtype)


class LoraEinsum(LoraUpdate, nnx.Einsum):
    """An ``nnx.Einsum`` plus its ``LoraUpdate``."""

    def __init__(self, base: nnx.Einsum, rank: int, alpha: float, dropout_rate: float, salt: int, *,
                 rngs: nnx.Rngs):
        for name, value in vars(base).items():  # the base projection's kernel, bias and settings, as they are
            if not name.startswith("_pytree__"):
                setattr(self, name, value)
        self.init_factors(base.kernel, base.einsum_str, rank, alpha, dropout_rate, salt, rngs)

    def __call__(self, inputs: jax.Array, einsum_str: str | None = None, out_sharding=None) -> jax.Array:
        return LoraUpdate.__call__(self, inputs, nnx.Einsum.__call__(self, inputs, einsum_str, out_sharding))


def lora_modules(model: nnx.Module) -> list[tuple[str, LoraUpdate]]:
    """Every ``LoraEinsum`` and ``LoraUpdate`` in ``model`` with its path (``blocks/0/attn/q``,
    ``blocks/1/mlp/w_in_lora``)."""
    return [("/".join(map(str, path)), m) for path, m in nnx.iter_graph(model) if isinstance(m, LoraUpdate)]


def _adapted_weights(model: nnx.Module) -> list[tuple[LoraUpdate, nnx.Param]]:
    """(LoRA, the weight it updates) for every LoRA in ``model``: a projection's own kernel, or the weight W
    beside a ``W_lora``."""
    found = []
    for _, m in nnx.iter_graph(model):
        if isinstance(m, LoraEinsum):
            found.append((m, m.kernel))
        elif isinstance(m, nnx.Module):
            found += [(getattr(m, SEAM.format(name)), getattr(m, name)) for name in getattr(type(m), "EINSUMS", ())
                      if isinstance(getattr(m, SEAM.format(name), None), LoraUpdate)]
    return found


def merge(model: nnx.Module) -> nnx.Module:
    """Adds every LoRA update into its kernel (in place): outputs stay the same, the extra einsums are gone. A
    kernel that layers share (share_parameters) under LoRAs of their own cannot hold their different updates: a
    one-line error."""
    adapted = _adapted_weights(model)
    owners: dict[int, str] = {}
    for name, lora in lora_modules(model):
        kernel = next(k for m, k in adapted if m is lora)
        if id(kernel) in owners:
            raise ConfigError(f"merge: {name} and {owners[id(kernel)]} adapt one shared weight (share_parameters) with "
                              "LoRAs of their own, whose different updates one weight cannot hold; keep them unmerged")
        owners[id(kernel)] = name
    for lora, kernel in adapted:
        if not lora.merged:
            kernel[...] = kernel[...] + lora.update().astype(kernel.dtype)
            lora.merged = True
    return model


def unmerge(model: nnx.Module) -> nnx.Module:
    """Takes every merged LoRA update back out of its kernel (in place)."""
    for lora, kernel in _adapted_weights(model):
        if lora.merged:
            kernel[...] = kernel[...] - lora.update().astype(kernel.dtype)
            lora.merged = False
    return model
