"""(input, target) pairs for ``task: seq2seq`` without span corruption: jsonl files -> encoder-decoder batches.

This is how T5 is fine-tuned on a task of one's own (summarization, translation, "question: ... context: ..."). A
dataset config names jsonl files (``path`` for train, ``eval_path`` for eval; globs, ``.jsonl`` or ``.jsonl.zst``)
whose lines hold an input text and its target text::

    {"inputs": "The cat sat on the mat all day long.", "targets": "A cat sat."}

The key names are the dataset config's ``inputs_key`` and ``targets_key`` (defaults ``inputs`` and ``targets``,
T5's feature names and the batch's; Hugging Face's ``source``/``target`` files need
``"inputs_key": "source", "targets_key": "target"``). ``prefix`` is put before every input, as T5's task prefixes
(``"summarize: "``, ``"translate English to German: "``).

Each text is tokenized once with the run's tokenizer, cut to leave room for end-of-text and ended with it, as
Hugging Face's T5 tokenizer does with ``truncation=True``: inputs to ``n_ctx`` tokens, targets to the config's
``decoder_ctx`` (``n_decoder_ctx``, else n_ctx); both right-padded, with segment id 1 on real tokens and 0 on
padding. How many were cut is counted and said at start. Batches follow ``ExampleStream``: a pure function of the
step (train: a seeded permutation per epoch; eval: in order), so resuming is exact; eval rows past the last pair
have no target tokens, so they weigh nothing.

With ``pack_pairs`` several pairs share a row, as T5's seqio packs them: pair k of a row has segment id k on its
input and its target tokens, so it attends only to itself (the model masks across segments and restarts the
decoder's shifted-right targets at each; T5's relative positions need no reset). Rows are packed once at start,
first fit over the last ``OPEN_ROWS`` rows, the train pairs taken in a seeded order (so row-mates differ from file
neighbours) and the eval pairs in file order; the epochs then shuffle the rows. The loss is per target token either
way, so packing changes how many pairs a step sees, not what each pair weighs.
"""

from __future__ import annotations

import numpy as np

from config import Config, ConfigError
from data.labelled import ExampleStream, _dataset, jsonl_objects, split_files
from data.tokenizer import Tokenizer, load_tokenizer

INPUTS_KEY, TARGETS_KEY = "inputs", "targets"
SUFFIXES = (".jsonl", ".jsonl.zst")
OPEN_ROWS = 64  # rows a pair may still go into when packing: near first fit's density, in linear time
PACKING_STREAM = 0x7061636B  # the train pairs' packing order draws from (seed, this), the epochs from (seed, epoch)


def is_pairs_path(path) -> bool:
    """Whether a dataset config's ``path`` names jsonl files (pairs), not TFRecords of tokens."""
    return isinstance(path, str) and path.endswith(SUFFIXES)


def read_pairs(pattern: str, where: str, keys: tuple[str, str] = (INPUTS_KEY, TARGETS_KEY)
               ) -> tuple[list[str], list[str], list[str]]:
    """(inputs, targets, where each pair was read) of the jsonl files ``pattern`` matches, in file order."""
    inputs_key, targets_key = keys
    inputs, targets, places = [], [], []
    for row, place in jsonl_objects(pattern, where, "pairs"):
        for key, name in ((inputs_key, "inputs_key"), (targets_key, "targets_key")):
            if key not in row:
                raise ConfigError(f"{place} has no '{key}' field ({name}; it has "
                                  f"{', '.join(map(repr, row)) or 'none'})")
            if not isinstance(row[key], str):
                raise ConfigError(f"{place}: '{key}' is not a string ({name})")
        if not row[targets_key].strip():
            raise ConfigError(f"{place}: '{targets_key}' is empty: a pair needs a target to learn (targets_key)")
        inputs.append(row[inputs_key])
        targets.append(row[targets_key])
        places.append(place)
    return inputs, targets, places


def ended(tokens: list[int], length: int, eos: int) -> tuple[list[int], bool]:
    """(``tokens`` cut to their first ``length - 1`` and ended with end-of-text ``eos``, whether any were cut): an
    encoder input as training reads it (transformers' ``truncation=True`` keeps the start, where T5's task prefix
    is). An ``eos`` already at the end (SentencePiece's tokenizers add it) is not doubled. Shared by training,
    predict.py and ``Pretrained``, so all three cut a long input alike."""
    if tokens and tokens[-1] == eos:
        tokens = tokens[:-1]
    return tokens[:length - 1] + [eos], len(tokens) > length - 1


def encode_ended(tokenizer: Tokenizer, texts: list[str], length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids (N, length) right-padded, real lengths (N,), which were cut (N,) bool): each text's tokens as
    ``ended`` cuts them."""
    ids = np.full((len(texts), length), tokenizer.padding_id, np.int32)  # (N, length)
    lengths = np.zeros(len(texts), np.int32)
    cut = np.zeros(len(texts), bool)
    for row, tokens in enumerate(tokenizer.encode_batch(texts)):
        tokens, cut[row] = ended(tokens, length, tokenizer.eos_id)
        ids[row, :len(tokens)] = tokens
        lengths[row] = len(tokens)
    return ids, lengths, cut


def pack_rows(input_lengths: np.ndarray, target_lengths: np.ndarray, n_inputs: int, n_targets: int,
              order: np.ndarray, open_rows: int = OPEN_ROWS) -> list[list[int]]:
    """Pairs (indices, taken in ``order``) grouped into rows of at most ``n_inputs`` input and ``n_targets`` target
    tokens: each goes into the first of the ``open_rows`` newest rows with room for both, else starts a row."""
    rows: list[list[int]] = []
    open_ids: list[int] = []  # rows still open, oldest first
    room = np.zeros((0, 2), np.int64)  # (open rows, [input, target] tokens left)
    for pair in order:
        need = (input_lengths[pair], target_lengths[pair])
        fits = np.flatnonzero((room[:, 0] >= need[0]) & (room[:, 1] >= need[1]))
        if fits.size:
            at = int(fits[0])
            rows[open_ids[at]].append(int(pair))
            room[at] -= need
            continue
        if len(open_ids) == open_rows:
            open_ids, room = open_ids[1:], room[1:]
        rows.append([int(pair)])
        open_ids.append(len(rows) - 1)
        room = np.concatenate([room, [[n_inputs - need[0], n_targets - need[1]]]])
    return rows


def packed(ids: np.ndarray, lengths: np.ndarray, rows: list[list[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, segment ids), each (rows, width): the real tokens of each row's pairs one after another, pair k
    (from 1) with segment id k, then padding (segment id 0)."""
    width = ids.shape[1]
    tokens = np.full((len(rows), width), pad, ids.dtype)
    segments = np.zeros((len(rows), width), np.min_scalar_type(width))  # at most one pair per token
    for row, pairs in enumerate(rows):
        at = 0
        for k, pair in enumerate(pairs, 1):
            n = lengths[pair]
            tokens[row, at:at + n], segments[row, at:at + n] = ids[pair, :n], k
            at += n
    return tokens, segments


class PairSource(ExampleStream):
    """seq2seq batches from (input, target) pairs held in memory, tokenized once."""

    def __init__(self, inputs: list[str], targets: list[str], places: list[str], tokenizer: Tokenizer, n_ctx: int,
                 n_targets: int, *, prefix: str = "", shuffle: bool, seed: int, description: str,
                 pack: bool = False):
        if n_ctx < 2 or n_targets < 2:
            raise ConfigError(f"n_ctx {n_ctx} / n_decoder_ctx {n_targets}: a pair needs at least 2 tokens on each "
                              "side (a text and end-of-text)")
        input_ids, input_lengths, cut_inputs = encode_ended(tokenizer, [prefix + t for t in inputs], n_ctx)
        target_ids, target_lengths, cut_targets = encode_ended(tokenizer, targets, n_targets)
        self.tokenizer, self.shuffle, self.seed = tokenizer, shuffle, seed
        self.bytes_per_token = None  # losses of targets alone have no bits per byte of the text
        self._order = None
        self.cut = (int(cut_inputs.sum()), int(cut_targets.sum()))
        rows = [[pair] for pair in range(len(inputs))]  # row r holds the pairs rows[r]
        if pack:
            order = np.random.default_rng([seed, PACKING_STREAM]).permutation(len(inputs)) if shuffle else \
                range(len(inputs))
            rows = pack_rows(input_lengths, target_lengths, n_ctx, n_targets, order)
        self.inputs, self.segment_ids = packed(input_ids, input_lengths, rows, tokenizer.padding_id)
        self.targets, self.target_segment_ids = packed(target_ids, target_lengths, rows, tokenizer.padding_id)

        def first(cut):
            return f", the first {places[int(np.argmax(cut))]}" if cut.any() else ""

        self.description = (f"{description}: {len(inputs):,} pairs; {self.cut[0]:,} inputs cut to n_ctx {n_ctx}"
                            f"{first(cut_inputs)}; {self.cut[1]:,} targets cut to n_decoder_ctx {n_targets}"
                            f"{first(cut_targets)}; tokens per pair: {input_lengths.mean():.1f} in, "
                            f"{target_lengths.mean():.1f} out")
        if pack:
            self.row_name = f"packed rows ({len(inputs):,} pairs)"
            self.description += (f"; packed into {len(rows):,} rows ({len(inputs) / len(rows):.2f} pairs per row, "
                                 f"{input_lengths.sum() / self.inputs.size:.0%} of input and "
                                 f"{target_lengths.sum() / self.targets.size:.0%} of target positions filled)")

    def __len__(self) -> int:
        return len(self.inputs)

    def batch(self, step: int, batch_size: int, rows: slice | None = None) -> dict:
        """Rows ``rows`` (default all) of global batch ``step``: {"inputs", "segment_ids": (rows, n_ctx),
        "targets", "target_segment_ids": (rows, n_decoder_ctx)} int32; segment id k on the tokens of a row's k-th
        pair (1: its only one, unpacked), 0 on padding and on every target token of an eval row past the last."""
        ids, weights = self.example_ids(step, batch_size, rows)
        return {"inputs": self.inputs[ids], "segment_ids": self.segment_ids[ids].astype(np.int32),
                "targets": self.targets[ids],
                "target_segment_ids": self.target_segment_ids[ids].astype(np.int32) * (weights > 0)[:, None]}


def pairs_mistake(cfg: Config, dataset: dict) -> str | None:
    """Why ``dataset`` cannot feed ``cfg``'s seq2seq task, or None: span corruption cuts spans out of text
    (TFRecords of tokens, the embedded corpus), while pairs come from jsonl files."""
    path, where = dataset["path"], dataset["where"]
    if cfg.task != "seq2seq" or path == "" or path.startswith("tfds:"):
        return None
    if cfg.span_corruption and is_pairs_path(path):
        return (f"span_corruption: true cuts spans out of plain text, but {where} names (input, target) pairs "
                f"({path}); --set span_corruption=false trains on its pairs")
    if cfg.span_corruption or is_pairs_path(path):
        return None
    if path == "embedded" or path.endswith((".tfrecords", ".tfrecord")):
        return (f"span_corruption: false, so task seq2seq reads (input, target) pairs from jsonl files, but {where} "
                f"names text ({path}); --set span_corruption=true makes its batches from the text's tokens")
    return (f"{where} path: {path} is not jsonl (.jsonl or .jsonl.zst): task seq2seq reads (input, target) pairs, "
            f'one {{"{dataset.get("inputs_key") or INPUTS_KEY}": ..., "{dataset.get("targets_key") or TARGETS_KEY}": '
            "...} object per line")


def pair_source(cfg: Config, split: str) -> PairSource:
    """The seq2seq source for ``split`` ("train" or "eval") of the config's one dataset of pairs."""
    from data.source import check_tokenizer

    dataset = _dataset(cfg)
    where = dataset["where"]
    if dataset["path"].startswith("tfds:"):
        raise ConfigError(f"{where}: seq2seq pairs are read from jsonl files, not TFDS")
    if split == "train" and dataset["path"] == "":
        raise ConfigError(f"{where}: 'path' is empty: an eval-only dataset config, which train.py --eval reads")
    mistake = pairs_mistake(cfg, dataset)
    if mistake:
        raise ConfigError(mistake)
    tokenizer = load_tokenizer(dataset.get("tokenizer_path", "bytes"), f"{where} tokenizer_path")
    check_tokenizer(tokenizer, dataset, cfg)
    keys = (dataset.get("inputs_key") or INPUTS_KEY, dataset.get("targets_key") or TARGETS_KEY)
    prefix = dataset.get("prefix", "")
    if not isinstance(prefix, str):
        raise ConfigError(f"{where}: prefix must be a string (put before every input), got {prefix!r}")
    inputs, targets, places = read_pairs(*split_files(dataset, split), keys)
    return PairSource(inputs, targets, places, tokenizer, cfg.n_ctx, cfg.decoder_ctx, prefix=prefix,
                      shuffle=split == "train", seed=cfg.seed, description=f"{split}: {where}", pack=cfg.pack_pairs)
