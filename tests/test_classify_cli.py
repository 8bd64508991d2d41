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
    import transformers  # its tokenizer loads (transformers took it for a BertTokenizer and failed)

    (said,) = transformers.pipeline("text-classification", model=str(tmp_path / "hf_classify"))(["Open a file."])
    assert said["label"] in names
    pairs = [(f"sentence {i} says {'yes' if i % 3 else 'no'}", f"reply {i}", int(i % 3 != 0)) for i in range(12)]
    prepare_tiny_glue(str(tmp_path / "tfds"), pairs)
    # Fine-tuning a Hugging Face BERT on it: --init-from its directory loads the encoder; the classifier starts fresh.
    bert = hf_fixtures.save(hf_fixtures.encoder("bert", head=None, n_embd=32, n_head=2, n_layer=1, n_ctx=32,
                                                vocab=257, d_ff=64), tmp_path / "hf_bert")
    evaluation = classify(tmp_path / "glue", 'datasets=[["tfds:neomesh_tiny_glue/mrpc", null, null, null]]',
                          f"tfds_data_dir={tmp_path / 'tfds'}", "tokenizer_path=bytes", "num_labels=2", "n_vocab=257",
                          extra=("--init-from", bert))
    assert 0.0 <= evaluation["f1"] <= 1.0
    (warning,) = [line for line in classify.stdout.splitlines() if line.startswith("warning: ")]  # its own line
    assert warning.startswith(f"warning: {bert} has no task head; initialised fresh (train it before use): "
                              "classifier/") and "classifier/out/kernel" in warning, warning


@pytest.mark.e2e
def test_a_classifier_with_other_labels_trains_a_new_head_on_its_backbone(tmp_path):
    """A 2-label BertForSequenceClassification (neg, pos) fine-tuned on the 8 docstring modules: one line naming
    both counts and init_new_head, before any data work; with it, the run trains a new 8-label head on the
    backbone, a note names the new parameters, and the run's labels are the data's, not neg and pos. A NeoMesh run
    of that classifier (an import) starts the same way."""
    from convert.hf import import_hf

    hf = hf_fixtures.encoder("bert", head="sequence_classification", n_embd=32, n_head=2, n_layer=1, n_ctx=32,
                             d_ff=64, num_labels=2)
    hf.config.id2label, hf.config.label2id = {0: "neg", 1: "pos"}, {"neg": 0, "pos": 1}
    source = hf_fixtures.save(hf, tmp_path / "hf")
    refused = run_command("train.py", "--config", "configs/bert_classify.json", "--model-path", str(tmp_path / "no"),
                          "--init-from", source, *[arg for s in TINY for arg in ("--set", s)])
    assert refused.returncode != 0 and refused.stderr.strip().splitlines() == [
        f"error: --init-from {source}: its classifier has 2 labels, but num_labels is 8; --set init_new_head=true "
        "keeps its backbone and starts a new head of 8 (--set num_labels=2 fine-tunes its head)"], refused.stderr
    assert "data train" not in refused.stdout and not (tmp_path / "no").exists()
    imported = str(tmp_path / "imported")
    import_hf(source, imported)
    going_on = run_command("train.py", "--config", "configs/bert_classify.json", "--model-path", imported,
                           *[arg for s in TINY for arg in ("--set", s)])
    assert going_on.returncode != 0 and going_on.stderr.strip().endswith(
        f"(set it back, or --new for a fresh run; --init-from {imported} --set init_new_head=true --model-path "
        "NEW_DIR starts a new head of 8 on its weights)"), going_on.stderr
    # From the import, LoRA keeping only the trained parameters: loading the run reads the backbone from it again.
    for start, peft in ((source, []), (imported, ['peft={"lora": {}, "checkpoint": "trainable"}'])):
        run = tmp_path / ("from_run" if peft else "from_hf")
        classify(run, "init_new_head=true", *peft, extra=("--init-from", start))
        assert ("init_new_head: a new head of 8 labels, initialised fresh: classifier/out/bias, "
                "classifier/out/kernel") in classify.stdout
        initialised = next(line for line in classify.stdout.splitlines() if line.startswith("initialised from"))
        assert initialised.startswith(f"initialised from {start}"), initialised
        fresh = initialised[len(f"initialised from {start}"):]  # LoRA's factors; the head is named above
        assert fresh.startswith("; fresh (not in it): blocks/0/attn/q/lora") if peft else fresh == "", fresh
        assert "classifier" not in fresh
        names = json.loads((run / "labels.json").read_text())
        assert len(names) == 8 and "neg" not in names
    from pretrained import Pretrained

    model = Pretrained.from_pretrained(str(tmp_path / "from_run"))
    assert model.labels == names and model(["Fail if the two objects are unequal."]).shape == (1, 8)


@pytest.mark.parametrize("head", ["sequence_classification", "token_classification"])
def test_predict_labels_a_text_classifiers_prompts(head, tmp_path, capsys):
    """predict.py refused every text classifier ("does not generate text"): a sequence classifier's prompts now get
    their likeliest labels with transformers' probabilities, a token classifier's words the label transformers
    gives each word's first token; generation options are one line."""
    import numpy as np
    import torch

    import predict
    from data.token_labels import framed
    from data.tokenizer import load_tokenizer
    from pretrained import Pretrained

    hf = hf_fixtures.encoder(head=head)
    hf.config.id2label = {0: "red", 1: "green", 2: "blue"}
    hf_dir = hf_fixtures.save(hf, tmp_path / "hf")
    texts = ["the cat sat on the mat", "a b", "numbers 12345 and words"]
    assert predict.main(["--hf-model", hf_dir, *[a for t in texts for a in ("--prompt", t)], "--top-k", "2",
                         "--output", str(tmp_path / "out.txt")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == (tmp_path / "out.txt").read_text().splitlines() and len(lines) == 3
    if head == "sequence_classification":
        p = torch.softmax(torch.from_numpy(np.array(Pretrained.from_pretrained(hf_dir)(texts), np.float32)), -1)
        for i, (line, row) in enumerate(zip(lines, p.numpy()), 1):
            order = np.argsort(-row)[:2]
            assert line == f"prompt {i}: " + ", ".join(f"{hf.config.id2label[int(j)]} {row[j]:.4f}" for j in order)
    else:
        tokenizer = load_tokenizer(hf_dir)
        for i, (line, text) in enumerate(zip(lines, texts), 1):
            words, firsts, ids = text.split(), [], []
            for n, word in enumerate(words):  # each word alone, after a space but the first: as training read it
                firsts.append(1 + len(ids))
                ids += tokenizer.encode(word if n == 0 else " " + word) or [tokenizer.padding_id]
            with torch.no_grad():
                logits = hf(torch.tensor([framed(tokenizer, ids, 40)])).logits[0].numpy()
            assert line == f"prompt {i}: " + " ".join(f"{w}/{hf.config.id2label[int(logits[t].argmax())]}"
                                                       for w, t in zip(words, firsts))
    assert predict.main(["--hf-model", hf_dir, "--prompt", "x", "--temperature", "0"]) == 2
    assert capsys.readouterr().err.strip() == (f"error: --temperature shapes generated text; a bert model trained for "
                                               f"{head} labels its prompts (--top-k: the classes shown)")


def test_predict_fills_a_masked_lms_masks(tmp_path, capsys):
    """predict.py refused a masked LM ("does not generate text"): each [MASK] of a prompt now gets its likeliest
    tokens with transformers' probabilities (Hugging Face's fill-mask pipeline); a prompt without one is one line."""
    import numpy as np
    import torch

    import predict
    from pretrained import Pretrained

    tok = hf_fixtures.tokenizer()
    tok.add_special_tokens(["<mask>"])
    hf = hf_fixtures.encoder(kind="roberta", vocab=hf_fixtures.VOCAB + 1)
    hf.save_pretrained(str(tmp_path / "hf"))
    tok.save(str(tmp_path / "hf" / "tokenizer.json"))
    hf_dir, mask = str(tmp_path / "hf"), hf_fixtures.VOCAB
    texts = ["the <mask> sat", "import <mask> as<mask>"]
    assert predict.main(["--hf-model", hf_dir, *[a for t in texts for a in ("--prompt", t)], "--top-k", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    batch = Pretrained.from_pretrained(hf_dir).tokenize(texts)
    with torch.no_grad():
        p = torch.softmax(hf(torch.tensor(batch["inputs"]), attention_mask=torch.tensor(batch["segment_ids"])).logits,
                          -1).numpy()
    for i, (line, ids, row) in enumerate(zip(lines, batch["inputs"], p), 1):
        fills = [", ".join(f"{tok.decode([int(j)])!r} {row[t, j]:.4f}" for j in np.argsort(-row[t])[:2])
                 for t in np.flatnonzero(ids == mask)]
        assert line == f"prompt {i}: " + "; ".join(f"mask {k}: {fill}" for k, fill in enumerate(fills, 1))
    assert lines[1].count("mask ") == 2
    assert predict.main(["--hf-model", hf_dir, "--prompt", "no mask"]) == 2
    assert capsys.readouterr().err.strip() == ("error: prompt 1: no <mask> token (id 320) in its first n_ctx 40 "
                                               "tokens; a masked LM fills the masks of a prompt")


def test_predict_takes_sentence_pairs_and_notes_a_cut_prompt(tmp_path, capsys):
    """A sentence-pair classifier read only single prompts in predict.py, and a prompt past n_ctx was cut without a
    word: --pair gives each prompt its second text (as Pretrained(texts, pairs) reads them), and a cut is noted."""
    import numpy as np

    import predict
    from neomesh.classifier_output import top_classes
    from pretrained import Pretrained

    hf = hf_fixtures.encoder(head="sequence_classification")
    hf.config.id2label = {0: "red", 1: "green", 2: "blue"}
    hf_dir = hf_fixtures.save(hf, tmp_path / "hf")
    texts, pairs = ["the cat sat", "a b " * 30], ["on the mat", "c"]
    assert predict.main(["--hf-model", hf_dir, *[a for t, q in zip(texts, pairs) for a in ("--prompt", t, "--pair", q)],
                         "--top-k", "1"]) == 0
    out = capsys.readouterr()
    logits = np.asarray(Pretrained.from_pretrained(hf_dir)(texts, pairs), np.float64)
    assert out.out.splitlines() == [f"prompt {i}: {top_classes(row, ['red', 'green', 'blue'], 1)}"
                                    for i, row in enumerate(logits, 1)]
    assert "note: prompt 2: " in out.err and "cut to n_ctx 40 (the longer text first)" in out.err
    assert "prompt 1" not in out.err
    assert predict.main(["--hf-model", hf_dir, "--prompt", "x", "--pair", "y", "--pair", "z"]) == 2
    assert capsys.readouterr().err.strip() == "error: --pair: 2 second texts for 1 prompts; give one per prompt"


def test_predict_prints_a_regressions_score_for_each_text_and_pair(tmp_path, capsys):
    """A num_labels 1 classifier (STS-B) was given softmax "probabilities" of its one class (always 1.0000): each
    prompt, with its --pair, now gets its score, transformers' logit."""
    import torch

    import predict
    from data.tokenizer import load_tokenizer

    hf = hf_fixtures.encoder(head="sequence_classification", num_labels=1)
    hf_dir = hf_fixtures.save(hf, tmp_path / "hf")
    texts, pairs = ["the cat sat", "numbers 12345"], ["on the mat", "and words"]
    assert predict.main(["--hf-model", hf_dir, *[a for t, q in zip(texts, pairs) for a in ("--prompt", t, "--pair", q)]
                         ]) == 0
    tokenizer = load_tokenizer(hf_dir)
    for i, (line, text, pair) in enumerate(zip(capsys.readouterr().out.splitlines(), texts, pairs), 1):
        ids, types = tokenizer.encode_pairs([text], [pair], 40)[0]
        with torch.no_grad():
            score = hf(torch.tensor([ids]), token_type_ids=torch.tensor([types])).logits[0, 0].item()
        assert line == f"prompt {i}: score {score:.4f}"
    assert predict.main(["--hf-model", hf_dir, "--prompt", "x", "--top-k", "2"]) == 2
    assert capsys.readouterr().err.strip() == ("error: --top-k: this sequence classifier is a regression (num_labels "
                                               "1): it gives each prompt one score, no classes to show")


@pytest.mark.e2e
def test_a_regression_fine_tunes_on_stsb_and_reports_correlations(tmp_path):
    """A Hugging Face BERT regression (num_labels 1) fine-tuned on a GLUE/STS-B-shaped TFDS dataset: eval rows carry
    mse, pearson and spearmanr; the run gives scores through Pretrained and exports as a regression."""
    from tests.data_common import prepare_tiny_stsb

    prepare_tiny_stsb(str(tmp_path / "tfds"), [(f"sentence {i} about {'cats' if i % 2 else 'dogs'}", f"reply {i}",
                                                 (i * 7 % 11) / 2) for i in range(14)])
    source = hf_fixtures.save(hf_fixtures.encoder("bert", head="sequence_classification", num_labels=1, n_embd=32,
                                                  n_head=2, n_layer=1, n_ctx=32, vocab=257, d_ff=64), tmp_path / "hf")
    run = tmp_path / "stsb"
    sets = TINY + ['datasets=[["tfds:neomesh_tiny_glue/stsb", null, null, null]]', f"tfds_data_dir={tmp_path / 'tfds'}",
                   "tokenizer_path=bytes", "num_labels=1", "n_vocab=257"]
    result = run_command("train.py", "--config", "configs/bert_classify.json", "--model-path", str(run),
                         "--no-progress", "--init-from", source, *[arg for s in sets for arg in ("--set", s)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "labels are scores: mean" in result.stdout and "warning" not in result.stdout  # its head came along
    (evaluation,) = metrics_rows(run, "eval")
    assert set(evaluation) >= {"loss", "mse", "pearson", "spearmanr"} and "accuracy" not in evaluation
    assert evaluation["mse"] == evaluation["loss"] > 0 and -1 <= evaluation["spearmanr"] <= 1
    assert not (run / "labels.json").exists()
    from pretrained import Pretrained

    model = Pretrained.from_pretrained(str(run))
    assert model.labels is None and model(["sentence 3 about cats"], ["reply 3"]).shape == (1, 1)
    exported = run_command("-m", "convert", "export", str(run), str(tmp_path / "hf_out"))
    assert exported.returncode == 0, exported.stderr
    assert json.loads((tmp_path / "hf_out" / "config.json").read_text())["problem_type"] == "regression"


def multi_label_encoder(num_labels=4, **shape):
    """A Hugging Face BERT multi-label classifier (problem_type multi_label_classification) with named labels."""
    hf = hf_fixtures.encoder(head="sequence_classification", num_labels=num_labels, **shape)
    hf.config.problem_type = "multi_label_classification"
    hf.config.id2label = {i: name for i, name in enumerate(["arts", "politics", "sports", "weather"][:num_labels])}
    hf.config.label2id = {name: i for i, name in hf.config.id2label.items()}
    return hf


def test_predict_prints_a_multi_label_classifiers_labels_of_probability_half_or_more(tmp_path, capsys):
    """A multi-label classifier was shown softmax probabilities of its likeliest classes: each prompt now gets the
    labels whose sigmoid of transformers' logit is >= 0.5, likeliest first."""
    import numpy as np
    import torch

    import predict
    from data.tokenizer import load_tokenizer

    hf = multi_label_encoder()
    with torch.no_grad():  # arts always applies, politics never; sports and weather depend on the text
        hf.classifier.weight.mul_(0.05)
        hf.classifier.bias.copy_(torch.tensor([4.0, -4.0, 0.0, 0.0]))
    hf_dir = hf_fixtures.save(hf, tmp_path / "hf")
    texts = ["the cat sat", "numbers 12345", "a vote on the match"]
    assert predict.main(["--hf-model", hf_dir, *[a for t in texts for a in ("--prompt", t)]]) == 0
    tokenizer, names = load_tokenizer(hf_dir), ["arts", "politics", "sports", "weather"]
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    for i, (line, text) in enumerate(zip(lines, texts), 1):
        ids, types = tokenizer.encode_pairs([text], [None], 40)[0]
        with torch.no_grad():
            p = torch.sigmoid(hf(torch.tensor([ids]), token_type_ids=torch.tensor([types])).logits[0]).numpy()
        shown = [j for j in np.argsort(-p) if p[j] >= 0.5]
        assert shown[0] == 0 and 1 not in shown
        assert line == f"prompt {i}: " + ", ".join(f"{names[j]} {p[j]:.4f}" for j in shown)
    assert predict.main(["--hf-model", hf_dir, "--prompt", "x", "--top-k", "2"]) == 2
    assert capsys.readouterr().err.strip() == ("error: --top-k: this sequence classifier is multi-label: it shows each "
                                               "prompt's labels of probability >= 0.5, however many")


def test_a_text_no_label_applies_to_names_the_likeliest():
    import numpy as np

    from neomesh.classifier_output import labels_that_apply

    assert labels_that_apply(np.array([0.5, -0.5, 2.0, 0.0]), ["a", "b", "c", "d"]) == "c 0.8808, a 0.6225, d 0.5000"
    assert labels_that_apply(np.array([-3.0, -0.5]), ["a", "b"]) == "no label >= 0.5 (likeliest: b 0.3775)"


@pytest.mark.e2e
def test_a_multi_label_classifier_fine_tunes_on_label_lists_and_reports_f1s(tmp_path):
    """--init-from a Hugging Face multi-label BERT, fine-tuned on jsonl rows whose labels are lists: eval rows carry
    micro/macro F1 and exact match; Pretrained gives its logits; export writes it as multi-label."""
    topics = ["arts", "politics", "sports", "weather"]
    rows = [{"text": f"text {i} about {' and '.join(topics[j] for j in range(4) if i >> j & 1)}",
             "labels": [topics[j] for j in range(4) if i >> j & 1]} for i in range(16)]
    for name, part in (("train", rows[:12]), ("eval", rows[12:])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    dataset = tmp_path / "topics.json"
    dataset.write_text(json.dumps({"path": str(tmp_path / "train.jsonl"), "eval_path": str(tmp_path / "eval.jsonl"),
                                   "tokenizer_path": "bytes"}))
    source = hf_fixtures.save(multi_label_encoder(n_embd=32, n_head=2, n_layer=1, n_ctx=32, vocab=257, d_ff=64),
                              tmp_path / "hf")
    run = tmp_path / "run"
    sets = TINY + [f'datasets=[["{dataset}", null, null, null]]', "tokenizer_path=bytes", "num_labels=4",
                   "n_vocab=257", "multi_label=true"]
    result = run_command("train.py", "--config", "configs/bert_classify.json", "--model-path", str(run),
                         "--no-progress", "--init-from", source, *[arg for s in sets for arg in ("--set", s)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "per label: arts 6, politics 6, sports 4, weather 4; with none: 1" in result.stdout
    assert "warning" not in result.stdout  # its head came along
    (evaluation,) = metrics_rows(run, "eval")
    assert set(evaluation) >= {"loss", "micro_f1", "macro_f1", "exact_match"} and "accuracy" not in evaluation
    assert all(0 <= evaluation[k] <= 1 for k in ("micro_f1", "macro_f1", "exact_match")) and evaluation["loss"] > 0
    assert json.loads((run / "labels.json").read_text()) == topics
    from pretrained import Pretrained

    model = Pretrained.from_pretrained(str(run))
    assert model.labels == topics and model(["text 3 about arts and politics"]).shape == (1, 4)
    exported = run_command("-m", "convert", "export", str(run), str(tmp_path / "hf_out"))
    assert exported.returncode == 0, exported.stderr
    written = json.loads((tmp_path / "hf_out" / "config.json").read_text())
    assert written["problem_type"] == "multi_label_classification" and written["id2label"]["2"] == "sports"
    single = run_command("train.py", "--config", "configs/bert_classify.json", "--model-path", str(tmp_path / "x"),
                         "--no-progress", "--init-from", source, *[a for s in sets[:-1] for a in ("--set", s)])
    assert single.returncode == 2 and single.stderr.strip().endswith(
        "its classifier is multi-label (a sigmoid per label), but multi_label is false; --set multi_label=true "
        "fine-tunes its head (--set init_new_head=true starts a new one)")
