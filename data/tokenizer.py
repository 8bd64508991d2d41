"""Tokenizers behind one small interface: ``encode``, ``decode``, ``vocab_size``, ``eos_id``, ``padding_id``.

Two kinds: the built-in byte tokenizer (no training, no files) and byte-level BPE from Hugging Face
``tokenizers``, trained here (``data/train_tokenizer.py``) or loaded from a ``tokenizer.json`` or from the
GPT-2 files a user already has (``vocab.json`` + ``merges.txt``). Byte-level BPE is lossless: decoding an
encoding gives the text back exactly.
"""

from __future__ import annotations

import os
from typing import Iterable, Protocol, Sequence

from config import ConfigError

EOS = "<|endoftext|>"
PAD = "<|padding|>"
T5_EOS, T5_PAD = "</s>", "<pad>"  # T5's (SentencePiece) end-of-text and padding tokens


class Tokenizer(Protocol):
    vocab_size: int
    eos_id: int
    padding_id: int

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_id(self, token: str) -> int | None: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255 and ``<|endoftext|>`` as 256: lossless, needs no training."""

    vocab_size = 257
    eos_id = 256
    padding_id = 256
    name = "bytes"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def token_id(self, token: str) -> int | None:
        return self.eos_id if token == EOS else None


class BPETokenizer:
    """A ``tokenizers.Tokenizer`` (byte-level BPE) with its end-of-text and padding ids."""

    def __init__(self, tokenizer, name: str):
        self.tok, self.name = tokenizer, name
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.eos_id = next((i for i in map(tokenizer.token_to_id, (EOS, T5_EOS)) if i is not None), None)
        if self.eos_id is None:
            raise ConfigError(f"{name}: the tokenizer has no {EOS} (or T5's {T5_EOS}) token")
        pad = next((i for i in map(tokenizer.token_to_id, (PAD, T5_PAD)) if i is not None), None)
        self.padding_id = self.eos_id if pad is None else pad

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(list(texts))]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def token_id(self, token: str) -> int | None:
        """The id of a special (or any whole) token, None when the vocabulary has no such token."""
        return self.tok.token_to_id(token)

    def save(self, path: str) -> None:
        self.tok.save(path)


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


def _byte_level(tok):
    """Byte-level pre-tokenizer and decoder without a prefix space: the exact-round-trip settings."""
    from tokenizers import decoders, pre_tokenizers

    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def train_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int = 2,
              special_tokens: Sequence[str] = ()) -> BPETokenizer:
    """Trains a byte-level BPE on ``texts``: 256 byte tokens, ``<|endoftext|>``, ``<|padding|>`` and any
    ``special_tokens`` (e.g. ``[MASK]`` for masked-LM data), then merges up to ``vocab_size`` tokens in all."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    specials = [EOS, PAD, *special_tokens]
    if vocab_size < 256 + len(specials):
        raise ConfigError(f"vocab_size: {vocab_size} is below {256 + len(specials)} (256 bytes + "
                          f"{', '.join(specials)})")
    tok = _byte_level(HFTokenizer(models.BPE()))
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return BPETokenizer(tok, "trained BPE")


def load_tokenizer(path: str) -> Tokenizer:
    """``"bytes"``, a ``tokenizer.json``, or a directory holding ``tokenizer.json``, GPT-2's ``vocab.json`` and
    ``merges.txt``, or T5's SentencePiece ``spiece.model`` (needs the optional ``sentencepiece`` package).
    Nothing is downloaded: a hub name like ``gpt2`` must be a local directory."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models

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
            return BPETokenizer(HFTokenizer.from_file(path), path)
        except Exception as e:  # tokenizers raises plain Exceptions with multi-line messages
            raise ConfigError(f"{path}: not a tokenizers JSON file ({str(e).splitlines()[0][:160]})") from None
    vocab, merges = os.path.join(path, "vocab.json"), os.path.join(path, "merges.txt")
    if os.path.isdir(path) and os.path.exists(vocab) and os.path.exists(merges):
        try:
            tok = _byte_level(HFTokenizer(models.BPE.from_file(vocab, merges)))
        except Exception as e:
            raise ConfigError(f"{path}: unreadable vocab.json/merges.txt ({str(e).splitlines()[0][:160]})") from None
        if tok.token_to_id(EOS) is None:
            raise ConfigError(f"{vocab}: no {EOS} token in the vocabulary")
        # GPT-2's files have <|endoftext|> (id 50256) and no padding token: padding falls back to end-of-text.
        tok.add_special_tokens([t for t in (EOS, PAD) if tok.token_to_id(t) is not None])
        return BPETokenizer(tok, path)
    raise ConfigError(f"tokenizer_path: {path!r} is neither 'bytes', a tokenizer.json, nor a directory with "
                      "tokenizer.json or vocab.json + merges.txt (nothing is downloaded)")
