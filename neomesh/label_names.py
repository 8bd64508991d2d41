"""A classifier run's label names, kept beside its checkpoints in ``labels.json`` (a JSON list in id order).

Training writes them from the labelled dataset (its ``labels``, or the train split's string labels); export
writes them as the Hugging Face config's ``id2label`` / ``label2id`` (else ``LABEL_i``), and import keeps a model's
own, so a pipeline says ``positive``, not ``LABEL_1``, either way. Labels that are plain integers have no names.
"""

from __future__ import annotations

import json
import os

FILE = "labels.json"


def named(names: list[str] | None) -> bool:
    """Whether ``names`` say more than the ids themselves ("0", "1", ... or Hugging Face's LABEL_0, ...)."""
    return bool(names) and names != [str(i) for i in range(len(names))] and \
        names != [f"LABEL_{i}" for i in range(len(names))]


def save(model_path: str, names: list[str]) -> None:
    """Writes ``names`` whole or not at all."""
    path = os.path.join(model_path, FILE)
    os.makedirs(model_path, exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(list(names), f, ensure_ascii=False)
    os.replace(path + ".tmp", path)


def load(model_path: str, num_labels: int) -> list[str] | None:
    """The run's label names, or None where it has none, or none for ``num_labels`` classes (a file from another
    task)."""
    try:
        with open(os.path.join(model_path, FILE), encoding="utf-8") as f:
            names = json.load(f)
    except (OSError, ValueError):
        return None
    ok = isinstance(names, list) and len(names) == num_labels and all(isinstance(n, str) for n in names)
    return names if ok and len(set(names)) == len(names) else None


def from_hf(hf_config: dict) -> list[str] | None:
    """A Hugging Face config's ``id2label`` in id order, where it names its labels."""
    id2label = hf_config.get("id2label") or {}
    try:
        names = [str(id2label[key]) for key in sorted(id2label, key=int)]
    except (TypeError, ValueError):
        return None
    return names if named(names) else None


def to_hf(names: list[str]) -> dict:
    """``id2label`` and ``label2id`` for a Hugging Face config."""
    return {"id2label": {str(i): name for i, name in enumerate(names)},
            "label2id": {name: i for i, name in enumerate(names)}}
