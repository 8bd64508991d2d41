"""A labelled example that needs no download: which standard-library module a docstring comes from.

The dataset config's ``labels`` name the modules; each module's public functions, classes and their methods give
one example per docstring (``inspect.cleandoc``-ed), in sorted order of qualified name, at most ``PER_MODULE`` of
them spread evenly over that order so the classes stay balanced. A docstring found in two modules is dropped
(it says nothing about either). Every ``EVAL_EVERY``-th example of each module is held out for evaluation: the
split is fixed. As with the embedded corpus, the exact texts depend on the Python version.

``prepare_docstrings`` writes ``train.jsonl``, ``eval.jsonl`` (``{"text", "label", "name"}`` lines) and a
byte-level BPE trained on the train texts; data/prepare.py runs it once, under a lock, into data_cache/.
"""

from __future__ import annotations

import collections
import importlib
import inspect
import json
import os
import warnings

from config import ConfigError

PER_MODULE = 100  # examples kept per module (label)
EVAL_EVERY = 5  # every 5th example of a module is held out (20%)
MIN_CHARS = 20  # shorter docstrings ("Return self.") carry no signal


def _documented(module) -> dict[str, str]:
    """{qualified name: docstring} of the module's public functions and classes (with their own methods)."""
    out = {}

    def add(name: str, obj) -> None:
        doc = getattr(obj, "__doc__", None)
        if isinstance(doc, str) and len(doc.strip()) >= MIN_CHARS:
            out[name] = inspect.cleandoc(doc)

    root = module.__name__.split(".")[0]
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") or inspect.ismodule(obj):
            continue
        if inspect.isclass(obj):
            if not getattr(obj, "__module__", "").lstrip("_").startswith(root):
                continue  # a class imported from elsewhere (e.g. typing's re-exports of collections.abc)
            add(name, obj)
            for attr, value in sorted(vars(obj).items()):
                if not attr.startswith("_") and (callable(value) or isinstance(value, (property, classmethod,
                                                                                       staticmethod))):
                    add(f"{name}.{attr}", value)
        elif callable(obj):
            add(name, obj)
    return out


def examples(modules: list[str]) -> dict[str, list[tuple[str, str]]]:
    """{module: [(qualified name, docstring), ...]} for each module, at most PER_MODULE, unique across modules."""
    found = {}
    for name in modules:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # deprecated submodules warn when touched
                found[name] = _documented(importlib.import_module(name))
        except ImportError as e:
            raise ConfigError(f"labels: stdlib module {name!r} cannot be imported here ({e})") from None
    seen = collections.Counter(text for docs in found.values() for text in set(docs.values()))
    out = {}
    for name, docs in found.items():
        unique = [(qualname, text) for qualname, text in sorted(docs.items()) if seen[text] == 1]
        unique = list(dict((text, (q, text)) for q, text in unique).values())  # one copy of a repeated text
        step = max(len(unique) / PER_MODULE, 1.0)
        out[name] = [unique[int(i * step)] for i in range(min(len(unique), PER_MODULE))]
    return out


def prepare_docstrings(directory: str, dataset: dict, where: str, n_ctx: int) -> None:
    """Writes train.jsonl, eval.jsonl and the BPE tokenizer (``tokenizer_path``'s file name) into ``directory``."""
    from data.tokenizer import train_bpe

    modules = dataset.get("labels")
    if not modules or "vocab_size" not in dataset:
        raise ConfigError(f"{where}: prepare 'stdlib_docstrings' needs 'labels' (module names) and 'vocab_size'")
    os.makedirs(directory)
    splits = {"train": [], "eval": []}
    for module, docs in examples(modules).items():
        for i, (qualname, text) in enumerate(docs):
            row = {"text": text, "label": module, "name": f"{module}.{qualname}"}
            splits["eval" if i % EVAL_EVERY == 0 else "train"].append(row)
    for split, rows in splits.items():
        with open(os.path.join(directory, f"{split}.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    tokenizer = train_bpe([row["text"] for row in splits["train"]], dataset["vocab_size"])
    tokenizer.save(os.path.join(directory, os.path.basename(dataset["tokenizer_path"])))
    with open(os.path.join(directory, "DONE"), "w") as f:
        f.write(f"prepared from the docstrings of {', '.join(modules)}\n")
