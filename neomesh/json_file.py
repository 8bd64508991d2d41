"""Reading a JSON file a user gave (a config, a dataset config, a model directory's config.json): what cannot be
read or parsed is one line naming the file."""

from __future__ import annotations

import json

from config import ConfigError


def read_json(path: str, where: str | None = None):
    """``path``'s JSON content; a one-line ``ConfigError`` starting with ``where`` (default: the path) if it cannot
    be read, is not UTF-8 text, or is not JSON."""
    where = path if where is None else where
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise ConfigError(f"{where}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where}: not a JSON text file (byte {e.start} is not UTF-8)") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
