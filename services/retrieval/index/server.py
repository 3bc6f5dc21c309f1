"""Qdrant server / cluster backend through qdrant-client (gRPC preferred), for scale-out."""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
from qdrant_client import QdrantClient, models
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from services.common.breaker import ANSWERED, OUTAGE
from services.common.retry import whole_seconds
from services.retrieval.index.base import (
    DENSE_VECTOR,
    LAYOUT_VERSION,
    SCOPE_FIELD,
    SPARSE_VECTOR,
    FieldMatch,
    IndexLayoutError,
    IndexUnavailableError,
)
from services.retrieval.index.qdrant_common import (
    VectorIndex,
    dense_search_params,
    payload_indexes,
    settle_layout,
)
from services.retrieval.index.sparse import Bm25Encoder, SparseVector

_T = TypeVar("_T")
QDRANT_GRPC_PORT = 6334
"""Qdrant's default gRPC port (qdrant-client's too): where a URL without a port is reached."""
QDRANT_REST_PORT = 6333
"""Qdrant's default REST port: a URL naming it means the server whose gRPC port is the
default."""
LAYOUT_KEY = "visior_layout_version"
"""Collection metadata key recording LAYOUT_VERSION."""
_UPSERT_BATCH = 256
# gRPC status names (duck-typed: this module does not import grpc) that mean "not reachable
# or not serving now".
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
# gRPC status names of the server refusing the request: it is up, the request is wrong.
_REFUSED_GRPC = {
    "INVALID_ARGUMENT",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "FAILED_PRECONDITION",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
}
_UNAVAILABLE_HTTP = (401, 403, 408, 429)
"""4xx replies that mean "cannot serve now" (auth, timeout, rate limit); other 4xx refuse."""


def server_verdict(exc: BaseException) -> str | None:
    """The circuit breaker's verdict on the server (services/common/breaker.py) from a
    qdrant-client error: OUTAGE when the server cannot be reached or cannot serve (transport
    errors, 5xx, 401/403/408/429, UNAVAILABLE and the like), ANSWERED when it replied to refuse
    the request (another 4xx, INVALID_ARGUMENT, NOT_FOUND and the like: a bug of ours, the
    server is up); None when `exc` is no answer of the server's (our own code failed)."""
    if isinstance(
        exc, ResponseHandlingException | httpx.TransportError | ConnectionError | TimeoutError
    ):
        return OUTAGE
    if isinstance(exc, UnexpectedResponse):
        status = exc.status_code
        if status is None or status >= 500 or status in _UNAVAILABLE_HTTP:
            return OUTAGE
        return ANSWERED
    code = getattr(exc, "code", None)
    if callable(code):  # grpc.RpcError, without importing grpc
        try:
            name = getattr(code(), "name", "")
        except Exception:
            return None
        if name in _UNAVAILABLE_GRPC:
            return OUTAGE
        if name in _REFUSED_GRPC:
            return ANSWERED
    return None


class QdrantServerIndex(VectorIndex):
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
        timeout: float,
        api_key: str | None = None,
        prefer_grpc: bool = True,
        **kwargs: Any,
    ) -> QdrantServerIndex:
        """Connect to `url`; no I/O until first use.

        The URL's port is the port of the protocol the client speaks: with `prefer_grpc`, gRPC
        (the server's service.grpc_port; qdrant-client would take it as the REST port and speak
        gRPC to 6334 whatever the URL said), else REST. A URL without one, or with Qdrant's
        REST port 6333 (the form Qdrant's docs and Cloud console give), leaves qdrant-client's
        defaults (gRPC 6334, REST 6333). qdrant-client takes its call `timeout` in whole
        seconds: it is rounded up (0.25 -> 1).
        """
        port = urlsplit(url).port
        grpc_port = QDRANT_GRPC_PORT if port in (None, QDRANT_REST_PORT) else port
        client = QdrantClient(
            url=url,
            api_key=api_key,
            prefer_grpc=prefer_grpc,
            grpc_port=grpc_port if prefer_grpc else QDRANT_GRPC_PORT,
            timeout=whole_seconds(timeout),
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
            verdict = server_verdict(exc)
            if verdict == OUTAGE:
                raise IndexUnavailableError(f"Qdrant server unavailable: {exc}") from exc
            if verdict == ANSWERED:  # a refusal: it propagates as it is, the server being up
                exc.breaker_verdict = ANSWERED  # type: ignore[attr-defined]
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
                    raise IndexLayoutError(
                        f"Qdrant collection {self.collection} holds dense vectors of size "
                        f"{size}, the embedding model makes {self.dim}: delete the collection "
                        "(or point QDRANT_COLLECTION at a new one) and re-ingest the documents"
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
            indexes = [
                (name, models.KeywordIndexParams(type=kw, **options))
                for name, options in payload_indexes(hnsw_on_filter_fields=False)
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
        """Refuse a collection written with another point layout; record ours on an old one
        (settle_layout). The layout is recorded in the collection's metadata (LAYOUT_KEY); a
        collection from before that shows it by its first point."""

        def first_payloads() -> list[Any]:
            records, _ = c.scroll(
                self.collection, limit=1, with_payload=[SCOPE_FIELD], with_vectors=False
            )
            return [r.payload for r in records]

        settle_layout(
            (metadata or {}).get(LAYOUT_KEY),
            first_payloads,
            f"Qdrant collection {self.collection}",
            "Delete the collection (or point QDRANT_COLLECTION at a new one) and re-ingest "
            "the documents (`visior ingest PATH... --tenant T`)",
            lambda: c.update_collection(self.collection, metadata={LAYOUT_KEY: LAYOUT_VERSION}),
        )

    # -- the backend (VectorIndex) ---------------------------------------------------------

    def _condition(self, c: FieldMatch) -> models.FieldCondition:
        if len(c.values) == 1:
            return models.FieldCondition(key=c.key, match=models.MatchValue(value=c.values[0]))
        return models.FieldCondition(key=c.key, match=models.MatchAny(any=list(c.values)))

    def _filter_of(self, must: list[Any], must_not: list[Any] | None) -> models.Filter:
        return models.Filter(must=must, must_not=must_not)

    def _sparse_vector(self, v: SparseVector) -> models.SparseVector:
        return models.SparseVector(indices=list(v.indices), values=list(v.values))

    def _nearest(self, vector: Any, using: str) -> Any:
        return vector  # the named vector goes with the request (`using`)

    def _idf_params(self, corpus: models.Filter) -> models.SearchParams:
        return models.SearchParams(idf=models.IdfCorpusParams(corpus=corpus))

    def _point(self, point_id: int, vectors: dict[str, Any], payload: dict[str, Any]) -> Any:
        return models.PointStruct(id=point_id, vector=vectors, payload=payload)

    def _write_points(self, batch: list[Any]) -> None:
        """Returns when the server has applied them."""
        for i in range(0, len(batch), _UPSERT_BATCH):
            self._upsert_part(batch[i : i + _UPSERT_BATCH])

    def _upsert_part(self, part: list[Any]) -> None:
        self._call(lambda c: c.upsert(self.collection, points=part, wait=True))

    def _delete_where(self, filter_: models.Filter) -> None:
        selector = models.FilterSelector(filter=filter_)
        self._call(lambda c: c.delete(self.collection, points_selector=selector, wait=True))

    def _request(
        self,
        query: Any,
        using: str,
        filter_: models.Filter,
        limit: int,
        params: Any,
        *,
        payload: bool,
    ) -> models.QueryRequest:
        return models.QueryRequest(
            query=query,
            using=using,
            filter=filter_,
            limit=limit,
            params=params,
            with_payload=payload,
            with_vector=False,
        )

    def _query_batch(self, requests: list[Any]) -> Sequence[Sequence[Any]]:
        """One query_batch_points call: one round trip."""
        answers = self._call(lambda c: c.query_batch_points(self.collection, requests=requests))
        return [answer.points for answer in answers]

    def _scroll_page(
        self, filter_: models.Filter, offset: Any, limit: int, fields: list[str]
    ) -> tuple[Sequence[Any], Any]:
        return self._call(
            lambda c: c.scroll(
                self.collection,
                scroll_filter=filter_,
                limit=limit,
                offset=offset,
                with_payload=fields,
                with_vectors=False,
            )
        )

    def _count(self, filter_: models.Filter | None) -> int:
        res = self._call(lambda c: c.count(self.collection, count_filter=filter_, exact=True))
        return int(res.count)

    # -- VectorIndex (the rest: qdrant_common) -----------------------------------------------

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
