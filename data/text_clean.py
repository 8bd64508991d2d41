"""Optional text clean-up before tokenizing (create_tfrecords' ``--ftfy`` and ``--wikitext-detokenize``, as in
GPT-Neo's data/create_tfrecords.py)."""

from __future__ import annotations

import re
from typing import Callable

from config import ConfigError

# WikiText's tokenized spacing undone, in order: (pattern, replacement, is_regex).
_WIKITEXT_RULES = (
    ("s '", "s'", False),  # plural possessive
    (" @-@ ", "-", False), (" @,@ ", ",", False), (" @.@ ", ".", False),  # number separators
    (" : ", ": ", False), (" ; ", "; ", False), (" . ", ". ", False), (" ! ", "! ", False), (" ? ", "? ", False),
    (" , ", ", ", False),
    (r"\(\s*([^\)]*?)\s*\)", r"(\1)", True), (r"\[\s*([^\]]*?)\s*\]", r"[\1]", True),  # brackets hug their text
    (r"{\s*([^}]*?)\s*}", r"{\1}", True), (r"\"\s*([^\"]*?)\s*\"", r'"\1"', True),
    (r"'\s*([^']*?)\s*'", r"'\1'", True),
    ("= = = =", "====", False), ("= = =", "===", False), ("= =", "==", False),  # headings
    (" \u00b0 ", "\u00b0", False), (" \n", "\n", False), ("\n ", "\n", False), (" N ", " 1 ", False),
    (" 's", "'s", False),
)


def wikitext_detokenize(text: str) -> str:
    """WikiText's raw files with their tokenized spacing undone (``a @-@ b`` -> ``a-b``, ``( x )`` -> ``(x)``,
    ``= = h = =`` -> ``== h ==``, ...), GPT-Neo's rules. GPT-Neo also had a rule for ``' <digit>`` written with
    literal slashes, which never matched ordinary text; it is left out."""
    for pattern, replacement, is_regex in _WIKITEXT_RULES:
        text = re.sub(pattern, replacement, text) if is_regex else text.replace(pattern, replacement)
    return text


def cleaner(ftfy: bool, wikitext: bool) -> Callable[[str], str] | None:
    """The clean-up to apply to each document (ftfy's NFKC fix first, then the WikiText detokenizer), or None."""
    steps = []
    if ftfy:
        try:
            import ftfy as ftfy_module
        except ImportError:
            raise ConfigError("--ftfy needs the ftfy package (pip install ftfy)") from None
        steps.append(lambda t: ftfy_module.fix_text(t, normalization="NFKC"))
    if wikitext:
        steps.append(wikitext_detokenize)
    if not steps:
        return None

    def clean(text: str) -> str:
        for step in steps:
            text = step(text)
        return text

    return clean
