"""Qdrant Edge backend: the embedded, in-process default index (one shard directory)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import qdrant_edge as qe

from services.retrieval.index.base import (
    DENSE_VECTOR,
    LAYOUT_VERSION,
    SCOPE_FIELD,
    SPARSE_VECTOR,
    FieldMatch,
    IndexLayoutError,
    IndexLockedError,
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
_CONFIG_FILE = "edge_config.json"
LAYOUT_FILE = "visior_layout.json"
"""Written into the shard directory: {"layout_version": LAYOUT_VERSION}."""
_UPSERT_BATCH = 512


def _edge_config(
    dim: int,
    hnsw: qe.HnswIndexConfig,
    max_search_threads: int | None,
    quantization: str,
    indexing_threshold_kb: int | None,
) -> qe.EdgeConfig:
    """A shard's configuration (EdgeIndex's arguments of the same names)."""
    return qe.EdgeConfig(
        vectors={DENSE_VECTOR: qe.EdgeVectorParams(size=dim, distance=qe.Distance.Cosine)},
        sparse_vectors={SPARSE_VECTOR: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
        hnsw_config=hnsw,
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


def _open_shard(path: str, config: qe.EdgeConfig, exists: bool) -> qe.EdgeShard:
    """Load the shard at `path` (`exists`) or create it; IndexLockedError when another
    owner has it open, IndexLayoutError when its vectors are of another size than `config`'s
    (another embedding model), IndexUnavailableError when it cannot be opened or created."""
    try:
        if exists:
            return qe.EdgeShard.load(path, config)
        os.makedirs(path, exist_ok=True)
        return qe.EdgeShard.create(path, config)
    except Exception as exc:
        msg = str(exc)
        if "WAL" in msg or "WouldBlock" in msg or "lock" in msg.lower():
            raise IndexLockedError(
                f"Qdrant Edge shard {path} is already open (in this or another "
                f"process); an Edge shard belongs to one process: {msg}"
            ) from exc
        if "incompatible" in msg.lower():
            raise IndexLayoutError(
                f"Qdrant Edge shard {path} was written with another vector configuration "
                f"({msg}); delete the index directory and re-ingest the documents"
            ) from exc
        verb = "open" if exists else "create"
        raise IndexUnavailableError(f"cannot {verb} Edge shard {path}: {msg}") from exc


def _write_marker(marker: str) -> None:
    """Record LAYOUT_VERSION in the shard directory (durably, then atomically)."""
    tmp = f"{marker}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"layout_version": LAYOUT_VERSION}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, marker)


class EdgeIndex(VectorIndex):
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
        config = _edge_config(
            dim,
            qe.HnswIndexConfig(
                m=hnsw_m,
                ef_construct=hnsw_ef_construct,
                full_scan_threshold=10_000,
                payload_m=hnsw_payload_m,
            ),
            max_search_threads,
            quantization,
            indexing_threshold_kb,
        )
        exists = os.path.exists(os.path.join(self.path, _CONFIG_FILE))
        self._shard: qe.EdgeShard | None = _open_shard(self.path, config, exists)
        try:
            self._check_layout(created=not exists)
            self._ensure_payload_indexes()
        except Exception:
            self.close()
            raise

    # -- internals -------------------------------------------------------------------------

    def _check_layout(self, *, created: bool) -> None:
        """Refuse a shard written with another point layout; record ours in a new one
        (settle_layout). The layout is recorded in LAYOUT_FILE; a shard from before that file
        existed shows it by its first point."""
        marker = os.path.join(self.path, LAYOUT_FILE)
        recorded: object = None
        has_marker = not created and os.path.exists(marker)
        if has_marker:
            try:
                with open(marker, encoding="utf-8") as f:
                    recorded = json.load(f).get("layout_version")
            except (OSError, ValueError, AttributeError) as exc:
                raise IndexLayoutError(
                    f"Edge shard {self.path}: unreadable {LAYOUT_FILE} ({exc}); "
                    "delete the index directory and re-ingest the documents"
                ) from exc

        def first_payloads() -> list[Any]:
            if created or has_marker:  # nothing written before layouts were recorded
                return []
            req = qe.ScrollRequest(limit=1, with_payload=[SCOPE_FIELD], with_vector=False)
            return [r.payload for r in self._scroll(req)[0]]

        settle_layout(
            recorded,
            first_payloads,
            f"Edge shard {self.path}",
            "Delete the index directory (RETR_INDEX_PATH) and re-ingest the documents (the "
            "document store keeps them: `visior ingest PATH... --tenant T`)",
            lambda: _write_marker(marker),
        )

    def _ensure_payload_indexes(self) -> None:
        have = set(self._call(lambda s: s.info().payload_schema))
        for name, options in payload_indexes(self._hnsw_on_filter_fields):
            if name not in have:
                params = qe.KeywordIndexParams(**options)
                self._update(qe.UpdateOperation.create_field_index(name, params))

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

    # -- the backend (VectorIndex) ---------------------------------------------------------

    def _condition(self, c: FieldMatch) -> qe.FieldCondition:
        if len(c.values) == 1:
            return qe.FieldCondition(c.key, match=qe.MatchValue(c.values[0]))
        return qe.FieldCondition(c.key, match=qe.MatchAny(list(c.values)))

    def _filter_of(self, must: list[Any], must_not: list[Any] | None) -> qe.Filter:
        return qe.Filter(must=must, must_not=must_not)

    def _sparse_vector(self, v: SparseVector) -> qe.SparseVector:
        return qe.SparseVector(list(v.indices), list(v.values))

    def _nearest(self, vector: Any, using: str) -> Any:
        return qe.Query.Nearest(vector, using=using)

    def _idf_params(self, corpus: qe.Filter) -> qe.SearchParams:
        return qe.SearchParams(idf=qe.IdfParams(corpus=corpus))

    def _point(self, point_id: int, vectors: dict[str, Any], payload: dict[str, Any]) -> Any:
        return qe.Point(point_id, vectors, payload)

    def _write_points(self, batch: list[Any]) -> None:
        """In the WAL when it returns (survives a process crash)."""
        with self._writing():
            for i in range(0, len(batch), _UPSERT_BATCH):
                self._update(qe.UpdateOperation.upsert_points(batch[i : i + _UPSERT_BATCH]))

    def _delete_where(self, filter_: qe.Filter) -> None:
        op = qe.UpdateOperation.delete_points_by_filter(filter_)
        with self._writing():
            self._update(op)

    def _request(
        self,
        query: Any,
        using: str,
        filter_: qe.Filter,
        limit: int,
        params: Any,
        *,
        payload: bool,
    ) -> qe.QueryRequest:
        # `using` is in the query (qe.Query.Nearest).
        return qe.QueryRequest(
            limit=limit,
            query=query,
            filter=filter_,
            with_payload=payload,
            with_vector=False,
            params=params,
        )

    def _query_batch(self, requests: list[Any]) -> Sequence[Sequence[Any]]:
        """One `query_batch`: one planned pass over the segments."""
        return self._call(lambda s: s.query_batch(qe.QueryBatchRequest(requests)))

    def _scroll_page(
        self, filter_: qe.Filter, offset: Any, limit: int, fields: list[str]
    ) -> tuple[Sequence[Any], Any]:
        req = qe.ScrollRequest(
            offset=offset, limit=limit, filter=filter_, with_payload=fields, with_vector=False
        )
        return self._scroll(req)

    def _count(self, filter_: qe.Filter | None) -> int:
        return self._call(lambda s: s.count(qe.CountRequest(exact=True, filter=filter_)))

    # -- VectorIndex (the rest: qdrant_common) -----------------------------------------------

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
