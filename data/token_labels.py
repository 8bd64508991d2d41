"""Labelled words for ``task: token_classification`` (named entities, parts of speech): jsonl -> batches.

A dataset config names jsonl files (``path`` for train, ``eval_path`` for eval; globs, ``.jsonl`` or
``.jsonl.zst``) whose lines hold a sentence as words and one label per word, as CoNLL-style datasets do::

    {"tokens": ["EU", "rejects", "German", "call"], "labels": ["B-ORG", "O", "B-MISC", "O"]}

The key names are the dataset config's ``text_key`` and ``label_key`` (defaults ``tokens`` and ``labels``).
Labels are integers, or strings mapped to integers through the dataset config's ``labels`` list (else the
sorted set of the train file's labels); there must be ``num_labels`` of them.

Each word is tokenized on its own (after a space, except the first, so byte-level BPE sees it mid-sentence);
its label goes on its first token and the label -1 (not scored) on the rest, as Hugging Face's token
classification examples do. The row is ``[CLS] tokens [SEP]`` (or end-of-text around them for tokenizers without
[CLS]), cut to n_ctx, right-padded. Batches follow ``ExampleStream``: a pure function of the step, so resuming
is exact; eval rows past the last sentence carry no labels.
"""

from __future__ import annotations

import json

import numpy as np

from config import Config, ConfigError
from data.labelled import (ExampleStream, _dataset, check_not_empty, in_head_order, jsonl_objects, labels_mismatch,
                           mixed_labels, split_files)
from data.tokenizer import Tokenizer, load_tokenizer

IGNORED = -1  # the label of tokens that are not scored: a word's later pieces, special tokens, padding


def read_sentences(pattern: str, where: str, keys: tuple[str, str]) -> tuple[list[list[str]], list[list], list[str]]:
    """(sentences as word lists, their label lists, where each was read) of the files ``pattern`` matches."""
    words_key, labels_key = keys
    sentences, labels, places = [], [], []
    for row, place in jsonl_objects(pattern, where, "sentences"):
        for key, name in ((words_key, "text_key"), (labels_key, "label_key")):
            if key not in row:
                raise ConfigError(f"{place} has no '{key}' field ({name}; it has "
                                  f"{', '.join(map(repr, row)) or 'none'})")
        words, tags = row[words_key], row[labels_key]
        if not (isinstance(words, list) and words and all(isinstance(w, str) and w for w in words)):
            raise ConfigError(f"{place}: '{words_key}' is not a list of words (text_key)")
        if not isinstance(tags, list) or len(tags) != len(words):
            raise ConfigError(f"{place}: '{labels_key}' is not a list of one label per word (label_key; "
                              f"{len(words)} words)")
        for tag in tags:
            check_not_empty(tag, place, labels_key)
        sentences.append(words)
        labels.append(tags)
        places.append(place)
    return sentences, labels, places


def label_table(dataset: dict, train_labels: list[list], num_labels: int) -> list[str] | None:
    """The label strings in id order (the dataset config's ``labels``, else the train file's sorted strings);
    None when the labels are integers. There must be ``num_labels`` of them."""
    names = dataset.get("labels")
    if names is None and any(isinstance(t, str) for tags in train_labels for t in tags):
        names = sorted({t for tags in train_labels for t in tags if isinstance(t, str)})
        other = next((t for tags in train_labels for t in tags if not isinstance(t, str)), None)
        if other is not None:
            raise ConfigError(f"{dataset['where']} path: {mixed_labels(other, names)}")
    if names is not None and len(names) != num_labels:
        raise ConfigError(labels_mismatch(num_labels, dataset["where"], names))
    return names


def label_id(label, names: list[str] | None, num_labels: int, place: str) -> int:
    if isinstance(label, str) and names is not None and label in names:
        return names.index(label)
    if isinstance(label, int) and not isinstance(label, bool) and 0 <= label < num_labels:
        return label
    known = f"one of {', '.join(names)}" if names else f"an integer in 0..{num_labels - 1}"
    raise ConfigError(f"{place}: label {json.dumps(label)} is not {known}")


def word_pieces(tokenizer: Tokenizer, words: list[str]) -> list[list[int]]:
    """Each word's ids as a row holds them: tokenized alone, after a space but for the first (so byte-level BPE
    sees it mid-sentence); a word that encodes to nothing keeps one padding id, so every word has a first token."""
    return [tokenizer.encode(word if i == 0 else " " + word) or [tokenizer.padding_id]
            for i, word in enumerate(words)]


def framed(tokenizer: Tokenizer, ids: list, n_ctx: int) -> list:
    """``[CLS] ids [SEP]`` (end-of-text on both sides for a tokenizer without [CLS]), ``ids`` cut to fit n_ctx."""
    first = getattr(tokenizer, "cls_id", None)
    return [tokenizer.eos_id if first is None else first, *ids[:n_ctx - 2], tokenizer.eos_id]


class TokenLabelSource(ExampleStream):
    """Token-classification batches from sentences held in memory, tokenized once."""

    def __init__(self, sentences, labels, places, names, tokenizer: Tokenizer, n_ctx: int, num_labels: int, *,
                 shuffle: bool, seed: int, description: str):
        self.inputs = np.full((len(sentences), n_ctx), tokenizer.padding_id, np.int32)  # (N, T)
        self.token_labels = np.full((len(sentences), n_ctx), IGNORED, np.int32)  # (N, T)
        self.lengths = np.zeros(len(sentences), np.int32)
        cut = 0
        for row, (words, tags, place) in enumerate(zip(sentences, labels, places)):
            pieces = word_pieces(tokenizer, words)
            ids = framed(tokenizer, [i for word in pieces for i in word], n_ctx)
            scored = [IGNORED]  # [CLS], then each word's label on its first piece
            for tag, word in zip(tags, pieces):
                scored += [label_id(tag, names, num_labels, place)] + [IGNORED] * (len(word) - 1)
            row_labels = scored[:len(ids) - 1] + [IGNORED]
            cut += len(scored) + 1 > n_ctx
            self.inputs[row, :len(ids)], self.token_labels[row, :len(ids)] = ids, row_labels
            self.lengths[row] = len(ids)
        self.labels = np.zeros(len(sentences), np.int32)  # ExampleStream counts examples by this
        self.tokenizer, self.shuffle, self.seed = tokenizer, shuffle, seed
        self.bytes_per_token = None
        self._order = None
        scored = self.token_labels[self.token_labels >= 0]
        names = self.label_names = names or [str(i) for i in range(num_labels)]
        counts = np.bincount(scored, minlength=num_labels)
        self.description = (f"{description}: {len(sentences):,} sentences ({cut:,} cut to n_ctx {n_ctx}), "
                            f"{len(scored):,} labelled words; per label: "
                            + ", ".join(f"{name} {count}" for name, count in zip(names, counts)))

    def batch(self, step: int, batch_size: int, rows: slice | None = None) -> dict:
        """Rows ``rows`` (default all) of global batch ``step``: {"inputs", "segment_ids" (1 real token,
        0 padding), "token_types" (zeros), "labels" (-1 where nothing is scored)}: (rows, n_ctx) int32."""
        ids, weights = self.example_ids(step, batch_size, rows)
        positions = np.arange(self.inputs.shape[1])
        labels = np.where(weights[:, None] > 0, self.token_labels[ids], IGNORED).astype(np.int32)
        return {"inputs": self.inputs[ids], "segment_ids": (positions < self.lengths[ids, None]).astype(np.int32),
                "token_types": np.zeros_like(self.inputs[ids]), "labels": labels}


def token_label_source(cfg: Config, split: str) -> TokenLabelSource:
    """The token-classification source for ``split`` ("train" or "eval") of the config's one dataset."""
    from data.source import check_tokenizer

    dataset = _dataset(cfg)
    where = dataset["where"]
    if dataset["path"].startswith("tfds:"):
        raise ConfigError(f"{where}: token classification reads jsonl files of words and labels, not TFDS")
    tokenizer = load_tokenizer(dataset.get("tokenizer_path", "bytes"))
    check_tokenizer(tokenizer, dataset, cfg)
    keys = (dataset.get("text_key") or "tokens", dataset.get("label_key") or "labels")
    sentences, labels, places = read_sentences(*split_files(dataset, split), keys)
    train_labels = labels if split == "train" or dataset.get("labels") else \
        read_sentences(dataset["path"], f"{where} path", keys)[1]
    names = in_head_order(cfg, label_table(dataset, train_labels, cfg.num_labels), dataset)
    return TokenLabelSource(sentences, labels, places, names, tokenizer, cfg.n_ctx, cfg.num_labels,
                            shuffle=split == "train", seed=cfg.seed, description=f"{split}: {where}")
