"""Batches from tf.data shard streams, and the input position a checkpoint keeps so that a resumed run continues
where it stopped without re-reading what came before.

Exact resume without replay: the choice. TensorFlow 2.21 offers three ways to reach batch N of a stream:

* ``skip(N)``: re-reads (and re-tokenizes, re-packs) everything before N: O(N). The fallback, used only when
  no saved position fits (see ``restore``).
* Random access: ``tf.data.Dataset.load`` / ``from_tensor_slices`` / ``range`` with the (still private)
  global shuffle and ``tf.random.experimental.index_shuffle``. Only element-indexable datasets qualify; the
  TFRecord reader, the packing ``scan`` and the shuffle buffers that make our sampling modes do not, so it would
  mean a different data format and different sampling semantics.
* Iterator checkpoints: every stage we use (parallel interleave, ``scan``, seeded ``shuffle`` with its buffer,
  ``Dataset.random``, ``sample_from_datasets``, ``batch``, ``prefetch``, the MLM stage, TFDS readers) serializes
  its state. ``NumpyIterator.save()`` gives it as one string and ``restore()`` puts it back (the same format,
  written and read in one ``tf.function`` each: ``data/iterator_state.py``): O(1) reading,
  bit-identical, the shuffle buffers included (which is also what makes it large: a shard's state holds its
  buffered documents and windows, tens of MB at n_ctx 2048 with 1,000-element buffers).

We take iterator checkpoints, one per shard (``data/shards.py``), written as the ``data`` item of the orbax
checkpoint at the same step (``training/input_checkpoint.py``). Shard states do not depend on the process count,
so a run resumes bit-identically on any number of processes. Where no saved position fits (a checkpoint from
before, the embedded in-memory source which needs none, a changed batch size, ``data_shards``, dataset or
files, or a TensorFlow that rejects the saved state) ``restore`` says so in one line and the stream is replayed.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from data import iterator_state
from data.shards import shard_bounds, shards_for_rows
from data.tokenizer import Tokenizer

STATE_FORMAT = "neomesh-input/1"
# A shard's iterator replayed to batch N skips N in its graph, and TensorFlow restores a state only into the graph
# it came from: such a state is saved behind this line with N, and restored into a stream built to skip N again.
_SKIPPED = b"neomesh-skipped "


def _concat(blocks: list):
    """Row blocks (arrays, or dicts of arrays after the MLM stage) joined along the batch dimension."""
    if isinstance(blocks[0], dict):
        return {key: np.concatenate([b[key] for b in blocks]) for key in blocks[0]}
    return np.concatenate(blocks)


def _rows(batch, start: int, stop: int):
    if isinstance(batch, dict):
        return {key: value[start:stop] for key, value in batch.items()}
    return batch[start:stop]


class _Reader:
    """The shard iterators of one batch size, standing at global batch ``next``."""

    def __init__(self, batch_size: int, shards: int):
        self.bounds = shard_bounds(batch_size, shards)
        self.iterators: dict[int, object] = {}
        self.skipped: dict[int, int] = {}  # the batches each shard's stream skips in its graph (a replay's)
        self.next = 0


class TFDataSource:
    """Global batches made of shard blocks (``data/shards.py``); batch ``step`` is a pure function of the config.

    Reading forward is the fast path. Another step (a repeated evaluation, a resume without a saved position)
    rebuilds the shard iterators and skips to it, which reads but does not use what it skips; ``replayed``
    counts the shard blocks skipped that way (one per shard and batch)."""

    def __init__(self, build_shard: Callable, shards: int, files: list[str], tokenizer: Tokenizer,
                 bytes_per_token: float | None, description: str, memoize: bool, fingerprint: str):
        self._build_shard, self.shards, self.files, self.tokenizer = build_shard, shards, files, tokenizer
        self._bytes_per_token, self.description, self._memoize = bytes_per_token, description, memoize
        self.fingerprint = fingerprint
        self._readers: dict[int, _Reader] = {}
        self._memo: dict = {}
        self.replayed = 0

    def _open(self, reader: _Reader, shard: int, step: int, state: bytes | None = None):
        block = reader.bounds[shard + 1] - reader.bounds[shard]
        skipped = step
        if state:
            skipped = 0
            if state.startswith(_SKIPPED):
                line, _, state = state.partition(b"\n")
                skipped = int(line[len(_SKIPPED):])
        iterator = self._build_shard(shard, block, skipped).as_numpy_iterator()
        if state:
            iterator_state.restore(iterator, state)
        else:
            self.replayed += step
        reader.iterators[shard], reader.skipped[shard] = iterator, skipped

    def batch(self, step: int, batch_size: int, rows: slice | None = None):
        """Rows ``rows`` (default all) of global batch ``step``: (rows, n_ctx+1) int32 tokens (with
        ``mlm_training``, a dict of (rows, n_ctx) ``inputs``/``targets``/``mask`` arrays)."""
        from data.tf_import import tensorflow
        from data.tfrecords import DataError, diagnose
        tf = tensorflow()
        rows = rows or slice(0, batch_size)
        key = (step, batch_size, rows.start, rows.stop)
        if self._memoize and key in self._memo:
            return self._memo[key]
        reader = self._readers.setdefault(batch_size, _Reader(batch_size, self.shards))
        needed = shards_for_rows(reader.bounds, rows)
        if step != reader.next:
            reader.iterators = {}
        for shard in set(reader.iterators) - set(needed):
            del reader.iterators[shard]
        blocks = []
        for shard in needed:
            if shard not in reader.iterators:
                self._open(reader, shard, step)
            try:
                blocks.append(next(reader.iterators[shard]))
            except tf.errors.OpError as e:
                raise diagnose(self.files, e) from None
            except StopIteration:
                raise DataError(f"data_shards: shard {shard} of {self.shards} holds no data (a shard reads every "
                                f"{self.shards}-th file, or every {self.shards}-th record of each file when there are "
                                "fewer files than shards); lower data_shards") from None
        reader.next = step + 1
        offset = reader.bounds[needed[0]]
        out = _rows(_concat(blocks), (rows.start or 0) - offset, rows.stop - offset)
        if self._memoize:
            self._memo[key] = out
        return out

    def state(self, batch_size: int) -> dict | None:
        """The input position after the last batch of ``batch_size`` read: ``{"meta": {...}, "shards": {k: bytes}}``
        with the iterator state of every shard this process reads (None before the first batch)."""
        reader = self._readers.get(batch_size)
        if reader is None or not reader.iterators:
            return None
        meta = {"format": STATE_FORMAT, "step": reader.next, "batch_size": batch_size, "shards": self.shards,
                "fingerprint": self.fingerprint}
        return {"meta": meta, "shards": {k: (b"%s%d\n" % (_SKIPPED, reader.skipped[k]) if reader.skipped[k] else b"")
                                         + iterator_state.save(it) for k, it in sorted(reader.iterators.items())}}

    def restore(self, step: int, batch_size: int, rows: slice, saved) -> str:
        """Positions the stream at global batch ``step`` for this process's ``rows`` from ``saved`` (an object with
        ``meta`` and ``read(shard) -> bytes | None``, or None); returns one line saying what happened (none at step
        0). Where no saved position fits, the stream is replayed from its start on the first batch."""
        from data.tf_import import tensorflow
        tf = tensorflow()
        if saved is None:
            if step == 0:  # an imported run's checkpoint (python -m convert import): nothing read yet, none to replay
                return ""
            return (f"note: checkpoint {step} holds no readable input position; the input stream is replayed up to "
                    f"step {step}")
        meta = saved.meta
        expected = {"format": STATE_FORMAT, "step": step, "batch_size": batch_size, "shards": self.shards,
                    "fingerprint": self.fingerprint}
        changed = next((k for k in expected if meta.get(k) != expected[k]), None)
        if changed:
            why = {"format": f"it is in format {meta.get('format')!r}, not {STATE_FORMAT!r}",
                   "step": f"it is the position of step {meta.get('step')}",
                   "batch_size": f"train_batch_size was {meta.get('batch_size')} there",
                   "shards": f"data_shards was {meta.get('shards')} there",
                   "fingerprint": "the datasets, their files or the data settings have changed since"}[changed]
            return (f"note: the input position saved at step {step} does not fit ({why}); the input stream is "
                    f"replayed up to step {step}")
        reader = _Reader(batch_size, self.shards)
        reader.next = step
        failed = []
        for shard in shards_for_rows(reader.bounds, rows):
            try:
                state = saved.read(shard)
                if not state:
                    raise ValueError("not saved")
                self._open(reader, shard, step, state)
            except (tf.errors.OpError, ValueError, OSError) as e:
                failed.append(f"shard {shard}: {str(e).strip().splitlines()[0][:120]}")
                self._open(reader, shard, step)
        self._readers[batch_size] = reader
        if failed:
            return (f"note: the input position of step {step} could not be restored for {'; '.join(failed)}; "
                    f"{'that shard is' if len(failed) == 1 else 'those shards are'} replayed up to step {step}")
        return f"input: continues at step {step} from the saved position ({len(reader.iterators)} shard(s); " \
               "nothing re-read)"

    @property
    def bytes_per_token(self) -> float:
        """From the TFRecord indexes when every file has one, else measured on the first batch."""
        if self._bytes_per_token is None:
            sample = self.batch(0, max(8, self.shards))
            # targets only: the shared first token is counted once (MLM's targets are the unmasked tokens)
            sample = sample["targets"] if isinstance(sample, dict) else sample[:, 1:]
            text = "".join(self.tokenizer.decode(row) for row in sample)
            self._bytes_per_token = len(text.encode("utf-8")) / sample.size
        return self._bytes_per_token
