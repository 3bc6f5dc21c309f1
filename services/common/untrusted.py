"""Untrusted text (documents, external APIs) as delimited data the model can tell apart.

Every text a tool returns is wrapped as `<<<DOCUMENT doc_id="…">>>\n…\n<<<END DOCUMENT>>>`
(or EXTERNAL); runs of `<<<` inside the data are neutralised first, so a document cannot
close the delimiter itself. The LLM service unwraps what it quotes.

The format is written and read here only: the kind (KIND), the attributes of the opening
marker (`name="value"`, values cleaned by the writer) and the `pages` attribute
(format_pages / parse_pages).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

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

KIND = "[A-Z][A-Z_]*"
"""The pattern of a block's kind (DOCUMENT, EXTERNAL, CONTEXT, QUERY): wrap_untrusted writes
no other kind, and every reader finds exactly these."""
_KIND = re.compile(KIND)
_ATTR_NAME = re.compile(r"\w+")
# The opening marker: the kind, then nothing or a space and the attributes.
_OPEN = rf"<<<({KIND})((?: [^\n]*)?)>>>\n"
_WRAPPED = re.compile(rf"\A{_OPEN}(.*)\n<<<END \1>>>\Z", re.DOTALL)
_BLOCK = re.compile(rf"{_OPEN}(.*?)\n<<<END \1>>>", re.DOTALL)
_ATTR = re.compile(rf'({_ATTR_NAME.pattern})="([^"]*)"')
_PAGES = re.compile(r"([0-9]+)(?:-([0-9]+))?")


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
    """`<<<KIND k="v" …>>>\\ntext\\n<<<END KIND>>>`; `text` must already be neutralised.

    `kind` matches KIND and every attribute name is a word (letters, digits, `_`): the
    readers here find nothing else (ValueError otherwise).
    """
    if not _KIND.fullmatch(kind):
        raise ValueError(f"block kind {kind!r} does not match {KIND}")
    for k in attrs:
        if not _ATTR_NAME.fullmatch(k):
            raise ValueError(f"marker attribute name {k!r} is not a word")
    head = "".join(f' {k}="{_attr(v)}"' for k, v in attrs.items())
    return f"<<<{kind}{head}>>>\n{text}\n<<<END {kind}>>>"


def is_wrapped(text: str, kind: str | None = None) -> bool:
    """`text` is one wrap_untrusted block (of `kind` when given): a marker line, the data, the
    END of the same kind."""
    m = _WRAPPED.match(text)
    return m is not None and (kind is None or m.group(1) == kind)


def unwrap_untrusted(text: str) -> str:
    """The data inside a wrap_untrusted text (the text itself when it is not wrapped)."""
    m = _WRAPPED.match(text)
    return m.group(3) if m else text


def parse_attrs(head: str) -> dict[str, str]:
    """The `name="value"` attributes of an opening marker (what follows its kind)."""
    return dict(_ATTR.findall(head))


@dataclass(frozen=True)
class DelimitedText:
    """A delimited block of data found in a message: its kind, marker attributes and text."""

    kind: str
    attrs: dict[str, str]
    text: str


def delimited_blocks(text: str, kind: str | None = None) -> list[DelimitedText]:
    """Every `<<<KIND …>>>…<<<END KIND>>>` block of `text` (of one kind when given)."""
    return [
        DelimitedText(m.group(1), parse_attrs(m.group(2)), m.group(3))
        for m in _BLOCK.finditer(text)
        if kind is None or m.group(1) == kind
    ]


def strip_delimited(text: str) -> str:
    """`text` without its delimited data blocks: only the instructions around them."""
    return _BLOCK.sub("", text)


def _page(value: object) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, str) and re.fullmatch("[0-9]+", value.strip()):
        return int(value)
    return 0


def format_pages(first: object, last: object = None) -> str | None:
    """The `pages` attribute of the text on pages `first`..`last`: "3", or "3-5" when `last`
    is past `first`; None (no attribute) when the first page is not known.

    Pages count from 1: 0, a negative number or anything but an int (or its decimal string)
    is not known. An unknown, equal or earlier `last` gives the single page `first`.
    """
    start, end = _page(first), _page(last)
    if start < 1:
        return None
    return f"{start}-{end}" if end > start else str(start)


def parse_pages(attr: str) -> tuple[int, int]:
    """The (first, last) pages a `pages` attribute written by format_pages names; (0, 0)
    when it names none (absent, empty or unreadable)."""
    m = _PAGES.fullmatch(attr.strip())
    if m is None or int(m.group(1)) < 1:
        return 0, 0
    start = int(m.group(1))
    return start, max(start, int(m.group(2) or 0))
