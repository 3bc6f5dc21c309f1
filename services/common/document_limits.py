"""How long a document's id and filterable fields may be: what ingestion accepts
(services/retrieval/ingestion.py, services/docstore/fields.py) and, so, the longest value a
search filter can usefully hold (`search_contract.validate_filters`, which the Orchestrator
and Retrieval both run)."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

from services.common import errors

MAX_DOC_ID_CHARS = 128
"""A doc_id's longest spelling, in characters of any script."""
_DOC_ID = re.compile(rf"[^\W_][\w.-]{{0,{MAX_DOC_ID_CHARS - 1}}}")
"""Letters of any script (ids are derived from file names, often Russian), digits, . _ -"""
DOC_ID_RULE = (
    f"doc_id must be 1-{MAX_DOC_ID_CHARS} characters of letters, digits, '.', '_' or '-', "
    "starting with a letter or digit"
)


def is_mark(char: str) -> bool:
    """Whether `char` is a combining mark (Unicode category M): part of the letter before it
    (a Devanagari vowel sign, Hebrew points, an accent NFKC has no single letter for)."""
    return unicodedata.category(char).startswith("M")


def is_doc_id(value: str) -> bool:
    """Whether a document could be stored under `value` (ingestion holds every id to it).
    A letter's combining marks count as part of it, anywhere but first."""
    if not value or len(value) > MAX_DOC_ID_CHARS or is_mark(value[0]):
        return False
    return _DOC_ID.fullmatch("".join(c for c in value if not is_mark(c))) is not None


def check_doc_ids(values: Iterable[str], field_name: str) -> None:
    """INVALID_ARGUMENT naming `field_name` for the first of `values` no document could have:
    a request naming one is refused, never answered as a document the tenant lacks."""
    bad = next((v for v in values if not is_doc_id(v)), None)
    if bad is not None:
        raise errors.invalid(field_name, f"{DOC_ID_RULE}; {bad[:MAX_DOC_ID_CHARS]!r} is not")


MAX_TAG_CHARS = 128
MAX_PRODUCT_CHARS = 256
"""Also the limit of `version`."""

SECTION_SLUG_CHARS = 40
"""The longest slug of a heading in its section's id (`section_key`)."""
MAX_PART_ID_CHARS = 200
"""The longest id of a document's section or chunk: its document's id (MAX_DOC_ID_CHARS) and
what `section_key` adds (":s", the section's number, "-", a slug of SECTION_SLUG_CHARS at
most: 176 characters at parsing's MAX_SECTIONS) or a chunk's ":c" and number; the longest
id a document tool takes (tool_contract.ID_SCHEMA)."""

FILTER_VALUE_CHARS = {
    "product": MAX_PRODUCT_CHARS,
    "version": MAX_PRODUCT_CHARS,
    "tags": MAX_TAG_CHARS,
    "doc_ids": MAX_DOC_ID_CHARS,
    "section_ids": MAX_PART_ID_CHARS,
}
"""The longest value of each search filter: the longest a document or section can be stored
with."""


def section_key(doc_id: str, index: int, slug: str) -> str:
    """The id ingestion gives a document's `index`-th section: `<doc_id>:s<NNN>-<slug>`."""
    return f"{doc_id}:s{index:03d}-{slug}"


def section_document(section_id: str) -> str:
    """The document a section id (`section_key`) names: the part before the first ':', as a
    doc_id holds none (DOC_ID_RULE); "" for an id of another form, which names no document."""
    doc_id, colon, _ = section_id.partition(":")
    return doc_id if colon else ""
