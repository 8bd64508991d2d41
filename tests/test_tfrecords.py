"""create_tfrecords and reading back: no document or token lost, the index, GPT-Neo's format from TensorFlow's
own writer, and the full round trip text -> tokenizer -> TFRecords -> batches -> text."""

import json

import numpy as np
import pytest

from data.source import make_source
from data.tf_import import tensorflow
from data.tokenizer import load_tokenizer, train_bpe
from tests.common import run_cli, run_command
from tests.data_common import config, synthetic_docs, take, use_dataset_configs, write_tf_records

tf = tensorflow()  # as the data code imports it (quiet, without Keras)

DOCS = {  # short, empty and long documents: none may be dropped
    "a.jsonl": ["short", "", "x" * 3, "def long():\n    return 'a much longer document' * 3\n" * 4],
    "b.jsonl": ["Grüße 世界 😀", "another one\n\n"] + [f"doc {i} " * i for i in range(12)],
}


def read_records(path):
    parse = lambda r: tf.io.parse_single_example(r, {"text": tf.io.VarLenFeature(tf.int64)})["text"].values  # noqa
    return [list(parse(r).numpy()) for r in tf.data.TFRecordDataset(str(path))]


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    for name, texts in DOCS.items():
        (root / name).write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tok = train_bpe([t for texts in DOCS.values() for t in texts], 300, 1)
    tok.save(str(root / "tokenizer.json"))
    return root


@pytest.mark.parametrize("mode, workers", [("chunks", 2), ("documents", 1)])
def test_create_tfrecords_keeps_every_token_and_writes_the_index(corpus_dir, tmp_path, mode, workers):
    """With 2 workers the command runs as a user starts it (its worker processes); with 1, in this process."""
    out = tmp_path / "out"
    run, command = ((run_cli, ["data/create_tfrecords.py"]) if workers > 1 else
                    (run_command, ["-m", "data.create_tfrecords"]))
    result = run(*command, "--input", str(corpus_dir / "*.jsonl"), "--output-dir", str(out), "--name", "tiny",
                 "--tokenizer", str(corpus_dir / "tokenizer.json"), "--mode", mode, "--chunk-size", "7",
                 "--workers", str(workers))
    assert result.returncode == 0, result.stderr
    tok = load_tokenizer(str(corpus_dir / "tokenizer.json"))
    index = json.loads((out / "tiny.index").read_text())
    assert index["vocab_size"] == 300 and index["mode"] == mode and len(index["files"]) == 2
    for i, (name, texts) in enumerate(DOCS.items()):
        records = read_records(out / f"tiny_{i:05d}.tfrecords")
        expected = [ids + [tok.eos_id] for ids in tok.encode_batch(texts)]
        stream = [t for ids in expected for t in ids]
        assert [t for r in records for t in r] == stream  # every token, in order, documents separated by EOS
        if mode == "chunks":
            assert all(len(r) == 7 for r in records[:-1]) and 0 < len(records[-1]) <= 7
        else:
            assert records == expected  # one record per document, the empty one included
        entry = index["files"][i]
        assert (entry["documents"], entry["records"], entry["tokens"]) == (len(texts), len(records), len(stream))
    totals = index["totals"]
    assert f"{totals['documents']:,} documents, {totals['records']:,} records, {totals['tokens']:,} tokens" \
        in result.stdout


def test_round_trip_text_to_batches_to_text(corpus_dir, tmp_path, monkeypatch):
    out = tmp_path / "rt"
    written = run_command("-m", "data.create_tfrecords", "--input", str(corpus_dir / "b.jsonl"), "--output-dir",
                          str(out), "--name", "rt", "--tokenizer", str(corpus_dir / "tokenizer.json"), "--n-ctx", "8")
    assert written.returncode == 0, written.stderr
    use_dataset_configs(monkeypatch, tmp_path / "dc", rt={
        "path": str(out / "rt_*.tfrecords"), "eval_path": str(out / "rt_*.tfrecords"),
        "tokenizer_path": str(corpus_dir / "tokenizer.json"), "n_vocab": 300})
    source = make_source(config([["rt", None, None, None]], n_ctx=8, n_vocab=300), "eval")  # eval: file order
    windows = take(source, 4, batch_size=4)  # (16, 9)
    assert (windows[1:, 0] == windows[:-1, -1]).all()  # consecutive windows share one token
    text = source.tokenizer.decode(np.concatenate([windows[:1, 0], windows[:, 1:].ravel()]))
    assert "<|endoftext|>".join(DOCS["b.jsonl"]).startswith(text)
    assert len(text) > 60
    index = json.loads((out / "rt.index").read_text())["totals"]
    assert source.bytes_per_token == pytest.approx(index["bytes"] / index["tokens"])


def test_reads_tfrecords_written_by_tensorflow_in_gpt_neo_format(tmp_path, monkeypatch):
    docs = synthetic_docs([5, 40, 3, 17])
    stream = [t for d in docs for t in d]
    chunks = [stream[i:i + 9] for i in range(0, len(stream), 9)]  # GPT-Neo-style chunked records, no index
    write_tf_records(str(tmp_path / "neo_0.tfrecords"), chunks[:4])
    write_tf_records(str(tmp_path / "neo_1.tfrecords"), chunks[4:])
    use_dataset_configs(monkeypatch, tmp_path / "dc", neo={
        "path": str(tmp_path / "neo_*.tfrecords"), "eval_path": str(tmp_path / "neo_0.tfrecords"),
        "tokenizer_path": "bytes"})
    source = make_source(config([["neo", None, None, None]], n_ctx=8), "eval")
    got = take(source, 2, batch_size=2)  # (4, 9): the stream of file 0 (36 tokens) packed with stride 8
    expected = [stream[i * 8:i * 8 + 9] for i in range(4)]
    assert got.tolist() == expected
