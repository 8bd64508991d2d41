"""``layout`` ("batch:x,heads:y,embd:y") -> logical-axis rules -> PartitionSpecs.

This file is the one place where tensor dimension names meet mesh axes. Model code annotates every parameter
(``logical_axes`` metadata) and key activation (``constrain``) with GPT-Neo's dimension names (models/axes.py);
the layout decides which mesh axes, if any, each name is split over. Data parallelism is ``batch:x``;
Megatron-style tensor parallelism adds ``heads:y`` (and ``intermediate_expanded:y``); FSDP/ZeRO-3 shards
parameters over the data axis too (``embd:x``); expert parallelism is ``experts:x``.

Syntax (GPT-Neo's, extended so that old layouts keep their meaning):

* ``name:axis`` splits dimension ``name`` over one mesh axis; ``name:x+z`` over several at once (x major), e.g.
  ``batch:x+z`` for data parallelism over two axes; ``name:none`` keeps it whole even where another rule of the
  layout would otherwise apply (see the activation names below).
* Rules apply in layout order with flax's resolution: when two dimensions of one tensor want the same mesh
  axis, the one named first gets it and the other stays whole; a dimension gets all the axes of its rule or
  none of them. So with ``batch:x,heads:y,embd:y`` the attention weights (embd, heads, features_per_head) split
  heads over y and the MLP weights (embd, intermediate_expanded) split embd over y.
* Parameters and activations share most names, as in mesh-tensorflow, but the activations where the choice
  matters have names of their own (MaxText's ``activation_embed`` vs ``embed``): ``activation_embd`` is the
  residual stream's model dimension, ``activation_vocab`` the logits' vocabulary. A layout that does not name
  them places them like ``embd`` and ``vocab`` (GPT-Neo's meaning); ``activation_embd:none`` keeps the residual
  stream whole while the weights are split on ``embd`` (2-D weight sharding with tensor parallelism). Sequence
  parallelism is ``sequence:y`` named after the tensor-parallel rules: the residual stream is split over the
  sequence, while attention and MLP activations, whose heads or intermediate dimension takes y first, are not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import sys
from typing import Iterator, Sequence

import flax.linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from config import ConfigError
from models.axes import ACTIVATION_DIMENSIONS, DIMENSIONS, check_names, placing, unknown_name_hint
from parallel.mesh import AXIS_NAME, mesh_axes

NOT_SPLIT = "none"  # layout value: keep the dimension whole

Rule = tuple[str, tuple[str, ...]]  # (dimension name, mesh axes it is split over; () for none)


def layout_rules(text: str) -> tuple[Rule, ...]:
    """``"batch:x+z,heads:y,activation_embd:none"`` -> ``(("batch", ("x", "z")), ("heads", ("y",)),
    ("activation_embd", ()))``: the syntax and the dimension names checked, the mesh axes as written (no mesh is
    needed, so a typo is found before any device is)."""
    names = (*DIMENSIONS, *ACTIVATION_DIMENSIONS)
    rules: list[Rule] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = (s.strip() for s in part.partition(":"))
        if not sep or not name or not value:
            hint = "; did you mean 'auto'?" if part.lower() == "auto" != part else ""
            raise ConfigError(f"layout: '{part}' is not dimension:mesh_axis (e.g. 'batch:x' or 'batch:x+z'){hint}")
        if name not in names:
            raise ConfigError(f"layout: unknown dimension '{name}'{unknown_name_hint(name, names)}")
        axes = () if value == NOT_SPLIT else tuple(a.strip() for a in value.split("+"))
        if not all(axes) and value != NOT_SPLIT:
            raise ConfigError(f"layout: '{part}' is not dimension:mesh_axis (e.g. 'batch:x' or 'batch:x+z')")
        check_axis_names(part, axes)
        if len(set(axes)) != len(axes):
            raise ConfigError(f"layout: '{part}' names a mesh axis twice")
        if any(name == seen for seen, _ in rules):
            raise ConfigError(f"layout: dimension '{name}' is given twice")
        rules.append((name, axes))
    return tuple(rules)


def check_axis_names(part: str, axes: Sequence[str]) -> None:
    """A rule's mesh axes must be names mesh_shape could give. One that is missing from mesh_shape is only a
    warning later (GPT-Neo's meaning), so a name that no mesh can have ('x;heads:y', from ';' for ',') is refused
    here, or the rule would be dropped with a warning and the run go on unsharded."""
    for axis in axes:
        if not re.fullmatch(AXIS_NAME, axis):
            hint = "; rules are separated by ',' (e.g. 'batch:x,heads:y')" if re.search(r"[;:]", axis) else ""
            raise ConfigError(f"layout: '{part}': '{axis}' cannot name a mesh axis (mesh_shape's axis names are "
                              f"letters, digits and _){hint}")


def parse_layout(text: str, mesh: Mesh) -> tuple[Rule, ...]:
    """``layout_rules`` checked against the mesh axes: a rule naming an axis the mesh lacks is dropped with a
    warning (GPT-Neo's meaning), or an error in NeoMesh's own ``x+z`` syntax."""
    rules: list[Rule] = []
    for name, axes in layout_rules(text):
        part = f"{name}:{'+'.join(axes) or NOT_SPLIT}"
        missing = [axis for axis in axes if axis not in mesh.axis_names]
        if missing and len(axes) > 1:  # our own 'x+z' syntax: a typo there is an error, not a silent reshard
            raise ConfigError(f"layout: '{part}' names mesh axis '{missing[0]}', which is not in mesh_shape "
                              f"(axes: {', '.join(mesh.axis_names)})")
        if missing:  # mesh-tensorflow ignored such a rule (GPT-Neo's Colab has 'vocab:n_vocab'); so do we, and say so
            print(f"warning: layout: '{part}' names mesh axis '{missing[0]}', which is not in mesh_shape (axes: "
                  f"{', '.join(mesh.axis_names)}); '{name}' stays whole", file=sys.stderr)
            continue
        rules.append((name, axes))
    used = {axis for _, axes in rules for axis in axes}
    batch = dict(rules).get("batch", ())
    for axis, size in mesh.shape.items():
        if size > 1 and axis not in used:  # replicated work, rarely meant: "x:4,y:2" with "batch:x"
            print(f"warning: layout: no rule names mesh axis '{axis}' (size {size}), so its {size} devices "
                  f"each repeat the same work; name it in the layout (e.g. 'batch:{'+'.join((*batch, axis))}') "
                  f"or drop it from mesh_shape", file=sys.stderr)
    return tuple(rules)


def check_text(mesh_shape: str, layout: str) -> None:
    """``mesh_shape`` and ``layout`` as text, before any device exists: a mistake in either is one line before a
    run prepares data or moves a run aside ("auto" is chosen later, for the devices)."""
    if mesh_shape != "auto":
        mesh_axes(mesh_shape)
    if layout != "auto":
        layout_rules(layout)


def resolution_rules(rules: Sequence[Rule]) -> tuple[tuple[str, str | tuple[str, ...] | None], ...]:
    """The layout's rules in flax's form, in priority order, with each activation dimension the layout does not
    name placed like (and right after) the parameter dimension it shadows."""
    named = {name for name, _ in rules}
    flax_rules = []
    for name, axes in rules:
        value = None if not axes else axes[0] if len(axes) == 1 else axes
        flax_rules.append((name, value))
        flax_rules += [(act, value) for act, param in ACTIVATION_DIMENSIONS.items()
                       if param == name and act not in named]
    return tuple(flax_rules)


def spec_axes(entry: str | Sequence[str] | None) -> tuple[str, ...]:
    """The mesh axes one ``PartitionSpec`` entry splits its dimension over: None, a name, or a tuple of names."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def ways(mesh, entry: str | Sequence[str] | None) -> int:
    """How many ways one ``PartitionSpec`` entry splits its dimension over ``mesh`` (1: whole)."""
    return math.prod(mesh.shape[axis] for axis in spec_axes(entry))


def format_spec(spec: PartitionSpec) -> str:
    """``PartitionSpec(("x", "z"), None, "y")`` -> ``"(x+z, -, y)"``: compact, for tables and messages."""
    return "(" + ", ".join("-" if a is None else "+".join(spec_axes(a)) for a in spec) + ")"


@dataclasses.dataclass(frozen=True)
class Layout:
    """A mesh and the rules that place logical dimensions on its axes."""

    mesh: Mesh
    rules: tuple[Rule, ...]

    @classmethod
    def from_config(cls, mesh: Mesh, layout: str) -> "Layout":
        return cls(mesh, parse_layout(layout, mesh))

    @property
    def text(self) -> str:
        """The rules back in layout syntax, for messages (no rule left: every tensor whole on every device)."""
        return ",".join(f"{name}:{'+'.join(axes) or NOT_SPLIT}" for name, axes in self.rules) or \
            "none (every tensor whole on every device)"

    @property
    def platform(self) -> str:
        """The platform of the mesh's devices: "cpu", "gpu" or "tpu" (a dry run's are the accelerators it compiles
        for)."""
        return self.mesh.devices.flat[0].platform

    def spec(self, names: Sequence[str | None], prefer: Sequence[str] = ()) -> PartitionSpec:
        """``prefer`` moves the rules of those dimensions to the front, so they win a contested mesh axis."""
        rules = sorted(resolution_rules(self.rules), key=lambda rule: rule[0] not in prefer)  # stable otherwise
        return PartitionSpec(*nn.logical_to_mesh_axes(tuple(names), rules))

    def sharding(self, names: Sequence[str | None], prefer: Sequence[str] = ()) -> NamedSharding:
        return NamedSharding(self.mesh, self.spec(names, prefer))

    def axis_size(self, name: str) -> int:
        """How many ways the dimension ``name`` is split (1 if the layout leaves it whole)."""
        return ways(self.mesh, self.spec((name,))[0])

    def checked_sharding(self, what: str, shape: Sequence[int], names: Sequence[str | None]) -> NamedSharding:
        """The sharding of one tensor; a clear error if a split dimension does not divide its mesh axis."""
        if len(names) != len(shape):
            raise ValueError(f"{what}: {len(names)} logical axes {names} for shape {tuple(shape)}")
        check_names(what, names)
        spec = self.spec(names)
        for size, name, entry in zip(shape, names, spec):
            axes, split = spec_axes(entry), ways(self.mesh, entry)
            if size % split:
                where = f"mesh axis '{axes[0]}'" if len(axes) == 1 else f"mesh axes '{'+'.join(axes)}'"
                padded = -(-size // (split * 64)) * split * 64
                hint = (f" (n_vocab {padded}, a multiple of {split * 64}, splits, as GPT-Neo padded 50257 to 50304; "
                        "or leave vocab whole)" if name == "vocab" else "")
                raise ConfigError(f"layout: {what} dimension '{name}' has size {size}, not divisible by {where} "
                                  f"of size {split}{hint}")
        return NamedSharding(self.mesh, spec)

    def without(self, axes: Sequence[str]) -> "Layout":
        """This layout with ``axes`` taken out of every rule (a rule left with none keeps its dimension whole):
        how each device's own program places what it holds, once those axes are manual (``jax.shard_map``)."""
        return Layout(self.mesh, tuple((name, tuple(a for a in split if a not in axes)) for name, split in self.rules))

    @contextlib.contextmanager
    def active(self) -> Iterator["Layout"]:
        """Makes ``models.axes.constrain`` place activations with this layout while model code is traced."""
        with placing(self.sharding):
            yield self


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())
