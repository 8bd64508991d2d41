"""Questions and contexts for ``task: question_answering``: SQuAD-format jsonl or TFDS ``squad`` -> windows.

A dataset config names jsonl files (``path`` for train, ``eval_path`` for eval; globs, ``.jsonl`` or
``.jsonl.zst``) whose lines are Hugging Face datasets' ``squad`` rows::

    {"question": "Who wrote it?", "context": "It was written by Ada.",
     "answers": {"text": ["Ada"], "answer_start": [18]}}

(an unanswerable question, SQuAD v2's, has empty lists), or ``path`` is ``tfds:squad`` (v1.1, prepared in a local
data dir; ``tfds:squad/v2.0`` too), read from its ``train`` and ``validation`` splits.

Each example is tokenized as run_qa does: the question, then the context as the pair's second text, the context
cut into windows of what n_ctx leaves beside the question, consecutive windows sharing ``doc_stride`` tokens. A
training window's labels are the first answer's first and last tokens (found through the tokens' character
offsets), or the window's first token (index 0, [CLS]) where the answer is not wholly inside it, or the question
has none. Rows are windows; batches follow ``ExampleStream`` (a pure function of the step; eval windows in order,
weight-0 filler past the last), and an evaluation scores the examples all of whose windows it saw
(evaluation/squad.py).
"""

from __future__ import annotations

import numpy as np

from config import Config, ConfigError
from data.labelled import ExampleStream, _dataset, jsonl_objects, split_files
from data.tokenizer import NoRoomForContext, Tokenizer, Window, load_tokenizer
from evaluation.squad import NOT_CONTEXT, best_answer, squad_scores


class Questions:
    """Questions, contexts and gold answers ([(text, start character), ...]), each with where it was read."""

    def __init__(self):
        self.questions: list[str] = []
        self.contexts: list[str] = []
        self.answers: list[list[tuple[str, int]]] = []
        self.places: list[str] = []

    def add(self, question, context, texts, starts, place: str) -> None:
        """One example, its answers checked: lists of one start per text, each text found at its start."""
        for key, value in (("question", question), ("context", context)):
            if not isinstance(value, str):
                raise ConfigError(f"{place}: '{key}' is not a string")
        if not (isinstance(texts, list) and isinstance(starts, list) and len(texts) == len(starts)):
            raise ConfigError(f"{place}: 'answers' is not {{\"text\": [...], \"answer_start\": [...]}} with a start "
                              "for each text (empty lists: no answer)")
        for text, start in zip(texts, starts):
            if not isinstance(text, str) or isinstance(start, bool) or not isinstance(start, int):
                raise ConfigError(f"{place}: answer {text!r} at {start!r} is not a text at a character index")
            if context[start:start + len(text)] != text:
                raise ConfigError(f"{place}: answer {text!r} is not at answer_start {start} of the context (it reads "
                                  f"{context[start:start + len(text)]!r} there)")
        self.questions.append(question)
        self.contexts.append(context)
        self.answers.append(list(zip(texts, starts)))
        self.places.append(place)

    def __len__(self) -> int:
        return len(self.questions)


def read_jsonl(pattern: str, where: str) -> Questions:
    """The examples of the SQuAD-format jsonl files ``pattern`` matches (sorted), in file order."""
    out = Questions()
    for row, place in jsonl_objects(pattern, where):
        for key in ("question", "context", "answers"):
            if key not in row:
                raise ConfigError(f"{place} has no '{key}' field (a SQuAD row has question, context and answers; "
                                  f"it has {', '.join(map(repr, row)) or 'none'})")
        answers = row["answers"] if isinstance(row["answers"], dict) else {}
        out.add(row["question"], row["context"], answers.get("text"), answers.get("answer_start"), place)
    return out


def read_tfds(name: str, data_dir: str | None, split: str) -> Questions:
    """The examples of a prepared TFDS SQuAD split (``squad``: question, context, answers {text, answer_start})."""
    from data.pipeline import open_tfds
    from data.tf_import import tensorflow_datasets

    tfds = tensorflow_datasets()
    builder = open_tfds(name, data_dir, split, "answers")
    features = builder.info.features
    missing = [key for key in ("question", "context", "answers") if key not in features]
    if missing:
        raise ConfigError(f"tfds:{name}: no feature '{missing[0]}' (a SQuAD dataset has question, context and "
                          f"answers; features: {', '.join(sorted(features))})")
    out = Questions()
    for i, row in enumerate(tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False))):
        answers = row["answers"]
        out.add(row["question"].decode("utf-8"), row["context"].decode("utf-8"),
                [t.decode("utf-8") for t in answers["text"]], [int(s) for s in answers["answer_start"]],
                f"tfds:{name} {split}: example {i}")
    if not len(out):
        raise ConfigError(f"tfds:{name}: split {split!r} has no examples")
    return out


def answer_tokens(offsets: list, answer: tuple[str, int] | None) -> tuple[int, int]:
    """(first, last) token of ``answer`` (text, start character) in a window whose tokens have these context
    character offsets (None outside the context); (0, 0) where the window does not hold all of it (run_qa's)."""
    if answer is None:
        return 0, 0
    text, start_char = answer
    end_char = start_char + len(text)
    inside = [i for i, span in enumerate(offsets) if span is not None]
    if not inside or offsets[inside[0]][0] > start_char or offsets[inside[-1]][1] < end_char:
        return 0, 0
    first = max(i for i in inside if offsets[i][0] <= start_char)
    last = min(i for i in inside if offsets[i][1] >= end_char)
    return first, last


def context_windows(tokenizer: Tokenizer, question: str, context: str, cfg: Config, where: str) -> list[Window]:
    """The windows of one example as a question-answering model reads them: the question, then each part of the
    context that fits beside it in n_ctx tokens, consecutive parts sharing doc_stride tokens."""
    try:
        return tokenizer.encode_windows(question, context, cfg.n_ctx, cfg.doc_stride)
    except NoRoomForContext as e:
        raise ConfigError(f"{where}: {e}; raise n_ctx, lower doc_stride or shorten the question") from None


def window_rows(windows: list[Window], n_ctx: int, padding_id: int) -> tuple[np.ndarray, ...]:
    """Windows -> (inputs, token types: (W, T) int32 right-padded, lengths (W,), character offsets (W, T, 2) of
    each context token, NOT_CONTEXT elsewhere)."""
    inputs = np.full((len(windows), n_ctx), padding_id, np.int32)
    token_types = np.zeros((len(windows), n_ctx), np.int32)
    offsets = np.full((len(windows), n_ctx, 2), NOT_CONTEXT, np.int32)
    for row, (ids, types, spans) in enumerate(windows):
        inputs[row, :len(ids)], token_types[row, :len(types)] = ids, types
        offsets[row, :len(spans)] = [span or (NOT_CONTEXT, NOT_CONTEXT) for span in spans]
    return inputs, token_types, np.array([len(ids) for ids, _, _ in windows], np.int32), offsets


class AnswerSource(ExampleStream):
    """Question-answering batches from examples held in memory, each example's windows tokenized once."""

    row_name = "windows"

    def __init__(self, examples: Questions, tokenizer: Tokenizer, cfg: Config, *, shuffle: bool, seed: int,
                 description: str):
        windows, example_of = [], []
        for i, (question, context, place) in enumerate(zip(examples.questions, examples.contexts, examples.places)):
            parts = context_windows(tokenizer, question, context, cfg, place)
            windows += parts
            example_of += [i] * len(parts)
        self.inputs, self.token_types, self.lengths, self.offsets = window_rows(windows, cfg.n_ctx,
                                                                                tokenizer.padding_id)
        n, t = self.inputs.shape
        self.starts, self.ends = np.zeros(n, np.int32), np.zeros(n, np.int32)  # (W,) training labels
        for row, ((_, _, offsets), example) in enumerate(zip(windows, example_of)):
            answers = examples.answers[example]
            self.starts[row], self.ends[row] = answer_tokens(offsets, answers[0] if answers else None)
        self.example_of = np.array(example_of, np.int64)  # (W,) the example each window reads
        self.examples, self.max_answer_length = examples, cfg.max_answer_length
        self.null_allowed = any(not answers for answers in examples.answers)  # SQuAD v2: "" may be the answer
        self.labels = self.starts  # ExampleStream counts rows (windows) by this
        self.tokenizer, self.shuffle, self.seed = tokenizer, shuffle, seed
        self.bytes_per_token = None
        self.label_names = None
        self._order = None
        unanswerable = sum(not answers for answers in examples.answers)
        self.description = (f"{description}: {len(examples):,} questions ({unanswerable:,} without an answer) in "
                            f"{n:,} windows of n_ctx {t} (doc_stride {cfg.doc_stride}); "
                            f"{int((self.starts > 0).sum()):,} windows hold their question's first answer")

    def batch(self, step: int, batch_size: int, rows: slice | None = None) -> dict:
        """Rows ``rows`` (default all) of global batch ``step``: {"inputs", "segment_ids" (1 real token, 0 padding),
        "token_types": (rows, n_ctx) int32, "start_positions", "end_positions": (rows,) int32, "weights": (rows,)
        float32}."""
        ids, weights = self.example_ids(step, batch_size, rows)
        positions = np.arange(self.inputs.shape[1])
        return {"inputs": self.inputs[ids], "segment_ids": (positions < self.lengths[ids, None]).astype(np.int32),
                "token_types": self.token_types[ids], "start_positions": self.starts[ids],
                "end_positions": self.ends[ids], "weights": weights}

    def answer_scores(self, start_logits: np.ndarray, end_logits: np.ndarray) -> dict:
        """SQuAD's exact match and F1 (percentages) of the answers picked from the (N, T) logits of the first N
        windows, over the examples all of whose windows are among them; "examples": how many that is."""
        bounds = np.searchsorted(self.example_of, np.arange(len(self.examples) + 1))  # example e: rows e0..e1-1
        complete = [e for e in range(len(self.examples)) if bounds[e + 1] <= len(start_logits)]
        predictions = [best_answer(start_logits[bounds[e]:bounds[e + 1]], end_logits[bounds[e]:bounds[e + 1]],
                                   self.offsets[bounds[e]:bounds[e + 1]], self.examples.contexts[e],
                                   self.max_answer_length, self.null_allowed)[0] for e in complete]
        golds = [[text for text, _ in self.examples.answers[e]] for e in complete]
        return {**squad_scores(predictions, golds), "examples": len(complete)}


def answer_source(cfg: Config, split: str) -> AnswerSource:
    """The question-answering source for ``split`` ("train" or "eval") of the config's one dataset."""
    from data.source import check_tokenizer

    dataset = _dataset(cfg)
    tokenizer = load_tokenizer(dataset.get("tokenizer_path", "bytes"))
    check_tokenizer(tokenizer, dataset, cfg)
    if dataset["path"].startswith("tfds:"):
        tfds_split = dataset.get(f"{split}_split", "train" if split == "train" else "validation")
        examples = read_tfds(dataset["path"][len("tfds:"):], dataset.get("data_dir"), tfds_split)
    else:
        examples = read_jsonl(*split_files(dataset, split))
    return AnswerSource(examples, tokenizer, cfg, shuffle=split == "train", seed=cfg.seed,
                        description=f"{split}: {dataset['where']}")
