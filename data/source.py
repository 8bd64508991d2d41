"""Token sources: every batch is a pure function of (seed, step), so a resumed run reads exactly what the
uninterrupted run would have, and each process can build just its own rows of the global batch.

``make_source(cfg, split)`` is the seam train.py uses; dataset configs (``configs/dataset_configs/ID.json``)
say where tokens come from. The embedded corpus is read into memory and cut into non-overlapping windows of
n_ctx+1 tokens (targets are the inputs shifted by one); train windows are visited in a fresh permutation per
epoch, eval windows in order.
"""

from __future__ import annotations

import json
import os

import numpy as np

from config import Config, ConfigError
from data import corpus
from data.tokenizer import TOKENIZERS, Tokenizer

DATASET_CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                                  "dataset_configs")


def load_dataset_config(name: str) -> dict:
    path = os.path.join(DATASET_CONFIG_DIR, f"{name}.json")
    if not os.path.exists(path):
        known = sorted(f[:-5] for f in os.listdir(DATASET_CONFIG_DIR) if f.endswith(".json"))
        raise ConfigError(f"datasets: no dataset config {path} (known: {', '.join(known)})")
    with open(path) as f:
        return json.load(f)


class WindowSource:
    """Non-overlapping (n_ctx+1)-token windows over one token stream."""

    def __init__(self, tokens: np.ndarray, n_ctx: int, *, shuffle: bool, seed: int, tokenizer: Tokenizer,
                 bytes_per_token: float, name: str):
        self.window = n_ctx + 1
        self.num_windows = (len(tokens) - 1) // n_ctx
        if self.num_windows < 1:
            raise ConfigError(f"datasets: {name} has {len(tokens)} tokens, fewer than one window of n_ctx+1")
        self.tokens, self.n_ctx, self.shuffle, self.seed = tokens, n_ctx, shuffle, seed
        self.tokenizer, self.bytes_per_token = tokenizer, bytes_per_token

    def _window_ids(self, examples: np.ndarray) -> np.ndarray:
        epoch, position = np.divmod(examples, self.num_windows)
        if not self.shuffle:
            return position
        ids = np.empty_like(position)
        for e in np.unique(epoch):
            order = np.random.default_rng([self.seed, int(e)]).permutation(self.num_windows)
            ids[epoch == e] = order[position[epoch == e]]
        return ids

    def batch(self, step: int, batch_size: int, rows: slice | None = None) -> np.ndarray:
        """Rows ``rows`` (default all) of global batch ``step``: (rows, n_ctx+1) int32 tokens."""
        examples = np.arange(step * batch_size, (step + 1) * batch_size, dtype=np.int64)[rows or slice(None)]
        starts = self._window_ids(examples) * self.n_ctx
        return np.stack([self.tokens[s:s + self.window] for s in starts]).astype(np.int32)


def _tokenize(texts: list[str], tokenizer: Tokenizer) -> tuple[np.ndarray, float]:
    ids: list[int] = []
    n_bytes = 0
    for text in texts:
        ids.extend(tokenizer.encode(text))
        ids.append(tokenizer.eos_id)
        n_bytes += len(text.encode("utf-8"))
    return np.asarray(ids, dtype=np.int32), n_bytes / len(ids)


def make_tokenizer(cfg: Config) -> Tokenizer:
    """The tokenizer of the config's (first) dataset."""
    name = cfg.datasets[0][0]
    kind = load_dataset_config(name).get("tokenizer_path", "bytes")
    if kind not in TOKENIZERS:
        raise ConfigError(f"configs/dataset_configs/{name}.json: unknown tokenizer_path '{kind}' "
                          f"(known: {', '.join(TOKENIZERS)})")
    return TOKENIZERS[kind]()


def make_source(cfg: Config, split: str) -> WindowSource:
    """The token source for ``split`` ("train" or "eval") from the config's ``datasets``."""
    if len(cfg.datasets) != 1:
        raise ConfigError("datasets: mixing several datasets needs the TFRecord pipeline; give one dataset")
    name = cfg.datasets[0][0]
    dataset = load_dataset_config(name)
    where = f"configs/dataset_configs/{name}.json"
    if dataset.get("path") != "embedded":
        raise ConfigError(f"{where}: path {json.dumps(dataset.get('path'))} is not readable yet; "
                          "only the embedded corpus ('embedded') is")
    tokenizer = make_tokenizer(cfg)
    if tokenizer.vocab_size > cfg.n_vocab:
        raise ConfigError(f"n_vocab: {cfg.n_vocab} is smaller than the {tokenizer.vocab_size} tokens of "
                          f"{where}'s tokenizer")
    tokens, bytes_per_token = _tokenize(corpus.split(corpus.documents(), split), tokenizer)
    return WindowSource(tokens, cfg.n_ctx, shuffle=split == "train", seed=cfg.seed, tokenizer=tokenizer,
                        bytes_per_token=bytes_per_token, name=f"{name} ({split})")
