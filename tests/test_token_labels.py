"""Token classification from jsonl files of words and labels: labels on each word's first token, -1 elsewhere;
one-line errors; the shipped code-tags example through train.py."""

import json

import numpy as np
import pytest

from config import ConfigError
from data.token_labels import IGNORED, TokenLabelSource, label_table, read_sentences
from data.tokenizer import load_tokenizer
from tests.common import metrics_rows, run_command


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_labels_sit_on_each_word_first_token_and_batches_resume_by_step(tmp_path):
    path = write(tmp_path / "train.jsonl", [{"tokens": ["ab", "c"], "labels": ["Y", "X"]},
                                            {"tokens": ["d", "éf", "g"], "labels": ["X", "X", "Y"]}])
    sentences, labels, places = read_sentences(path, "test", ("tokens", "labels"))
    names = label_table({"where": "test"}, labels, 2)
    assert names == ["X", "Y"]
    bytes_tokenizer = load_tokenizer("bytes")  # no [CLS]: end-of-text opens and closes the row
    eos = bytes_tokenizer.eos_id
    source = TokenLabelSource(sentences, labels, places, names, bytes_tokenizer, 8, 2, shuffle=False, seed=0,
                              description="test")
    batch = source.batch(0, 3)
    # "ab c" -> eos a b ' ' c eos; labels on 'a' (Y) and on the space that starts " c" (X)
    assert batch["inputs"][0].tolist() == [eos, 97, 98, 32, 99, eos, bytes_tokenizer.padding_id,
                                           bytes_tokenizer.padding_id]
    assert batch["labels"][0].tolist() == [IGNORED, 1, IGNORED, 0, IGNORED, IGNORED, IGNORED, IGNORED]
    assert batch["segment_ids"][0].tolist() == [1] * 6 + [0] * 2
    # "d éf g" is 1 + 4 + 2 bytes plus two ends: cut to n_ctx 8 with its end kept; "é" is two bytes, one label
    assert batch["labels"][1].tolist() == [IGNORED, 0, 0, IGNORED, IGNORED, IGNORED, 1, IGNORED]
    assert batch["inputs"][1, -1] == eos
    assert (batch["labels"][2] == IGNORED).all()  # past the last sentence: a filler row that scores nothing
    assert "2 sentences (1 cut to n_ctx 8), 5 labelled words; per label: X 3, Y 2" in source.description
    shuffled = [TokenLabelSource(sentences, labels, places, names, bytes_tokenizer, 8, 2, shuffle=True, seed=3,
                                 description="test") for _ in range(2)]
    shuffled[0].batch(2, 2)  # a run that read other steps first (a resumed one did not) sees the same batch 5
    np.testing.assert_array_equal(shuffled[0].batch(5, 2)["labels"], shuffled[1].batch(5, 2)["labels"])


@pytest.mark.parametrize("row, message", [
    ({"tokens": ["a", "b"], "labels": ["X"]}, "'labels' is not a list of one label per word (label_key; 2 words)"),
    ({"tokens": "a b", "labels": ["X"]}, "'tokens' is not a list of words (text_key)"),
    ({"tokens": ["a"], "labels": ["Z"]}, 'label "Z" is not one of X, Y'),
    ({"tokens": ["a"], "tags": ["X"]}, "has no 'labels' field (label_key; it has 'tokens', 'tags')"),
    ({"tokens": ["a", "b"], "labels": ["X", ""]}, "'labels' is the empty label \"\" (label_key)"),
])
def test_bad_lines_name_the_file_and_line(tmp_path, row, message):
    path = write(tmp_path / "bad.jsonl", [{"tokens": ["a"], "labels": ["X"]}, row])
    with pytest.raises(ConfigError) as e:
        sentences, labels, places = read_sentences(path, "test", ("tokens", "labels"))
        TokenLabelSource(sentences, labels, places, ["X", "Y"], load_tokenizer("bytes"), 8, 2, shuffle=False,
                         seed=0, description="test")
    assert str(e.value).startswith(f"{path}: line 2") and message in str(e.value)
    with pytest.raises(ConfigError, match="num_labels: 3, but test has 2 labels"):
        label_table({"where": "test"}, [["X", "Y"]], 3)
    with pytest.raises(ConfigError, match=r'^test path: label 1 is not a string, as other train labels are \("X"\)'):
        label_table({"where": "test"}, [["X", 1]], 2)  # 1 was taken as the id of whichever name sorted second


@pytest.mark.e2e
def test_code_tags_config_learns_token_categories(tmp_path):
    model_path = tmp_path / "tags"
    result = run_command("train.py", "--config", "configs/bert_code_tags.json", "--model-path", str(model_path),
                         "--no-progress", "--set", "train_steps=40", "--set", "eval_every=0", "--set", "n_layer=1",
                         "--set", "train_batch_size=16", "--set", "warmup_steps=6", "--set", "eval_steps=2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "data train: configs/dataset_configs/code_tags.json: 6,000 sentences" in result.stdout and \
        "labelled words; per label: builtin" in result.stdout
    (evaluation,) = metrics_rows(model_path, "eval")
    assert evaluation["accuracy"] > 0.8, evaluation  # the most common category alone is under 0.5


def test_labels_take_the_order_of_the_classifier_the_run_starts_from(tmp_path, monkeypatch):
    from data.source import make_source
    from tests.data_common import config, use_dataset_configs

    path = write(tmp_path / "train.jsonl", [{"tokens": ["EU", "rejects"], "labels": ["B-ORG", "O"]}])
    use_dataset_configs(monkeypatch, tmp_path / "dc", ner={"path": path, "tokenizer_path": "bytes"})
    (tmp_path / "config.json").write_text(json.dumps({"id2label": {"0": "O", "1": "B-ORG"}}))
    source = make_source(config([["ner", None, None, None]], 8, task="token_classification", num_labels=2,
                                init_from=str(tmp_path)), "train")
    assert source.label_names == ["O", "B-ORG"] and source.token_labels[0, 1] == 1
