"""seq2seq from (input, target) pairs in jsonl: batches against a direct construction (prefix, end-of-text, padding,
segment ids, truncation counts), exact resume, one-line errors for bad input, and the shipped reverse-words
example through train.py and predict.py (also fine-tuning an imported Hugging Face T5 on it)."""

import json
import re

import numpy as np
import pytest

from config import ConfigError
from data.pairs import PairSource, read_pairs
from data.tokenizer import HFTokenizer, load_tokenizer
from tests.common import metrics_rows, run_command
from tests.data_common import config, use_dataset_configs

PAIRS = [{"inputs": "ab", "targets": "x"},
         {"inputs": "a much longer input", "targets": "yz"},
         {"inputs": "é", "targets": "a target too long"}]


def write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def direct(ids: list[int], length: int, eos: int, pad: int) -> tuple[list[int], list[int]]:
    """(ids cut to length - 1, ended with eos, padded; segment ids) built by hand."""
    ids = ids[:length - 1] + [eos]
    return ids + [pad] * (length - len(ids)), [1] * len(ids) + [0] * (length - len(ids))


def test_batches_are_prefixed_ended_padded_and_cut_as_built_by_hand(tmp_path):
    path = write(tmp_path / "train.jsonl", PAIRS)
    inputs, targets, places = read_pairs(path, "test")
    assert places == [f"{path}: line {i}" for i in (1, 2, 3)]
    tok = load_tokenizer("bytes")
    source = PairSource(inputs, targets, places, tok, 8, 6, prefix="p: ", shuffle=False, seed=0, description="eval")
    batch = source.batch(0, 4)  # 3 pairs and one row past the end
    assert {k: v.shape for k, v in batch.items()} == {"inputs": (4, 8), "segment_ids": (4, 8), "targets": (4, 6),
                                                      "target_segment_ids": (4, 6)}
    for row, pair in enumerate(PAIRS):
        ids, segments = direct(list(("p: " + pair["inputs"]).encode()), 8, tok.eos_id, tok.padding_id)
        assert batch["inputs"][row].tolist() == ids and batch["segment_ids"][row].tolist() == segments
        ids, segments = direct(list(pair["targets"].encode()), 6, tok.eos_id, tok.padding_id)
        assert batch["targets"][row].tolist() == ids and batch["target_segment_ids"][row].tolist() == segments
    assert batch["inputs"][1, -1] == tok.eos_id and batch["targets"][2, -1] == tok.eos_id  # cut, still ended
    assert batch["inputs"][3].tolist() == batch["inputs"][0].tolist()  # past the end: a copy of the first pair ...
    assert not batch["target_segment_ids"][3].any()  # ... whose targets weigh nothing
    assert (f"3 pairs; 1 inputs cut to n_ctx 8, the first {path}: line 2; 1 targets cut to n_decoder_ctx 6, the "
            f"first {path}: line 3") in source.description


def test_a_t5_laid_out_tokenizer_pads_with_its_pad_and_ends_with_its_eos(tmp_path):
    """T5's tokenizer.json: <pad> 0, </s> 1; text encoded without special tokens, then </s> appended once."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator(["summarize: the cat sat on the mat"] * 4, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "</s>", "<unk>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    t5 = HFTokenizer(tok, "t5-like")
    assert (t5.padding_id, t5.eos_id) == (0, 1)
    source = PairSource(["the cat sat"], ["a cat"], ["x: line 1"], t5, 12, 6, prefix="summarize: ", shuffle=False,
                        seed=0, description="train")
    batch = source.batch(0, 1)
    want = tok.encode("summarize: the cat sat", add_special_tokens=False).ids
    assert batch["inputs"][0].tolist() == direct(want, 12, 1, 0)[0]
    assert batch["targets"][0].tolist() == direct(tok.encode("a cat", add_special_tokens=False).ids, 6, 1, 0)[0]


def text(ids) -> str:
    return load_tokenizer("bytes").decode([int(i) for i in ids])


def test_resumed_batches_are_the_same_and_each_epoch_reads_every_pair_once(tmp_path, monkeypatch):
    from data.source import make_source

    rows = [{"inputs": f"input {i}", "targets": f"target {i}"} for i in range(10)]
    path = write(tmp_path / "train.jsonl", rows)
    use_dataset_configs(monkeypatch, tmp_path / "dc", pairs={"path": path, "eval_path": path,
                                                             "tokenizer_path": "bytes"})
    cfg = config([["pairs", None, None, None]], 16, n_vocab=257, model="t5", task="seq2seq", span_corruption=False,
                 n_decoder_ctx=12, attention_types=None, seed=5)
    first, resumed = make_source(cfg, "train"), make_source(cfg, "train")
    run = [first.batch(step, 4) for step in range(6)]  # 24 rows: two epochs of 10 and a part of the third
    for step in (5, 3):  # a resumed run asks for its step first, whatever it read before
        for key, value in resumed.batch(step, 4).items():
            np.testing.assert_array_equal(value, run[step][key])
    seen = np.concatenate([b["inputs"] for b in run])[:20]
    decoded = [text(r) for r in seen]
    assert sorted(decoded[:10]) == sorted(decoded[10:]) == sorted(f"input {i}" for i in range(10))
    assert decoded[:10] != decoded[10:]  # each epoch its own order
    evaluation = make_source(cfg, "eval")
    assert [text(r) for r in evaluation.batch(0, 4)["inputs"]] == [f"input {i}" for i in range(4)]


def test_packing_puts_each_pair_in_one_row_within_both_lengths():
    from data.pairs import pack_rows

    rng = np.random.default_rng(0)
    inputs, targets = rng.integers(2, 12, 500), rng.integers(2, 9, 500)
    rows = pack_rows(inputs, targets, 32, 16, rng.permutation(500))
    assert sorted(p for row in rows for p in row) == list(range(500))
    assert all(inputs[row].sum() <= 32 and targets[row].sum() <= 16 for row in rows)
    assert len(rows) < 500 / 2.5, len(rows)  # 6.5 in and 5 out on average: about 3 pairs fit a row
    in_order = pack_rows(inputs, targets, 32, 16, range(500))
    assert all(row == sorted(row) for row in in_order)  # a row's pairs in the order taken
    assert pack_rows(np.array([32, 2]), np.array([2, 16]), 32, 16, range(2)) == [[0], [1]]  # exactly full rows


def test_packed_rows_hold_the_unpacked_pairs_as_segments(tmp_path):
    """Pair k of a packed row is an unpacked pair's tokens with segment id k, on both sides, and every pair is in
    one row; eval rows weigh nothing past the last; the train pairs are packed in an order drawn from the seed."""
    rows = [{"inputs": "x" * (i % 5), "targets": "y" * (1 + i % 3)} for i in range(23)]
    path = write(tmp_path / "train.jsonl", rows)
    inputs, targets, places = read_pairs(path, "test")
    tok = load_tokenizer("bytes")
    make = lambda pack, shuffle=False: PairSource(inputs, targets, places, tok, 16, 8, prefix="p: ",  # noqa: E731
                                                  shuffle=shuffle, seed=0, description="eval", pack=pack)
    alone, packed = make(False), make(True)
    assert len(alone) == 23 and len(packed) < 23 / 1.5
    single, batch = alone.batch(0, 23), packed.batch(0, len(packed) + 2)
    pairs = []
    for row in range(len(packed)):
        for k in range(1, batch["segment_ids"][row].max() + 1):
            pairs.append((batch["inputs"][row][batch["segment_ids"][row] == k].tolist(),
                          batch["targets"][row][batch["target_segment_ids"][row] == k].tolist()))
        assert batch["target_segment_ids"][row].max() == batch["segment_ids"][row].max()
    assert sorted(pairs) == sorted((single["inputs"][i][single["segment_ids"][i] == 1].tolist(),
                                    single["targets"][i][single["target_segment_ids"][i] == 1].tolist())
                                   for i in range(23))
    assert not batch["target_segment_ids"][len(packed):].any()  # past the last row: nothing to learn
    assert "; packed into " in packed.description and " pairs per row, " in packed.description
    from training.eval_reads import repeat_note
    assert repeat_note(packed, config([["pairs", None, None, None]], eval_steps=1, eval_batch_size=2)).startswith(
        f"note: the eval split holds {len(packed)} packed rows (23 pairs), but one evaluation reads 2 ")
    shuffled = make(True, shuffle=True)
    assert shuffled.inputs.tolist() != packed.inputs.tolist() and len(shuffled) < 23 / 1.5
    assert sorted(shuffled.inputs[shuffled.segment_ids > 0].tolist()) == sorted(
        packed.inputs[packed.segment_ids > 0].tolist())


def test_pack_pairs_is_for_seq2seq_only():
    with pytest.raises(ConfigError, match='^pack_pairs: true packs the \\(input, target\\) pairs of task seq2seq, '
                                          'but task is "causal_lm"$'):
        config([["pairs", None, None, None]], 64, n_vocab=300, pack_pairs=True)


@pytest.mark.parametrize("line, message", [
    ({"inputs": "a"}, "line 2 has no 'targets' field (targets_key; it has 'inputs')"),
    ({"source": "a", "target": "b"}, "line 2 has no 'inputs' field (inputs_key; it has 'source', 'target')"),
    ({"inputs": "a", "targets": ""}, "line 2: 'targets' is empty: a pair needs a target"),
    ({"inputs": "a", "targets": ["b"]}, "line 2: 'targets' is not a string (targets_key)"),
    ("inputs,targets", "line 2 is not a JSON object"),
])
def test_bad_lines_name_the_file_and_line(tmp_path, line, message):
    path = write(tmp_path / "bad.jsonl", [{"inputs": "ok", "targets": "ok"}, line])
    with pytest.raises(ConfigError) as e:
        read_pairs(path, "test")
    assert str(e.value).startswith(f"{path}: ") and message in str(e.value), str(e.value)


def test_files_and_settings_that_cannot_feed_pairs_are_one_line(tmp_path, monkeypatch):
    from data.source import make_source

    good = write(tmp_path / "good.jsonl", [{"source": "a", "target": "b"}])
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b'{"inputs": "a", "targets": "b"}\n\xff\xfe\x00\x01\n')
    csv = write(tmp_path / "pairs.csv", ["a,b"])
    use_dataset_configs(monkeypatch, tmp_path / "dc",
                        renamed={"path": good, "inputs_key": "source", "targets_key": "target"},
                        typo={"path": str(tmp_path / "god.jsonl")}, binary={"path": str(binary)},
                        csv={"path": csv}, prefix={"path": good, "prefix": 3, "inputs_key": "source",
                                                   "targets_key": "target"},
                        text={"path": "embedded"})
    cfg = config([["renamed", None, None, None]], 16, n_vocab=257, model="t5", task="seq2seq",
                 span_corruption=False, n_decoder_ctx=8, attention_types=None)
    assert make_source(cfg, "train").targets[0, :2].tolist() == [ord("b"), 256]  # HF's source/target keys
    for name, message in [
            ("typo", f"typo.json path: {tmp_path}/god.jsonl matches no file"),
            ("binary", f"{binary}: not UTF-8 text (line 2, byte offset 32: 0xff)"),
            ("csv", f"csv.json path: {csv} is not jsonl (.jsonl or .jsonl.zst): task seq2seq reads"),
            ("prefix", "prefix must be a string"),
            ("text", "span_corruption: false, so task seq2seq reads (input, target) pairs from jsonl files, but "
                     "configs/dataset_configs/text.json names text (embedded); --set span_corruption=true")]:
        with pytest.raises(ConfigError) as e:
            make_source(cfg.replace(datasets=[[name, None, None, None]]), "train")
        assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
    with pytest.raises(ConfigError, match="no 'eval_path' for evaluation"):
        make_source(cfg, "eval")
    spans = config([["renamed", None, None, None]], 64, n_vocab=300, model="t5", task="seq2seq",
                   span_corruption=True, attention_types=None)
    with pytest.raises(ConfigError, match="span_corruption: true cuts spans out of plain text, but .* names \\(input, "
                                          "target\\) pairs .*--set span_corruption=false"):
        make_source(spans, "train")


def test_a_bad_line_stops_train_py_in_one_line(tmp_path):
    bad = write(tmp_path / "train.jsonl", [{"inputs": "a", "targets": "b"}, {"inputs": "c"}])
    (tmp_path / "pairs.json").write_text(json.dumps({"path": bad, "tokenizer_path": "bytes"}))
    result = run_command("train.py", "--config", "configs/t5_reverse_words.json", "--model-path",
                         str(tmp_path / "run"), "--no-progress", "--set",
                         f'datasets=[["{tmp_path}/pairs.json", null, null, null]]', "--set", "eval_steps=0")
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {bad}: line 2 has no 'targets' field (targets_key; it has 'inputs')"


TINY = ["n_layer=1", "n_decoder_layer=1", "n_embd=64", "n_head=2", "d_ff=128", "train_batch_size=16",
        "eval_batch_size=32", "warmup_steps=4", "eval_every=0", "eval_steps=2", "lr=0.005"]


def train(model_path, steps, *sets, extra=()):
    args = ["train.py", "--config", "configs/t5_reverse_words.json", "--model-path", str(model_path), "--no-progress"]
    result = run_command(*args, *[a for s in TINY + [f"train_steps={steps}", f"steps_per_checkpoint={steps}",
                                                     *sets] for a in ("--set", s)], *extra)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.e2e
def test_reverse_words_trains_and_predict_writes_a_target(tmp_path):
    result = train(tmp_path / "run", 40)
    assert "data train: configs/dataset_configs/reverse_words.json: " in result.stdout and "pairs; " in result.stdout
    losses = [row["loss"] for row in metrics_rows(tmp_path / "run")]
    assert len(losses) == 40 and np.mean(losses[-5:]) < np.mean(losses[:5]) - 1.0, losses
    (evaluation,) = metrics_rows(tmp_path / "run", "eval")
    assert 0.05 < evaluation["accuracy"] < 1.0 and "perplexity" in evaluation  # common words come first
    predicted = run_command("predict.py", "--model-path", str(tmp_path / "run"), "--prompt",
                            "reverse: the for statement is", "--temperature", "0", "--max-new-tokens", "12")
    assert predicted.returncode == 0, predicted.stderr[-2000:]
    assert re.fullmatch(r"[a-z]+( [a-z]+)*\n", predicted.stdout), predicted.stdout  # words, ended by end-of-text


@pytest.mark.e2e
def test_fine_tuning_an_imported_hugging_face_t5_reads_pairs_with_its_tokenizer(tmp_path):
    from tests import hf_fixtures

    hf = hf_fixtures.save_t5(hf_fixtures.t5(n_embd=32, n_head=2, d_ff=64, ffn="gated-gelu", tied=False),
                             tmp_path / "hf_t5")
    result = train(tmp_path / "tuned", 3, extra=("--init-from", hf))
    initialised = next(line for line in result.stdout.splitlines() if line.startswith("initialised from"))
    assert "fresh" not in initialised and "unused" not in initialised, initialised  # every weight, and only those
    assert "n_vocab 320" in result.stdout  # the checkpoint's shape
    theirs = load_tokenizer(hf)
    saved = load_tokenizer(str(tmp_path / "tuned" / "tokenizer"))  # the run keeps the model's, for predict.py
    assert saved.encode("reverse: the for") == theirs.encode("reverse: the for") and saved.eos_id == 1
    predicted = run_command("predict.py", "--model-path", str(tmp_path / "tuned"), "--prompt", "reverse: a b",
                            "--temperature", "0", "--max-new-tokens", "4")
    assert predicted.returncode == 0 and predicted.stdout.strip(), predicted.stderr[-2000:]


def test_init_from_a_t5_without_a_tokenizer_says_whose_tokenizer_reads_the_pairs(tmp_path):
    """A checkpoint directory without tokenizer files left the pairs to the dataset's tokenizer without a word: where
    its ids fit the model's vocabulary, fine-tuning went on with ids naming other tokens."""
    from config import from_dict
    from training.run_tokenizer import with_tokenizer_of_init_from

    (tmp_path / "config.json").write_text("{}")
    cfg = from_dict(dict(model="t5", span_corruption=False, n_embd=32, n_head=2, n_layer=1, init_from=str(tmp_path),
                         datasets=[["reverse_words", None, None, None]]))[0]
    notes = []
    assert with_tokenizer_of_init_from(cfg, notes) is cfg
    assert notes == [f"--init-from {tmp_path}: no tokenizer there (tokenizer.json, vocab.json + merges.txt, vocab.txt "
                     "or spiece.model), so dataset reverse_words's tokenizer reads the text; put the model's own there "
                     "to fine-tune on its ids"]
    (tmp_path / "tokenizer.json").write_text("{}")
    notes = []
    assert with_tokenizer_of_init_from(cfg, notes).tokenizer_path == str(tmp_path) and notes == []
