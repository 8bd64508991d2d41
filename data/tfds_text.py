"""TFDS text datasets, tokenized once into TFRecords beside the prepared dataset.

Tokenizing inside tf.data needs a Python callback (``tf.numpy_function``) in the graph, and TensorFlow can hang
destroying such an iterator: the iterator's destructor holds the GIL while it waits for an in-flight callback that
needs the GIL to finish (seen at the end of ``--check-dataset``; the same can happen to every evaluation's
iterator). So a split is tokenized on first use, in plain Python, into a documents-mode TFRecord file with its
index, and read from then on like any other TFRecords dataset: no Python in the graph, per-host shards and saved
input positions as for files, token and byte counts (bits per byte) from the index.

The copy lives in ``<the dataset's version directory>/neomesh_tokenized/<split>-<text key>-<hash of the
tokenizer>/``, so it goes where the dataset goes; ``data_cache/`` holds it where that directory is read-only.
"""

from __future__ import annotations

import hashlib
import os

from data.prepare import build_once
from neomesh import paths

RECORDS = "documents.tfrecords"


def tokenizer_fingerprint(tokenizer) -> str:
    """Short hash of what decides the token ids: the tokenizer's full JSON, or its kind for the byte tokenizer."""
    inner = getattr(tokenizer, "tok", None)
    described = inner.to_str() if inner is not None else f"{type(tokenizer).__name__}/{tokenizer.vocab_size}"
    return hashlib.sha256(described.encode()).hexdigest()[:12]


def _writable(directory: str) -> bool:
    try:
        os.makedirs(directory, exist_ok=True)
        return os.access(directory, os.W_OK)
    except OSError:
        return False


def tokenized_split(builder, name: str, split: str, text_key: str, tokenizer, tokenizer_path: str) -> list[str]:
    """The TFRecord file(s) holding ``split`` of the prepared TFDS ``builder`` tokenized with ``tokenizer`` (each
    document + <|endoftext|>, one record each, in the split's order); written on first use."""
    leaf = f"{split}-{text_key}-{tokenizer_fingerprint(tokenizer)}"
    home = os.path.join(builder.data_dir, "neomesh_tokenized")
    if not _writable(home):
        home = os.path.join(paths.work_root(), "data_cache", "tfds", name.replace("/", "_"), str(builder.version))
    target = os.path.join(home, leaf)

    def build(directory: str) -> None:
        from data.create_tfrecords import write_file, write_index
        from data.pipeline import stream_options
        from data.tf_import import tensorflow, tensorflow_datasets

        tf, tfds = tensorflow(), tensorflow_datasets()

        os.makedirs(directory)
        texts = (row[text_key].decode("utf-8") for row in
                 tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False).with_options(stream_options(tf))))
        counts = write_file(texts, tokenizer, os.path.join(directory, RECORDS), "documents", 0)
        write_index(os.path.join(directory, "documents.index"), [counts], tokenizer, tokenizer_path, "documents", 0)
        with open(os.path.join(directory, "DONE"), "w") as f:
            f.write(f"tfds:{name} split {split!r}, feature {text_key!r}, tokenized\n")

    build_once(target, build, f"tokenizing tfds:{name} ({split}) once into {target}")
    return [os.path.join(target, RECORDS)]
