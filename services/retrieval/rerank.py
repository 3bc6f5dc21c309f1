"""Optional reranking through a rerank HTTP API (TEI ``/rerank`` or Cohere/Jina ``/v1/rerank``)
or a local cross-encoder.

Off unless ``RERANK_MODEL_URL`` or ``RERANK_MODEL_PATH`` is set. Any failure surfaces as
:class:`RerankError`; the engine then keeps the un-reranked order and reports
``rerank_used=false``. No registry package ships cross-encoder weights (docs/architecture.md §18), so the
local model (services/retrieval/local_rerank.py) loads only files the operator provides.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from services.common.http import TRANSIENT_STATUSES, endpoint_url, fetch_capped
from services.common.retry import AttemptFailed, RetryPolicy, run_with_retry
from services.common.settings import SettingsError

API_STYLES = ("tei", "cohere")
MODEL_FILES = ("model.onnx", "onnx/model.onnx")
"""Where the ONNX graph is looked for in RERANK_MODEL_PATH (Hugging Face / Optimum layouts)."""
THREADS_LIMIT = 256
MAX_RESPONSE_BYTES = 1024 * 1024
"""Largest answer body read from a rerank API (200 scores take a few kilobytes); a longer one
is a bad response, the rest never read."""
_RETRY_PAUSE_S = 0.05


class RerankError(Exception):
    """The reranker could not score the candidates; ``reason`` says why.

    Reasons: ``timeout``, ``unavailable`` (connection refused / 5xx after the retry),
    ``rejected`` (a 4xx: bad request, auth, too many texts), ``bad_response`` (the body
    is not the API's shape). ``status`` is the HTTP status when there was one.
    """

    def __init__(self, reason: str, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status

    def __repr__(self) -> str:
        return f"RerankError({self.reason}: {self})"


@dataclass(frozen=True)
class RerankResult:
    """The score of one input text; ``index`` is its position in the request's texts."""

    index: int
    score: float


class Reranker(ABC):
    """Scores texts against a query; results best first, indices into ``texts``.

    `rerank` does what every implementation shares (`call_terms`, `best_first`); a subclass
    scores the texts sent (`_score`): the HTTP API (`RerankClient`) or the local model
    (services/retrieval/local_rerank.py).
    """

    _settings: RerankSettings

    async def rerank(
        self,
        query: str,
        texts: Sequence[str],
        *,
        top_n: int | None = None,
        timeout_s: float | None = None,
    ) -> list[RerankResult]:
        """Scores of the first ``max_candidates`` texts, best first (ties by index).

        ``top_n`` (default: the settings' ``top_n``; 0 = all) caps the results.
        ``timeout_s`` (default: the settings', RERANK_TIMEOUT_S) bounds the whole call;
        pass the caller's remaining deadline here. Raises :class:`RerankError`.
        """
        sent, limit, budget = call_terms(self._settings, texts, top_n, timeout_s)
        if not sent:
            return []
        return best_first(await self._score(query, sent, limit, budget), limit)

    @abstractmethod
    async def _score(
        self, query: str, texts: list[str], limit: int, budget: float
    ) -> list[RerankResult]:
        """Scores of ``texts`` (indices into it; at least the best ``limit`` when it is
        above 0) within ``budget`` seconds, in any order."""


@dataclass(frozen=True)
class RerankSettings:
    """The rerank API or the local model (RERANK_*); off without either."""

    url: str = ""
    """Base URL (``http://tei:8080``; with or without ``/v1`` for the cohere style) or full
    endpoint (``…/rerank``, ``…/v1/rerank``, ``…/v2/rerank``)."""
    api_style: str = "tei"
    """Request shape: ``tei`` (HuggingFace TEI) or ``cohere`` (Cohere, Jina, vLLM, Infinity)."""
    model: str = ""
    """Model name sent in Cohere-style requests (required by Cohere and Jina)."""
    api_key: str = field(default="", repr=False)
    """Sent as ``Authorization: Bearer …``; never logged or shown in repr."""
    timeout_s: float = 2.0
    """Budget for one rerank call, the retry included."""
    top_n: int = 0
    """Results kept after reranking; 0 keeps every candidate sent."""
    max_candidates: int = 50
    """Candidates sent to the reranker at most; the caller keeps the rest in their order."""
    batch_size: int = 32
    """Texts per TEI request (TEI refuses more than its ``--max-client-batch-size``, 32), or
    pairs per local model run (services/retrieval/config.py defaults it to 16 for the local
    model)."""
    model_path: str = ""
    """Directory of a local cross-encoder (ONNX graph + tokenizer.json); excludes ``url``."""
    model_file: str = ""
    """The graph inside ``model_path``; empty = ``model.onnx``, else ``onnx/model.onnx``."""
    max_length: int = 512
    """Local model: tokens per (query, passage) pair, capped by the model's stated limit."""
    threads: int = 0
    """Local model: intra-op threads of one call; 0 = half the usable CPUs, at least 1."""

    @property
    def enabled(self) -> bool:
        """True when a URL or a local model is configured."""
        return bool(self.url or self.model_path)

    def endpoint(self) -> str:
        """The URL requests go to (services.common.http.endpoint_url): the configured one when
        its path ends with ``/rerank``, else its base plus the style's path, ``/rerank`` (tei)
        or ``/v1/rerank`` (cohere, whose base may end with ``/v1``)."""
        path = "/rerank" if self.api_style == "tei" else "/v1/rerank"
        return endpoint_url(self.url, path, full_suffix="/rerank")


def call_terms(
    settings: RerankSettings, texts: Sequence[str], top_n: int | None, timeout_s: float | None
) -> tuple[list[str], int, float]:
    """What one `Reranker.rerank` call works on, for every implementation: the texts sent (the
    first ``max_candidates``), the cap on results (``top_n``, default the settings'; 0 = all)
    and the time budget in seconds (``timeout_s``, default the settings', never negative)."""
    limit = settings.top_n if top_n is None else top_n
    budget = settings.timeout_s if timeout_s is None else timeout_s
    return list(texts[: settings.max_candidates]), limit, max(budget, 0.0)


def best_first(results: list[RerankResult], limit: int) -> list[RerankResult]:
    """`results` by score, best first (ties by index), at most `limit` of them (0 = all)."""
    results.sort(key=lambda r: (-r.score, r.index))
    return results[:limit] if limit > 0 else results


def local_model_files(model_path: str, model_file: str = "") -> tuple[Path, Path]:
    """The ONNX graph and the ``tokenizer.json`` in RERANK_MODEL_PATH.

    The graph is ``model_file`` (relative to the directory) when given, else the first of
    :data:`MODEL_FILES` present; ``tokenizer.json`` is read from the directory, or from the
    graph's own directory. Raises :class:`SettingsError` naming what is missing.
    """
    root = Path(model_path)
    if not root.is_dir():
        raise SettingsError(f"RERANK_MODEL_PATH={model_path!r} is not a directory")
    candidates = [root / model_file] if model_file else [root / name for name in MODEL_FILES]
    graph = next((path for path in candidates if path.is_file()), None)
    if graph is None:
        wanted = " or ".join(str(path) for path in candidates)
        raise SettingsError(f"RERANK_MODEL_PATH={model_path!r}: no ONNX model at {wanted}")
    for tokenizer in (root / "tokenizer.json", graph.parent / "tokenizer.json"):
        if tokenizer.is_file():
            return graph, tokenizer
    raise SettingsError(f"RERANK_MODEL_PATH={model_path!r}: no tokenizer.json in {root}")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _parse_items(items: Any, score_key: str, count: int) -> list[RerankResult]:
    if not isinstance(items, list):
        raise RerankError("bad_response", "expected a list of results")
    out: list[RerankResult] = []
    seen: set[int] = set()
    for item in items:
        if not isinstance(item, dict):
            raise RerankError("bad_response", "a result is not an object")
        index, score = item.get("index"), _number(item.get(score_key))
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            raise RerankError("bad_response", f"result index {index!r} is out of range")
        if score is None:
            raise RerankError("bad_response", f"result {index} has no numeric {score_key}")
        if index in seen:
            raise RerankError("bad_response", f"result index {index} is repeated")
        seen.add(index)
        out.append(RerankResult(index, score))
    return out


def _error_text(content: bytes) -> str:
    """The API's own error message (TEI ``error``, Cohere ``message``, Jina ``detail``)."""
    try:
        body = json.loads(content)
    except ValueError:
        return content[:200].decode("utf-8", "replace")
    if isinstance(body, dict):
        for key in ("error", "message", "detail"):
            if key in body:
                return str(body[key])[:200]
    return str(body)[:200]


class _Unavailable(AttemptFailed):
    """The reranker could not be reached or gave a transient answer (TRANSIENT_STATUSES):
    the one failure retried."""

    def __init__(self, error: RerankError) -> None:
        super().__init__(str(error), retry=True)
        self.error = error


class RerankClient(Reranker):
    """A :class:`Reranker` over HTTP; one retry on 5xx and connection errors, within a budget."""

    def __init__(self, settings: RerankSettings, http: httpx.AsyncClient | None = None) -> None:
        if not settings.url:
            raise ValueError("RerankClient needs RerankSettings.url")
        self._settings = settings
        self._endpoint = settings.endpoint()
        self._owns_http = http is None
        self._http = http or httpx.AsyncClient()
        self._headers = {"Content-Type": "application/json"}
        if settings.api_key:
            self._headers["Authorization"] = f"Bearer {settings.api_key}"

    @property
    def settings(self) -> RerankSettings:
        """The settings this client was built with."""
        return self._settings

    async def aclose(self) -> None:
        """Close the HTTP client if this object created it."""
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> RerankClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _score(
        self, query: str, texts: list[str], limit: int, budget: float
    ) -> list[RerankResult]:
        """The budget covers the retry and any TEI batches."""
        deadline = time.monotonic() + budget
        if self._settings.api_style != "tei":
            return await self._call_cohere(query, texts, limit, deadline)
        size = self._settings.batch_size
        batches = [(start, texts[start : start + size]) for start in range(0, len(texts), size)]
        parts = await asyncio.gather(
            *(self._call_tei(query, batch, start, deadline) for start, batch in batches)
        )
        return [r for part in parts for r in part]

    async def _call_tei(
        self, query: str, texts: list[str], offset: int, deadline: float
    ) -> list[RerankResult]:
        body = {"query": query, "texts": texts, "raw_scores": False, "truncate": True}
        data = await self._post(body, deadline)
        results = _parse_items(data, "score", len(texts))
        if len(results) != len(texts):
            raise RerankError("bad_response", f"{len(results)} scores for {len(texts)} texts")
        return [RerankResult(r.index + offset, r.score) for r in results]

    async def _call_cohere(
        self, query: str, texts: list[str], top_n: int, deadline: float
    ) -> list[RerankResult]:
        body: dict[str, Any] = {"query": query, "documents": texts}
        if self._settings.model:
            body["model"] = self._settings.model
        body["top_n"] = min(top_n, len(texts)) if top_n > 0 else len(texts)
        data = await self._post(body, deadline)
        if not isinstance(data, dict) or "results" not in data:
            raise RerankError("bad_response", "expected an object with 'results'")
        results = _parse_items(data["results"], "relevance_score", len(texts))
        if len(results) < min(body["top_n"], len(texts)):
            raise RerankError("bad_response", f"{len(results)} results for top_n={body['top_n']}")
        return results

    async def _post(self, body: dict[str, Any], deadline: float) -> Any:
        """POST with one retry on connection errors and transient answers (TRANSIENT_STATUSES),
        when the pause fits the budget; the JSON body on 2xx."""
        started = time.monotonic()
        if deadline <= started:
            raise RerankError("timeout", "no time left to call the reranker")
        policy = RetryPolicy(
            attempts=2, first_delay_s=_RETRY_PAUSE_S, deadline_s=deadline - started
        )
        try:
            data, _ = await run_with_retry(
                lambda: self._attempt(body, deadline),
                policy,
                retry_on=_Unavailable,
                started=started,
            )
        except _Unavailable as failed:
            raise failed.error from None
        return data

    async def _attempt(self, body: dict[str, Any], deadline: float) -> Any:
        remaining = deadline - time.monotonic()
        try:
            async with asyncio.timeout(remaining):
                answer = await fetch_capped(
                    self._http,
                    "POST",
                    self._endpoint,
                    cap=MAX_RESPONSE_BYTES,
                    json=body,
                    headers=self._headers,
                    timeout=remaining,
                )
        except (TimeoutError, httpx.TimeoutException):
            raise RerankError("timeout", "the reranker did not answer in time") from None
        except httpx.TransportError as exc:
            raise _Unavailable(
                RerankError("unavailable", f"cannot reach the reranker: {type(exc).__name__}")
            ) from None
        except httpx.DecodingError:
            raise RerankError("bad_response", "the reranker's answer does not decode") from None
        status, content = answer.status, answer.body
        said = "its answer is too large" if content is None else _error_text(content)
        if status >= 500 or status == 429:
            error = RerankError("unavailable", f"reranker answered {status}: {said}", status=status)
            if status in TRANSIENT_STATUSES:
                raise _Unavailable(error)
            raise error
        if status >= 400:
            raise RerankError(
                "rejected",
                f"reranker refused the request ({status}): {said}",
                status=status,
            )
        if content is None:
            raise RerankError("bad_response", "the reranker's answer is too large")
        try:
            return json.loads(content)
        except ValueError:
            raise RerankError("bad_response", "the reranker's answer is not JSON") from None
