"""Extractive question answering, scored as SQuAD is: the answer a model's start and end logits pick from the
windows of a context (transformers' run_qa ``postprocess_qa_predictions``), and exact match and F1 against the
gold answers (the official SQuAD evaluation script's normalisation: lower case, no punctuation, no articles, single
spaces).

Span choice, per example over all its windows: the ``N_BEST`` highest start and end logits of each window pair up
into spans inside the context with start <= end and at most ``max_answer_length`` tokens; the span of the highest
start + end logit wins, its text cut from the context by the tokens' character offsets (surrounding whitespace
stripped). Where the data has unanswerable questions (SQuAD v2), the empty answer wins when its null score, the
least over windows of their first token's start + end logit, is above the best span's (run_qa's
``version_2_with_negative``, threshold 0).
"""

from __future__ import annotations

import collections
import re
import string

import numpy as np

N_BEST = 20  # start and end candidates per window (run_qa's n_best_size)
NOT_CONTEXT = -1  # the character offset of a token outside the context (the question, special tokens, padding)


def best_answer(start_logits: np.ndarray, end_logits: np.ndarray, offsets: np.ndarray, context: str,
                max_answer_length: int, null_allowed: bool) -> tuple[str, float]:
    """(answer text, its start + end logit) of one example from its windows' (W, T) start and end logits and
    (W, T, 2) character offsets (NOT_CONTEXT outside the context); "" (and the null score) for no answer."""
    best, best_score, null_score = None, -np.inf, np.inf
    for start, end, spans in zip(start_logits, end_logits, offsets):
        null_score = min(null_score, float(start[0] + end[0]))
        starts, ends = (np.argsort(x)[::-1][:N_BEST] for x in (start, end))  # likeliest first, as run_qa
        length = ends[None, :] - starts[:, None] + 1  # (S, E) tokens in each span
        valid = (spans[starts, 0] != NOT_CONTEXT)[:, None] & (spans[ends, 0] != NOT_CONTEXT)[None, :] & \
            (length >= 1) & (length <= max_answer_length)
        scores = np.where(valid, start[starts][:, None] + end[ends][None, :], -np.inf)  # (S, E)
        i, j = np.unravel_index(np.argmax(scores), scores.shape)  # the first of equal scores, as run_qa's sort
        if scores[i, j] > best_score:
            best, best_score = (int(spans[starts[i], 0]), int(spans[ends[j], 1])), float(scores[i, j])
    if best is None or (null_allowed and null_score > best_score):
        return "", null_score
    # a byte-level BPE token's offsets hold the space before its word (" Ada"), as transformers' without trim_offsets
    return context[best[0]:best[1]].strip(), best_score


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower case, punctuation and the articles a/an/the removed, whitespace collapsed."""
    text = "".join(ch for ch in text.lower() if ch not in PUNCTUATION)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


PUNCTUATION = frozenset(string.punctuation)


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    """SQuAD's token F1 of the normalised texts; where either is empty (an unanswerable question), 1 when both are
    (SQuAD v2's rule)."""
    predicted, wanted = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not predicted or not wanted:
        return float(predicted == wanted)
    same = sum((collections.Counter(predicted) & collections.Counter(wanted)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(wanted)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: list[str], golds: list[list[str]]) -> dict:
    """{"exact_match", "f1"}: percentages (0-100, as SQuAD's script and run_qa report them), each example scored
    against the best of its gold answers (an unanswerable question's gold is the empty answer)."""
    if not predictions:
        return {"exact_match": float("nan"), "f1": float("nan")}
    scores = [(max(exact_match(p, g) for g in gold or [""]), max(f1(p, g) for g in gold or [""]))
              for p, gold in zip(predictions, golds)]
    return {"exact_match": 100 * float(np.mean([s[0] for s in scores])),
            "f1": 100 * float(np.mean([s[1] for s in scores]))}
