"""Finding, checking and diagnosing TFRecord files: globs, ``NAME.index`` files, and a one-line error naming the
file and record for data that TensorFlow's reader rejects."""

from __future__ import annotations

import json
import os
import re

from config import ConfigError


class DataError(ConfigError):
    """Bad data: the file (and record index or byte offset) is named in the message."""


def list_files(pattern: str, where: str) -> list[str]:
    """Files matching ``pattern`` (a glob; gs:// and other tf.io.gfile paths work), sorted; empty is an error."""
    from data.tf_import import tensorflow
    tf = tensorflow()
    try:
        files = sorted(tf.io.gfile.glob(pattern))
    except tf.errors.OpError as e:
        raise DataError(f"{where}: cannot list {pattern}: {e.message.splitlines()[0]}") from None
    if not files:
        raise DataError(f"{where}: {pattern} matches no file")
    empty = [f for f in files if tf.io.gfile.stat(f).length == 0]
    if empty:
        raise DataError(f"{empty[0]}: empty file (0 bytes), matched by {where}")
    return files


def read_indexes(files: list[str]) -> dict[str, dict]:
    """``{file: {"documents", "records", "tokens", "bytes", "vocab_size", "tokenizer_hash", "eos_id", "index"}}``
    for every file that a ``*.index`` written by create_tfrecords in its directory lists (an older index has no
    tokenizer_hash: None)."""
    import glob
    found: dict[str, dict] = {}
    for directory in sorted({os.path.dirname(f) for f in files}):
        for path in sorted(glob.glob(os.path.join(directory, "*.index"))):
            try:
                with open(path) as fh:
                    index = json.load(fh)
            except (OSError, json.JSONDecodeError) as e:
                raise DataError(f"{path}: unreadable index ({e})") from None
            for entry in index.get("files", []):
                found[os.path.join(directory, entry["file"])] = {
                    **entry, "vocab_size": index.get("vocab_size"), "tokenizer_hash": index.get("tokenizer_hash"),
                    "eos_id": index.get("eos_id"), "index": path}
    return {f: found[f] for f in files if f in found}


def check_vocab(indexes: dict[str, dict], tokenizer, n_vocab: int, where: str) -> None:
    """The files' tokenizer (from their index) must be the one the dataset config names, and fit n_vocab: the same
    size, and the same vocabulary where the index records its hash (an older index records the size alone)."""
    from data.tokenizer import tokenizer_hash

    named = tokenizer_hash(tokenizer) if any(e.get("tokenizer_hash") for e in indexes.values()) else None
    for path, entry in indexes.items():
        if entry["vocab_size"] is not None and entry["vocab_size"] != tokenizer.vocab_size:
            raise DataError(f"{entry['index']}: {os.path.basename(path)} was written with a {entry['vocab_size']}-"
                            f"token tokenizer but {where} names one with {tokenizer.vocab_size} tokens")
        if entry.get("tokenizer_hash") and named and entry["tokenizer_hash"] != named:
            raise DataError(f"{entry['index']}: {os.path.basename(path)} was written with another tokenizer than the "
                            f"one {where} names (both of {tokenizer.vocab_size} tokens, but other vocabularies: its "
                            "ids would name other tokens)")
        if entry["vocab_size"] is not None and entry["vocab_size"] > n_vocab:
            raise DataError(f"n_vocab: {n_vocab} is smaller than the {entry['vocab_size']} tokens {path} was "
                            "written with")


def check_sizes(indexes: dict[str, dict], sizes: dict[str, int]) -> None:
    """Each file as long as its index recorded when it was written (indexes from before that record nothing):
    a file cut short (a full disk, a copy stopped midway) or replaced is one line at start, where the reader would
    find it only on reaching the cut, possibly hours into a run."""
    for path, entry in indexes.items():
        expected = entry.get("file_bytes")
        if isinstance(expected, int) and sizes[path] != expected:
            raise DataError(f"{path}: {sizes[path]:,} bytes, but {entry['index']} says it was written with "
                            f"{expected:,} (cut short or replaced since); write it again")


def features(tf) -> dict:
    return {"text": tf.io.VarLenFeature(tf.int64)}


def diagnose(files: list[str], error) -> DataError:
    """Turns a tf.data failure into a one-line error that names the file and the record."""
    from data.tf_import import tensorflow
    tf = tensorflow()
    message = getattr(error, "message", str(error))
    bad = re.search(r"NEOMESH_BAD_TOKEN (.*?) END", message)
    if bad:
        return DataError(bad.group(1))
    for path in files:
        count = 0
        try:
            for record in tf.data.TFRecordDataset(path):
                try:
                    tf.io.parse_single_example(record, features(tf))
                except tf.errors.InvalidArgumentError:
                    return DataError(f"{path}: record {count} is not a tf.train.Example with an int64 'text' list")
                count += 1
        except (tf.errors.DataLossError, tf.errors.OutOfRangeError) as e:
            offset = re.search(r"at (\d+)", e.message)
            where = f" at byte offset {offset.group(1)}" if offset else ""
            kind = "truncated" if "truncated" in e.message else "corrupt (CRC mismatch)"
            return DataError(f"{path}: record {count}{where} is {kind}")
    first = message.strip().splitlines()[0] if message.strip() else type(error).__name__
    return DataError(f"reading {len(files)} TFRecord files failed: {first[:300]}")
