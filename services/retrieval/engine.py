"""The multi-stage search: query processing, doc -> section -> chunk retrieval, fusion, rerank,
token-aware context (retrieval.md §5, docs/architecture.md §5-6).

Every index call goes through `_Guarded` (retries on IndexUnavailableError, a circuit
breaker); every filter is made by `IndexFilter`, which refuses an empty tenant.

Index queries return point ids and scores only. The candidates' fields (`StoredPoint`: what
fusion and shaping need) come from the document store's list of each committed document's
points, read by id under the request's tenant, so a point of an uncommitted or replaced
generation is never shown; the text of the few that survive is read from the store in one
more query, by their generation, so a re-ingest that commits in between never lends them
its texts.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import takewhile
from typing import Any, Protocol, TypeVar

import numpy as np

from services.common import errors
from services.common.breaker import CircuitBreaker, CircuitOpenError
from services.common.outcomes import INTERNAL, OK, outcome_of
from services.common.search_contract import KB_SOURCE, KB_TENANT, normalise_query
from services.common.tokenizer import Tokenizer
from services.docstore.fields import filter_tags, filter_text
from services.docstore.model import StoredPoint
from services.retrieval.context_builder import ContextOptions, build_context
from services.retrieval.embeddings import Embedder, EmbeddingBackendError, ScopedQueryEmbedder
from services.retrieval.fusion import (
    FUSIONS,
    add_exact_matches,
    impute_cross_language,
    rrf_fusion,
    weighted_fusion,
)
from services.retrieval.index.base import (
    IndexFilter,
    IndexUnavailableError,
    PointId,
    RankQuery,
)
from services.retrieval.index.qdrant_common import VectorIndex
from services.retrieval.query import (
    QueryExpander,
    SynonymTable,
    detect_language,
    exact_terms,
    expand_query,
    passage_language,
)
from services.retrieval.rerank import Reranker
from services.retrieval.search import (
    PARAM_LIMITS,
    ChunkHit,
    DocHit,
    SearchDefaults,
    SearchQuery,
    SearchResult,
    SectionHit,
    validate,
)
from services.retrieval.search_log import SearchTiming, count_candidates, log_search
from services.retrieval.sections import DocSections, SectionCatalog

log = logging.getLogger("visior.retrieval.engine")

T = TypeVar("T")
Key = tuple[str, str]  # (doc_id, chunk_id | section_id | "")
TextKey = tuple[str, str, str]
"""(doc_id, chunk_id, generation): what a candidate chunk's text is read by."""
Scored = tuple[StoredPoint, float]
"""A candidate and its score in the ranking at hand."""

RANKINGS = ("hybrid", "dense", "sparse")
CHUNK_LANGUAGES_CACHED = 200_000
"""Chunk languages the engine keeps (point id -> language, ~100 bytes each)."""
EXACT_WEIGHT = 0.5
"""Weight of the BM25 list of a query's exact terms alone (`query.exact_terms`: its
abbreviations, a Russian query's Latin words), next to dense 0.7 + BM25 0.3."""
DEEPER = 4
"""How much deeper the chunk stage fetches again when the caps leave the answer short
(`RetrievalEngine._deepening`)."""
MAX_CHUNK_DEPTH = 2 * PARAM_LIMITS["max_chunks"]
"""Chunk candidates (x candidate_factor per list) fetched again at most: as deep as
chunk_priority's first look with the largest max_chunks."""
Ranking = tuple[list[tuple[PointId, float]], bool]
"""A level's fused ranking, and whether the index may hold more candidates past it that
score at least min_score (one of its lists came back full, its last candidate scores so)."""


class BackendUnavailableError(errors.BackendUnavailableError):
    """The vector store cannot be reached (retrieval.md §7.2); 502 through Envoy."""


_Started = SearchResult | tuple[list[Scored], dict[TextKey, str]] | errors.BackendUnavailableError
"""What a search's first worker hop answers (`RetrievalEngine._start`): a backend outage
only when RETR_EMPTY_ON_BACKEND_ERROR answers it with an empty result."""


class ChunkText(Protocol):
    """A stored chunk; only its text is read here."""

    @property
    def text(self) -> str: ...


class ChunkStore(Protocol):
    """Where candidates' fields and hit texts come from: the document store
    (services/docstore/sqlite_store.py)."""

    def points_by_ids(
        self, tenant_id: str, point_ids: Collection[PointId]
    ) -> Mapping[PointId, StoredPoint]: ...

    def chunks_by_ids(self, tenant_id: str, keys: Sequence[TextKey]) -> Mapping[TextKey, ChunkText]:
        """The chunks among `keys` the store holds in that generation of their document."""
        ...

    def replacements(self, tenant_id: str) -> int:
        """How many times a document of the tenant has been replaced."""
        ...


class SearchMetrics(Protocol):
    """What the engine reports (services/retrieval/metrics.py implements it)."""

    def observe(self, result: SearchResult) -> None: ...

    def failed(self, reason: str) -> None: ...

    def finished(self, outcome: str) -> None: ...


@dataclass(frozen=True)
class EngineSettings:
    """How searches rank (RETR_* / retrieval.md §8)."""

    enable_hybrid: bool = True
    """Dense + BM25 when the request does not say (ENABLE_HYBRID)."""
    enable_rerank: bool = False
    """Rerank when the request does not say and a reranker is configured (ENABLE_RERANK)."""
    fusion: str = "weighted"
    """Default hybrid fusion: "weighted" (normalised lists, weighted) or "rrf" (RETR_FUSION)."""
    dense_weight: float = 0.7
    """Weight of the normalised dense list (RETR_DENSE_WEIGHT)."""
    sparse_weight: float = 0.3
    """Weight of the normalised BM25 list (RETR_SPARSE_WEIGHT)."""
    rrf_k: int = 60
    """RRF's k."""
    candidate_factor: int = 2
    """Candidates fetched per list = factor x what the stage keeps."""
    rerank_candidates: int = 40
    """Chunks sent to the reranker (RERANK_MAX_CANDIDATES)."""
    expand_query: bool = False
    """Search synonym variants too when the request does not say (RETR_EXPAND_QUERY)."""
    max_query_variants: int = 3
    """Variants searched besides the query."""
    retries: int = 2
    """Retries of a failed index call, at most 2 (retrieval.md §7.2)."""
    empty_on_backend_error: bool = False
    """Answer a search an empty result instead of 502 when a backend it needs is down: the
    vector store, the embedding backend or the document store (RETR_EMPTY_ON_BACKEND_ERROR)."""
    cross_language: bool = True
    """Hybrid: a dense candidate written in the other language than a ru/en query gets its
    keyword evidence from its dense score (fusion.impute_cross_language; RETR_CROSS_LANGUAGE)."""
    slow_search_ms: float = 300.0
    """A search's log line is a WARNING above this many ms; 0: never."""


class _Guarded:
    """An index behind retries and a circuit breaker; raises BackendUnavailableError."""

    def __init__(self, index: VectorIndex, breaker: CircuitBreaker, retries: int) -> None:
        self.index = index
        self._breaker = breaker
        self._retries = retries

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        last: Exception | None = None
        for _attempt in range(1 + self._retries):
            try:
                with self._breaker.trial():
                    return fn(*args)
            except CircuitOpenError as exc:
                raise BackendUnavailableError(
                    str(exc), metadata={"backend": self.index.backend}
                ) from None
            except IndexUnavailableError as exc:
                last = exc
        raise BackendUnavailableError(
            f"the vector store is unavailable: {last}", metadata={"backend": self.index.backend}
        )


@dataclass(frozen=True)
class RequestLimits:
    """A request's caps with the server defaults applied: what shaping reads
    (`select_chunks`, `sections_and_docs`, `context_chunks`; mock mode shapes its fixed
    list with them too)."""

    max_results: int
    max_docs: int
    max_sections: int
    max_chunks: int
    token_limit: int
    topk_per_doc: int
    min_score: float
    hard_trim: bool


def request_limits(q: SearchQuery, d: SearchDefaults) -> RequestLimits:
    """The caps of a validated request (`check_request`), each default applied."""
    return RequestLimits(
        max_results=q.max_results or d.max_results,
        max_docs=q.max_docs or d.max_docs,
        max_sections=q.max_sections or d.max_sections,
        max_chunks=q.max_chunks or d.max_chunks,
        token_limit=q.context_token_limit or d.context_token_limit,
        topk_per_doc=q.topk_per_doc if q.topk_per_doc is not None else d.topk_per_doc,
        min_score=q.min_score if q.min_score is not None else d.min_score,
        hard_trim=bool(q.hard_trim),
    )


def check_request(q: SearchQuery, d: SearchDefaults) -> None:
    """`search.validate` and the ranking and fusion names: INVALID_ARGUMENT / LIMIT_EXCEEDED
    for a request every search (the engine's, mock mode's) refuses."""
    validate(q, d)
    if q.ranking and q.ranking not in RANKINGS:
        raise errors.InvalidArgumentError(
            f"params.ranking must be one of {', '.join(RANKINGS)}",
            metadata={"field": "params.ranking"},
        )
    if q.fusion and q.fusion not in FUSIONS:
        raise errors.InvalidArgumentError(
            f"params.fusion must be one of {', '.join(FUSIONS)}",
            metadata={"field": "params.fusion"},
        )


@dataclass(frozen=True)
class _Plan(RequestLimits):
    """A validated request with every default applied."""

    q: SearchQuery
    tenant_id: str
    """The tenant searched: the caller's (q.tenant_id), or the knowledge base's."""
    text: str
    language: str
    variants: tuple[str, ...]
    variants_source: str
    """"synonyms" or "llm" when `variants` came from there; "" when there are none."""
    expand: bool
    """Expansion is on for this request and ranking reads BM25 (variants are searched)."""
    mode: str
    ranking: str
    fusion: str
    rerank: bool
    base_filter: IndexFilter
    exact_terms: tuple[str, ...] = ()
    """The query's exact terms (`query.exact_terms`: abbreviations, a Russian query's Latin
    words): the BM25 list of them alone joins the weighted fusion (docs/architecture.md §6)."""


class RetrievalEngine:
    """Runs searches: planning, embedding, index work and shaping in one worker thread per
    request.

    With rerank the request makes three hops (plan and retrieve in a thread, rerank on the
    loop, shape in a thread); without, one. A model query expander adds one in front: the
    plan in a thread, the model's variants on the loop.
    """

    def __init__(
        self,
        *,
        index: VectorIndex,
        embedder: Embedder,
        sections: SectionCatalog,
        chunks: ChunkStore,
        tokenizer: Tokenizer,
        defaults: SearchDefaults,
        settings: EngineSettings,
        breaker: CircuitBreaker,
        reranker: Reranker | None = None,
        synonyms: SynonymTable | None = None,
        expander: QueryExpander | None = None,
        metrics: SearchMetrics | None = None,
    ) -> None:
        self._index = _Guarded(index, breaker, min(2, max(0, settings.retries)))
        self._embedder = embedder
        # Its query cache kept apart per caller's tenant (CachedQueryEmbedder), looked up once.
        self._scoped = embedder if isinstance(embedder, ScopedQueryEmbedder) else None
        self._sections = sections
        self._chunks = chunks
        self._tokenizer = tokenizer
        self._defaults = defaults
        self._settings = settings
        self._reranker = reranker
        self._synonyms = synonyms
        # Model-written variants (llm_assist.LlmQueryExpander); the synonyms are its fallback.
        self._expander = expander
        self._metrics = metrics
        # Chunk languages by point id (an id names one generation's chunk, so its text never
        # changes), for impute_cross_language; bounded, oldest first out.
        self._languages: OrderedDict[PointId, str] = OrderedDict()
        self._languages_lock = threading.Lock()

    @property
    def backend(self) -> str:
        return self._index.index.backend

    async def search(self, q: SearchQuery) -> SearchResult:
        # retrieval_requests_total{outcome}: every search, whatever its outcome (ok, or the
        # error's reason, as services.common.outcomes names it), so an error rate can be read.
        failure: BaseException | None = None
        outcome = OK
        try:
            result, outcome = await self._search(q)
            return result
        except BaseException as exc:
            failure = exc
            if self._metrics is not None and isinstance(exc, Exception):
                # retrieval_errors_total{reason}: every failed search, by its error's reason.
                self._metrics.failed(
                    exc.reason if isinstance(exc, errors.ServiceError) else INTERNAL
                )
            raise
        finally:
            if self._metrics is not None:
                self._metrics.finished(outcome if failure is None else outcome_of(failure))

    async def _search(self, q: SearchQuery) -> tuple[SearchResult, str]:
        """The search and its outcome: `ok`, or the outage's reason when a backend being down
        was answered with an empty result (RETR_EMPTY_ON_BACKEND_ERROR)."""
        started = time.perf_counter()
        timing = SearchTiming()
        # Planning normalises the query and looks its words up in the synonym table (tens of
        # ms for a long query): never on the event loop. It shares the search's first hop
        # unless the model writes variants in between.
        if self._expander is None:
            plan, first = await asyncio.to_thread(self._plan_and_start, q, timing, started)
        else:
            plan = await asyncio.to_thread(self._plan, q)
            if plan.expand:
                plan = await self._model_variants(plan, self._expander)
            first = await asyncio.to_thread(self._start, plan, timing, started)
        result, outcome = await self._finish(plan, first, timing, started)
        if timing.stale:
            # A re-ingest committed between the index's answer and the store's: the replaced
            # generation's candidates were dropped and the new one's were never ranked, so
            # its document could be missing. Once more, with the new generation committed
            # (docs/architecture.md §4).
            timing = SearchTiming(retried=True)
            first = await asyncio.to_thread(self._start, plan, timing, started)
            result, outcome = await self._finish(plan, first, timing, started)
        if self._metrics is not None:
            self._metrics.observe(result)
        log_search(plan, result, timing, self._settings.slow_search_ms)
        return result, outcome

    async def _finish(
        self, plan: _Plan, first: _Started, timing: SearchTiming, started: float
    ) -> tuple[SearchResult, str]:
        """The answer from the first hop's (`_start`): reranked and shaped, or empty for a
        backend outage when RETR_EMPTY_ON_BACKEND_ERROR says so; and its outcome."""
        outcome = OK
        if isinstance(first, errors.BackendUnavailableError):
            result, outcome = self._empty(plan, first, timing, started), first.reason
        elif isinstance(first, SearchResult):
            result = first
        else:
            chunks, texts = first
            rerank_used = False
            if chunks:
                chunks, rerank_used = await self._rerank(plan, chunks, texts, timing)
            try:
                # Shaping reads the document store too: the texts of hits the reranker
                # moved up and the sections' titles and summaries.
                result = await asyncio.to_thread(
                    self._shape, plan, chunks, texts, rerank_used, timing, started
                )
            except errors.BackendUnavailableError as exc:
                if not self._settings.empty_on_backend_error:
                    raise  # counted by search()
                result, outcome = self._empty(plan, exc, timing, started), exc.reason
        return result, outcome

    def _empty(
        self,
        plan: _Plan,
        outage: errors.BackendUnavailableError,
        timing: SearchTiming,
        started: float,
    ) -> SearchResult:
        """RETR_EMPTY_ON_BACKEND_ERROR's answer to a backend outage (retrieval.md §7.2): no
        chunks, the Orchestrator decides the fallback. Counted as a failure and logged."""
        if self._metrics is not None:
            self._metrics.failed(outage.reason)
        log.warning(
            "backend down; answering empty (RETR_EMPTY_ON_BACKEND_ERROR)",
            extra={"backend": _outage_backend(outage), "error": outage.message},
            exc_info=outage,
        )
        # No search to run again: what was dropped before the outage is no stale answer, and
        # the store may be what is down (`_shape` would read it for `stale`).
        timing.dropped = 0
        return self._shape(plan, [], {}, False, timing, started)

    def _plan_and_start(
        self, q: SearchQuery, timing: SearchTiming, started: float
    ) -> tuple[_Plan, _Started]:
        plan = self._plan(q)
        return plan, self._start(plan, timing, started)

    def _start(self, plan: _Plan, timing: SearchTiming, started: float) -> _Started:
        """The search's first hop (worker thread): all of it without rerank; with rerank, the
        candidates and the texts the reranker reads. A backend being down (the vector store,
        the embedding backend, the document store: every errors.BackendUnavailableError) is
        returned when RETR_EMPTY_ON_BACKEND_ERROR answers it with an empty result, raised
        otherwise."""
        try:
            if plan.rerank:
                return self._find(plan, timing)
            return self._search_sync(plan, timing, started)
        except errors.BackendUnavailableError as exc:
            if not self._settings.empty_on_backend_error:
                raise  # counted by search()
            return exc

    def _search_sync(self, plan: _Plan, timing: SearchTiming, started: float) -> SearchResult:
        """A search without rerank, start to end in the worker thread."""
        chunks = self._retrieve(plan, self._embed(plan, timing), timing)
        count_candidates(timing, chunks)
        return self._shape(plan, chunks, {}, False, timing, started)

    def _find(self, plan: _Plan, timing: SearchTiming) -> tuple[list[Scored], dict[TextKey, str]]:
        """Candidates for rerank, with the texts of the head the reranker reads."""
        chunks = self._retrieve(plan, self._embed(plan, timing), timing)
        count_candidates(timing, chunks)
        texts = self._texts(plan, chunks[: self._settings.rerank_candidates], {}, timing)
        head = [hs for hs in chunks[: self._settings.rerank_candidates] if _key(hs[0]) in texts]
        return head + chunks[self._settings.rerank_candidates :], texts

    # -- planning ---------------------------------------------------------------------------

    def _plan(self, q: SearchQuery) -> _Plan:
        d, s = self._defaults, self._settings
        check_request(q, d)
        text = normalise_query(q.query)  # not empty: validate() refuses such a query
        language = detect_language(text, q.language)  # a hint as its primary subtag; auto detects
        mode = q.mode or d.mode
        hybrid = q.enable_hybrid if q.enable_hybrid is not None else s.enable_hybrid
        ranking = q.ranking or ("hybrid" if hybrid else "dense")
        if mode == "hybrid_only":
            ranking = "hybrid"
        rerank = q.enable_rerank if q.enable_rerank is not None else s.enable_rerank
        rerank = rerank and self._reranker is not None and mode != "hybrid_only"
        expand = q.expand_query if q.expand_query is not None else s.expand_query
        expand = expand and ranking != "dense" and s.max_query_variants > 0
        variants: tuple[str, ...] = ()
        if expand and self._synonyms is not None:
            # expand_query counts the query among its variants.
            found = expand_query(text, language, self._synonyms, s.max_query_variants + 1)
            variants = tuple(v for v in found if v != text)
        f = q.filters
        # The knowledge base is the one shared corpus (docs/architecture.md §15): asked for by source, read
        # under its reserved tenant, never mixed into the caller's own documents.
        tenant = KB_TENANT if f.source == KB_SOURCE else q.tenant_id
        base = IndexFilter(
            tenant_id=tenant,
            doc_ids=f.doc_ids,
            section_ids=f.section_ids,
            product=filter_text(f.product),
            version=filter_text(f.version),
            tags=filter_tags(f.tags),
            source=f.source,
        )
        limits = request_limits(q, d)
        return _Plan(
            **vars(limits),
            q=q,
            tenant_id=tenant,
            text=text,
            language=language,
            variants=variants,
            variants_source="synonyms" if variants else "",
            expand=expand,
            mode=mode,
            ranking=ranking,
            fusion=q.fusion or s.fusion,
            rerank=rerank,
            base_filter=base,
            exact_terms=exact_terms(q.query),
        )

    async def _model_variants(self, plan: _Plan, expander: QueryExpander) -> _Plan:
        """`plan` with the model's variants when it gave any; else as it is (synonyms or none).
        The expander keeps its own (tight) timeout and does not raise; this is a backstop."""
        try:
            found = await expander.expand(
                plan.text, plan.language, self._settings.max_query_variants + 1,
                scope=plan.q.tenant_id,
            )  # fmt: skip
        except Exception as exc:
            log.warning("query expander failed; synonyms used", extra={"error": str(exc)})
            return plan
        variants = tuple(dict.fromkeys(v for v in found if v and v != plan.text))
        if not variants:
            return plan
        variants = variants[: self._settings.max_query_variants]
        return replace(plan, variants=variants, variants_source="llm")

    def _embed(self, plan: _Plan, timing: SearchTiming) -> np.ndarray | None:
        if plan.ranking == "sparse":
            return None
        t0 = time.perf_counter()
        # The caller's tenant, not the searched one: knowledge-base searches by two tenants
        # must not share cache entries either.
        if self._scoped is not None:
            matrix = self._scoped.embed_queries_in(plan.q.tenant_id, [plan.text])
        else:
            matrix = self._embedder.embed_queries([plan.text])
        timing.embed_ms = (time.perf_counter() - t0) * 1000
        return np.asarray(matrix[0], dtype=np.float32)

    # -- retrieval (worker thread) ----------------------------------------------------------

    def _retrieve(
        self, plan: _Plan, vector: np.ndarray | None, timing: SearchTiming
    ) -> list[Scored]:
        t0 = time.perf_counter()
        try:
            timing.replacements = self._chunks.replacements(plan.tenant_id)
            keep = max(plan.max_chunks, plan.max_results)
            flt = plan.base_filter
            # Sections named by the caller pick their documents: ranking documents on the query
            # first could leave those sections' documents out of the top max_docs.
            if plan.mode == "doc_first" and not flt.section_ids:
                doc_filter = replace(flt, kinds=("doc",), section_ids=())
                docs, _ = self._level(plan, vector, doc_filter, plan.max_docs, timing)
                timing.doc_candidates = len(docs)
                if not docs:
                    return []
                flt = replace(flt, doc_ids=tuple(dict.fromkeys(h.doc_id for h, _ in docs)))
            if plan.mode in ("doc_first", "section_first"):
                return self._deepening(
                    plan, lambda depth: self._section_first(plan, vector, flt, depth, timing), keep
                )
            # chunk_priority / hybrid_only: straight to chunks; chunk_priority looks deeper.
            chunk_filter = replace(flt, kinds=("chunk",))
            return self._deepening(
                plan,
                lambda depth: self._level(plan, vector, chunk_filter, depth, timing, whole=True),
                keep * (2 if plan.mode == "chunk_priority" else 1),
            )
        finally:
            timing.engine_ms = (time.perf_counter() - t0) * 1000

    def _deepening(
        self,
        plan: _Plan,
        fetch: Callable[[int], tuple[list[Scored], bool]],
        depth: int,
    ) -> list[Scored]:
        """The chunk candidates `fetch(depth)` gives; fetched again DEEPER times deeper (up to
        MAX_CHUNK_DEPTH) while the caps leave fewer than max_results of them in the answer,
        the answer has room for another section and document, and the index may hold more.

        The caps leave an answer short two ways. topk_per_doc: a document matching more
        chunks than were fetched fills every candidate and is cut to topk_per_doc, and the
        other documents that match were never fetched. max_docs / max_sections: the answer's
        documents or sections match more chunks than the other documents' candidates left
        room for in the fetch. When no cap binds, the first fetch fills the answer and there
        is no second index call; an answer at max_docs or max_sections whose documents are
        all at topk_per_doc is what the caller asked for (`_may_grow`). A deeper fetch
        normalises longer lists, so its candidates replace the first ones only when the caps
        keep more of them."""
        chunks, more = fetch(depth)
        kept = select_chunks(plan, chunks)
        while len(kept) < plan.max_results and more and depth < MAX_CHUNK_DEPTH:
            if not _may_grow(plan, kept):
                break
            depth = min(depth * DEEPER, MAX_CHUNK_DEPTH)
            deeper, more = fetch(depth)
            found = select_chunks(plan, deeper)
            if len(found) > len(kept):
                chunks, kept = deeper, found
        return chunks

    def _section_first(
        self,
        plan: _Plan,
        vector: np.ndarray | None,
        flt: IndexFilter,
        depth: int,
        timing: SearchTiming,
    ) -> tuple[list[Scored], bool]:
        """Every fetched chunk candidate (`depth` x candidate_factor per list) inside the
        max_sections shortlisted sections, and whether the chunk ranking may hold more.

        Sections are ranked by their own summary/text match fused with their best chunk's
        match, so a section whose summary misses the query but whose text answers it still
        makes the shortlist (`shortlist_sections`). The answer is the chunk ranking's
        committed chunks inside the shortlisted sections, all of them, for `select_chunks` to
        apply topk_per_doc and max_docs to. Both levels' lists come from one batched index
        call and are read from the document store in one query, whole: the section list is
        normalised over what was fetched, not over the max_sections it is cut to."""
        (section_rank, _), (chunk_rank, more) = self._rank(
            plan,
            vector,
            [(replace(flt, kinds=("section",)), plan.max_sections),
             (replace(flt, kinds=("chunk",)), depth)],
        )  # fmt: skip
        sections, chunks = self._resolve(
            plan.tenant_id,
            [(section_rank, len(section_rank)), (chunk_rank, len(chunk_rank))],
            timing,
        )
        allowed = shortlist_sections(plan, sections, chunks)
        return [(h, s) for h, s in chunks if (h.doc_id, h.section_id) in allowed], more

    def _level(
        self,
        plan: _Plan,
        vector: np.ndarray | None,
        flt: IndexFilter,
        limit: int,
        timing: SearchTiming,
        *,
        whole: bool = False,
    ) -> tuple[list[Scored], bool]:
        """One level's candidates: dense and/or BM25 lists `limit` x candidate_factor deep,
        fused, committed points only; the first `limit`, or with `whole` every one fetched
        (chunks: `select_chunks` fills the answer from them, past a document that would
        take every one of the first `limit` places and be cut to topk_per_doc); and whether
        the index may hold more."""
        ranking, more = self._rank(plan, vector, [(flt, limit)])[0]
        keep = len(ranking) if whole else limit
        return self._resolve(plan.tenant_id, [(ranking, keep)], timing)[0], more

    def _rank(
        self,
        plan: _Plan,
        vector: np.ndarray | None,
        levels: Sequence[tuple[IndexFilter, int]],
    ) -> list[Ranking]:
        """Each (filter, limit) level's ranking: its dense and/or BM25 lists (by point id, no
        payload) fused, and whether the index may hold more (`Ranking`); every level's lists
        from one batched index call."""
        factor = self._settings.candidate_factor
        inside_text = plan.text
        exact = plan.exact_terms
        if plan.ranking in ("sparse", "hybrid"):
            # Words naming one of the tenant's documents say which, not what in it
            # (docs/architecture.md §6): gone from the keyword query of sections and chunks,
            # kept for documents (doc_first's first level), which they do name. The dense
            # query keeps them; no title word is an exact term.
            titles = self._sections.title_index(plan.tenant_id)
            inside_text = titles.without_titles(plan.text)
            exact = tuple(t for t in exact if not titles.names(t))
        named: list[list[tuple[str, RankQuery]]] = []
        for flt, limit in levels:
            depth = max(limit, 1) * factor
            lists: list[tuple[str, RankQuery]] = []
            if plan.ranking in ("dense", "hybrid") and vector is not None:
                lists.append(("dense", RankQuery(flt, depth, vector=vector)))
            if plan.ranking in ("sparse", "hybrid"):
                keyword_text = plan.text if flt.kinds == ("doc",) else inside_text
                lists.append(("sparse", RankQuery(flt, depth, text=keyword_text)))
                for i, variant in enumerate(plan.variants):
                    lists.append((f"variant{i}", RankQuery(flt, depth, text=variant)))
                if exact and plan.ranking == "hybrid" and plan.fusion == "weighted":
                    # Only the weighted fusion reads it (_level): no index query for nothing.
                    text = " ".join(exact)
                    lists.append(("exact", RankQuery(flt, depth, text=text)))
            named.append(lists)
        queries = [q for lists in named for _, q in lists]
        index = self._index
        found = iter(index.call(index.index.search_ids_batch, queries) if queries else [])
        results = [{name: next(found) for name, _ in lists} for lists in named]
        languages: Mapping[PointId, str] = {}
        if (
            self._settings.cross_language
            and plan.ranking == "hybrid"
            and plan.language
            in (
                "ru",
                "en",
            )
        ):
            languages = self._chunk_languages(
                plan.tenant_id, {k for r in results for k, _ in r.get("dense", ())}
            )
        out: list[Ranking] = []
        for r, lists in zip(results, named, strict=True):
            fused = self._fuse(plan, r, languages)
            full = any(len(r[name]) >= q.limit for name, q in lists)
            out.append((fused, full and bool(fused) and fused[-1][1] >= plan.min_score))
        return out

    def _chunk_languages(self, tenant_id: str, ids: Collection[PointId]) -> dict[PointId, str]:
        """passage_language of the chunks among `ids`; two store reads for the ids not cached.

        Section and document points are cached as "" (no language: not imputed), so they are
        not read again; a point the store does not list (yet), or a chunk whose text is gone
        from its generation, is left out and not cached."""
        cache = self._languages
        missing = [i for i in ids if i not in cache]
        found: dict[PointId, str] = {}
        if missing:
            points = self._chunks.points_by_ids(tenant_id, missing)
            keys = {_key(p): i for i, p in points.items() if p.kind == "chunk"}
            found = {i: "" for i, p in points.items() if p.kind != "chunk"}
            if keys:
                texts = self._chunks.chunks_by_ids(tenant_id, list(keys))
                found.update((keys[k], passage_language(c.text)) for k, c in texts.items())
            with self._languages_lock:
                cache.update(found)
                for _ in range(len(cache) - CHUNK_LANGUAGES_CACHED):
                    cache.popitem(last=False)
        return {i: lang for i in ids if (lang := found.get(i) or cache.get(i))}

    def _resolve(
        self,
        tenant_id: str,
        rankings: list[tuple[list[tuple[PointId, float]], int]],
        timing: SearchTiming,
    ) -> list[list[Scored]]:
        """For each (fused ranking, limit): its first `limit` candidates the document store
        lists under the tenant, fields read from it.

        Usually one read for all rankings; a point the store does not list (of an ingest
        in flight or interrupted, of a generation replaced or deleted since it was ranked)
        is skipped, counted in `timing.dropped`, and the next batch read. Such points still
        took part in their lists' normalisation, which only shifts scores while an ingest is
        unfinished.
        """
        points_by_ids = self._chunks.points_by_ids
        outs: list[list[Scored]] = [[] for _ in rankings]
        starts = [0] * len(rankings)
        while True:
            parts = []
            for n, (fused, limit) in enumerate(rankings):
                part = fused[starts[n] : starts[n] + limit - len(outs[n])]
                starts[n] += len(part)
                parts.append(part)
            ids = {k for part in parts for k, _ in part}
            if not ids:
                return outs
            found = points_by_ids(tenant_id, ids)
            timing.dropped += len(ids) - len(found)
            for out, part in zip(outs, parts, strict=True):
                out.extend((p, score) for key, score in part if (p := found.get(key)) is not None)

    def _texts(
        self,
        plan: _Plan,
        items: Sequence[Scored],
        have: dict[TextKey, str],
        timing: SearchTiming,
    ) -> dict[TextKey, str]:
        """`have` plus the texts of `items` it lacks: one document-store query, tenant-scoped,
        each text of its candidate's generation.

        A chunk the store no longer has in that generation (its document re-ingested or
        deleted since the visibility check) gets no text, and the caller drops it (counted
        in `timing.dropped`).
        """
        missing = [_key(h) for h, _ in items if _key(h) not in have]
        if missing:
            found = self._chunks.chunks_by_ids(plan.tenant_id, missing)
            timing.dropped += len(set(missing)) - len(found)
            for key, chunk in found.items():
                have[key] = chunk.text
        return have

    def _fuse(
        self,
        plan: _Plan,
        lists: dict[str, list[tuple[PointId, float]]],
        languages: Mapping[PointId, str] | None = None,
    ) -> list[tuple[PointId, float]]:
        s = self._settings
        if plan.ranking == "dense":
            # Cosine similarity, clipped to [0, 1] so min_score reads the same everywhere.
            return [(k, max(0.0, min(1.0, v))) for k, v in lists.get("dense", [])]
        exact = lists.get("exact", [])
        sparse_lists = {n: v for n, v in lists.items() if n not in ("dense", "exact")}
        if len(sparse_lists) > 1:
            # Query variants (expansion) merge with RRF into one BM25 list.
            merged = rrf_fusion({n: [k for k, _ in v] for n, v in sparse_lists.items()}, k=s.rrf_k)
            sparse: list[tuple[PointId, float]] = merged
        else:
            sparse = sparse_lists.get("sparse", [])
        if plan.ranking == "sparse":
            top = sparse[0][1] if sparse else 1.0
            return [(k, v / top if top > 0 else 0.0) for k, v in sparse]
        dense = lists.get("dense", [])
        if languages:
            sparse = impute_cross_language(dense, sparse, languages, plan.language)
        if plan.fusion == "rrf":
            fused = rrf_fusion(
                {"dense": [k for k, _ in dense], "sparse": [k for k, _ in sparse]},
                k=s.rrf_k,
                weights={"dense": s.dense_weight, "sparse": s.sparse_weight},
            )
            # Scaled so that first place in both lists scores 1.
            best = (s.dense_weight + s.sparse_weight) / (s.rrf_k + 1)
            return [(k, min(1.0, v / best)) for k, v in fused]
        fused = weighted_fusion(
            {"dense": dense, "sparse": sparse},
            {"dense": s.dense_weight, "sparse": s.sparse_weight},
        )
        total = s.dense_weight + s.sparse_weight
        if total != 1.0:
            # Scaled so that first place in both lists scores 1, as with RRF: min_score,
            # add_exact_matches and the rerank scaling read scores in [0, 1].
            fused = [(k, v / total) for k, v in fused]
        if exact:
            # The embedding reads an unknown abbreviation as noise, and a borrowed word as a
            # small part of a sentence; BM25 matches either exactly.
            fused = add_exact_matches(fused, exact, EXACT_WEIGHT)
        return fused

    # -- rerank -----------------------------------------------------------------------------

    async def _rerank(
        self,
        plan: _Plan,
        chunks: list[Scored],
        texts: Mapping[TextKey, str],
        timing: SearchTiming,
    ) -> tuple[list[Scored], bool]:
        assert self._reranker is not None
        # Only the leading candidates whose texts `_find` read: past a dropped one (its text
        # gone from the store) the tail moved up, and its texts were never read.
        head = list(
            takewhile(lambda hs: _key(hs[0]) in texts, chunks[: self._settings.rerank_candidates])
        )
        if not head:
            return chunks, False
        timing.rerank_candidates = len(head)
        t0 = time.perf_counter()
        try:
            order = await self._reranker.rerank(plan.text, [texts[_key(h)] for h, _ in head])
        except Exception as exc:  # the un-reranked order is a fine answer
            log.warning("rerank failed; keeping the hybrid order", extra={"error": str(exc)})
            return chunks, False
        finally:
            timing.rerank_ms = (time.perf_counter() - t0) * 1000
        seen = set()
        out = []
        for r in order:
            i, score = r.index, r.score
            if 0 <= i < len(head) and i not in seen:
                seen.add(i)
                out.append((head[i][0], max(0.0, min(1.0, float(score)))))
        rest = [head[i] for i in range(len(head)) if i not in seen] + chunks[len(head) :]
        if out:
            # What the reranker did not score (past its top_n, its max_candidates or
            # rerank_candidates) keeps its order after all it did: hybrid scores are on another
            # scale, and sorted with the cross-encoder's they would interleave. Scaled under
            # the lowest reranked score, they keep their order and stay within [0, 1].
            under = min(score for _, score in out) * 0.999
            rest = [(h, score * under) for h, score in rest]
        return out + rest, True

    # -- shaping (worker thread) ------------------------------------------------------------

    def _shape(
        self,
        plan: _Plan,
        chunks: list[Scored],
        texts: dict[TextKey, str],
        rerank_used: bool,
        timing: SearchTiming,
        started: float,
    ) -> SearchResult:
        head, texts = self._with_texts(plan, select_chunks(plan, chunks), texts, timing)
        if timing.dropped and not timing.retried:
            # Dropped candidates are usually an ingest's uncommitted points: only a replace
            # committed since the index was asked makes the answer stale (`_search`).
            timing.stale = self._chunks.replacements(plan.tenant_id) != timing.replacements
        kept = [chunk_hit(h, texts[_key(h)], score) for h, score in head]
        # The head's, not the whole selection's: the candidates past it (fetched
        # candidate_factor deep) contribute no hit and no context chunk.
        sections, docs = sections_and_docs(
            plan, head, lambda doc_id: self._sections.document(plan.tenant_id, doc_id)
        )
        return SearchResult(
            hits=kept[: plan.max_results],
            chunks=context_chunks(plan, kept, self._tokenizer),
            docs=docs,
            sections=sections,
            mode=plan.mode,
            hybrid_used=plan.ranking == "hybrid",
            rerank_used=rerank_used,
            elapsed_ms=round((time.perf_counter() - started) * 1000),
            backend=self.backend,
            language=plan.language,
            query_variants=plan.variants,
            query_variants_source=plan.variants_source,
            query_embedding_ms=round(timing.embed_ms, 3),
            engine_ms=round(timing.engine_ms, 3),
            rerank_ms=round(timing.rerank_ms, 3),
        )

    def _with_texts(
        self, plan: _Plan, selected: list[Scored], texts: dict[TextKey, str], timing: SearchTiming
    ) -> tuple[list[Scored], dict[TextKey, str]]:
        """The head of the selection without chunks whose text is gone (what the response
        carries: hits, context candidates, the sections and documents they are in) and the
        texts of that head.

        A chunk dropped lets the next one into the head, whose text is read in turn: one
        store query when every text is there, one more per round that finds some gone."""
        size = max(plan.max_results, plan.max_chunks)
        t0 = time.perf_counter()
        while True:
            head = selected[:size]
            # By key, not by count: `texts` may hold texts of candidates select_chunks dropped.
            lacking = [hs for hs in head if _key(hs[0]) not in texts]
            if not lacking:
                break
            texts = self._texts(plan, lacking, texts, timing)
            gone = {_key(h) for h, _ in lacking if _key(h) not in texts}
            if not gone:
                break
            selected = [hs for hs in selected if _key(hs[0]) not in gone]
        timing.engine_ms += (time.perf_counter() - t0) * 1000
        return head, texts


# -- shaping, shared with mock mode (services/retrieval/mock.py) ------------------------------


def _may_grow(limits: RequestLimits, kept: Sequence[Scored]) -> bool:
    """Whether more candidates could add a hit to `kept` (select_chunks' answer): a new
    document or section while neither cap is reached, else one more chunk of a kept
    document below topk_per_doc."""
    per_doc = Counter(h.doc_id for h, _ in kept)
    sections = {(h.doc_id, h.section_id) for h, _ in kept}
    if len(per_doc) < limits.max_docs and len(sections) < limits.max_sections:
        return True
    return not limits.topk_per_doc or min(per_doc.values()) < limits.topk_per_doc


def select_chunks(limits: RequestLimits, chunks: Iterable[Scored]) -> list[Scored]:
    """Best first, min_score, topk_per_doc, max_docs and max_sections applied.

    The caps hold the chunks to the documents and sections `used_docs` / `used_sections`
    can list, in every mode: chunk_priority and hybrid_only rank chunks alone, and a
    section_first shortlist of max_sections sections may span more than max_docs
    documents."""
    per_doc: dict[str, int] = {}
    sections: set[tuple[str, str]] = set()
    kept: list[Scored] = []
    for h, score in sorted(chunks, key=lambda hs: (-hs[1], hs[0].doc_id, hs[0].ord)):
        if score < limits.min_score:
            continue
        n = per_doc.get(h.doc_id, 0)
        if (n == 0 and len(per_doc) >= limits.max_docs) or (
            limits.topk_per_doc and n >= limits.topk_per_doc
        ):
            continue
        section = (h.doc_id, h.section_id)
        if section not in sections:
            if len(sections) >= limits.max_sections:
                continue
            sections.add(section)
        per_doc[h.doc_id] = n + 1
        kept.append((h, score))
    return kept


def shortlist_sections(
    limits: RequestLimits, sections: Sequence[Scored], chunks: Sequence[Scored]
) -> set[Key]:
    """The (doc_id, section_id) of the max_sections best sections: each scored by its own
    match (`sections`, section points) and its best chunk's (`chunks`, best first), both
    lists normalised, weighted 0.5 each.

    Only a section holding one of `chunks` takes a place, and at most topk_per_doc sections
    of one document: another could not contribute to the answer. Ties go to the better
    chunk, then to the one earlier in `chunks`, never to the key text as weighted_fusion's
    do: a section ranked first by its summary alone ties with the one holding the best
    chunk."""
    best: dict[Key, float] = {}
    first: dict[Key, int] = {}  # the section's best chunk's place in `chunks`
    for n, (hit, score) in enumerate(chunks):
        key = (hit.doc_id, hit.section_id)
        if key not in best or score > best[key]:
            best[key], first[key] = score, n
    fused = dict(
        weighted_fusion(
            {
                "section": [((h.doc_id, h.section_id), s) for h, s in sections],
                "chunk": sorted(best.items(), key=lambda kv: -kv[1]),
            },
            {"section": 0.5, "chunk": 0.5},
        )
    )
    order = sorted(best, key=lambda key: (-fused[key], -best[key], first[key]))
    allowed: set[Key] = set()
    per_doc: dict[str, int] = {}
    for doc_id, section_id in order:
        if len(allowed) >= limits.max_sections:
            break
        n = per_doc.get(doc_id, 0)
        if limits.topk_per_doc and n >= limits.topk_per_doc:
            continue
        per_doc[doc_id] = n + 1
        allowed.add((doc_id, section_id))
    return allowed


def chunk_hit(h: StoredPoint, text: str, score: float) -> ChunkHit:
    """A selected candidate as the response carries it."""
    return ChunkHit(
        doc_id=h.doc_id,
        section_id=h.section_id,
        chunk_id=h.chunk_id,
        text=text,
        tokens=h.tokens,
        page_start=h.page_start,
        page_end=h.page_end,
        score=round(score, 6),
        ord=h.ord,
    )


def sections_and_docs(
    limits: RequestLimits,
    selected: Sequence[Scored],
    document: Callable[[str], DocSections | None],
) -> tuple[list[SectionHit], list[DocHit]]:
    """The best sections and documents of the selection, in score order, with the titles and
    summaries `document(doc_id)` (the section catalog) gives."""
    sections: dict[tuple[str, str], SectionHit] = {}
    docs: dict[str, DocHit] = {}
    entries: dict[str, DocSections | None] = {}  # one catalog lookup per document
    for c, raw in selected:
        if len(sections) >= limits.max_sections and len(docs) >= limits.max_docs:
            break
        key = (c.doc_id, c.section_id)
        new_section = key not in sections and len(sections) < limits.max_sections
        new_doc = c.doc_id not in docs and len(docs) < limits.max_docs
        if not (new_section or new_doc):
            continue
        if c.doc_id in entries:
            entry = entries[c.doc_id]
        else:
            entry = entries[c.doc_id] = document(c.doc_id)
        if new_section:
            info = entry[1].get(c.section_id) if entry else None
            sections[key] = SectionHit(
                section_id=c.section_id,
                doc_id=c.doc_id,
                title=info.title if info else "",
                summary=info.summary if info else "",
                page_start=info.page_start if info else c.page_start,
                page_end=info.page_end if info else c.page_end,
                anchor_chunk_id=c.chunk_id,
                score=round(raw, 6),
            )
        if new_doc:
            docs[c.doc_id] = DocHit(c.doc_id, entry[0] if entry else "", round(raw, 6))
    return list(sections.values()), list(docs.values())


def context_chunks(
    limits: RequestLimits, kept: Sequence[ChunkHit], tokenizer: Tokenizer
) -> list[ChunkHit]:
    """The context blocks built from the best `limits.max_chunks` hits."""
    built = build_context(
        kept[: limits.max_chunks],
        token_limit=limits.token_limit,
        tokenizer=tokenizer,
        options=ContextOptions(hard_trim=limits.hard_trim),
    )
    return [
        ChunkHit(
            doc_id=b.doc_id,
            section_id=b.section_id,
            chunk_id=b.chunk_ids[0],
            text=b.text,
            tokens=b.tokens,
            page_start=b.page_start,
            page_end=b.page_end,
            score=round(b.score, 6),
            ord=b.ord_start,
            merged=b.chunk_ids,
            truncated=b.truncated,
        )
        for b in built.blocks
    ]


def _outage_backend(exc: errors.BackendUnavailableError) -> str:
    """What was down, for the log: the error's `backend` metadata (the index's backend,
    "docstore"), "embedder" for the embedding backend."""
    if isinstance(exc, EmbeddingBackendError):
        return "embedder"
    return exc.metadata.get("backend", "") or type(exc).__name__


def _key(h: StoredPoint) -> TextKey:
    """The (doc_id, chunk_id, generation) a chunk candidate's text is read by."""
    return (h.doc_id, h.chunk_id, h.generation)
