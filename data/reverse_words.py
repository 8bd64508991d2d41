"""A seq2seq example that needs no download: a few words of the language reference, and the same words in reverse
order.

The words are the embedded corpus's help topics (``pydoc_data.topics``: English prose about Python), lower-cased,
read in order and cut into runs of 3 to 6 words (the lengths cycle). Each run is a pair
``{"inputs": "the for statement is", "targets": "is statement for the"}``: deterministic, checkable by eye, and it
needs what real seq2seq tasks need (reading the whole input, emitting each word once, knowing where to stop),
so a small T5 learns it from scratch in minutes while its eval token accuracy climbs from the frequency of
common words towards 1. The corpus's own split holds: runs from its eval documents are the eval set.

``prepare_reverse_words`` writes ``train.jsonl``, ``eval.jsonl`` and a byte-level BPE trained on the train
inputs; data/prepare.py runs it once, under a lock, into data_cache/.
"""

from __future__ import annotations

import json
import os
import re

LENGTHS = (3, 4, 5, 6)  # words per pair, in turn
MAX_PAIRS = {"train": 20000, "eval": 512}  # spread evenly over each split's runs


def runs(text: str, start: int = 0) -> list[list[str]]:
    """``text``'s lower-cased words (letters only) cut into consecutive runs of LENGTHS[start], then the next."""
    words = [w.lower() for w in re.findall(r"[A-Za-z]+", text)]
    out, i, k = [], 0, start
    while i + LENGTHS[k % len(LENGTHS)] <= len(words):
        n = LENGTHS[k % len(LENGTHS)]
        out.append(words[i:i + n])
        i, k = i + n, k + 1
    return out


def pair(words: list[str]) -> dict:
    return {"inputs": " ".join(words), "targets": " ".join(reversed(words))}


def prepare_reverse_words(directory: str, dataset: dict, where: str, n_ctx: int) -> None:
    """Writes train.jsonl, eval.jsonl and the BPE tokenizer (``tokenizer_path``'s file name) into ``directory``."""
    from data import corpus
    from data.tokenizer import train_bpe

    os.makedirs(directory)
    named = [(name, (name, text)) for name, text in corpus.documents()]  # split() keeps the names this way
    rows = {}
    for split in ("train", "eval"):
        found = [pair(words) for k, (name, text) in enumerate(corpus.split(named, split)) if name.startswith("help:")
                 for words in runs(text, k)]
        step = max(1, len(found) // MAX_PAIRS[split])
        rows[split] = found[::step][:MAX_PAIRS[split]]
        with open(os.path.join(directory, f"{split}.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows[split])
    prefix = dataset.get("prefix", "")
    tokenizer = train_bpe([prefix + row["inputs"] for row in rows["train"]], dataset["vocab_size"])
    tokenizer.save(os.path.join(directory, os.path.basename(dataset["tokenizer_path"])))
    with open(os.path.join(directory, "DONE"), "w") as f:
        f.write("prepared from the help topics' words\n")
