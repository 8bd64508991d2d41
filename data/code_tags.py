"""A token-classification example that needs no download: the lexical category of each token of Python source.

The embedded corpus's standard-library modules are split into logical lines by Python's own ``tokenize``; each
line is a sentence whose words are its tokens and whose labels are their categories: ``keyword``, ``builtin``
(a name in ``builtins``), ``name``, ``number``, ``string``, ``operator``, ``comment``. Lines of fewer than
``MIN_WORDS`` tokens are dropped. The corpus's own split holds: lines of its eval documents are the eval set.
The task is easy for a pattern matcher and still needs context (a keyword's text is never a name, a name is a
builtin only by its text, strings and comments are long and varied), so a small encoder learns it in minutes.

``prepare_code_tags`` writes ``train.jsonl``, ``eval.jsonl`` (``{"tokens", "labels"}`` lines) and a byte-level
BPE trained on the train lines; data/prepare.py runs it once, under a lock, into data_cache/.
"""

from __future__ import annotations

import builtins
import io
import json
import keyword
import os
import tokenize

LABELS = ["builtin", "comment", "keyword", "name", "number", "operator", "string"]
MIN_WORDS = 4
MAX_LINES = {"train": 6000, "eval": 600}  # spread evenly over each split's lines


def category(token: tokenize.TokenInfo) -> str | None:
    """The label of one token (None for layout tokens: newlines, indents, the end marker)."""
    if token.type == tokenize.NAME:
        if keyword.iskeyword(token.string) or keyword.issoftkeyword(token.string):
            return "keyword"
        return "builtin" if hasattr(builtins, token.string) else "name"
    return {tokenize.NUMBER: "number", tokenize.STRING: "string", tokenize.OP: "operator",
            tokenize.COMMENT: "comment"}.get(token.type)


def sentences(source: str) -> list[dict]:
    """``{"tokens", "labels"}`` per logical line of ``source`` with at least ``MIN_WORDS`` tokens."""
    out, words, labels = [], [], []
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
                if len(words) >= MIN_WORDS:
                    out.append({"tokens": words, "labels": labels})
                words, labels = [], []
                continue
            label = category(token)
            if label is not None and token.string.strip():
                words.append(" ".join(token.string.split()))  # a multi-line string as one line of text
                labels.append(label)
    except (tokenize.TokenError, SyntaxError):  # a module this Python cannot tokenize keeps what it had
        pass
    return out


def prepare_code_tags(directory: str, dataset: dict, where: str, n_ctx: int) -> None:
    """Writes train.jsonl, eval.jsonl and the BPE tokenizer (``tokenizer_path``'s file name) into ``directory``."""
    from data import corpus
    from data.tokenizer import train_bpe

    os.makedirs(directory)
    named = [(name, (name, text)) for name, text in corpus.documents()]  # split() keeps the names this way
    rows = {}
    for split in ("train", "eval"):
        lines = [row for name, text in corpus.split(named, split) if name.startswith("stdlib:")
                 for row in sentences(text)]
        step = max(1, len(lines) // MAX_LINES[split])
        rows[split] = lines[::step][:MAX_LINES[split]]
        with open(os.path.join(directory, f"{split}.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows[split])
    tokenizer = train_bpe([" ".join(row["tokens"]) for row in rows["train"]], dataset["vocab_size"])
    tokenizer.save(os.path.join(directory, os.path.basename(dataset["tokenizer_path"])))
    with open(os.path.join(directory, "DONE"), "w") as f:
        f.write("prepared from the standard library's tokens\n")
