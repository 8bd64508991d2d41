"""Tokenizers behind one small interface: ``encode``, ``decode``, ``encode_pair``, ``vocab_size``, ``eos_id``,
``padding_id``, ``cls_id``.

Two kinds: the built-in byte tokenizer (no training, no files) and any Hugging Face ``tokenizers`` tokenizer:
byte-level BPE trained here (``data/train_tokenizer.py``), or loaded from a ``tokenizer.json`` (GPT-2/GPT-Neo,
BERT WordPiece, RoBERTa BPE) or from the files older checkpoints ship: GPT-2's or RoBERTa's ``vocab.json`` +
``merges.txt``, BERT's ``vocab.txt`` (with ``tokenizer_config.json``'s ``do_lower_case``). Byte-level BPE is
lossless: decoding an encoding gives the text back exactly.

``encode`` never adds special tokens (language-model data joins documents with ``eos_id`` itself);
``encode_pair`` builds a classifier's input the way the tokenizer's own post-processor does (BERT:
``[CLS] a [SEP] b [SEP]``, RoBERTa: ``<s> a </s></s> b </s>``), else ``[cls or eos] a [eos] b [eos]``;
``encode_windows`` builds question answering's: the question with each window of a long context, as that pair,
with each context token's character offsets (Hugging Face's ``return_overflowing_tokens`` with a ``stride``).
"""

from __future__ import annotations

import json
import os
import re
from typing import Iterable, Protocol, Sequence

from config import ConfigError

EOS = "<|endoftext|>"
PAD = "<|padding|>"
# Special tokens by role, in order of preference: GPT-2/GPT-Neo's, RoBERTa's, BERT's.
EOS_TOKENS = (EOS, "</s>", "[SEP]")
PAD_TOKENS = (PAD, "<pad>", "[PAD]")
CLS_TOKENS = ("[CLS]", "<s>")


class Tokenizer(Protocol):
    vocab_size: int
    eos_id: int
    padding_id: int
    cls_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def encode_pair(self, text: str, pair: str | None = None, max_length: int | None = None
                    ) -> tuple[list[int], list[int]]: ...

    def encode_pairs(self, texts: Sequence[str], pairs: Sequence[str | None], max_length: int | None = None
                     ) -> list[tuple[list[int], list[int]]]: ...

    def encode_windows(self, question: str, context: str, max_length: int, stride: int) -> list[Window]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_id(self, token: str) -> int | None: ...


Window = tuple[list[int], list[int], list]  # (ids, type ids, each token's (start, end) context characters or None)


class NoRoomForContext(ValueError):
    """A question too long for a window of ``max_length`` to hold more than ``stride`` tokens of context."""


def truncate_longest_first(a: list, b: list, budget: int) -> tuple[list, list]:
    """``a`` and ``b`` cut to ``budget`` items together, the rule of ``tokenizers``' ``longest_first``: the
    longer loses items until both fit, and when both must lose, each keeps half (the longer one, ``b`` on a tie,
    keeps an odd one)."""
    if len(a) + len(b) <= budget:
        return a, b
    short = min(len(a), len(b))
    keep_short, keep_long = short, max(short, budget - short) if short <= budget else short
    if keep_short + keep_long > budget:
        keep_short, keep_long = budget // 2, budget // 2 + budget % 2
    keep_a, keep_b = (keep_long, keep_short) if len(a) > len(b) else (keep_short, keep_long)
    return a[:keep_a], b[:keep_b]


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255 and ``<|endoftext|>`` as 256: lossless, needs no training."""

    vocab_size = 257
    eos_id = 256
    padding_id = 256
    cls_id = None
    name = "bytes"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def encode_pair(self, text: str, pair: str | None = None, max_length: int | None = None
                    ) -> tuple[list[int], list[int]]:
        """``eos a eos (b eos)`` and its type ids (0 for the first part, 1 for the second), at most
        ``max_length`` ids: the longer text is cut first."""
        a, b = self.encode(text), self.encode(pair) if pair is not None else []
        if max_length is not None:
            if max_length <= 3:
                raise ConfigError(f"bytes: {max_length} tokens leave no room for text beside the 3 special tokens "
                                  "of a pair")
            a, b = truncate_longest_first(a, b, max_length - (2 if pair is None else 3))
        first = [self.eos_id, *a, self.eos_id]
        second = [*b, self.eos_id] if pair is not None else []
        return first + second, [0] * len(first) + [1] * len(second)

    def encode_pairs(self, texts: Sequence[str], pairs: Sequence[str | None], max_length: int | None = None
                     ) -> list[tuple[list[int], list[int]]]:
        return [self.encode_pair(t, p, max_length) for t, p in zip(texts, pairs)]

    def encode_windows(self, question: str, context: str, max_length: int, stride: int) -> list[Window]:
        """``eos question eos window eos`` for each window of the context's bytes: windows of the room left, each
        starting ``stride`` bytes before the previous one's end, as ``tokenizers``' overflowing encodings."""
        q = self.encode(question)
        room = max_length - len(q) - 3
        if room <= stride:
            raise NoRoomForContext(f"a question of {len(q)} tokens leaves {max(room, 0)} of max_length {max_length} "
                                   f"for context, not more than the stride {stride}")
        characters = [(i, i + 1) for i, ch in enumerate(context) for _ in ch.encode("utf-8")]  # each byte's character
        c = self.encode(context)
        windows, start = [], 0
        while True:
            part = slice(start, start + room)
            ids = [self.eos_id, *q, self.eos_id, *c[part], self.eos_id]
            types = [0] * (len(q) + 2) + [1] * (len(c[part]) + 1)
            windows.append((ids, types, [None] * (len(q) + 2) + characters[part] + [None]))
            if start + room >= len(c):
                return windows
            start += room - stride

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def token_id(self, token: str) -> int | None:
        return self.eos_id if token == EOS else None


class HFTokenizer:
    """A Hugging Face ``tokenizers.Tokenizer`` (BPE, WordPiece, ...) with its special-token ids by role."""

    def __init__(self, tokenizer, name: str):
        self.tok, self.name = tokenizer, name
        # The ids it can give, not how many tokens it has: a token added at an id past the vocabulary (a gap)
        # counted as one more, so n_vocab came out too small for the ids written.
        self.vocab_size = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1) + 1
        eos = self._first(EOS_TOKENS)
        if eos is None:
            raise ConfigError(f"{name}: the tokenizer has no end-of-text token (one of {', '.join(EOS_TOKENS)})")
        self.eos_token, self.eos_id = eos
        pad = self._first(PAD_TOKENS)
        self.padding_id = self.eos_id if pad is None else pad[1]
        cls = self._first(CLS_TOKENS)
        self.cls_token, self.cls_id = cls if cls is not None else (None, None)
        self._pair_tokenizers: dict = {}

    def _first(self, tokens: Sequence[str]) -> tuple[str, int] | None:
        return next(((t, self.tok.token_to_id(t)) for t in tokens if self.tok.token_to_id(t) is not None), None)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(list(texts), add_special_tokens=False)]

    def encode_pair(self, text: str, pair: str | None = None, max_length: int | None = None
                    ) -> tuple[list[int], list[int]]:
        """(ids, type ids) of ``text`` (and ``pair``) with the tokenizer's own special tokens: BERT's
        ``[CLS] a [SEP] b [SEP]`` (type ids 0, then 1), RoBERTa's ``<s> a </s></s> b </s>``; a tokenizer
        whose post-processor adds none (GPT-2) gets ``[cls or eos] a [eos] b [eos]``. With ``max_length`` the
        texts are cut (the longer first) so the whole fits."""
        return self.encode_pairs([text], [pair], max_length)[0]

    def encode_pairs(self, texts: Sequence[str], pairs: Sequence[str | None], max_length: int | None = None
                     ) -> list[tuple[list[int], list[int]]]:
        """``encode_pair`` of many examples at once (``tokenizers`` encodes a batch in parallel)."""
        tok = self._pair_tokenizer(max_length)
        specials = tok.post_processor.num_special_tokens_to_add(True)
        if max_length is not None and max_length <= specials:
            raise ConfigError(f"{self.name}: {max_length} tokens leave no room for text beside the {specials} "
                              "special tokens of a pair")
        inputs = [t if p is None else (t, p) for t, p in zip(texts, pairs)]
        return [(e.ids, e.type_ids) for e in tok.encode_batch(inputs)]

    def encode_windows(self, question: str, context: str, max_length: int, stride: int) -> list[Window]:
        """The pair (question, context) with the tokenizer's own special tokens, once for each window of the context
        that fits beside the question in ``max_length`` tokens, each window starting ``stride`` tokens before the
        previous one's end (transformers' ``truncation="only_second", return_overflowing_tokens=True``)."""
        try:
            first = self._pair_tokenizer(max_length, stride).encode(question, context)
        except Exception as e:  # tokenizers' own error for a question that leaves no room: a one-liner above
            raise NoRoomForContext(f"a question of {len(self.encode(question))} tokens leaves no more than the stride "
                                   f"{stride} of max_length {max_length} for context ({e})") from None
        return [(e.ids, e.type_ids, [o if s == 1 else None for o, s in zip(e.offsets, e.sequence_ids)])
                for e in (first, *first.overflowing)]

    def pair_processor(self):
        """The ``tokenizers`` post-processor ``encode_pairs`` wraps texts with: the tokenizer's own where it adds
        special tokens (BERT's, RoBERTa's), else ``[cls or eos] a [eos]`` and ``... b [eos]`` (type ids 1)."""
        from tokenizers import processors

        own = self.tok.post_processor
        if own is not None and own.num_special_tokens_to_add(True) > 0:
            return own
        first, eos = self.cls_token or self.eos_token, self.eos_token
        return processors.TemplateProcessing(
            single=f"{first}:0 $A:0 {eos}:0", pair=f"{first}:0 $A:0 {eos}:0 $B:1 {eos}:1",
            special_tokens=sorted({(first, self.tok.token_to_id(first)), (eos, self.eos_id)}))

    def _pair_tokenizer(self, max_length: int | None, stride: int | None = None):
        """A copy of the tokenizer that adds the pair template and truncates to ``max_length`` (a copy, so the
        settings never leak into ``encode``): the longer text first, or with a ``stride`` the second text alone,
        into overflowing windows."""
        if (max_length, stride) not in self._pair_tokenizers:
            from tokenizers import Tokenizer as Library

            tok = Library.from_str(self.tok.to_str())
            tok.no_padding()
            tok.post_processor = self.pair_processor()
            if max_length is None:
                tok.no_truncation()
            elif stride is None:
                tok.enable_truncation(max_length, strategy="longest_first")
            else:
                tok.enable_truncation(max_length, stride=stride, strategy="only_second")
            self._pair_tokenizers[max_length, stride] = tok
        return self._pair_tokenizers[max_length, stride]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def token_id(self, token: str) -> int | None:
        """The id of a special (or any whole) token, None when the vocabulary has no such token."""
        return self.tok.token_to_id(token)

    def save(self, path: str) -> None:
        """Writes ``tokenizer.json`` under a temporary name and renames it when whole: a failure (a full disk)
        leaves no truncated file, and raises ``OSError``."""
        text = self.tok.to_str(pretty=True)
        try:
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(path + ".tmp", path)
        except BaseException:
            if os.path.lexists(path + ".tmp"):
                os.remove(path + ".tmp")
            raise


BPETokenizer = HFTokenizer  # the name of the byte-level BPE case, kept for callers


class SentencePieceTokenizer:
    """A SentencePiece model (T5's ``spiece.model``) through the optional ``sentencepiece`` package, with T5's
    ``extra_ids`` sentinels ``<extra_id_0>`` .. above the model's pieces (``<extra_id_0>`` the highest id)."""

    def __init__(self, path: str, extra_ids: int = 100):
        try:
            import sentencepiece
        except ImportError:
            raise ConfigError(f"{path}: a SentencePiece model needs the sentencepiece package (pip install "
                              "sentencepiece), or give a tokenizer.json") from None
        self.sp, self.name = sentencepiece.SentencePieceProcessor(model_file=path), path
        self.pieces = self.sp.get_piece_size()
        self.vocab_size = self.pieces + extra_ids
        self.eos_id, self.padding_id = self.sp.eos_id(), max(self.sp.pad_id(), 0)

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text) + [self.eos_id]  # T5's tokenizer ends every text with </s>

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        return self.sp.decode([int(i) for i in ids if i < self.pieces])

    def token_id(self, token: str) -> int | None:
        if token.startswith("<extra_id_") and token.endswith(">") and token[10:-1].isdigit():
            return self.vocab_size - 1 - int(token[10:-1]) if int(token[10:-1]) < self.vocab_size - self.pieces \
                else None
        found = self.sp.piece_to_id(token)
        return None if found == self.sp.unk_id() and token != self.sp.id_to_piece(found) else found


def tokenizer_hash(tokenizer) -> str | None:
    """A short hash of what the tokenizer's ids mean (its model's vocabulary and merges, its added tokens), the
    same for every copy of one tokenizer whatever file it was read from: sizes alone let two vocabularies of one
    size pass as one. None for a kind of tokenizer it cannot read (then sizes are all there is to compare)."""
    import hashlib

    if isinstance(tokenizer, ByteTokenizer):
        content = b"bytes"
    elif isinstance(tokenizer, HFTokenizer):  # read through to_str: one library version lays out both alike
        saved = json.loads(tokenizer.tok.to_str())
        model = saved.get("model") or {}
        added = sorted([t["id"], t["content"]] for t in saved.get("added_tokens") or [])
        content = json.dumps({"type": model.get("type"), "vocab": model.get("vocab"), "merges": model.get("merges"),
                              "added": added}, sort_keys=True).encode()
    elif isinstance(tokenizer, SentencePieceTokenizer):
        content = tokenizer.sp.serialized_model_proto() + str(tokenizer.vocab_size).encode()
    else:
        return None
    return hashlib.sha256(content).hexdigest()[:16]


def _byte_level(tok):
    """Byte-level pre-tokenizer and decoder without a prefix space: the exact-round-trip settings."""
    from tokenizers import decoders, pre_tokenizers

    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def check_bpe_size(vocab_size: int, special_tokens: Sequence[str] = (), where: str = "vocab_size") -> None:
    """A one-line error naming ``where`` when ``vocab_size`` cannot hold the 256 bytes and the special tokens."""
    specials = [EOS, PAD, *special_tokens]
    if vocab_size < 256 + len(specials):
        shown = ", ".join(specials) if len(specials) <= 4 else \
            f"{EOS}, {PAD} and {len(special_tokens)} more: {special_tokens[0]} .. {special_tokens[-1]}"
        raise ConfigError(f"{where}: {vocab_size} is below {256 + len(specials)} (256 bytes + {shown})")


def train_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int = 2,
              special_tokens: Sequence[str] = ()) -> HFTokenizer:
    """Trains a byte-level BPE on ``texts``: 256 byte tokens, ``<|endoftext|>``, ``<|padding|>`` and any
    ``special_tokens`` (e.g. ``[MASK]`` for masked-LM data), then merges up to ``vocab_size`` tokens in all."""
    from tokenizers import Tokenizer as Library
    from tokenizers import models, pre_tokenizers, trainers

    check_bpe_size(vocab_size, special_tokens)
    specials = [EOS, PAD, *special_tokens]
    tok = _byte_level(Library(models.BPE()))
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_training_pieces(texts), trainer=trainer)
    return HFTokenizer(tok, "trained BPE")


LONGEST_WORD = 1000  # characters of one pre-token the BPE trainer sees; no merge grows anywhere near as long


def _training_pieces(texts: Iterable[str]) -> Iterable[str]:
    """``texts``, with every run of more than LONGEST_WORD characters without whitespace cut into pieces of that
    length. The pre-tokenizer makes such a run (a minified file, base64, a line of Chinese) one word, and the
    trainer's time grows with the square of a word's length: one 3 MB line took hours, 80 KB 7 s. Only the
    training sees the pieces; the tokenizer encodes the whole run, exactly, in linear time."""
    long_run = re.compile(r"\S{%d,}" % (LONGEST_WORD + 1))
    for text in texts:
        start = 0
        for run in long_run.finditer(text) if len(text) > LONGEST_WORD else ():
            for cut in range(run.start() + LONGEST_WORD, run.end(), LONGEST_WORD):
                yield text[start:cut]
                start = cut
        yield text[start:] if start else text


def short_of(size: int, asked: int, where: str, min_frequency: int) -> str:
    """Why a trained BPE has fewer tokens than asked (``where`` names the size): merging stops when no pair of
    tokens is frequent enough."""
    return (f"the tokenizer has {size} tokens, not the {asked} of {where}: BPE merged every pair of tokens seen at "
            f"least {min_frequency} times in the text; more text gives more tokens")


def load_tokenizer(path: str, where: str = "tokenizer_path") -> Tokenizer:
    """``"bytes"``, a ``tokenizer.json``, or a directory holding ``tokenizer.json``, GPT-2's or RoBERTa's
    ``vocab.json`` and ``merges.txt``, BERT's ``vocab.txt``, or T5's SentencePiece ``spiece.model`` (needs the
    optional ``sentencepiece`` package). Nothing is downloaded: a hub name like ``gpt2`` must be a local
    directory. Errors name ``where``, the key or flag that gave ``path``."""
    from tokenizers import Tokenizer as Library

    if path == "bytes":
        return ByteTokenizer()
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "tokenizer.json")):
        path = os.path.join(path, "tokenizer.json")
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "spiece.model")):
        return SentencePieceTokenizer(os.path.join(path, "spiece.model"))
    if path.endswith(".model") and os.path.isfile(path):
        return SentencePieceTokenizer(path)
    if os.path.isfile(path):
        try:
            tok = Library.from_file(path)
        except Exception as e:  # tokenizers raises plain Exceptions with multi-line messages
            raise ConfigError(f"{path}: not a tokenizers JSON file ({str(e).splitlines()[0][:160]})") from None
        return HFTokenizer(tok, path)
    if os.path.isdir(path) and all(os.path.exists(os.path.join(path, f)) for f in ("vocab.json", "merges.txt")):
        return HFTokenizer(_bpe_files(path), path)
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "vocab.txt")):
        return HFTokenizer(_wordpiece_files(path), path)
    if not os.path.exists(path):
        raise ConfigError(f"{where}: {path!r} does not exist; a hub name like 'gpt2' works only as a local "
                          "folder with tokenizer.json, vocab.json + merges.txt or vocab.txt (nothing is downloaded)")
    raise ConfigError(f"{where}: {path!r} is neither 'bytes', a tokenizer.json, nor a directory with "
                      "tokenizer.json, vocab.json + merges.txt or vocab.txt (nothing is downloaded)")


def _tokenizer_config(path: str) -> dict:
    """The directory's ``tokenizer_config.json`` (the options Hugging Face saved with the vocabulary), or {}."""
    file = os.path.join(path, "tokenizer_config.json")
    if not os.path.exists(file):
        return {}
    from neomesh.json_file import read_json

    options = read_json(file)
    if not isinstance(options, dict):
        raise ConfigError(f"{file}: expected a JSON object")
    return options


def _bpe_files(path: str):
    """GPT-2's (``<|endoftext|>``) or RoBERTa's (``<s> </s> <pad> <mask>``) ``vocab.json`` + ``merges.txt``, set up
    as Hugging Face's own tokenizers for them are."""
    from tokenizers import Tokenizer, models, processors

    vocab = os.path.join(path, "vocab.json")
    try:
        tok = _byte_level(Tokenizer(models.BPE.from_file(vocab, os.path.join(path, "merges.txt"))))
    except Exception as e:
        raise ConfigError(f"{path}: unreadable vocab.json/merges.txt ({str(e).splitlines()[0][:160]})") from None
    if tok.token_to_id(EOS) is not None:
        # GPT-2's files have <|endoftext|> (id 50256) and no padding token: padding falls back to end-of-text.
        tok.add_special_tokens([t for t in (EOS, PAD) if tok.token_to_id(t) is not None])
        return tok
    missing = [t for t in ("<s>", "</s>") if tok.token_to_id(t) is None]
    if missing:
        raise ConfigError(f"{vocab}: neither GPT-2's {EOS} nor RoBERTa's <s> and </s> are in the vocabulary")
    prefix_space = bool(_tokenizer_config(path).get("add_prefix_space", False))
    tok.pre_tokenizer.add_prefix_space = prefix_space
    tok.add_special_tokens([t for t in ("<s>", "<pad>", "</s>", "<unk>", "<mask>") if tok.token_to_id(t) is not None])
    sep, cls = ("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>"))
    tok.post_processor = processors.RobertaProcessing(sep, cls, trim_offsets=True, add_prefix_space=prefix_space)
    return tok


def _wordpiece_files(path: str):
    """BERT's ``vocab.txt`` with ``tokenizer_config.json``'s ``do_lower_case`` (default true, as BERT's),
    ``strip_accents`` and ``tokenize_chinese_chars``: the WordPiece tokenizer Hugging Face builds from them."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = os.path.join(path, "vocab.txt")
    options = _tokenizer_config(path)
    try:
        tok = Tokenizer(models.WordPiece.from_file(vocab, unk_token="[UNK]"))
    except Exception as e:
        raise ConfigError(f"{vocab}: unreadable WordPiece vocabulary ({str(e).splitlines()[0][:160]})") from None
    missing = [t for t in ("[CLS]", "[SEP]", "[UNK]") if tok.token_to_id(t) is None]
    if missing:
        raise ConfigError(f"{vocab}: no {' '.join(missing)} token in the vocabulary")
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=bool(options.get("tokenize_chinese_chars", True)),
        strip_accents=options.get("strip_accents"), lowercase=bool(options.get("do_lower_case", True)))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens([t for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
                            if tok.token_to_id(t) is not None])
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tok
