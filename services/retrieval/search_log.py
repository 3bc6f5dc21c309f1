"""One structured log line per search (retrieval-v1 §7, retrieval.md §7.4).

Event ``search``: tenant_id (the caller's), searched_tenant (the tenant whose documents were
searched: the caller's, or the knowledge base's), max_results, filters, mode, hits_count,
backend, the candidates each stage produced and the time each stage took. A search slower than
``EngineSettings.slow_search_ms`` (300) is logged at WARNING with ``slow: true``, otherwise at INFO. The
query's text is the user's: it is never logged (its variants are counted only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from services.common.document_limits import FILTER_VALUE_CHARS
from services.common.logging import get_logger
from services.common.search_contract import Filters
from services.retrieval.search import SearchQuery, SearchResult

log = get_logger("visior.retrieval.search")

MAX_FILTER_VALUES = 20
"""A list filter (doc_ids, section_ids, tags) is logged up to this many values."""
MAX_FILTER_VALUE_CHARS = max(FILTER_VALUE_CHARS.values())
"""A filter value is logged up to this many characters, then "…": the longest any filter
accepts (a section id has no bound of its own)."""


class _Plan(Protocol):
    """What the engine's plan tells: read only."""

    @property
    def q(self) -> SearchQuery: ...
    @property
    def tenant_id(self) -> str: ...
    @property
    def max_results(self) -> int: ...
    @property
    def mode(self) -> str: ...
    @property
    def ranking(self) -> str: ...
    @property
    def variants(self) -> tuple[str, ...]: ...
    @property
    def variants_source(self) -> str: ...
    @property
    def language(self) -> str: ...


@dataclass
class SearchTiming:
    """What one search's stages took and produced, filled in by the engine as it runs."""

    embed_ms: float = 0.0
    engine_ms: float = 0.0
    rerank_ms: float = 0.0
    doc_candidates: int | None = None
    """None when the search had no document stage."""
    section_candidates: int = 0
    chunk_candidates: int = 0
    rerank_candidates: int | None = None
    """None when nothing was reranked."""
    replacements: int = 0
    """The searched tenant's count of replaced documents as the index was asked
    (`DocumentStore.replacements`)."""
    dropped: int = 0
    """Candidates left out for not being in the store, or not in that generation."""
    stale: bool = False
    """Candidates were dropped and a document of the tenant was replaced after the index was
    asked: the replaced generation's candidates went and the new one's were not ranked."""
    retried: bool = False
    """This is the search run once more after a stale one."""


def count_candidates(timing: SearchTiming, chunks: Sequence[tuple[Any, float]]) -> None:
    """The chunk stage's candidates and the sections they fall in (points with
    doc_id and section_id), recorded on `timing`."""
    timing.chunk_candidates = len(chunks)
    timing.section_candidates = len({(h.doc_id, h.section_id) for h, _ in chunks})


def filters_logged(filters: Filters) -> dict[str, Any]:
    """The filters the caller set (empty ones left out); lists cut to MAX_FILTER_VALUES,
    values to MAX_FILTER_VALUE_CHARS."""
    out: dict[str, Any] = {}
    for name in ("product", "version", "source"):
        value = getattr(filters, name)
        if value:
            out[name] = _cut(value)
    for name in ("tags", "doc_ids", "section_ids"):
        values = getattr(filters, name)
        if values:
            out[name] = [_cut(v) for v in values[:MAX_FILTER_VALUES]]
            if len(values) > MAX_FILTER_VALUES:
                out[f"{name}_count"] = len(values)
    return out


def _cut(value: str) -> str:
    if len(value) <= MAX_FILTER_VALUE_CHARS:
        return value
    return value[:MAX_FILTER_VALUE_CHARS] + "…"


def log_search(plan: _Plan, result: SearchResult, timing: SearchTiming, slow_ms: float) -> None:
    """The search's line; WARNING when it took more than `slow_ms` (0: never)."""
    slow = 0 < slow_ms < result.elapsed_ms
    fields: dict[str, Any] = {
        "tenant_id": plan.q.tenant_id,
        "searched_tenant": plan.tenant_id,
        "max_results": plan.max_results,
        "filters": filters_logged(plan.q.filters),
        "mode": plan.mode,
        "ranking": plan.ranking,
        "hits_count": len(result.hits),
        "backend": result.backend,
        "doc_candidates": timing.doc_candidates,
        "section_candidates": timing.section_candidates,
        "chunk_candidates": timing.chunk_candidates,
        "rerank_candidates": timing.rerank_candidates,
        "docs_count": len(result.docs),
        "sections_count": len(result.sections),
        "context_chunks": len(result.chunks),
        "rerank_used": result.rerank_used,
        "query_variants": len(plan.variants),
        "query_variants_source": plan.variants_source,
        "latency_ms": result.elapsed_ms,
        "embed_ms": round(timing.embed_ms, 3),
        "engine_ms": round(timing.engine_ms, 3),
        "rerank_ms": round(timing.rerank_ms, 3),
        "retried": timing.retried,
    }
    if slow:
        log.warning("search", slow=True, slow_search_ms=slow_ms, **fields)
    else:
        log.info("search", **fields)
    if plan.variants:
        # agent.md §9's event: the search ran extra phrasings of the query (their count and
        # where they came from: the synonym table or the model), never their text.
        log.info(
            "query_expansion",
            tenant_id=plan.q.tenant_id,
            variants=len(plan.variants),
            source=plan.variants_source,
            language=plan.language,
        )
