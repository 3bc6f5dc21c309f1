"""The search request and result as the domain sees them, and request validation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from services.common import errors

MAX_QUERY_CHARS = 4096
MAX_RESULTS_LIMIT = 50
MODES = ("doc_first", "section_first", "chunk_priority", "hybrid_only")
PARAM_LIMITS = {"max_docs": 100, "max_sections": 200, "max_chunks": 200}
MAX_CONTEXT_TOKEN_LIMIT = 131_072
MAX_FILTER_VALUES = 100
SOURCES = ("user", "knowledge_base")
"""The values of filters.source (empty: any)."""
MAX_TOPK_PER_DOC = 50

KB_TENANT = "__knowledge_base__"
"""The reserved tenant that holds the shared knowledge base (DESIGN §3, agent.md §6)."""


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
    max_docs: int = 20
    max_sections: int = 50
    max_chunks: int = 40
    context_token_limit: int = 4096
    topk_per_doc: int = 0
    min_score: float = 0.0
    mode: str = "section_first"


class ChunkHit(NamedTuple):
    doc_id: str
    section_id: str
    chunk_id: str
    text: str
    tokens: int
    page_start: int
    page_end: int
    score: float
    ord: int = 0


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


def _invalid(field_name: str, message: str) -> errors.InvalidArgumentError:
    return errors.InvalidArgumentError(message, metadata={"field": field_name})


def validate(q: SearchQuery, defaults: SearchDefaults) -> None:
    """Raise InvalidArgumentError / LimitExceededError for a request the service must refuse."""
    if not q.tenant_id.strip():
        raise _invalid("tenant_id", "tenant_id is required")
    if q.tenant_id == KB_TENANT:
        raise _invalid(
            "tenant_id", "the knowledge base is searched with filters.source=knowledge_base"
        )
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
    if q.topk_per_doc is not None and not 0 <= q.topk_per_doc <= MAX_TOPK_PER_DOC:
        raise errors.LimitExceededError(
            f"params.topk_per_doc must be between 0 and {MAX_TOPK_PER_DOC}",
            metadata={"field": "params.topk_per_doc", "limit": str(MAX_TOPK_PER_DOC)},
        )
    if q.min_score is not None and not 0.0 <= q.min_score <= 1.0:
        raise _invalid("params.min_score", "params.min_score must be between 0 and 1")
    validate_filters(q.filters)


class FilterValues(Protocol):
    """The filter fields validate_filters reads (this module's Filters, the orchestrator's)."""

    @property
    def tags(self) -> Sequence[str]: ...
    @property
    def doc_ids(self) -> Sequence[str]: ...
    @property
    def section_ids(self) -> Sequence[str]: ...
    @property
    def source(self) -> str: ...


def validate_filters(f: FilterValues) -> None:
    """filters.source and the filter lists' limits; the orchestrator checks a Respond's
    filters with it before they reach Retrieval."""
    if f.source and f.source not in SOURCES:
        raise _invalid("filters.source", "filters.source must be 'user' or 'knowledge_base'")
    for name in ("tags", "doc_ids", "section_ids"):
        if len(getattr(f, name)) > MAX_FILTER_VALUES:
            raise errors.LimitExceededError(
                f"filters.{name} has more than {MAX_FILTER_VALUES} values",
                metadata={"field": f"filters.{name}", "limit": str(MAX_FILTER_VALUES)},
            )
