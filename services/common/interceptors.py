"""Server and client interceptors: errors -> google.rpc.Status, trace ids, deadlines, logs, metrics."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from services.common import errors
from services.common.context import (
    TRACE_METADATA_KEY,
    call_timeout,
    check_trace_id,
    current_trace_id,
    deadline_var,
    new_trace_id,
    trace_id_var,
    valid_trace_id,
)
from services.common.draining import RunningCalls
from services.common.handlers import wrapped
from services.common.logging import bind_request_id, bind_trace_id
from services.common.metrics import ClientRpcMetrics, RpcKey, RpcMetrics, split_method
from services.common.retry import AttemptFailed, RetryPolicy, run_with_retry
from services.common.status import to_status
from services.common.tracing import TRACEPARENT_METADATA_KEY, parse_traceparent, traceparent_var

if TYPE_CHECKING:  # pragma: no cover
    from services.common.tracing import ClientSpan, ServerSpan, Tracing

log = logging.getLogger("visior.rpc")

# A caller deadline further away than this counts as "no deadline" (grpc#26236: without a
# deadline, time_remaining() returns a huge number).
_NO_DEADLINE_SECONDS = 24 * 3600.0


_RECORDING: set[asyncio.Future[None]] = set()
"""The client streams' metric and span recordings still running."""
UNCAPPED_METHODS = frozenset({"GetHealth"})
"""Methods the concurrency cap never refuses (besides grpc.health and reflection)."""
REQUEST_ID_METADATA_KEY = "x-request-id"
"""The id Envoy gives every JSON request (the caller's own when it sent one) and logs in its
access log: the service's log lines carry it as `request_id`, which joins the two."""
_MAX_REQUEST_ID_CHARS = 128


def _trace_metadata(metadata: Any) -> tuple[str, str, str]:
    """(x-trace-id, traceparent, x-request-id) of the call's metadata ('' when absent)."""
    found = {TRACE_METADATA_KEY: "", TRACEPARENT_METADATA_KEY: "", REQUEST_ID_METADATA_KEY: ""}
    for item in metadata or ():
        if item[0] in found:
            value = item[1]
            found[item[0]] = value.decode() if isinstance(value, bytes) else str(value)
    request_id = found[REQUEST_ID_METADATA_KEY]
    if len(request_id) > _MAX_REQUEST_ID_CHARS or not request_id.isprintable():
        request_id = ""  # a caller's own id is logged only when it is a short printable one
    return found[TRACE_METADATA_KEY], found[TRACEPARENT_METADATA_KEY], request_id


def _trace_of_traceparent(traceparent: str) -> str:
    """The 32-hex trace id of a valid W3C traceparent, else ''."""
    parsed = parse_traceparent(traceparent) if traceparent else None
    return f"{parsed[0]:032x}" if parsed else ""


class _Undecodable:
    """Stands in for a request whose bytes are not a valid message, so the wrapped handler
    refuses it as the caller's error: grpc.aio would answer a deserializer's exception with
    UNKNOWN "Unexpected <class DecodeError>" (HTTP 500 through Envoy)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # DecodeError: malformed bytes, bad UTF-8, nested too deep
            return _Undecodable(str(exc))

    return deserialize


_B = TypeVar("_B")


def _as_is(behavior: _B) -> _B:
    return behavior


class ServerInterceptor(grpc.aio.ServerInterceptor):
    """Wraps every handler: sets trace id and deadline context, maps errors, logs, counts,
    and with `tracing` (None = off) opens a SERVER span per RPC.

    With `max_concurrent_rpcs`, a call of the service's own RPCs that would make more in
    flight is refused with RESOURCE_EXHAUSTED SERVER_BUSY, which carries an ErrorInfo and is
    counted like any other answer. Health and reflection are exempt: grpc's own
    `maximum_concurrent_rpcs` counted them too, so a busy server failed its liveness probe.
    Once the server begins to stop (`draining`), its own GetHealth fails as grpc.health does.
    With `calls`, each handler of the server's own services is kept there while it runs, so
    the stop can end it with DRAINING (services.common.draining).
    """

    def __init__(
        self,
        domain: str,
        metrics: RpcMetrics,
        tracing: Tracing | None = None,
        max_concurrent_rpcs: int | None = None,
        calls: RunningCalls | None = None,
    ) -> None:
        self._domain = domain
        self._calls = calls
        self._metrics = metrics
        self._tracing = tracing
        self._max_in_flight = max_concurrent_rpcs
        self._in_flight = 0
        self.draining = False
        """Set when the server begins to stop (RunningServer.stop): a service's own GetHealth
        answers UNAVAILABLE DRAINING (502 over JSON) while the calls in flight finish."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        service, name = split_method(method)
        if service.startswith("grpc."):  # health and reflection: no logs, no wrapping
            return handler
        meta_trace, traceparent, request_id = _trace_metadata(
            handler_call_details.invocation_metadata
        )
        trace = (meta_trace, traceparent, request_id)
        calls = self._calls
        keep_unary = calls.kept_unary if calls is not None else _as_is
        keep_stream = calls.kept_stream if calls is not None else _as_is
        return wrapped(
            handler,
            lambda b: self._wrap_unary(keep_unary(b), (service, name, "unary"), trace),
            lambda b: self._wrap_stream(keep_stream(b), (service, name, "server_stream"), trace),
            _tolerant(handler.request_deserializer),
        )

    def _enter(
        self,
        request: Any,
        context: grpc.aio.ServicerContext,
        meta_trace: str,
        request_id: str,
        traceparent: str = "",
    ) -> None:
        if request_id:
            bind_request_id(request_id)
        if isinstance(request, _Undecodable):
            bind_trace_id(new_trace_id())
            raise errors.InvalidArgumentError(f"the request could not be decoded: {request.reason}")
        # A trace id travels in metadata and logs: a bad one in the request is the caller's
        # error; a bad one in metadata is ignored (a fresh one is generated).
        body_trace = getattr(request, "trace_id", "")
        if body_trace and not valid_trace_id(body_trace):
            bind_trace_id(new_trace_id())  # so the refusal is logged under some id
            check_trace_id(body_trace)
        usable = meta_trace if meta_trace and valid_trace_id(meta_trace) else ""
        # A W3C caller's trace id names the request, also over an x-trace-id no trace id can
        # be (ignored, and said so below).
        usable = usable or (_trace_of_traceparent(traceparent) if traceparent else "")
        trace = body_trace or usable or new_trace_id()
        if hasattr(request, "trace_id") and not request.trace_id:
            request.trace_id = trace
        bind_trace_id(trace)
        if meta_trace and not valid_trace_id(meta_trace) and not body_trace:
            log.info(
                "x-trace-id ignored: not a trace id (1-128 of A-Z a-z 0-9 . _ : -)",
                extra={"x_trace_id": meta_trace[:128]},
            )
        remaining = context.time_remaining()
        deadline_var.set(
            None
            if remaining is None or remaining > _NO_DEADLINE_SECONDS
            else time.monotonic() + remaining
        )

    def _admit(self, name: str) -> bool:
        """Take one of the `max_concurrent_rpcs` places (True), else refuse the call (the
        caller's `_Rpc` gives the place back when the call ends). A service's own GetHealth
        takes none: the sidecar's readiness probe asks it (GET /health), and a busy replica
        must still answer it."""
        if name in UNCAPPED_METHODS:
            if self.draining:
                # The JSON /health a balancer probes says what grpc.health already says.
                raise errors.UnavailableError(
                    "the server is shutting down: ask another replica", reason=errors.DRAINING
                )
            return False
        cap = self._max_in_flight
        if cap is not None and self._in_flight >= cap:
            raise errors.ResourceExhaustedError(
                f"the server is handling its limit of {cap} concurrent calls; retry later",
                reason=errors.SERVER_BUSY,
                metadata=errors.limit_metadata(cap, name=errors.BUSY_LIMIT_NAME),
            )
        self._in_flight += 1
        return True

    def _failure(self, exc: BaseException, method: str) -> tuple[grpc.StatusCode, str, Any]:
        """The status an exception becomes: code, details and trailing metadata (an unexpected
        exception is logged with its traceback and becomes a generic INTERNAL)."""
        if isinstance(exc, errors.ServiceError):
            err = exc
            if err.code in (errors.INTERNAL, errors.UNKNOWN):
                log.error("rpc failed: %s", err, extra={"method": method, "reason": err.reason})
        else:
            log.exception("unhandled error", extra={"method": method})
            err = errors.as_service_error(exc, trace_id_var.get())
        status = to_status(err, self._domain)
        # The failed call's trace id, for a caller who sent none to quote to an operator
        # (over JSON, Envoy makes it a response header).
        trailing = (*status.trailing_metadata, (TRACE_METADATA_KEY, trace_id_var.get() or ""))
        if err.code == errors.UNAVAILABLE:
            # The handler ran and already retried its own dependency: a negative pushback
            # tells the caller's transparent retry (channels.py) not to run it again, so a
            # hung model costs Respond one runtime timeout, not three.
            trailing += (("grpc-retry-pushback-ms", "-1"),)
        return status.code, status.details, trailing

    def _span(self, service: str, name: str, traceparent: str) -> ServerSpan | None:
        """The RPC's span, opened once _enter has set the trace id (tracing on only)."""
        if self._tracing is None:
            return None
        return self._tracing.start_server_span(service, name, trace_id_var.get(), traceparent)

    def _finish(
        self,
        service: str,
        name: str,
        kind: str,
        code: grpc.StatusCode,
        started: float,
        span: ServerSpan | None,
    ) -> None:
        elapsed = time.perf_counter() - started
        self._metrics.done((service, name, kind), code.name, elapsed)
        level = logging.INFO if code == grpc.StatusCode.OK else logging.WARNING
        log.log(  # before the span ends: the line carries its span_id
            level,
            "rpc",
            extra={
                "method": f"{service}/{name}",
                "code": code.name,
                "latency_ms": round(elapsed * 1000, 2),
            },
        )
        if span is not None:
            span.end(code.name, code.value[0])

    def _wrap_unary(
        self, behavior: Callable[..., Awaitable[Any]], rpc: RpcKey, trace: tuple[str, str, str]
    ) -> Callable[..., Awaitable[Any]]:
        async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
            async with _Rpc(self, context, rpc) as scope:
                scope.enter(request, trace)
                return await behavior(request, context)

        return wrapper

    def _wrap_stream(
        self, behavior: Callable[..., AsyncIterator[Any]], rpc: RpcKey, trace: tuple[str, str, str]
    ) -> Callable[..., AsyncIterator[Any]]:
        async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async with _Rpc(self, context, rpc) as scope:
                scope.enter(request, trace)
                stream = behavior(request, context)
                try:
                    async for item in stream:
                        yield item
                finally:
                    # When the caller goes away, grpc closes this generator (GeneratorExit at
                    # the yield); the handler's own generator is closed now, not whenever the
                    # collector finds it, so its cleanup runs while the call is still counted.
                    aclose = getattr(stream, "aclose", None)
                    if aclose is not None:
                        await aclose()

        return wrapper


class _Rpc:
    """One RPC (service, name, kind) from start to finish, unary or streamed: trace id and
    deadline (`enter`), a place among the server's concurrent calls, span, metrics and the
    "rpc" line; an exception becomes the caller's status. A class, not @asynccontextmanager:
    it runs on every call (~2 µs less)."""

    __slots__ = ("_admitted", "_context", "_owner", "_rpc", "_span", "_started")

    def __init__(
        self, owner: ServerInterceptor, context: grpc.aio.ServicerContext, rpc: RpcKey
    ) -> None:
        self._owner = owner
        self._context = context
        self._rpc = rpc
        self._span: ServerSpan | None = None
        self._admitted = False

    async def __aenter__(self) -> _Rpc:
        self._started = time.perf_counter()
        self._owner._metrics.start(self._rpc)
        return self

    def enter(self, request: Any, trace: tuple[str, str, str]) -> None:
        """Bind the request's trace id and deadline, then open its span (even when the
        request is refused here: the refusal is traced too)."""
        meta_trace, traceparent, request_id = trace
        try:
            self._owner._enter(request, self._context, meta_trace, request_id, traceparent)
            self._admitted = self._owner._admit(self._rpc[1])
        finally:
            self._span = self._owner._span(self._rpc[0], self._rpc[1], traceparent)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> bool:
        service, name, kind = self._rpc
        code = grpc.StatusCode.OK
        finished = False
        if self._admitted:
            self._admitted = False
            self._owner._in_flight -= 1
        try:
            if isinstance(exc, grpc.aio.AbortError):
                code = self._context.code() or grpc.StatusCode.UNKNOWN  # type: ignore[assignment]
            elif isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
                # grpc cancels a handler whose caller went away or whose deadline passed, and
                # closes a stream's generator (GeneratorExit) when it cannot write to the caller.
                code = self._ended_code()
            elif isinstance(exc, Exception):
                code = _code_of(exc)
                status, details, trailing = self._owner._failure(exc, f"{service}/{name}")
                # Counted, logged and its span ended before the status leaves: a caller that
                # holds its error finds the call in the metrics and the trace, as after a success.
                self._owner._finish(service, name, kind, code, self._started, self._span)
                finished = True
                await self._context.abort(status, details, trailing)
                raise AssertionError("abort returned")  # pragma: no cover
            return False
        finally:
            if not finished:
                self._owner._finish(service, name, kind, code, self._started, self._span)

    def _ended_code(self) -> grpc.StatusCode:
        """The status of a call grpc ended under the handler: DEADLINE_EXCEEDED once the
        caller's deadline has passed (time_remaining() is then 0), else CANCELLED (the caller
        cancelled; time_remaining() is None without a deadline)."""
        remaining = self._context.time_remaining()
        if remaining is not None and remaining <= 0:
            return grpc.StatusCode.DEADLINE_EXCEEDED
        return grpc.StatusCode.CANCELLED


_CODES_BY_NUMBER = {c.value[0]: c for c in grpc.StatusCode}


def _code_of(exc: BaseException) -> grpc.StatusCode:
    if isinstance(exc, errors.ServiceError):
        return _CODES_BY_NUMBER.get(exc.code, grpc.StatusCode.INTERNAL)
    return grpc.StatusCode.INTERNAL


class _ClientDetails(grpc.aio.ClientCallDetails):
    pass


def _client_span(
    tracing: Tracing | None, details: grpc.aio.ClientCallDetails, target: str
) -> ClientSpan | None:
    if tracing is None:
        return None
    service, method = split_method(details.method)
    return tracing.start_client_span(service, method, current_trace_id(), target)


def _with_context(
    details: grpc.aio.ClientCallDetails, default_timeout: float, span: ClientSpan | None = None
) -> Any:
    """The call's details with the trace id, traceparent and deadline in. Raises
    DeadlineExceededError (ending `span` so) when the caller's deadline has passed."""
    metadata = grpc.aio.Metadata(*(details.metadata or ()))
    trace = current_trace_id()
    if trace and TRACE_METADATA_KEY not in metadata:
        metadata.add(TRACE_METADATA_KEY, trace)
    # The call's own span, else the span being served ('' when tracing is off).
    parent = span.traceparent if span is not None else traceparent_var.get()
    if parent and TRACEPARENT_METADATA_KEY not in metadata:
        metadata.add(TRACEPARENT_METADATA_KEY, parent)
    timeout = call_timeout(details.timeout if details.timeout is not None else default_timeout)
    if timeout <= 0:
        if span is not None:
            span.end(
                grpc.StatusCode.DEADLINE_EXCEEDED.name,
                _code_number(grpc.StatusCode.DEADLINE_EXCEEDED),
            )
        raise errors.DeadlineExceededError("the caller's deadline passed before this call")
    return _ClientDetails(
        details.method, timeout, metadata, details.credentials, details.wait_for_ready
    )


def _code_number(code: grpc.StatusCode) -> int:
    return int(code.value[0])


class _ClientContext:
    """What both client interceptors hold: the default deadline, the client metrics and
    the tracing (None: off) of one channel to `target`."""

    def __init__(
        self,
        default_timeout: float,
        metrics: ClientRpcMetrics | None = None,
        tracing: Tracing | None = None,
        target: str = "",
    ) -> None:
        self._timeout = default_timeout
        self._metrics = metrics
        self._tracing = tracing
        self._target = target


_UNREACHED = "failed to connect to all addresses"
"""How grpc-core begins the UNAVAILABLE of a call no connection could carry."""
UNREACHED_PAUSE_S = 0.2
"""The first pause before a call that reached no server is sent again (doubling after)."""


class _Unreached(AttemptFailed):
    """A call that reached no server, finished: the one its caller gets if it is the last."""

    def __init__(self, call: Any) -> None:
        super().__init__("the call reached no server", retry=True)
        self.call = call


def _unreached(exc: grpc.aio.AioRpcError) -> bool:
    """A call that never left this client: no connection to the server could be made."""
    return exc.code() == grpc.StatusCode.UNAVAILABLE and (exc.details() or "").startswith(
        _UNREACHED
    )


class ClientContextInterceptor(_ClientContext, grpc.aio.UnaryUnaryClientInterceptor):
    """Puts the trace id (and, when tracing, the W3C traceparent) in metadata and a deadline
    (clamped to the caller's) on every unary call; with `metrics`, counts and times it; with
    `tracing`, makes a CLIENT span of it (`target` names the server in it).

    A call the channel's retry policy does not cover (`retried`: "/pkg.Service/Method"
    names, or "/pkg.Service/" for all of a service's) that reached no server (a neighbour
    restarting) is sent again, up to `attempts` in all within its deadline: it never left
    this client, so no handler ran. Any other failure is the caller's to see.

    grpc.aio files an interceptor under its first matching kind only (unary-unary before
    unary-stream), so server-streaming calls need their own: ClientStreamContextInterceptor.
    """

    def __init__(
        self,
        default_timeout: float,
        metrics: ClientRpcMetrics | None = None,
        tracing: Tracing | None = None,
        target: str = "",
        *,
        attempts: int = 1,
        retried: Collection[str] = (),
    ) -> None:
        super().__init__(default_timeout, metrics, tracing, target)
        self._attempts = attempts
        self._retried = tuple(retried)

    def _covered(self, method: str | bytes) -> bool:
        method = method.decode() if isinstance(method, bytes) else method
        return any(
            method.startswith(name) if name.endswith("/") else method == name
            for name in self._retried
        )

    async def _send(self, continuation, details, request):  # type: ignore[no-untyped-def]
        """The call, sent again while it reaches no server (see the class docstring)."""
        if self._attempts <= 1 or self._covered(details.method):
            return await continuation(details, request)
        deadline = time.monotonic() + details.timeout

        async def attempt() -> Any:
            timeout = deadline - time.monotonic()
            call = await continuation(
                _ClientDetails(
                    details.method, timeout, details.metadata, details.credentials,
                    details.wait_for_ready,
                ),
                request,
            )  # fmt: skip
            try:
                await call
            except grpc.aio.AioRpcError as exc:
                if _unreached(exc):
                    raise _Unreached(call) from None
            return call

        policy = RetryPolicy(
            self._attempts, UNREACHED_PAUSE_S, factor=2.0, deadline_s=details.timeout
        )
        try:
            call, _ = await run_with_retry(attempt, policy, retry_on=_Unreached)
        except _Unreached as last:
            return last.call
        return call

    async def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        span = _client_span(self._tracing, client_call_details, self._target)
        details = _with_context(client_call_details, self._timeout, span)
        metrics = self._metrics
        if metrics is None and span is None:
            return await self._send(continuation, details, request)
        key = (*split_method(details.method), "unary")
        if metrics is not None:
            metrics.start(key)
        started = time.perf_counter()
        code = grpc.StatusCode.UNKNOWN
        try:
            call = await self._send(continuation, details, request)
            await call  # the caller awaits the same finished call: its response or its error
            code = grpc.StatusCode.OK
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        finally:
            if metrics is not None:
                metrics.done(key, code.name, time.perf_counter() - started)
            if span is not None:
                span.end(code.name, _code_number(code))
        return call


class ClientStreamContextInterceptor(_ClientContext, grpc.aio.UnaryStreamClientInterceptor):
    """ClientContextInterceptor's work for server-streaming calls: the span ends with the
    stream."""

    async def intercept_unary_stream(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        span = _client_span(self._tracing, client_call_details, self._target)
        details = _with_context(client_call_details, self._timeout, span)
        try:
            call = await continuation(details, request)
        except BaseException:
            if span is not None:
                span.end(grpc.StatusCode.UNKNOWN.name, _code_number(grpc.StatusCode.UNKNOWN))
            raise
        metrics = self._metrics
        if metrics is None and span is None:
            return call
        key = (*split_method(details.method), "server_stream")
        if metrics is not None:
            metrics.start(key)
        started = time.perf_counter()

        async def record(done: Any) -> None:
            code = await done.code()
            if metrics is not None:
                metrics.done(key, code.name, time.perf_counter() - started)
            if span is not None:
                span.end(code.name, _code_number(code))

        def on_done(done: Any) -> None:
            # Held until it ends: the event loop keeps only a weak reference to a task.
            task = asyncio.ensure_future(record(done))
            _RECORDING.add(task)
            task.add_done_callback(_RECORDING.discard)

        call.add_done_callback(on_done)
        return call
