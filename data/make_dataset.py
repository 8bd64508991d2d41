"""Your own text to a dataset train.py reads, in one command:

    python data/make_dataset.py --input 'my_texts/*.txt' [--vocab-size 8192 | --tokenizer PATH]
                                [--eval-fraction 0.05] [--n-ctx 2048] [--output-dir DIR] [--config FILE]
                                [--skip-bad-files]

Inputs are ``.txt`` (a document per file), ``.jsonl`` and ``.jsonl.zst`` (a ``text`` field per line) files,
folders or globs. The command trains a byte-level BPE on the train documents (data/tokenizer.py, as
train_tokenizer.py does) or reuses ``--tokenizer``, writes train and eval TFRecords in GPT-Neo's format (records
of n_ctx + 1 tokens, as create_tfrecords.py writes them) and ``dataset.json``, a dataset config whose paths are
relative to its folder. Train on it with ``python train.py --data DIR``, or name ``DIR/dataset.json`` in a
config's ``datasets``. ``--config`` prepares the text for that config as ``train.py --data`` does: its objective's
special tokens (BERT's ``[MASK]``, T5's sentinels) are trained into the BPE (or looked up in ``--tokenizer``), and
the vocabulary size and context default to its ``n_vocab`` and ``n_ctx``.

Eval split (data/eval_split.py): a document is held out when a hash of its text falls below the fraction, so
adding, removing or renaming files moves no other document between train and eval; at least one document is
held out of two or more. A single document (one book in one .txt file) gives its last fraction, cut at a line
break, to eval.

The output folder defaults to ``data_cache/NAME-HASH``, HASH covering the input files' contents and the settings,
so running the command again on the same files reuses it at once, and changed files get a new folder. It is
built in a temporary folder and published by one rename, under a file lock. An ``--output-dir`` holding files
this command did not write is refused, never replaced.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shlex
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Iterator, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere

from config import ConfigError  # noqa: E402  (after the path: run from anywhere)
from data.eval_split import SCHEME as EVAL_SPLIT  # noqa: E402
from neomesh.units import human_bytes  # noqa: E402

FORMAT = "neomesh-text-dataset/1"
EVAL_FRACTION = 0.05
MAX_SHARDS = 64  # output files per split: consecutive input files are grouped into at most this many
SMALL_INPUT = 32 << 20  # bytes of input below which one process writes the TFRecords


def dataset_name(inputs: list[str]) -> str:
    """A short name for the inputs: the folder's name, a glob's folder, or a single file's stem."""
    first = inputs[0].rstrip("/")
    if os.path.isdir(first):
        name = os.path.basename(os.path.abspath(first))
    elif glob.has_magic(first) or len(inputs) > 1:
        name = os.path.basename(os.path.abspath(os.path.dirname(first.split("*")[0]) or "."))
    else:
        name = os.path.basename(first).split(".")[0]
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "text"


def documents(files: list[str], which: str, split) -> Iterator[str]:
    """The ``which`` ("train" or "eval") texts of input ``files`` under ``split`` (an ``EvalSplit``)."""
    from data.text_files import read_documents

    for path in files:
        for text in read_documents(path, keep_blank=False):
            part = split.parts(text)[which == "eval"]
            if part:
                yield part


def count_documents(files: list[str], skip_bad_files: bool, say: Callable[[str], None], draws) -> tuple[
        list[tuple[str, int]], list[dict]]:
    """``([(file, its documents), ...], [{"file", "error"} of each bad file skipped])``: every file is read through
    once, before any work, so a bad one (unreadable, not UTF-8, binary, corrupt .zst) stops the command at once,
    naming it, or with ``skip_bad_files`` is left out with a warning line; and the documents are counted as they
    will be read (an empty .txt file holds none), each one's draw added to ``draws`` (data/eval_split.py)."""
    from data.eval_split import Draws
    from data.text_files import SKIP_HINT, BadFile, read_documents

    counts, skipped = [], []
    for path in files:
        try:
            own = Draws(draws.fraction)  # merged once the whole file read without error
            for text in read_documents(path, keep_blank=False):
                own.add(text)
            counts.append((path, own.count))
            draws.merge(own)
        except BadFile as e:
            if not skip_bad_files:
                raise BadFile(f"{e}; {SKIP_HINT}") from None
            say(f"data: warning: {e}; skipped (--skip-bad-files)")
            skipped.append({"file": path, "error": str(e)})
    return counts, skipped


def check_skipped(folder: str, skip_bad_files: bool, say: Callable[[str], None]) -> str:
    """Before reusing ``folder``: the bad files its build skipped are an error again without ``skip_bad_files``
    (as they would be for a fresh build), else each is a warning line again; returns a note saying how many."""
    from data.text_files import SKIP_HINT, BadFile

    skipped = manifest(folder).get("skipped") or []
    if skipped and not skip_bad_files:
        raise BadFile(f"{skipped[0]['error']}; {SKIP_HINT}")
    for bad in skipped:
        say(f"data: warning: {bad['error']}; skipped (--skip-bad-files)")
    return f"; {len(skipped)} bad file{'s' * (len(skipped) != 1)} skipped" if skipped else ""


def content_key(files: list[str], settings: dict) -> str:
    """A hash of the settings and of every input file's bytes, in input order (for a file that cannot be read, a
    mark saying so)."""
    digest = hashlib.sha256(json.dumps({"format": FORMAT, **settings}, sort_keys=True).encode())
    for path in files:
        digest.update(os.path.splitext(path)[1].encode() + b"\0")  # the suffix decides how a file is read
        if path == "embedded":
            digest.update(b"embedded")
            continue
        try:
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
        except OSError as e:  # named (or skipped) when the files are read; made readable, it gives a new key
            digest.update(f"\0unreadable: {e.strerror}".encode())
    return digest.hexdigest()


def _write_shard(job) -> dict:
    files, which, split, out_path, tokenizer_path, chunk_size = job
    from data.create_tfrecords import write_file
    from data.tokenizer import load_tokenizer

    counts = write_file(documents(files, which, split), load_tokenizer(tokenizer_path), out_path, "chunks",
                        chunk_size)
    if counts["records"] == 0:  # an empty TFRecord file is an error for the reader: leave none
        os.remove(out_path)
    return counts


def write_splits(directory: str, files: list[str], split, tok, tokenizer_file: str, chunk_size: int,
                 processes: int, say) -> tuple[dict, dict]:
    """Writes ``train_*`` / ``eval_*`` TFRecords of ``files`` divided by ``split`` (an ``EvalSplit``; consecutive
    input files grouped into at most MAX_SHARDS files per split) and their indexes; returns (the dataset config,
    token/document/byte totals per split)."""
    from data.create_tfrecords import write_index

    count = min(len(files), MAX_SHARDS)
    shards = [files[len(files) * i // count:len(files) * (i + 1) // count] for i in range(count)]
    splits = ("train", "eval") if split.fraction > 0 else ("train",)
    tokenizer_path = os.path.join(directory, tokenizer_file) if tokenizer_file != "bytes" else "bytes"
    jobs = [(shard, which, split, os.path.join(directory, f"{which}_{i:05d}.tfrecords"), tokenizer_path,
             chunk_size) for which in splits for i, shard in enumerate(shards)]
    processes = min(processes, len(jobs))
    say(f"data: writing TFRecords ({processes} process{'es' if processes > 1 else ''})")
    if processes > 1:
        import multiprocessing  # spawn: forking after the tokenizer trained with threads can deadlock
        with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
            written = list(pool.map(_write_shard, jobs))
    else:
        written = [_write_shard(job) for job in jobs]
    dataset = {"path": "train_*.tfrecords", "tokenizer_path": tokenizer_file, "n_vocab": tok.vocab_size,
               "eos_id": tok.eos_id}
    totals = {}
    for which in splits:
        kept = [c for (_, s, *_), c in zip(jobs, written) if s == which and c["records"]]
        totals[which] = {k: sum(c[k] for c in kept) for k in ("documents", "tokens", "bytes")}
        if kept:
            write_index(os.path.join(directory, f"{which}.index"), kept, tok, tokenizer_file, "chunks", chunk_size)
            if which == "eval":
                dataset["eval_path"] = "eval_*.tfrecords"
    return dataset, totals


def make_dataset(inputs: list[str], output_dir: str | None = None, vocab_size: int = 8192,
                 tokenizer: str | None = None, eval_fraction: float = EVAL_FRACTION, n_ctx: int = 2048,
                 min_frequency: int = 2, workers: int = 0, say: Callable[[str], None] | None = None,
                 special_tokens: Sequence[str] = (), input_flag: str = "--input", vocab_flag: str = "--vocab-size",
                 tokenizer_flag: str = "--tokenizer", skip_bad_files: bool = False) -> str:
    """Prepares (or finds already prepared) the dataset of ``inputs``; returns its folder, holding
    ``dataset.json``, ``tokenizer.json`` (unless the tokenizer is bytes), ``train_*.tfrecords`` and
    ``eval_*.tfrecords`` with their ``.index`` files. A trained BPE holds ``special_tokens`` too (``[MASK]``, T5's
    sentinels) within its ``vocab_size``. Errors name ``input_flag``, ``vocab_flag`` and ``tokenizer_flag``, the
    flags that gave those values (train.py's are ``--data`` and the config's ``n_vocab`` and ``tokenizer_path``).
    A file that cannot be read or decoded is an error naming it, or with ``skip_bad_files`` is left out (a warning
    line each, counted in the summary); every file bad is an error still."""
    from data.eval_split import Draws
    from data.prepare import build_once
    from data.text_files import expand_inputs
    from data.tokenizer import ByteTokenizer, check_bpe_size, load_tokenizer
    from neomesh.paths import work_root

    say = say or (lambda message: print(message, flush=True))
    check_settings(eval_fraction, n_ctx, min_frequency, workers)
    if tokenizer is None:
        check_bpe_size(vocab_size, special_tokens, vocab_flag)
    files = expand_inputs(inputs, input_flag)
    reused = load_tokenizer(tokenizer, tokenizer_flag) if tokenizer else None
    if reused is not None and not isinstance(reused, ByteTokenizer) and not hasattr(reused, "tok"):
        # the prepared folder records its tokenizer as a tokenizer.json or "bytes": a SentencePiece model would
        # be written down as "bytes", and the run would read its ids as bytes
        raise ConfigError(f"{tokenizer_flag} {tokenizer}: a {type(reused).__name__} cannot prepare text here; give "
                          "a tokenizer.json (transformers' tokenizer.save_pretrained writes one) or the byte tokenizer")
    cache = os.path.join(work_root(), "data_cache")
    try:
        check_output_dir(output_dir, cache)
        unwritable = None
    except Unwritable as e:  # a copy prepared there before is still read (a read-only or shared cache)
        unwritable = e
    trained = {"vocab_size": vocab_size, "min_frequency": min_frequency}
    if special_tokens:  # only then: the folders of earlier datasets keep their names
        trained["special_tokens"] = list(special_tokens)
    settings = {"eval_fraction": eval_fraction, "eval_split": EVAL_SPLIT, "chunk_size": n_ctx + 1,
                "tokenizer": ("bytes" if not hasattr(reused, "tok") else reused.tok.to_str()) if reused else trained}
    size = sum(os.path.getsize(f) for f in files if f != "embedded")
    if not size and "embedded" not in files:
        raise ConfigError(f"{input_flag} {' '.join(inputs)}: no text to train on")
    if size > 64 << 20:
        say(f"data: hashing {human_bytes(size)} of input to find a prepared copy")
    key = content_key(files, settings)[:8]
    name = dataset_name(inputs)
    target = output_dir or os.path.join(cache, f"{name}-{key}")

    def finished() -> bool:  # an explicit --output-dir may hold another dataset: rebuilt
        return manifest(target).get("key") == key

    if not finished() and output_dir is None:
        twin = trained_twin(cache, name, files, {**settings, "tokenizer": trained}, reused)
        target, key = twin or (target, key)
    if finished():
        skipped = check_skipped(target, skip_bad_files, say)
        say(f"data: reusing {_shown(target)} (prepared from the same files and settings{skipped})")
        return target
    if unwritable is not None:
        raise unwritable

    def build(directory: str) -> None:
        os.makedirs(directory)
        draws = Draws(eval_fraction)
        counts, skipped = count_documents(files, skip_bad_files, say, draws)
        if not counts:
            raise ConfigError(f"{input_flag} {' '.join(inputs)}: every file is bad ({len(skipped)} skipped); the "
                              f"first: {skipped[0]['error']}")
        if not draws.count:
            raise ConfigError(f"{input_flag} {' '.join(inputs)}: no text to train on" +
                              (f" ({len(skipped)} bad file{'s' * (len(skipped) != 1)} skipped)" if skipped else ""))
        textless = sum(1 for _, n in counts if not n)
        notes = [f"{len(skipped)} bad, skipped" if skipped else "", f"{textless} with no text" if textless else ""]
        notes = "; ".join(n for n in notes if n)
        used = sum(os.path.getsize(path) for path, _ in counts if path != "embedded")
        say(f"data: {len(files)} files{f' ({notes})' if notes else ''}, {draws.count:,} documents, "
            f"{human_bytes(used)}; eval: {draws.described()}")
        read, split = [path for path, _ in counts], draws.split()[0]
        tok = reused
        if tok is None:
            from data.tokenizer import train_bpe
            say(f"data: training a {vocab_size:,}-token byte-level BPE on the train documents")
            tok = train_bpe(documents(read, "train", split), vocab_size, min_frequency, special_tokens)
            if tok.vocab_size < vocab_size:
                from data.tokenizer import short_of
                say(f"data: note: {short_of(tok.vocab_size, vocab_size, vocab_flag, min_frequency)}")
        tokenizer_file = "tokenizer.json" if hasattr(tok, "save") else "bytes"
        if hasattr(tok, "save"):
            tok.save(os.path.join(directory, tokenizer_file))
        # Start-up (a process imports TensorFlow) costs seconds: small inputs are written by this process alone.
        processes = workers or (os.cpu_count() or 1 if size > SMALL_INPUT else 1)
        dataset, totals = write_splits(directory, read, split, tok, tokenizer_file, n_ctx + 1, processes, say)
        if not totals["train"]["tokens"]:
            raise ConfigError(f"{input_flag} {' '.join(inputs)}: no text to train on")
        with open(os.path.join(directory, "dataset.json"), "w") as f:
            json.dump(dataset, f, indent=2)
        with open(os.path.join(directory, "DONE"), "w") as f:
            json.dump({"format": FORMAT, "key": key, "inputs": inputs, "files": len(files), "settings":
                       {k: v for k, v in settings.items() if k != "tokenizer"}, "totals": totals,
                       "skipped": skipped}, f, indent=1)
        parts = [f"{split} {t['tokens']:,} tokens ({t['documents']:,} document{'s' * (t['documents'] != 1)})"
                 for split, t in totals.items()]
        skipped_note = f", {len(skipped)} bad file{'s' * (len(skipped) != 1)} skipped" if skipped else ""
        say(f"data: {', '.join(parts)}, {totals['train']['bytes'] / max(totals['train']['tokens'], 1):.2f} "
            f"bytes/token{skipped_note}")

    if not build_once(target, build, f"data: first use: preparing {_shown(target)} (later runs with the same "
                                     "files reuse it)", done=finished):
        check_skipped(target, skip_bad_files, say)  # another process built it while this one waited
    return target


def trained_twin(cache: str, name: str, files: list[str], settings: dict, reused) -> tuple[str, str] | None:
    """``(folder, key)`` of ``files`` prepared with a BPE trained on them (``settings`` name its training) that
    is the ``reused`` tokenizer itself, else None: a run going on with its own text and its own tokenizer
    (train.py --data) reads the copy its first run prepared, not the same ids again under a new name."""
    from data.tokenizer import load_tokenizer, tokenizer_hash

    if not hasattr(reused, "tok"):
        return None
    key = content_key(files, settings)[:8]
    folder = os.path.join(cache, f"{name}-{key}")
    tokenizer = os.path.join(folder, "tokenizer.json")
    if manifest(folder).get("key") != key or not os.path.isfile(tokenizer):
        return None
    return (folder, key) if tokenizer_hash(load_tokenizer(tokenizer)) == tokenizer_hash(reused) else None


def check_settings(eval_fraction: float, n_ctx: int, min_frequency: int, workers: int) -> None:
    """The numbers in range, or a one-line error naming the flag (n_ctx 0 would write a record per token)."""

    if not 0 <= eval_fraction < 1:
        raise ConfigError(f"--eval-fraction: {eval_fraction} is not in [0, 1)")
    for flag, value, least in (("--n-ctx", n_ctx, 1), ("--min-frequency", min_frequency, 0),
                               ("--workers", workers, 0)):
        if value < least:
            raise ConfigError(f"{flag}: {value} must be {'positive' if least else 'zero or more'}")


def manifest(folder: str) -> dict:
    """The ``DONE`` file of a dataset folder this module wrote ({} when there is none)."""
    try:
        with open(os.path.join(folder, "DONE")) as f:
            done = json.load(f)
    except (OSError, json.JSONDecodeError):
        return {}
    return done if isinstance(done, dict) else {}


def check_output_dir(output_dir: str | None, cache: str) -> None:
    """Refuses, before any work, an ``--output-dir`` that cannot be written, or that holds files this module did
    not write (publishing replaces the folder); without one, the ``cache`` folder must be writable."""

    if output_dir is None:
        writable_folder(cache, "")
        return
    where = f"--output-dir {output_dir}"
    if os.path.exists(output_dir):
        if not os.path.isdir(output_dir):
            raise ConfigError(f"{where}: a file, not a folder")
        if os.listdir(output_dir) and manifest(output_dir).get("format") != FORMAT:
            raise ConfigError(f"{where}: holds files data/make_dataset.py did not write, which the dataset would "
                              "replace; choose a new or empty folder")
    writable_folder(os.path.dirname(os.path.abspath(output_dir)), where)


class Unwritable(ConfigError):
    """A folder data would be prepared in cannot be written."""


def writable_folder(folder: str, where: str) -> None:
    """Creates ``folder`` if needed and writes a file there (the lock and the staging folder go there); a
    one-line error naming ``where`` (the flag) and the folder otherwise."""
    import tempfile

    try:
        os.makedirs(folder, exist_ok=True)
        handle, probe = tempfile.mkstemp(dir=folder, prefix=".write-test-")
        os.close(handle)
        os.remove(probe)
    except OSError as e:
        blocker, why = folder, e.strerror or str(e)
        while not os.path.exists(blocker) and os.path.dirname(blocker) != blocker:
            blocker = os.path.dirname(blocker)
        if os.path.exists(blocker) and not os.path.isdir(blocker):  # makedirs says only "File exists"
            folder, why = blocker, "a file, not a folder"
        raise Unwritable(f"{where + ': ' if where else ''}cannot write in {folder} ({why})") from None


def _shown(path: str) -> str:
    """``path`` relative to the current directory when it is inside it."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def config_for_data(cfg, inputs: list[str], skip_bad_files: bool = False, tokenizer: str | None = None):
    """``cfg`` training on ``inputs`` (train.py --data): a folder this module wrote (or its dataset.json), or text
    files, prepared here once (cached by content) with a tokenizer of ``n_vocab`` tokens (or the config's
    ``tokenizer_path``) and a 5% eval split. The run directory becomes ``runs/<data folder name>``; with no eval
    split, ``eval_steps`` becomes 0. A task that plain text cannot feed is refused before anything is prepared.
    ``skip_bad_files`` (--skip-bad-files) leaves out text files that cannot be read or decoded, as make_dataset,
    or an image folder's unreadable images. ``tokenizer`` prepares the text instead of ``tokenizer_path`` (a run
    going on reads new text with its own: training/run_tokenizer.py).
    For task image_classification a folder of class folders is named in ``datasets`` as it is (data/images.py)."""

    dataset_file = given_dataset_file(inputs)
    dataset = read_given_dataset(dataset_file) if dataset_file else None
    if cfg.task == "image_classification" and dataset_file is None and len(inputs) == 1:
        from data.image_folder import looks_like_one, meant_folder, skipping_dataset_config

        if not os.path.exists(inputs[0]):
            raise ConfigError(f"--data {inputs[0]}: no such folder{meant_folder(inputs[0])}")
        if looks_like_one(inputs[0]):  # read as it is, by data/images.py: nothing to prepare
            folder = os.path.abspath(inputs[0])
            # unreadable images left out: the folder named in a dataset config that says so
            source = skipping_dataset_config(folder) if skip_bad_files else folder
            return cfg.replace(datasets=[[source, None, None, None]],
                               model_path=os.path.join("runs", os.path.basename(folder)))
    refusal = text_cannot_feed(cfg)
    if refusal and (dataset is None or names_token_records(dataset)):
        raise ConfigError(f"--data: {refusal}")
    if dataset_file is None:
        reader = cfg.replace(tokenizer_path=tokenizer or cfg.tokenizer_path)
        check_reused_tokenizer(reader)
        folder = make_dataset(inputs, vocab_size=cfg.n_vocab, tokenizer=reader.tokenizer_path, n_ctx=cfg.n_ctx,
                              special_tokens=objective_tokens(cfg), input_flag="--data", vocab_flag="n_vocab",
                              tokenizer_flag="tokenizer_path", skip_bad_files=skip_bad_files)
        dataset_file = os.path.join(folder, "dataset.json")
        dataset = read_given_dataset(dataset_file)
    run = os.path.basename(os.path.dirname(os.path.abspath(dataset_file)))
    changes = {"datasets": [[dataset_file, None, None, None]], "model_path": os.path.join("runs", run)}
    if "eval_path" not in dataset and cfg.task != "image_classification":  # an image folder holds out a fraction
        if cfg.eval_steps:
            print(f"note: {dataset_file} has no eval set (no eval_path: --eval-fraction 0); evaluation is skipped",
                  flush=True)
        changes["eval_steps"] = 0
    if dataset.get("n_vocab", 0) > cfg.n_vocab:  # the model's vocabulary must hold the data's tokenizer
        print(f"note: n_vocab {cfg.n_vocab} -> {dataset['n_vocab']}, the size of {dataset_file}'s tokenizer",
              flush=True)
        changes["n_vocab"] = dataset["n_vocab"]
    return cfg.replace(**changes)


def objective_tokens(cfg) -> list[str]:
    """The special tokens ``cfg``'s objective looks up in the tokenizer, which a BPE trained for it must hold:
    BERT's ``[MASK]`` (unless ``mlm_mask_token_id`` is set), T5's sentinels (as many as an example can need)."""
    from data.source import MASK_TOKENS
    from data.spans import SENTINEL, sentinel_count

    if cfg.mlm_training and cfg.mlm_mask_token_id is None:
        return [MASK_TOKENS[0]]
    if cfg.span_corruption:
        return [SENTINEL.format(i) for i in range(sentinel_count(cfg))]
    return []


def check_reused_tokenizer(cfg, where: str = "tokenizer_path") -> None:
    """Before preparing: a reused tokenizer (the config's ``tokenizer_path``, given by ``where``) has the special
    tokens the objective needs (one line otherwise); nothing to check without one, or for an objective without."""
    from data.source import with_mask_token
    from data.spans import sentinel_count, sentinel_ids
    from data.tokenizer import load_tokenizer

    if not cfg.tokenizer_path or not (cfg.mlm_training or cfg.span_corruption):
        return
    tokenizer = load_tokenizer(cfg.tokenizer_path, where)
    if cfg.mlm_training:
        with_mask_token(cfg, tokenizer)
    if cfg.span_corruption:  # n_vocab grows to the tokenizer's size (config_for_data)
        sentinel_ids(tokenizer, max(cfg.n_vocab, tokenizer.vocab_size), sentinel_count(cfg),
                     f"{where} {cfg.tokenizer_path}")


def config_to_prepare_for(path: str, tokenizer: str | None):
    """The config ``--config`` names, checked as ``train.py --data`` checks it: a task plain text can feed, and a
    reused ``tokenizer`` holding the objective's special tokens."""
    from config import load_config

    cfg = load_config(path)[0]
    refusal = text_cannot_feed(cfg)
    if refusal:
        raise ConfigError(f"--config {path}: {refusal}")
    check_reused_tokenizer(cfg.replace(tokenizer_path=tokenizer), "--tokenizer")
    return cfg


def given_dataset_file(inputs: list[str]) -> str | None:
    """The dataset config ``--data`` names (a ``.json`` file, or a folder holding ``dataset.json``), else None:
    the inputs are text to prepare."""
    first = inputs[0]
    if len(inputs) == 1 and first.endswith(".json") and os.path.isfile(first):
        return first
    if len(inputs) == 1 and os.path.isfile(os.path.join(first, "dataset.json")):
        return os.path.join(first, "dataset.json")
    return None


def read_given_dataset(dataset_file: str) -> dict:
    """The JSON object of the dataset config ``--data`` names; one line naming the file for anything else, and for a
    model config given there (as a dataset config is, a .json)."""
    from config import KNOWN_KEYS
    from data.source import DATASET_KEYS

    from neomesh.json_file import read_json

    dataset = read_json(dataset_file, f"--data {dataset_file}")
    if not isinstance(dataset, dict):
        raise ConfigError(f"--data {dataset_file}: a dataset config is a JSON object ({{\"path\": ...}}), not a "
                          f"{type(dataset).__name__}")
    if "path" not in dataset and set(dataset) & (set(KNOWN_KEYS) - DATASET_KEYS):
        raise ConfigError(f"--data {dataset_file}: a model config, not data; give it as --config {dataset_file}")
    return dataset


def names_token_records(dataset: dict) -> bool:
    """Whether a dataset config names TFRecords of tokens (as this module writes), not labelled examples."""
    path = dataset.get("path", "")
    return not isinstance(path, str) or path.endswith(".tfrecords")  # not a string: its reader says what is wrong


def text_cannot_feed(cfg) -> str | None:
    """Why plain text (documents cut into token windows) cannot train ``cfg``'s task, or None when it can:
    causal_lm, masked_lm through mlm_training, seq2seq through span_corruption."""
    if cfg.task == "sequence_classification":
        return ('plain text cannot feed task sequence_classification, which needs labelled jsonl ({"text": ..., '
                '"label": ...} per line) named by a dataset config in the config\'s datasets (README, Data: '
                "labelled data)")
    if cfg.task == "token_classification":
        return ('plain text cannot feed task token_classification, which needs labelled jsonl ({"tokens": [...], '
                '"labels": [...]} per line) named by a dataset config in the config\'s datasets (README, Model zoo: '
                "token classification)")
    if cfg.task == "question_answering":
        return ('plain text cannot feed task question_answering, which needs SQuAD-format jsonl ({"question": ..., '
                '"context": ..., "answers": {"text": [...], "answer_start": [...]}} per line) or tfds:squad named by a '
                "dataset config in the config's datasets (README, Model zoo: question answering)")
    if cfg.task == "image_classification":
        return ("plain text cannot feed task image_classification, which needs labelled images: a folder of class "
                "folders (--data my_images/ with my_images/CLASS/IMAGE), or digits or tfds:NAME such as tfds:mnist "
                "in the config's datasets")
    if cfg.task == "masked_lm" and not cfg.mlm_training:
        return "plain text feeds task masked_lm only with mlm_training true (--set mlm_training=true)"
    if cfg.task == "seq2seq" and not cfg.span_corruption:
        return ("plain text feeds task seq2seq only with span_corruption true (--set span_corruption=true); "
                '(input, target) pairs come from jsonl ({"inputs": ..., "targets": ...} per line) named by a dataset '
                "config in the config's datasets (README, Model zoo: T5)")
    return None


def main(argv=None) -> int:
    from neomesh.help import ArgumentParser, HelpFormatter

    p = ArgumentParser(description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
    p.add_argument("--input", nargs="+", required=True, metavar="PATH",
                   help=".txt / .jsonl / .jsonl.zst files, folders or globs (embedded: the corpus shipped with "
                   "Python)")
    p.add_argument("--output-dir", metavar="DIR", help="where to write (default: data_cache/NAME-HASH, found "
                   "again by content)")
    tokenizer = p.add_mutually_exclusive_group()
    tokenizer.add_argument("--vocab-size", type=int, metavar="N", help="tokens of the BPE to train, special tokens "
                           "included; the model's n_vocab (default: 8192, or --config's n_vocab)")
    tokenizer.add_argument("--tokenizer", metavar="PATH", help="reuse this tokenizer instead of training one: a "
                           "tokenizer.json, a folder with one or with GPT-2's vocab.json + merges.txt, or bytes")
    p.add_argument("--min-frequency", type=int, default=2, metavar="N", help="BPE: pairs seen fewer times are "
                   "not merged")
    p.add_argument("--eval-fraction", type=float, default=EVAL_FRACTION, metavar="F",
                   help="share of the documents held out for eval, each chosen by a hash of its text (0: none)")
    p.add_argument("--n-ctx", type=int, metavar="N", help="context length; records hold n_ctx + 1 tokens (default: "
                   "2048, or --config's n_ctx)")
    p.add_argument("--workers", type=int, default=0, metavar="N", help="processes writing TFRecords (0: one per "
                   "CPU)")
    p.add_argument("--config", metavar="FILE", help="prepare for this config (a path, or a shipped config by "
                   "name): its objective's special tokens ([MASK], T5's sentinels) go into the BPE")
    p.add_argument("--skip-bad-files", action="store_true", help="leave out input files that cannot be read or "
                   "decoded (not UTF-8, binary, corrupt or truncated .zst, bad JSON), each named in a warning line, "
                   "instead of stopping")
    args = p.parse_args(argv)
    try:
        cfg = config_to_prepare_for(args.config, args.tokenizer) if args.config else None
        vocab_size = (cfg.n_vocab if cfg else 8192) if args.vocab_size is None else args.vocab_size
        n_ctx = (cfg.n_ctx if cfg else 2048) if args.n_ctx is None else args.n_ctx
        folder = make_dataset(args.input, args.output_dir, vocab_size, args.tokenizer, args.eval_fraction, n_ctx,
                              args.min_frequency, args.workers, special_tokens=objective_tokens(cfg) if cfg else (),
                              skip_bad_files=args.skip_bad_files)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line, as every command says it (outputs are published whole)
        print("interrupted", file=sys.stderr)
        return 130
    except OSError as e:  # disk full, permissions, once writing began
        from neomesh.errors import one_line
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    config = shlex.quote(args.config) if args.config else "configs/quickstart.json"
    print(f"dataset config: {_shown(os.path.join(folder, 'dataset.json'))}; train on it with: python train.py "
          f"--config {config} --data {shlex.quote(_shown(folder))}")  # pasted into a shell: a path may hold spaces
    return 0


if __name__ == "__main__":
    sys.exit(main())
