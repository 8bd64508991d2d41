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
An input that leaves no record (no document in it, or all under ``--minimum-size``) gets no file, which the reader
would refuse as empty; the index lists it under ``no_records`` and the summary counts it. A rerun under the same
name removes the files the index it replaces listed and it does not write, with a line saying so.
Outputs are written under temporary names (``*.tmp``, which no ``*.tfrecords`` glob matches) and renamed once every
file is done, then the index: a failure leaves no partial output. An input that cannot be decoded (invalid UTF-8,
binary, corrupt or truncated ``.zst``, bad JSON) is an error naming it, or with ``--skip-bad-files`` is left out
and listed under ``skipped`` in the index.

GPT-Neo's flags work as aliases: ``--input_dir --name --output_dir --encoder_path --chunk_size`` (its context
length: records hold chunk_size + 1 tokens, as ``--n-ctx``) ``--processes --files_per --minimum_size --separator
--ftfy --wikitext-detokenize --write_dataset_config``. GPT-Neo declared ``--ftfy`` and ``--wikitext-detokenize``
with ``store_false``, so there they were on unless the flag was given; here each flag turns its clean-up on, as
its help text said.
"""

from __future__ import annotations

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
    ``out_stem_00000.tfrecords`` ... of at most that many records each), each written as ``<name>.tmp`` and
    left so (``publish`` renames them); returns each file's counts. On failure nothing it wrote is left."""
    from config import ConfigError
    from data.tf_import import tensorflow
    tf = tensorflow()
    written: list[dict] = []
    try:
        return _write_records(tf, documents, tokenizer, out_stem, mode, chunk_size, options, written)
    except BaseException as e:
        for counts in written:
            _remove(os.path.join(os.path.dirname(out_stem), counts["file"] + ".tmp"))
        if isinstance(e, tf.errors.OpError):  # disk full, no permission, a missing bucket: the writer says which
            raise ConfigError(f"{out_stem}: cannot write ({e.message.strip().splitlines()[0][:200]})") from None
        raise


def _write_records(tf, documents: Iterable[str], tokenizer, out_stem: str, mode: str, chunk_size: int,
                   options: Options, written: list[dict]) -> list[dict]:
    from data.text_clean import cleaner
    clean = cleaner(options.ftfy, options.wikitext_detokenize)
    separator = list(options.separator) if options.separator else [tokenizer.eos_id]
    writer = None
    pending: list[int] = []

    def open_next():
        nonlocal writer
        if writer is not None:
            writer.close()
        path = f"{out_stem}.tfrecords" if options.files_per is None else f"{out_stem}_{len(written):05d}.tfrecords"
        written.append({"file": os.path.basename(path), "documents": 0, "records": 0, "tokens": 0, "bytes": 0,
                        "dropped_documents": 0})
        writer = tf.io.TFRecordWriter(path + ".tmp")

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
    directory = os.path.dirname(out_stem)
    for counts in written:  # in the index: a file cut short (or replaced) since is found at start, not at the cut
        counts["file_bytes"] = tf.io.gfile.stat(os.path.join(directory, counts["file"] + ".tmp")).length
    return written


def write_file(documents: Iterable[str], tokenizer, out_path: str, mode: str, chunk_size: int) -> dict:
    """Tokenizes ``documents`` into the one file ``out_path``; returns its counts for the index."""
    [counts] = write_files(documents, tokenizer, out_path.removesuffix(".tfrecords"), mode, chunk_size)
    publish(os.path.dirname(out_path), [counts])
    return counts


def publish(directory: str, written: list[dict]) -> None:
    """Renames every written ``<file>.tmp`` in ``directory`` to its final name."""
    for counts in written:
        final = os.path.join(directory, counts["file"])
        os.replace(final + ".tmp", final)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _job(args) -> dict:
    """One input file's TFRecords, under temporary names; a file that cannot be decoded leaves nothing and, with
    ``skip_bad``, is reported instead."""
    in_path, out_stem, tokenizer_path, mode, chunk_size, options, skip_bad = args
    from data.text_files import SKIP_HINT, BadFile, read_documents
    from data.tokenizer import load_tokenizer
    try:
        return {"written": write_files(read_documents(in_path), load_tokenizer(tokenizer_path), out_stem, mode,
                                       chunk_size, options)}
    except BadFile as e:
        if skip_bad:
            return {"skipped": in_path, "error": str(e)}
        raise BadFile(f"{e}; {SKIP_HINT}") from None


def write_index(path: str, files: list[dict], tokenizer, tokenizer_path: str, mode: str, chunk_size: int,
                separator: tuple[int, ...] | None = None, skipped: list[dict] = (),
                no_records: list[dict] = ()) -> dict:
    """``NAME.index``, written under a temporary name and renamed: the files, their counts and totals, the
    tokenizer's size, hash (data/tokenizer.py tokenizer_hash) and separator, the input files skipped as bad (with
    why), and those that gave no record (with the documents they dropped, counted in the totals)."""
    from data.tokenizer import tokenizer_hash

    totals = {k: sum(f.get(k, 0) for f in [*files, *no_records]) for k in ("documents", "records", "tokens",
                                                                            "bytes", "dropped_documents")}
    index = {"format": INDEX_FORMAT, "mode": mode, "chunk_size": chunk_size, "tokenizer": tokenizer_path,
             "vocab_size": tokenizer.vocab_size, "tokenizer_hash": tokenizer_hash(tokenizer),
             "eos_id": tokenizer.eos_id,
             "separator": list(separator) if separator else [tokenizer.eos_id], "totals": totals, "files": files,
             "skipped": list(skipped), "no_records": list(no_records)}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(index, f, indent=1)
    os.replace(tmp, path)
    return index


def create(inputs: list[str], output_dir: str, name: str, tokenizer_path: str, mode: str = "chunks",
           chunk_size: int = 2049, workers: int = 0, options: Options = Options(),
           skip_bad_files: bool = False, tokenizer_flag: str = "--tokenizer") -> dict:
    """Writes TFRecord files (one per input file, or several of ``options.files_per`` records; in parallel over
    ``workers`` processes) and ``NAME.index``. Outputs are renamed into place only once every file is done, then
    the index is written: a failure leaves no partial output. A file that cannot be decoded is an error naming it,
    or with ``skip_bad_files`` is left out and listed under ``skipped`` in the index."""
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
    tokenizer = load_tokenizer(tokenizer_path, tokenizer_flag)
    bad = [i for i in options.separator or () if not 0 <= i < tokenizer.vocab_size]
    if bad:
        raise ConfigError(f"--separator: id {bad[0]} is outside the tokenizer's [0, {tokenizer.vocab_size})")
    cleaner(options.ftfy, options.wikitext_detokenize)  # a missing ftfy is an error before any work
    files = expand_inputs(inputs)
    os.makedirs(output_dir, exist_ok=True)
    jobs = [(f, os.path.join(output_dir, f"{name}_{i:05d}"), tokenizer_path, mode, chunk_size, options,
             skip_bad_files) for i, f in enumerate(files)]
    workers = min(workers or os.cpu_count() or 1, len(jobs))
    pool = ProcessPoolExecutor(workers) if workers > 1 else None
    results: list[dict] = []
    try:
        for result in (pool.map(_job, jobs) if pool else map(_job, jobs)):
            results.append(result)
    except BaseException:
        if pool:  # jobs not started are dropped; the running ones finish, so nothing writes once it returns
            pool.shutdown(wait=True, cancel_futures=True)
        for result in results:  # the failing job cleaned up after itself; the finished ones are removed here
            for counts in result.get("written", ()):
                _remove(os.path.join(output_dir, counts["file"] + ".tmp"))
        raise
    if pool:
        pool.shutdown()
    skipped = [r for r in results if "skipped" in r]
    # An input with no record left (no document in it, or all under --minimum-size) would be a 0-byte file that
    # the reader refuses as a failed write: it is not published, and the index names it with what it dropped.
    no_records = [{"input": job[0], "dropped_documents": sum(c["dropped_documents"] for c in r["written"])}
                  for job, r in zip(jobs, results) if "written" in r and not any(c["records"] for c in r["written"])]
    for result in results:
        for counts in result.get("written", ()):
            if not counts["records"]:
                _remove(os.path.join(output_dir, counts["file"] + ".tmp"))
    written = [counts for r in results for counts in r.get("written", ()) if counts["records"]]
    if not written:
        if skipped and not no_records:
            raise ConfigError(f"every input file is bad; the first: {skipped[0]['error']}")
        dropped = sum(e["dropped_documents"] for e in no_records)
        why = (f"every document is under --minimum-size {options.minimum_size} ({dropped:,} dropped)" if dropped
               else "no document in them")
        raise ConfigError(f"--input: no record to write from {len(files)} file(s) ({no_records[0]['input']}"
                          f"{', ...' if len(no_records) > 1 else ''}): {why}"
                          + (f"; {len(skipped)} bad file(s) skipped" if skipped else ""))
    index_path = os.path.join(output_dir, f"{name}.index")
    previous = _listed_files(index_path)
    publish(output_dir, written)
    index = write_index(index_path, written, tokenizer, tokenizer_path, mode, chunk_size, options.separator,
                        skipped, no_records)
    # A rerun under the same name that writes fewer files replaced the index listing the earlier ones: those left
    # would still match NAME_*.tfrecords and be trained on unchecked, as data this run never wrote.
    index["removed"] = sorted(set(previous) - {c["file"] for c in written})
    for file in index["removed"]:
        _remove(os.path.join(output_dir, file))
    return index


def _listed_files(index_path: str) -> list[str]:
    """The files an existing ``NAME.index`` lists (none when there is none, or it cannot be read)."""
    try:
        with open(index_path) as f:
            files = json.load(f).get("files", [])
        return [e["file"] for e in files if isinstance(e, dict) and isinstance(e.get("file"), str)
                and os.path.basename(e["file"]) == e["file"]]
    except (OSError, ValueError, AttributeError):
        return []


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


def flag_as_typed(typed: list[str], names: tuple[str, ...]) -> str:
    """The one of ``names`` (ours, or GPT-Neo's alias) that the command line used, for errors that name it."""
    return next((a.split("=")[0] for a in typed if a.split("=")[0] in names), names[0])


def check_sizes(args, typed: list[str]) -> None:
    """Each size flag in range, or a one-line error naming it as typed (ours, or GPT-Neo's alias)."""
    from config import ConfigError

    limits = ((("--n-ctx", "--chunk_size"), args.n_ctx, 1), (("--chunk-size",), args.chunk_size, 1),
              (("--files-per", "--files_per"), args.files_per, 1), (("--workers", "--processes"), args.workers, 0),
              (("--minimum-size", "--minimum_size"), args.minimum_size, 0))
    for names, value, least in limits:
        if value is not None and value < least:
            flag = flag_as_typed(typed, names)
            raise ConfigError(f"{flag}: {value} must be {'positive' if least else 'zero or more'}")


def main(argv=None) -> int:
    from neomesh.help import ArgumentParser, HelpFormatter

    p = ArgumentParser(description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
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
    p.add_argument("--skip-bad-files", action="store_true", help="leave out input files that cannot be decoded "
                   "(invalid UTF-8, binary, corrupt or truncated .zst, bad JSON) and count them, instead of stopping")
    args = p.parse_args(argv)
    from config import ConfigError
    from data.source import DATASET_CONFIG_DIR
    typed = sys.argv[1:] if argv is None else argv
    options = Options(separator=tuple(args.separator) if args.separator else None, minimum_size=args.minimum_size,
                      files_per=args.files_per, ftfy=args.ftfy, wikitext_detokenize=args.wikitext_detokenize)
    try:
        check_sizes(args, typed)
        if not args.tokenizer:
            raise ConfigError("--tokenizer (GPT-Neo's --encoder_path) is required; GPT-Neo's default, GPT-2's "
                              "tokenizer, works from a local folder with vocab.json + merges.txt")
        index = create(args.input, args.output_dir, args.name, args.tokenizer, args.mode,
                       args.n_ctx + 1 if args.chunk_size is None else args.chunk_size, args.workers, options,
                       args.skip_bad_files, flag_as_typed(typed, ("--tokenizer", "--encoder_path")))
        config_path = write_dataset_config(DATASET_CONFIG_DIR, args.name, args.output_dir, args.tokenizer, index) \
            if args.write_dataset_config else None
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line, as every command says it (outputs are published whole)
        print("interrupted", file=sys.stderr)
        return 130
    except OSError as e:  # disk full, permissions, a directory where a file should be
        print(f"error: {e.filename or args.output_dir}: {e.strerror or e}", file=sys.stderr)
        return 2
    t, skipped = index["totals"], index["skipped"]
    dropped = (f"{t['dropped_documents']:,} documents under --minimum-size {args.minimum_size} were dropped"
               if t["dropped_documents"] else "no document or token was dropped")
    if skipped:
        of_others = dropped.replace("no document or token was dropped",
                                    "no document or token of the other files was dropped")
        dropped = (f"skipped {len(skipped)} bad input file(s) ({skipped[0]['error']}"
                   f"{', ...' if len(skipped) > 1 else ''}); {of_others}")
    empty = index["no_records"]
    if empty:
        dropped += (f"; {len(empty)} input file(s) gave no record, so no file ({empty[0]['input']}"
                    f"{', ...' if len(empty) > 1 else ''})")
    print(f"wrote {len(index['files'])} file(s) to {args.output_dir}: {t['documents']:,} documents, "
          f"{t['records']:,} records, {t['tokens']:,} tokens ({t['bytes'] / max(t['tokens'], 1):.2f} bytes/token), "
          f"index {os.path.join(args.output_dir, args.name + '.index')}; {dropped}")
    if index["removed"]:
        print(f"removed {len(index['removed'])} file(s) the previous {args.name}.index listed and this run did not "
              f"write ({index['removed'][0]}{', ...' if len(index['removed']) > 1 else ''}), so that "
              f"{args.name}_*.tfrecords matches only this run's files")
    if config_path:
        print(f"wrote {config_path}: name it in a config as \"datasets\": [[\"{args.name}\", null, null, null]]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
