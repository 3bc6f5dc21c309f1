"""Search: validate the request, query the index inside the tenant, shape both specs' results."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from services.common import errors
from services.retrieval.keyword_index import IndexedChunk, KeywordIndex

MAX_QUERY_CHARS = 4096
MAX_RESULTS_LIMIT = 50
MODES = ("doc_first", "section_first", "chunk_priority", "hybrid_only")
PARAM_LIMITS = {"max_docs": 100, "max_sections": 200, "max_chunks": 200}
MAX_CONTEXT_TOKEN_LIMIT = 131_072
MAX_FILTER_VALUES = 100


@dataclass(frozen=True)
class Filters:
    """Metadata filters (retrieval-v1 §3)."""

    product: str = ""
    version: str = ""
    tags: tuple[str, ...] = ()
    doc_ids: tuple[str, ...] = ()
    section_ids: tuple[str, ...] = ()
    source: str = ""


@dataclass(frozen=True)
class SearchQuery:
    """A search request as the domain sees it; None means 'server default'."""

    query: str
    tenant_id: str
    max_results: int | None = None
    filters: Filters = field(default_factory=Filters)
    language: str = ""
    mode: str = ""
    max_docs: int | None = None
    max_sections: int | None = None
    max_chunks: int | None = None
    context_token_limit: int | None = None
    enable_hybrid: bool | None = None
    enable_rerank: bool | None = None
    trace_id: str = ""


@dataclass(frozen=True)
class SearchDefaults:
    """Server defaults (RETR_* / retrieval.md §8)."""

    max_results: int = 10
    max_docs: int = 20
    max_sections: int = 50
    max_chunks: int = 40
    context_token_limit: int = 4096
    topk_per_doc: int = 0
    min_score: float = 0.0
    mode: str = "section_first"


@dataclass(frozen=True)
class ChunkHit:
    doc_id: str
    section_id: str
    chunk_id: str
    text: str
    tokens: int
    page_start: int
    page_end: int
    score: float


@dataclass(frozen=True)
class DocHit:
    doc_id: str
    title: str
    score: float


@dataclass(frozen=True)
class SectionHit:
    section_id: str
    doc_id: str
    title: str
    summary: str
    page_start: int
    page_end: int
    anchor_chunk_id: str
    score: float


@dataclass(frozen=True)
class SearchResult:
    hits: list[ChunkHit]
    chunks: list[ChunkHit]
    docs: list[DocHit]
    sections: list[SectionHit]
    mode: str
    hybrid_used: bool
    rerank_used: bool
    elapsed_ms: int
    backend: str


def _invalid(field_name: str, message: str) -> errors.InvalidArgumentError:
    return errors.InvalidArgumentError(message, metadata={"field": field_name})


def validate(q: SearchQuery, defaults: SearchDefaults) -> None:
    """Raise InvalidArgumentError / LimitExceededError for a request the service must refuse."""
    if not q.tenant_id.strip():
        raise _invalid("tenant_id", "tenant_id is required")
    if not q.query.strip():
        raise _invalid("query", "query is required")
    if len(q.query) > MAX_QUERY_CHARS:
        raise errors.LimitExceededError(
            f"query is {len(q.query)} characters; the limit is {MAX_QUERY_CHARS}",
            metadata={"field": "query", "limit": str(MAX_QUERY_CHARS)},
        )
    if q.max_results is not None:
        if q.max_results < 1:
            raise _invalid("max_results", "max_results must be at least 1")
        if q.max_results > MAX_RESULTS_LIMIT:
            raise errors.LimitExceededError(
                f"max_results is {q.max_results}; the limit is {MAX_RESULTS_LIMIT}",
                metadata={"field": "max_results", "limit": str(MAX_RESULTS_LIMIT)},
            )
    if q.mode and q.mode not in MODES:
        raise _invalid("params.retrieval_mode", f"retrieval_mode must be one of {', '.join(MODES)}")
    for name, limit in PARAM_LIMITS.items():
        value = getattr(q, name)
        if value is not None and not 1 <= value <= limit:
            raise errors.LimitExceededError(
                f"params.{name} must be between 1 and {limit}",
                metadata={"field": f"params.{name}", "limit": str(limit)},
            )
    if (
        q.context_token_limit is not None
        and not 1 <= q.context_token_limit <= MAX_CONTEXT_TOKEN_LIMIT
    ):
        raise errors.LimitExceededError(
            f"params.context_token_limit must be between 1 and {MAX_CONTEXT_TOKEN_LIMIT}",
            metadata={"field": "params.context_token_limit", "limit": str(MAX_CONTEXT_TOKEN_LIMIT)},
        )
    f = q.filters
    for name in ("tags", "doc_ids", "section_ids"):
        if len(getattr(f, name)) > MAX_FILTER_VALUES:
            raise errors.LimitExceededError(
                f"filters.{name} has more than {MAX_FILTER_VALUES} values",
                metadata={"field": f"filters.{name}", "limit": str(MAX_FILTER_VALUES)},
            )


def _keeper(f: Filters):  # type: ignore[no-untyped-def]
    doc_ids, section_ids, tags = set(f.doc_ids), set(f.section_ids), set(f.tags)

    def keep(item: IndexedChunk) -> bool:
        doc = item.doc
        return (
            (not f.product or doc.product == f.product)
            and (not f.version or doc.version == f.version)
            and (not f.source or doc.source == f.source)
            and (not tags or bool(tags & set(doc.tags)))
            and (not doc_ids or doc.doc_id in doc_ids)
            and (not section_ids or item.section.section_id in section_ids)
        )

    return keep


class SearchEngine:
    """Runs searches over an index with server defaults."""

    def __init__(self, index: KeywordIndex, defaults: SearchDefaults) -> None:
        self._index = index
        self._defaults = defaults

    def search(self, q: SearchQuery) -> SearchResult:
        d = self._defaults
        validate(q, d)
        started = time.perf_counter()
        max_results = q.max_results or d.max_results
        max_chunks = q.max_chunks or d.max_chunks
        max_sections = q.max_sections or d.max_sections
        max_docs = q.max_docs or d.max_docs
        token_limit = q.context_token_limit or d.context_token_limit
        scored = self._index.search(
            q.tenant_id, q.query, keep=_keeper(q.filters), limit=max(max_results, max_chunks) * 4
        )
        top = scored[0].score if scored else 1.0
        per_doc: dict[str, int] = {}
        hits: list[ChunkHit] = []
        for s in scored:
            score = s.score / top  # normalised to (0, 1]
            if score < d.min_score:
                continue
            if d.topk_per_doc and per_doc.get(s.item.doc.doc_id, 0) >= d.topk_per_doc:
                continue
            per_doc[s.item.doc.doc_id] = per_doc.get(s.item.doc.doc_id, 0) + 1
            c = s.item.chunk
            hits.append(
                ChunkHit(
                    s.item.doc.doc_id, c.section_id, c.chunk_id, c.text, c.tokens,
                    c.page_start, c.page_end, round(score, 6),
                )
            )  # fmt: skip
        sections: dict[str, SectionHit] = {}
        docs: dict[str, DocHit] = {}
        by_chunk = {s.item.chunk.chunk_id: s.item for s in scored}
        for h in hits:
            item = by_chunk[h.chunk_id]
            if h.section_id not in sections and len(sections) < max_sections:
                sec = item.section
                sections[h.section_id] = SectionHit(
                    sec.section_id, h.doc_id, sec.title, sec.summary, sec.page_start,
                    sec.page_end, h.chunk_id, h.score,
                )  # fmt: skip
            if h.doc_id not in docs and len(docs) < max_docs:
                docs[h.doc_id] = DocHit(h.doc_id, item.doc.title, h.score)
        context: list[ChunkHit] = []
        used = 0
        for h in hits:
            if len(context) >= max_chunks:
                break
            if used + h.tokens > token_limit:
                continue
            context.append(h)
            used += h.tokens
        return SearchResult(
            hits=hits[:max_results],
            chunks=context,
            docs=list(docs.values()),
            sections=list(sections.values()),
            mode=q.mode or d.mode,
            hybrid_used=False,
            rerank_used=False,
            elapsed_ms=round((time.perf_counter() - started) * 1000),
            backend="keyword",
        )
