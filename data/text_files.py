"""Documents from text files: ``.txt`` (one document per file), ``.jsonl`` and ``.jsonl.zst`` (one JSON object
per line with a ``text`` field, the Pile's format), and ``embedded`` (the corpus shipped with Python)."""

from __future__ import annotations

import glob
import io
import json
import os
from typing import Iterator

from config import ConfigError

SUFFIXES = (".txt", ".jsonl", ".jsonl.zst")


def expand_inputs(patterns: list[str]) -> list[str]:
    """Files matched by ``patterns`` (globs, files or directories), sorted per pattern; ``embedded`` is kept as
    is. A pattern that matches nothing readable is an error, not an empty input."""
    files: list[str] = []
    for pattern in patterns:
        if pattern == "embedded":
            files.append(pattern)
            continue
        if os.path.isdir(pattern):
            matched = sorted(os.path.join(root, f) for root, _, names in os.walk(pattern) for f in names)
        else:
            matched = sorted(glob.glob(pattern, recursive=True))
        matched = [f for f in matched if os.path.isfile(f) and f.endswith(SUFFIXES)]
        if not matched:
            raise ConfigError(f"--input {pattern}: matches no {'/'.join(SUFFIXES)} file")
        files.extend(matched)
    return files


def read_documents(path: str) -> Iterator[str]:
    """The documents of one input file, in file order."""
    if path == "embedded":
        from data import corpus
        for _, text in corpus.documents():
            yield text
        return
    if path.endswith(".txt"):
        with open(path, encoding="utf-8") as f:
            yield f.read()
        return
    if path.endswith(".zst"):
        import zstandard
        raw = zstandard.ZstdDecompressor().stream_reader(open(path, "rb"))
        stream = io.TextIOWrapper(raw, encoding="utf-8")
    else:
        stream = open(path, encoding="utf-8")
    with stream:
        for line_no, line in enumerate(stream, 1):
            if not line.strip():
                continue
            try:
                text = json.loads(line)["text"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise ConfigError(f"{path}: line {line_no} is not a JSON object with a 'text' field") from None
            if not isinstance(text, str):
                raise ConfigError(f"{path}: line {line_no}: 'text' is not a string")
            yield text
