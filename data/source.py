"""Token sources: every batch is a pure function of (config, step), so a resumed run reads exactly what the
uninterrupted run would have, and each process builds just its own rows of the global batch.

``make_source(cfg, split)`` is the seam train.py uses. ``cfg.datasets`` is GPT-Neo's
``[[id, stitch, sampling_mode, weight], ...]``; ``id`` names ``configs/dataset_configs/ID.json`` or is
``tfds:NAME[/CONFIG]`` (a TFDS text dataset prepared in ``tfds_data_dir``) or is the path of a dataset config
file (``.../dataset.json``, as data/make_dataset.py writes). Two kinds of source:

* ``WindowSource``: the embedded corpus held in memory (``path: "embedded"``): no TensorFlow needed.
* ``TFDataSource`` (``data/tf_source.py``): TFRecords (GPT-Neo's format, ``path``/``eval_path`` globs) and TFDS
  through tf.data (``data/pipeline.py``): parallel reads, seeded shuffles, sampling modes, weighted mixing,
  prefetch; read as ``data_shards`` shards of which each process builds only those its rows need
  (``data/shards.py``); its position is saved with each checkpoint, so a resumed run re-reads nothing.

Both have ``batch(step, batch_size, rows)``, ``state(batch_size)`` (the position to checkpoint, or None) and
``restore(step, batch_size, rows, saved)`` (one line saying what was restored, or None when nothing needs to be).

``task: sequence_classification`` reads labelled examples instead (jsonl or TFDS): ``data/labelled.py``;
``task: token_classification`` labelled words: ``data/token_labels.py``; ``task: question_answering`` SQuAD's questions
and contexts (jsonl or TFDS): ``data/squad.py``; ``task: seq2seq`` without span corruption
(input, target) pairs from jsonl: ``data/pairs.py``;
``task: image_classification`` labelled images (embedded digits or TFDS): ``data/images.py``.

Relative paths in the shipped dataset configs are relative to the repository root (the current directory when
NeoMesh is installed, see neomesh/paths.py); in a dataset config given by its path, relative to its folder.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os

import numpy as np

from config import DATASET_KEYS, Config, ConfigError, closest, json_names
from data import corpus
from data.shards import shard_files, shard_seed
from data.tf_source import TFDataSource
from data.tokenizer import Tokenizer, load_tokenizer, tokenizer_hash
from neomesh import paths
from neomesh.json_file import read_json

DATASET_CONFIG_DIR = os.path.join(paths.configs_dir(), "dataset_configs")
SHUFFLE_BUFFER = 1000  # documents (and windows) held for shuffling; GPT-Neo used 1000 * stitch


class NoEvalSet(ConfigError):
    """No dataset has an eval set (GPT-Neo's ``"eval_path": ""``): train.py skips evaluation with a note."""


def load_dataset_config(name: str) -> dict:
    """``configs/dataset_configs/NAME.json``, or the dataset config file ``name`` ends in ``.json``; checked, with
    relative paths made absolute."""
    by_path = name.endswith(".json")
    path = name if by_path else os.path.join(DATASET_CONFIG_DIR, f"{name}.json")
    if not os.path.exists(path) and os.path.exists(name):  # a file or folder, but not a dataset config
        from data.text_files import SUFFIXES

        if name.endswith((".tfrecords", ".tfrecord")):
            raise ConfigError(f"datasets: {name} is TFRecords, not a dataset config: name them in a dataset config's "
                              "path (create_tfrecords.py --write-dataset-config writes one)")
        if os.path.isdir(name) or name.endswith(SUFFIXES):
            raise ConfigError(f"datasets: {name} is not a dataset config; to train on text, give it as --data {name}")
    if not os.path.exists(path):
        names = json_names(DATASET_CONFIG_DIR)
        close = None if by_path else closest(name, names)
        raise ConfigError(f"datasets: no dataset config {path}" + (f"; did you mean '{close}'?" if close else "")
                          + f" (known: {', '.join(names)}; or tfds:NAME, or the path of a dataset config .json)")
    where = name if by_path else f"configs/dataset_configs/{name}.json"
    base = os.path.dirname(os.path.abspath(path)) if by_path else paths.work_root()
    dataset = read_json(path, where)
    if not isinstance(dataset, dict):
        raise ConfigError(f"{where}: a dataset config is a JSON object ({{\"path\": ...}}), not a "
                          f"{type(dataset).__name__}")
    unknown = sorted(set(dataset) - DATASET_KEYS)
    if unknown and "path" not in dataset and {"n_layer", "n_embd", "attention_types", "model"} & set(dataset):
        raise ConfigError(f"{where}: a model config, not a dataset config (it has '{unknown[0]}'); give it as "
                          f"--config {where}")
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), DATASET_KEYS, 1)
        raise ConfigError(f"{where}: unknown key '{unknown[0]}'" + (f"; did you mean '{close[0]}'?" if close else
                                                                     f" (known: {', '.join(sorted(DATASET_KEYS))})"))
    if "path" not in dataset:
        raise ConfigError(f"{where}: no 'path' (a TFRecord glob, tfds:NAME, or embedded)")
    check_counts(dataset, where)
    for key in ("path", "eval_path", "tokenizer_path", "data_dir", "lambada_tokens_path"):
        value = dataset.get(key)
        if isinstance(value, str) and value not in ("", "embedded", "bytes") and not value.startswith("tfds:") \
                and "://" not in value and not os.path.isabs(value):
            dataset[key] = os.path.join(base, value)
    return {**dataset, "where": where}


COUNT_KEYS = {"n_vocab": 1, "vocab_size": 1, "shuffle_buffer": 1, "eos_id": 0, "padding_id": 0}  # key: least value


def check_counts(dataset: dict, where: str) -> None:
    """A dataset config's counts and ids are integers from their least value up (or null): a string or a 0 buffer
    otherwise reached TensorFlow's shuffle as a traceback, and ``"eos_id": "0"`` read as another id than 0."""
    for key, least in COUNT_KEYS.items():
        value = dataset.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < least):
            raise ConfigError(f"{where}: {key} {json.dumps(value)} must be an integer of at least {least} (or null)")


class WindowSource:
    """Non-overlapping (n_ctx+1)-token windows over one in-memory token stream (no TensorFlow)."""

    def __init__(self, tokens: np.ndarray, n_ctx: int, *, shuffle: bool, seed: int, tokenizer: Tokenizer,
                 bytes_per_token: float, name: str):
        self.window = n_ctx + 1
        self.num_windows = (len(tokens) - 1) // n_ctx
        if self.num_windows < 1:
            raise ConfigError(f"datasets: {name} has {len(tokens)} tokens, fewer than one window of n_ctx+1")
        self.tokens, self.n_ctx, self.shuffle, self.seed = tokens, n_ctx, shuffle, seed
        self.tokenizer, self.bytes_per_token = tokenizer, bytes_per_token
        self.description = f"{name}: {len(tokens):,} tokens in memory, {self.num_windows:,} windows per epoch"

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

    def state(self, batch_size: int) -> None:
        """Nothing to save: any batch is computed directly from its step (O(1))."""
        return None

    def restore(self, step: int, batch_size: int, rows: slice, saved) -> None:
        return None


def _embedded_source(cfg: Config, dataset: dict, split: str) -> WindowSource:
    where = dataset["where"]
    if len(cfg.datasets) != 1 or cfg.datasets[0][2] not in (None, "chunks") or cfg.datasets[0][1] is not None:
        raise ConfigError(f"datasets: {where} (the in-memory embedded corpus) is read alone, in 'chunks' mode; "
                          "mixing and sampling modes are for TFRecord datasets (e.g. embedded_bpe)")
    tokenizer = load_tokenizer(dataset.get("tokenizer_path", "bytes"), f"{where} tokenizer_path")
    if tokenizer.vocab_size > cfg.n_vocab:
        raise ConfigError(f"n_vocab: {cfg.n_vocab} is smaller than the {tokenizer.vocab_size} tokens of "
                          f"{where}'s tokenizer")
    ids: list[int] = []
    n_bytes = 0
    for text in corpus.split(corpus.documents(), split):
        ids.extend(tokenizer.encode(text))
        ids.append(tokenizer.eos_id)
        n_bytes += len(text.encode("utf-8"))
    return WindowSource(np.asarray(ids, dtype=np.int32), cfg.n_ctx, shuffle=split == "train", seed=cfg.seed,
                        tokenizer=tokenizer, bytes_per_token=n_bytes / len(ids), name=f"{where} ({split})")


def check_tokenizer(tokenizer: Tokenizer, dataset: dict, cfg: Config) -> None:
    where = dataset["where"]
    if tokenizer.vocab_size > cfg.n_vocab:
        raise ConfigError(f"n_vocab: {cfg.n_vocab} is smaller than the {tokenizer.vocab_size} tokens of "
                          f"{where}'s tokenizer")
    if dataset.get("n_vocab") is not None and dataset["n_vocab"] < tokenizer.vocab_size:
        raise ConfigError(f"{where}: n_vocab {dataset['n_vocab']} is smaller than the {tokenizer.vocab_size} tokens "
                          f"of its tokenizer {dataset.get('tokenizer_path', 'bytes')}; set it to at least "
                          f"{tokenizer.vocab_size} (more leaves padding rows)")
    if dataset.get("eos_id") is not None and dataset["eos_id"] != tokenizer.eos_id:
        raise ConfigError(f"{where}: eos_id {dataset['eos_id']} is not the tokenizer's end-of-text id "
                          f"{tokenizer.eos_id}")


MASK_TOKENS = ("[MASK]", "<mask>")  # BERT's and RoBERTa's


def with_mask_token(cfg: Config, tokenizer: Tokenizer) -> Config:
    """``cfg`` with ``mlm_mask_token_id`` filled in from the tokenizer's [MASK] or <mask> token when unset."""
    if cfg.mlm_mask_token_id is not None:
        return cfg
    found = next((i for i in map(tokenizer.token_id, MASK_TOKENS) if i is not None), None)
    if found is None:
        raise ConfigError(f"mlm_mask_token_id: not set, and the tokenizer has no {' or '.join(MASK_TOKENS)} token; "
                          "set it to the id masked tokens become, or prepare the text with train.py --data or "
                          "data/make_dataset.py --config, which train [MASK] into the BPE")
    return cfg.replace(mlm_mask_token_id=found)


def configured_tokenizer(cfg: Config) -> str | None:
    """The ``tokenizer_path`` a config reads its text with, found without reading or preparing any data: its own,
    else its first dataset's ("bytes" for TFDS and by default); None where the dataset config cannot be read."""
    name = cfg.datasets[0][0]
    if cfg.tokenizer_path or name.startswith("tfds:"):
        return cfg.tokenizer_path or "bytes"
    try:
        return load_dataset_config(name).get("tokenizer_path", "bytes")
    except ConfigError:
        return None


def make_tokenizer(cfg: Config) -> Tokenizer:
    """The tokenizer of the config's first dataset (``tokenizer_path`` overrides it), without reading any data;
    a dataset that prepares its own tokenizer (embedded_bpe) is prepared first."""
    name = cfg.datasets[0][0]
    if cfg.tokenizer_path:
        return load_tokenizer(cfg.tokenizer_path)
    dataset = {"path": name, "where": name} if name.startswith("tfds:") else load_dataset_config(name)
    if dataset.get("prepare"):
        from data.prepare import ensure_prepared
        ensure_prepared(dataset, dataset["where"], cfg.n_ctx)
    return load_tokenizer(dataset.get("tokenizer_path", "bytes"), f"{dataset['where']} tokenizer_path")


def check_one_tokenizer(datasets: list[dict], tokenizers: list[Tokenizer]) -> None:
    """Mixed datasets share one tokenizer: the same size, and the same vocabulary (two BPEs of one size give one
    id to different tokens). A one-line error naming the first dataset whose tokenizer differs from the first's."""
    sizes = {t.vocab_size for t in tokenizers}
    if len(sizes) > 1:
        k = next(k for k, t in enumerate(tokenizers) if t.vocab_size != tokenizers[0].vocab_size)
        first, other = datasets[0], datasets[k]
        raise ConfigError(f"datasets: the mixed datasets use tokenizers of different sizes: {first['where']} reads "
                          f"with {first['tokenizer_path']} ({tokenizers[0].vocab_size} tokens), {other['where']} with "
                          f"{other['tokenizer_path']} ({tokenizers[k].vocab_size}); mixed datasets must share one "
                          "tokenizer")
    hashes = [tokenizer_hash(t) for t in tokenizers] if len(tokenizers) > 1 else []
    other = next((k for k, h in enumerate(hashes) if None not in (h, hashes[0]) and h != hashes[0]), None)
    if other is not None:
        first, second = datasets[0], datasets[other]
        raise ConfigError(f"datasets: the mixed datasets use different tokenizers of the same size "
                          f"{sizes.pop()}: {first['where']} reads with {first['tokenizer_path']}, {second['where']} "
                          f"with {second['tokenizer_path']}, whose vocabularies differ; mixed datasets must share "
                          "one tokenizer")


def window_length(cfg: Config) -> int:
    """New tokens each token window takes from the stream (``windows()`` cuts one more, shared with the next): the
    context, or a span-corruption example's input tokens before its spans are cut."""
    return cfg.span_lengths[0] - 1 if cfg.span_corruption else cfg.n_ctx


def check_not_examples(dataset: dict, task: str) -> None:
    """A token stream's dataset config that names jsonl files (the examples of the classifier and pair tasks) is one
    line: read as TFRecords, its first record was 'corrupt'."""
    for key in ("path", "eval_path"):
        path = dataset.get(key)
        if isinstance(path, str) and path.endswith((".jsonl", ".jsonl.zst")):
            raise ConfigError(f"{dataset['where']} {key}: {path} is jsonl, the examples of a classifier or of seq2seq "
                              f"pairs; task {task} reads TFRecords of tokens (train.py --data FOLDER, or "
                              "make_dataset.py, makes them from text)")


def make_source(cfg: Config, split: str):
    """The token source for ``split`` ("train" or "eval") from the config's ``datasets``."""
    from data.pipeline import check_mode, check_weight

    if cfg.task == "token_classification":
        from data.token_labels import token_label_source
        return token_label_source(cfg, split)
    if cfg.task == "sequence_classification":
        from data.labelled import labelled_source
        return labelled_source(cfg, split)
    if cfg.task == "question_answering":
        from data.squad import answer_source
        return answer_source(cfg, split)
    if cfg.task == "image_classification":
        from data.images import image_source
        return image_source(cfg, split)
    if cfg.task == "seq2seq" and not cfg.span_corruption:
        from data.pairs import pair_source
        return pair_source(cfg, split)

    datasets, entries, without_eval = [], [], []
    for entry in cfg.datasets:
        name = entry[0]
        if name.startswith("tfds:"):
            dataset = {"path": name, "where": name, "data_dir": cfg.tfds_data_dir}
            if cfg.tokenizer_path:
                dataset["tokenizer_path"] = cfg.tokenizer_path
        else:
            dataset = load_dataset_config(name)
        if cfg.span_corruption:
            from data.pairs import pairs_mistake
            mistake = pairs_mistake(cfg, dataset)
            if mistake:
                raise ConfigError(mistake)
        check_not_examples(dataset, cfg.task)
        if split == "eval" and dataset.get("eval_path") == "":
            without_eval.append(dataset["where"])  # the file read: a config named by path is not under configs/
            continue  # GPT-Neo's way of saying "no eval set"
        if split == "train" and dataset["path"] == "":
            raise ConfigError(f"{dataset['where']}: 'path' is empty: an eval-only dataset config, which train.py "
                              "--eval reads; give a TFRecord glob to train on it")
        datasets.append(dataset)
        entries.append(entry)
    if not datasets:
        raise NoEvalSet(f"datasets: no eval set ('eval_path' is empty in {', '.join(without_eval)})")
    embedded = next((d for d in datasets if d["path"] == "embedded"), None)
    if embedded:
        return _embedded_source(cfg, embedded, split)
    # Text datasets (TFDS) take the tokenizer of the first dataset config when none is set.
    # Errors name the key that gave the path: a dataset config's, else the config's own tokenizer_path.
    first = next((d for d in datasets if "tokenizer_path" in d), None)
    default_tokenizer = cfg.tokenizer_path or (first["tokenizer_path"] if first else "bytes")
    default_where = f"{first['where']} tokenizer_path" if first and not cfg.tokenizer_path else "tokenizer_path"
    wheres = [f"{d['where']} tokenizer_path" if "tokenizer_path" in d and not d["where"].startswith("tfds:")
              else default_where for d in datasets]
    for d in datasets:
        d.setdefault("tokenizer_path", default_tokenizer)
        if d.get("prepare"):
            from data.prepare import ensure_prepared
            ensure_prepared(d, d["where"], cfg.n_ctx)
    tokenizers = [load_tokenizer(d["tokenizer_path"], where) for d, where in zip(datasets, wheres)]
    for tokenizer, dataset in zip(tokenizers, datasets):
        check_tokenizer(tokenizer, dataset, cfg)
    if cfg.mlm_training:
        cfg = with_mask_token(cfg, tokenizers[0])
    window = window_length(cfg)
    if cfg.span_corruption:
        from data.spans import sentinel_count, sentinel_ids

        sentinels = sentinel_ids(tokenizers[0], cfg.n_vocab, sentinel_count(cfg), datasets[0]["where"])
    check_one_tokenizer(datasets, tokenizers)
    from data.pipeline import mix, open_tfds, shard_batches, tfrecord_documents, windows
    from data.tfds_text import tokenized_split
    from data.tf_import import tensorflow
    from data.tfrecords import check_sizes, check_vocab, list_files, read_indexes

    tf = tensorflow()
    shuffle = split == "train"
    shards = cfg.data_shards
    plan, all_files, weights, token_bytes, identity = [], [], [], [], []
    for k, (entry, dataset, tokenizer) in enumerate(zip(entries, datasets, tokenizers)):
        where = dataset["where"]
        mode, stitch = check_mode(entry, where)
        weight = check_weight(entry, where)
        seed = cfg.seed * 1000 + 10 * k  # every entry and every stage draws its own stream
        buffer = dataset.get("shuffle_buffer") or SHUFFLE_BUFFER  # null: the default
        if dataset["path"].startswith("tfds:"):  # tokenized once into TFRecords, then read like any files
            name = dataset["path"][len("tfds:"):]
            tfds_split = dataset.get(f"{split}_split", "train" if split == "train" else "validation")
            text_key = dataset.get("text_key", "text")
            builder = open_tfds(name, dataset.get("data_dir"), tfds_split, text_key)
            files = tokenized_split(builder, name, tfds_split, text_key, tokenizer, dataset["tokenizer_path"])
        else:
            pattern = dataset["path"] if split == "train" else dataset.get("eval_path")
            if pattern is None:
                raise ConfigError(f"{where}: no 'eval_path' for evaluation; add one or set eval_steps to 0")
            files = list_files(pattern, f"{where} {'path' if split == 'train' else 'eval_path'}")
        indexes = read_indexes(files)
        check_vocab(indexes, tokenizer, cfg.n_vocab, where)
        sizes = {f: tf.io.gfile.stat(f).length for f in files}
        check_sizes(indexes, sizes)
        all_files += files
        plan.append((files, mode, stitch, seed, buffer))
        identity.append([[os.path.basename(f), sizes[f]] for f in files])
        full = len(indexes) == len(files)
        records = sum(i["records"] for i in indexes.values())
        if full and shards > len(files) and records < shards:  # shards split records: each needs one at least
            raise ConfigError(f"data_shards: {shards} is more than the {records} records of {where} "
                              f"({split}); a shard reads an even part of them")
        token_bytes.append((sum(i["tokens"] for i in indexes.values()), sum(i["bytes"] for i in indexes.values()))
                           if full else None)
        weights.append(weight)

    def build_shard(shard: int, block: int, start: int):
        """Shard ``shard``'s stream of ``block``-row blocks of global batches ``start``, ``start + 1``, ..."""
        streams = []
        for files, mode, stitch, seed, buffer in plan:
            seed = shard_seed(seed, shard)
            files, record_shard = shard_files(files, shards, shard)
            docs = tfrecord_documents(tf, files, n_vocab=cfg.n_vocab, shuffle=shuffle, seed=seed,
                                      shuffle_buffer=buffer, record_shard=record_shard)
            streams.append(windows(tf, docs, window, mode, stitch, shuffle=shuffle, seed=seed,
                                   shuffle_buffer=buffer))
        stream = mix(tf, streams, weights, shard_seed(cfg.seed * 1000 + 7, shard))
        if cfg.mlm_training:
            from data.mlm import mlm_stage
            stream = mlm_stage(tf, stream, cfg, shard_seed(cfg.seed * 1000 + 8, shard))
        elif cfg.span_corruption:
            from data.spans import span_stage
            stream = span_stage(tf, stream, cfg, sentinels, tokenizers[0].eos_id, tokenizers[0].padding_id,
                                shard_seed(cfg.seed * 1000 + 9, shard))
        return shard_batches(tf, stream, block, start)

    bytes_per_token = None
    if all(tb is not None for tb in token_bytes):
        total = sum(weights)
        bytes_per_token = sum(w / total * b / max(t, 1) for w, (t, b) in zip(weights, token_bytes))
    names = ", ".join(f"{d['where']} ({check_mode(e, d['where'])[0]}, weight {w:g})"
                      for d, e, w in zip(datasets, entries, weights))
    description = f"{split}: {names}; {len(all_files)} TFRecord files" + (
        f", {sum(t for t, _ in token_bytes):,} tokens" if bytes_per_token else "") + (
        f"; {shards} shards" if shards > 1 else "")
    fingerprint = _fingerprint(cfg, split, identity, [p[1:] for p in plan], weights)
    return TFDataSource(build_shard, shards, all_files, tokenizers[0], bytes_per_token, description,
                        memoize=not shuffle, fingerprint=fingerprint)


def _fingerprint(cfg: Config, split: str, identity: list, stages: list, weights: list[float]) -> str:
    """What decides the stream (files and their sizes, modes, seeds, buffers, weights, n_ctx, MLM settings,
    shards): a saved input position is restored only into the same stream."""
    mlm = {k: v for k, v in cfg.to_dict().items() if k.startswith("mlm_")}
    what = [split, identity, stages, weights, cfg.n_ctx, cfg.n_vocab, cfg.seed, cfg.data_shards, mlm]
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]
