"""Documents from text files: ``.txt`` (one document per file), ``.jsonl`` and ``.jsonl.zst`` (one JSON object
per line with a ``text`` field, the Pile's format), and ``embedded`` (the corpus shipped with Python)."""

from __future__ import annotations

import glob
import json
import os
import sys
from typing import Iterator

from config import ConfigError

SUFFIXES = (".txt", ".jsonl", ".jsonl.zst")
CHUNK = 1 << 20  # compressed bytes read at a time
BOM = "\ufeff"  # the byte-order mark Windows editors start UTF-8 files with: no part of the text


def expand_inputs(patterns: list[str], flag: str = "--input") -> list[str]:
    """Files matched by ``patterns`` (globs, files or directories), sorted per pattern; ``embedded`` is kept as
    is. A path that does not exist, or a pattern that matches nothing readable, is an error naming ``flag`` (the
    command-line flag that gave the patterns), not an empty input."""
    files: list[str] = []
    for pattern in patterns:
        if pattern == "embedded":
            files.append(pattern)
            continue
        if not glob.has_magic(pattern) and not os.path.exists(pattern):
            raise ConfigError(f"{flag} {pattern}: no such file or folder")
        if os.path.isdir(pattern):
            matched = sorted(os.path.join(root, f) for root, _, names in os.walk(pattern) for f in names)
        else:
            matched = sorted(glob.glob(pattern, recursive=True))
        records = any(f.endswith((".tfrecords", ".tfrecord")) for f in matched)
        other = [f for f in matched if os.path.isfile(f) and not f.endswith(SUFFIXES)]
        matched = [f for f in matched if os.path.isfile(f) and f.endswith(SUFFIXES)]
        if not matched:
            hint = ("; TFRecords are read through a dataset config's path, named in a config's datasets "
                    "(create_tfrecords.py --write-dataset-config writes one)") if records else ""
            raise ConfigError(f"{flag} {pattern}: matches no {'/'.join(SUFFIXES)} file{hint}")
        if other:  # a folder of notes.md and README: said, not silently left out
            print(f"note: {flag} {pattern}: {len(other)} file(s) left out, not {'/'.join(SUFFIXES)} (the first: "
                  f"{other[0]}); rename them to be read", file=sys.stderr)
        files.extend(matched)
    return without_repeats(files, flag)


def without_repeats(files: list[str], flag: str) -> list[str]:
    """``files`` with each file once, where it is first named: a folder and a glob inside it that both name a file
    read its documents twice, into train and eval alike."""
    unique, seen, repeats = [], set(), []
    for f in files:
        key = os.path.realpath(f) if f != "embedded" else f
        if key in seen:
            repeats.append(f)
            continue
        seen.add(key)
        unique.append(f)
    if repeats:
        print(f"note: {flag}: {len(repeats)} file(s) named more than once are read once (the first: {repeats[0]})",
              file=sys.stderr)
    return unique


SKIP_HINT = "--skip-bad-files skips such files"  # what a bad file's error adds where the command has the flag


class BadFile(ConfigError):
    """An input file that cannot be read or decoded (no permission, invalid UTF-8, binary, corrupt or truncated
    zstd, bad JSON line); the message names the file and where. The tools stop on it, or skip the file with
    ``--skip-bad-files``."""


def read_documents(path: str, keep_blank: bool = True) -> Iterator[str]:
    """The documents of one input file, in file order; ``BadFile`` if it cannot be read or decoded. Without
    ``keep_blank`` a text of only whitespace (an empty .txt file, a ``"text": ""`` line) is no document: to train
    on your text (make_dataset, train_tokenizer) it would be end-of-text tokens alone, counted as a document that is
    not there; create_tfrecords keeps it, as GPT-Neo's did (a record of the separator alone)."""
    try:
        for text in _documents(path):
            if keep_blank or text.strip():
                yield text
    except OSError as e:  # no permission, an I/O error: a file that cannot be read is a bad file too
        raise BadFile(f"{path}: cannot be read ({e.strerror or e})") from None


def _documents(path: str) -> Iterator[str]:
    if path == "embedded":
        from data import corpus
        for _, text in corpus.documents():
            yield text
        return
    if path.endswith(".txt"):
        with open(path, "rb") as f:
            raw = f.read()
        nul = raw.find(b"\0")
        if nul >= 0:
            raise BadFile(f"{path}: binary data (a NUL byte at byte offset {nul}), not text")
        yield _decode(raw, path, 0).removeprefix(BOM)
        return
    for line_no, text_line in jsonl_lines(path):
        if not text_line.strip():
            continue
        text = _text_field(text_line, path, line_no)
        if not isinstance(text, str):
            raise BadFile(f"{path}: line {line_no}: 'text' is not a string")
        yield text


def json_object(line: str) -> dict | None:
    """The JSON object one jsonl line holds; None where it holds no JSON, or JSON that is not an object."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


def _text_field(line: str, path: str, line_no: int):
    """The ``text`` of one jsonl line; a line without one names the keys it has (a ``content`` field was 'not a JSON
    object with a 'text' field', as if the file were broken)."""
    record = json_object(line)
    if record is None:
        raise BadFile(f"{path}: line {line_no} is not a JSON object")
    if "text" not in record:
        has = ", ".join(repr(k) for k in list(record)[:5]) or "no fields"
        raise BadFile(f"{path}: line {line_no} has no 'text' field (it has {has}); a line's document is its "
                      "'text', as in the Pile")
    return record["text"]


def jsonl_lines(path: str) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a ``.jsonl`` or ``.jsonl.zst`` file, the one way every jsonl reader reads them:
    decoded as UTF-8 (a ``BadFile`` naming the line and byte offset otherwise), a byte-order mark at the start
    skipped (Windows editors write one; it is no part of the first line's JSON)."""
    lines = _zstd_lines(path) if path.endswith(".zst") else _file_lines(path)
    offset = 0
    for line_no, raw in enumerate(lines, 1):
        line, offset = _decode(raw, path, offset, line_no), offset + len(raw)
        yield line_no, line.removeprefix(BOM) if line_no == 1 else line


def _decode(raw: bytes, path: str, offset: int, line_no: int | None = None) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        where = (f"line {line_no}, " if line_no else "") + ("decompressed " if path.endswith(".zst") else "")
        raise BadFile(f"{path}: not UTF-8 text ({where}byte offset {offset + e.start}: 0x{raw[e.start]:02x})") \
            from None


def _file_lines(path: str) -> Iterator[bytes]:
    with open(path, "rb") as f:
        yield from f


def zstd_module(path: str):
    """``zstandard``, or a one-line error naming the .zst file that needs it (it is in the [data] extra)."""
    try:
        import zstandard
    except ImportError:
        raise ConfigError(f"{path}: reading .zst files needs zstandard: pip install zstandard (or NeoMesh's [data] "
                          "extra)") from None
    return zstandard


def _zstd_lines(path: str) -> Iterator[bytes]:
    """Lines of a zstd-compressed file (one or more frames). A corrupt stream, or one that ends inside a frame
    (a truncated download or copy), is a ``BadFile``, never a silently shorter input."""
    zstandard = zstd_module(path)
    decompressor = zstandard.ZstdDecompressor()
    frame, started, pending, read = decompressor.decompressobj(), False, b"", 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            read += len(chunk)
            while chunk:
                started = True
                try:
                    pending += frame.decompress(chunk)
                except zstandard.ZstdError as e:
                    raise BadFile(f"{path}: corrupt zstd data near compressed byte {read} ({e})") from None
                chunk = b""
                if frame.eof:  # the next frame, if any, starts in what this one did not use
                    chunk, frame, started = frame.unused_data, decompressor.decompressobj(), False
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line + b"\n"
    if started or read == 0:
        raise BadFile(f"{path}: truncated zstd data (the stream ends inside a frame after {read} compressed bytes)"
                      if read else f"{path}: empty, not zstd data")
    if pending:
        yield pending
