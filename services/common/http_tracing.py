"""CLIENT spans of the HTTP calls a service makes (model runtime, embeddings, rerank, the
bank, Tavily): httpx transports that wrap the real one.

Only built when tracing is on (`traced_async_client` / `traced_client` return plain
clients otherwise), so nothing here runs or imports opentelemetry by default. A span is
named by the HTTP method (OpenTelemetry's HTTP conventions, no route template known) and
carries `http.request.method`, `server.address`, `server.port`, `url.full` (without query,
fragment or credentials: they may hold keys), `http.response.status_code`, `error.type`
(the status code from 400 up, or the exception's class), `visior.peer` (what the service
is: "llm-runtime", "cbr", ...) and `visior.trace_id`. It lasts until the response body is
read or closed, so a streamed answer (SSE) is timed whole.

`propagate` sends the span's W3C `traceparent` with the request: for the operator's own
services (runtime, embeddings, reranker), not for third parties (the bank, Tavily), who
have no use for the mesh's trace ids.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import httpx

from services.common.context import current_trace_id
from services.common.tracing import TRACEPARENT_METADATA_KEY, ClientSpan, Tracing


def _safe_url(url: httpx.URL) -> str:
    return str(url.copy_with(query=None, fragment=None, username=None, password=None))


def _start(tracing: Tracing, request: httpx.Request, peer: str, propagate: bool) -> ClientSpan:
    url = request.url
    span = tracing.start_span(
        request.method,
        current_trace_id(),
        {
            "http.request.method": request.method,
            "server.address": url.host,
            "server.port": url.port or (443 if url.scheme == "https" else 80),
            "url.full": _safe_url(url),
            "visior.peer": peer,
        },
    )
    if propagate:
        request.headers[TRACEPARENT_METADATA_KEY] = span.traceparent
    return span


def _end_status(span: ClientSpan, status: int, error_type: str | None = None) -> None:
    """End the span of a response whose status arrived: an error from 400 up, or when
    reading its body failed (`error_type`). Once: a later end is ignored."""
    if not span.ended:
        span.set_attribute("http.response.status_code", status)
    span.finish(error_type or (str(status) if status >= 400 else None))


class _AsyncStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, span: ClientSpan, status: int) -> None:
        self._inner = inner
        self._span = span
        self._status = status

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                yield chunk
        except GeneratorExit:
            # Abandoned by its reader (the runtime stops at "[DONE]"): no verdict on the
            # call; aclose() ends the span.
            raise
        except BaseException as exc:
            _end_status(self._span, self._status, type(exc).__name__)
            raise

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            _end_status(self._span, self._status)


class _SyncStream(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, span: ClientSpan, status: int) -> None:
        self._inner = inner
        self._span = span
        self._status = status

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._inner
        except GeneratorExit:  # abandoned by its reader: close() ends the span
            raise
        except BaseException as exc:
            _end_status(self._span, self._status, type(exc).__name__)
            raise

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            _end_status(self._span, self._status)


class _Traced:
    """What both transports hold: the wrapped one and how its requests are traced."""

    def __init__(self, inner: Any, tracing: Tracing, *, peer: str, propagate: bool) -> None:
        self._inner = inner
        self._tracing = tracing
        self._peer = peer
        self._propagate = propagate

    def _span(self, request: httpx.Request) -> ClientSpan:
        return _start(self._tracing, request, self._peer, self._propagate)

    @staticmethod
    @contextlib.contextmanager
    def _until_response(span: ClientSpan) -> Iterator[None]:
        """No response: the exception names the failure and ends the span."""
        try:
            yield
        except BaseException as exc:
            span.finish(type(exc).__name__)
            raise


class TracedAsyncTransport(_Traced, httpx.AsyncBaseTransport):
    """An async transport whose every request is a CLIENT span."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        span = self._span(request)
        with self._until_response(span):
            response = await self._inner.handle_async_request(request)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _AsyncStream(response.stream, span, response.status_code)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


class TracedTransport(_Traced, httpx.BaseTransport):
    """A sync transport whose every request is a CLIENT span (the remote embedder's)."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        span = self._span(request)
        with self._until_response(span):
            response = self._inner.handle_request(request)
        assert isinstance(response.stream, httpx.SyncByteStream)
        response.stream = _SyncStream(response.stream, span, response.status_code)
        return response

    def close(self) -> None:
        self._inner.close()


_C = TypeVar("_C", httpx.Client, httpx.AsyncClient)


def _wrap_transports(client: _C, wrap: Callable[[Any], Any]) -> _C:
    """`client` with its own transports wrapped: the default one and each mount's (proxies
    from the environment, `proxy=`, `verify`, `limits` all kept). Passing `transport=` to
    the constructor instead would make httpx skip HTTP(S)_PROXY / ALL_PROXY."""
    client._transport = wrap(client._transport)
    client._mounts = {k: None if t is None else wrap(t) for k, t in client._mounts.items()}
    return client


def _traced(
    client: _C, transport: type[_Traced], tracing: Tracing | None, peer: str, propagate: bool
) -> _C:
    if tracing is None:
        return client
    return _wrap_transports(client, lambda t: transport(t, tracing, peer=peer, propagate=propagate))


def traced_async_client(
    tracing: Tracing | None, *, peer: str, propagate: bool, **kwargs: Any
) -> httpx.AsyncClient:
    """httpx.AsyncClient(**kwargs), its requests CLIENT spans when `tracing` is given."""
    return _traced(httpx.AsyncClient(**kwargs), TracedAsyncTransport, tracing, peer, propagate)


def traced_client(
    tracing: Tracing | None, *, peer: str, propagate: bool, **kwargs: Any
) -> httpx.Client:
    """httpx.Client(**kwargs), its requests CLIENT spans when `tracing` is given."""
    return _traced(httpx.Client(**kwargs), TracedTransport, tracing, peer, propagate)
