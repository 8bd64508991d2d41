"""Sequence regression (Hugging Face's num_labels 1, GLUE STS-B): float labels from jsonl and TFDS, the squared-error
objective, eval rows with mse and run_glue's pearson and spearmanr, and sharded training equal to one device."""

import numpy as np
import pytest
import scipy.stats

from config import ConfigError
from data.source import make_source
from tests.common import assert_trains_sharded_as_one_device, eval_row_and_kept, text_batches, tiny_config
from tests.data_common import prepare_tiny_glue, prepare_tiny_stsb, use_dataset_configs
from tests.test_labelled import classify, write_jsonl

TRAIN = [{"text": "a cat sits", "text_pair": "a cat is sitting", "label": 4.6}, {"text": "a dog", "label": 0.25},
         {"text": "rain", "text_pair": "sun", "label": 1}, {"text": "x", "label": 2.5}]
EVAL = [{"text": "two men", "text_pair": "two people", "label": 3.8}, {"text": "no", "label": 0}]


def regression_data(num_labels=1, datasets="scores", **changes):
    return classify(datasets, num_labels, **changes)


@pytest.fixture
def scores(tmp_path, monkeypatch):
    body = {"path": write_jsonl(tmp_path / "train.jsonl", TRAIN),
            "eval_path": write_jsonl(tmp_path / "eval.jsonl", EVAL), "tokenizer_path": "bytes"}
    use_dataset_configs(monkeypatch, tmp_path / "dc", scores=body)
    return lambda rows=None, **more: use_dataset_configs(monkeypatch, tmp_path / "dc", scores={
        **body, **({"path": write_jsonl(tmp_path / "bad.jsonl", rows)} if rows else {}), **more})


def test_jsonl_scores_are_float_labels_integers_included(scores):
    train = make_source(regression_data(), "train")
    assert train.labels.dtype == np.float32 and sorted(train.labels.tolist()) == pytest.approx([0.25, 1.0, 2.5, 4.6])
    assert train.label_names is None and "labels are scores: mean 2.088, min 0.25, max 4.6" in train.description
    batch = make_source(regression_data(), "eval").batch(0, 4)
    assert batch["labels"].dtype == np.float32 and batch["labels"].tolist() == pytest.approx([3.8, 0.0, 3.8, 0.0])
    assert batch["weights"].tolist() == [1, 1, 0, 0]
    assert (batch["token_types"][0] == 1).any() and not (batch["token_types"][1] == 1).any()  # the pair's second text


@pytest.mark.parametrize("rows, more, message", [
    ([{"text": "a", "label": "pos"}], {},
     '{path}: line 1: label "pos" is not a number; num_labels 1 is regression (a score per text, as Hugging '
     "Face's num_labels 1), so every label is one"),
    ([{"text": "a", "label": 1.5}, {"text": "b", "label": None}], {},
     "{path}: line 2: label null is not a number; num_labels 1 is regression (a score per text, as Hugging Face's "
     "num_labels 1), so every label is one"),
    ([{"text": "a", "label": True}], {}, "{path}: line 1: label true is not a number;"),
    (None, {"labels": ["low", "high"]}, "{where}: labels names classes, and num_labels 1 is regression (a score per "
                                        "text); leave labels out, or set num_labels to their number"),
])
def test_bad_scores_are_one_line(scores, tmp_path, rows, more, message):
    scores(rows, **more)
    with pytest.raises(ConfigError) as e:
        make_source(regression_data(), "train")
    expected = message.format(path=tmp_path / "bad.jsonl", where="configs/dataset_configs/scores.json")
    assert str(e.value).startswith(expected) and "\n" not in str(e.value)


def test_float_labels_with_classes_point_at_num_labels_1(scores):
    with pytest.raises(ConfigError, match=r"train.jsonl: line 1: label 4.6 is neither an integer nor a string; a "
                                          r"number is a regression's score, for num_labels 1$"):
        make_source(regression_data(num_labels=3), "train")


def test_tfds_stsb_scores_by_name(tmp_path):
    data_dir = str(tmp_path / "tfds")
    pairs = [(f"sentence {i}", f"other {i}", i / 2) for i in range(11)]
    prepare_tiny_stsb(data_dir, pairs)
    cfg = regression_data(datasets="tfds:neomesh_tiny_glue/stsb", tfds_data_dir=data_dir)
    assert make_source(cfg, "train").labels.tolist() == [i / 2 for i in range(8)]
    assert make_source(cfg, "eval").labels.tolist() == [4.0, 4.5, 5.0]
    with pytest.raises(ConfigError) as e:  # a class count for a score: one line saying what the number is
        make_source(cfg.replace(num_labels=2), "train")
    assert str(e.value) == ("tfds:neomesh_tiny_glue/stsb: feature 'label' is not a class label (label_key); a number "
                            "is a regression's score (num_labels 1)")
    prepare_tiny_glue(data_dir, [(f"s {i}", f"t {i}", i % 2) for i in range(10)])
    with pytest.raises(ConfigError) as e:  # and classes for a regression
        make_source(cfg.replace(datasets=[["tfds:neomesh_tiny_glue/mrpc", None, None, None]]), "train")
    assert str(e.value) == ("tfds:neomesh_tiny_glue/mrpc: feature 'label' is not a number (label_key), as num_labels "
                            "1's regression reads, such as tfds:glue/stsb's label")


def regression_config(**changes):
    return tiny_config(model="bert", task="sequence_classification", num_labels=1, n_token_types=2,
                       warmup_steps=0, lr=3e-3, **changes)


def regression_batches(cfg, steps, seed=0):
    """Batches of random texts with float scores (tests.common.text_batches)."""
    return text_batches(cfg, steps, lambda rng, b: rng.uniform(0, 5, b).astype(np.float32), seed)


def test_eval_row_is_mse_pearson_and_spearman_of_the_counted_rows():
    """The eval step keeps each row's score; the row holds their squared error's mean and run_glue's correlations
    over the rows that count (weight-0 filler left out), as scipy computes them."""
    cfg = regression_config()
    row, got, want = eval_row_and_kept(cfg, regression_batches(cfg, 2), "score")
    assert set(row) == {"loss", "mse", "pearson", "spearmanr"}
    assert len(got) == 12 and np.std(got) > 0
    np.testing.assert_allclose(row["mse"], np.mean((got - want) ** 2), rtol=1e-5)
    assert row["loss"] == row["mse"]
    np.testing.assert_allclose(row["pearson"], scipy.stats.pearsonr(got, want)[0], atol=1e-5)
    np.testing.assert_allclose(row["spearmanr"], scipy.stats.spearmanr(got, want)[0], atol=1e-5)


def test_regression_trains_sharded_as_on_one_device_and_accumulates_exactly():
    cfg = regression_config()
    batches = regression_batches(cfg, 1) * 3  # one batch again and again: the squared error must fall
    single = assert_trains_sharded_as_one_device(cfg, batches)
    assert single[-1]["loss"] < single[0]["loss"]
    assert "score" not in single[0] and "label" not in single[0]  # per-row values stay out of the train row


def test_check_dataset_shows_a_regressions_scores(scores, capsys):
    """--check-dataset indexed label names by a float label (a TypeError): it prints the score instead."""
    from data.check import check_dataset

    check_dataset(regression_data(train_batch_size=2, eval_batch_size=2), batch_size=2)
    out = capsys.readouterr().out
    assert "labels are scores: mean 2.088, min 0.25, max 4.6" in out and "labels (2,) float32" in out
    assert "first example (label " in out
