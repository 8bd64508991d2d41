"""LoRA: a low-rank update ``scale * (x A) B`` added to any einsum projection (q/k/v/out, the MLP, a head).

``LoraEinsum`` is the projection it replaces, with the same ``kernel`` and ``bias`` (their parameter paths do not
change, so base weights load and export as before) plus ``lora_a`` and ``lora_b``. For a kernel of the einsum
``in,kernel->out`` the kernel's dimensions split into those contracted with the input (A's, then the rank) and the
output ones (the rank, then B's): q's (D, N, H) kernel gets A (D, R) and B (R, N, H). Each factor carries the logical
names of the kernel dimensions it shares, so it is split like the weight it adapts; the rank dimension
(``lora_rank``) is never split. B starts at zero, so a fresh LoRA model computes exactly what its base does.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from models.axes import LORA_RANK, axes
from models.layers import dropout, scoped_dropout_key


def _rank_letter(einsum: str) -> str:
    return next(c for c in "rRzZ" if c not in einsum)


def factor_einsums(einsum: str) -> tuple[str, str, str, list[int], list[int]]:
    """``"BTD,DNH->BTNH"`` -> (down ``BTD,Dr->BTr``, up ``BTr,rNH->BTNH``, delta ``Dr,rNH->DNH``, the kernel's
    contracted dimension indices, its output dimension indices)."""
    spec = einsum.replace(" ", "")
    inputs, rest = spec.split(",")
    kernel, out = rest.split("->")
    r = _rank_letter(spec)
    contracted = [i for i, c in enumerate(kernel) if c in inputs]
    produced = [i for i, c in enumerate(kernel) if c not in inputs]
    a, b = "".join(kernel[i] for i in contracted), "".join(kernel[i] for i in produced)
    kept = "".join(c for c in inputs if c not in a)
    return f"{inputs},{a}{r}->{kept}{r}", f"{kept}{r},{r}{b}->{out}", f"{a}{r},{r}{b}->{kernel}", contracted, produced


class LoraEinsum(nnx.Einsum):
    """An ``nnx.Einsum`` plus ``scale * dropout(x) A B`` (scale = alpha / rank); ``merged`` means the update is
    already in the kernel (see ``merge``/``unmerge``)."""

    def __init__(self, base: nnx.Einsum, rank: int, alpha: float, dropout_rate: float, salt: int, *,
                 rngs: nnx.Rngs):
        for name, value in vars(base).items():  # the base projection's kernel, bias and settings, as they are
            if not name.startswith("_pytree__"):
                setattr(self, name, value)
        self.down, self.up, self.delta, contracted, produced = factor_einsums(base.einsum_str)
        shape, names = base.kernel.shape, base.kernel.get_metadata().get("logical_axes") or (None,) * base.kernel.ndim
        a_shape = tuple(shape[i] for i in contracted) + (rank,)
        fan_in = math.prod(a_shape[:-1])
        bound = fan_in ** -0.5  # kaiming-uniform with a=sqrt(5), as PyTorch's Linear and peft's LoRA A
        self.lora_a = nnx.Param(jax.random.uniform(rngs.params(), a_shape, minval=-bound, maxval=bound),
                                **axes(*(names[i] for i in contracted), LORA_RANK))
        self.lora_b = nnx.Param(jnp.zeros((rank,) + tuple(shape[i] for i in produced)),
                                **axes(LORA_RANK, *(names[i] for i in produced)))
        self.scale, self.dropout_rate, self.salt, self.merged = alpha / rank, dropout_rate, salt, False

    def update(self) -> jax.Array:
        """The low-rank update of the kernel: ``scale * A B``, shaped like the kernel."""
        return self.scale * jnp.einsum(self.delta, self.lora_a[...], self.lora_b[...])

    def __call__(self, inputs: jax.Array, einsum_str: str | None = None, out_sharding=None) -> jax.Array:
        y = super().__call__(inputs, einsum_str, out_sharding)
        if self.merged:
            return y
        x = dropout(self.dropout_rate, inputs, scoped_dropout_key(self.salt))
        h = jnp.einsum(self.down, x, self.lora_a[...].astype(x.dtype))  # (..., R)
        return y + (self.scale * jnp.einsum(self.up, h, self.lora_b[...].astype(x.dtype))).astype(y.dtype)


def lora_modules(model: nnx.Module) -> list[tuple[str, LoraEinsum]]:
    """Every ``LoraEinsum`` in ``model`` with its path (``blocks/0/attn/q``)."""
    return [("/".join(map(str, path)), m) for path, m in nnx.iter_graph(model) if isinstance(m, LoraEinsum)]


def merge(model: nnx.Module) -> nnx.Module:
    """Adds every LoRA update into its kernel (in place): outputs stay the same, the extra einsums are gone."""
    for _, m in lora_modules(model):
        if not m.merged:
            m.kernel[...] = m.kernel[...] + m.update().astype(m.kernel.dtype)
            m.merged = True
    return model


def unmerge(model: nnx.Module) -> nnx.Module:
    """Takes every merged LoRA update back out of its kernel (in place)."""
    for _, m in lora_modules(model):
        if m.merged:
            m.kernel[...] = m.kernel[...] - m.update().astype(m.kernel.dtype)
            m.merged = False
    return model
