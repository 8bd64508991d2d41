"""Labelled data for sequence classification: batches as the objective reads them (shapes, padding, truncation,
label mapping), a pure function of (config, step) (determinism, resume anywhere, per-process rows, weight-0 rows
closing the evaluation), TFDS by name from a local data dir, the stdlib docstrings example, one-line errors."""

import json
import os

import numpy as np
import pytest

from config import ConfigError
from data.source import make_source
from data.tokenizer import truncate_longest_first
from tests.data_common import config, prepare_tiny_glue, use_dataset_configs

N_CTX = 16
EOS = 256  # the byte tokenizer's end-of-text, also its padding
TRAIN = [{"text": "good film", "label": "pos"}, {"text": "bad", "label": "neg"},
         {"text": "so so", "text_pair": "meh", "label": "neutral"},
         {"text": "a long review that goes on and on", "text_pair": "and a reply", "label": "pos"},
         {"text": "awful", "label": "neg"}, {"text": "fine", "label": "neutral"}, {"text": "great", "label": "pos"}]
EVAL = [{"text": "ok", "label": "neutral"}, {"text": "superb", "label": "pos"}, {"text": "dull", "label": "neg"}]


def write_jsonl(path, rows) -> str:
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(path)


def classify(datasets="reviews", num_labels=3, n_ctx=N_CTX, **changes):
    return config([[datasets, None, None, None]], n_ctx, n_vocab=257, task="sequence_classification",
                  num_labels=num_labels, **changes)


@pytest.fixture
def reviews(tmp_path, monkeypatch):
    """A dataset config 'reviews' over a 7-example train file and a 3-example eval file (byte tokenizer)."""
    body = {"path": write_jsonl(tmp_path / "train.jsonl", TRAIN),
            "eval_path": write_jsonl(tmp_path / "eval.jsonl", EVAL), "tokenizer_path": "bytes"}
    use_dataset_configs(monkeypatch, tmp_path / "dc", reviews=body)
    return lambda **more: use_dataset_configs(monkeypatch, tmp_path / "dc", reviews={**body, **more})


def expected_row(text, pair=None):
    """[eos] a [eos] (b [eos]) in bytes, cut longest-first to N_CTX, and its token types."""
    a, b = truncate_longest_first(list(text.encode()), list(pair.encode()) if pair else [],
                                  N_CTX - (3 if pair else 2))
    return [EOS, *a, EOS] + ([*b, EOS] if pair else []), [0] * (len(a) + 2) + ([1] * (len(b) + 1) if pair else [])


def test_eval_batches_in_order_padded_truncated_and_labelled(reviews):
    source = make_source(classify(), "train")
    assert source.bytes_per_token is None and source.tokenizer.eos_id == EOS
    assert "7 examples (1 cut to n_ctx 16); per label: neg 2, neutral 2, pos 3" in source.description
    ordered = make_source(classify(), "eval")
    batch = ordered.batch(0, 4)
    assert {k: (v.shape, v.dtype.name) for k, v in batch.items()} == {
        "inputs": ((4, N_CTX), "int32"), "segment_ids": ((4, N_CTX), "int32"), "token_types": ((4, N_CTX), "int32"),
        "labels": ((4,), "int32"), "weights": ((4,), "float32")}
    for row, example in enumerate(EVAL + EVAL[:1]):  # the 4th row is a weight-0 copy of the first example
        ids, types = expected_row(example["text"])
        assert batch["inputs"][row].tolist() == ids + [EOS] * (N_CTX - len(ids))  # right-padded
        assert batch["segment_ids"][row].tolist() == [1] * len(ids) + [0] * (N_CTX - len(ids))
        assert batch["token_types"][row].tolist() == types + [0] * (N_CTX - len(types))
    assert batch["labels"].tolist() == [1, 2, 0, 1]  # sorted names: neg 0, neutral 1, pos 2
    assert batch["weights"].tolist() == [1, 1, 1, 0]
    assert ordered.batch(1, 4)["weights"].tolist() == [0] * 4  # past the end nothing counts
    ids, types = expected_row(TRAIN[3]["text"], TRAIN[3]["text_pair"])  # 33 + 11 bytes cut to 16 tokens
    assert source.inputs[3].tolist() == ids and source.token_types[3].tolist() == types == [0] * 9 + [1] * 7


def test_label_mapping_follows_the_labels_list_or_the_sorted_train_labels(reviews, tmp_path):
    reviews(labels=["pos", "neutral", "neg"])
    assert make_source(classify(), "eval").batch(0, 3)["labels"].tolist() == [1, 0, 2]
    ints = [{"text": r["text"], "label": i % 3} for i, r in enumerate(TRAIN)]
    reviews(path=write_jsonl(tmp_path / "ints.jsonl", ints), labels=None)
    assert make_source(classify(num_labels=4), "train").labels.tolist() == [0, 1, 2, 0, 1, 2, 0]
    keys = [{"sentence": r["text"], "other": r.get("text_pair"), "y": r["label"]} for r in TRAIN]
    reviews(path=write_jsonl(tmp_path / "keys.jsonl", keys), text_key="sentence", text_pair_key="other", label_key="y",
            eval_path=None)
    renamed = make_source(classify(eval_steps=0), "train")
    assert renamed.labels.tolist() == [2, 0, 1, 2, 0, 1, 2] and renamed.token_types[2].max() == 1


def test_labels_take_the_order_of_the_classifier_the_run_starts_from(reviews, tmp_path):
    # A fine-tuned classifier's head row i is its label i: sorting the data's labels would silently swap them.
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"id2label": {"0": "pos", "1": "neg", "2": "neutral"}}))
    source = make_source(classify(init_from=str(hf)), "eval")
    assert source.label_names == ["pos", "neg", "neutral"] and source.labels.tolist() == [2, 0, 1]
    run = tmp_path / "run"  # an imported run directory, or a run going on, keeps its names in labels.json
    run.mkdir()
    (run / "labels.json").write_text(json.dumps(["neutral", "pos", "neg"]))
    assert make_source(classify(model_path=str(run)), "eval").labels.tolist() == [0, 1, 2]
    (hf / "config.json").write_text(json.dumps({"id2label": {"0": "good", "1": "bad", "2": "meh"}}))
    assert make_source(classify(init_from=str(hf)), "eval").labels.tolist() == [1, 2, 0]  # other labels: sorted
    reviews(labels=["neg", "neutral", "pos"])
    with pytest.raises(ConfigError) as e:
        make_source(classify(model_path=str(run)), "train")
    assert str(e.value) == ('configs/dataset_configs/reviews.json: labels ["neg", "neutral", "pos"] are in another '
                            f'order than the classifier of {run / "labels.json"} (["neutral", "pos", "neg"]); list '
                            "them in its order, or leave labels out to take it")


def test_a_new_head_takes_no_label_order_from_the_classifier_it_replaces(reviews, tmp_path):
    # init_new_head: the old head's rows are gone, so its label names (here the same three, in its order) are not
    # the new head's; the data's own order (sorted) holds, as for a model without a classifier.
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"id2label": {"0": "pos", "1": "neg", "2": "neutral"}}))
    source = make_source(classify(init_from=str(hf), init_new_head=True), "eval")
    assert source.label_names == ["neg", "neutral", "pos"] and source.labels.tolist() == [1, 2, 0]


def test_batches_are_a_pure_function_of_config_and_step(reviews):
    cfg = classify()
    source = make_source(cfg, "train")
    reference = [source.batch(s, 4) for s in range(7)]  # 28 rows: 4 epochs of 7 examples
    for start in (1, 3, 6):
        resumed = make_source(cfg, "train")
        for s in range(start, 7):
            assert all((resumed.batch(s, 4)[k] == reference[s][k]).all() for k in reference[s]), (start, s)
    rows = np.concatenate([source.example_ids(s, 4)[0] for s in range(7)])
    for epoch in range(4):
        assert sorted(rows[epoch * 7:(epoch + 1) * 7].tolist()) == list(range(7))  # each example once per epoch
    assert rows[:7].tolist() != rows[7:14].tolist()  # reshuffled each epoch
    assert rows[:7].tolist() != make_source(classify(seed=7), "train").example_ids(0, 7)[0].tolist()
    for step in (0, 5):
        whole = source.batch(step, 4)
        halves = [source.batch(step, 4, slice(0, 2)), source.batch(step, 4, slice(2, 4))]
        for k in whole:
            assert np.concatenate([h[k] for h in halves]).tolist() == whole[k].tolist()
    assert source.batch(0, 4)["weights"].tolist() == [1] * 4


def test_weighted_rows_close_the_evaluation_exactly(reviews):
    """Eval means over batches of any size count each example once: the objective's weights are the rows'."""
    import jax.numpy as jnp

    from training.objectives import objective_for

    cfg = classify(eval_batch_size=2)
    objective = objective_for(cfg)
    ordered = make_source(cfg, "eval")
    table = jnp.asarray(np.random.default_rng(0).normal(size=(257, 3)), jnp.float32)

    def model(inputs, segment_ids, dropout_key=None, token_types=None):  # logits from the second token: (B, 3)
        assert token_types is not None and segment_ids.shape == inputs.shape
        return table[inputs[:, 1]], None

    def mean_loss(batch_size, steps):
        sums = weights = 0.0
        for step in range(steps):
            batch = {k: jnp.asarray(v) for k, v in ordered.batch(step, batch_size).items()}
            objective.check_batch(cfg, batch, ordered.description)  # every field the objective reads, shaped so
            losses, metrics = objective(model, batch)
            w = objective.weights(batch)
            assert w.tolist() == batch["weights"].tolist()
            sums, weights = sums + float((losses * w).sum()), weights + float(w.sum())
        return sums / weights, weights

    exact, count = mean_loss(3, 1)
    assert count == 3
    assert mean_loss(2, 5) == pytest.approx((exact, 3), rel=1e-6)  # a partial batch, then batches past the end
    unweighted = {k: v for k, v in ordered.batch(0, 4).items() if k != "weights"}
    assert objective.weights({k: jnp.asarray(v) for k, v in unweighted.items()}).tolist() == [1] * 4


@pytest.fixture(scope="module")
def tiny_glue(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("tfds"))
    pairs = [(f"sentence {i} says {'yes' if i % 3 else 'no'}", f"reply {i}", int(i % 3 != 0)) for i in range(12)]
    prepare_tiny_glue(data_dir, pairs)
    return data_dir, pairs


def test_tfds_glue_like_dataset_by_name(tiny_glue):
    data_dir, pairs = tiny_glue
    cfg = classify("tfds:neomesh_tiny_glue/mrpc", num_labels=2, tfds_data_dir=data_dir, n_ctx=40)
    ordered = make_source(cfg, "eval")  # the validation split, in order
    batch = ordered.batch(0, 4)
    for row, (a, b, label) in enumerate(pairs[8:]):
        ids = [EOS, *a.encode(), EOS, *b.encode(), EOS]
        assert batch["inputs"][row, :len(ids)].tolist() == ids and batch["segment_ids"][row].sum() == len(ids)
        assert batch["token_types"][row, :len(ids)].tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1)
        assert batch["labels"][row] == label
    assert "per label: not_equivalent 1, equivalent 3" in ordered.description
    train = make_source(cfg, "train")
    assert len(train) == 8 and sorted(train.example_ids(0, 8)[0].tolist()) == list(range(8))
    with pytest.raises(ConfigError) as e:
        make_source(classify("tfds:neomesh_tiny_glue/mrpc", num_labels=3, tfds_data_dir=data_dir), "train")
    assert str(e.value) == "num_labels: 3, but tfds:neomesh_tiny_glue/mrpc has 2 labels (not_equivalent, equivalent)"


@pytest.mark.parametrize("rows, changes, message", [
    ([{"txt": "a", "label": "pos"}], {}, "{path}: line 1 has no 'text' field (text_key; it has 'txt', 'label')"),
    ([{"text": "a", "label": "pos"}, {"text": "b"}], {}, "{path}: line 2 has no 'label' field (label_key; it has "
                                                         "'text')"),
    ([{"text": "a", "label": "great"}], {"labels": ["neg", "neutral", "pos"]},
     '{path}: line 1: label "great" is not one of the labels (neg, neutral, pos)'),
    ([{"text": "a", "label": "pos"}], {"labels": ["neg", "neutral", "pos", "mixed"]},
     "num_labels: 3, but {where} has 4 labels (neg, neutral, pos, mixed)"),
    ([{"text": "a", "label": "pos"}, {"text": "b", "label": "neg"}], {},
     "num_labels: 3, but {where} has 2 labels (neg, pos)"),
    ([{"text": "a", "label": "pos"}, {"text": "b", "label": "pos"}], {},  # was "... has 1 labels (pos)"
     "{where} has one label (pos): a classifier needs two or more"),
    ([{"text": "a", "label": 3}], {}, "{path}: line 1: label 3 is outside 0..2 (num_labels 3)"),
    ([{"text": "a", "label": "pos"}, {"text": "b", "label": 1}], {},  # was "num_labels: 3, but ... has 1 labels"
     '{path}: line 2: label 1 is not a string, as other train labels are ("pos"); give every label as a string or '
     "every one as an id (or list the names in the dataset config's labels)"),
    ([{"text": ["a"], "label": 1}], {}, "{path}: line 1: 'text' is not a string"),
    ([{"text": "a", "label": "pos"}, {"text": "b", "label": " "}], {},  # was "num_labels: 3, but ... ( , pos)"
     '{path}: line 2: \'label\' is the empty label " " (label_key); give every example one of the labels'),
    ([{"text": "a", "label": 0.5}], {},  # Hugging Face's regression labels
     "{path}: line 1: label 0.5 is neither an integer nor a string; a number is a regression's score, for "
     "num_labels 1"),
    ([], {}, "{path}: no examples (an empty file, matched by {where} path)"),
])
def test_bad_labelled_data_is_a_one_line_error(tmp_path, monkeypatch, rows, changes, message):
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    use_dataset_configs(monkeypatch, tmp_path / "dc", bad={"path": path, "tokenizer_path": "bytes", **changes})
    with pytest.raises(ConfigError) as e:
        make_source(classify("bad"), "train")
    assert str(e.value) == message.format(path=path, where="configs/dataset_configs/bad.json")


def test_bad_lines_and_eval_labels_name_their_file(reviews, tmp_path):
    (tmp_path / "broken.jsonl").write_text('{"text": "a", "label": "pos"}\n\n[1, 2]\n')
    reviews(path=str(tmp_path / "broken.jsonl"))
    with pytest.raises(ConfigError, match=r"broken.jsonl: line 3 is not a JSON object$"):
        make_source(classify(), "train")
    (tmp_path / "reviews.csv").write_text("text,label\ngreat,pos\n")  # not jsonl: the error says what is read
    reviews(path=str(tmp_path / "reviews.csv"))
    with pytest.raises(ConfigError, match=r"reviews.csv: line 1 is not a JSON object; these files are read as jsonl "
                                          r"\(.jsonl or .jsonl.zst\), one JSON object per line, not CSV"):
        make_source(classify(), "train")
    (tmp_path / "reviews.tsv").write_text("text\tlabel\ngreat\tpos\n")  # a TSV's pandas call reads tabs
    reviews(path=str(tmp_path / "reviews.tsv"))
    with pytest.raises(ConfigError, match=r"not TSV \(pandas converts one: pd.read_csv\(FILE, sep='\\t'\)"):
        make_source(classify(), "train")
    reviews(eval_path=write_jsonl(tmp_path / "new.jsonl", [{"text": "x", "label": "surprise"}]))
    with pytest.raises(ConfigError) as e:
        make_source(classify(), "eval")
    assert str(e.value) == f'{tmp_path / "new.jsonl"}: line 1: label "surprise" is not one of the labels ' \
                           "(neg, neutral, pos)"
    with pytest.raises(ConfigError, match="task sequence_classification reads one dataset of examples, got 2"):
        make_source(config([["reviews", None, None, None]] * 2, N_CTX, task="sequence_classification"), "train")


def test_stdlib_docstrings_example_prepares_once_with_a_fixed_split(tmp_path, monkeypatch):
    shipped = json.load(open(os.path.join(os.path.dirname(__file__), "..", "configs", "dataset_configs",
                                          "stdlib_docstrings.json")))
    cache = tmp_path / "cache" / "docstrings"
    body = {**shipped, "labels": ["decimal", "logging", "unittest"], "vocab_size": 400, "n_vocab": 400,
            **{k: str(cache / os.path.basename(shipped[k])) for k in ("path", "eval_path", "tokenizer_path")}}
    use_dataset_configs(monkeypatch, tmp_path / "dc", docs=body)
    cfg = config([["docs", None, None, None]], 64, n_vocab=400, task="sequence_classification", num_labels=3)
    train, held_out = make_source(cfg, "train"), make_source(cfg, "eval")
    assert sorted(os.listdir(tmp_path / "cache")) == ["docstrings"]  # published by one rename, lock removed
    assert sorted(os.listdir(cache)) == ["DONE", "eval.jsonl", "tokenizer.json", "train.jsonl"]
    rows = {s: [json.loads(line) for line in open(cache / f"{s}.jsonl")] for s in ("train", "eval")}
    texts = {s: {r["text"] for r in rows[s]} for s in rows}
    assert not texts["train"] & texts["eval"]  # no docstring in both splits
    for module in body["labels"]:
        n_train = sum(r["label"] == module for r in rows["train"])
        n_eval = sum(r["label"] == module for r in rows["eval"])
        assert 50 <= n_train + n_eval <= 100 and n_eval == -(-(n_train + n_eval) // 5)  # every 5th held out
    assert train.tokenizer.vocab_size == 400 and len(held_out) == len(rows["eval"])
    assert held_out.label_names == body["labels"]
    assert sorted(set(train.labels.tolist())) == [0, 1, 2]
    first = (cache / "train.jsonl").read_bytes()
    os.rename(cache, tmp_path / "old")
    make_source(cfg, "train")  # prepared again from scratch: the same split, byte for byte
    assert (cache / "train.jsonl").read_bytes() == first


def test_a_loaded_classifier_names_its_labels(tmp_path):
    """Pretrained.labels: a run's labels.json or a Hugging Face directory's id2label, in id order, as
    transformers' config.id2label; None where the ids are not named or name another number of classes."""
    from pretrained import label_names_of

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "labels.json").write_text(json.dumps(["neg", "pos"]))
    assert label_names_of(str(run), 2) == ["neg", "pos"] and label_names_of(str(run), 3) is None
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"id2label": {"1": "pos", "0": "neg"}}))
    assert label_names_of(str(hf), 2) == ["neg", "pos"]
    (hf / "config.json").write_text(json.dumps({"id2label": {"0": "LABEL_0", "1": "LABEL_1"}}))
    assert label_names_of(str(hf), 2) is None


def test_a_trained_classifier_reads_texts_as_its_training_data_held_them(reviews):
    """pretrained.Pretrained tokenizes texts and pairs into the very rows the labelled source trained on, and
    its class logits do not depend on how far a batch is padded."""
    from flax import nnx

    from models import registry
    from pretrained import Pretrained

    cfg = classify(model="bert", attention_types=None, n_layer=1, n_embd=32, n_head=2, d_ff=64, num_labels=3)
    source = make_source(cfg, "train")
    graphdef, state = nnx.split(registry.build(cfg, nnx.Rngs(0)))
    model = Pretrained(cfg, graphdef, nnx.to_pure_dict(state), source.tokenizer)
    rows = [0, 2, 4]  # "good film", ("so so", "meh"), "awful"
    texts = [TRAIN[r]["text"] for r in rows]
    pairs = [TRAIN[r].get("text_pair") for r in rows]
    batch = model.tokenize(texts, pairs)
    width = batch["inputs"].shape[1]
    assert width == source.lengths[rows].max() < N_CTX
    for name, ours in (("inputs", source.inputs), ("token_types", source.token_types)):
        assert batch[name].tolist() == ours[rows, :width].tolist(), name
    assert batch["segment_ids"].sum(1).tolist() == source.lengths[rows].tolist()
    positions = np.arange(N_CTX)
    full = {"inputs": source.inputs[rows], "token_types": source.token_types[rows],  # padded to n_ctx
            "segment_ids": (positions < source.lengths[rows, None]).astype(np.int32)}
    logits = np.asarray(model(texts, pairs))
    assert logits.shape == (3, 3)
    np.testing.assert_allclose(logits, np.asarray(model(full)), atol=1e-5)


@pytest.mark.parametrize("keys", [{}, {"text_key": "sentence1"}])
def test_glue_style_jsonl_reads_both_sentences(tmp_path, monkeypatch, keys):
    """jsonl with GLUE's sentence1/sentence2 (as transformers' run_glue reads them) was an error without text_key,
    and with text_key alone its second sentences were dropped without a word: both texts are read now."""
    rows = [{"sentence1": "a cat", "sentence2": "the dog", "label": 1},
            {"sentence1": "b", "sentence2": "c", "label": 0}]
    path = write_jsonl(tmp_path / "glue.jsonl", rows)
    use_dataset_configs(monkeypatch, tmp_path / "dc", glue={"path": path, "tokenizer_path": "bytes", **keys})
    batch = make_source(classify("glue", num_labels=2), "train").batch(0, 2)
    firsts = [row[:int(seg.sum())].tolist() for row, seg in zip(batch["inputs"], batch["segment_ids"])]
    want = {tuple([EOS, *a.encode(), EOS, *b.encode(), EOS]) for a, b in (("a cat", "the dog"), ("b", "c"))}
    assert set(map(tuple, firsts)) == want
