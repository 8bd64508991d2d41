"""tf.data graphs: documents from TFRecords (TFDS text is tokenized into TFRecords first, ``data/tfds_text.py``)
-> (n_ctx+1)-token windows by sampling mode -> weighted mix -> a shard's blocks of global batch rows
(``data/shards.py`` puts the shards' blocks together).

Every stage is deterministic for a given seed (seeded shuffles, ``deterministic=True`` parallel reads and maps,
``Dataset.random`` for random offsets), so the stream of batches is a pure function of the config: batch ``s`` is
the same in every run, on any number of processes. Epochs follow each other inside the stream (files and
documents reshuffled each epoch), so a run crosses epoch boundaries without a seam. Every stage can save its
state in a tf.data iterator checkpoint (``data/tf_source.py``), so a resumed run continues without re-reading.

Sampling modes (GPT-Neo's ``[id, stitch, sampling_mode, weight]``):

* ``chunks`` (or null): the documents' token stream (each ends with ``<|endoftext|>``) packed into windows of
  n_ctx+1 tokens that overlap by one, so every token is a target exactly once. ``stitch`` must be null.
* ``documents_fixed``: each window starts at a document: at least ``stitch`` (default 1) documents, and more
  while they are shorter than n_ctx+1 tokens, are joined and the first n_ctx+1 tokens taken.
* ``documents_random``: the same groups, and a window at a random offset inside each.

Short documents are joined with the next ones, never dropped or padded.

The functions the stages map are plain TensorFlow (no Python ``if``/``for`` over tensors), so they reach tf.data
``as_written``: AutoGraph's rewrite of them cost half a second of every shard pipeline's start.
"""

from __future__ import annotations

import math
import os

from config import ConfigError, closest

MODES = ("chunks", "documents_fixed", "documents_random")
READ_CYCLE = 4  # files read in parallel (GPT-Neo's cycle_length)


def as_written(tf, fn):
    """``fn`` for a tf.data stage, traced as written (not rewritten by AutoGraph: see the module docstring)."""
    return tf.autograph.experimental.do_not_convert(fn)


def check_mode(entry: list, where: str) -> tuple[str, int]:
    """``(mode, stitch)`` from a datasets entry; a stitch that would have no effect is an error, not ignored."""
    _, stitch, mode, _ = entry
    mode = mode or "chunks"
    if mode not in MODES:
        raise ConfigError(f"datasets: {where}: sampling_mode {mode!r} is not one of {', '.join(MODES)} (or null)")
    if mode == "chunks" and stitch not in (None, 0, 1):
        raise ConfigError(f"datasets: {where}: stitch {stitch} has no effect in sampling_mode 'chunks' (the whole "
                          "stream is packed); use 'documents_fixed' or 'documents_random', or set stitch to null")
    if stitch is not None and (not isinstance(stitch, int) or isinstance(stitch, bool) or stitch < 1):
        raise ConfigError(f"datasets: {where}: stitch {stitch!r} must be a positive integer or null")
    return mode, stitch or 1


def check_weight(entry: list, where: str) -> float:
    """A datasets entry's mixing weight (null: 1): a positive finite number. JSON's ``NaN`` and ``Infinity`` parse as
    numbers, and sample_from_datasets silently drew no window at all from a dataset of either weight."""
    weight = 1.0 if entry[3] is None else entry[3]
    if (not isinstance(weight, (int, float)) or isinstance(weight, bool) or not math.isfinite(weight)
            or weight <= 0):
        raise ConfigError(f"datasets: {where}: weight {weight!r} must be a positive number or null")
    return float(weight)


def tfrecord_documents(tf, files: list[str], *, n_vocab: int, shuffle: bool, seed: int, shuffle_buffer: int,
                       record_shard: tuple[int, int] | None = None):
    """Endless stream of int64[None] records (documents or chunks); token ids are checked against n_vocab.
    ``record_shard = (k, S)`` keeps only the records whose index in their file is k modulo S."""
    paths = tf.data.Dataset.from_tensor_slices(files)
    if shuffle:
        paths = paths.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)

    def read(path):
        records = tf.data.TFRecordDataset(path).enumerate()
        if record_shard is not None:
            k, count = record_shard
            records = records.filter(as_written(tf, lambda i, r: i % count == k))
        return records.map(as_written(tf, lambda i, r: (path, i, r)))

    records = paths.interleave(as_written(tf, read), cycle_length=min(READ_CYCLE, len(files)), block_length=1,
                               num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    # Repeated after reading, not before: an epoch reads every file once, and a shard without a single record
    # ends (repeat stops on an empty first pass) instead of cycling through its files forever.
    records = records.repeat()

    def parse(path, i, record):
        ids = tf.io.parse_single_example(record, {"text": tf.io.VarLenFeature(tf.int64)})["text"].values
        ok = tf.reduce_all((ids >= 0) & (ids < n_vocab))

        def fail():
            bad = tf.boolean_mask(ids, (ids < 0) | (ids >= n_vocab))[0]
            msg = tf.strings.join(["NEOMESH_BAD_TOKEN ", path, ": record ", tf.strings.as_string(i), ": token id ",
                                   tf.strings.as_string(bad), f" is outside [0, n_vocab={n_vocab}) END"])
            with tf.control_dependencies([tf.debugging.Assert(False, [msg])]):
                return tf.identity(ids)

        return tf.cond(ok, lambda: ids, fail)

    docs = records.map(as_written(tf, parse), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if shuffle:
        docs = docs.shuffle(shuffle_buffer, seed=seed + 1, reshuffle_each_iteration=True)
    return docs


def open_tfds(name: str, data_dir: str | None, split: str, text_key: str):
    """The TFDS builder of a dataset prepared in ``data_dir`` (read from its files; nothing is downloaded)."""
    from data.tf_import import tensorflow_datasets

    tfds = tensorflow_datasets()

    try:
        builder = tfds.builder(name, data_dir=data_dir)
        splits = builder.info.splits
        if not builder.is_prepared():
            raise FileNotFoundError(f"not prepared in {builder.data_dir}")
    except Exception as e:  # tfds raises many types; all mean "not here"
        where = data_dir or f"{os.path.expanduser(tfds.core.constants.DATA_DIR)}, TFDS's default"
        close = closest(name, prepared_tfds(data_dir or os.path.expanduser(tfds.core.constants.DATA_DIR)))
        raise ConfigError(f"datasets: tfds:{name}: not found in {where} ({str(e).splitlines()[0][:200]}); "
                          "nothing is downloaded: prepare it there first"
                          + ("" if data_dir else ", or set tfds_data_dir to where it is")
                          + (f"; did you mean 'tfds:{close}'?" if close else "")) from None
    if split not in splits:
        raise ConfigError(f"datasets: tfds:{name} has no split {split!r} (splits: {', '.join(splits)})")
    if text_key not in builder.info.features:
        raise ConfigError(f"datasets: tfds:{name} has no {text_key!r} feature "
                          f"(features: {', '.join(builder.info.features)})")
    return builder


def prepared_tfds(data_dir: str) -> list[str]:
    """The names (``NAME`` and ``NAME/CONFIG``) of the TFDS datasets in ``data_dir``'s folders
    (``NAME/[CONFIG/]VERSION/``), for naming the closest to a mistyped one."""
    def folders(path):
        return sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d))) if os.path.isdir(path) \
            else []

    names = []
    for name in folders(data_dir):
        if name != "downloads":
            names.append(name)
            names += [f"{name}/{sub}" for sub in folders(os.path.join(data_dir, name)) if not sub[:1].isdigit()]
    return names


def pack(tf, docs, n_ctx: int):
    """Token stream -> windows of n_ctx+1 tokens, consecutive windows sharing one token; nothing is dropped."""
    def step(carry, ids):
        buf = tf.concat([carry, ids], 0)
        n = tf.maximum((tf.size(buf, tf.int64) - 1) // n_ctx, 0)
        index = tf.range(n)[:, None] * n_ctx + tf.range(n_ctx + 1, dtype=tf.int64)[None, :]  # (n, n_ctx+1)
        return buf[n * n_ctx:], tf.gather(buf, index)

    return docs.scan(tf.zeros([0], tf.int64), as_written(tf, step)).unbatch()


def groups(tf, docs, n_ctx: int, stitch: int):
    """Documents joined until there are at least ``stitch`` of them and n_ctx+1 tokens: int64[>= n_ctx+1]."""
    def step(state, ids):
        buf, count = state
        buf, count = tf.concat([buf, ids], 0), count + 1
        ready = (count >= stitch) & (tf.size(buf) >= n_ctx + 1)
        empty = (tf.zeros([0], tf.int64), tf.constant(0, tf.int64))
        return tf.cond(ready, lambda: empty, lambda: (buf, count)), (ready, buf)

    def is_ready(ready, buf):
        return ready

    def tokens(ready, buf):
        return buf

    start = (tf.zeros([0], tf.int64), tf.constant(0, tf.int64))
    return docs.scan(start, as_written(tf, step)).filter(as_written(tf, is_ready)).map(as_written(tf, tokens))


def windows(tf, docs, n_ctx: int, mode: str, stitch: int, *, shuffle: bool, seed: int, shuffle_buffer: int):
    """One dataset entry's stream of int32[n_ctx+1] windows in its sampling mode."""
    if mode == "chunks":
        out = pack(tf, docs, n_ctx)
        if shuffle:  # neighbouring windows come from the same document
            out = out.shuffle(shuffle_buffer, seed=seed + 2, reshuffle_each_iteration=True)
    elif mode == "documents_fixed":
        out = groups(tf, docs, n_ctx, stitch).map(as_written(tf, lambda buf: buf[:n_ctx + 1]))
    else:
        offsets = tf.data.Dataset.random(seed=seed + 3)

        def sample(buf, r):
            start = tf.math.floormod(r, tf.size(buf, tf.int64) - n_ctx)  # any of the len - n_ctx starts
            return buf[start:start + n_ctx + 1]

        out = tf.data.Dataset.zip(groups(tf, docs, n_ctx, stitch), offsets).map(as_written(tf, sample))
    return out.map(as_written(tf, lambda w: tf.ensure_shape(tf.cast(w, tf.int32), [n_ctx + 1])))


def mix(tf, streams: list, weights: list[float], seed: int):
    """Weighted sampling between endless window streams (each window drawn from stream i with prob. w_i)."""
    if len(streams) == 1:
        return streams[0]
    return tf.data.Dataset.sample_from_datasets(streams, weights=weights, seed=seed + 4)


def shard_batches(tf, stream, block: int, start_batch: int = 0):
    """A shard's blocks of ``block`` consecutive windows, one per global batch, from ``start_batch`` on:
    int32 (block, n_ctx+1) (or a dict of such arrays after the MLM stage), prefetched."""
    out = stream.batch(block, drop_remainder=True)
    if start_batch:
        out = out.skip(start_batch)  # replay: the stream is deterministic, so skipping reaches the same position
    return out.with_options(stream_options(tf)).prefetch(tf.data.AUTOTUNE)


def stream_options(tf):
    """Deterministic, and without tf.data's autotuning model thread. Destroying an iterator wakes that thread
    through a cancellation callback, but the thread checks ``IsCancelled()``, which TensorFlow sets only after
    every callback ran, and can go back to sleep for the rest of its optimisation period, which doubles up to a
    minute: a finished run's process then waited that long in the iterator's destructor. Without the model,
    ``AUTOTUNE`` parallelism is min(16, cores) and the prefetch buffer keeps its own tuning; measured on 2 cores,
    reading is as fast (tens of 16 x 2,049-token batches a second, far more than training consumes)."""
    options = tf.data.Options()
    options.deterministic = True
    options.autotune.enabled = False
    return options
