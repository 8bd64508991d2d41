"""The evaluation files' one format: a JSON object per line (blank lines skipped), errors naming ``file:line``."""

from __future__ import annotations

import json
from collections.abc import Iterator

from config import ConfigError


def json_objects(path: str, limit: int | None, kind: str, noun: str) -> Iterator[tuple[dict, str]]:
    """(object, "path:line") for the first ``limit`` objects of ``path``; one-line errors for a missing file
    ("no such ``kind`` file"), text that is not UTF-8 or not JSON, and a file without any ``noun``."""
    count = 0
    try:
        with open(path, encoding="utf-8-sig") as f:  # a BOM (Notepad's UTF-8) is no part of the first line
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                if limit is not None and count == limit:
                    break
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ConfigError(f"{path}:{number}: not a JSON line ({e.msg})") from None
                count += 1
                yield row, f"{path}:{number}"
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such {kind} file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start})") from None
    if not count:
        raise ConfigError(f"{path}: no {noun} in it")
