"""The tf.data pipeline: sampling modes, stitch, mixing weights, seeds, per-process rows, exact resume across
epochs, TFDS by name, and the MLM stage."""

import glob

import numpy as np
import pytest

from config import ConfigError
from data.source import make_source
from data.tf_import import tensorflow
from tests.common import run_cli
from tests.data_common import (EOS, config, prepare_tiny_tfds, synthetic_docs, take, use_dataset_configs,
                               write_tf_records)

tf = tensorflow()  # as the data code imports it (quiet, without Keras)

N_CTX = 16
LENGTHS = [3, 40, 7, 2, 25, 11, 60, 5, 1, 30, 9, 4, 18, 6, 2, 33]  # many shorter than a window


@pytest.fixture
def datasets(tmp_path, monkeypatch):
    """Two TFRecord datasets in documents mode (a record per document) with disjoint token ids."""
    a, b = synthetic_docs(LENGTHS), synthetic_docs(LENGTHS[::-1], first=100)
    write_tf_records(str(tmp_path / "a_0.tfrecords"), a[:8])
    write_tf_records(str(tmp_path / "a_1.tfrecords"), a[8:])
    write_tf_records(str(tmp_path / "b_0.tfrecords"), b)
    use_dataset_configs(monkeypatch, tmp_path / "dc",
                        a={"path": str(tmp_path / "a_*.tfrecords"), "eval_path": str(tmp_path / "a_0.tfrecords"),
                           "tokenizer_path": "bytes", "shuffle_buffer": 8},
                        b={"path": str(tmp_path / "b_*.tfrecords"), "tokenizer_path": "bytes", "shuffle_buffer": 8})
    return {"a": a, "b": b}


def doc_of(token):
    return token // 1000 - 1


def check_contiguous(window, docs):
    """Each window is a slice of the documents joined: tokens count up inside a document, and the token after an
    end-of-text is the first token of a (whole) document."""
    for prev, cur in zip(window[:-1], window[1:]):
        if prev == EOS:
            assert cur % 1000 == 0, window
        else:
            assert cur == prev + 1 or (cur == EOS and prev % 1000 == len(docs[doc_of(prev) % 100]) - 2), window


def test_chunks_mode_packs_every_token_once(datasets):
    source = make_source(config([["a", None, None, None]], N_CTX), "eval")  # unshuffled: file order
    got = take(source, 2, batch_size=4)
    stream = [t for d in datasets["a"][:8] for t in d]  # 161 tokens: 10 windows, then the next epoch
    assert got.tolist() == [stream[i * N_CTX:i * N_CTX + N_CTX + 1] for i in range(8)]
    train = take(make_source(config([["a", None, None, None]], N_CTX), "train"), 6)
    for window in train:
        check_contiguous(window, datasets["a"])


def test_shard_streams_run_without_tf_datas_autotuning_thread(datasets):
    """Its wake-up on an iterator's destruction can be lost (data/pipeline.py stream_options): a finished run then
    waited up to a minute in the destructor."""
    for split in ("train", "eval"):
        options = make_source(config([["a", None, None, None]], N_CTX), split)._build_shard(0, 4, 0).options()
        assert options.deterministic and options.autotune.enabled is False, split


def reference_groups(docs, stitch, n_ctx, count):
    """The documents_fixed rule in plain Python: join documents (cycling through them) until there are at least
    ``stitch`` and n_ctx+1 tokens, take the first n_ctx+1."""
    out, buf, joined, i = [], [], 0, 0
    while len(out) < count:
        buf, joined, i = buf + docs[i % len(docs)], joined + 1, i + 1
        if joined >= stitch and len(buf) >= n_ctx + 1:
            out.append(buf[:n_ctx + 1])
            buf, joined = [], 0
    return out


@pytest.mark.parametrize("stitch", [1, 3])
def test_documents_fixed_joins_stitch_documents_and_drops_none(datasets, stitch):
    ordered = make_source(config([["a", stitch, "documents_fixed", None]], N_CTX), "eval")  # file order
    assert take(ordered, 3, batch_size=4).tolist() == reference_groups(datasets["a"][:8], stitch, N_CTX, 12)
    got = take(make_source(config([["a", stitch, "documents_fixed", None]], N_CTX), "train"), 12)  # (96, 17)
    assert (got % 1000 == 0)[:, 0].all()  # every window starts at a document
    for window in got:
        check_contiguous(window, datasets["a"])
    every_doc = {doc_of(t) for w in got for t in w if t != EOS and t % 1000 == 0}
    assert every_doc == set(range(len(LENGTHS)))  # short documents are joined, never dropped
    assert len({doc_of(t) for t in got[:, 0]}) > 4


def test_documents_random_takes_windows_at_random_offsets(datasets):
    source = make_source(config([["a", 2, "documents_random", None]], N_CTX), "train")
    got = take(source, 8)
    for window in got:
        check_contiguous(window, datasets["a"])
    offsets = got[:, 0] % 1000
    assert (offsets != 0).mean() > 0.5 and len(set(offsets.tolist())) > 10


def test_mixing_weights_give_the_proportions(datasets):
    source = make_source(config([["a", None, None, 3.0], ["b", 1, "documents_fixed", 1.0]], N_CTX), "train")
    got = take(source, 100, batch_size=16)  # 1600 windows
    from_b = (got[:, 0] >= 101_000) | ((got[:, 0] == EOS) & (got[:, 1] >= 101_000))
    assert abs(from_b.mean() - 0.25) < 0.04  # 4 binomial standard deviations
    assert ((got[~from_b] < 100_000) | (got[~from_b] == EOS)).all()  # windows never mix datasets


def test_seed_decides_the_order_and_rows_are_the_global_rows(datasets):
    def first(seed, rows=None):
        return make_source(config([["a", None, None, None]], N_CTX, seed=seed), "train").batch(2, 8, rows)

    whole = first(1)
    assert (first(1) == whole).all() and not (first(2) == whole).all()
    assert np.concatenate([first(1, slice(0, 4)), first(1, slice(4, 8))]).tolist() == whole.tolist()


@pytest.mark.parametrize("mode", ["chunks", "documents_random"])
def test_resume_anywhere_equals_no_resume_across_epochs(datasets, mode):
    cfg = config([["a", 1, mode, 2.0], ["b", 2, "documents_fixed", 1.0]] if mode != "chunks"
                 else [["a", None, None, None]], N_CTX)
    # a's 16 documents hold 270 tokens, about 17 windows: 24 steps of 8 windows cross ~10 epochs.
    source = make_source(cfg, "train")
    reference = [source.batch(s, 8) for s in range(24)]
    for start in (1, 5, 13, 23):
        resumed = make_source(cfg, "train")
        for s in range(start, 24):
            assert (resumed.batch(s, 8) == reference[s]).all(), (start, s)
    assert (source.batch(7, 8) == reference[7]).all()  # going back works too


def test_tfds_text_dataset_by_name(tmp_path):
    texts = [f"document number {i}: " + "lorem ipsum " * i for i in range(20)]

    prepare_tiny_tfds(str(tmp_path), texts)
    cfg = config([["tfds:neomesh_tiny_text", None, None, None]], 32, n_vocab=257, tfds_data_dir=str(tmp_path))
    source = make_source(cfg, "eval")  # the validation split, in order, with the byte tokenizer
    windows = take(source, 1, batch_size=4)  # (4, 33)
    stream = b"".join(t.encode() + b"\xff" for t in texts[15:])  # 0xff stands for <|endoftext|> (256)
    got = bytes(0xFF if t == 256 else t for t in np.concatenate([windows[:1, 0], windows[:, 1:].ravel()]))
    assert got == stream[:len(got)] and len(got) == 129
    tokenized = glob.glob(str(tmp_path / "**" / "neomesh_tokenized" / "validation-text-*" / "DONE"), recursive=True)
    assert len(tokenized) == 1  # tokenized once, beside the prepared dataset; no Python runs inside tf.data
    train = take(make_source(cfg, "train"), 2, batch_size=4)
    assert set(train.ravel().tolist()) <= set(range(257)) and (train == 256).any()  # EOS between documents
    # By name from the files alone, as a user runs it (this process has the builder class registered).
    result = run_cli("train.py", "--config", "configs/quickstart.json", "--check-dataset", "--set",
                     'datasets=[["tfds:neomesh_tiny_text", null, "documents_fixed", null]]', "--set",
                     f"tfds_data_dir={tmp_path}", "--set", "n_ctx=24", "--set", "train_batch_size=2")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "first text (" in result.stdout and "document number " in result.stdout
    with pytest.raises(ConfigError, match="tfds:no_such_dataset: not found"):
        make_source(config([["tfds:no_such_dataset", None, None, None]], 32, n_vocab=257,
                           tfds_data_dir=str(tmp_path)), "train")


def test_a_missing_tfds_dataset_names_the_directory_searched(tmp_path, monkeypatch):
    from data.tf_import import tensorflow_datasets

    monkeypatch.setattr(tensorflow_datasets().core.constants, "DATA_DIR", str(tmp_path / "default"))
    with pytest.raises(ConfigError, match=rf"^datasets: tfds:no_such_dataset: not found in {tmp_path}/default, "
                                          r"TFDS's default \(.*\); nothing is downloaded: prepare it there first, "
                                          r"or set tfds_data_dir to where it is$"):
        make_source(config([["tfds:no_such_dataset", None, None, None]], 32, n_vocab=257), "train")


def test_a_mistyped_tfds_name_suggests_the_closest_prepared_one(tmp_path):
    for folder in ("neomesh_tiny_text/1.0.0", "glue/mrpc/2.0.0", "downloads/extracted"):
        (tmp_path / folder).mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"prepare it there first; did you mean 'tfds:neomesh_tiny_text'\?$"):
        make_source(config([["tfds:neomesh_tiny_txt", None, None, None]], 32, n_vocab=257,
                           tfds_data_dir=str(tmp_path)), "train")
    with pytest.raises(ConfigError, match=r"did you mean 'tfds:glue/mrpc'\?$"):
        make_source(config([["tfds:glue/mrcp", None, None, None]], 32, n_vocab=257, tfds_data_dir=str(tmp_path)),
                    "train")


def test_mlm_stage_masks_with_the_configured_probabilities():
    from data.mlm import mlm_stage

    cfg = config([["a", None, None, None]], n_ctx=64, n_vocab=500, mlm_mask_prob=0.2, mlm_same_token_prob=0.1,
                 mlm_random_token_prob=0.2, mlm_mask_token_id=3, mlm_mask_ignore_ids=[7], mlm_cls_token_id=2,
                 mlm_random_token_ids=list(range(400, 500)))
    rng = np.random.default_rng(0)
    windows = rng.integers(5, 300, (400, 65)).astype(np.int32)
    windows[:, 10] = 7  # an ignored id
    ds = mlm_stage(tf, tf.data.Dataset.from_tensor_slices(windows), cfg, seed=5)
    out = [{k: v.numpy() for k, v in ex.items()} for ex in ds]
    inputs, targets, mask = (np.stack([o[k] for o in out]) for k in ("inputs", "targets", "mask"))
    assert (targets[:, 0] == 2).all() and (targets[:, 1:] == windows[:, :63]).all()  # CLS, then the tokens
    assert (inputs[:, 0] == 2).all() and not mask[:, 0].any() and not mask[:, 11].any()  # CLS, id 7 never masked
    selected = mask.astype(bool)
    assert abs(selected[:, 1:].mean() * 64 / 62 - 0.2) < 0.01
    assert (inputs[~selected] == targets[~selected]).all()
    chosen_in, chosen_t = inputs[selected], targets[selected]
    assert abs((chosen_in == 3).mean() - 0.7) < 0.03
    assert abs((chosen_in >= 400).mean() - 0.2) < 0.03  # random ids come from mlm_random_token_ids
    assert abs((chosen_in == chosen_t).mean() - 0.1) < 0.03
    again = [ex["inputs"].numpy() for ex in mlm_stage(tf, tf.data.Dataset.from_tensor_slices(windows), cfg, 5)]
    assert (np.stack(again) == inputs).all()  # stateless: the same masks every run
