"""Mock mode (retrieval-v1 §5): stable hits from a fixed list, no index, no store."""

from __future__ import annotations

from services.retrieval.search import (
    ChunkHit,
    DocHit,
    SearchDefaults,
    SearchQuery,
    SearchResult,
    SectionHit,
    validate,
)

_FIXED = (
    ChunkHit("doc_1", "sec_intro", "chunk_1", "Orion X is configured through the admin console.",
             10, 1, 2, 0.92),
    ChunkHit("doc_1", "sec_ldap", "chunk_2", "LDAP integration is set up under Settings > Auth.",
             11, 6, 7, 0.81),
)  # fmt: skip


class MockSearchEngine:
    """Answers every valid query with the same hits, as the spec's mock mode does."""

    def __init__(self, defaults: SearchDefaults) -> None:
        self._defaults = defaults

    async def search(self, q: SearchQuery) -> SearchResult:
        validate(q, self._defaults)
        hits = list(_FIXED[: q.max_results or self._defaults.max_results])
        return SearchResult(
            hits=hits,
            chunks=hits,
            docs=[DocHit("doc_1", "Orion X guide", 0.92)],
            sections=[
                SectionHit(
                    h.section_id,
                    h.doc_id,
                    h.section_id,
                    h.text,
                    h.page_start,
                    h.page_end,
                    h.chunk_id,
                    h.score,
                )
                for h in hits
            ],
            mode=q.mode or self._defaults.mode,
            hybrid_used=False,
            rerank_used=False,
            elapsed_ms=0,
            backend="mock",
        )
