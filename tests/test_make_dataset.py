"""Your own text in one command: data/make_dataset.py (split, tokenizer, TFRecords, dataset config, cache by
content) and train.py --data."""

import glob
import json
import os
import re
import shutil

import numpy as np
import pytest

import neomesh.paths
from config import ConfigError
from data.eval_split import SCHEME, Draws, split_text
from data.make_dataset import FORMAT, config_for_data, content_key, dataset_name, make_dataset
from data.text_files import expand_inputs
from tests.common import ROOT, metrics_rows, run_command, tiny_config

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def write_texts(folder, count, lines=6, seed=0):
    """``count`` .txt documents; document i starts with the marker ``doc<i>``."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        body = "\n".join(" ".join(rng.choice(WORDS, 8)) for _ in range(lines))
        (folder / f"{i:03d}.txt").write_text(f"doc{i}\n{body}\n")
    return folder


@pytest.fixture
def work_root(tmp_path, monkeypatch):
    """data_cache/ goes under tmp_path, not the repository."""
    monkeypatch.setattr(neomesh.paths, "work_root", lambda: str(tmp_path))
    return tmp_path


def records(pattern):
    from data.tf_import import tensorflow
    tf = tensorflow()
    out = []
    for path in sorted(glob.glob(pattern)):
        for raw in tf.data.TFRecordDataset(path):
            example = tf.train.Example.FromString(raw.numpy())
            out.append(list(example.features.feature["text"].int64_list.value))
    return out


def test_one_document_splits_at_a_line_break():
    text = "".join(f"line {i}\n" for i in range(100))
    train, held = split_text(text, 0.1)
    assert train + held == text and train.endswith("\n") and held.startswith("line ")
    assert 0.08 < len(held) / len(text) < 0.12
    assert split_text("no line breaks at all", 0.5) == ("no line br", "eaks at all")


def test_names():
    assert dataset_name(["my texts/"]) == "my_texts"
    assert dataset_name(["corpus/*.jsonl.zst"]) == "corpus"
    assert dataset_name(["books/moby.txt"]) == "moby"


def test_folder_to_dataset_split_by_document_and_cached_by_content(tmp_path, work_root, capsys):
    texts = write_texts(tmp_path / "texts", 40)
    folder = make_dataset([str(texts)], vocab_size=300, n_ctx=32, workers=1)
    assert os.path.dirname(folder) == str(work_root / "data_cache") and os.path.basename(folder).startswith("texts-")
    with open(os.path.join(folder, "dataset.json")) as f:
        dataset = json.load(f)
    assert dataset == {"path": "train_*.tfrecords", "eval_path": "eval_*.tfrecords",
                       "tokenizer_path": "tokenizer.json", "n_vocab": 300, "eos_id": 0}
    from data.tokenizer import load_tokenizer
    tokenizer = load_tokenizer(os.path.join(folder, "tokenizer.json"))
    eval_text = tokenizer.decode(sum(records(os.path.join(folder, "eval_*.tfrecords")), []))
    train_text = tokenizer.decode(sum(records(os.path.join(folder, "train_*.tfrecords")), []))
    held = eval_markers(texts)  # none of these 40 hashes below 5%: the one of lowest hash is held out
    assert sorted(re.findall(r"doc\d+", eval_text)) == held and len(held) == 1
    assert sorted(re.findall(r"doc\d+", train_text)) == sorted(f"doc{i}" for i in range(40) if f"doc{i}" not in held)
    assert all(len(r) <= 33 for r in records(os.path.join(folder, "train_*.tfrecords")))  # n_ctx + 1 per record
    with open(os.path.join(folder, "DONE")) as f:
        totals = json.load(f)["totals"]
    assert totals["train"]["documents"] == 39 and totals["eval"]["documents"] == 1
    out = capsys.readouterr().out
    assert "first use: preparing" in out and "training a 300-token byte-level BPE" in out

    built = os.path.getmtime(os.path.join(folder, "DONE"))
    # The same files named by a glob: found again, not rebuilt.
    assert make_dataset([str(texts / "*.txt")], vocab_size=300, n_ctx=32, workers=1) == folder
    assert os.path.getmtime(os.path.join(folder, "DONE")) == built and "reusing" in capsys.readouterr().out
    (texts / "000.txt").write_text("changed\n")
    assert make_dataset([str(texts)], vocab_size=300, n_ctx=32, workers=1) != folder


def eval_markers(folder, fraction=0.05):
    """The ``doc<i>`` markers of the documents of ``folder`` that the hash of their text holds out."""
    split = Draws(fraction)
    paths = expand_inputs([str(folder)])
    for path in paths:
        split.add(open(path).read())
    split = split.split()[0]
    return sorted(re.match(r"doc\d+", text)[0] for text in map(lambda p: open(p).read(), paths)
                  if split.parts(text)[1])


def eval_documents(folder):
    """The ``doc<i>`` markers in a byte-level prepared folder's eval records."""
    held = bytes(t for r in records(os.path.join(folder, "eval_*.tfrecords")) for t in r if t < 256).decode()
    return sorted(re.findall(r"doc\d+", held))


def test_adding_and_renaming_files_moves_no_document_between_train_and_eval(tmp_path, work_root):
    texts = write_texts(tmp_path / "texts", 60)
    before = eval_documents(make_dataset([str(texts)], tokenizer="bytes", n_ctx=64, workers=1))
    assert before
    (texts / "010.txt").rename(texts / "renamed.txt")
    for i in range(60, 66):  # named to sort first: by position, every document after them would shift
        (texts / f"-{i}.txt").write_text(f"doc{i}\nnew text {i}\n")
    after = eval_documents(make_dataset([str(texts)], tokenizer="bytes", n_ctx=64, workers=1))
    assert set(before) <= set(after) and set(after) - set(before) <= {f"doc{i}" for i in range(60, 66)}


def test_a_folder_prepared_with_the_old_positional_split_is_prepared_anew(tmp_path, work_root, capsys):
    texts = write_texts(tmp_path / "texts", 40)
    old_settings = {"eval_fraction": 0.05, "chunk_size": 65, "tokenizer": "bytes"}  # no "eval_split" key
    old_key = content_key(expand_inputs([str(texts)]), old_settings)[:8]
    old = work_root / "data_cache" / f"texts-{old_key}"
    old.mkdir(parents=True)
    (old / "DONE").write_text(json.dumps({"format": FORMAT, "key": old_key}))
    folder = make_dataset([str(texts)], tokenizer="bytes", n_ctx=64, workers=1)
    assert folder != str(old) and "first use: preparing" in capsys.readouterr().out
    with open(os.path.join(folder, "DONE")) as f:
        assert json.load(f)["settings"]["eval_split"] == SCHEME


def test_read_back_through_the_pipeline_and_trainer_config(tmp_path, work_root):
    from data.source import make_source
    texts = write_texts(tmp_path / "notes", 30)
    cfg = config_for_data(tiny_config(n_vocab=300, n_ctx=32), [str(texts)])
    folder = os.path.dirname(cfg.datasets[0][0])
    assert cfg.datasets == [[os.path.join(folder, "dataset.json"), None, None, None]]
    assert cfg.model_path == os.path.join("runs", os.path.basename(folder)) and cfg.eval_steps > 0
    source = make_source(cfg, "train")
    batch = source.batch(0, 4)
    assert batch.shape == (4, 33) and batch.max() < 300
    assert any(word in source.tokenizer.decode(batch[0]) for word in WORDS)
    assert make_source(cfg, "eval").batch(0, 2).shape == (2, 33)
    again = config_for_data(tiny_config(n_vocab=300, n_ctx=32), [folder])  # the prepared folder itself
    assert again.datasets == cfg.datasets and again.model_path == cfg.model_path


def test_one_book_gives_its_last_lines_to_eval(tmp_path, work_root):
    book = tmp_path / "book.txt"
    book.write_text("".join(f"line {i} of the book\n" for i in range(200)))
    folder = make_dataset([str(book)], tokenizer="bytes", n_ctx=64, workers=1)
    with open(os.path.join(folder, "dataset.json")) as f:
        assert json.load(f)["tokenizer_path"] == "bytes"
    held = bytes(t for r in records(os.path.join(folder, "eval_*.tfrecords")) for t in r if t < 256).decode()
    assert held == "".join(f"line {i} of the book\n" for i in range(190, 200))


def test_jsonl_with_a_reused_tokenizer_and_no_eval(tmp_path, work_root, capsys):
    from data.tokenizer import train_bpe
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"text": f"row {i}: " + " ".join(WORDS[i % 5:])}) + "\n" for i in range(50)))
    train_bpe([" ".join(WORDS)] * 3, 280).save(str(tmp_path / "tok.json"))
    folder = make_dataset([str(rows)], tokenizer=str(tmp_path / "tok.json"), eval_fraction=0, n_ctx=16, workers=1)
    with open(os.path.join(folder, "dataset.json")) as f:
        dataset = json.load(f)
    assert "eval_path" not in dataset and dataset["n_vocab"] == 280
    assert not any(name.startswith("eval") for name in os.listdir(folder))
    capsys.readouterr()
    cfg = config_for_data(tiny_config(n_vocab=128, n_ctx=16, eval_steps=4), [folder])
    assert cfg.eval_steps == 0 and cfg.n_vocab == 280  # the model's vocabulary grows to hold the tokenizer
    assert f"note: {folder}/dataset.json has no eval set (no eval_path: --eval-fraction 0); evaluation is " \
        "skipped" in capsys.readouterr().out  # an eval_every the user set is not silently ignored


def test_bad_inputs_are_one_line(tmp_path, work_root):
    with pytest.raises(ConfigError, match="matches no .txt/.jsonl/.jsonl.zst file"):
        make_dataset([str(tmp_path / "nothing*")])
    texts = [str(write_texts(tmp_path / "t", 2))]
    with pytest.raises(ConfigError, match="--eval-fraction: 1.0 is not in"):
        make_dataset(texts, eval_fraction=1.0)
    for given, error in (({"n_ctx": 0}, "--n-ctx: 0 must be positive"),  # it wrote a record per token
                         ({"min_frequency": -1}, "--min-frequency: -1 must be zero or more"),  # a traceback
                         ({"workers": -2}, "--workers: -2 must be zero or more")):
        with pytest.raises(ConfigError, match=f"^{error}$"):
            make_dataset(texts, **given)
    assert not os.path.exists(work_root / "data_cache")


@pytest.mark.e2e
def test_train_on_a_folder_of_text_in_one_command(tmp_path):
    name = f"mytext_{os.getpid()}"  # unique: its data_cache/ folder is removed afterwards, whatever happens
    texts = write_texts(tmp_path / name, 24, lines=20, seed=os.getpid())
    run = tmp_path / "run"
    sets = ["n_layer=2", "n_embd=64", "n_head=4", "n_ctx=32", 'attention_types=[[["global","local"],1]]',
            "local_attention_radius=8", "n_vocab=300", "train_batch_size=8", "eval_batch_size=8", "train_steps=6",
            "warmup_steps=2", "eval_steps=1", "sample_tokens=0", "log_every=3"]
    try:
        result = run_command("train.py", "--data", str(texts), "--model-path", str(run),
                         *[arg for s in sets for arg in ("--set", s)])
        assert result.returncode == 0, result.stderr[-3000:]
        out = result.stdout
        assert f"preparing data_cache/{name}-" in out and "training a 300-token byte-level BPE" in out
        assert [line.split()[1] for line in out.splitlines() if line.startswith("step ") and "loss" in line
                and "eval" not in line] == ["1/6", "3/6", "6/6"]
        assert "train loss" in out and f"checkpoint: {run}/checkpoints/6" in out
        assert [r["step"] for r in metrics_rows(run)] == list(range(1, 7)) and metrics_rows(run, "eval")
    finally:  # the prepared folder, its lock, or the staging folder of a killed run
        for path in glob.glob(os.path.join(ROOT, "data_cache", name + "-*")):
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


def test_prepared_data_leaves_no_lock_file_built_or_failed(tmp_path):
    from data.prepare import build_once

    def build(directory):
        os.makedirs(directory)
        (tmp_path / "ran").write_text("")
        open(os.path.join(directory, "DONE"), "w").close()

    assert build_once(str(tmp_path / "ok"), build)
    assert sorted(os.listdir(tmp_path)) == ["ok", "ran"]

    def broken(directory):
        raise ConfigError("broken input")

    with pytest.raises(ConfigError, match="broken input"):
        build_once(str(tmp_path / "bad"), broken)
    assert sorted(os.listdir(tmp_path)) == ["ok", "ran"]


def test_a_build_removes_what_a_killed_build_left(tmp_path):
    """kill -9 during first-use preparation leaves its staging folder (target.tmp-PID); the next build, the only
    builder under the lock, removes it. A live process's staging folder stays."""
    import subprocess

    from data.prepare import build_once

    gone = subprocess.Popen(["true"])
    gone.wait()
    (tmp_path / f"ok.tmp-{gone.pid}" / "half").mkdir(parents=True)
    alive = tmp_path / f"ok.tmp-{os.getppid()}"
    alive.mkdir()

    def build(directory):
        os.makedirs(directory)
        open(os.path.join(directory, "DONE"), "w").close()

    assert build_once(str(tmp_path / "ok"), build)
    assert sorted(os.listdir(tmp_path)) == ["ok", alive.name]


def test_a_process_waiting_on_a_removed_lock_file_finds_the_work_done(tmp_path):
    import threading
    import time

    from data.prepare import build_once

    started, release, builds = threading.Event(), threading.Event(), []

    def build(directory):  # the first builder holds the lock until released
        builds.append(directory)
        started.set()
        release.wait(10)
        os.makedirs(directory)
        open(os.path.join(directory, "DONE"), "w").close()

    target = str(tmp_path / "data")
    first = threading.Thread(target=build_once, args=(target, build))
    first.start()
    assert started.wait(10)
    results = []
    second = threading.Thread(target=lambda: results.append(build_once(target, build)))
    second.start()  # opens data.lock and waits on it, then finds the file it locked removed
    time.sleep(0.5)  # time to reach the lock
    release.set()
    first.join(10)
    second.join(10)
    assert results == [False] and len(builds) == 1 and os.listdir(tmp_path) == ["data"]


def test_data_names_the_flag_and_a_missing_path(tmp_path, work_root):
    cfg = tiny_config(n_vocab=300)
    with pytest.raises(ConfigError) as e:
        config_for_data(cfg, [str(tmp_path / "missing_folder")])
    assert str(e.value) == f"--data {tmp_path / 'missing_folder'}: no such file or folder"
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError) as e:
        config_for_data(cfg, [str(tmp_path / "empty")])
    assert str(e.value) == f"--data {tmp_path / 'empty'}: matches no .txt/.jsonl/.jsonl.zst file"
    with pytest.raises(ConfigError, match=r"^--input \S+missing.txt: no such file or folder$"):
        make_dataset([str(tmp_path / "missing.txt")])


def test_data_names_tfrecords_and_a_model_config_given_as_data(tmp_path, work_root):
    """create_tfrecords' output folder, or a model config (a .json, as a dataset config is), given to --data."""
    cfg = tiny_config(n_vocab=300)
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "x_00000.tfrecords").write_bytes(b"")
    with pytest.raises(ConfigError) as e:
        config_for_data(cfg, [str(tmp_path / "records")])
    assert str(e.value) == (f"--data {tmp_path / 'records'}: matches no .txt/.jsonl/.jsonl.zst file; TFRecords are "
                            "read through a dataset config's path, named in a config's datasets (create_tfrecords.py "
                            "--write-dataset-config writes one)")
    model_config = os.path.join(ROOT, "configs", "quickstart.json")
    with pytest.raises(ConfigError) as e:
        config_for_data(cfg, [model_config])
    assert str(e.value) == f"--data {model_config}: a model config, not data; give it as --config {model_config}"
    for text, says in [("[1, 2]", 'a dataset config is a JSON object ({"path": ...}), not a list'),
                       ('{"path": ,}', "invalid JSON at line 1 column 10: Expecting value")]:
        (tmp_path / "given.json").write_text(text)  # a traceback, and a line that did not name the file
        with pytest.raises(ConfigError) as e:
            config_for_data(cfg, [str(tmp_path / "given.json")])
        assert str(e.value) == f"--data {tmp_path / 'given.json'}: {says}"


def test_an_output_dir_that_cannot_be_written_is_one_line_before_any_work(tmp_path, work_root, capsys,
                                                                          monkeypatch):
    from data import make_dataset as module

    texts = str(write_texts(tmp_path / "texts", 2))
    blocker = tmp_path / "afile"
    blocker.write_text("a file")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    cases = {str(blocker / "out"): f"cannot write in {blocker} (a file, not a folder)",
             str(blocker): "a file, not a folder",
             str(mine): "holds files data/make_dataset.py did not write, which the dataset would replace; choose "
                        "a new or empty folder"}
    for output_dir, why in cases.items():
        assert module.main(["--input", texts, "--output-dir", output_dir]) == 2
        out, err = capsys.readouterr()
        assert err == f"error: --output-dir {output_dir}: {why}\n" and "preparing" not in out
    assert (mine / "notes.txt").read_text() == "keep me"

    def read_only(**kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr("tempfile.mkstemp", read_only)
    assert module.main(["--input", texts, "--output-dir", str(tmp_path / "ro" / "out")]) == 2
    assert capsys.readouterr().err == \
        f"error: --output-dir {tmp_path / 'ro' / 'out'}: cannot write in {tmp_path / 'ro'} (Read-only file system)\n"
    assert sorted(os.listdir(tmp_path)) == ["afile", "mine", "ro", "texts"]  # no lock, no staging folder


def test_data_prepared_before_is_reused_from_a_cache_that_cannot_be_written(tmp_path, work_root, capsys,
                                                                            monkeypatch):
    """A shared or read-only data_cache: what was prepared there is read; only new data needs to write."""
    texts = write_texts(tmp_path / "texts", 12)
    folder = make_dataset([str(texts)], vocab_size=300, n_ctx=32, workers=1)

    def read_only(**kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr("tempfile.mkstemp", read_only)
    capsys.readouterr()
    assert make_dataset([str(texts)], vocab_size=300, n_ctx=32, workers=1) == folder
    assert "reusing" in capsys.readouterr().out
    with pytest.raises(ConfigError, match=r"^cannot write in .*data_cache \(Read-only file system\)$"):
        make_dataset([str(texts)], vocab_size=280, n_ctx=32, workers=1)  # other settings: a new folder


@pytest.mark.parametrize("config, sets, refusal", [
    ("bert_classify", (), "plain text cannot feed task sequence_classification, which needs labelled jsonl "
                          '({"text": ..., "label": ...} per line)'),
    ("bert_code_tags", (), "plain text cannot feed task token_classification, which needs labelled jsonl "
                           '({"tokens": [...], "labels": [...]} per line)'),
    ("vit_digits", (), "plain text cannot feed task image_classification, which needs labelled images"),
    ("bert_mlm", ("mlm_training=false",), "plain text feeds task masked_lm only with mlm_training true"),
    ("t5_reverse_words", (), "plain text feeds task seq2seq only with span_corruption true (--set "
                             'span_corruption=true); (input, target) pairs come from jsonl ({"inputs": ..., '
                             '"targets": ...} per line)'),
], ids=["sequence_classification", "token_classification", "image_classification", "masked_lm", "seq2seq"])
def test_data_refuses_a_task_text_cannot_feed_before_preparing(tmp_path, work_root, config, sets, refusal):
    from config import load_config

    cfg = load_config(config, sets)[0]
    texts = write_texts(tmp_path / "texts", 3)
    with pytest.raises(ConfigError) as e:
        config_for_data(cfg, [str(texts)])
    assert str(e.value).startswith(f"--data: {refusal}") and "\n" not in str(e.value)
    assert not os.path.exists(work_root / "data_cache")  # nothing prepared
    folder = make_dataset([str(texts)], tokenizer="bytes", n_ctx=16, workers=1, say=lambda _: None)
    with pytest.raises(ConfigError, match=f"^--data: {re.escape(refusal)}"):  # already prepared token data
        config_for_data(cfg, [folder])


@pytest.mark.parametrize("config", ["t5_small_spans", "bert_mlm"])
def test_data_trains_the_special_tokens_the_objective_needs(tmp_path, work_root, config):
    from config import load_config
    from data.source import make_source
    from data.spans import sentinel_count

    cfg = load_config(config, ("n_vocab=300", "n_ctx=32", "train_batch_size=2"))[0]
    needed = [f"<extra_id_{i}>" for i in range(sentinel_count(cfg))] if cfg.span_corruption else ["[MASK]"]
    cfg = config_for_data(cfg, [str(write_texts(tmp_path / "texts", 20))])
    source = make_source(cfg, "train")  # looks the tokens up (a one-line error without them)
    assert cfg.n_vocab == 300  # the tokens fit in the vocabulary asked for
    assert all(source.tokenizer.token_id(t) is not None for t in needed)
    assert set(source.batch(0, 2)) >= {"inputs", "targets"}


def test_data_refuses_a_vocabulary_without_room_for_the_objectives_tokens_before_preparing(tmp_path, work_root):
    from config import load_config
    from data.tokenizer import train_bpe

    texts = [str(write_texts(tmp_path / "texts", 3))]
    cfg = load_config("t5_small_spans", ("n_vocab=260",))[0]
    with pytest.raises(ConfigError, match=r"^n_vocab: 260 is below 265 \(256 bytes \+ <\|endoftext\|>, "
                                          r"<\|padding\|> and 7 more: <extra_id_0> .. <extra_id_6>\)$"):
        config_for_data(cfg, texts)
    train_bpe([" ".join(WORDS)] * 3, 280).save(str(tmp_path / "tok.json"))  # no [MASK]
    cfg = load_config("bert_mlm", (f"tokenizer_path={tmp_path / 'tok.json'}",))[0]
    with pytest.raises(ConfigError, match=r"^mlm_mask_token_id: not set, and the tokenizer has no \[MASK\]"):
        config_for_data(cfg, texts)
    assert not os.path.exists(work_root / "data_cache")


def test_a_write_failure_while_preparing_is_one_line(tmp_path, work_root, capsys, monkeypatch):
    from data import make_dataset as module

    def full_disk(target, build, message="", done=None):
        raise OSError(28, "No space left on device", f"{target}.tmp-1/train_00000.tfrecords")

    monkeypatch.setattr("data.prepare.build_once", full_disk)
    out = tmp_path / "out"
    assert module.main(["--input", str(write_texts(tmp_path / "texts", 2)), "--output-dir", str(out)]) == 2
    assert capsys.readouterr().err == f"error: {out}.tmp-1/train_00000.tfrecords: No space left on device\n"


def test_a_sentencepiece_model_is_refused_before_preparing(tmp_path, work_root, capsys, monkeypatch):
    """A folder prepared with a SentencePiece model (a T5 checkpoint with only spiece.model, through --init-from)
    recorded its tokenizer as "bytes", and the run read its ids as bytes. It is one line naming the model."""
    from data import make_dataset as module
    from data.tokenizer import SentencePieceTokenizer

    spiece = object.__new__(SentencePieceTokenizer)  # as loaded from a spiece.model (the package is optional)
    spiece.vocab_size, spiece.eos_id, spiece.padding_id = 400, 1, 0
    monkeypatch.setattr("data.tokenizer.load_tokenizer", lambda path, where=None: spiece)
    out = tmp_path / "out"
    assert module.main(["--input", str(write_texts(tmp_path / "texts", 2)), "--output-dir", str(out), "--tokenizer",
                        "t5/spiece.model"]) == 2
    assert capsys.readouterr().err == ("error: --tokenizer t5/spiece.model: a SentencePieceTokenizer cannot prepare "
                                       "text here; give a tokenizer.json (transformers' tokenizer.save_pretrained "
                                       "writes one) or the byte tokenizer\n")
    assert not out.exists()


def test_make_dataset_for_a_config_trains_its_objectives_tokens(tmp_path, work_root, capsys):
    from data.make_dataset import main
    from data.tokenizer import load_tokenizer

    texts = str(write_texts(tmp_path / "texts", 20))
    assert main(["--input", texts, "--config", "bert_mlm", "--vocab-size", "300", "--n-ctx", "32",
                 "--workers", "1"]) == 0
    out = capsys.readouterr().out
    folder = re.search(r"--config bert_mlm --data (\S+)", out).group(1)
    assert load_tokenizer(os.path.join(folder, "tokenizer.json")).token_id("[MASK]") is not None
    assert main(["--input", texts, "--config", "bert_code_tags"]) == 2
    assert capsys.readouterr().err.startswith("error: --config bert_code_tags: plain text cannot feed task "
                                              "token_classification")
    assert main(["--input", texts, "--config", "bert_mlm", "--tokenizer", os.path.join(folder, "tokenizer.json"),
                 "--n-ctx", "32", "--output-dir", str(tmp_path / "again")]) == 0  # a reused one holds [MASK]
    assert main(["--input", texts, "--config", "bert_mlm", "--tokenizer", "bytes"]) == 2
    assert capsys.readouterr().err.startswith("error: mlm_mask_token_id: not set, and the tokenizer has no [MASK]")
    assert main(["--input", texts, "--tokenizer", str(tmp_path / "nope")]) == 2  # named as the flag, not the key
    assert capsys.readouterr().err.startswith(f"error: --tokenizer: '{tmp_path / 'nope'}' does not exist")
    assert main(["--input", texts, "--config", "bert_mlm", "--tokenizer", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.startswith(f"error: --tokenizer: '{tmp_path / 'nope'}' does not exist")


def test_sizes_are_printed_in_a_unit_that_shows_them():
    from neomesh.units import human_bytes

    assert [human_bytes(n) for n in (812, 35_150, 1_234_567, 2.5e9)] == ["812 B", "35.1 kB", "1.23 MB", "2.5 GB"]


def bad_folder(tmp_path):
    """25 good documents, a file that is not UTF-8, an empty file and one of whitespace only."""
    texts = write_texts(tmp_path / "texts", 25)
    (texts / "bad.txt").write_bytes("café".encode("latin-1"))
    (texts / "empty.txt").write_text("")
    (texts / "blank.txt").write_text("  \n\n")
    return texts


def test_a_bad_file_stops_make_dataset_naming_it_or_is_skipped_with_a_warning(tmp_path, work_root, capsys):
    """One file that is not UTF-8 stopped the whole folder, and the error did not say how to go on without it.
    Empty and whitespace-only .txt files counted (and were written) as documents."""
    from data.make_dataset import main

    texts, out = bad_folder(tmp_path), tmp_path / "out"
    base = ["--input", str(texts), "--vocab-size", "300", "--n-ctx", "32", "--workers", "1", "--output-dir", str(out)]
    error = f"error: {texts / 'bad.txt'}: not UTF-8 text (byte offset 3: 0xe9); --skip-bad-files skips such files\n"
    warning = f"data: warning: {texts / 'bad.txt'}: not UTF-8 text (byte offset 3: 0xe9); skipped (--skip-bad-files)"
    assert main(base) == 2
    assert capsys.readouterr().err == error and not out.exists()

    assert main(base + ["--skip-bad-files"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if "warning" in line or "bad.txt" in line] == [warning]
    used = sum(os.path.getsize(f) for f in texts.iterdir() if f.name != "bad.txt")  # about 7 kB: "0.0 MB" it said
    assert f"data: 28 files (1 bad, skipped; 2 with no text), 25 documents, {used / 1e3:.3g} kB; eval: " \
        in "\n".join(lines)
    assert any(line.startswith("data: train ") and line.endswith(", 1 bad file skipped") for line in lines)
    with open(out / "DONE") as f:
        done = json.load(f)
    assert done["totals"]["train"]["documents"] + done["totals"]["eval"]["documents"] == 25  # none empty
    assert done["skipped"] == [{"file": str(texts / "bad.txt"),
                                "error": f"{texts / 'bad.txt'}: not UTF-8 text (byte offset 3: 0xe9)"}]
    eos = json.loads((out / "dataset.json").read_text())["eos_id"]
    assert sum(t == eos for r in records(str(out / "*.tfrecords")) for t in r) == 25  # one per document written

    # Found again: without the flag the bad file is the same error, with it the same warning.
    assert main(base) == 2 and capsys.readouterr().err == error
    assert main(base + ["--skip-bad-files"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [warning, f"data: reusing {out} (prepared from the same files and settings; 1 bad file "
                                  "skipped)"]


def test_every_file_bad_is_an_error_with_skip_bad_files(tmp_path, work_root, capsys):
    from data.make_dataset import main

    texts = bad_folder(tmp_path)
    assert main(["--input", str(texts / "bad.txt"), "--skip-bad-files", "--output-dir", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == (f"error: --input {texts / 'bad.txt'}: every file is bad (1 skipped); the "
                                       f"first: {texts / 'bad.txt'}: not UTF-8 text (byte offset 3: 0xe9)\n")
    assert main(["--input", str(texts / "bad.txt"), str(texts / "blank.txt"), "--skip-bad-files"]) == 2
    assert capsys.readouterr().err.endswith(": no text to train on (1 bad file skipped)\n")
    assert not os.path.exists(tmp_path / "o") and os.listdir(work_root / "data_cache") == []


def test_an_unreadable_file_is_a_bad_file(tmp_path, work_root, capsys, monkeypatch):
    """A file without read permission (patched: the tests may run as root) was a bare OSError, never skippable."""
    import builtins

    from data.make_dataset import main

    texts = write_texts(tmp_path / "texts", 25)
    locked, real_open = str(texts / "003.txt"), builtins.open

    def no_permission(file, *args, **kwargs):
        if file == locked:
            raise PermissionError(13, "Permission denied", file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_permission)
    base = ["--input", str(texts), "--vocab-size", "300", "--n-ctx", "32", "--workers", "1"]
    assert main(base) == 2
    assert capsys.readouterr().err == (f"error: {locked}: cannot be read (Permission denied); --skip-bad-files "
                                       "skips such files\n")
    assert main(base + ["--skip-bad-files"]) == 0
    out = capsys.readouterr().out
    assert f"data: warning: {locked}: cannot be read (Permission denied); skipped" in out
    assert "data: 25 files (1 bad, skipped), 24 documents" in out


def test_train_data_takes_skip_bad_files(tmp_path, work_root, capsys):
    """train.py --data prepares through make_dataset: the same error naming the flag, and the same flag."""
    import train

    texts = bad_folder(tmp_path)
    sets = ["--set", "n_vocab=300", "--set", "n_ctx=32", "--set", "train_batch_size=4", "--set", "eval_batch_size=4"]
    assert train.main(["--data", str(texts), "--check-dataset"] + sets) == 2
    assert capsys.readouterr().err == (f"error: {texts / 'bad.txt'}: not UTF-8 text (byte offset 3: 0xe9); "
                                       "--skip-bad-files skips such files\n")
    assert train.main(["--data", str(texts), "--skip-bad-files", "--check-dataset"] + sets) == 0
    out = capsys.readouterr().out
    assert f"data: warning: {texts / 'bad.txt'}: not UTF-8 text" in out and "(1 bad, skipped; 2 with no text)" in out
    with pytest.raises(SystemExit):
        train.parse_args(["--config", "quickstart", "--skip-bad-files"])
    assert ": --skip-bad-files: only with --data (" in capsys.readouterr().err


def test_a_run_going_on_prepares_new_text_with_its_own_tokenizer(tmp_path, work_root, capsys):
    """train.py --data on changed text, resuming a run, trained a new BPE and kept training on ids that named other
    tokens (and replaced the run's tokenizer.json). It reads the text with the run's own tokenizer, says so, and
    finds its first run's copy of unchanged text; --new trains a fresh one."""
    import train
    from data.tokenizer import load_tokenizer, tokenizer_hash

    texts = write_texts(tmp_path / "texts", 24)
    sets = ["--set", "n_vocab=300", "--set", "n_ctx=32", "--set", "train_batch_size=4", "--set", "eval_batch_size=4"]
    assert train.main(["--data", str(texts), "--check-dataset"] + sets) == 0
    assert "training a 300-token byte-level BPE" in capsys.readouterr().out
    first, = glob.glob(str(work_root / "data_cache" / "texts-*"))
    run = tmp_path / "run"
    (run / "checkpoints" / "4" / "config").mkdir(parents=True)
    (run / "checkpoints" / "4" / "config" / "metadata").write_text(json.dumps({"n_vocab": 300}))
    shutil.copytree(first, run / "tokenizer")
    own = tokenizer_hash(load_tokenizer(str(run / "tokenizer")))

    more = shutil.copytree(texts, tmp_path / "more")
    (more / "new.txt").write_text("a new file " * 200)
    assert train.main(["--data", str(more), "--model-path", str(run), "--check-dataset"] + sets) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"note: --data: the text is prepared with the run's own tokenizer ({run}/tokenizer), "
                          f"whose ids {run}'s weights learned (--new starts a fresh run with a new one)\n"), out
    assert f"first use: preparing {work_root}/data_cache/more-" in out and "training a" not in out
    prepared, = glob.glob(str(work_root / "data_cache" / "more-*"))
    assert tokenizer_hash(load_tokenizer(os.path.join(prepared, "tokenizer.json"))) == own
    held = {folder: set(re.findall(r"doc\d+", load_tokenizer(os.path.join(folder, "tokenizer.json")).decode(
        sum(records(os.path.join(folder, "eval_*.tfrecords")), [])))) for folder in (first, prepared)}
    assert held[prepared] <= held[first]  # the run going on finds none of the text it trained on in eval
    assert train.main(["--data", str(texts), "--model-path", str(run), "--check-dataset"] + sets) == 0
    assert f"data: reusing {first} (prepared" in capsys.readouterr().out
    assert train.main(["--data", str(more), "--model-path", str(run), "--new", "--check-dataset"] + sets) == 0
    out = capsys.readouterr().out
    assert "note: --data" not in out and "training a 300-token byte-level BPE" in out


def test_a_run_that_read_bytes_goes_on_reading_bytes(tmp_path, work_root, capsys):
    """A run that read its text with the byte tokenizer saves no tokenizer/: train.py --data going on with it
    trained a BPE, and the weights learned on bytes went on with BPE ids. It prepares the text as bytes, whether
    the run's config named them or its dataset did."""
    import train

    texts = write_texts(tmp_path / "texts", 24)
    sets = ["--set", "n_vocab=300", "--set", "n_ctx=32", "--set", "train_batch_size=4", "--set", "eval_batch_size=4"]
    run = tmp_path / "run"
    (run / "checkpoints" / "4" / "config").mkdir(parents=True)
    (run / "checkpoints" / "4" / "config" / "metadata").write_text(json.dumps({"tokenizer_path": "bytes"}))
    assert train.main(["--data", str(texts), "--model-path", str(run), "--check-dataset"] + sets) == 0
    out = capsys.readouterr().out
    assert out.startswith("note: --data: the text is prepared with the run's own tokenizer (bytes)"), out
    assert "training a" not in out
    assert "note: the eval split holds " in out  # --check-dataset gives the note train.py gives at start
    prepared, = glob.glob(str(work_root / "data_cache" / "texts-*"))
    assert json.load(open(os.path.join(prepared, "dataset.json")))["tokenizer_path"] == "bytes"

    from training.run_tokenizer import read_bytes

    datasets = [[os.path.join(prepared, "dataset.json"), None, None, None]]
    (run / "checkpoints" / "4" / "config" / "metadata").write_text(json.dumps({"datasets": datasets}))
    assert read_bytes(str(run))
    bpe = make_dataset([str(texts)], vocab_size=300, n_ctx=32, workers=1)
    datasets = [[os.path.join(bpe, "dataset.json"), None, None, None]]
    (run / "checkpoints" / "4" / "config" / "metadata").write_text(json.dumps({"datasets": datasets}))
    assert not read_bytes(str(run))


def test_a_run_going_on_notes_data_read_with_another_tokenizer(tmp_path, work_root, capsys):
    """A prepared folder keeps its own ids, and a tokenizer_path the config names prepares the text: each is a note
    where it is not the run's own tokenizer."""
    from training.run_tokenizer import tokenizer_of_run_for_data

    one = make_dataset([str(write_texts(tmp_path / "one", 24))], vocab_size=300, n_ctx=32, workers=1)
    two = make_dataset([str(write_texts(tmp_path / "two", 24, seed=1))], vocab_size=300, n_ctx=32, workers=1)
    run = tmp_path / "run"
    (run / "checkpoints" / "4" / "config").mkdir(parents=True)
    (run / "checkpoints" / "4" / "config" / "metadata").write_text("{}")
    shutil.copytree(one, run / "tokenizer")
    capsys.readouterr()
    cfg = tiny_config(n_vocab=300)
    assert tokenizer_of_run_for_data(cfg, str(run), [two]) is None
    assert tokenizer_of_run_for_data(cfg.replace(tokenizer_path=f"{two}/tokenizer.json"), str(run), ["t"]) is None
    assert tokenizer_of_run_for_data(cfg, str(run), [one]) is None
    assert capsys.readouterr().out == (
        f"note: --data {two}/dataset.json: holds the ids of its own tokenizer ({two}/tokenizer.json), not those of "
        f"the run's ({run}/tokenizer), which {run}'s weights learned; --data TEXT prepares text with the run's\n"
        f"note: tokenizer_path: {two}/tokenizer.json prepares the text, not the run's own tokenizer "
        f"({run}/tokenizer), whose ids {run}'s weights learned\n")
    assert tokenizer_of_run_for_data(cfg, str(tmp_path / "new"), ["t"]) is None  # no run there: a new BPE
    # The cache key holds the tokenizer's content: another of the same size prepares another folder.
    texts = str(tmp_path / "one")
    assert make_dataset([texts], tokenizer=f"{one}/tokenizer.json", n_ctx=32, workers=1) != \
        make_dataset([texts], tokenizer=f"{two}/tokenizer.json", n_ctx=32, workers=1)


def test_the_train_command_printed_at_the_end_pastes_into_a_shell(tmp_path, work_root, capsys):
    """An output folder with a space in its name printed `--data /x/my data`, which a shell reads as two paths."""
    import shlex

    from data.make_dataset import main

    out = tmp_path / "my data"
    assert main(["--input", str(write_texts(tmp_path / "texts", 2)), "--vocab-size", "300", "--n-ctx", "16",
                 "--workers", "1", "--output-dir", str(out)]) == 0
    command = capsys.readouterr().out.strip().splitlines()[-1].split("train on it with: ", 1)[1]
    assert shlex.split(command)[-2:] == ["--data", str(out)]
