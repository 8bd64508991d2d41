"""Which parameters train: the ``peft.trainable`` filter, by part or by parameter path pattern.

Parts: ``lora``, ``prefix``, ``adapter`` (what peft added), ``head`` (a task head: sequence/token classifier,
masked-LM head, ...), ``bias`` (every bias: BitFit), ``norm`` (norm scales and biases), ``embeddings`` and ``all``;
anything with a ``/`` or ``*`` is an fnmatch pattern over path names such as ``blocks/1/mlp/c_fc/kernel``. The
default is what peft added plus the task head (plus every bias with ``bitfit``). A frozen parameter gets neither a
gradient nor optimizer state (parallel/steps.py, parallel/state.py).
"""

from __future__ import annotations

import fnmatch
from typing import Callable

from config import ConfigError, check_peft

HEADS = ("score", "classifier", "mlm", "token_classifier")  # the families' task heads (not the LM output)
EMBEDDINGS = ("wte", "wpe", "wtt", "axial_wpe", "ln_embed", "shared")


def _is_norm(names: list[str]) -> bool:
    return any(n.startswith(("ln_", "ln")) or n in ("layer_norm", "final_layer_norm") for n in names[:-1])


PARTS: dict[str, Callable[[list[str]], bool]] = {
    "lora": lambda names: names[-1] in ("lora_a", "lora_b"),
    "prefix": lambda names: "prefix" in names,
    "adapter": lambda names: "attn_adapter" in names or "mlp_adapter" in names,
    "head": lambda names: names[0] in HEADS,
    "bias": lambda names: names[-1] == "bias",
    "norm": _is_norm,
    "embeddings": lambda names: names[0] in EMBEDDINGS,
    "all": lambda names: True,
}


def trainable_items(settings: dict | None) -> list[str] | None:
    """The parts and patterns that train under ``settings`` (a ``peft`` dict); None: everything trains."""
    if settings is None:
        return None
    settings = check_peft(settings)
    items = settings["trainable"]
    if items is None:
        items = [part for part in ("lora", "prefix", "adapter") if part in settings] + ["head"]
    return list(items) + (["bias"] if settings["bitfit"] and "bias" not in items else [])


def trainable_filter(settings: dict | None) -> Callable[[str], bool] | None:
    """A predicate on parameter path names (``blocks/0/attn/q/lora_a``): does it train? None: all do."""
    items = trainable_items(settings)
    if items is None:
        return None

    def trains(path: str) -> bool:
        names = path.split("/")
        return any(PARTS[item](names) if item in PARTS else fnmatch.fnmatch(path, item) for item in items)

    return trains


def check_trainable(settings: dict | None, names: list[str]) -> None:
    """One-line errors for a ``peft.trainable`` pattern that matches no parameter of the model (``names``), and
    for a filter that leaves nothing to train."""
    items = trainable_items(settings)
    if items is None:
        return
    for item in items:
        if item not in PARTS and not any(fnmatch.fnmatch(n, item) for n in names):
            raise ConfigError(f"peft.trainable: {item!r} matches no parameter (they look like {names[0]!r})")
    trains = trainable_filter(settings)
    if not any(trains(n) for n in names):
        raise ConfigError(f"peft.trainable: {', '.join(items)} selects no parameter of this model; nothing would "
                          "train")
