"""Qdrant server / cluster backend through qdrant-client (gRPC preferred), for scale-out."""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import httpx
import numpy as np
from qdrant_client import QdrantClient, models
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

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
LAYOUT_KEY = "visior_layout_version"
"""Collection metadata key recording LAYOUT_VERSION."""
_UPSERT_BATCH = 256
_SCROLL_PAGE = 2048
# gRPC status names (duck-typed: this module does not import grpc) that mean "not reachable
# or not serving now"; INVALID_ARGUMENT, NOT_FOUND and the like are bugs and propagate.
_UNAVAILABLE_GRPC = {
    "UNAVAILABLE",
    "DEADLINE_EXCEEDED",
    "RESOURCE_EXHAUSTED",
    "ABORTED",
    "CANCELLED",
    "INTERNAL",
    "UNKNOWN",
    "UNAUTHENTICATED",
    "PERMISSION_DENIED",
}


def server_filter(flt: IndexFilter, *, exclude: Sequence[FieldMatch] = ()) -> models.Filter:
    """The only IndexFilter -> qdrant-client filter translation (tenant first)."""
    must: list[Any] = [_condition(c) for c in filter_conditions(flt)]
    return models.Filter(
        must=must,
        must_not=[_condition(c) for c in exclude] or None,  # type: ignore[misc]
    )


def _condition(c: FieldMatch) -> models.FieldCondition:
    if len(c.values) == 1:
        return models.FieldCondition(key=c.key, match=models.MatchValue(value=c.values[0]))
    return models.FieldCondition(key=c.key, match=models.MatchAny(any=list(c.values)))


def _client_sparse(v: SparseVector) -> models.SparseVector:
    return models.SparseVector(indices=list(v.indices), values=list(v.values))


def is_unavailable(exc: BaseException) -> bool:
    """True when a qdrant-client error means the server cannot be reached or cannot serve."""
    if isinstance(exc, ResponseHandlingException | httpx.TransportError):
        return True
    if isinstance(exc, UnexpectedResponse):
        return (
            exc.status_code is None
            or exc.status_code >= 500
            or exc.status_code in (401, 403, 408, 429)
        )
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    code = getattr(exc, "code", None)
    if callable(code):  # grpc.RpcError, without importing grpc
        try:
            name = getattr(code(), "name", "")
        except Exception:
            return False
        return name in _UNAVAILABLE_GRPC
    return False


class QdrantServerIndex:
    """A VectorIndex over one collection of a Qdrant server or cluster.

    The collection (named vectors `dense` cosine and `bm25` sparse with the IDF
    modifier, keyword payload indexes with the tenant `is_tenant`) is created on first
    use, so a process can start while the server is down and report it in `health()`.

    Thread-safety: safe to share between threads. A remote client is used concurrently;
    qdrant-client's local mode (tests only: it scans every point per query) is
    serialised by a lock.
    """

    backend = "qdrant"

    def __init__(
        self,
        client: QdrantClient,
        collection: str,
        dim: int,
        *,
        encoder: Bm25Encoder | None = None,
        hnsw_m: int = 0,
        hnsw_payload_m: int = 16,
        hnsw_ef: int | None = None,
        idf_per_tenant: bool = True,
        shard_number: int | None = None,
        replication_factor: int | None = None,
        quantization: str = "int8",
    ) -> None:
        """Wrap `client`; nothing is sent to the server until the first call.

        A new collection gets Qdrant's multitenant HNSW layout by default (`hnsw_m=0`:
        no whole-collection graph; `hnsw_payload_m=16`: a graph per tenant and kind) and, with
        `quantization` "int8", an int8 scalar copy of the dense vectors in RAM, searched first
        and rescored with the originals (as the Edge backend); "none" searches the originals.
        """
        if dim <= 0:
            raise ValueError("dim must be positive")
        if not collection:
            raise ValueError("collection name is required")
        self.client = client
        self.collection = collection
        self.dim = dim
        self.encoder = encoder or Bm25Encoder()
        self.quantization = quantization
        self._dense_params = dense_search_params(
            models.SearchParams, models.QuantizationSearchParams, hnsw_ef, quantization
        )
        self._hnsw_m = hnsw_m
        self._hnsw_payload_m = hnsw_payload_m
        self.idf_per_tenant = idf_per_tenant
        self._shard_number = shard_number
        self._replication_factor = replication_factor
        opts = client.init_options
        self.local_mode = bool(opts.get("path")) or opts.get("location") == ":memory:"
        self._ready = False
        self._closed = False
        self._setup_lock = threading.Lock()
        self._local_lock: contextlib.AbstractContextManager[Any] = (
            threading.RLock() if self.local_mode else contextlib.nullcontext()
        )

    @classmethod
    def from_url(
        cls,
        url: str,
        collection: str,
        dim: int,
        *,
        api_key: str | None = None,
        timeout: float = 5.0,
        prefer_grpc: bool = True,
        **kwargs: Any,
    ) -> QdrantServerIndex:
        """Connect to `url` (gRPC on its gRPC port when `prefer_grpc`); no I/O until first use."""
        client = QdrantClient(
            url=url,
            api_key=api_key,
            prefer_grpc=prefer_grpc,
            timeout=int(timeout) or 1,
            check_compatibility=False,
        )
        return cls(client, collection, dim, **kwargs)

    # -- internals -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        if self._closed:
            raise IndexUnavailableError(f"Qdrant index {self.collection} is closed")
        try:
            yield
        except IndexUnavailableError:
            raise
        except Exception as exc:
            if is_unavailable(exc):
                raise IndexUnavailableError(f"Qdrant server unavailable: {exc}") from exc
            raise

    def _call(self, fn: Callable[[QdrantClient], _T]) -> _T:
        with self._guard():
            self._ensure_collection()
            with self._local_lock:
                return fn(self.client)

    def _ensure_collection(self) -> None:
        if self._ready:
            return
        with self._setup_lock, self._local_lock:
            if self._ready:
                return
            c = self.client
            have: set[str] = set()
            if c.collection_exists(self.collection):
                info = c.get_collection(self.collection)
                vectors = info.config.params.vectors
                size = vectors[DENSE_VECTOR].size if isinstance(vectors, dict) else None
                if size != self.dim:
                    raise ValueError(
                        f"collection {self.collection} has dense size {size}, want {self.dim}"
                    )
                have = set(info.payload_schema or {})
                self._check_layout(c, info.config.metadata)
            else:
                c.create_collection(
                    self.collection,
                    vectors_config={
                        DENSE_VECTOR: models.VectorParams(
                            size=self.dim, distance=models.Distance.COSINE
                        )
                    },
                    sparse_vectors_config={
                        SPARSE_VECTOR: models.SparseVectorParams(modifier=models.Modifier.IDF)
                    },
                    hnsw_config=models.HnswConfigDiff(
                        m=self._hnsw_m, payload_m=self._hnsw_payload_m
                    ),
                    quantization_config=models.ScalarQuantization(
                        scalar=models.ScalarQuantizationConfig(
                            type=models.ScalarType.INT8, quantile=0.99, always_ram=True
                        )
                    )
                    if self.quantization == "int8"
                    else None,
                    shard_number=self._shard_number,
                    replication_factor=self._replication_factor,
                    metadata={LAYOUT_KEY: LAYOUT_VERSION},
                )
            kw = models.KeywordIndexType.KEYWORD
            # HNSW per-value graphs on the scope (tenant + kind) only: every search filters on it.
            indexes: list[tuple[str, models.KeywordIndexParams]] = [
                (SCOPE_FIELD, models.KeywordIndexParams(type=kw, is_tenant=True)),
                (
                    TENANT_FIELD,
                    models.KeywordIndexParams(type=kw, is_tenant=True, enable_hnsw=False),
                ),
            ]
            indexes += [
                (name, models.KeywordIndexParams(type=kw, enable_hnsw=False))
                for name in KEYWORD_FIELDS
            ]
            with warnings.catch_warnings():
                # Local mode warns that payload indexes do nothing there; the server uses them.
                warnings.simplefilter("ignore", UserWarning)
                for name, schema in indexes:
                    if name in have:
                        continue
                    c.create_payload_index(self.collection, name, field_schema=schema, wait=True)
            self._ready = True

    def _check_layout(self, c: QdrantClient, metadata: dict[str, Any] | None) -> None:
        """Refuse a collection written with another point layout; record ours on an old one.

        A collection from before the marker is adopted when it has no points and otherwise
        refused: layout 1 when its points lack SCOPE_FIELD, 2 when they carry it.
        """
        found = (metadata or {}).get(LAYOUT_KEY)
        if found is None:
            records, _ = c.scroll(
                self.collection, limit=1, with_payload=[SCOPE_FIELD], with_vectors=False
            )
            if records:
                found = PRE_RECORD_LAYOUT if SCOPE_FIELD in (records[0].payload or {}) else 1
        if found is not None and found != LAYOUT_VERSION:
            raise IndexLayoutError(
                f"Qdrant collection {self.collection} was written with index layout {found}; "
                f"this version reads layout {LAYOUT_VERSION} and would find nothing in it. "
                "Delete the collection (or point QDRANT_COLLECTION at a new one) and re-ingest "
                "the documents (`visior ingest PATH... --tenant T`)"
            )
        if found is None:
            c.update_collection(self.collection, metadata={LAYOUT_KEY: LAYOUT_VERSION})

    def _upsert_batch(self, part: list[models.PointStruct]) -> None:
        self._call(lambda c: c.upsert(self.collection, points=part, wait=True))

    def _scroll(self, flt: models.Filter, offset: Any) -> tuple[list[models.Record], Any]:
        return self._call(
            lambda c: c.scroll(
                self.collection,
                scroll_filter=flt,
                limit=_SCROLL_PAGE,
                offset=offset,
                with_payload=["doc_id", "generation"],
                with_vectors=False,
            )
        )

    def _search(
        self,
        query: Any,
        using: str,
        flt: IndexFilter,
        limit: int,
        params: models.SearchParams | None,
        payload: bool | list[str] = True,
    ) -> list[models.ScoredPoint]:
        qfilter = server_filter(flt)
        res = self._call(
            lambda c: c.query_points(
                self.collection,
                query=query,
                using=using,
                query_filter=qfilter,
                limit=limit,
                with_payload=payload,
                with_vectors=False,
                search_params=params,
            )
        )
        return res.points

    def _dense(self, vector: np.ndarray) -> tuple[Any, models.SearchParams | None]:
        return query_vector(vector, self.dim), self._dense_params

    def _sparse(
        self, query: str, flt: IndexFilter
    ) -> tuple[models.SparseVector, models.SearchParams | None] | None:
        server_filter(flt)  # validate the filter even when the query has no terms
        sparse = in_tenant_space(self.encoder.embed_query(query), flt.tenant_id)
        if not sparse:
            return None
        params = None
        if self.idf_per_tenant:
            corpus = server_filter(idf_corpus(flt))
            params = models.SearchParams(idf=models.IdfCorpusParams(corpus=corpus))
        return _client_sparse(sparse), params

    # -- VectorIndex -----------------------------------------------------------------------

    def upsert(self, points: Sequence[IndexPoint]) -> None:
        """Insert or replace points by id; returns when the server has applied them."""
        batch: list[models.PointStruct] = []
        for p in points:
            dense = validate_point(p, self.dim)
            vectors: dict[str, Any] = {}
            if dense is not None:
                vectors[DENSE_VECTOR] = dense
            sparse = in_tenant_space(self.encoder.embed_document(p.sparse_text), p.tenant_id)
            if sparse:
                vectors[SPARSE_VECTOR] = _client_sparse(sparse)
            batch.append(
                models.PointStruct(id=p.point_id, vector=vectors, payload=point_payload(p))
            )
        for i in range(0, len(batch), _UPSERT_BATCH):
            part = batch[i : i + _UPSERT_BATCH]
            self._upsert_batch(part)

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
        selector = models.FilterSelector(filter=server_filter(flt, exclude=exclude))
        self._call(lambda c: c.delete(self.collection, points_selector=selector, wait=True))

    def search_dense(self, vector: np.ndarray, flt: IndexFilter, limit: int) -> list[IndexHit]:
        """Cosine nearest neighbours inside the filter, best first, with the full payload."""
        if check_limit(limit) == 0:
            return []
        query, params = self._dense(vector)
        points = self._search(query, DENSE_VECTOR, flt, limit, params)
        return [hit_from_payload(p.id, p.payload, p.score) for p in points]

    def search_sparse(self, query: str, flt: IndexFilter, limit: int) -> list[IndexHit]:
        """BM25 inside the filter; IDF over the tenant's points of the same kinds."""
        q = self._sparse(query, flt)
        if check_limit(limit) == 0 or q is None:
            return []
        points = self._search(q[0], SPARSE_VECTOR, flt, limit, q[1])
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
        """The rankings of `queries` from one query_batch_points call (one round trip)."""
        return run_ranking_batch(
            queries,
            self._ranking_request,
            lambda reqs: self._call(lambda c: c.query_batch_points(self.collection, requests=reqs)),
            lambda answer: [(p.id, p.score) for p in answer.points],
        )

    def _ranking_request(self, q: RankQuery) -> models.QueryRequest | None:
        flt = server_filter(q.flt)  # refuses a filter without tenant, whatever the limit
        built = ranking_query(q, self._dense, self._sparse)
        if built is None:
            return None
        query, params = built
        return models.QueryRequest(
            query=query,
            using=DENSE_VECTOR if q.vector is not None else SPARSE_VECTOR,
            filter=flt,
            limit=q.limit,
            params=params,
            with_payload=False,
            with_vector=False,
        )

    def document_generations(self, tenant_id: str) -> dict[str, set[str]]:
        """doc_id -> generations present in the tenant's points."""
        flt = server_filter(IndexFilter(tenant_id=tenant_id, kinds=KINDS))
        out: dict[str, set[str]] = {}
        offset: Any = None
        while True:
            records, offset = self._scroll(flt, offset)
            for r in records:
                payload = r.payload or {}
                out.setdefault(str(payload.get("doc_id", "")), set()).add(
                    str(payload.get("generation", ""))
                )
            if offset is None:
                return out

    def count(self, tenant_id: str | None = None) -> int:
        """Exact number of points, of one tenant (all kinds) or of the whole collection."""
        flt = None if tenant_id is None else server_filter(IndexFilter(tenant_id, kinds=KINDS))
        res = self._call(lambda c: c.count(self.collection, count_filter=flt, exact=True))
        return int(res.count)

    def count_document(self, tenant_id: str, doc_id: str, generation: str) -> int:
        """Exact number of one document's points of one generation (every kind)."""
        flt = server_filter(
            IndexFilter(tenant_id, kinds=KINDS, doc_ids=(doc_id,), generation=generation)
        )
        res = self._call(lambda c: c.count(self.collection, count_filter=flt, exact=True))
        return int(res.count)

    def optimize(self) -> None:
        """No-op: the server's optimizers build HNSW and merge segments on their own."""
        self._call(lambda c: None)

    def health(self) -> dict[str, str]:
        """Status and collection details; never raises."""
        details = {"backend": self.backend, "collection": self.collection}
        if self.local_mode:
            details["mode"] = "local (tests only)"
        try:
            info = self._call(lambda c: c.get_collection(self.collection))
            return {
                "status": "ok",
                **details,
                "points": str(info.points_count or 0),
                "collection_status": str(getattr(info.status, "value", info.status)),
            }
        except Exception as exc:
            return {"status": "down", **details, "error": str(exc)[:300]}

    def close(self) -> None:
        """Close the client; idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._local_lock, contextlib.suppress(Exception):
            self.client.close()
