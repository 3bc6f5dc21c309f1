"""The search request and result as the domain sees them, and request validation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from services.common import errors
from services.common.search_contract import (
    Filters,
    check_max_results,
    check_query,
    check_tenant_id,
    refuse_reserved_tenant,
    validate_filters,
)

MODES = ("doc_first", "section_first", "chunk_priority", "hybrid_only")
PARAM_LIMITS = {"max_docs": 100, "max_sections": 200, "max_chunks": 200}
MAX_CONTEXT_TOKEN_LIMIT = 131_072
MAX_TOPK_PER_DOC = 50


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
    ranking: str = ""
    fusion: str = ""
    topk_per_doc: int | None = None
    min_score: float | None = None
    expand_query: bool | None = None
    hard_trim: bool | None = None


@dataclass(frozen=True)
class SearchDefaults:
    """Server defaults (RETR_* / retrieval.md §8)."""

    max_results: int = 10
    """Hits per search when the request gives no max_results (retrieval-v1 §6)."""
    max_docs: int = 20
    """Documents a search keeps at most (retrieval.md §8.1)."""
    max_sections: int = 50
    """Sections a search keeps at most (retrieval.md §8.1)."""
    max_chunks: int = 40
    """Chunks a search keeps at most (retrieval.md §8.1)."""
    context_token_limit: int = 4096
    """Tokens of the context a search assembles (retrieval.md §8.1's context_token_limit)."""
    topk_per_doc: int = 0
    """Chunks per document at most; 0 = no limit (retrieval-v1 §6)."""
    min_score: float = 0.0
    """Hits scoring below this (0..1) are dropped (retrieval-v1 §6). Scores are the
    ranking's own: a cosine with dense ranking, relative to the query's best candidates with
    sparse and hybrid (the default) ranking, where a query nothing matches still scores its
    nearest chunks high; the threshold trims weak hits, it does not tell relevant from not."""
    mode: str = "section_first"
    """The retrieval_mode when the request names none (retrieval.md §4.1)."""


class ChunkHit(NamedTuple):
    """A chunk the search found: a hit, and a candidate of the context builder."""

    doc_id: str
    section_id: str
    chunk_id: str
    text: str
    tokens: int
    """Token count of `text` from ingestion, counted with the same tokenizer (0 = unknown).
    The context builder takes it as the count of a block of this chunk alone; merged and
    trimmed blocks it counts itself."""
    page_start: int
    page_end: int
    score: float
    ord: int = 0
    """Position of the chunk in its document (consecutive chunks differ by 1)."""
    merged: tuple[str, ...] = ()
    """A context entry: the ids of every chunk it holds, in document order (neighbours of
    one section merged; `chunk_id` is the first); () for a hit."""
    truncated: bool = False
    """A context entry whose last chunk was cut to fit the token limit (hard_trim)."""


class DocHit(NamedTuple):
    doc_id: str
    title: str
    score: float


class SectionHit(NamedTuple):
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
    language: str = ""
    query_variants: tuple[str, ...] = ()
    query_variants_source: str = ""
    """Where query_variants came from: "synonyms", "llm", or "" when none were searched."""
    query_embedding_ms: float = 0.0
    engine_ms: float = 0.0
    rerank_ms: float = 0.0


def validate(q: SearchQuery, defaults: SearchDefaults) -> None:
    """Raise InvalidArgumentError / LimitExceededError for a request the service must refuse."""
    check_tenant_id(q.tenant_id)
    refuse_reserved_tenant(q.tenant_id, "tenant_id", "search it with filters.source=knowledge_base")
    check_query(q.query)
    check_max_results(q.max_results)
    if q.mode and q.mode not in MODES:
        raise errors.invalid(
            "params.retrieval_mode", f"retrieval_mode must be one of {', '.join(MODES)}"
        )
    for name, limit in PARAM_LIMITS.items():
        value = getattr(q, name)
        if value is not None and not 1 <= value <= limit:
            raise errors.over_limit(
                f"params.{name} must be between 1 and {limit}", limit, field=f"params.{name}"
            )
    if (
        q.context_token_limit is not None
        and not 1 <= q.context_token_limit <= MAX_CONTEXT_TOKEN_LIMIT
    ):
        raise errors.over_limit(
            f"params.context_token_limit must be between 1 and {MAX_CONTEXT_TOKEN_LIMIT}",
            MAX_CONTEXT_TOKEN_LIMIT,
            field="params.context_token_limit",
        )
    if q.topk_per_doc is not None and not 0 <= q.topk_per_doc <= MAX_TOPK_PER_DOC:
        raise errors.over_limit(
            f"params.topk_per_doc must be between 0 and {MAX_TOPK_PER_DOC}",
            MAX_TOPK_PER_DOC,
            field="params.topk_per_doc",
        )
    if q.min_score is not None and not 0.0 <= q.min_score <= 1.0:
        raise errors.invalid("params.min_score", "params.min_score must be between 0 and 1")
    validate_filters(q.filters)
