"""One text normalisation for training, translation and serving.

Every tokenizer applies :func:`normalize` before it splits a text, so the model never
sees what a user cannot see: control characters (NUL, escape, ...) and invisible
format characters (zero-width space, byte-order mark, soft hyphen) are removed, tabs,
line breaks and other whitespace become one space, leading and trailing whitespace go,
and (``nfkc``, every run trained since normalisation was added) Unicode compatibility
forms are folded as SentencePiece's own default does (a no-break space becomes a space,
a ligature its letters, a full-width letter the usual one). A whitespace-only text
becomes empty, and an empty text is translated as empty.

Runs trained before (their ``tokenizer.json`` names no normalisation) get ``controls``:
everything but the NFKC fold, which changes no ordinary text, so they translate as before.
"""

from __future__ import annotations

import re
import unicodedata

NORMALIZATIONS = ("nfkc", "controls")
INVISIBLE = dict.fromkeys(map(ord, "\u200b\u2060\ufeff\u00ad"))     # removed: zero-width space,
                                                                    # word joiner, BOM, soft hyphen
_WHITESPACE = re.compile(r"\s+")


def _without_controls(text: str) -> str:
    return "".join(character if unicodedata.category(character) != "Cc"
                   else " " if character.isspace() else ""
                   for character in text.translate(INVISIBLE))


def normalize(text: str, form: str = "nfkc") -> str:
    """``text`` as the tokenizers see it (see the module docstring)."""
    if text.isascii() and text.isprintable():          # the common case: only spaces to tidy
        return " ".join(text.split())
    text = _without_controls(text)
    if form == "nfkc":
        text = unicodedata.normalize("NFKC", text)
    return _WHITESPACE.sub(" ", text).strip()
