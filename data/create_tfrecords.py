"""Tokenize documents into TFRecords in GPT-Neo's format:
``python data/create_tfrecords.py --input PATH... --output-dir DIR --name NAME --tokenizer TOKENIZER``.

Each record is one ``tf.train.Example`` whose feature ``"text"`` is an int64 list of token ids. Every document
is followed by ``<|endoftext|>``, so concatenating the records of a file gives back its token stream. Two modes:

* ``chunks`` (default, GPT-Neo's): the stream of an input file cut into records of ``--chunk-size`` tokens
  (default ``n_ctx + 1``); the last record of a file is shorter rather than dropped.
* ``documents``: one record per document (of any length, empty ones included).

Input files are tokenized in parallel, one output file ``NAME_00000.tfrecords`` ... per input file (with
``--files-per N``, files of at most N records: ``NAME_00000_00000.tfrecords`` ...). ``NAME.index`` (JSON) lists
every output file with its documents, records, tokens and bytes, and the tokenizer's vocabulary size, which the
reader checks. No document and no token is dropped unless ``--minimum-size`` asks for it; the counts are printed.

GPT-Neo's flags work as aliases: ``--input_dir --name --output_dir --encoder_path --chunk_size`` (its context
length: records hold chunk_size + 1 tokens, as ``--n-ctx``) ``--processes --files_per --minimum_size --separator
--ftfy --wikitext-detokenize --write_dataset_config``. GPT-Neo declared ``--ftfy`` and ``--wikitext-detokenize``
with ``store_false``, so there they were on unless the flag was given; here each flag turns its clean-up on, as
its help text said.
"""

from __future__ import annotations

import argparse
import dataclasses
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


@dataclasses.dataclass(frozen=True)
class Options:
    """GPT-Neo's create_tfrecords options."""

    separator: tuple[int, ...] | None = None  # ids after every document (default: the tokenizer's <|endoftext|>)
    minimum_size: int = 0  # documents with fewer tokens (separator not counted) are dropped, and counted
    files_per: int | None = None  # records per output file (default: one file per input file)
    ftfy: bool = False  # fix text with ftfy (NFKC) before tokenizing
    wikitext_detokenize: bool = False  # undo WikiText's tokenized spacing before tokenizing


def write_files(documents: Iterable[str], tokenizer, out_stem: str, mode: str, chunk_size: int,
                options: Options = Options()) -> list[dict]:
    """Tokenizes ``documents`` into ``out_stem.tfrecords`` (or, with ``options.files_per``, into
    ``out_stem_00000.tfrecords`` ... of at most that many records each); returns each file's counts."""
    from data.tf_import import tensorflow
    from data.text_clean import cleaner
    tf = tensorflow()
    clean = cleaner(options.ftfy, options.wikitext_detokenize)
    separator = list(options.separator) if options.separator else [tokenizer.eos_id]
    written: list[dict] = []
    writer = None
    pending: list[int] = []

    def open_next():
        nonlocal writer
        if writer is not None:
            writer.close()
        path = f"{out_stem}.tfrecords" if options.files_per is None else f"{out_stem}_{len(written):05d}.tfrecords"
        written.append({"file": os.path.basename(path), "documents": 0, "records": 0, "tokens": 0, "bytes": 0,
                        "dropped_documents": 0})
        writer = tf.io.TFRecordWriter(path)

    def emit(ids):
        if options.files_per is not None and written[-1]["records"] == options.files_per:
            open_next()
        writer.write(serialize(tf, ids))
        written[-1]["records"] += 1
        written[-1]["tokens"] += len(ids)

    def encode(texts):
        for text, ids in zip(texts, tokenizer.encode_batch(texts)):
            counts = written[-1]
            if len(ids) < options.minimum_size:
                counts["dropped_documents"] += 1
                continue
            counts["documents"] += 1
            counts["bytes"] += len(text.encode("utf-8"))
            ids.extend(separator)
            if mode == "documents":
                emit(ids)
                continue
            pending.extend(ids)
            while len(pending) >= chunk_size:
                emit(pending[:chunk_size])
                del pending[:chunk_size]

    open_next()
    batch: list[str] = []
    for text in documents:
        batch.append(clean(text) if clean else text)
        if len(batch) == ENCODE_BATCH:
            encode(batch)
            batch = []
    encode(batch)
    if pending:  # the input's tail: a short record, never dropped
        emit(pending)
    writer.close()
    return written


def write_file(documents: Iterable[str], tokenizer, out_path: str, mode: str, chunk_size: int) -> dict:
    """Tokenizes ``documents`` into the one file ``out_path``; returns its counts for the index."""
    return write_files(documents, tokenizer, out_path.removesuffix(".tfrecords"), mode, chunk_size)[0]


def _job(args) -> list[dict]:
    in_path, out_stem, tokenizer_path, mode, chunk_size, options = args
    from data.text_files import read_documents
    from data.tokenizer import load_tokenizer
    return write_files(read_documents(in_path), load_tokenizer(tokenizer_path), out_stem, mode, chunk_size, options)


def write_index(path: str, files: list[dict], tokenizer, tokenizer_path: str, mode: str, chunk_size: int,
                separator: tuple[int, ...] | None = None) -> dict:
    totals = {k: sum(f.get(k, 0) for f in files) for k in ("documents", "records", "tokens", "bytes",
                                                            "dropped_documents")}
    index = {"format": INDEX_FORMAT, "mode": mode, "chunk_size": chunk_size, "tokenizer": tokenizer_path,
             "vocab_size": tokenizer.vocab_size, "eos_id": tokenizer.eos_id,
             "separator": list(separator) if separator else [tokenizer.eos_id], "totals": totals, "files": files}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(index, f, indent=1)
    os.replace(tmp, path)
    return index


def create(inputs: list[str], output_dir: str, name: str, tokenizer_path: str, mode: str = "chunks",
           chunk_size: int = 2049, workers: int = 0, options: Options = Options()) -> dict:
    """Writes TFRecord files (one per input file, or several of ``options.files_per`` records; in parallel over
    ``workers`` processes) and ``NAME.index``."""
    from config import ConfigError
    from data.text_clean import cleaner
    from data.text_files import expand_inputs
    from data.tokenizer import load_tokenizer

    if chunk_size < 1:
        raise ConfigError(f"--chunk-size: {chunk_size} must be positive")
    if options.files_per is not None and options.files_per < 1:
        raise ConfigError(f"--files-per: {options.files_per} must be positive")
    if options.minimum_size < 0:
        raise ConfigError(f"--minimum-size: {options.minimum_size} must not be negative")
    tokenizer = load_tokenizer(tokenizer_path)
    bad = [i for i in options.separator or () if not 0 <= i < tokenizer.vocab_size]
    if bad:
        raise ConfigError(f"--separator: id {bad[0]} is outside the tokenizer's [0, {tokenizer.vocab_size})")
    cleaner(options.ftfy, options.wikitext_detokenize)  # a missing ftfy is an error before any work
    files = expand_inputs(inputs)
    os.makedirs(output_dir, exist_ok=True)
    jobs = [(f, os.path.join(output_dir, f"{name}_{i:05d}"), tokenizer_path, mode, chunk_size, options)
            for i, f in enumerate(files)]
    workers = min(workers or os.cpu_count() or 1, len(jobs))
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            written = list(pool.map(_job, jobs))
    else:
        written = [_job(j) for j in jobs]
    return write_index(os.path.join(output_dir, f"{name}.index"), [f for w in written for f in w], tokenizer,
                       tokenizer_path, mode, chunk_size, options.separator)


def write_dataset_config(directory: str, name: str, output_dir: str, tokenizer_path: str, index: dict) -> str:
    """``DIRECTORY/NAME.json`` naming what was written (GPT-Neo's ``--write_dataset_config``); an existing
    different file of that name is an error, not overwritten."""
    from config import ConfigError

    tokenizer = tokenizer_path if tokenizer_path == "bytes" else os.path.abspath(tokenizer_path)
    body = {"path": os.path.join(os.path.abspath(output_dir), f"{name}_*.tfrecords"), "eval_path": "",
            "tokenizer_path": tokenizer, "n_vocab": index["vocab_size"], "eos_id": index["eos_id"]}
    path = os.path.join(directory, f"{name}.json")
    text = json.dumps(body, indent=2) + "\n"
    if os.path.exists(path):
        with open(path) as f:
            if f.read() != text:
                raise ConfigError(f"--write-dataset-config: {path} exists with other contents; remove it or "
                                  "choose another --name")
    with open(path, "w") as f:
        f.write(text)
    return path


def main(argv=None) -> int:
    from neomesh.help import HelpFormatter

    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
    p.add_argument("--input", "--input_dir", nargs="+", required=True, metavar="PATH",
                   help=".txt / .jsonl / .jsonl.zst files, directories or globs; 'embedded' for the built-in corpus")
    p.add_argument("--output-dir", "--output_dir", required=True, help="where the TFRecords and NAME.index are "
                   "written")
    p.add_argument("--name", required=True, help="output files are NAME_00000.tfrecords ... and NAME.index")
    p.add_argument("--tokenizer", "--encoder_path", help="tokenizer.json, a directory with tokenizer.json or "
                   "GPT-2's vocab.json + merges.txt, or 'bytes' (required)")
    p.add_argument("--mode", choices=("chunks", "documents"), default="chunks",
                   help="chunks: the token stream cut into --chunk-size records; documents: a record per document")
    p.add_argument("--n-ctx", "--chunk_size", type=int, default=2048, dest="n_ctx",
                   help="context length; the default chunk size is n_ctx + 1 (GPT-Neo's --chunk_size)")
    p.add_argument("--chunk-size", type=int, help="tokens per record in chunks mode (default: n_ctx + 1)")
    p.add_argument("--workers", "--processes", type=int, default=0,
                   help="processes (0: one per CPU, at most one per file)")
    p.add_argument("--files-per", "--files_per", type=int, help="at most this many records per output file "
                   "(default: one output file per input file)")
    p.add_argument("--minimum-size", "--minimum_size", type=int, default=0,
                   help="drop documents of fewer tokens (counted in the index; 0: keep all)")
    p.add_argument("--separator", nargs="+", type=int, help="ids written after every document (default: the "
                   "tokenizer's <|endoftext|>)")
    p.add_argument("--ftfy", action="store_true", help="fix text with ftfy (NFKC) first (needs ftfy)")
    p.add_argument("--wikitext-detokenize", "--wikitext_detokenize", action="store_true",
                   help="undo WikiText's tokenized spacing first")
    p.add_argument("--write-dataset-config", "--write_dataset_config", action="store_true",
                   help="also write configs/dataset_configs/NAME.json naming these files")
    args = p.parse_args(argv)
    from config import ConfigError
    from data.source import DATASET_CONFIG_DIR
    options = Options(separator=tuple(args.separator) if args.separator else None, minimum_size=args.minimum_size,
                      files_per=args.files_per, ftfy=args.ftfy, wikitext_detokenize=args.wikitext_detokenize)
    try:
        if not args.tokenizer:
            raise ConfigError("--tokenizer (GPT-Neo's --encoder_path) is required; GPT-Neo's default, GPT-2's "
                              "tokenizer, works from a local folder with vocab.json + merges.txt")
        index = create(args.input, args.output_dir, args.name, args.tokenizer, args.mode,
                       args.chunk_size or args.n_ctx + 1, args.workers, options)
        config_path = write_dataset_config(DATASET_CONFIG_DIR, args.name, args.output_dir, args.tokenizer, index) \
            if args.write_dataset_config else None
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t = index["totals"]
    dropped = (f"{t['dropped_documents']:,} documents under --minimum-size {args.minimum_size} were dropped"
               if t["dropped_documents"] else "no document or token was dropped")
    print(f"wrote {len(index['files'])} file(s) to {args.output_dir}: {t['documents']:,} documents, "
          f"{t['records']:,} records, {t['tokens']:,} tokens ({t['bytes'] / max(t['tokens'], 1):.2f} bytes/token), "
          f"index {os.path.join(args.output_dir, args.name + '.index')}; {dropped}")
    if config_path:
        print(f"wrote {config_path}: name it in a config as \"datasets\": [[\"{args.name}\", null, null, null]]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
