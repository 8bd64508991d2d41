"""LAMBADA: predict a passage's last word. Last-word accuracy and perplexity, as GPT-Neo and the harness compute it.

The file format is LAMBADA's own (``lambada_test.jsonl``): one JSON object per line with a ``text`` field. The
target is what follows the text's last space; the model reads everything before it and is right when greedy
decoding produces every token of the target (``" " + word``). Perplexity is exp of minus the mean log-likelihood
of the targets (``lambada_openai``'s definition).

``evaluation/data/lambada_embedded.jsonl`` ships with the project: passages of the embedded corpus's held-out
documents (Python's help topics and standard-library source), each ending in a word, so the evaluation runs
offline; ``python -m evaluation.lambada --build FILE`` writes it again (the corpus follows the Python version).
"""

from __future__ import annotations

import json
import math
import os
import re

from config import ConfigError

EMBEDDED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "lambada_embedded.jsonl")


def read_examples(path: str, limit: int | None = None) -> list[tuple[str, str]]:
    """``[(context, " " + word), ...]`` of a LAMBADA-format jsonl file (the first ``limit`` lines)."""
    from evaluation.jsonl import json_objects

    examples = []
    for row, where in json_objects(path, limit, "LAMBADA", "examples"):
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise ConfigError(f"{where}: a LAMBADA line is an object with a \"text\" string")
        examples.append(split_example(row["text"], where))
    return examples


def split_example(text: str, where: str = "text") -> tuple[str, str]:
    """``text`` -> (context, " " + last word): the split at the last space, as LAMBADA's tasks make it."""
    context, space, word = text.rpartition(" ")
    if not space or not context or not word:
        raise ConfigError(f"{where}: a LAMBADA text needs words before its last space and a word after it")
    return context, " " + word


def evaluate(scorer, path: str | None = None, limit: int | None = None) -> dict:
    """{"lambada_acc", "lambada_ppl", "lambada_examples"} of ``scorer``'s model on ``path`` (the shipped
    embedded-corpus file by default)."""
    examples = read_examples(path or EMBEDDED, limit)
    scores = scorer.loglikelihood(examples)
    mean_logprob = sum(s.logprob for s in scores) / len(scores)
    return {"lambada_acc": sum(s.greedy for s in scores) / len(scores),
            "lambada_ppl": math.exp(-mean_logprob) if -mean_logprob < 700 else math.inf,
            "lambada_examples": len(scores)}


# Passages of held-out text that end in a word after a space: the LAMBADA shape, from the embedded corpus.
TARGET = re.compile(r"(?<=[^\s] )[A-Za-z]{3,}(?![\w(])")
PASSAGE_CHARS = 400  # a passage's context is at least this long (about 100-150 tokens)


def embedded_passages() -> list[str]:
    """LAMBADA-format texts from the embedded corpus's eval documents (never trained on): each starts at a line
    and ends with the first word (3+ letters, after a space, not a call) at least ``PASSAGE_CHARS`` on."""
    from data import corpus

    texts = []
    for document in corpus.split(corpus.documents(), "eval"):
        start = 0
        while True:
            match = TARGET.search(document, start + PASSAGE_CHARS)
            if match is None:
                break
            texts.append(document[start:match.end()])
            next_line = document.find("\n", match.end())
            if next_line < 0:
                break
            start = next_line + 1
    return texts


def build(path: str) -> int:
    """Writes ``embedded_passages()`` to ``path`` as LAMBADA jsonl; returns the count."""
    texts = embedded_passages()
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        for text in texts:
            f.write(json.dumps({"text": text}) + "\n")
    os.replace(path + ".tmp", path)
    return len(texts)


def main(argv=None) -> int:
    """``python -m evaluation.lambada [--build FILE]``: write the embedded-corpus LAMBADA file again."""
    from neomesh.errors import run_main
    from neomesh.help import ArgumentParser, HelpFormatter

    parser = ArgumentParser(prog="python -m evaluation.lambada", formatter_class=HelpFormatter, allow_abbrev=False,
                            description="Write the embedded-corpus LAMBADA file (for another Python version's corpus).")
    parser.add_argument("--build", metavar="FILE", default=EMBEDDED,
                        help="where to write it (default: %(default)s, the shipped file)")
    args = parser.parse_args(argv)
    return run_main(lambda: print(f"wrote {build(args.build)} passages to {args.build}"))


if __name__ == "__main__":
    from neomesh.errors import exit_process

    exit_process(main())
