"""Multiple-choice scoring as lm-evaluation-harness does it: each choice, after the context and a delimiter (a
space), is a continuation scored by the sum of its tokens' log-probabilities; the highest wins.

Accuracies as the harness names them: ``acc`` (raw sums), ``acc_norm`` (sums divided by the choice's length in
characters), ``acc_bytes`` (by its UTF-8 bytes), and ``acc_per_token`` (mean log-probability per token). Files
are jsonl, one question per line: ``{"context": "The capital of France is", "choices": ["Paris", "Rome"],
"label": 0}``.
"""

from __future__ import annotations

from config import ConfigError


def read_questions(path: str, limit: int | None = None) -> list[dict]:
    """The questions of a multiple-choice jsonl file, checked (a one-line error names the file and line)."""
    from evaluation.jsonl import json_objects

    return [_question(row, where) for row, where in json_objects(path, limit, "multiple-choice", "questions")]


def _question(row, where: str) -> dict:
    shape = 'an object with "context" (a string), "choices" (2+ strings) and "label" (the right choice\'s index)'
    if not (isinstance(row, dict) and isinstance(row.get("context"), str) and isinstance(row.get("choices"), list)
            and len(row["choices"]) >= 2 and all(isinstance(c, str) and c for c in row["choices"])
            and isinstance(row.get("label"), int) and not isinstance(row["label"], bool)):
        raise ConfigError(f"{where}: a question is {shape}")
    if not 0 <= row["label"] < len(row["choices"]):
        raise ConfigError(f"{where}: label {row['label']} is not one of the {len(row['choices'])} choices' indices")
    return row


def choice_scores(scorer, questions: list[dict], delimiter: str = " ") -> list[list]:
    """One ``Score`` per choice of each question (all choices of all questions scored in one pass)."""
    requests = [(q["context"], delimiter + choice) for q in questions for choice in q["choices"]]
    scores = iter(scorer.loglikelihood(requests))
    return [[next(scores) for _ in q["choices"]] for q in questions]


def evaluate(scorer, path: str, limit: int | None = None, name: str = "choice", delimiter: str = " ") -> dict:
    """{"<name>_acc", "<name>_acc_norm", "<name>_acc_bytes", "<name>_acc_per_token", "<name>_questions"} of
    ``scorer``'s model on the questions in ``path``."""
    questions = read_questions(path, limit)
    hits = dict.fromkeys(("acc", "acc_norm", "acc_bytes", "acc_per_token"), 0)
    for question, scores in zip(questions, choice_scores(scorer, questions, delimiter)):
        choices = question["choices"]
        ranked = {"acc": [s.logprob for s in scores],
                  "acc_norm": [s.logprob / len(c) for s, c in zip(scores, choices)],
                  "acc_bytes": [s.logprob / len(c.encode("utf-8")) for s, c in zip(scores, choices)],
                  "acc_per_token": [s.logprob / s.tokens for s in scores]}
        for metric, values in ranked.items():
            hits[metric] += max(range(len(values)), key=values.__getitem__) == question["label"]
    result = {f"{name}_{metric}": count / len(questions) for metric, count in hits.items()}
    return {**result, f"{name}_questions": len(questions)}
