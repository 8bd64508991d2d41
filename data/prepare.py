"""Data that prepares itself on first use: the quickstart's BPE tokenizer and TFRecords, built from the embedded
corpus into a cache directory in seconds and reused afterwards (and ``"prepare": "stdlib_docstrings"``, the
labelled example of data/docstrings.py).

A dataset config with ``"prepare": "embedded"`` names where its files go (``path``, ``eval_path``,
``tokenizer_path``), the ``vocab_size`` to train and any extra ``special_tokens`` (``[MASK]`` for masked LM).
Preparation runs under a file lock (several processes of a multi-host run, or parallel tests, may start together;
the lock file is removed when done) and publishes the directory with one atomic rename, so a half-written cache is
never read.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from typing import Callable, Iterator

from config import ConfigError
from neomesh.paths import remove_stale_staging

PREPARERS = ("embedded", "stdlib_docstrings", "code_tags", "reverse_words")  # data/docstrings.py, code_tags.py,
# reverse_words.py


def ensure_prepared(dataset: dict, where: str, n_ctx: int) -> None:
    """Builds the dataset's cache directory if it is missing (the directory of its ``tokenizer_path``)."""
    kind = dataset["prepare"]
    if kind not in PREPARERS:
        raise ConfigError(f"{where}: prepare {kind!r} is not one of {', '.join(PREPARERS)}")
    target = os.path.dirname(dataset["tokenizer_path"])
    if kind == "stdlib_docstrings":
        from data.docstrings import prepare_docstrings
        build_once(target, lambda build: prepare_docstrings(build, dataset, where, n_ctx),
                   f"{where}: first use, preparing {target} (labelled docstrings of the standard library and a "
                   f"{dataset.get('vocab_size')}-token BPE; later runs reuse it)")
        return
    if kind == "code_tags":
        from data.code_tags import prepare_code_tags
        build_once(target, lambda build: prepare_code_tags(build, dataset, where, n_ctx),
                   f"{where}: first use, preparing {target} (the standard library's tokens and their categories, "
                   f"a {dataset.get('vocab_size')}-token BPE; later runs reuse it)")
        return
    if kind == "reverse_words":
        from data.reverse_words import prepare_reverse_words
        build_once(target, lambda build: prepare_reverse_words(build, dataset, where, n_ctx),
                   f"{where}: first use, preparing {target} (word runs of the help topics and their reverses, a "
                   f"{dataset.get('vocab_size')}-token BPE; later runs reuse it)")
        return
    build_once(target, lambda build: prepare_embedded(build, dataset, where, n_ctx),
               f"{where}: first use, preparing {target} (a {dataset.get('vocab_size')}-token BPE and TFRecords from "
               "the embedded corpus; later runs reuse it)")


def build_once(target: str, build: Callable[[str], None], message: str = "",
               done: Callable[[], bool] | None = None) -> bool:
    """Runs ``build(directory)`` unless ``target`` is complete (``done()``; by default: it holds ``DONE``), then
    publishes the directory as ``target`` with one rename; ``build`` writes ``DONE`` last. Returns whether it
    built. Under a file lock (``target.lock``, removed when done): the first process builds, others wait and then
    find it done."""
    done = done or (lambda: os.path.exists(os.path.join(target, "DONE")))
    if done():
        return False
    if os.path.isdir(target) and os.listdir(target) and not os.path.exists(os.path.join(target, "DONE")):
        # builds are published whole, DONE included: a folder without one is someone else's
        raise ConfigError(f"{target}: exists and is not a prepared dataset (no DONE); not replacing it: move it, or "
                          "point the dataset config elsewhere")
    os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
    with held_lock(target + ".lock"):
        if done():
            return False
        if message:
            print(message, flush=True)
        began = time.perf_counter()
        staging = target + f".tmp-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        remove_stale_staging(target)  # a build killed midway (the lock's holder is the only builder)
        try:
            build(staging)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
        if message:
            shown = os.path.relpath(target)
            print(f"prepared {target if shown.startswith('..') else shown} in {time.perf_counter() - began:.1f} s",
                  flush=True)
    return True


@contextlib.contextmanager
def held_lock(path: str) -> Iterator[None]:
    """Holds an exclusive ``flock`` on the file ``path`` and removes the file on leaving, as training/run_lock.py
    does: removed before it is let go, so a process that waited on the removed file finds it gone and locks the
    file of that name anew (two processes never hold locks on different files of one name)."""
    while True:
        lock = open(path, "w")
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _same_file(lock, path):
            break
        lock.close()  # the holder removed it while this process waited
    try:
        yield
    finally:
        try:
            os.remove(path)
        except OSError:
            pass
        lock.close()


def _same_file(f, path: str) -> bool:
    try:
        return os.path.samestat(os.fstat(f.fileno()), os.stat(path))
    except FileNotFoundError:
        return False


def prepare_embedded(directory: str, dataset: dict, where: str, n_ctx: int) -> None:
    """Trains the BPE on the embedded corpus's train documents and writes train/eval TFRecords."""
    from data import corpus
    from data.create_tfrecords import write_file, write_index
    from data.tokenizer import train_bpe

    os.makedirs(directory)
    if "vocab_size" not in dataset:
        raise ConfigError(f"{where}: 'prepare' needs 'vocab_size' (tokens of the BPE to train)")
    docs = corpus.documents()
    train, held_out = corpus.split(docs, "train"), corpus.split(docs, "eval")
    tokenizer = train_bpe(train, dataset["vocab_size"], special_tokens=dataset.get("special_tokens", ()))
    tokenizer_file = os.path.basename(dataset["tokenizer_path"])
    tokenizer.save(os.path.join(directory, tokenizer_file))
    for split, texts, pattern in (("train", train, dataset["path"]), ("eval", held_out, dataset.get("eval_path"))):
        if pattern is None:
            continue
        name = os.path.basename(pattern).split("*")[0].rstrip("_") or split
        out = os.path.join(directory, f"{name}_00000.tfrecords")
        counts = write_file(texts, tokenizer, out, "chunks", n_ctx + 1)
        write_index(os.path.join(directory, f"{name}.index"), [counts], tokenizer, tokenizer_file, "chunks",
                    n_ctx + 1)
    with open(os.path.join(directory, "DONE"), "w") as f:
        f.write("prepared from the embedded corpus\n")
