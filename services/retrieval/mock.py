"""Mock mode (retrieval-v1 §4/§5): stable hits from a fixed in-memory list, no index, no
embedder, no document store.

The list does not depend on the query or the tenant; the request's filters and limits apply
to it as they apply to the real engine's candidates: the same validation
(`engine.check_request`), the same defaults (`engine.request_limits`) and the same shaping
(`engine.select_chunks`, `sections_and_docs`, `context_chunks`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from services.common.search_contract import KB_SOURCE, USER_SOURCE, Filters
from services.common.tokenizer import Tokenizer, default_tokenizer
from services.docstore.model import Section, StoredPoint
from services.retrieval.engine import (
    RequestLimits,
    Scored,
    check_request,
    chunk_hit,
    context_chunks,
    request_limits,
    sections_and_docs,
    select_chunks,
)
from services.retrieval.search import SearchDefaults, SearchQuery, SearchResult
from services.retrieval.sections import DocSections


@dataclass(frozen=True)
class MockChunk:
    chunk_id: str
    section_id: str
    ord: int
    page_start: int
    page_end: int
    score: float
    """The chunk's fixed score: what min_score reads and hits are ordered by."""
    text: str


@dataclass(frozen=True)
class MockDocument:
    doc_id: str
    title: str
    sections: tuple[Section, ...]
    chunks: tuple[MockChunk, ...]
    product: str = ""
    version: str = ""
    tags: tuple[str, ...] = ()
    source: str = USER_SOURCE
    """USER_SOURCE: every tenant's own documents; KB_SOURCE: the shared knowledge base,
    searched with filters.source=knowledge_base only, as the real engine searches it."""


def _section(section_id: str, ord: int, title: str, summary: str, pages: tuple[int, int],
             chunk_ords: tuple[int, int]) -> Section:  # fmt: skip
    return Section(section_id, ord, title, summary, *pages, *chunk_ords)


FIXED_DOCUMENTS = (
    MockDocument(
        "doc_1",
        "Orion X guide",
        (
            _section("sec_intro", 0, "Introduction", "How Orion X is configured.", (1, 2), (0, 4)),
            _section("sec_ldap", 1, "LDAP integration", "Setting up LDAP under Settings > Auth.",
                     (6, 7), (5, 9)),
        ),
        (
            MockChunk("chunk_1", "sec_intro", 0, 1, 2, 0.92,
                      "Orion X is configured through the admin console."),
            MockChunk("chunk_2", "sec_ldap", 5, 6, 7, 0.81,
                      "LDAP integration is set up under Settings > Auth."),
        ),
        product="orion-x",
        version="2.1",
        tags=("admin", "guide"),
    ),
    MockDocument(
        "doc_2",
        "Orion X release notes",
        (_section("sec_changes", 0, "Changes", "What version 2.2 changed.", (1, 1), (0, 0)),),
        (
            MockChunk("chunk_3", "sec_changes", 0, 1, 1, 0.64,
                      "Version 2.2 fixes LDAP synchronisation of large groups."),
        ),
        product="orion-x",
        version="2.2",
        tags=("release",),
    ),
    MockDocument(
        "kb_depreciation",
        "Depreciation basics",
        (_section("sec_methods", 0, "Methods", "Depreciation methods.", (1, 2), (0, 0)),),
        (
            MockChunk("kb_chunk_1", "sec_methods", 0, 1, 2, 0.7,
                      "Depreciation spreads the cost of an asset over its useful life."),
        ),
        tags=("finance",),
        source=KB_SOURCE,
    ),
)  # fmt: skip
"""The fixed list: two documents of every tenant's own, one of the knowledge base."""


def matches(doc: MockDocument, chunk: MockChunk, f: Filters) -> bool:
    """Whether the real engine's index filter (index.base.filter_conditions) would let the
    chunk through: the knowledge base only when asked for by source, doc_ids, section_ids
    and tags any-of, product, version and source equal; an empty filter restricts nothing."""
    return (
        (doc.source == KB_SOURCE) == (f.source == KB_SOURCE)
        and (not f.source or doc.source == f.source)
        and (not f.doc_ids or doc.doc_id in f.doc_ids)
        and (not f.section_ids or chunk.section_id in f.section_ids)
        and (not f.tags or bool(set(f.tags) & set(doc.tags)))
        and (not f.product or doc.product == f.product)
        and (not f.version or doc.version == f.version)
    )


class MockSearchEngine:
    """Answers every valid query from FIXED_DOCUMENTS, the request's filters and limits
    applied as the real engine applies them; the same request always gets the same answer."""

    def __init__(
        self,
        defaults: SearchDefaults,
        documents: tuple[MockDocument, ...] = FIXED_DOCUMENTS,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        self._defaults = defaults
        self._documents = documents
        self._tokenizer = tokenizer or default_tokenizer()
        self._points: dict[str, StoredPoint] = {}
        self._texts: dict[str, str] = {}
        for doc in documents:
            for c in doc.chunks:
                self._points[c.chunk_id] = StoredPoint(
                    point_id=len(self._points),
                    doc_id=doc.doc_id,
                    section_id=c.section_id,
                    chunk_id=c.chunk_id,
                    kind="chunk",
                    ord=c.ord,
                    page_start=c.page_start,
                    page_end=c.page_end,
                    tokens=self._tokenizer.count(c.text),
                    generation="mock",
                )
                self._texts[c.chunk_id] = c.text
        self._catalog: dict[str, DocSections] = {
            d.doc_id: (d.title, {s.section_id: s for s in d.sections}) for d in documents
        }

    def _candidates(self, f: Filters) -> Iterator[Scored]:
        for doc in self._documents:
            for c in doc.chunks:
                if matches(doc, c, f):
                    yield self._points[c.chunk_id], c.score

    async def search(self, q: SearchQuery) -> SearchResult:
        check_request(q, self._defaults)
        limits: RequestLimits = request_limits(q, self._defaults)
        selected = select_chunks(limits, self._candidates(q.filters))
        head = selected[: max(limits.max_results, limits.max_chunks)]
        kept = [chunk_hit(h, self._texts[h.chunk_id], score) for h, score in head]
        sections, docs = sections_and_docs(limits, selected, self._catalog.get)
        return SearchResult(
            hits=kept[: limits.max_results],
            chunks=context_chunks(limits, kept, self._tokenizer),
            docs=docs,
            sections=sections,
            mode=q.mode or self._defaults.mode,
            hybrid_used=False,
            rerank_used=False,
            elapsed_ms=0,
            backend="mock",
        )
