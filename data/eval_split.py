"""Which of your text is held out for eval (data/make_dataset.py, train.py --data): decided per document by a hash
of its text, so the split is stable under edits to the folder.

A document is an eval document when the SHA-256 of its text (line endings as ``\\n``, surrounding whitespace
stripped), read as a number in [0, 1), is below the eval fraction. Its side depends on nothing else: adding,
removing, renaming or reordering files (or jsonl lines) moves no other document between train and eval; copies
of one text land on one side; a larger fraction only adds eval documents. Editing a document's text may move it.
The share held out is the fraction on average (binomial: 50 +- 7 of 1,000 documents at 5%), not exact: an exact
count would have to move documents as the folder grows.

Two guards keep both sides non-empty, and they alone look at the other documents: where none falls below the
fraction, the one of lowest hash is held out (a folder of fewer than about 1/fraction documents holds out one), and
where all do, the one of highest hash trains. A single document (or copies of one text) is cut instead: its last
fraction, at a line break, is eval.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

SCHEME = "text-sha256/1"  # recorded in a prepared folder's settings: a folder split another way is prepared anew
SALT = b"neomesh eval split\0"
SCALE = 1 << 64  # a draw is the hash's first 8 bytes: an integer in [0, SCALE)


def draw(text: str) -> int:
    """The document's number in [0, SCALE): the same in every process and on every machine (no ``hash()``);
    a file saved with Windows line endings, or with a trailing newline added, draws the same."""
    return draw_bytes(text.replace("\r\n", "\n").strip().encode("utf-8"))


def draw_bytes(content: bytes) -> int:
    """``draw`` of raw content (an image file's bytes)."""
    return int.from_bytes(hashlib.sha256(SALT + content).digest()[:8], "big")


def split_text(text: str, fraction: float) -> tuple[str, str]:
    """(train, eval) parts of one document: its last ``fraction``, cut after a line break when there is one."""
    cut = int(len(text) * (1 - fraction))
    line_end = text.rfind("\n", 0, cut)
    if line_end > 0:
        cut = line_end + 1
    return text[:cut], text[cut:]


@dataclass(frozen=True)
class EvalSplit:
    """How documents divide between train and eval (picklable: the processes writing TFRecords get it whole).
    ``to_eval`` / ``to_train``: the draw of the document a guard moved (None: no guard acted)."""
    fraction: float
    whole_documents: bool = True
    to_eval: int | None = None
    to_train: int | None = None

    def is_eval(self, value: int) -> bool:
        """Whether the whole document of draw ``value`` is held out."""
        return value != self.to_train and (value < self.fraction * SCALE or value == self.to_eval)

    def parts(self, text: str) -> tuple[str, str]:
        """(train, eval) text of one document."""
        if self.fraction <= 0:
            return text, ""
        if not self.whole_documents:
            return split_text(text, self.fraction)
        return ("", text) if self.is_eval(draw(text)) else (text, "")


class Draws:
    """What the split needs to know of all documents, gathered as they are counted (a file's own, merged once it
    read through without error): how many there are, how many fall below the fraction, and the lowest and highest
    draw with the number of documents drawing each (copies of one text draw alike)."""

    def __init__(self, fraction: float):
        self.fraction, self.count, self.below = fraction, 0, 0
        self.lowest: tuple[int, int] | None = None  # (draw, documents)
        self.highest: tuple[int, int] | None = None

    def add(self, text: str) -> None:
        self.add_draw(draw(text))

    def add_draw(self, value: int) -> None:
        self.count += 1
        self.below += value < self.fraction * SCALE
        self.lowest, self.highest = _extreme(min, self.lowest, (value, 1)), _extreme(max, self.highest, (value, 1))

    def merge(self, other: Draws) -> None:
        self.count += other.count
        self.below += other.below
        self.lowest, self.highest = _extreme(min, self.lowest, other.lowest), _extreme(max, self.highest,
                                                                                       other.highest)

    def split(self) -> tuple[EvalSplit, int | None]:
        """(the split, the number of eval documents; None where each document is cut instead)."""
        if self.fraction <= 0 or self.count == 0:
            return EvalSplit(self.fraction), 0
        if self.lowest[0] == self.highest[0]:  # one document, or copies of one text: nothing else to hold out
            return EvalSplit(self.fraction, whole_documents=False), None
        if self.below == 0:
            return EvalSplit(self.fraction, to_eval=self.lowest[0]), self.lowest[1]
        if self.below == self.count:
            return EvalSplit(self.fraction, to_train=self.highest[0]), self.count - self.highest[1]
        return EvalSplit(self.fraction), self.below

    def described(self) -> str:
        """The eval split in words, for the summary line."""
        split, held = self.split()
        if self.fraction <= 0:
            return "none (--eval-fraction 0)"
        if held is None:
            return f"the last {self.fraction:.0%} of each document (a single distinct document)"
        if split.to_eval is not None:
            return f"{held:,} of the documents, the one of lowest text hash (none fell below {self.fraction:.0%})"
        if split.to_train is not None:
            return f"{held:,} of the documents, all but the one of highest text hash"
        return f"{held:,} of the documents, chosen by a hash of each one's text ({self.fraction:.0%} on average)"


def _extreme(pick, a: tuple[int, int] | None, b: tuple[int, int] | None) -> tuple[int, int] | None:
    """The lower (``pick`` min) or higher (max) of two (draw, documents), their documents added when equal."""
    if a is None or b is None:
        return a or b
    if a[0] == b[0]:
        return a[0], a[1] + b[1]
    return a if pick(a[0], b[0]) == a[0] else b
