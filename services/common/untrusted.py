"""Untrusted text (documents, external APIs) as delimited data the model can tell apart.

Every text a tool returns is wrapped as `<<<DOCUMENT doc_id="…">>>\n…\n<<<END DOCUMENT>>>`
(or EXTERNAL); runs of `<<<` inside the data are neutralised first, so a document cannot
close the delimiter itself. The LLM service unwraps what it quotes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# "<<<" and look-alikes (fullwidth, small form) in data: a marker can only start with "<<<".
# Invisible format characters (soft hyphen, zero-width space/joiners, word joiner, bidi
# controls, BOM, ...) between them render as nothing, so "<\u200b<\u200b<" reads as "<<<":
# they are part of the run.
MARKER_CHARS = ("<", "\uff1c", "\ufe64")
"""The characters a marker run is made of: "<" and its look-alikes (fullwidth, small form)."""
_LT = "[" + "".join(MARKER_CHARS) + "]"
_INVISIBLE = "[\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff]"
_MARKER_RUN = re.compile(f"{_LT}(?:{_INVISIBLE}*{_LT}){{2,}}")
_ATTR_UNSAFE = re.compile('[<>"\\\\\x00-\x1f\x7f\uff1c\uff1e\ufe64\ufe65]')
_WRAPPED = re.compile(r"\A<<<([A-Z]+)[^\n]*>>>\n(.*)\n<<<END \1>>>\Z", re.DOTALL)


def has_marker(text: str) -> bool:
    """`text` holds a run of 3+ `<` (or look-alikes, invisible characters between them): the
    start of a marker, as neutralise_markers finds them."""
    return _MARKER_RUN.search(text) is not None


def neutralise_markers(text: str) -> str:
    """Replace every run of 3+ `<` (or look-alikes) by as many `‹`: data cannot forge a marker."""
    return _MARKER_RUN.sub(lambda m: "\u2039" * len(m.group()), text)


def _attr(value: object) -> str:
    return _ATTR_UNSAFE.sub("_", str(value))[:300]


def wrap_untrusted(text: str, kind: str = "DOCUMENT", attrs: Mapping[str, object] = {}) -> str:
    """`<<<KIND k="v" …>>>\\ntext\\n<<<END KIND>>>`; `text` must already be neutralised."""
    head = "".join(f' {k}="{_attr(v)}"' for k, v in attrs.items())
    return f"<<<{kind}{head}>>>\n{text}\n<<<END {kind}>>>"


def is_wrapped(text: str) -> bool:
    """`text` is one wrap_untrusted block: a marker line, the data, the END of the same kind."""
    return _WRAPPED.match(text) is not None


def unwrap_untrusted(text: str) -> str:
    """The data inside a wrap_untrusted text (the text itself when it is not wrapped)."""
    m = _WRAPPED.match(text)
    return m.group(2) if m else text
