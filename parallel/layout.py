"""``layout`` ("batch:x,heads:y,embd:y") -> logical-axis rules -> PartitionSpecs.

This file is the one place where tensor dimension names meet mesh axes. Model code annotates every parameter
(``logical_axes`` metadata) and key activation (``constrain``) with GPT-Neo's dimension names (models/axes.py);
the layout decides which mesh axis, if any, each name is split over. Data parallelism is ``batch:x``;
Megatron-style tensor parallelism adds ``heads:y`` (and ``intermediate_expanded:y``); FSDP/ZeRO-3 shards
parameters over the data axis too (``embd:x``); expert parallelism is ``experts:x``.

The rules are applied in layout order with flax's resolution: when two dimensions of one tensor map to the same
mesh axis, the one named first in the layout gets it and the other stays whole. So with
``batch:x,heads:y,embd:y`` the attention weights (embd, heads, features_per_head) split heads over y and the MLP
weights (embd, intermediate_expanded) split embd over y.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Iterator, Sequence

import flax.linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from config import ConfigError
from models.axes import DIMENSIONS, placing


def parse_layout(text: str, mesh: Mesh) -> tuple[tuple[str, str], ...]:
    """``"batch:x,heads:y"`` -> ``(("batch", "x"), ("heads", "y"))``, checked against the mesh axes."""
    rules = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, axis = (s.strip() for s in part.partition(":"))
        if not sep or not name or not axis:
            raise ConfigError(f"layout: '{part}' is not dimension:mesh_axis (e.g. 'batch:x')")
        if name not in DIMENSIONS:
            raise ConfigError(f"layout: unknown dimension '{name}' (valid: {', '.join(DIMENSIONS)})")
        if axis not in mesh.axis_names:
            raise ConfigError(f"layout: '{part}' names mesh axis '{axis}', which is not in mesh_shape "
                              f"(axes: {', '.join(mesh.axis_names)})")
        if any(name == seen for seen, _ in rules):
            raise ConfigError(f"layout: dimension '{name}' is given twice")
        rules.append((name, axis))
    return tuple(rules)


@dataclasses.dataclass(frozen=True)
class Layout:
    """A mesh and the rules that place logical dimensions on its axes."""

    mesh: Mesh
    rules: tuple[tuple[str, str], ...]

    @classmethod
    def from_config(cls, mesh: Mesh, layout: str) -> "Layout":
        return cls(mesh, parse_layout(layout, mesh))

    def spec(self, names: Sequence[str | None], prefer: Sequence[str] = ()) -> PartitionSpec:
        """``prefer`` moves the rules of those dimensions to the front, so they win a contested mesh axis."""
        rules = sorted(self.rules, key=lambda rule: rule[0] not in prefer)  # stable: layout order otherwise
        return PartitionSpec(*nn.logical_to_mesh_axes(tuple(names), rules))

    def sharding(self, names: Sequence[str | None], prefer: Sequence[str] = ()) -> NamedSharding:
        return NamedSharding(self.mesh, self.spec(names, prefer))

    def axis_size(self, name: str) -> int:
        """How many ways the dimension ``name`` is split (1 if the layout leaves it whole)."""
        axes = self.spec((name,))[0]
        if axes is None:
            return 1
        axes = (axes,) if isinstance(axes, str) else axes
        return math.prod(self.mesh.shape[a] for a in axes)

    def checked_sharding(self, what: str, shape: Sequence[int], names: Sequence[str | None]) -> NamedSharding:
        """The sharding of one tensor; a clear error if a split dimension does not divide its mesh axis."""
        if len(names) != len(shape):
            raise ValueError(f"{what}: {len(names)} logical axes {names} for shape {tuple(shape)}")
        spec = self.spec(names)
        for size, name, axes in zip(shape, names, spec):
            if axes is None:
                continue
            ways = math.prod(self.mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes))
            if size % ways:
                raise ConfigError(f"layout: {what} dimension '{name}' has size {size}, not divisible by mesh "
                                  f"axis '{axes}' of size {ways}")
        return NamedSharding(self.mesh, spec)

    @contextlib.contextmanager
    def active(self) -> Iterator["Layout"]:
        """Makes ``models.axes.constrain`` place activations with this layout while model code is traced."""
        with placing(self.sharding):
            yield self


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())
