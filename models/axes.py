"""The logical dimension names model code speaks, and the hook that places activations by them.

Model code names every parameter dimension (``axes(...)`` metadata on each variable) and pins key activations
with ``constrain(x, names)``. Which mesh axis a name is split over is not the model's business: the layout
(parallel/layout.py) reads these names and installs itself with ``placing`` while a step is traced. Outside that
context ``constrain`` is a no-op, so models run unchanged on one device, in tests and in notebooks.

The names are GPT-Neo's, each with the one letter used in einsum strings and shape comments.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator, Sequence

import jax

from config import ConfigError, closest

DIMENSIONS = {
    "batch": "B", "sequence": "T", "embd": "D", "heads": "N", "features_per_head": "H",
    "intermediate_expanded": "F", "vocab": "V", "experts": "E", "memory_length": "S",
}

# Activation dimensions with names of their own, so a layout can place them apart from the parameter dimension
# they shadow (MaxText's activation_embed vs embed); a layout that does not name one places it like its parameter.
ACTIVATION_DIMENSIONS = {"activation_embd": "embd", "activation_vocab": "vocab"}

# Activation shapes named once, used by every layer.
HIDDEN = ("batch", "sequence", "activation_embd")  # (B, T, D): the residual stream
LOGITS = ("batch", "sequence", "activation_vocab")  # (B, T, V)
HEADS = ("batch", "sequence", "heads", "features_per_head")  # (B, T, N, H): queries, keys, values

# The rank of a low-rank update (LoRA, training/peft/lora.py). No layout may name it, so it is never split: each
# factor is split like the weight it adapts along that weight's dimensions, and the rank dimension stays whole.
LORA_RANK = "lora_rank"

NAMES = (*DIMENSIONS, *ACTIVATION_DIMENSIONS, LORA_RANK)  # every name a parameter or an activation may carry


def unknown_name_hint(name: str, names: Sequence[str] = NAMES) -> str:
    """The hint after an unknown dimension name: the closest known one, or all of them."""
    close = closest(name, list(names))
    return f"; did you mean '{close}'?" if close else f" (valid: {', '.join(names)})"


def check_names(what: str, names: Sequence[str | None]) -> None:
    """A name no layout rule can match would leave its dimension whole on every device, silently: one line."""
    for name in names:
        if name is not None and name not in NAMES:
            raise ConfigError(f"{what}: logical axis '{name}' is no dimension name{unknown_name_hint(name)}")

Placer = Callable[[Sequence[str | None], Sequence[str]], jax.sharding.Sharding]
_active = threading.local()


def axes(*names: str | None) -> dict:
    """Variable metadata naming each dimension of a parameter (None: never split)."""
    return {"logical_axes": tuple(names)}


@contextlib.contextmanager
def placing(placer: Placer) -> Iterator[None]:
    """While active, ``constrain`` pins activations to ``placer(names, prefer)``."""
    previous = getattr(_active, "placer", None)
    _active.placer = placer
    try:
        yield
    finally:
        _active.placer = previous


def placement() -> object:
    """What identifies the active placer (None outside ``placing``), as a static argument of a jitted function that
    traces model code: jax keys a function's traces by its arguments, not by this thread's placer, so the same
    function called under another layout whose parameters are placed alike reused the first layout's trace and
    its activation constraints. A layout's placer (its bound ``sharding``) is identified by the layout itself, so
    equal layouts share a program."""
    placer = getattr(_active, "placer", None)
    return getattr(placer, "__self__", placer)


def target_device() -> jax.Device:
    """A device the code being traced or built runs on: the active layout's, else jax's default backend's. They
    differ in a dry run compiled for accelerators this process does not drive (parallel/dry_run.py), where the
    kernels must still be theirs."""
    placer = getattr(_active, "placer", None)
    if placer is None:
        return jax.devices()[0]
    return next(iter(placer((), ()).device_set))


def target_platform() -> str:
    """``target_device``'s platform: "cpu", "gpu" or "tpu"."""
    return target_device().platform


def splits(name: str) -> bool:
    """Whether the active layout splits dimension ``name`` across more than one device (never outside ``placing``)."""
    placer = getattr(_active, "placer", None)
    if placer is None:
        return False
    sharding = placer((name,), ())
    devices = len(sharding.device_set)  # a split's ways divide it
    return sharding.shard_shape((devices,))[0] < devices


def per_device(f: Callable, in_names: Sequence[Sequence[str | None]], out_names: Sequence[str | None],
               whole: Sequence[str] = ()) -> Callable:
    """``f`` run on each device's share under ``shard_map``, its inputs and output split as the active layout
    places these dimension names (a kernel that is one device's program, such as a Pallas kernel); ``f`` itself
    outside ``placing`` or on one device. A layout that splits a dimension named in ``whole`` is a ValueError."""
    placer = getattr(_active, "placer", None)
    if placer is None:
        return f
    inputs = [placer(names, ()) for names in in_names]
    if inputs[0].mesh.size == 1:
        return f
    for names, sharding in zip(in_names, inputs):
        for name, split in zip(names, sharding.spec):
            if name in whole and split is not None:
                raise ValueError(f"layout: '{name}' is split over {split}, and this kernel needs it whole")
    return shard_map_rest(f, inputs[0].mesh, tuple(s.spec for s in inputs), placer(out_names, ()).spec)


def shard_map_rest(f: Callable, mesh, in_specs, out_specs) -> Callable:
    """``jax.shard_map`` over the axes of ``mesh`` that are not manual yet: all of them, or inside another
    shard_map (a train step accumulating each device's gradients: parallel/steps.py) the rest, on the mesh as the
    trace sees it; ``f`` itself where none is left. The specs name only those axes."""
    context = jax.sharding.get_abstract_mesh()
    if not context.manual_axes:
        return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
    rest = frozenset(context.axis_names) - set(context.manual_axes)
    if not rest:
        return f
    return jax.shard_map(f, mesh=context, in_specs=in_specs, out_specs=out_specs, axis_names=rest, check_vma=False)


def constrain(x: jax.Array, names: Sequence[str | None], prefer: Sequence[str] = ()) -> jax.Array:
    """Pins an activation's sharding by dimension names; a no-op outside ``placing``.

    ``prefer`` names dimensions that take a contested mesh axis ahead of the layout order. Expert parallelism uses
    it: with ``batch:x,experts:x`` the expert computation runs on (batch, experts, ...) buffers split over experts,
    so moving from tokens split by batch to buffers split by experts is one all-to-all over x. The names are
    checked on one device too, where a typo would otherwise pass every test and leave a pod's activation whole."""
    check_names("constrain", names)
    if len(names) != x.ndim:
        raise ValueError(f"constrain: {len(names)} dimension names {tuple(names)} for an array of shape {x.shape}")
    placer = getattr(_active, "placer", None)
    if placer is None:
        return x
    sharding = placer(names, prefer)
    if jax.sharding.get_abstract_mesh().manual_axes:
        # Inside a shard_map the spec alone, placed on the mesh as the trace sees it: pinned to the whole mesh,
        # the activation would carry a mesh that later operations there cannot use.
        return jax.lax.with_sharding_constraint(x, sharding.spec)
    return jax.lax.with_sharding_constraint(x, sharding)
