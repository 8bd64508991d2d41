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


def constrain(x: jax.Array, names: Sequence[str | None], prefer: Sequence[str] = ()) -> jax.Array:
    """Pins an activation's sharding by dimension names; a no-op outside ``placing``.

    ``prefer`` names dimensions that take a contested mesh axis ahead of the layout order. Expert parallelism uses
    it: with ``batch:x,experts:x`` the expert computation runs on (batch, experts, ...) buffers split over experts,
    so moving from tokens split by batch to buffers split by experts is one all-to-all over x."""
    placer = getattr(_active, "placer", None)
    if placer is None:
        return x
    return jax.lax.with_sharding_constraint(x, placer(names, prefer))
