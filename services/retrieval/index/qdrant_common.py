"""The vector index's interface, and what both Qdrant backends (Edge in-process, server
through qdrant-client) do alike.

`VectorIndex` states the interface and holds its methods once: point building, filters,
deletes by filter, dense and BM25 searches with and without payload, batched id rankings,
generation scrolls, counts, the layout check. A backend supplies the calls in its own
client's classes (the `# --- the backend` hooks): its conditions and filter, its query and
request objects, and how a write, a batch of queries, a scroll and a count reach the engine.
Also shared: the search parameters of dense queries and the payload indexes every collection
gets.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import numpy as np

from services.retrieval.index.base import (
    DENSE_VECTOR,
    KEYWORD_FIELDS,
    KINDS,
    LAYOUT_VERSION,
    PRE_RECORD_LAYOUT,
    QUANTIZATIONS,
    SCOPE_FIELD,
    SPARSE_VECTOR,
    TENANT_FIELD,
    FieldMatch,
    IndexFilter,
    IndexHit,
    IndexLayoutError,
    IndexPoint,
    PointId,
    RankQuery,
    check_limit,
    filter_conditions,
    hit_from_payload,
    idf_corpus,
    point_payload,
    query_vector,
    validate_point,
)
from services.retrieval.index.sparse import Bm25Encoder, SparseVector, in_tenant_space

R = TypeVar("R")
Ranking = list[tuple[PointId, float]]
_SCROLL_PAGE = 2048
_SCROLL_FIELDS = ["doc_id", "generation"]
"""The payload a generation scroll reads."""


def ranking(points: Iterable[Any]) -> Ranking:
    """(id, score) of each of a backend's scored points, in order."""
    return [(p.id, p.score) for p in points]


def dense_search_params(
    search_params: Callable[..., R],
    quantization_params: Callable[..., Any],
    hnsw_ef: int | None,
    quantization: str,
) -> R:
    """A backend's SearchParams for dense queries, built with its own classes (qdrant_edge or
    qdrant_client.models): the HNSW beam, and the int8 copy searched then rescored with the
    originals, or ignored."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}")
    quant = (
        quantization_params(rescore=True)
        if quantization == "int8"
        else quantization_params(ignore=True)
    )
    return search_params(hnsw_ef=hnsw_ef, quantization=quant)


def payload_indexes(hnsw_on_filter_fields: bool) -> list[tuple[str, dict[str, Any]]]:
    """(field, keyword index options) of every payload index a collection or shard gets.

    HNSW per-value graphs on the scope (tenant + kind): every search filters on it; on the
    other fields only when asked (`hnsw_on_filter_fields`).
    """
    return [
        (SCOPE_FIELD, {"is_tenant": True}),
        (TENANT_FIELD, {"is_tenant": True, "enable_hnsw": False}),
        *((name, {"enable_hnsw": hnsw_on_filter_fields}) for name in KEYWORD_FIELDS),
    ]


def settle_layout(
    recorded: object,
    first_payloads: Callable[[], Sequence[dict[str, Any] | None]],
    where: str,
    remedy: str,
    record: Callable[[], object],
) -> None:
    """The layout check of an index being opened.

    The layout is the one the index records, or when it records none the one its first point
    shows (`first_payloads`: up to one point's payload; an index written before layouts were
    recorded is layout 1 without SCOPE_FIELD, 2 with it, and none without points). Another
    than ours raises IndexLayoutError; an index that shows none gets ours (`record`).
    """
    found = recorded
    if found is None:
        payloads = first_payloads()
        if payloads:
            found = PRE_RECORD_LAYOUT if SCOPE_FIELD in (payloads[0] or {}) else 1
    if found is not None and found != LAYOUT_VERSION:
        raise IndexLayoutError(
            f"{where} was written with index layout {found}; this version reads layout "
            f"{LAYOUT_VERSION} and would find nothing in it. {remedy}"
        )
    if found is None:
        record()


class VectorIndex(ABC):
    """A tenant-scoped hybrid (dense + BM25) index of chunks, section summaries and documents.

    Every method is synchronous (the engine calls them through asyncio.to_thread) and raises
    IndexUnavailableError when the backend cannot be reached. A subclass is one Qdrant
    client (services/retrieval/index/edge.py, server.py): it supplies the backend hooks and
    `optimize`, `health` and `close`.
    """

    backend: str
    """"qdrant-edge" | "qdrant"."""
    dim: int
    encoder: Bm25Encoder
    idf_per_tenant: bool
    _dense_params: Any

    # --- the backend ----------------------------------------------------------------------

    @abstractmethod
    def _condition(self, c: FieldMatch) -> Any:
        """The backend's condition for `c`: its one value, or any of its values."""

    @abstractmethod
    def _filter_of(self, must: list[Any], must_not: list[Any] | None) -> Any:
        """The backend's filter of these conditions."""

    @abstractmethod
    def _sparse_vector(self, v: SparseVector) -> Any:
        """`v` as the backend's sparse vector."""

    @abstractmethod
    def _nearest(self, vector: Any, using: str) -> Any:
        """The backend's nearest-neighbour query on the named vector `using`."""

    @abstractmethod
    def _idf_params(self, corpus: Any) -> Any:
        """Search parameters computing BM25 IDF over the points of the filter `corpus`."""

    @abstractmethod
    def _point(self, point_id: int, vectors: dict[str, Any], payload: dict[str, Any]) -> Any:
        """The backend's point to write."""

    @abstractmethod
    def _write_points(self, batch: list[Any]) -> None:
        """Insert or replace `batch`; durable when it returns."""

    @abstractmethod
    def _delete_where(self, filter_: Any) -> None:
        """Delete every point matching the backend filter `filter_`."""

    @abstractmethod
    def _request(
        self, query: Any, using: str, filter_: Any, limit: int, params: Any, *, payload: bool
    ) -> Any:
        """One query of a batch, with its points' payload or only their ids and scores."""

    @abstractmethod
    def _query_batch(self, requests: list[Any]) -> Sequence[Sequence[Any]]:
        """The scored points (id, score, payload when asked) of each of `requests`, best
        first, from one call, in order."""

    @abstractmethod
    def _scroll_page(
        self, filter_: Any, offset: Any, limit: int, fields: list[str]
    ) -> tuple[Sequence[Any], Any]:
        """One page of at most `limit` records with the payload `fields`, and the next offset
        (None: the last page)."""

    @abstractmethod
    def _count(self, filter_: Any | None) -> int:
        """Exact number of points matching `filter_` (None: every point)."""

    # --- queries ----------------------------------------------------------------------------

    def _filter(self, flt: IndexFilter, *, exclude: Sequence[FieldMatch] = ()) -> Any:
        """The backend's filter for `flt`: the only translation (tenant condition first, by
        filter_conditions); `exclude` are must-not conditions."""
        must = [self._condition(c) for c in filter_conditions(flt)]
        return self._filter_of(must, [self._condition(c) for c in exclude] or None)

    def _search(
        self, query: Any, using: str, filter_: Any, limit: int, params: Any
    ) -> Sequence[Any]:
        """One query's scored points (id, payload, score), best first."""
        request = self._request(query, using, filter_, limit, params, payload=True)
        return self._query_batch([request])[0]

    def _dense(self, vector: np.ndarray) -> tuple[Any, Any]:
        return self._nearest(query_vector(vector, self.dim), DENSE_VECTOR), self._dense_params

    def _sparse(self, query: str, flt: IndexFilter) -> tuple[Any, Any] | None:
        self._filter(flt)  # validate the filter even when the query has no terms
        sparse = in_tenant_space(self.encoder.embed_query(query), flt.tenant_id)
        if not sparse:
            return None
        params = self._idf_params(self._filter(idf_corpus(flt))) if self.idf_per_tenant else None
        return self._nearest(self._sparse_vector(sparse), SPARSE_VECTOR), params

    def _ranking_request(self, q: RankQuery) -> Any | None:
        """The batch request of `q`, or None when it cannot match: no searchable terms, or
        limit 0 (a bad limit or a filter without tenant raises either way)."""
        filter_ = self._filter(q.flt)
        built = self._dense(q.vector) if q.vector is not None else self._sparse(q.text, q.flt)
        if check_limit(q.limit) == 0 or built is None:
            return None
        using = DENSE_VECTOR if q.vector is not None else SPARSE_VECTOR
        return self._request(built[0], using, filter_, q.limit, built[1], payload=False)

    # --- the interface ----------------------------------------------------------------------

    @abstractmethod
    def optimize(self) -> None:
        """Build HNSW / merge segments where the backend needs it (blocking)."""

    @abstractmethod
    def health(self) -> dict[str, str]:
        """{"status": "ok"|"down", "backend": ..., ...}; never raises."""

    @abstractmethod
    def close(self) -> None:
        """Release the backend; later calls raise IndexUnavailableError. Idempotent."""

    def upsert(self, points: Sequence[IndexPoint]) -> None:
        """Insert or replace points by point_id; visible and crash-safe when it returns."""
        batch: list[Any] = []
        for p in points:
            dense = validate_point(p, self.dim)
            vectors: dict[str, Any] = {}
            if dense is not None:
                vectors[DENSE_VECTOR] = dense
            sparse = in_tenant_space(self.encoder.embed_document(p.sparse_text), p.tenant_id)
            if sparse:
                vectors[SPARSE_VECTOR] = self._sparse_vector(sparse)
            batch.append(self._point(p.point_id, vectors, point_payload(p)))
        self._write_points(batch)

    def delete_document(
        self,
        tenant_id: str,
        doc_id: str,
        *,
        except_generation: str | None = None,
        generation: str | None = None,
    ) -> None:
        """Delete all points of a document (every kind), keeping `except_generation`'s, or
        only `generation`'s."""
        flt = IndexFilter(
            tenant_id=tenant_id, kinds=KINDS, doc_ids=(doc_id,), generation=generation or ""
        )
        exclude = [FieldMatch("generation", (except_generation,))] if except_generation else []
        self._delete_where(self._filter(flt, exclude=exclude))

    def search_dense(self, vector: np.ndarray, flt: IndexFilter, limit: int) -> list[IndexHit]:
        """Cosine nearest neighbours inside the filter, best first, with the full payload."""
        if check_limit(limit) == 0:
            return []
        query, params = self._dense(vector)
        points = self._search(query, DENSE_VECTOR, self._filter(flt), limit, params)
        return [hit_from_payload(p.id, p.payload, p.score) for p in points]

    def search_sparse(self, query: str, flt: IndexFilter, limit: int) -> list[IndexHit]:
        """BM25 inside the filter; IDF over the tenant's points of the same kinds."""
        q = self._sparse(query, flt)
        if check_limit(limit) == 0 or q is None:
            return []
        points = self._search(q[0], SPARSE_VECTOR, self._filter(flt), limit, q[1])
        return [hit_from_payload(p.id, p.payload, p.score) for p in points]

    def search_dense_ids(self, vector: np.ndarray, flt: IndexFilter, limit: int) -> Ranking:
        """search_dense returning (point id, score) only: no payload is read."""
        return self.search_ids_batch([RankQuery(flt, limit, vector=vector)])[0]

    def search_sparse_ids(self, query: str, flt: IndexFilter, limit: int) -> Ranking:
        """search_sparse returning (point id, score) only: no payload is read."""
        return self.search_ids_batch([RankQuery(flt, limit, text=query)])[0]

    def search_ids_batch(self, queries: Sequence[RankQuery]) -> list[Ranking]:
        """Several search_dense_ids / search_sparse_ids as one backend call, results in
        order: the rankings of `queries` from one backend call (one round trip, one planned pass
        over the segments: 4.3 ms for a section_first search's four lists at 100k points in
        Edge, against 5.5 ms as four calls); [] for a query that cannot match."""
        built = [self._ranking_request(q) for q in queries]
        requests = [b for b in built if b is not None]
        answers = iter(self._query_batch(requests) if requests else ())
        return [[] if b is None else ranking(next(answers)) for b in built]

    def document_generations(self, tenant_id: str) -> dict[str, set[str]]:
        """doc_id -> generations present in the tenant's points: what an ingest, a crash or a
        recovery left in the index (the tests read the index with it; recovery itself goes by
        the ingest journal)."""
        filter_ = self._filter(IndexFilter(tenant_id=tenant_id, kinds=KINDS))
        out: dict[str, set[str]] = {}
        offset: Any = None
        while True:
            records, offset = self._scroll_page(filter_, offset, _SCROLL_PAGE, _SCROLL_FIELDS)
            for r in records:
                payload = r.payload or {}
                out.setdefault(str(payload.get("doc_id", "")), set()).add(
                    str(payload.get("generation", ""))
                )
            if offset is None:
                return out

    def count(self, tenant_id: str | None = None) -> int:
        """Exact number of points, of one tenant (all kinds) or of the whole index."""
        if tenant_id is None:
            return self._count(None)
        return self._count(self._filter(IndexFilter(tenant_id, kinds=KINDS)))

    def count_document(self, tenant_id: str, doc_id: str, generation: str) -> int:
        """Exact number of one document's points of one generation (every kind)."""
        flt = IndexFilter(tenant_id, kinds=KINDS, doc_ids=(doc_id,), generation=generation)
        return self._count(self._filter(flt))
