"""Bad data is never silent: each case is a one-line error naming the file (and record or offset)."""

import json
import os
import struct
import subprocess
import sys

import pytest

import train
from config import ConfigError
from data.source import make_source
from data.tfrecords import DataError
from tests.common import ROOT
from tests.data_common import config, synthetic_docs, take, use_dataset_configs, write_tf_records


def record_offsets(path):
    """Byte offset of each record: 8-byte length, 4-byte length CRC, data, 4-byte data CRC."""
    data, offsets, at = open(path, "rb").read(), [], 0
    while at < len(data):
        offsets.append(at)
        at += 16 + struct.unpack("<Q", data[at:at + 8])[0]
    return offsets


@pytest.fixture
def records(tmp_path, monkeypatch):
    """Six good records in one file and a dataset config 'bad' pointing at it."""
    path = write_tf_records(str(tmp_path / "bad_0.tfrecords"), synthetic_docs([30] * 6))
    use_dataset_configs(monkeypatch, tmp_path / "dc", bad={"path": str(tmp_path / "bad_*.tfrecords"),
                                                           "tokenizer_path": "bytes"})
    return path


def first_batches(n_vocab=1_000_000):
    return take(make_source(config([["bad", None, None, None]], 16, n_vocab=n_vocab), "train"), 4)


def test_good_records_read(records):
    assert first_batches().shape == (32, 17)


def test_corrupt_record_names_file_record_and_offset(records):
    offset = record_offsets(records)[2]
    data = bytearray(open(records, "rb").read())
    data[offset + 20] ^= 0xFF  # a byte inside record 2's payload: its CRC no longer matches
    open(records, "wb").write(data)
    with pytest.raises(DataError) as e:
        first_batches()
    # TensorFlow reports the offset of the record's payload, 12 bytes (length and its CRC) after its start.
    assert str(e.value) == f"{records}: record 2 at byte offset {offset + 12} is corrupt (CRC mismatch)"


def test_truncated_file_names_the_record(records):
    offset = record_offsets(records)[4]
    data = open(records, "rb").read()
    open(records, "wb").write(data[:offset + 30])
    with pytest.raises(DataError, match=rf"^{records}: record 4 .*is truncated$"):
        first_batches()


def test_a_file_cut_short_since_its_index_was_written_is_named_at_start(tmp_path, monkeypatch):
    """Its index records each file's size: the cut is found before any batch, not when the reader reaches it."""
    from data.create_tfrecords import write_file, write_index
    from data.tokenizer import ByteTokenizer

    tokenizer, path = ByteTokenizer(), str(tmp_path / "cut_00000.tfrecords")
    counts = write_file(["some text " * 50] * 20, tokenizer, path, "chunks", 17)
    write_index(str(tmp_path / "cut.index"), [counts], tokenizer, "bytes", "chunks", 17)
    use_dataset_configs(monkeypatch, tmp_path / "dc", cut={"path": str(tmp_path / "cut_*.tfrecords"),
                                                           "tokenizer_path": "bytes"})
    make_source(config([["cut", None, None, None]]), "train")
    size = os.path.getsize(path)
    os.truncate(path, size - 100)
    with pytest.raises(DataError) as e:
        make_source(config([["cut", None, None, None]]), "train")
    assert str(e.value) == (f"{path}: {size - 100:,} bytes, but {tmp_path}/cut.index says it was written with "
                            f"{size:,} (cut short or replaced since); write it again")


def two_bpes_of_one_size(tmp_path):
    """Two BPE tokenizer.json files of 270 tokens each, trained on different text: the same size, other ids."""
    from data.tokenizer import train_bpe

    paths = []
    for name, text in (("one", "hello world foo bar baz"), ("two", "qux quux corge grault")):
        tokenizer = train_bpe([text] * 5, 270, 1)
        assert tokenizer.vocab_size == 270
        paths.append(str(tmp_path / f"{name}.json"))
        tokenizer.save(paths[-1])
    return paths


def test_mixed_datasets_with_two_tokenizers_of_one_size_are_refused(tmp_path, monkeypatch):
    """Only sizes were compared: two BPEs of one size mixed silently, one id naming two tokens."""
    one, two = two_bpes_of_one_size(tmp_path)
    use_dataset_configs(monkeypatch, tmp_path / "dc",
                        a={"path": str(tmp_path / "a_*.tfrecords"), "tokenizer_path": one},
                        b={"path": str(tmp_path / "b_*.tfrecords"), "tokenizer_path": two},
                        c={"path": str(tmp_path / "c_*.tfrecords"), "tokenizer_path": one})
    with pytest.raises(ConfigError) as e:
        make_source(config([["a", None, None, 1.0], ["c", None, None, 1.0], ["b", None, None, 1.0]]), "train")
    assert str(e.value) == (f"datasets: the mixed datasets use different tokenizers of the same size 270: "
                            f"configs/dataset_configs/a.json reads with {one}, configs/dataset_configs/b.json with "
                            f"{two}, whose vocabularies differ; mixed datasets must share one tokenizer")


def test_an_index_names_records_written_with_another_tokenizer_of_the_same_size(tmp_path, monkeypatch):
    """The index recorded only the tokenizer's size: a dataset config naming another BPE of that size passed.
    An index written before it recorded the tokenizer's hash is still read, on its size alone."""
    from data.create_tfrecords import write_file, write_index
    from data.tokenizer import load_tokenizer

    one, two = two_bpes_of_one_size(tmp_path)
    path = str(tmp_path / "text_00000.tfrecords")
    counts = write_file(["hello world " * 20] * 4, load_tokenizer(one), path, "chunks", 17)
    index = write_index(str(tmp_path / "text.index"), [counts], load_tokenizer(one), "one.json", "chunks", 17)
    use_dataset_configs(monkeypatch, tmp_path / "dc", same={"path": str(tmp_path / "text_*.tfrecords"),
                                                            "tokenizer_path": one},
                        other={"path": str(tmp_path / "text_*.tfrecords"), "tokenizer_path": two})
    make_source(config([["same", None, None, None]]), "train")
    with pytest.raises(DataError) as e:
        make_source(config([["other", None, None, None]]), "train")
    assert str(e.value) == (f"{tmp_path}/text.index: text_00000.tfrecords was written with another tokenizer than "
                            "the one configs/dataset_configs/other.json names (both of 270 tokens, but other "
                            "vocabularies: its ids would name other tokens)")
    del index["tokenizer_hash"]  # as older indexes were written
    (tmp_path / "text.index").write_text(json.dumps(index))
    make_source(config([["other", None, None, None]]), "train")


def test_a_tokenizer_hash_does_not_depend_on_how_its_file_writes_merges(tmp_path):
    """tokenizers 0.20 began to write merges as ["a", "b"] pairs, earlier versions as "a b": a file of either layout
    gives one hash (it is taken from the loaded tokenizer, not the file), so an index written before an upgrade
    still names the same tokenizer; another vocabulary does not."""
    from tokenizers import Tokenizer

    from data.tokenizer import HFTokenizer, load_tokenizer, tokenizer_hash

    one, two = two_bpes_of_one_size(tmp_path)
    saved = json.loads(open(one).read())
    merges = saved["model"]["merges"]
    assert merges and all(isinstance(m, list) for m in merges)
    saved["model"]["merges"] = [" ".join(m) for m in merges]  # the older layout
    older = HFTokenizer(Tokenizer.from_str(json.dumps(saved)), "older")
    assert tokenizer_hash(older) == tokenizer_hash(load_tokenizer(one)) != tokenizer_hash(load_tokenizer(two))


def test_token_id_outside_n_vocab_names_the_record(records):
    with pytest.raises(DataError) as e:
        first_batches(n_vocab=3500)  # documents 3.. hold ids 3000+, 4000+, ...
    assert str(e.value) == f"{records}: record 3: token id 4000 is outside [0, n_vocab=3500)"
    assert "\n" not in str(e.value)


def test_missing_and_empty_globs(tmp_path, monkeypatch):
    open(tmp_path / "empty_0.tfrecords", "wb").close()
    use_dataset_configs(monkeypatch, tmp_path / "dc", gone={"path": str(tmp_path / "gone_*.tfrecords")},
                        empty={"path": str(tmp_path / "empty_*.tfrecords")},
                        noeval={"path": str(tmp_path / "empty_*.tfrecords")})
    with pytest.raises(DataError, match=rf"^configs/dataset_configs/gone.json path: {tmp_path}/gone_\*.tfrecords "
                                        "matches no file$"):
        make_source(config([["gone", None, None, None]]), "train")
    with pytest.raises(DataError, match=rf"^{tmp_path}/empty_0.tfrecords: empty file \(0 bytes\)"):
        make_source(config([["empty", None, None, None]]), "train")
    with pytest.raises(ConfigError, match="noeval.json: no 'eval_path' for evaluation"):
        make_source(config([["noeval", None, None, None]]), "eval")


def test_tokenizer_and_vocab_size_mismatches(records, tmp_path, monkeypatch):
    with open(tmp_path / "bad.index", "w") as f:  # as create_tfrecords writes it, for a 300-token BPE
        json.dump({"vocab_size": 300, "eos_id": 0, "files": [{"file": "bad_0.tfrecords", "documents": 6,
                                                              "records": 6, "tokens": 186, "bytes": 0}]}, f)
    with pytest.raises(DataError, match=r"bad.index: bad_0.tfrecords was written with a 300-token tokenizer but "
                                        r"configs/dataset_configs/bad.json names one with 257 tokens"):
        first_batches()
    (tmp_path / "unindexed").mkdir()
    plain = write_tf_records(str(tmp_path / "unindexed" / "plain_0.tfrecords"), synthetic_docs([30] * 6))
    use_dataset_configs(monkeypatch, tmp_path / "dc", neo={"path": records, "tokenizer_path": "bytes",
                                                           "n_vocab": 256},
                        padded={"path": plain, "tokenizer_path": "bytes", "n_vocab": 50257})
    with pytest.raises(ConfigError, match=r"neo.json: n_vocab 256 is smaller than the 257 tokens of its tokenizer "
                                          r"bytes; set it to at least 257 \(more leaves padding rows\)"):
        make_source(config([["neo", None, None, None]]), "train")
    assert make_source(config([["padded", None, None, None]]), "train").tokenizer.vocab_size == 257
    with pytest.raises(ConfigError, match=r"^n_vocab: 200 is smaller than the 257 tokens"):
        make_source(config([["bad", None, None, None]], n_vocab=200), "train")


def test_bad_dataset_entries(records):
    with pytest.raises(ConfigError, match="stitch 4 has no effect in sampling_mode 'chunks'"):
        make_source(config([["bad", 4, None, None]]), "train")
    with pytest.raises(ConfigError, match="sampling_mode 'documents' is not one of"):
        make_source(config([["bad", None, "documents", None]]), "train")
    with pytest.raises(ConfigError, match="weight -1 must be a positive number"):
        make_source(config([["bad", None, None, -1]]), "train")


def test_a_datasets_entry_that_is_not_a_dataset_config_says_what_it_is(tmp_path, monkeypatch):
    """Text, TFRecords or a model config named in datasets got 'no dataset config
    configs/dataset_configs/NAME.json' (or a model config's first key as unknown)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text("some text")
    (tmp_path / "x_00000.tfrecords").write_bytes(b"")
    (tmp_path / "mine.json").write_text(json.dumps({"n_layer": 2, "n_embd": 64}))
    for name, message in [("texts", "datasets: texts is not a dataset config; to train on text, give it as --data "
                                    "texts"),
                          ("texts/a.txt", "give it as --data texts/a.txt"),
                          ("x_00000.tfrecords", "datasets: x_00000.tfrecords is TFRecords, not a dataset config: "
                                                "name them in a dataset config's path"),
                          ("mine.json", "mine.json: a model config, not a dataset config (it has 'n_embd'); give it "
                                        "as --config mine.json")]:
        with pytest.raises(ConfigError) as e:
            make_source(config([[name, None, None, None]]), "train")
        assert message in str(e.value), str(e.value)


def test_check_dataset_cli_prints_or_fails_in_one_line(records, capsys):
    args = ["--config", os.path.join(ROOT, "configs/quickstart.json"), "--check-dataset", "--set",
            'datasets=[["bad", null, null, null]]', "--set", "n_vocab=1000000", "--set", "n_ctx=16"]
    # The eval split is checked too, as train.py reads it at start: 'bad' has no eval_path (the check passed, and
    # then train.py stopped on it).
    assert train.main(args) == 2
    captured = capsys.readouterr()
    assert "batch 0: shape (16, 17) int32; token ids min 1 max 6029" in captured.out
    assert captured.err == ("error: configs/dataset_configs/bad.json: no 'eval_path' for evaluation; add one or "
                            "set eval_steps to 0\n")
    assert train.main(args + ["--set", "eval_steps=0"]) == 0
    out = capsys.readouterr().out
    assert "batch 0: shape (16, 17) int32; token ids min 1 max 6029" in out and "first text (" in out
    assert out.endswith("eval: none (eval_steps 0)\n")
    args += ["--set", "eval_steps=0"]
    data = bytearray(open(records, "rb").read())
    data[record_offsets(records)[1] + 20] ^= 0xFF
    open(records, "wb").write(data)
    assert train.main(args) == 2
    err = capsys.readouterr().err
    assert err == f"error: {records}: record 1 at byte offset {record_offsets(records)[1] + 12} is corrupt (CRC " \
                  "mismatch)\n"


def test_everything_but_the_tfrecord_path_runs_without_tensorflow():
    code = """
import sys
sys.modules["tensorflow"] = None  # importing it now raises ImportError, as where it is not installed
import train, models.gpt_neo, models.registry, parallel.steps, training.objectives, convert.hf, pretrained, data.source
from config import ConfigError
from tests.common import tiny_config
cfg = tiny_config(n_vocab=257, datasets=[["embedded", None, None, None]])
assert data.source.make_source(cfg, "train").batch(3, 2).shape == (2, 33)
try:
    data.source.make_source(tiny_config(n_vocab=1024, datasets=[["embedded_bpe", None, None, None]]), "train")
except ConfigError as e:
    print("ERROR", e)
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ERROR datasets: TFRecord and TFDS data need TensorFlow (pip install tensorflow-cpu==2.21.0)" \
        in result.stdout


def test_mlm_training_needs_a_bidirectional_model_and_a_mask_token(capsys, tmp_path):
    base = ["--config", os.path.join(ROOT, "configs/quickstart.json"), "--set", "mlm_training=true",
            "--model-path", str(tmp_path / "run")]
    assert train.main(base) == 2
    assert capsys.readouterr().err == ("error: causal: a masked_lm model must see both sides of a mask; set causal "
                                       "false\n")
    assert train.main(base + ["--set", "causal=false"]) == 2  # the quickstart's BPE has no [MASK] or <mask>
    assert capsys.readouterr().err.startswith("error: mlm_mask_token_id: not set, and the tokenizer ")


@pytest.mark.parametrize("kind", ["sequence_labels", "token_labels", "seq2seq", "images"])
def test_check_dataset_shows_every_kind_of_batch(kind, monkeypatch, capsys):
    """--check-dataset of bert_classify, bert_code_tags, t5_small_spans and vit_digits stopped with KeyError 'mask'
    (every dict batch was taken for a masked-LM one)."""
    import types

    import numpy as np

    from data import check
    from data.tokenizer import load_tokenizer
    from tests.common import tiny_config

    tok = load_tokenizer("bytes")
    ids = np.array([[tok.eos_id, *b"def f", tok.eos_id, 0]], np.int32)  # (1, 8)
    real = (np.arange(8) < 7).astype(np.int32)[None]
    batches = {
        "sequence_labels": {"inputs": ids, "segment_ids": real, "labels": np.array([1], np.int32),
                            "weights": np.ones(1, np.float32)},
        "token_labels": {"inputs": ids, "segment_ids": real,
                         "labels": np.array([[-1, 0, -1, -1, 2, 1, -1, -1]], np.int32)},
        "seq2seq": {"inputs": ids, "segment_ids": real, "targets": ids[:, ::-1].copy(),
                    "target_segment_ids": real[:, ::-1].copy()},
        "images": {"images": np.zeros((2, 4, 4, 1), np.float32), "labels": np.array([3, 3], np.int32),
                   "weights": np.ones(2, np.float32)}}
    source = types.SimpleNamespace(batch=lambda step, size: batches[kind], tokenizer=tok, description="train: x",
                                   label_names=["keyword", "name", "operator"])
    monkeypatch.setattr("data.source.make_source", lambda cfg, split: source)
    check.check_dataset(tiny_config(n_vocab=300), batch_size=1)
    out = capsys.readouterr().out
    assert out.startswith("train: x\nbatch 0: ")
    assert {"sequence_labels": "first example (label 1: name):\ndef f",
            "token_labels": "its labelled tokens: 'd'/keyword ' '/operator 'f'/name",
            "seq2seq": "first targets:\n",
            "images": "per label: 3 2\nfirst image: label 3"}[kind] in out, out


def test_an_empty_eval_path_of_examples_is_no_eval_set_and_eval_then_names_it(tmp_path, monkeypatch, capsys):
    """Labelled, token-labelled and pair datasets take GPT-Neo's "eval_path": "" as records do (it was a glob that
    matched no file); train.py --eval with nothing to evaluate is one line (it wrote an empty eval row)."""
    from data.source import NoEvalSet

    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": t, "label": t, "inputs": t, "targets": t, "tokens": [t],
                                         "labels": [t]}) + "\n" for t in "xy"))
    use_dataset_configs(monkeypatch, tmp_path / "dc", ex={"path": str(texts), "eval_path": "",
                                                          "tokenizer_path": "bytes"})
    for task in (dict(task="sequence_classification", num_labels=2), dict(task="token_classification", num_labels=2),
                 dict(model="t5", task="seq2seq", span_corruption=False, attention_types=None)):
        cfg = config([["ex", None, None, None]], 16, n_vocab=257, causal=False, **task)
        assert len(make_source(cfg, "train")) == 2
        with pytest.raises(NoEvalSet, match=r"ex.json: eval_path is empty \(no eval set\)$"):
            make_source(cfg, "eval")
    run = ["--config", os.path.join(ROOT, "configs/quickstart.json"), "--model-path", str(tmp_path / "run"), "--eval"]
    (tmp_path / "run" / "checkpoints" / "4").mkdir(parents=True)  # said before the checkpoint is read
    assert train.main(run + ["--set", "eval_steps=0"]) == 2
    assert capsys.readouterr().err == ("error: --eval: nothing to evaluate: eval_steps is 0, and eval_tasks is empty; "
                                       "--set eval_steps=N with an eval set, or eval_tasks, names something\n")
    assert os.listdir(tmp_path / "run") == ["checkpoints"]  # nothing written


def test_a_dataset_config_that_is_not_a_json_object_or_misspells_a_key_is_one_line(tmp_path):
    from data.source import load_dataset_config

    (tmp_path / "listed.json").write_text('[["a", 1]]')  # unhashable keys: a traceback
    with pytest.raises(ConfigError, match=r'listed.json: a dataset config is a JSON object \(\{"path": ...\}\), not '
                                          r"a list$"):
        load_dataset_config(str(tmp_path / "listed.json"))
    (tmp_path / "typo.json").write_text('{"path": "x", "tokenizer_pth": "bytes"}')
    with pytest.raises(ConfigError, match=r"typo.json: unknown key 'tokenizer_pth'; did you mean 'tokenizer_path'\?$"):
        load_dataset_config(str(tmp_path / "typo.json"))


def test_a_token_stream_named_jsonl_examples_says_so(tmp_path, monkeypatch):
    """A causal LM pointed at a classifier's jsonl read it as TFRecords: 'record 0 ... is corrupt (CRC mismatch)'."""
    examples = tmp_path / "labelled.jsonl"
    examples.write_text('{"text": "a", "label": 0}\n')
    use_dataset_configs(monkeypatch, tmp_path / "dc", examples={"path": str(examples), "tokenizer_path": "bytes"})
    with pytest.raises(ConfigError, match=rf"^configs/dataset_configs/examples.json path: {examples} is jsonl, the "
                                          r"examples of a classifier or of seq2seq pairs; task causal_lm reads "
                                          r"TFRecords of tokens \(train.py --data FOLDER, or make_dataset.py"):
        make_source(config([["examples", None, None, None]], n_vocab=257), "train")


@pytest.mark.parametrize("key, value", [("shuffle_buffer", 0), ("shuffle_buffer", "big"), ("shuffle_buffer", 2.5),
                                        ("n_vocab", "4096"), ("eos_id", "0"), ("padding_id", -1)])
def test_a_dataset_configs_count_or_id_that_is_no_such_integer_is_one_line(tmp_path, key, value):
    """A shuffle_buffer of 0 or "big" was a TensorFlow traceback at the first batch; "eos_id": "0" was 'not the
    tokenizer's end-of-text id 0'."""
    from data.source import load_dataset_config

    (tmp_path / "bad.json").write_text(json.dumps({"path": "x_*.tfrecords", key: value}))
    with pytest.raises(ConfigError, match=rf"bad.json: {key} {json.dumps(value)} must be an integer of at least "
                                          r"[01] \(or null\)$"):
        load_dataset_config(str(tmp_path / "bad.json"))


def test_mixing_a_bytes_dataset_with_a_bpe_one_names_both(tmp_path, monkeypatch):
    """The error gave the two sizes alone, not which dataset read with which tokenizer."""
    one, _ = two_bpes_of_one_size(tmp_path)
    use_dataset_configs(monkeypatch, tmp_path / "dc", bpe={"path": str(tmp_path / "a_*.tfrecords"),
                                                           "tokenizer_path": one},
                        raw={"path": str(tmp_path / "b_*.tfrecords"), "tokenizer_path": "bytes"})
    with pytest.raises(ConfigError) as e:
        make_source(config([["bpe", None, None, None], ["raw", None, None, None]]), "train")
    assert str(e.value) == (f"datasets: the mixed datasets use tokenizers of different sizes: "
                            f"configs/dataset_configs/bpe.json reads with {one} (270 tokens), "
                            "configs/dataset_configs/raw.json with bytes (257); mixed datasets must share one "
                            "tokenizer")


def test_the_embedded_corpus_in_a_mixture_is_named_not_the_first_dataset(records, tmp_path, monkeypatch):
    """Mixed after a TFRecord dataset, the error called the first dataset 'the in-memory embedded corpus'."""
    use_dataset_configs(monkeypatch, tmp_path / "dc", embedded={"path": "embedded", "tokenizer_path": "bytes"})
    with pytest.raises(ConfigError, match=r"^datasets: configs/dataset_configs/embedded.json \(the in-memory"):
        make_source(config([["bad", None, None, None], ["embedded", None, None, None]]), "train")


@pytest.mark.parametrize("weight", [float("nan"), float("inf")])
def test_a_weight_that_is_not_finite_is_refused(records, weight):
    """JSON's NaN and Infinity passed the check, and the mixture silently drew nothing from that dataset."""
    with pytest.raises(ConfigError, match=f"datasets: bad: weight {weight} must be a positive number or null"):
        config([["bad", None, None, weight], ["bad", None, None, 1]])


def test_a_mistyped_dataset_config_name_suggests_the_closest(records):
    with pytest.raises(ConfigError, match=r"^datasets: no dataset config .*/bda.json; did you mean 'bad'\? \(known: "
                                          r"bad; or tfds:NAME"):
        make_source(config([["bda", None, None, None]]), "train")


@pytest.mark.parametrize("key, value, shown", [("mlm_mask_token_id", 300, "300"), ("mlm_cls_token_id", -1, "-1"),
                                               ("mlm_random_token_ids", [5, 257], "257")])
def test_mlm_ids_outside_the_vocabulary_are_refused(key, value, shown):
    """An id past n_vocab reached the embedding as a clamped row, silently."""
    with pytest.raises(ConfigError, match=rf"^{key}: {shown} is not a token id in \[0, n_vocab=257\)$"):
        config([["bad", None, None, None]], n_vocab=257, mlm_training=True, causal=False, **{key: value})
