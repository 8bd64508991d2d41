"""The data tools on bad input: a file that cannot be decoded is named in one line (exit 2) or, with
``--skip-bad-files``, left out and counted; a failure leaves no partial output; a truncated .jsonl.zst is an
error, never a silently shorter input. The tools run in-process through their ``main(argv)``."""

import json
import os
import re

import pytest
import zstandard

from data import create_tfrecords, train_tokenizer
from data.text_files import read_documents
from tests.common import run_cli

GOOD = [{"text": f"document {i}: " + "words and more words " * i} for i in range(30)]


def jsonl(docs) -> bytes:
    return "".join(json.dumps(d) + "\n" for d in docs).encode()


def zst(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


BAD = {  # file name -> (contents, what the one-line error says after the path)
    "latin1.txt": ("café".encode("latin-1"), r"not UTF-8 text \(byte offset 3: 0xe9\)"),
    "binary.txt": (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", r"binary data \(a NUL byte at byte offset 8\), not text"),
    "latin1.jsonl": (jsonl(GOOD[:2]) + b'{"text": "caf\xe9"}\n', r"not UTF-8 text \(line 3, byte offset \d+: 0xe9\)"),
    "corrupt.jsonl.zst": (b"(\xb5/\xfd" + bytes(range(256)) * 4, r"corrupt zstd data near compressed byte \d+"),
    "truncated.jsonl.zst": (zst(jsonl(GOOD))[:-12], r"truncated zstd data \(the stream ends inside a frame"),
    "empty.jsonl.zst": (b"", r"empty, not zstd data"),
}


@pytest.fixture
def inputs(tmp_path):
    directory = tmp_path / "in"
    directory.mkdir()
    (directory / "good.jsonl.zst").write_bytes(zst(jsonl(GOOD[:20])) + zst(jsonl(GOOD[20:])))  # two frames
    for name, (data, _) in BAD.items():
        (directory / name).write_bytes(data)
    return directory


def outputs(directory) -> list[str]:
    return sorted(os.listdir(directory)) if os.path.isdir(directory) else []


def test_a_multi_frame_zst_reads_every_document(inputs):
    assert [t for t in read_documents(str(inputs / "good.jsonl.zst"))] == [d["text"] for d in GOOD]


def test_a_byte_order_mark_is_no_part_of_the_text(tmp_path, capsys):
    """Windows editors start UTF-8 files with a BOM: a .jsonl was 'line 1 is not a JSON object' (labelled data,
    seq2seq pairs, token labels) or '... with a 'text' field' (make_dataset), and a .txt kept it as text. Every
    jsonl reader reads lines through one function that skips it."""
    from config import ConfigError
    from data.labelled import jsonl_objects
    from data.make_dataset import main as make_dataset_main

    bom = b"\xef\xbb\xbf"
    (tmp_path / "bom.jsonl").write_bytes(bom + jsonl(GOOD[:3]))
    (tmp_path / "bom.jsonl.zst").write_bytes(zst(bom + jsonl(GOOD[:3])))
    (tmp_path / "bom.txt").write_bytes(bom + b"plain text\n")
    for name in ("bom.jsonl", "bom.jsonl.zst"):
        assert list(read_documents(str(tmp_path / name))) == [d["text"] for d in GOOD[:3]], name
        assert [(row, place) for row, place in jsonl_objects(str(tmp_path / name), "path")] == [
            (d, f"{tmp_path / name}: line {i}") for i, d in enumerate(GOOD[:3], 1)]
    assert list(read_documents(str(tmp_path / "bom.txt"))) == ["plain text\n"]
    out = tmp_path / "out"
    assert make_dataset_main(["--input", str(tmp_path / "bom.jsonl"), "--output-dir", str(out), "--vocab-size",
                              "300", "--n-ctx", "16"]) == 0, capsys.readouterr().err
    (tmp_path / "late.jsonl").write_bytes(jsonl(GOOD[:1]) + bom + jsonl(GOOD[1:2]))  # mid-file: not a JSON line
    with pytest.raises(ConfigError, match=r"late.jsonl: line 2 is not a JSON object$"):
        list(jsonl_objects(str(tmp_path / "late.jsonl"), "path"))


def test_a_jsonl_line_without_a_text_field_names_the_fields_it_has(tmp_path):
    """A corpus whose documents are in "content" was 'line 1 is not a JSON object with a 'text' field', as if
    the file were broken."""
    from config import ConfigError

    (tmp_path / "content.jsonl").write_bytes(jsonl([{"content": "a document", "id": 1}]))
    with pytest.raises(ConfigError, match=r"content.jsonl: line 1 has no 'text' field \(it has 'content', 'id'\); a "
                                          r"line's document is its 'text', as in the Pile$"):
        list(read_documents(str(tmp_path / "content.jsonl")))


def test_a_file_named_by_two_patterns_is_read_once(tmp_path, capsys):
    """--input DIR 'DIR/a*.txt' read a.txt twice: its documents duplicated, one copy possibly in eval."""
    from data.text_files import expand_inputs

    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text(name)
    files = expand_inputs([str(tmp_path), str(tmp_path / "a*.txt"), str(tmp_path / "." / "b.txt")])
    assert files == [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    assert capsys.readouterr().err == (f"note: --input: 2 file(s) named more than once are read once (the first: "
                                       f"{tmp_path / 'a.txt'})\n")


def test_without_zstandard_a_zst_input_says_what_to_install(inputs, monkeypatch, capsys):
    """zstandard comes with the [data] extra; without it a .jsonl.zst input was an ImportError traceback."""
    monkeypatch.setitem(__import__("sys").modules, "zstandard", None)  # importing it raises ImportError
    path = inputs / "good.jsonl.zst"
    assert train_tokenizer.main(["--input", str(path), "--output-dir", str(inputs / "tok"), "--vocab-size", "300",
                                 "--skip-bad-files"]) == 2  # not a bad file: nothing to skip
    assert capsys.readouterr().err == (f"error: {path}: reading .zst files needs zstandard: pip install zstandard (or "
                                       "NeoMesh's [data] extra)\n")


@pytest.mark.parametrize("name", BAD)
def test_create_tfrecords_names_a_bad_file_in_one_line_and_leaves_nothing(inputs, tmp_path, capsys, name):
    out = tmp_path / "out"
    # The good file comes first and is written completely before the bad one fails.
    code = create_tfrecords.main(["--input", str(inputs / "good.jsonl.zst"), str(inputs / name), "--output-dir",
                                  str(out), "--name", "x", "--tokenizer", "bytes", "--workers", "1"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith(f"error: {inputs / name}: "), err
    assert re.search(BAD[name][1], err) and err.endswith("; --skip-bad-files skips such files\n"), err
    assert outputs(out) == []  # neither the good file's records, nor a partial file, nor an index


def test_create_tfrecords_skips_bad_files_and_counts_them(inputs, tmp_path, capsys):
    out = tmp_path / "out"
    code = create_tfrecords.main(["--input", str(inputs), "--output-dir", str(out), "--name", "x", "--tokenizer",
                                  "bytes", "--workers", "1", "--skip-bad-files"])
    stdout = capsys.readouterr().out
    assert code == 0
    index = json.loads((out / "x.index").read_text())
    good = sorted(os.listdir(inputs)).index("good.jsonl.zst")  # outputs are numbered by input
    assert outputs(out) == ["x.index", f"x_{good:05d}.tfrecords"]
    assert index["totals"]["documents"] == len(GOOD) and len(index["files"]) == 1
    assert sorted(os.path.basename(s["skipped"]) for s in index["skipped"]) == sorted(BAD)
    assert f"skipped {len(BAD)} bad input file(s) (" in stdout
    assert "no document or token of the other files was dropped" in stdout
    assert "; no document or token was dropped" not in stdout
    every_bad = create_tfrecords.main(["--input", str(inputs / "*.txt"), "--output-dir", str(tmp_path / "none"),
                                       "--name", "x", "--tokenizer", "bytes", "--workers", "1", "--skip-bad-files"])
    assert every_bad == 2 and capsys.readouterr().err.startswith("error: every input file is bad; the first: ")
    assert outputs(tmp_path / "none") == []


def test_a_failing_parallel_run_leaves_nothing(inputs, tmp_path):
    out = tmp_path / "out"
    result = run_cli("data/create_tfrecords.py", "--input", str(inputs / "good.jsonl.zst"),
                     str(inputs / "truncated.jsonl.zst"), "--output-dir", str(out), "--name", "x", "--tokenizer",
                     "bytes", "--workers", "2")
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith(f"error: {inputs / 'truncated.jsonl.zst'}: truncated zstd data")
    assert outputs(out) == []


def test_train_tokenizer_names_or_skips_bad_files(inputs, tmp_path, capsys):
    out = tmp_path / "tok"
    truncated = inputs / "truncated.jsonl.zst"
    base = ["--output-dir", str(out), "--vocab-size", "300"]
    assert train_tokenizer.main(["--input", str(inputs / "good.jsonl.zst"), str(truncated)] + base) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {truncated}: truncated zstd data"), err
    assert err.endswith("; --skip-bad-files skips such files\n"), err
    assert outputs(out) == []
    assert train_tokenizer.main(["--input", str(inputs)] + base + ["--skip-bad-files"]) == 0
    stdout = capsys.readouterr().out
    assert outputs(out) == ["tokenizer.json"] and f"skipped the rest of {len(BAD)} bad file(s) (" in stdout
    # What was read before a bad spot is used: the good file's documents and latin1.jsonl's first two.
    assert int(stdout.split("trained on ")[1].split()[0]) > len(GOOD)
    assert train_tokenizer.main(["--input", str(inputs / "*.txt")] + base + ["--skip-bad-files"]) == 2
    assert capsys.readouterr().err.startswith("error: --input: no document read from 2 file(s) (2 bad; the first: ")


def test_an_unwritable_output_is_one_line(inputs, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    code = create_tfrecords.main(["--input", str(inputs / "good.jsonl.zst"), "--output-dir", str(blocker / "out"),
                                  "--name", "x", "--tokenizer", "bytes", "--workers", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"error: {blocker / 'out'}: "), err
    code = train_tokenizer.main(["--input", str(inputs / "good.jsonl.zst"), "--output-dir", str(blocker),
                                 "--vocab-size", "300"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"error: {blocker}: "), err


def test_empty_text_is_refused_as_make_dataset_refuses_it(tmp_path, capsys):
    from data import make_dataset

    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("")
    (tmp_path / "empty" / "b.jsonl").write_text('{"text": ""}\n')
    for main, extra in ((train_tokenizer.main, ["--output-dir", str(tmp_path / "tok"), "--vocab-size", "300"]),
                        (make_dataset.main, ["--output-dir", str(tmp_path / "data")])):
        for given in (tmp_path / "empty" / "a.txt", tmp_path / "empty"):
            assert main(["--input", str(given)] + extra) == 2
            out, err = capsys.readouterr()
            assert err == f"error: --input {given}: no text to train on\n"
            assert "preparing" not in out or given.is_dir()  # empty files are seen up front, empty texts later
    assert sorted(os.listdir(tmp_path)) == ["empty"]  # nothing written


def test_a_vocabulary_short_of_the_size_asked_for_is_noted(tmp_path, capsys):
    (tmp_path / "tiny.txt").write_text("ab ab")
    assert train_tokenizer.main(["--input", str(tmp_path / "tiny.txt"), "--output-dir", str(tmp_path / "tok"),
                                 "--vocab-size", "512"]) == 0
    note = capsys.readouterr().out.splitlines()[-1]
    assert note == ("note: the tokenizer has 259 tokens, not the 512 of --vocab-size: BPE merged every pair of "
                    "tokens seen at least 2 times in the text; more text gives more tokens")
