"""Multi-label sequence classification (Hugging Face's problem_type multi_label_classification): jsonl lists of
labels as multi-hot rows, the mean binary cross-entropy objective, eval rows with micro/macro F1 and exact match,
and sharded training equal to one device."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from sklearn.metrics import accuracy_score, f1_score

from config import ConfigError
from data.source import make_source
from tests.common import assert_trains_sharded_as_one_device, eval_row_and_kept, text_batches, tiny_config
from tests.data_common import prepare_tiny_glue, use_dataset_configs
from tests.test_labelled import classify, write_jsonl
from training.objectives import objective_for

TRAIN = [{"text": "the match and the vote", "labels": ["sports", "politics"]}, {"text": "a goal", "labels": ["sports"]},
         {"text": "rain all day", "labels": []}, {"text": "new film", "labels": ["arts"]}]
EVAL = [{"text": "a vote on films", "labels": ["politics", "arts"]}, {"text": "quiet", "labels": []}]


def topics_data(num_labels=3, datasets="topics", **changes):
    return classify(datasets, num_labels, multi_label=True, **changes)


@pytest.fixture
def topics(tmp_path, monkeypatch):
    body = {"path": write_jsonl(tmp_path / "train.jsonl", TRAIN),
            "eval_path": write_jsonl(tmp_path / "eval.jsonl", EVAL), "tokenizer_path": "bytes"}
    use_dataset_configs(monkeypatch, tmp_path / "dc", topics=body)
    return lambda rows=None, **more: use_dataset_configs(monkeypatch, tmp_path / "dc", topics={
        **body, **({"path": write_jsonl(tmp_path / "bad.jsonl", rows)} if rows else {}), **more})


@pytest.mark.parametrize("changes, message", [
    ({"task": "token_classification"}, "multi_label: true gives a sequence classifier's texts several labels; task "
                                       "token_classification has none (set task sequence_classification, or "
                                       "multi_label false)"),
    ({"task": "sequence_classification", "num_labels": 1}, "multi_label: true needs 2 or more labels, num_labels is "
                                                           "1 (num_labels 1 without multi_label is regression)"),
])
def test_multi_label_needs_a_sequence_classifier_of_two_labels_or_more(changes, message):
    with pytest.raises(ConfigError) as e:
        tiny_config(model="bert", multi_label=True, **changes)
    assert str(e.value) == message


def test_label_lists_are_multi_hot_rows_named_from_the_train_split(topics):
    train = make_source(topics_data(), "train")
    assert train.label_names == ["arts", "politics", "sports"]  # sorted, as single labels' names are
    assert train.labels.dtype == np.float32 and train.labels.tolist() == [[0, 1, 1], [0, 0, 1], [0, 0, 0], [1, 0, 0]]
    assert train.description.endswith("per label: arts 1, politics 1, sports 2; with none: 1")
    batch = make_source(topics_data(), "eval").batch(0, 4)
    assert batch["labels"].tolist() == [[1, 1, 0], [0, 0, 0], [1, 1, 0], [0, 0, 0]]
    assert batch["weights"].tolist() == [1, 1, 0, 0]  # weight-0 filler past the last example


def test_label_lists_take_the_dataset_configs_order_ids_and_the_label_key(topics):
    topics(labels=["sports", "politics", "arts"])
    assert make_source(topics_data(), "train").labels.tolist()[0] == [1, 1, 0]
    topics([{"text": "a", "label": [2, 0]}, {"text": "b", "label": []}])  # ids, under "label"
    assert make_source(topics_data(), "train").labels.tolist() == [[1, 0, 1], [0, 0, 0]]


@pytest.mark.parametrize("rows, more, message", [
    ([{"text": "a", "labels": "sports"}], {}, '{path}: line 1: label "sports" is not a list; multi_label true reads '
                                              'each text\'s labels as one (["sports", "politics"], or [] where none '
                                              "applies)"),
    ([{"text": "a", "labels": ["x", ""]}], {}, "{path}: line 1: 'labels' is the empty label \"\" (label_key)"),
    ([{"text": "a", "labels": [0, 3]}], {}, "{path}: line 1: label 3 is outside 0..2 (num_labels 3)"),
    ([{"text": "a", "labels": [1, 0, 1]}], {}, "{path}: line 1: labels [1, 0, 1] repeat a label; multi_label true "
                                               "reads each text's labels as the names or ids that apply, not a 0/1 "
                                               "(multi-hot) row: give the ids of its 1s"),
    ([{"text": "a", "labels": ["x", 1]}], {}, "{path}: line 1: label 1 is not a string, as other train labels are"),
    ([{"text": "a", "labels": ["x", "y"]}], {}, "num_labels: 3, but {where} has 2 labels (x, y)"),
    (None, {"labels": ["arts", "sports", "weather"]}, "{eval}: line 1: label \"politics\" is not one of the labels"),
])
def test_bad_label_lists_are_one_line(topics, tmp_path, rows, more, message):
    topics(rows, **more)
    with pytest.raises(ConfigError) as e:
        make_source(topics_data(), "eval" if more else "train")
    expected = message.format(path=tmp_path / "bad.jsonl", where="configs/dataset_configs/topics.json",
                              eval=tmp_path / "eval.jsonl")
    assert str(e.value).startswith(expected) and "\n" not in str(e.value)


def test_a_list_without_multi_label_points_at_it(topics):
    with pytest.raises(ConfigError, match=r'train.jsonl: line 1: label \["sports", "politics"\] is neither an integer '
                                          r"nor a string; a list is a text's labels, for multi_label true$"):
        make_source(classify("topics", 3), "train")


def test_tfds_is_single_label(tmp_path):
    data_dir = str(tmp_path / "tfds")
    prepare_tiny_glue(data_dir, [(f"s {i}", f"t {i}", i % 2) for i in range(10)])
    with pytest.raises(ConfigError) as e:
        make_source(topics_data(2, "tfds:neomesh_tiny_glue/mrpc", tfds_data_dir=data_dir), "train")
    assert str(e.value) == ("tfds:neomesh_tiny_glue/mrpc: multi_label reads jsonl files, each text's labels a list; "
                            "a TFDS dataset's ClassLabel gives one label per text")


def multi_label_config(**changes):
    return tiny_config(model="bert", task="sequence_classification", num_labels=4, multi_label=True, n_token_types=2,
                       warmup_steps=0, lr=3e-3, **changes)


def multi_label_batches(cfg, steps, seed=0):
    """Batches of random texts with random multi-hot labels, some rows with none (tests.common.text_batches)."""
    return text_batches(cfg, steps, lambda rng, b: (rng.random((b, cfg.num_labels)) < 0.4).astype(np.float32), seed)


def test_loss_is_the_mean_binary_cross_entropy_of_each_row():
    """transformers' BCEWithLogitsLoss on the counted rows: log(1 + e^-x) for a label that applies, log(1 + e^x)
    for one that does not, averaged over the labels, then over the rows that count."""
    from models import registry
    from parallel.steps import objective_sums

    cfg = multi_label_config()
    model = registry.build(cfg, nnx.Rngs(0))
    batch = multi_label_batches(cfg, 1)[0]
    losses, metrics = objective_for(cfg)(model, batch)
    logits = np.asarray(model(batch["inputs"], segment_ids=batch["segment_ids"],
                              token_types=batch["token_types"])[0], np.float64)  # (B, C)
    y = batch["labels"]
    want = np.mean(y * np.log1p(np.exp(-logits)) + (1 - y) * np.log1p(np.exp(logits)), -1)
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    np.testing.assert_array_equal(metrics["predicted"], logits >= 0)
    np.testing.assert_array_equal(metrics["exact_match"], np.all((logits >= 0) == y, -1))
    graphdef, params = nnx.split(model, nnx.Param)
    sums = objective_sums(graphdef, objective_for(cfg), params, batch, jnp.float32)[0]
    np.testing.assert_allclose(sums["loss"] / sums["weight"], want[:-2].mean(), rtol=1e-5)


def test_eval_row_is_micro_and_macro_f1_and_exact_match_of_the_counted_rows():
    """The eval step keeps each row's predictions; the row holds scikit-learn's micro and macro F1 and subset
    accuracy over the rows that count (weight-0 filler left out), and the loss."""
    cfg = multi_label_config()
    row, got, want = eval_row_and_kept(cfg, multi_label_batches(cfg, 2), "predicted")
    assert set(row) == {"loss", "exact_match", "micro_f1", "macro_f1"}
    got, want = got.astype(int), want.astype(int)
    assert len(got) == 12 and 0 < got.sum() < got.size  # some labels predicted, not all
    assert row["micro_f1"] == pytest.approx(f1_score(want, got, average="micro", zero_division=0), abs=1e-6)
    assert row["macro_f1"] == pytest.approx(f1_score(want, got, average="macro", zero_division=0), abs=1e-6)
    assert row["exact_match"] == pytest.approx(accuracy_score(want, got), abs=1e-6)


def test_f1_of_a_label_never_true_nor_predicted_is_0_as_scikit_learns():
    from training.objectives import _multi_label_f1

    predicted, labels = np.array([[1, 0, 0], [0, 1, 0]]), np.array([[1, 0, 0], [1, 1, 0]])
    row = _multi_label_f1({"loss": 0.5}, {"predicted": predicted, "label": labels}, None)
    assert row == {"micro_f1": pytest.approx(f1_score(labels, predicted, average="micro")),
                   "macro_f1": pytest.approx(f1_score(labels, predicted, average="macro", zero_division=0))}
    nothing = {"predicted": np.zeros((0, 3)), "label": np.zeros((0, 3))}
    assert _multi_label_f1({"loss": 0.5}, nothing, None) == {"micro_f1": 0.0, "macro_f1": 0.0}


def test_multi_label_trains_sharded_as_on_one_device_and_accumulates_exactly():
    cfg = multi_label_config()
    batches = multi_label_batches(cfg, 1) * 3  # one batch again and again: the loss must fall
    single = assert_trains_sharded_as_one_device(cfg, batches, ("loss", "grad_norm", "exact_match"))
    assert single[-1]["loss"] < single[0]["loss"]
    assert "predicted" not in single[0] and "label" not in single[0]  # per-row values stay out of the train row


def test_check_dataset_shows_the_first_examples_labels(topics, capsys):
    """--check-dataset read a multi-hot row as a token classifier's labels: it names the labels that apply."""
    from data.check import check_dataset

    check_dataset(topics_data(train_batch_size=2, eval_batch_size=2), batch_size=2)
    out = capsys.readouterr().out
    assert "labels (2, 3) float32" in out and "with none: 1" in out
    shown = [f"first example (labels: {', '.join(sorted(row['labels'])) or 'none'}):\n{row['text'][:6]}"
             for row in TRAIN]
    assert sum(line in out for line in shown) == 1  # the first of a shuffled batch (cut to n_ctx), labels in id order
