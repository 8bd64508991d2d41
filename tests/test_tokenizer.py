"""Byte-level BPE: exact round trips, special tokens, GPT-2 vocab.json+merges.txt files, the training CLI."""

import json
import os

import pytest
import zstandard

from config import ConfigError
from data.tokenizer import EOS, PAD, ByteTokenizer, load_tokenizer, train_bpe
from tests.common import run_cli

TEXTS = ["def f(x):\n    return x  +  1\n", "Grüße, 世界! \t tabs\r\nand\u00a0nbsp 😀", "  leading spaces",
         "the the the theory of the thing " * 20]
HARD = TEXTS + ["", " ", "<|endoftext|> inside text", "\n\n\n", "ǅ\u200b\ufeffzero width"]


@pytest.fixture(scope="module")
def bpe():
    return train_bpe(TEXTS * 5, vocab_size=300, min_frequency=1)


def test_bpe_round_trip_is_exact_and_has_special_tokens(bpe):
    assert bpe.vocab_size == 300
    assert bpe.tok.token_to_id(EOS) == bpe.eos_id and bpe.tok.token_to_id(PAD) == bpe.padding_id != bpe.eos_id
    for text in HARD:
        assert bpe.decode(bpe.encode(text)) == text
    assert len(bpe.encode(TEXTS[3])) < len(TEXTS[3].encode()) / 2  # it learned merges
    assert bpe.encode("a<|endoftext|>b").count(bpe.eos_id) == 1  # special, not split into bytes
    byte = ByteTokenizer()
    assert all(byte.decode(byte.encode(t)) == t for t in HARD)


def test_saved_and_gpt2_files_load_with_the_same_ids(bpe, tmp_path):
    bpe.save(str(tmp_path / "tokenizer.json"))
    reloaded = load_tokenizer(str(tmp_path))
    gpt2_dir = tmp_path / "gpt2"
    os.makedirs(gpt2_dir)
    bpe.tok.model.save(str(gpt2_dir))  # vocab.json + merges.txt, the files GPT-2 users have
    assert sorted(os.listdir(gpt2_dir)) == ["merges.txt", "vocab.json"]
    gpt2 = load_tokenizer(str(gpt2_dir))
    for text in HARD:
        assert reloaded.encode(text) == bpe.encode(text)
        assert gpt2.encode(text) == bpe.encode(text)
        assert gpt2.decode(gpt2.encode(text)) == text
    assert gpt2.eos_id == bpe.eos_id and gpt2.vocab_size == bpe.vocab_size
    with pytest.raises(ConfigError, match="gpt2.*nothing is downloaded"):
        load_tokenizer("gpt2")


def test_the_size_of_a_vocabulary_with_a_gap_holds_its_highest_id(bpe, tmp_path):
    """A vocab.json with <|endoftext|> past the other ids (as GPT-2's 50256 is, in a vocabulary cut short) was
    counted, not measured: n_vocab 300 for an end-of-text id of 1000, written into dataset configs."""
    bpe.tok.model.save(str(tmp_path))
    vocab = json.loads((tmp_path / "vocab.json").read_text())
    vocab[EOS] = 1000
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    gapped = load_tokenizer(str(tmp_path))
    assert gapped.eos_id == 1000 and gapped.vocab_size == 1001
    assert max(gapped.encode("a<|endoftext|>b")) < gapped.vocab_size


def test_a_failed_save_leaves_no_partial_file(bpe, tmp_path):
    os.symlink("/dev/full", tmp_path / "tokenizer.json.tmp")  # every write: no space left on device
    with pytest.raises(OSError):
        bpe.save(str(tmp_path / "tokenizer.json"))
    assert os.listdir(tmp_path) == []


def test_bpe_training_is_deterministic():
    a, b = (train_bpe(TEXTS, 280, 1) for _ in range(2))
    assert a.tok.to_str() == b.tok.to_str()


def test_a_huge_word_trains_in_linear_time():
    """A long run without whitespace (a minified file, base64, a line of Chinese) is one pre-token, and the BPE
    trainer's time grows with the square of its length (150 KB: about 20 s; 3 MB: hours). Training
    sees it in pieces; the tokenizer still encodes it whole and exactly."""
    import time
    from data.tokenizer import LONGEST_WORD, _training_pieces

    text = "some words " * 50 + "x" * 2500 + " and " + "中文" * 25_000
    pieces = list(_training_pieces([text, "short"]))
    assert "".join(pieces[:-1]) == text and pieces[-1] == "short"
    assert max(len(w) for piece in pieces for w in piece.split()) == LONGEST_WORD
    start = time.perf_counter()
    tok = train_bpe([text] * 2, 300)
    assert time.perf_counter() - start < 10
    assert tok.decode(tok.encode(text)) == text


def test_files_a_folder_holds_of_other_kinds_are_named_not_silently_left_out(tmp_path, capsys):
    from data.text_files import expand_inputs

    (tmp_path / "sub").mkdir()
    for name in ("a.txt", "sub/b.jsonl", "notes.md", "sub/README"):
        (tmp_path / name).write_text("text")
    assert expand_inputs([str(tmp_path)]) == [str(tmp_path / "a.txt"), str(tmp_path / "sub" / "b.jsonl")]
    assert capsys.readouterr().err == (f"note: --input {tmp_path}: 2 file(s) left out, not .txt/.jsonl/.jsonl.zst "
                                       f"(the first: {tmp_path / 'notes.md'}); rename them to be read\n")
    assert expand_inputs([str(tmp_path / "*.txt")]) == [str(tmp_path / "a.txt")]
    assert capsys.readouterr().err == ""  # a glob that asks for .txt files leaves nothing out


def test_train_tokenizer_cli_reads_txt_jsonl_and_zst(tmp_path):
    (tmp_path / "a.txt").write_text(TEXTS[0])
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in TEXTS[1:3]) + "\n")
    (tmp_path / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(
        (json.dumps({"text": TEXTS[3]}) + "\n").encode()))
    out = tmp_path / "tok"
    result = run_cli("data/train_tokenizer.py", "--input", str(tmp_path / "*.txt"), str(tmp_path / "b.jsonl"),
                     str(tmp_path / "c.jsonl.zst"), "--output-dir", str(out), "--vocab-size", "290",
                     "--min-frequency", "1")
    assert result.returncode == 0, result.stderr
    assert "trained on 4 documents" in result.stdout and "from 3 files" in result.stdout
    tok = load_tokenizer(str(out / "tokenizer.json"))
    assert tok.vocab_size == 290 and all(tok.decode(tok.encode(t)) == t for t in HARD)
    bad = run_cli("data/train_tokenizer.py", "--input", str(tmp_path / "missing*.txt"), "--output-dir", str(out),
                  "--vocab-size", "290")
    assert bad.returncode == 2 and bad.stderr.strip() == \
        f"error: --input {tmp_path / 'missing*.txt'}: matches no .txt/.jsonl/.jsonl.zst file"
    (tmp_path / "broken.jsonl").write_text('{"text": "ok"}\nnot json\n')
    bad = run_cli("data/train_tokenizer.py", "--input", str(tmp_path / "broken.jsonl"), "--output-dir", str(out),
                  "--vocab-size", "290")
    assert bad.returncode == 2 and "broken.jsonl: line 2 is not a JSON object" in bad.stderr
    assert "Traceback" not in bad.stderr
