"""The document model shared by ingestion, retrieval and the tools: documents, sections, chunks."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Chunk:
    """A run of text small enough to embed and to quote; `ord` is its position in the document."""

    chunk_id: str
    section_id: str
    ord: int
    text: str
    tokens: int
    page_start: int
    page_end: int


@dataclass(frozen=True)
class Section:
    """A heading and the chunks under it."""

    section_id: str
    ord: int
    title: str
    summary: str
    page_start: int
    page_end: int
    first_chunk_ord: int
    last_chunk_ord: int


@dataclass(frozen=True)
class Document:
    """A parsed document of one tenant."""

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

    @property
    def chars(self) -> int:
        return sum(len(c.text) for c in self.chunks)
