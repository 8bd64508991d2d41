"""Sequence classification through train.py as a user runs it: configs/bert_classify.json (shrunk) on the stdlib
docstrings example it ships with, and on a two-class TFDS dataset read by name, where eval rows add F1."""

import json

import pytest

from tests import hf_fixtures
from tests.common import metrics_rows, run_command
from tests.data_common import prepare_tiny_glue

TINY = ["n_layer=1", "n_embd=32", "n_head=2", "d_ff=64", "n_ctx=32", "train_batch_size=8", "eval_batch_size=8",
        "train_steps=3", "warmup_steps=1", "eval_steps=2", "eval_every=0"]


def classify(model_path, *sets, extra=()):
    args = ["train.py", "--config", "configs/bert_classify.json", "--model-path", str(model_path), "--no-progress"]
    result = run_command(*args, *[arg for s in TINY + list(sets) for arg in ("--set", s)], *extra)
    assert result.returncode == 0, result.stderr[-3000:]
    classify.stdout = result.stdout
    assert [r["step"] for r in metrics_rows(model_path)] == [1, 2, 3]
    (evaluation,) = metrics_rows(model_path, "eval")
    assert evaluation["step"] == 3 and evaluation["loss"] > 0 and 0.0 <= evaluation["accuracy"] <= 1.0
    assert "perplexity" not in evaluation and "bits_per_byte" not in evaluation  # per-example losses
    return evaluation


@pytest.mark.e2e
def test_bert_classify_reports_accuracy_and_two_class_f1(tmp_path):
    assert "f1" not in classify(tmp_path / "docstrings")  # 8 modules: accuracy only
    names = json.loads((tmp_path / "docstrings" / "labels.json").read_text())  # the modules, in id order
    assert len(names) == 8 and names == sorted(names)
    exported = run_command("-m", "convert", "export", str(tmp_path / "docstrings"), str(tmp_path / "hf_classify"))
    assert exported.returncode == 0, exported.stderr
    hf = json.loads((tmp_path / "hf_classify" / "config.json").read_text())  # a pipeline says the module's name
    assert hf["id2label"] == {str(i): name for i, name in enumerate(names)} and hf["label2id"][names[3]] == 3
    pairs = [(f"sentence {i} says {'yes' if i % 3 else 'no'}", f"reply {i}", int(i % 3 != 0)) for i in range(12)]
    prepare_tiny_glue(str(tmp_path / "tfds"), pairs)
    # Fine-tuning a Hugging Face BERT on it: --init-from its directory loads the encoder; the classifier starts fresh.
    bert = hf_fixtures.save(hf_fixtures.encoder("bert", head=None, n_embd=32, n_head=2, n_layer=1, n_ctx=32,
                                                vocab=257, d_ff=64), tmp_path / "hf_bert")
    evaluation = classify(tmp_path / "glue", 'datasets=[["tfds:neomesh_tiny_glue/mrpc", null, null, null]]',
                          f"tfds_data_dir={tmp_path / 'tfds'}", "tokenizer_path=bytes", "num_labels=2", "n_vocab=257",
                          extra=("--init-from", bert))
    assert 0.0 <= evaluation["f1"] <= 1.0
    initialised = next(line for line in classify.stdout.splitlines() if line.startswith("initialised from"))
    assert "fresh (not in it): " in initialised and "classifier" in initialised, initialised
