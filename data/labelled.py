"""Labelled examples for ``task: sequence_classification``: jsonl files or a TFDS dataset -> classifier batches.

A dataset config names jsonl files (``path`` for train, ``eval_path`` for eval; globs, ``.jsonl`` or
``.jsonl.zst``) whose lines are objects with a text, an optional second text and a label::

    {"text": "The cat sat.", "text_pair": "A cat was sitting.", "label": "equivalent"}

The key names are the dataset config's ``text_key``, ``text_pair_key`` and ``label_key`` (defaults ``text``,
``text_pair``, ``label``; a file without ``text`` is read by the TFDS names below, GLUE's ``sentence1`` and
``sentence2`` first, one without ``label`` by ``labels``). Labels are integers, or strings mapped to integers
through the dataset config's ``labels`` list (else through the sorted set of the train file's labels); there must
be ``num_labels`` of them.
With ``num_labels`` 1 (Hugging Face's regression) a label is a number, the text's score (``"label": 3.8``).
With ``multi_label`` a label is a list of label names or ids, any number of them (``"labels": ["sports",
"politics"]``; ``[]``: none applies), as Hugging Face's go_emotions holds them; TFDS datasets are read
single-label.
``tfds:NAME[/CONFIG]`` reads a TFDS dataset prepared in a local data dir instead (``tfds:glue/mrpc``): its text
features are found by name (sentence1/sentence2, question1/question2, premise/hypothesis, question/sentence,
sentence, text) unless the dataset config names them, its labels are its ClassLabel feature (a regression's: a
scalar number feature, as ``tfds:glue/stsb``'s float ``label``).

Every example is tokenized once (``encode_pair``: the tokenizer's own [CLS]/[SEP] template), cut to n_ctx tokens
(the longer text first) and right-padded with the padding id. Batch ``step`` is a pure function of (config,
step): train batches walk a per-epoch permutation drawn from the seed, eval batches walk the examples in order,
and an eval batch that runs past the last example is filled with weight-0 rows, so the evaluation mean counts
each example once whatever the batch size.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator

import numpy as np

from config import Config, ConfigError
from data.tokenizer import Tokenizer, load_tokenizer

# Text features of TFDS classification datasets (GLUE, SuperGLUE, IMDB, ...), tried in this order.
TFDS_TEXT_KEYS = (("sentence1", "sentence2"), ("question1", "question2"), ("premise", "hypothesis"),
                  ("question", "sentence"), ("text", "text_pair"), ("sentence", None), ("text", None))


def text_fields(names) -> tuple[str, str | None] | None:
    """The first (text, second text) of TFDS_TEXT_KEYS that ``names`` (a row's keys, a dataset's features) hold."""
    return next(((a, b) for a, b in TFDS_TEXT_KEYS if a in names and (b is None or b in names)), None)


class Examples:
    """Texts, second texts (None where absent) and raw labels, each with where it was read (for errors)."""

    def __init__(self):
        self.texts: list[str] = []
        self.pairs: list[str | None] = []
        self.labels: list = []
        self.places: list[str] = []

    def add(self, text: str, pair: str | None, label, place: str) -> None:
        self.texts.append(text)
        self.pairs.append(pair)
        self.labels.append(label)
        self.places.append(place)

    def __len__(self) -> int:
        return len(self.texts)


def not_jsonl(path: str) -> str:
    """The end of the error for a file that is not jsonl by name (a CSV file given as ``path``), else ""."""
    if path.endswith((".jsonl", ".jsonl.zst")):
        return ""
    kind, sep = ("TSV", ", sep='\\t'") if path.endswith((".tsv", ".tsv.gz")) else ("CSV", "")
    return (f"; these files are read as jsonl (.jsonl or .jsonl.zst), one JSON object per line, not {kind} (pandas "
            f"converts one: pd.read_csv(FILE{sep}).to_json(OUT, orient='records', lines=True))")


def jsonl_objects(pattern: str, where: str, noun: str = "examples") -> Iterator[tuple[dict, str]]:
    """(object, "path: line N") for every line of the jsonl files ``pattern`` matches (sorted), in file order;
    one-line errors for no file, a line that is not UTF-8 (with its byte offset) or not a JSON object, a corrupt or
    truncated ``.zst``, and a file without any ``noun``."""
    from data.text_files import json_object, jsonl_lines

    files = sorted(f for f in glob.glob(pattern) if os.path.isfile(f))
    if not files:
        raise ConfigError(f"{where}: {pattern} matches no file")
    for path in files:
        found = False
        for line_no, line in jsonl_lines(path):
            if not line.strip():
                continue
            row = json_object(line)
            if row is None:
                raise ConfigError(f"{path}: line {line_no} is not a JSON object{not_jsonl(path)}")
            found = True
            yield row, f"{path}: line {line_no}"
        if not found:
            raise ConfigError(f"{path}: no {noun} (an empty file, matched by {where})")


def check_not_empty(label, place: str, key: str) -> None:
    """An empty or all-space label is an error naming its line: it would otherwise become a class of its own."""
    if isinstance(label, str) and not label.strip():
        raise ConfigError(f"{place}: '{key}' is the empty label {json.dumps(label)} (label_key); give every example "
                          "one of the labels")


def text_keys(row: dict, text_key: str | None, pair_key: str | None) -> tuple[str, str]:
    """The (text, second text) keys of a jsonl file whose first object is ``row``, where the dataset config leaves
    them out: ``text``/``text_pair``, else the first of the TFDS feature names the row holds (GLUE's
    ``sentence1``/``sentence2``, as transformers' run_glue finds them); a ``text_key`` given alone takes its
    partner there (``sentence1`` -> ``sentence2``), so a pair's second text is not dropped without a word."""
    if text_key is None and "text" not in row:
        text_key = (text_fields(row) or (None,))[0]
    text_key = text_key or "text"
    partner = next((b for a, b in TFDS_TEXT_KEYS if a == text_key and b in row), None)
    return text_key, pair_key or partner or "text_pair"


def read_jsonl(pattern: str, where: str, keys: tuple[str | None, str | None, str | None]) -> Examples:
    """The examples of the jsonl files ``pattern`` matches (sorted), in file order; a label key left out is
    ``label``, or ``labels`` where the first line has that and not ``label``."""
    text_key, pair_key, label_key = keys
    examples = Examples()
    for row, place in jsonl_objects(pattern, where):
        if not examples.places:  # the first line names the fields a dataset config leaves out
            text_key, pair_key = text_keys(row, *keys[:2])
            label_key = label_key or ("labels" if "label" not in row and "labels" in row else "label")
        for key, name in ((text_key, "text_key"), (label_key, "label_key")):
            if key not in row:
                raise ConfigError(f"{place} has no '{key}' field ({name}; it has "
                                  f"{', '.join(map(repr, row)) or 'none'})")
        pair = row.get(pair_key)
        for key, value in ((text_key, row[text_key]), (pair_key, pair)):
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{place}: '{key}' is not a string")
        for label in row[label_key] if isinstance(row[label_key], list) else [row[label_key]]:
            check_not_empty(label, place, label_key)
        examples.add(row[text_key], pair, row[label_key], place)
    return examples


def read_tfds(name: str, data_dir: str | None, split: str, keys: tuple[str | None, str | None, str],
              regression: bool = False) -> tuple[Examples, list[str] | None]:
    """The examples of a prepared TFDS split, in order, and the names of its ClassLabel feature (None for a
    ``regression``'s scalar number label)."""
    from data.pipeline import open_tfds
    from data.tf_import import tensorflow_datasets

    tfds = tensorflow_datasets()
    text_key, pair_key, label_key = keys
    builder = open_tfds(name, data_dir, split, label_key)
    features = builder.info.features
    where = f"tfds:{name}"
    label = features[label_key]
    number = isinstance(label, tfds.features.Tensor) and label.shape == () and np.issubdtype(label.np_dtype, np.number)
    if regression and (not number or isinstance(label, tfds.features.ClassLabel)):  # a class id is no score
        raise ConfigError(f"{where}: feature '{label_key}' is not a number (label_key), as num_labels 1's "
                          "regression reads, such as tfds:glue/stsb's label")
    if not regression and not isinstance(label, tfds.features.ClassLabel):
        raise ConfigError(f"{where}: feature '{label_key}' is not a class label (label_key)"
                          + ("; a number is a regression's score (num_labels 1)" if number else ""))
    if text_key is None:
        found = text_fields(features)
        if found is None:
            raise ConfigError(f"{where}: no text feature among {', '.join(sorted(features))}; set text_key (and "
                              "text_pair_key) in a dataset config")
        text_key, pair_key = found
    for key, option in ((text_key, "text_key"), (pair_key, "text_pair_key")):
        if key is not None and key not in features:
            raise ConfigError(f"{where}: no feature '{key}' ({option}; features: {', '.join(sorted(features))})")
    examples = Examples()
    for i, row in enumerate(tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False))):
        pair = row[pair_key].decode("utf-8") if pair_key is not None else None
        examples.add(row[text_key].decode("utf-8"), pair, row[label_key].item(), f"{where} {split}: example {i}")
    if not len(examples):
        raise ConfigError(f"{where}: split {split!r} has no examples")
    return examples, None if regression else list(label.names)


def mixed_labels(label, names: list[str]) -> str:
    """Why an id among string labels is refused: the names are the strings alone, so its id would mean nothing."""
    return (f"label {json.dumps(label)} is not a string, as other train labels are ("
            f"{', '.join(map(json.dumps, names[:3]))}{', ...' if len(names) > 3 else ''}); give every label as a "
            "string or every one as an id (or list the names in the dataset config's labels)")


def label_names(dataset: dict, train: Examples | None, num_labels: int) -> list[str] | None:
    """The label strings in id order: the dataset config's ``labels``, else the train split's sorted string
    labels; None when the labels are integers. Their number must be ``num_labels``."""
    where = dataset["where"]
    names = dataset.get("labels")
    if names is not None:
        if not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)):
            raise ConfigError(f"{where}: labels must be a list of strings, got {json.dumps(names)}")
        if len(set(names)) != len(names):
            raise ConfigError(f"{where}: labels {json.dumps(names)} names a label twice")
    elif train is not None and any(isinstance(label, str) for label in train.labels):
        names = sorted({label for label in train.labels if isinstance(label, str)})
        other = next((i for i, label in enumerate(train.labels) if not isinstance(label, str)), None)
        if other is not None:  # the count below would name only the strings, and the ids would mean nothing
            raise ConfigError(f"{train.places[other]}: {mixed_labels(train.labels[other], names)}")
    if names is not None and len(names) != num_labels:
        raise ConfigError(labels_mismatch(num_labels, where, names))
    return names


def labels_mismatch(num_labels: int, where: str, names: list) -> str:
    """The error for data whose label names are not ``num_labels``."""
    if len(names) == 1:
        return f"{where} has one label ({names[0]}): a classifier needs two or more"
    return f"num_labels: {num_labels}, but {where} has {len(names)} labels ({', '.join(map(str, names))})"


def head_labels(cfg: Config) -> tuple[list[str], str] | None:
    """The label names, in id order, of the classifier a run starts from: ``init_from``'s ``id2label``, else the
    names its run directory keeps (an import, or the run going on); None where that classifier names none, or
    where the run starts a new head on its backbone (``init_new_head``): the old head's names are not the new one's."""
    from neomesh import label_names

    if cfg.init_from:
        from training.init_from import source_labels

        names = None if cfg.init_new_head else source_labels(cfg.init_from)
        return (names, f"--init-from {cfg.init_from}") if names else None
    names = label_names.load(cfg.model_path, cfg.num_labels) if cfg.model_path else None
    return (names, os.path.join(cfg.model_path, label_names.FILE)) if names else None


def in_head_order(cfg: Config, names: list[str] | None, dataset: dict) -> list[str] | None:
    """``names`` in the order of the classifier the run starts from, where it names the same labels: its head's
    row i was trained for its label i, so the data's ids must follow it (as transformers' run_glue does). A
    dataset config whose ``labels`` list them in another order is an error rather than a silent remapping."""
    head = head_labels(cfg)
    if names is None or head is None or head[0] == names or sorted(head[0]) != sorted(names):
        return names
    if dataset.get("labels") is not None:
        raise ConfigError(f"{dataset['where']}: labels {json.dumps(names)} are in another order than the classifier of "
                          f"{head[1]} ({json.dumps(head[0])}); list them in its order, or leave labels out to "
                          "take it")
    return head[0]


def label_ids(examples: Examples, names: list[str] | None, num_labels: int) -> np.ndarray:
    """(N,) int32 label ids; a label outside the names or outside 0..num_labels-1 is an error naming its line."""
    index = {name: i for i, name in enumerate(names or [])}
    ids = np.empty(len(examples), np.int32)
    for i, (label, place) in enumerate(zip(examples.labels, examples.places)):
        if isinstance(label, str):
            if label not in index:
                known = f"one of the labels ({', '.join(names)})" if names else "an integer, as the train labels are"
                raise ConfigError(f"{place}: label {json.dumps(label)} is not {known}")
            ids[i] = index[label]
        elif isinstance(label, int) and not isinstance(label, bool):
            if not 0 <= label < num_labels:
                raise ConfigError(f"{place}: label {label} is outside 0..{num_labels - 1} (num_labels {num_labels})")
            ids[i] = label
        else:
            hint = {float: "; a number is a regression's score, for num_labels 1",
                    list: "; a list is a text's labels, for multi_label true"}.get(type(label), "")
            raise ConfigError(f"{place}: label {json.dumps(label)} is neither an integer nor a string{hint}")
    return ids


def label_items(examples: Examples) -> tuple[Examples, np.ndarray]:
    """Each label of each example's list (multi_label) as an example of its own, so single labels' naming and
    checks apply to it, and the (M,) index of the example it came from; a label that is no list is an error
    naming its line."""
    items, owners = Examples(), []
    for i, (labels, place) in enumerate(zip(examples.labels, examples.places)):
        if not isinstance(labels, list):
            raise ConfigError(f"{place}: label {json.dumps(labels)} is not a list; multi_label true reads each text's "
                              'labels as one (["sports", "politics"], or [] where none applies)')
        if len({json.dumps(label) for label in labels}) < len(labels):  # a multi-hot row read as ids was wrong
            raise ConfigError(f"{place}: labels {json.dumps(labels)} repeat a label; multi_label true reads each "
                              "text's labels as the names or ids that apply, not a 0/1 (multi-hot) row: give the ids "
                              "of its 1s")
        for label in labels:
            items.add(examples.texts[i], examples.pairs[i], label, place)
            owners.append(i)
    return items, np.array(owners, np.int64)


def multi_hot(items: Examples, owners: np.ndarray, count: int, names: list[str] | None, num_labels: int
              ) -> np.ndarray:
    """(count, num_labels) float32 rows of ``label_items``' output: 1 where a label of the example's list applies."""
    out = np.zeros((count, num_labels), np.float32)
    out[owners, label_ids(items, names, num_labels)] = 1
    return out


def scores(examples: Examples) -> np.ndarray:
    """(N,) float32 regression labels (num_labels 1): numbers, integers included; anything else is an error
    naming its line."""
    out = np.empty(len(examples), np.float32)
    for i, (label, place) in enumerate(zip(examples.labels, examples.places)):
        if isinstance(label, bool) or not isinstance(label, (int, float)) or not np.isfinite(label):
            raise ConfigError(f"{place}: label {json.dumps(label)} is not a number; num_labels 1 is regression (a "
                              "score per text, as Hugging Face's num_labels 1), so every label is one")
        out[i] = label
    return out


class ExampleStream:
    """The order in which in-memory examples (``self.labels`` long) fill batches: train batches walk a per-epoch
    permutation drawn from ``seed``, eval batches walk the examples in order with weight-0 filler past the end.
    Any batch is a function of its step, so there is no position to checkpoint."""

    shuffle: bool
    seed: int
    labels: np.ndarray
    _order: tuple[int, np.ndarray] | None = None
    row_name: str = "examples"  # what a row holds, for messages

    def __len__(self) -> int:
        return len(self.labels)

    def state(self, batch_size: int) -> None:
        """Nothing to save: any batch is computed directly from its step (O(1))."""
        return None

    def restore(self, step: int, batch_size: int, rows: slice, saved) -> None:
        return None

    def _permutation(self, epoch: int) -> np.ndarray:
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, np.random.default_rng([self.seed, epoch]).permutation(len(self)))
        return self._order[1]

    def example_ids(self, step: int, batch_size: int, rows: slice | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(example ids, weights) of rows ``rows`` of global batch ``step``."""
        positions = np.arange(step * batch_size, (step + 1) * batch_size, dtype=np.int64)[rows or slice(None)]
        if not self.shuffle:  # in order; past the last example, weight-0 copies of the first ones
            return positions % len(self), (positions < len(self)).astype(np.float32)
        epoch, position = np.divmod(positions, len(self))
        ids = np.empty_like(position)
        for e in np.unique(epoch):
            ids[epoch == e] = self._permutation(int(e))[position[epoch == e]]
        return ids, np.ones(len(ids), np.float32)


class LabelledSource(ExampleStream):
    """Classifier batches from tokenized examples held in memory (no TensorFlow needed once they are read)."""

    def __init__(self, examples: Examples, labels: np.ndarray, tokenizer: Tokenizer, n_ctx: int, *, shuffle: bool,
                 seed: int, description: str, names: list[str] | None = None):
        pad = tokenizer.padding_id
        encoded = tokenizer.encode_pairs(examples.texts, examples.pairs, n_ctx)
        self.lengths = np.array([len(ids) for ids, _ in encoded], np.int32)
        self.inputs = np.full((len(encoded), n_ctx), pad, np.int32)  # (N, T)
        self.token_types = np.zeros((len(encoded), n_ctx), np.int32)  # (N, T)
        for row, (ids, types) in enumerate(encoded):
            self.inputs[row, :len(ids)] = ids
            self.token_types[row, :len(types)] = types
        self.labels = labels
        self.tokenizer, self.shuffle, self.seed = tokenizer, shuffle, seed
        self.bytes_per_token = None  # per-example losses have no bits per byte
        cut = int((self.lengths == n_ctx).sum())
        self.description = f"{description}: {len(labels):,} examples ({cut:,} cut to n_ctx {n_ctx}); "
        if labels.ndim == 2:  # multi-hot rows: each label's count, and the texts with none
            self.label_names = names or [str(i) for i in range(labels.shape[1])]
            self.description += "per label: " + ", ".join(
                f"{name} {int(count)}" for name, count in zip(self.label_names, labels.sum(0))) + \
                f"; with none: {int((labels.sum(1) == 0).sum())}"
        elif labels.dtype.kind == "f":  # a regression's scores: no names, no classes to count
            self.label_names = None
            self.description += (f"labels are scores: mean {labels.mean():.4g}, min {labels.min():.4g}, max "
                                 f"{labels.max():.4g}")
        else:
            self.label_names = names or [str(i) for i in range(int(labels.max()) + 1)]
            counts = np.bincount(labels, minlength=len(self.label_names))
            self.description += "per label: " + ", ".join(f"{name} {count}"
                                                         for name, count in zip(self.label_names, counts))
        self._order: tuple[int, np.ndarray] | None = None

    def batch(self, step: int, batch_size: int, rows: slice | None = None) -> dict:
        """Rows ``rows`` (default all) of global batch ``step``: {"inputs", "segment_ids" (1 real token,
        0 padding), "token_types": (rows, n_ctx) int32, "labels": (rows,) int32 (a regression's float32,
        a multi-label classifier's (rows, num_labels) float32 multi-hot),
        "weights": (rows,) float32}."""
        ids, weights = self.example_ids(step, batch_size, rows)
        positions = np.arange(self.inputs.shape[1])
        return {"inputs": self.inputs[ids], "segment_ids": (positions < self.lengths[ids, None]).astype(np.int32),
                "token_types": self.token_types[ids], "labels": self.labels[ids], "weights": weights}


def _dataset(cfg: Config) -> dict:
    from data.source import load_dataset_config  # data.source dispatches here: import it when called

    if len(cfg.datasets) != 1:
        raise ConfigError(f"datasets: task {cfg.task} reads one dataset of examples, got "
                          f"{len(cfg.datasets)}")
    name = cfg.datasets[0][0]
    dataset = {"path": name, "where": name} if name.startswith("tfds:") else load_dataset_config(name)
    if dataset["path"].startswith("tfds:"):
        dataset.setdefault("data_dir", cfg.tfds_data_dir)
    if dataset.get("prepare"):  # into the dataset's own cache folder, whatever tokenizer reads it
        from data.prepare import ensure_prepared
        ensure_prepared(dataset, dataset["where"], cfg.n_ctx)
    if cfg.tokenizer_path:
        dataset["tokenizer_path"] = cfg.tokenizer_path
    return dataset


def split_files(dataset: dict, split: str) -> tuple[str, str]:
    """(the jsonl glob of ``split``, the key that named it, for errors): ``path`` for train, ``eval_path`` for eval;
    ``"eval_path": ""`` is no eval set (train.py skips evaluation), and none at all an error."""
    from data.source import NoEvalSet  # data.source dispatches here

    key = "path" if split == "train" else "eval_path"
    pattern = dataset.get(key)
    if pattern == "" and split == "eval":
        raise NoEvalSet(f"{dataset['where']}: eval_path is empty (no eval set)")
    if pattern is None:
        raise ConfigError(f"{dataset['where']}: no 'eval_path' for evaluation; add one or set eval_steps to 0")
    return pattern, f"{dataset['where']} {key}"


def _read(dataset: dict, split: str, regression: bool = False) -> tuple[Examples, list[str] | None]:
    """The examples of ``split`` and, for TFDS, its label names."""
    keys = (dataset.get("text_key"), dataset.get("text_pair_key"), dataset.get("label_key"))
    if dataset["path"].startswith("tfds:"):
        tfds_split = dataset.get(f"{split}_split", "train" if split == "train" else "validation")
        return read_tfds(dataset["path"][len("tfds:"):], dataset.get("data_dir"), tfds_split,
                         (*keys[:2], keys[2] or "label"), regression)
    return read_jsonl(*split_files(dataset, split), keys), None


def labelled_source(cfg: Config, split: str) -> LabelledSource:
    """The sequence-classification source for ``split`` ("train" or "eval") of the config's one dataset."""
    from data.source import check_tokenizer
    dataset = _dataset(cfg)
    where = dataset["where"]
    tokenizer = load_tokenizer(dataset.get("tokenizer_path", "bytes"))
    check_tokenizer(tokenizer, dataset, cfg)
    examples, tfds_names = _read(dataset, split, cfg.regression)
    if cfg.regression:
        if dataset.get("labels") is not None:
            raise ConfigError(f"{where}: labels names classes, and num_labels 1 is regression (a score per text); "
                              "leave labels out, or set num_labels to their number")
        return LabelledSource(examples, scores(examples), tokenizer, cfg.n_ctx, shuffle=split == "train",
                              seed=cfg.seed, description=f"{split}: {where}")
    if cfg.multi_label and tfds_names is not None:
        raise ConfigError(f"{where}: multi_label reads jsonl files, each text's labels a list; a TFDS dataset's "
                          "ClassLabel gives one label per text")
    items, owners = label_items(examples) if cfg.multi_label else (examples, None)
    if tfds_names is not None:
        names = label_names({**dataset, "labels": dataset.get("labels", tfds_names)}, None, cfg.num_labels)
    else:
        train = items if split == "train" or dataset.get("labels") else _read(dataset, "train")[0]
        if cfg.multi_label and train is not items:  # the names are those of the train split's lists
            train = label_items(train)[0]
        names = in_head_order(cfg, label_names(dataset, train, cfg.num_labels), dataset)
    labels = multi_hot(items, owners, len(examples), names, cfg.num_labels) if cfg.multi_label else \
        label_ids(examples, names, cfg.num_labels)
    return LabelledSource(examples, labels, tokenizer, cfg.n_ctx, shuffle=split == "train", seed=cfg.seed,
                          description=f"{split}: {where}", names=names)
