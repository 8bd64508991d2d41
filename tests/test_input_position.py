"""The input position in checkpoints and per-process shards: a restored stream equals the uninterrupted one
(sampling modes, mixing, MLM, across epochs, through an orbax checkpoint) without re-reading what came before;
processes read disjoint files or records and assemble the one-process batches; a position saved by one process
count resumes on another."""

import re

import numpy as np
import pytest

from config import ConfigError
from data.source import make_source
from data.tf_import import tensorflow
from data.tfrecords import DataError
from tests.data_common import config, synthetic_docs, use_dataset_configs, write_tf_records

tf = tensorflow()  # as the data code imports it (quiet, without Keras)

N_CTX = 16
B = 8
LENGTHS = [3, 40, 7, 2, 25, 11, 60, 5, 1, 30, 9, 4, 18, 6, 2, 33]


@pytest.fixture
def datasets(tmp_path, monkeypatch):
    """Dataset 'a' in four files (a record per document), 'b' in one, 'one' a single file of chunks."""
    a, b = synthetic_docs(LENGTHS), synthetic_docs(LENGTHS[::-1], first=100)
    for i in range(4):
        write_tf_records(str(tmp_path / f"a_{i}.tfrecords"), a[i * 4:(i + 1) * 4])
    write_tf_records(str(tmp_path / "b_0.tfrecords"), b)
    stream = [t for d in a for t in d]
    write_tf_records(str(tmp_path / "one_0.tfrecords"), [stream[i:i + 9] for i in range(0, len(stream), 9)])
    common = {"tokenizer_path": "bytes", "shuffle_buffer": 8}
    use_dataset_configs(monkeypatch, tmp_path / "dc",
                        a={"path": str(tmp_path / "a_*.tfrecords"), "eval_path": str(tmp_path / "a_*.tfrecords"),
                           **common},
                        b={"path": str(tmp_path / "b_*.tfrecords"), **common},
                        one={"path": str(tmp_path / "one_*.tfrecords"),
                             "eval_path": str(tmp_path / "one_*.tfrecords"), **common})
    return a


class Reads:
    """Every record TensorFlow reads from a TFRecord file, as (label, file name): ``label`` is the value of
    ``self.label`` when the pipeline was built, so background reads of other sources are told apart."""

    def __init__(self):
        self.label, self.seen = None, []

    def of(self, label) -> list[str]:
        return [name for got, name in self.seen if got == label]


@pytest.fixture
def reads(monkeypatch):
    real, log = tf.data.TFRecordDataset, Reads()

    def counting(path, *args, **kwargs):
        label = log.label

        def record(p):
            log.seen.append((label, p.numpy().decode().rsplit("/", 1)[-1]))
            return p

        return real(path, *args, **kwargs).map(lambda r: (tf.py_function(record, [path], tf.string), r)[1])

    monkeypatch.setattr(tf.data, "TFRecordDataset", counting)
    return log


class Saved:
    """What ``Checkpoints.restore_input`` returns, built from a source's ``state()`` (of one or more processes)."""

    def __init__(self, *states):
        self.meta = states[0]["meta"]
        self.shards = {k: v for s in states for k, v in s["shards"].items()}

    def read(self, shard):
        return self.shards.get(shard)


CASES = {
    "chunks": dict(datasets=[["one", None, None, None]]),
    "documents_random+fixed mixed": dict(datasets=[["a", 1, "documents_random", 2.0],
                                                   ["b", 2, "documents_fixed", 1.0]]),
    "2 shards of files": dict(datasets=[["a", None, None, None]], data_shards=2),
    "2 shards of records, mixed": dict(datasets=[["one", None, None, 1.0], ["b", 1, "documents_fixed", 1.0]],
                                       data_shards=2),
    "mlm": dict(datasets=[["a", None, None, None]], n_vocab=200_000, mlm_training=True, mlm_mask_token_id=3,
                causal=False),
}


def equal(x, y) -> bool:
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
    return np.array_equal(x, y)


@pytest.mark.parametrize("case", CASES)
def test_restored_position_continues_the_uninterrupted_stream(datasets, case):
    cfg = config(**{"n_ctx": N_CTX, **CASES[case]})
    source = make_source(cfg, "train")
    saved, reference = {}, []
    for step in range(24):  # 'a' holds ~17 windows: 24 batches of 8 cross ~10 epochs
        if step in (3, 17):
            saved[step] = source.state(B)
        reference.append(source.batch(step, B))
    for step, state in saved.items():
        resumed = make_source(cfg, "train")
        assert resumed.restore(step, B, slice(0, B), Saved(state)).startswith(f"input: continues at step {step}")
        for s in range(step, 24):
            assert equal(resumed.batch(s, B), reference[s]), (case, step, s)
        assert resumed.replayed == 0


def test_restoring_reads_nothing_of_what_came_before(datasets, reads):
    cfg = config([["a", 2, "documents_fixed", None]], N_CTX)
    source = make_source(cfg, "train")
    for step in range(60):
        source.batch(step, B)
    state = source.state(B)
    expected = source.batch(60, B)
    reads.label = "restored"
    restored = make_source(cfg, "train")
    restored.restore(60, B, slice(0, B), Saved(state))
    assert equal(restored.batch(60, B), expected)
    reads.label = "replayed"
    replayed = make_source(cfg, "train")
    note = replayed.restore(60, B, slice(0, B), None)
    assert note.startswith("note: checkpoint 60 holds no readable input position")
    # An imported run's step-0 checkpoint holds none either: nothing to replay, nothing to say.
    assert make_source(cfg, "train").restore(0, B, slice(0, B), None) == ""
    assert equal(replayed.batch(60, B), expected)
    # 61 batches of 8 windows of at least 2 documents: the replay reads over 900 records; restoring reads what
    # the prefetch and parallel reads take ahead of one batch (a few dozen), whatever the step.
    assert (restored.replayed, replayed.replayed) == (0, 60)
    assert len(reads.of("replayed")) > 900 and len(reads.of("restored")) < 200, \
        (len(reads.of("restored")), len(reads.of("replayed")))


def test_processes_read_disjoint_files_and_assemble_the_one_process_batches(datasets, reads):
    cfg = config([["a", None, "documents_fixed", None]], N_CTX, data_shards=4)
    one = make_source(cfg, "train")
    whole = [one.batch(s, B) for s in range(6)]
    halves, states = [], []
    for p, rows in enumerate((slice(0, 4), slice(4, 8))):  # process p of 2 holds rows 4p..4p+3: shards 2p, 2p+1
        reads.label = p
        process = make_source(cfg, "train")
        halves.append([process.batch(s, B, rows) for s in range(4)])
        states.append(process.state(B))
    # Shard k reads every 4th file from file k.
    assert set(reads.of(0)) == {"a_0.tfrecords", "a_1.tfrecords"}
    assert set(reads.of(1)) == {"a_2.tfrecords", "a_3.tfrecords"}
    for s in range(4):
        assert equal(np.concatenate([halves[0][s], halves[1][s]]), whole[s])
    # The two processes' positions resume one process, and one process's position resumes the second half.
    resumed = make_source(cfg, "train")
    assert resumed.restore(4, B, slice(0, B), Saved(*states)).startswith("input: continues")
    assert equal(resumed.batch(4, B), whole[4]) and equal(resumed.batch(5, B), whole[5])
    state_one = one.state(B)  # at step 6
    second = make_source(cfg, "train")
    assert second.restore(6, B, slice(4, 8), Saved(state_one)).startswith("input: continues")
    assert equal(second.batch(6, B, slice(4, 8)), one.batch(6, B)[4:]) and second.replayed == 0


def test_fewer_files_than_shards_splits_the_records(datasets):
    cfg = config([["a", None, "documents_fixed", None]], N_CTX, data_shards=2)
    ordered = make_source(cfg.replace(datasets=[["one", None, None, None]]), "eval")  # unshuffled, 1 file
    assert make_source(cfg, "eval").description.endswith("2 shards")
    windows = np.concatenate([ordered.batch(s, B) for s in range(3)]).reshape(3, 2, 4, N_CTX + 1)
    stream = [t for d in datasets for t in d]
    records = [stream[i:i + 9] for i in range(0, len(stream), 9)]
    for shard in range(2):  # shard k packs records k, k+2, k+4, ... of the file
        mine = [t for r in records[shard::2] for t in r] * 2  # the eval stream repeats the file
        got = windows[:, shard].reshape(-1, N_CTX + 1)
        assert got.tolist() == [mine[i * N_CTX:i * N_CTX + N_CTX + 1] for i in range(len(got))]


def test_positions_that_do_not_fit_are_replayed_with_a_note(datasets):
    cfg = config([["a", None, None, None]], N_CTX, data_shards=2)
    source = make_source(cfg, "train")
    for step in range(5):  # the stream moves on: its position is step 5
        source.batch(step, B)
    state = source.state(B)
    changed = make_source(cfg.replace(data_shards=4), "train")
    note = changed.restore(5, B, slice(0, B), Saved(state))
    assert note == ("note: the input position saved at step 5 does not fit (data_shards was 2 there); the input "
                    "stream is replayed up to step 5")
    assert changed.batch(5, B).shape == (B, N_CTX + 1) and changed.replayed == 4 * 5  # 4 shards
    broken = make_source(cfg, "train")
    state["shards"][1] = b"not an iterator state"
    note = broken.restore(5, B, slice(0, B), Saved(state))
    assert note.startswith("note: the input position of step 5 could not be restored for shard 1: ")
    assert note.endswith("; that shard is replayed up to step 5")
    assert equal(broken.batch(5, B), source.batch(5, B)) and broken.replayed == 5  # shard 1 alone replayed
    moved = make_source(config([["a", None, None, None]], N_CTX, data_shards=2, seed=7), "train")
    assert "(the datasets, their files or the data settings have changed since)" in \
        moved.restore(6, B, slice(0, B), Saved(source.state(B)))  # source stands at step 6


def test_iterator_state_is_tensorflows_own_format_both_ways():
    """data/iterator_state.py writes and reads the bytes ``NumpyIterator.save()`` / ``restore()`` do."""
    from data import iterator_state

    def stream(prefetch):
        docs = tf.data.Dataset.range(200).map(lambda i: tf.range(i % 7 + 1))  # ragged documents, as a corpus's
        batches = docs.shuffle(64, seed=3).padded_batch(4)
        if prefetch:
            return batches.prefetch(2).as_numpy_iterator()
        options = tf.data.Options()  # no background thread at all: tf.data injects a prefetch by default
        options.experimental_optimization.apply_default_optimizations = False
        options.autotune.enabled = False
        return batches.with_options(options).as_numpy_iterator()

    def rest(iterator):
        return [x.tolist() for x in iterator]

    # Bytes compared without prefetch: a prefetch thread may fill its buffer between two saves.
    for prefetch in (False, True):
        iterator = stream(prefetch)
        for _ in range(5):
            next(iterator)
        ours = iterator_state.save(iterator)
        assert ours.count(b",") > 60  # one part per buffered document
        if not prefetch:
            assert ours == iterator.save().numpy()
        expected = rest(iterator)
        for put in (iterator_state.restore, lambda it, saved: it.restore(tf.constant(saved))):
            resumed = stream(prefetch)
            put(resumed, ours)
            assert rest(resumed) == expected


def test_the_in_memory_source_needs_no_position():
    source = make_source(config([["embedded", None, None, None]], n_vocab=257), "train")
    source.batch(3, B)
    assert source.state(B) is None and source.restore(4, B, slice(0, B), None) is None


def test_a_shard_without_data_is_an_error(datasets, tmp_path, monkeypatch):
    write_tf_records(str(tmp_path / "tiny_0.tfrecords"), synthetic_docs([40, 40, 40]))
    use_dataset_configs(monkeypatch, tmp_path / "dc2", tiny={"path": str(tmp_path / "tiny_*.tfrecords"),
                                                              "tokenizer_path": "bytes", "shuffle_buffer": 8})
    source = make_source(config([["tiny", None, None, None]], N_CTX, data_shards=4), "train")
    with pytest.raises(DataError, match=r"^data_shards: shard 3 of 4 holds no data"):
        source.batch(0, B)
    with pytest.raises(ConfigError, match="data_shards: 16 is more than train_batch_size 8"):
        config([["tiny", None, None, None]], N_CTX, data_shards=16)


def test_position_goes_through_an_orbax_checkpoint(datasets, tmp_path):
    import jax.numpy as jnp

    from training.checkpoint import Checkpoints

    cfg = config([["a", 1, "documents_random", None]], N_CTX, data_shards=2)
    source = make_source(cfg, "train")
    for step in range(3):
        source.batch(step, B)
    checkpoints = Checkpoints(str(tmp_path / "run"), keep=2)
    checkpoints.save(3, {"w": jnp.zeros(2)}, {"n_ctx": N_CTX}, data=source.state(B))
    checkpoints.save(4, {"w": jnp.zeros(2)}, {"n_ctx": N_CTX})  # a source with no position to save
    checkpoints.close()
    expected = [source.batch(s, B) for s in (3, 4)]
    reopened = Checkpoints(str(tmp_path / "run"), keep=2)
    saved = reopened.restore_input(3)
    assert saved.meta["step"] == 3 and saved.meta["shards"] == 2 and reopened.restore_input(4) is None
    resumed = make_source(cfg, "train")
    assert resumed.restore(3, B, slice(0, B), saved).startswith("input: continues at step 3")
    assert equal(resumed.batch(3, B), expected[0]) and equal(resumed.batch(4, B), expected[1])
    reopened.close()


def test_a_damaged_saved_position_is_named_and_its_shard_replayed_exactly(datasets, tmp_path, capfd):
    import jax.numpy as jnp

    from training.checkpoint import Checkpoints

    cfg = config([["a", None, None, None]], N_CTX, data_shards=2)
    source = make_source(cfg, "train")
    for step in range(3):
        source.batch(step, B)
    with Checkpoints(str(tmp_path / "run"), keep=2) as checkpoints:
        checkpoints.save(3, {"w": jnp.zeros(2)}, {"n_ctx": N_CTX}, data=source.state(B))
    expected = [source.batch(s, B) for s in (3, 4)]
    state_file = tmp_path / "run" / "checkpoints" / "3" / "data" / "shard_00000.state"
    damaged = bytearray(state_file.read_bytes())
    damaged[len(damaged) // 2] ^= 0x55
    for written, why in ((bytes(damaged), "its checksum does not match"),
                         (b"not an iterator state", "its checksum line is missing")):
        state_file.write_bytes(written)
        capfd.readouterr()
        with Checkpoints(str(tmp_path / "run"), keep=2) as reopened:
            resumed = make_source(cfg, "train")
            note = resumed.restore(3, B, slice(0, B), reopened.restore_input(3))
        assert note.startswith("note: the input position of step 3 could not be restored for shard 0: "
                               f"shard_00000.state is damaged ({why}") and \
            note.endswith("); that shard is replayed up to step 3"), note
        assert equal(resumed.batch(3, B), expected[0]) and equal(resumed.batch(4, B), expected[1])
        assert resumed.replayed == 3  # shard 0 alone, from its start
        assert "Graph execution error" not in capfd.readouterr().err  # TensorFlow never parsed the damaged bytes


def test_tfds_shards_and_position(tmp_path):
    from tests.data_common import prepare_tiny_tfds

    prepare_tiny_tfds(str(tmp_path), [f"document number {i}: " + "lorem ipsum " * i for i in range(20)])
    cfg = config([["tfds:neomesh_tiny_text", None, None, None]], 32, n_vocab=257, tfds_data_dir=str(tmp_path),
                 data_shards=2)
    source = make_source(cfg, "train")
    reference = [source.batch(s, 4) for s in range(6)]
    state = source.state(4)
    for s in range(6, 9):
        reference.append(source.batch(s, 4))
    resumed = make_source(cfg, "train")
    assert resumed.restore(6, 4, slice(0, 4), Saved(state)).startswith("input: continues")
    assert all(equal(resumed.batch(s, 4), reference[s]) for s in range(6, 9))
    half = make_source(cfg, "train")  # the second process: shard 1 only, the second half of the documents
    rows = np.concatenate([half.batch(s, 4, slice(2, 4)) for s in range(3)])
    numbers = {int(n) for row in rows for n in re.findall(rb"document number (\d+):", bytes(t for t in row if t < 256))}
    assert numbers and numbers <= set(range(8, 15)), numbers  # train = texts[:15]; even split 8 + 7


def test_a_multi_process_run_is_told_when_its_processes_read_shards_in_common():
    from types import SimpleNamespace

    from data.shards import reading_note

    assert reading_note(SimpleNamespace(shards=4), 2) is None and reading_note(SimpleNamespace(shards=1), 1) is None
    assert reading_note(SimpleNamespace(), 4) is None  # the in-memory source reads nothing
    assert reading_note(SimpleNamespace(shards=1), 2) == (
        "note: data_shards 1 is not a multiple of the 2 processes, so every process reads the whole input; a "
        "multiple of 2 (dividing train_batch_size) splits the reading")
    assert "processes read some shards in common" in reading_note(SimpleNamespace(shards=6), 4)


def test_a_position_saved_after_a_replay_restores_without_another(datasets):
    """A run resumed with a replay (its data changed, say) saves positions that a later resume restores: the
    replayed shard's iterator skipped in its graph, and its state is restored into the same graph."""
    cfg = config([["a", None, None, None]], N_CTX, data_shards=2)
    reference = make_source(cfg, "train")
    expected = [reference.batch(step, B) for step in range(9)]
    replayed = make_source(cfg, "train")
    assert replayed.restore(4, B, slice(0, B), None).startswith("note: checkpoint 4 holds no readable")
    for step in range(4, 6):
        assert equal(replayed.batch(step, B), expected[step])
    state = replayed.state(B)
    resumed = make_source(cfg, "train")
    note = resumed.restore(6, B, slice(0, B), Saved(state))
    assert note.startswith("input: continues at step 6"), note
    assert all(equal(resumed.batch(step, B), expected[step]) for step in range(6, 9)) and resumed.replayed == 0
