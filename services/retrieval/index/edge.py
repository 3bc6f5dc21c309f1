"""Qdrant Edge backend: the embedded, in-process default index (one shard directory)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np
import qdrant_edge as qe

from services.retrieval.index.base import (
    DENSE_VECTOR,
    KEYWORD_FIELDS,
    KINDS,
    LAYOUT_VERSION,
    PRE_RECORD_LAYOUT,
    SCOPE_FIELD,
    SPARSE_VECTOR,
    TENANT_FIELD,
    FieldMatch,
    IndexFilter,
    IndexHit,
    IndexLayoutError,
    IndexLockedError,
    IndexPoint,
    IndexUnavailableError,
    PointId,
    RankQuery,
    check_limit,
    dense_search_params,
    filter_conditions,
    hit_from_payload,
    idf_corpus,
    point_payload,
    query_vector,
    ranking_query,
    run_ranking_batch,
    validate_point,
)
from services.retrieval.index.sparse import Bm25Encoder, SparseVector, in_tenant_space

_T = TypeVar("_T")
_CONFIG_FILE = "edge_config.json"
LAYOUT_FILE = "visior_layout.json"
"""Written into the shard directory: {"layout_version": LAYOUT_VERSION}."""
_UPSERT_BATCH = 512
_SCROLL_PAGE = 2048


def edge_filter(flt: IndexFilter, *, exclude: Sequence[FieldMatch] = ()) -> qe.Filter:
    """The only IndexFilter -> Edge filter translation (tenant first, via filter_conditions)."""
    must: list[Any] = [_condition(c) for c in filter_conditions(flt)]
    return qe.Filter(must=must, must_not=[_condition(c) for c in exclude] or None)


def _condition(c: FieldMatch) -> qe.FieldCondition:
    if len(c.values) == 1:
        return qe.FieldCondition(c.key, match=qe.MatchValue(c.values[0]))
    return qe.FieldCondition(c.key, match=qe.MatchAny(list(c.values)))


def _edge_sparse(v: SparseVector) -> qe.SparseVector:
    return qe.SparseVector(list(v.indices), list(v.values))


class EdgeIndex:
    """A VectorIndex over one Qdrant Edge shard directory, created on first open.

    Named vectors: `dense` (cosine, `dim`) and `bm25` (sparse, IDF modifier); keyword
    payload indexes on the tenant (`is_tenant`) and every filterable field. A shard is
    single-process: opening a path that is already open (here or in another process)
    raises IndexLockedError.

    Thread-safety: safe to share between threads. Searches, counts and scrolls take no
    lock here (the shard synchronises itself; docs/architecture.md §3 measured no throughput gain
    from a second thread); writes, `optimize` and `close` are serialised by a lock; calls
    after `close` raise IndexUnavailableError.
    """

    backend = "qdrant-edge"

    def __init__(
        self,
        path: str,
        dim: int,
        *,
        encoder: Bm25Encoder | None = None,
        hnsw_m: int = 0,
        hnsw_payload_m: int | None = 16,
        hnsw_ef_construct: int = 100,
        hnsw_ef: int | None = None,
        hnsw_on_filter_fields: bool = False,
        max_search_threads: int | None = None,
        idf_per_tenant: bool = True,
        quantization: str = "int8",
        indexing_threshold_kb: int | None = None,
    ) -> None:
        """Open (or create) the shard at `path` for `dim`-dimensional dense vectors.

        HNSW (built by `optimize`): `hnsw_m` links per node in the whole-shard graph and
        `hnsw_payload_m` in the per-(tenant, kind) graphs; the default `0, 16` is Qdrant's
        multitenant layout (no whole-shard graph, since every query has a tenant filter;
        it built 100k points about 4x faster than `16, None` here at the same recall);
        `hnsw_on_filter_fields` also builds per-value graphs for the other keyword fields
        (slower optimize, rarely useful: those filters narrow within a tenant).
        `hnsw_ef` is the search-time beam (None = engine default); `max_search_threads`
        the shard's search pool (None = one per CPU); `idf_per_tenant` computes BM25 IDF
        over the querying tenant's points instead of the whole shard.

        `quantization` "int8" (QUANTIZATIONS) keeps an int8 scalar copy of the dense vectors in
        RAM, built by `optimize` (an existing shard gets it at its next optimize), searched
        first and rescored with the originals, so scores stay exact cosines (fast profile,
        100k chunks: the four ranking lists 2.06 -> 1.31 ms p50, the HNSW chunk list
        1.30 -> 0.54 ms, same recall); "none" searches the originals only.
        `indexing_threshold_kb`: segments with more vector data than this get HNSW and the
        quantized copy at `optimize` (None = the engine's default; tests set it low).
        """
        if dim <= 0:
            raise ValueError("dim must be positive")
        self.path = os.path.abspath(path)
        self.dim = dim
        self.encoder = encoder or Bm25Encoder()
        self._dense_params = dense_search_params(
            qe.SearchParams, qe.QuantizationSearchParams, hnsw_ef, quantization
        )
        self.idf_per_tenant = idf_per_tenant
        self._hnsw_on_filter_fields = hnsw_on_filter_fields
        self._write_lock = threading.Lock()
        self._writes = 0
        config = qe.EdgeConfig(
            vectors={DENSE_VECTOR: qe.EdgeVectorParams(size=dim, distance=qe.Distance.Cosine)},
            sparse_vectors={SPARSE_VECTOR: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
            hnsw_config=qe.HnswIndexConfig(
                m=hnsw_m,
                ef_construct=hnsw_ef_construct,
                full_scan_threshold=10_000,
                payload_m=hnsw_payload_m,
            ),
            max_search_threads=max_search_threads,
            optimizers=None
            if indexing_threshold_kb is None
            else qe.EdgeOptimizersConfig(indexing_threshold=indexing_threshold_kb),
            quantization_config=qe.ScalarQuantizationConfig(
                type=qe.ScalarType.Int8, quantile=0.99, memory=qe.Memory.Cached
            )
            if quantization == "int8"
            else None,
        )
        exists = os.path.exists(os.path.join(self.path, _CONFIG_FILE))
        try:
            if exists:
                self._shard: qe.EdgeShard | None = qe.EdgeShard.load(self.path, config)
            else:
                os.makedirs(self.path, exist_ok=True)
                self._shard = qe.EdgeShard.create(self.path, config)
        except Exception as exc:
            msg = str(exc)
            if "WAL" in msg or "WouldBlock" in msg or "lock" in msg.lower():
                raise IndexLockedError(
                    f"Qdrant Edge shard {self.path} is already open (in this or another "
                    f"process); an Edge shard belongs to one process: {msg}"
                ) from exc
            if exists:
                raise IndexUnavailableError(f"cannot open Edge shard {self.path}: {msg}") from exc
            raise IndexUnavailableError(f"cannot create Edge shard {self.path}: {msg}") from exc
        try:
            self._check_layout(created=not exists)
            self._ensure_payload_indexes()
        except Exception:
            self.close()
            raise

    # -- internals -------------------------------------------------------------------------

    def _check_layout(self, *, created: bool) -> None:
        """Refuse a shard written with another point layout; record ours in a new one.

        A shard from before the layout file existed is adopted when it has no points and
        otherwise refused: layout 1 when its points lack SCOPE_FIELD, 2 when they carry it.
        """
        marker = os.path.join(self.path, LAYOUT_FILE)
        found: object = None
        if not created and os.path.exists(marker):
            try:
                with open(marker, encoding="utf-8") as f:
                    found = json.load(f).get("layout_version")
            except (OSError, ValueError, AttributeError) as exc:
                raise IndexLayoutError(
                    f"Edge shard {self.path}: unreadable {LAYOUT_FILE} ({exc}); "
                    "delete the index directory and re-ingest the documents"
                ) from exc
        elif not created:
            records, _ = self._scroll(
                qe.ScrollRequest(limit=1, with_payload=[SCOPE_FIELD], with_vector=False)
            )
            if records:
                found = PRE_RECORD_LAYOUT if SCOPE_FIELD in (records[0].payload or {}) else 1
        if found is not None and found != LAYOUT_VERSION:
            raise IndexLayoutError(
                f"Edge shard {self.path} was written with index layout {found}; this version "
                f"reads layout {LAYOUT_VERSION} and would find nothing in it. Delete the index "
                "directory (RETR_INDEX_PATH) and re-ingest the documents (the document store "
                "keeps them: `visior ingest PATH... --tenant T`)"
            )
        if found is None:
            tmp = f"{marker}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"layout_version": LAYOUT_VERSION}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, marker)

    def _ensure_payload_indexes(self) -> None:
        have = set(self._call(lambda s: s.info().payload_schema))
        # HNSW per-value graphs on the scope (tenant + kind) only: every search filters on it.
        wanted: list[tuple[str, Any]] = [
            (SCOPE_FIELD, qe.KeywordIndexParams(is_tenant=True)),
            (TENANT_FIELD, qe.KeywordIndexParams(is_tenant=True, enable_hnsw=False)),
        ]
        other = qe.KeywordIndexParams(enable_hnsw=self._hnsw_on_filter_fields)
        wanted += [(name, other) for name in KEYWORD_FIELDS]
        for name, params in wanted:
            if name not in have:
                op = qe.UpdateOperation.create_field_index(name, params)
                self._update(op)

    def _call(self, fn: Callable[[qe.EdgeShard], _T]) -> _T:
        shard = self._shard
        if shard is None:
            raise IndexUnavailableError(f"Edge shard {self.path} is closed")
        try:
            return fn(shard)
        except (ValueError, TypeError):
            raise
        except Exception as exc:  # the bindings raise bare Exception for engine errors
            if self._shard is None:
                raise IndexUnavailableError(f"Edge shard {self.path} is closed") from exc
            raise IndexUnavailableError(f"Edge shard {self.path}: {exc}") from exc

    def _update(self, op: qe.UpdateOperation) -> None:
        self._call(lambda s: s.update(op))

    def _scroll(self, req: qe.ScrollRequest) -> tuple[list[qe.Record], Any]:
        return self._call(lambda s: s.scroll(req))

    @contextmanager
    def _writing(self, *, counted: bool = True) -> Iterator[None]:
        with self._write_lock:
            if self._shard is None:
                raise IndexUnavailableError(f"Edge shard {self.path} is closed")
            try:
                yield
            finally:
                if counted:
                    self._writes += 1

    @property
    def write_count(self) -> int:
        """Writes (upserts, deletes) since the shard was opened; `optimize` is not one."""
        return self._writes

    def _query(
        self, query: Any, flt: IndexFilter, limit: int, params: Any, payload: Any
    ) -> list[Any]:
        req = qe.QueryRequest(
            limit=limit,
            query=query,
            filter=edge_filter(flt),
            with_payload=payload,
            with_vector=False,
            params=params,
        )
        return self._call(lambda s: s.query(req))

    def _dense(self, vector: np.ndarray) -> tuple[Any, Any]:
        query = qe.Query.Nearest(query_vector(vector, self.dim), using=DENSE_VECTOR)
        return query, self._dense_params

    def _sparse(self, query: str, flt: IndexFilter) -> tuple[Any, Any] | None:
        edge_filter(flt)  # validate the filter even when the query has no terms
        sparse = in_tenant_space(self.encoder.embed_query(query), flt.tenant_id)
        if not sparse:
            return None
        params = None
        if self.idf_per_tenant:
            params = qe.SearchParams(idf=qe.IdfParams(corpus=edge_filter(idf_corpus(flt))))
        return qe.Query.Nearest(_edge_sparse(sparse), using=SPARSE_VECTOR), params

    # -- VectorIndex -----------------------------------------------------------------------

    def upsert(self, points: Sequence[IndexPoint]) -> None:
        """Insert or replace points by id; in the WAL when it returns (survives a process crash)."""
        batch: list[qe.Point] = []
        for p in points:
            dense = validate_point(p, self.dim)
            vectors: dict[str, Any] = {}
            if dense is not None:
                vectors[DENSE_VECTOR] = dense
            sparse = in_tenant_space(self.encoder.embed_document(p.sparse_text), p.tenant_id)
            if sparse:
                vectors[SPARSE_VECTOR] = _edge_sparse(sparse)
            batch.append(qe.Point(p.point_id, vectors, point_payload(p)))
        with self._writing():
            for i in range(0, len(batch), _UPSERT_BATCH):
                op = qe.UpdateOperation.upsert_points(batch[i : i + _UPSERT_BATCH])
                self._update(op)

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
        op = qe.UpdateOperation.delete_points_by_filter(edge_filter(flt, exclude=exclude))
        with self._writing():
            self._update(op)

    def search_dense(self, vector: np.ndarray, flt: IndexFilter, limit: int) -> list[IndexHit]:
        """Cosine nearest neighbours inside the filter, best first, with the full payload."""
        if check_limit(limit) == 0:
            return []
        query, params = self._dense(vector)
        points = self._query(query, flt, limit, params, True)
        return [hit_from_payload(p.id, p.payload, p.score) for p in points]

    def search_sparse(self, query: str, flt: IndexFilter, limit: int) -> list[IndexHit]:
        """BM25 inside the filter; IDF over the tenant's points of the same kinds."""
        q = self._sparse(query, flt)
        if check_limit(limit) == 0 or q is None:
            return []
        points = self._query(q[0], flt, limit, q[1], True)
        return [hit_from_payload(p.id, p.payload, p.score) for p in points]

    def search_dense_ids(
        self, vector: np.ndarray, flt: IndexFilter, limit: int
    ) -> list[tuple[PointId, float]]:
        """search_dense returning (point id, score) only: no payload is read."""
        return self.search_ids_batch([RankQuery(flt, limit, vector=vector)])[0]

    def search_sparse_ids(
        self, query: str, flt: IndexFilter, limit: int
    ) -> list[tuple[PointId, float]]:
        """search_sparse returning (point id, score) only: no payload is read."""
        return self.search_ids_batch([RankQuery(flt, limit, text=query)])[0]

    def search_ids_batch(self, queries: Sequence[RankQuery]) -> list[list[tuple[PointId, float]]]:
        """The rankings of `queries` from one `query_batch` (one planned pass over the
        segments: 4.3 ms for a section_first search's four lists at 100k points, against
        5.5 ms as four calls)."""
        return run_ranking_batch(
            queries,
            self._ranking_request,
            lambda reqs: self._call(lambda s: s.query_batch(qe.QueryBatchRequest(reqs))),
            lambda points: [(p.id, p.score) for p in points],
        )

    def _ranking_request(self, q: RankQuery) -> qe.QueryRequest | None:
        flt = edge_filter(q.flt)  # refuses a filter without tenant, whatever the limit
        built = ranking_query(q, self._dense, self._sparse)
        if built is None:
            return None
        query, params = built
        return qe.QueryRequest(
            limit=q.limit,
            query=query,
            filter=flt,
            with_payload=False,
            with_vector=False,
            params=params,
        )

    def document_generations(self, tenant_id: str) -> dict[str, set[str]]:
        """doc_id -> generations present in the tenant's points."""
        flt = edge_filter(IndexFilter(tenant_id=tenant_id, kinds=KINDS))
        out: dict[str, set[str]] = {}
        offset: Any = None
        while True:
            req = qe.ScrollRequest(
                offset=offset,
                limit=_SCROLL_PAGE,
                filter=flt,
                with_payload=["doc_id", "generation"],
                with_vector=False,
            )
            records, offset = self._scroll(req)
            for r in records:
                payload = r.payload or {}
                out.setdefault(str(payload.get("doc_id", "")), set()).add(
                    str(payload.get("generation", ""))
                )
            if offset is None:
                return out

    def count(self, tenant_id: str | None = None) -> int:
        """Exact number of points, of one tenant (all kinds) or of the whole shard."""
        flt = None if tenant_id is None else edge_filter(IndexFilter(tenant_id, kinds=KINDS))
        return self._call(lambda s: s.count(qe.CountRequest(exact=True, filter=flt)))

    def count_document(self, tenant_id: str, doc_id: str, generation: str) -> int:
        """Exact number of one document's points of one generation (every kind)."""
        flt = IndexFilter(tenant_id, kinds=KINDS, doc_ids=(doc_id,), generation=generation)
        return self._call(lambda s: s.count(qe.CountRequest(exact=True, filter=edge_filter(flt))))

    def optimize(self) -> None:
        """Run the segment optimizers (HNSW build, merges, vacuum) until done; blocks."""
        with self._writing(counted=False):
            self._call(lambda s: s.optimize())

    def health(self) -> dict[str, str]:
        """Status and shard details; never raises."""
        details = {"backend": self.backend, "path": self.path}
        try:
            info = self._call(lambda s: s.info())
            return {
                "status": "ok",
                **details,
                "points": str(info.points_count),
                "segments": str(info.segments_count),
                "indexed_vectors": str(info.indexed_vectors_count),
            }
        except Exception as exc:
            return {"status": "down", **details, "error": str(exc)[:300]}

    def close(self) -> None:
        """Flush and close the shard, releasing its lock; idempotent."""
        with self._write_lock:
            shard, self._shard = self._shard, None
            if shard is None:
                return
            try:
                shard.flush()
            finally:
                shard.close()
