"""Tokenize documents into TFRecords in GPT-Neo's format:
``python data/create_tfrecords.py --input PATH... --output-dir DIR --name NAME --tokenizer TOKENIZER``.

Each record is one ``tf.train.Example`` whose feature ``"text"`` is an int64 list of token ids. Every document
is followed by ``<|endoftext|>``, so concatenating the records of a file gives back its token stream. Two modes:

* ``chunks`` (default, GPT-Neo's): the stream of an input file cut into records of ``--chunk-size`` tokens
  (default ``n_ctx + 1``); the last record of a file is shorter rather than dropped.
* ``documents``: one record per document (of any length, empty ones included).

Input files are tokenized in parallel, one output file ``NAME_00000.tfrecords`` ... per input file.
``NAME.index`` (JSON) lists every output file with its documents, records, tokens and bytes, and the tokenizer's
vocabulary size, which the reader checks. No document and no token is ever dropped; the counts are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Iterable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere

INDEX_FORMAT = "neomesh-tfrecords/1"
ENCODE_BATCH = 256  # documents per tokenizers.encode_batch call (it parallelises inside a batch)


def serialize(tf, ids) -> bytes:
    """One GPT-Neo record: a tf.train.Example with int64 feature "text"."""
    feature = tf.train.Feature(int64_list=tf.train.Int64List(value=ids))
    return tf.train.Example(features=tf.train.Features(feature={"text": feature})).SerializeToString()


def write_file(documents: Iterable[str], tokenizer, out_path: str, mode: str, chunk_size: int) -> dict:
    """Tokenizes ``documents`` into ``out_path``; returns its counts for the index."""
    from data.tf_import import tensorflow
    tf = tensorflow()
    counts = {"file": os.path.basename(out_path), "documents": 0, "records": 0, "tokens": 0, "bytes": 0}
    pending: list[int] = []
    with tf.io.TFRecordWriter(out_path) as writer:
        def emit(ids):
            writer.write(serialize(tf, ids))
            counts["records"] += 1
            counts["tokens"] += len(ids)

        def encode(batch):
            for ids in tokenizer.encode_batch(batch):
                ids.append(tokenizer.eos_id)
                counts["documents"] += 1
                if mode == "documents":
                    emit(ids)
                    continue
                pending.extend(ids)
                while len(pending) >= chunk_size:
                    emit(pending[:chunk_size])
                    del pending[:chunk_size]

        batch: list[str] = []
        for text in documents:
            counts["bytes"] += len(text.encode("utf-8"))
            batch.append(text)
            if len(batch) == ENCODE_BATCH:
                encode(batch)
                batch = []
        encode(batch)
        if pending:  # the file's tail: a short record, never dropped
            emit(pending)
    return counts


def _job(args) -> dict:
    in_path, out_path, tokenizer_path, mode, chunk_size = args
    from data.text_files import read_documents
    from data.tokenizer import load_tokenizer
    return write_file(read_documents(in_path), load_tokenizer(tokenizer_path), out_path, mode, chunk_size)


def write_index(path: str, files: list[dict], tokenizer, tokenizer_path: str, mode: str, chunk_size: int) -> dict:
    totals = {k: sum(f[k] for f in files) for k in ("documents", "records", "tokens", "bytes")}
    index = {"format": INDEX_FORMAT, "mode": mode, "chunk_size": chunk_size, "tokenizer": tokenizer_path,
             "vocab_size": tokenizer.vocab_size, "eos_id": tokenizer.eos_id, "totals": totals, "files": files}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(index, f, indent=1)
    os.replace(tmp, path)
    return index


def create(inputs: list[str], output_dir: str, name: str, tokenizer_path: str, mode: str = "chunks",
           chunk_size: int = 2049, workers: int = 0) -> dict:
    """Writes one TFRecord file per input file (in parallel over ``workers`` processes) and ``NAME.index``."""
    from config import ConfigError
    from data.text_files import expand_inputs
    from data.tokenizer import load_tokenizer

    if chunk_size < 1:
        raise ConfigError(f"--chunk-size: {chunk_size} must be positive")
    tokenizer = load_tokenizer(tokenizer_path)
    files = expand_inputs(inputs)
    os.makedirs(output_dir, exist_ok=True)
    jobs = [(f, os.path.join(output_dir, f"{name}_{i:05d}.tfrecords"), tokenizer_path, mode, chunk_size)
            for i, f in enumerate(files)]
    workers = min(workers or os.cpu_count() or 1, len(jobs))
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            written = list(pool.map(_job, jobs))
    else:
        written = [_job(j) for j in jobs]
    return write_index(os.path.join(output_dir, f"{name}.index"), written, tokenizer, tokenizer_path, mode,
                       chunk_size)


def main(argv=None) -> int:
    from neomesh.help import HelpFormatter

    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
    p.add_argument("--input", nargs="+", required=True, metavar="PATH",
                   help=".txt / .jsonl / .jsonl.zst files, directories or globs; 'embedded' for the built-in corpus")
    p.add_argument("--output-dir", required=True, help="where the TFRecords and NAME.index are written")
    p.add_argument("--name", required=True, help="output files are NAME_00000.tfrecords ... and NAME.index")
    p.add_argument("--tokenizer", required=True, help="tokenizer.json, a directory with tokenizer.json or "
                   "GPT-2's vocab.json + merges.txt, or 'bytes'")
    p.add_argument("--mode", choices=("chunks", "documents"), default="chunks",
                   help="chunks: the token stream cut into --chunk-size records; documents: a record per document")
    p.add_argument("--n-ctx", type=int, default=2048, help="context length; the default chunk size is n_ctx + 1")
    p.add_argument("--chunk-size", type=int, help="tokens per record in chunks mode (default: n_ctx + 1)")
    p.add_argument("--workers", type=int, default=0, help="processes (0: one per CPU, at most one per file)")
    args = p.parse_args(argv)
    from config import ConfigError
    try:
        index = create(args.input, args.output_dir, args.name, args.tokenizer, args.mode,
                       args.chunk_size or args.n_ctx + 1, args.workers)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t = index["totals"]
    print(f"wrote {len(index['files'])} file(s) to {args.output_dir}: {t['documents']:,} documents, "
          f"{t['records']:,} records, {t['tokens']:,} tokens ({t['bytes'] / max(t['tokens'], 1):.2f} bytes/token), "
          f"index {os.path.join(args.output_dir, args.name + '.index')}; no document or token was dropped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
