"""Sequence regression (Hugging Face's num_labels 1, GLUE STS-B): float labels from jsonl and TFDS, the squared-error
objective, eval rows with mse and run_glue's pearson and spearmanr, and sharded training equal to one device."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from config import ConfigError
from data.source import make_source
from tests.common import tiny_config, train_metrics
from tests.data_common import prepare_tiny_glue, prepare_tiny_stsb, use_dataset_configs
from tests.test_labelled import classify, write_jsonl
from training.objectives import objective_for, report

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
    """Batches of random texts of varied lengths, float scores, and weight-0 filler in the last rows."""
    rng = np.random.default_rng(seed)
    out = []
    b, t = cfg.train_batch_size, cfg.n_ctx
    for _ in range(steps):
        lengths = rng.integers(3, t + 1, b)
        segment_ids = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
        out.append({"inputs": np.where(segment_ids, rng.integers(0, cfg.n_vocab, (b, t)), 0).astype(np.int32),
                    "segment_ids": segment_ids, "token_types": np.zeros((b, t), np.int32),
                    "labels": rng.uniform(0, 5, b).astype(np.float32),
                    "weights": (np.arange(b) < b - 2).astype(np.float32)})
    return out


def test_eval_row_is_mse_pearson_and_spearman_of_the_counted_rows():
    """The eval step keeps each row's score; the row holds their squared error's mean and run_glue's correlations
    over the rows that count (weight-0 filler left out), as scipy computes them."""
    from models import registry
    from parallel.layout import Layout
    from parallel.mesh import make_mesh
    from parallel.state import create_train_state
    from parallel.steps import batch_shapes, batch_shardings, make_eval_step, mean_of, objective_sums
    from training.optimizer import make_optimizer

    cfg = regression_config()
    objective = objective_for(cfg)
    layout = Layout.from_config(make_mesh("x:4", jax.devices()[:4]), "batch:x")
    graphdef, state, shardings = create_train_state(lambda rngs: registry.build(cfg, rngs), make_optimizer(cfg),
                                                    layout, cfg.seed)
    data = batch_shardings(layout, objective, batch_shapes(objective, cfg, cfg.train_batch_size))
    step = make_eval_step(graphdef, objective, layout, shardings.params, data)
    batches = regression_batches(cfg, 2)
    row = report(objective, mean_of([step(state.params, jax.device_put(b, data)) for b in batches]))
    assert set(row) == {"loss", "mse", "pearson", "spearmanr"}
    params = jax.device_get(state.params)
    predicted = [np.asarray(objective_sums(graphdef, objective, params, b, jnp.float32, keep_rows=True)[0]["score"])
                 for b in batches]
    counted = np.concatenate([b["weights"] for b in batches]) > 0
    got, want = np.concatenate(predicted)[counted], np.concatenate([b["labels"] for b in batches])[counted]
    assert len(got) == 12 and np.std(got) > 0
    np.testing.assert_allclose(row["mse"], np.mean((got - want) ** 2), rtol=1e-5)
    assert row["loss"] == row["mse"]
    np.testing.assert_allclose(row["pearson"], scipy.stats.pearsonr(got, want)[0], atol=1e-5)
    np.testing.assert_allclose(row["spearmanr"], scipy.stats.spearmanr(got, want)[0], atol=1e-5)


def test_regression_trains_sharded_as_on_one_device_and_accumulates_exactly():
    cfg = regression_config()
    batches = regression_batches(cfg, 1) * 3  # one batch again and again: the squared error must fall
    single = train_metrics(cfg, batches, "x:1", "batch:x", devices=jax.devices()[:1])
    sharded = train_metrics(cfg, batches, "x:4,y:2", "batch:x,heads:y,intermediate_expanded:y")
    accumulated = train_metrics(cfg, batches, "x:1", "batch:x", devices=jax.devices()[:1], microbatches=2)
    for key in ("loss", "grad_norm"):
        for run in (sharded, accumulated):
            np.testing.assert_allclose([m[key] for m in run], [m[key] for m in single], rtol=0, atol=1e-5)
    assert single[-1]["loss"] < single[0]["loss"]
    assert "score" not in single[0] and "label" not in single[0]  # per-row values stay out of the train row


def test_check_dataset_shows_a_regressions_scores(scores, capsys):
    """--check-dataset indexed label names by a float label (a TypeError): it prints the score instead."""
    from data.check import check_dataset

    check_dataset(regression_data(train_batch_size=2, eval_batch_size=2), batch_size=2)
    out = capsys.readouterr().out
    assert "labels are scores: mean 2.088, min 0.25, max 4.6" in out and "labels (2,) float32" in out
    assert "first example (label " in out
