"""The embedded default corpus: text that ships with every CPython install, so the quickstart needs no download.

Documents are the interactive-help topics (``pydoc_data.topics``: the language reference in prose) and the
standard library's top-level modules (Python source with docstrings), in a fixed order. The exact text
depends on the Python version, and so, where a version has other modules, does which document is every 20th.

The split stays by position, unlike your own text's (data/eval_split.py, a hash of each document): nobody edits
this corpus, and its prepared caches (``data_cache/embedded_bpe``, found by name alone), the LAMBADA passages
shipped in ``evaluation/data/`` (drawn from its eval documents) and the README's measured numbers rest on it.
"""

from __future__ import annotations

import os
import sysconfig

EVAL_EVERY = 20  # every 20th document is held out for evaluation (5%)


def documents() -> list[tuple[str, str]]:
    """``[(name, text), ...]``: help topics, then standard-library modules, each sorted by name."""
    from pydoc_data.topics import topics

    docs = [(f"help:{name}", topics[name]) for name in sorted(topics)]
    stdlib = sysconfig.get_paths()["stdlib"]
    for name in sorted(os.listdir(stdlib)):
        if name.endswith(".py"):
            with open(os.path.join(stdlib, name), encoding="utf-8", errors="replace") as f:
                docs.append((f"stdlib:{name}", f.read()))
    return docs


def split(docs: list[tuple[str, str]], which: str) -> list[str]:
    """The texts of the ``train`` or ``eval`` documents."""
    held_out = [i % EVAL_EVERY == 0 for i in range(len(docs))]
    return [text for (_, text), out in zip(docs, held_out) if out == (which == "eval")]
