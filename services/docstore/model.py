"""The document model shared by ingestion, retrieval and the tools: documents, sections, chunks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from services.docstore.chunking import whole_text


@dataclass(frozen=True)
class Chunk:
    """A run of text small enough to embed and to quote; `ord` is its position in the document.

    `tokens` is the real token count of `text` (the default BPE encoding); a chunk that spans
    a page break has `page_end > page_start`. Pages count from 1.
    """

    doc_id: str
    chunk_id: str
    section_id: str
    ord: int
    text: str
    tokens: int
    page_start: int
    page_end: int


@dataclass(frozen=True)
class Section:
    """A heading and the chunks under it; `title` carries the heading path ("Parent › Child")."""

    section_id: str
    ord: int
    title: str
    summary: str
    page_start: int
    page_end: int
    first_chunk_ord: int
    last_chunk_ord: int


@dataclass(frozen=True)
class Page:
    """The plain text of one page (numbered from 1), as the tools quote it."""

    number: int
    text: str


@dataclass(frozen=True)
class Document:
    """A parsed document of one tenant.

    `generation` is a hash of everything the parse depended on (content, options, chunking
    config, parser version): identical input gives an identical generation. Retrieval mixes
    the embedding model and the summarizer into it before storing (services/retrieval/
    ingestion.py), so a document indexed another way is not `unchanged`. `metadata` holds
    free-form string facts (file_name, format, topic, jurisdiction, updated_at, ...).
    `page_texts[i]` is the text of page i+1 (may be empty when the store read left them out).
    """

    tenant_id: str
    doc_id: str
    title: str
    source: str = "user"
    product: str = ""
    version: str = ""
    tags: tuple[str, ...] = ()
    pages: int = 1
    sections: tuple[Section, ...] = ()
    chunks: tuple[Chunk, ...] = field(default=(), repr=False)
    generation: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)
    page_texts: tuple[str, ...] = field(default=(), repr=False)
    tokens: int = 0
    """Its whole text (`chars`) in BPE tokens of the chunking encoding (cl100k_base), as the
    LLM service counts a whole read of it; 0 when not counted."""

    @property
    def chars(self) -> int:
        """The document's size in characters: its whole text's (chunking.whole_text)."""
        return len(whole_text(self.page_texts, (c.text for c in self.chunks)))


@dataclass(frozen=True)
class DocumentSummary:
    """A listed document: its own fields and its counts, all of one stored generation (the
    store reads them in one query: `list_summaries`)."""

    doc_id: str
    title: str
    pages: int
    sections: int
    chunks: int
    chars: int
    source: str
    generation: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)
    tokens: int = 0
    """The whole text in cl100k tokens (Document.tokens); 0 when not counted."""


TO_THE_END = 1 << 30
"""A range end past any chunk ord or page number: chunk_range / pages_text to the end."""
MAX_POINT_ID = 2**64 - 1
"""Point ids are unsigned 64-bit integers (`retrieval.ingestion.point_id`): the largest one
both index backends and both document stores keep."""


class StoredPoint(NamedTuple):
    """An index point of a document's stored generation, as search reads it back.

    Written with the document in one transaction (the document store's `points` table), so a
    point id the store answers for is one of a committed generation: points of an ingest
    that never committed, or of a generation replaced since, are simply not found. Search
    uses these tuples as its candidates (services/retrieval/engine.py).
    """

    point_id: int
    """Unsigned 64-bit (services/retrieval/ingestion.point_id)."""
    doc_id: str
    section_id: str
    chunk_id: str
    kind: str
    ord: int
    page_start: int
    page_end: int
    tokens: int
    generation: str
