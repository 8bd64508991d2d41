"""Tokenizers for encoders: BERT WordPiece and RoBERTa byte-level BPE, from tokenizer.json and from the files older
checkpoints ship (vocab.txt; vocab.json + merges.txt), against transformers' own tokenizers built locally from
small trained vocabularies (nothing is downloaded): special-token ids by role, plain and pair encodings,
longest-first truncation; the fallback pair template of GPT-style tokenizers; one-line errors."""

import json
import os

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from config import ConfigError
from data.tokenizer import ByteTokenizer, load_tokenizer, train_bpe, truncate_longest_first

CORPUS = ["Hello world, this is a small corpus!", "Grüße aus Köln: the quick brown fox jumps over the lazy dog.",
          "def f(x):\n    return x + 1  # adds one", "Die Katze saß auf der Matte. 東京 is a city.",
          "The cat sat on the mat; the dog did not."] * 8
PAIRS = [("Hello world", "the quick fox"), ("The cat sat on the mat.", None), ("  Leading spaces", "ÀCCÉNTS here"),
         ("a [MASK] b <mask> c", "[SEP] </s> [CLS] <s>"), ("the lazy dog " * 9, "quick brown " * 4),
         ("x", "the quick brown fox jumps over the lazy dog " * 3), ("", "only the second")]
LENGTHS = [None, 8, 13, 24]


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


def wordpiece_vocab(directory, lowercase: bool) -> str:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(CORPUS, trainers.WordPieceTrainer(
        vocab_size=180, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False))
    os.makedirs(directory, exist_ok=True)
    tok.model.save(str(directory))
    return str(directory)


def roberta_vocab(directory) -> str:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=330, min_frequency=1, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    os.makedirs(directory, exist_ok=True)
    tok.model.save(str(directory))
    return str(directory)


def assert_same_as(ours, reference, type_ids: bool):
    assert ours.vocab_size == len(reference)
    assert (ours.eos_id, ours.padding_id, ours.cls_id) == (reference.sep_token_id, reference.pad_token_id,
                                                          reference.cls_token_id)
    assert ours.token_id(reference.mask_token) == reference.mask_token_id
    for text, pair in PAIRS:
        assert ours.encode(text) == reference(text, add_special_tokens=False)["input_ids"], text
        for max_length in LENGTHS:
            kwargs = {"truncation": "longest_first", "max_length": max_length} if max_length else {}
            expected = reference(text, pair, **kwargs)
            ids, types = ours.encode_pair(text, pair, max_length)
            assert ids == expected["input_ids"], (text, pair, max_length)
            if type_ids:
                assert types == expected["token_type_ids"], (text, pair, max_length)
            else:
                assert set(types) == {0}  # RoBERTa has one token type
    texts, pairs = zip(*PAIRS)
    assert ours.encode_pairs(texts, pairs, 13) == [ours.encode_pair(t, p, 13) for t, p in PAIRS]


@pytest.mark.parametrize("lowercase", [True, False])
def test_bert_wordpiece_matches_transformers(tmp_path, transformers, lowercase):
    """vocab.txt (+ tokenizer_config.json's do_lower_case) as older BERT checkpoints ship it, and the
    tokenizer.json transformers saves from it."""
    vocab_dir = wordpiece_vocab(tmp_path / "vocab_only", lowercase)
    if not lowercase:  # without tokenizer_config.json BERT lowercases
        (tmp_path / "vocab_only" / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    reference = transformers.BertTokenizer.from_pretrained(vocab_dir)
    assert reference.do_lower_case == lowercase
    reference.save_pretrained(str(tmp_path / "saved"))
    assert "tokenizer.json" in os.listdir(tmp_path / "saved")
    for path in (vocab_dir, str(tmp_path / "saved"), str(tmp_path / "saved" / "tokenizer.json")):
        ours = load_tokenizer(path)
        assert_same_as(ours, reference, type_ids=True)
        ids, types = ours.encode_pair("hello world", "the fox")
        first = ids.index(ours.eos_id) + 1  # [CLS] hello world [SEP] | the fox [SEP]
        assert ids[0] == ours.cls_id and ids.count(ours.eos_id) == 2 and ids[-1] == ours.eos_id
        assert types == [0] * first + [1] * (len(ids) - first) and first < len(ids) - 1
    assert (ours.encode("The Cat") == ours.encode("the cat")) == lowercase


def test_roberta_bpe_matches_transformers(tmp_path, transformers):
    """vocab.json + merges.txt with <s> </s> <pad> <mask> (no <|endoftext|>), and the saved tokenizer.json."""
    vocab_dir = roberta_vocab(tmp_path / "vocab_only")
    reference = transformers.RobertaTokenizer.from_pretrained(vocab_dir)
    reference.save_pretrained(str(tmp_path / "saved"))
    for path in (vocab_dir, str(tmp_path / "saved")):
        ours = load_tokenizer(path)
        assert_same_as(ours, reference, type_ids=False)
        ids, _ = ours.encode_pair("hello", "world")
        assert ids[0] == ours.cls_id and ids.count(ours.eos_id) == 3  # <s> a </s></s> b </s>
        text = "Grüße, 東京 <mask>!"
        assert ours.decode(ours.encode(text)) == text  # byte-level: lossless


def test_gpt_style_tokenizers_keep_encode_and_get_the_fallback_template():
    bpe = train_bpe(CORPUS, 300, 1)
    assert bpe.cls_id is None and bpe.padding_id != bpe.eos_id
    eos = bpe.eos_id
    a, b = bpe.encode("Hello world"), bpe.encode("the fox")
    expected_types = [0] * (len(a) + 2) + [1] * (len(b) + 1)
    assert bpe.encode_pair("Hello world", "the fox") == ([eos, *a, eos, *b, eos], expected_types)
    assert bpe.encode_pair("Hello world") == ([eos, *a, eos], [0] * (len(a) + 2))
    assert bpe.encode("a<|endoftext|>b").count(eos) == 1 and bpe.encode("Hello world") == a  # encode is untouched
    byte = ByteTokenizer()
    assert byte.encode_pair("ab", "c") == ([256, 97, 98, 256, 99, 256], [0, 0, 0, 0, 1, 1])


def test_longest_first_is_the_rule_of_tokenizers():
    """The byte tokenizer's own truncation against tokenizers' longest_first: a byte-level BPE with no merges
    has one token per byte, so both must keep the same number of tokens of each text."""
    bytes_only = train_bpe(["ab"], 258, 1)
    byte = ByteTokenizer()
    for n_a in (0, 1, 3, 7, 12):
        for n_b in (0, 1, 4, 9):
            for max_length in (4, 5, 8, 11, 16, 30):
                a, b = "a" * n_a, "b" * n_b
                theirs = bytes_only.encode_pair(a, b, max_length)
                ours = byte.encode_pair(a, b, max_length)
                assert theirs[1] == ours[1], (n_a, n_b, max_length)  # the same split into parts
                assert len(ours[0]) == min(n_a + n_b + 3, max_length)
    assert truncate_longest_first([1] * 5, [2] * 5, 7) == ([1] * 3, [2] * 4)


def test_tokenizer_errors_are_one_line_naming_the_file(tmp_path):
    def error(path):
        with pytest.raises(ConfigError) as e:
            load_tokenizer(str(path))
        assert "\n" not in str(e.value)
        return str(e.value)

    no_eos = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    no_eos.save(str(tmp_path / "plain.json"))
    assert error(tmp_path / "plain.json") == (f"{tmp_path / 'plain.json'}: the tokenizer has no end-of-text token "
                                              "(one of <|endoftext|>, </s>, [SEP])")
    bpe_dir = tmp_path / "bpe"
    os.makedirs(bpe_dir)
    Tokenizer(models.BPE({"a": 0, "b": 1, "ab": 2}, [("a", "b")])).model.save(str(bpe_dir))
    assert error(bpe_dir) == f"{bpe_dir / 'vocab.json'}: neither GPT-2's <|endoftext|> nor RoBERTa's <s> and </s> " \
                             "are in the vocabulary"
    wp = tmp_path / "wp"
    os.makedirs(wp)
    (wp / "vocab.txt").write_text("[PAD]\n[UNK]\n[SEP]\nhello\n")
    assert error(wp) == f"{wp / 'vocab.txt'}: no [CLS] token in the vocabulary"
    (wp / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n")
    (wp / "tokenizer_config.json").write_text('{"do_lower_case": tru')
    assert error(wp).startswith(f"{wp / 'tokenizer_config.json'}: invalid JSON at line 1")
    (wp / "tokenizer_config.json").write_text('{}')
    with pytest.raises(ConfigError, match=r"3 tokens leave no room for text beside the 3 special tokens"):
        load_tokenizer(str(wp)).encode_pair("hello", "hello", 3)
