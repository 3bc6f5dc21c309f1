"""VisiorClient: grpclib channels to the mesh, generated stubs with typed errors, shortcuts."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncGenerator, AsyncIterator, Collection, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Generic, Self, TypeVar, overload

import betterproto
from grpclib.client import Channel
from grpclib.encoding.proto import ProtoStatusDetailsCodec
from grpclib.metadata import Deadline, encode_metadata
from visior_sdk.visior.common.v1 import ChatMessage, UserContext
from visior_sdk.visior.llm.v1 import (
    GenerateStreamRequest,
    GenerateStreamResponse,
    LlmServiceStub,
)
from visior_sdk.visior.llm.v1 import GetHealthRequest as LlmGetHealthRequest
from visior_sdk.visior.orchestrator.v1 import GetHealthRequest as OrchestratorGetHealthRequest
from visior_sdk.visior.orchestrator.v1 import (
    OrchestratorServiceStub,
    RespondRequest,
    RespondResponse,
)
from visior_sdk.visior.retrieval.v1 import GetHealthRequest as RetrievalGetHealthRequest
from visior_sdk.visior.retrieval.v1 import (
    IngestionServiceStub,
    RetrievalServiceStub,
    SearchFilters,
    SearchParams,
    SearchRequest,
    SearchResponse,
)
from visior_sdk.visior.toolsproxy.v1 import ExecuteRequest, ToolError, ToolsProxyServiceStub
from visior_sdk.visior.toolsproxy.v1 import GetHealthRequest as ToolsGetHealthRequest

from services.client.errors import DeadlineExceeded, VisiorRpcError, from_exception
from services.client.structs import from_value, to_struct
from services.common.call_budgets import STREAM_IDLE_TIMEOUT_S, grpc_method_timeout
from services.common.context import (
    TRACE_METADATA_KEY,
    call_timeout,
    check_trace_id,
    current_trace_id,
    new_trace_id,
    remaining_seconds,
    valid_trace_id,
)
from services.common.errors import ServiceError
from services.common.settings import MAX_PORT, grpc_address, is_target_host
from services.common.topology import SERVICE_BY_KEY, Ports

Metadata = Mapping[str, str | bytes] | Collection[tuple[str, str | bytes]]


@dataclass(frozen=True)
class Target:
    """Where one gRPC server listens (plaintext: the mesh is loopback / sidecar-local)."""

    host: str
    port: int

    def __post_init__(self) -> None:
        """ValueError for a host that is no host name or address (the *_URL settings' rule,
        settings.is_target_host; an IPv6 address without brackets) or a port outside
        1..MAX_PORT: grpclib would only fail at the first call, to connect."""
        if not isinstance(self.host, str) or isinstance(self.port, bool):
            raise TypeError(f"not a target: {self.host!r}, {self.port!r}")
        if not isinstance(self.port, int):
            raise TypeError(f"target port {self.port!r}: not an int")
        if not is_target_host(self.host):
            raise ValueError(f"target host {self.host!r} is not a host name or address")
        if not 1 <= self.port <= MAX_PORT:
            raise ValueError(f"target {self}: the port is not in 1..{MAX_PORT}")

    @classmethod
    def parse(cls, value: Target | str | int | tuple[str, int], host: str) -> Target:
        """A Target from a Target, a bare port (on `host`), (host, port) or a string the
        services' *_URL settings take (services.common.settings.grpc_address: "host:port",
        "[::1]:port", a grpc:// / http:// / dns:/// URL), where ":port" is on `host`.

        A bare port and (host, port) are held to the string's rule (ValueError): they are
        read as "host:port" (an IPv6 host, bracketed or not, as "[host]:port"); a pair's port
        may be an int or a str of ASCII digits."""
        if isinstance(value, Target):
            return value
        if isinstance(value, bool):
            raise TypeError(f"not a target: {value!r}")
        if isinstance(value, int):
            return cls._from_pair(host, value)
        if isinstance(value, tuple):
            if len(value) != 2:
                raise ValueError(f"target {value!r}: not (host, port)")
            return cls._from_pair(*value)
        return cls(*grpc_address(value, "target", default_host=host))

    @classmethod
    def _from_pair(cls, host: object, port: object) -> Target:
        """A Target from a host and a port, read as the string "host:port" is."""
        if not isinstance(host, str) or isinstance(port, bool):
            raise TypeError(f"not a target: ({host!r}, {port!r})")
        bracketed = f"[{host}]" if ":" in host and not host.startswith("[") else host
        return cls(*grpc_address(f"{bracketed}:{port}", "target"))

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


TargetLike = Target | str | int | tuple[str, int]

# The topology's service keys, plus "ingestion": it is co-hosted with retrieval in the
# embedded setup (docs/architecture.md §3) but may run standalone against a Qdrant server.
TARGET_KEYS = (*SERVICE_BY_KEY, "ingestion")


def targets_from_ports(ports: Ports, host: str = "127.0.0.1") -> dict[str, Target]:
    """The gRPC target of every service of a mesh started with `ports` on `host`."""
    return {key: Target(host, port) for key, port in ports.grpc.items()}


def _check_trace_id(value: str, name: str) -> None:
    """ValueError unless `value` is a trace id the services take (check_trace_id's rule):
    one they would not take is dropped by the server, so logs would not show it."""
    try:
        check_trace_id(value)
    except ServiceError as err:
        raise ValueError(f"{name} {value!r}: {err.message}") from err


def _pairs(metadata: Metadata | None) -> list[tuple[str, str | bytes]]:
    """`metadata` as (lowercase key, value) pairs, each one that gRPC can send.

    ValueError for a key gRPC refuses (not lowercase letters, digits, '-', '_', '.'; or
    grpc-*), a value it refuses (a str that is not printable ASCII) or an `x-trace-id` that
    is not a valid trace id; TypeError for a value of the wrong type (bytes for a key ending
    in -bin, str otherwise). grpclib would only find out while sending, with its raw error.
    """
    if metadata is None:
        return []
    items = metadata.items() if isinstance(metadata, Mapping) else metadata
    pairs = [(key.lower(), value) for key, value in items]
    for key, value in pairs:
        if key == TRACE_METADATA_KEY and isinstance(value, str):
            _check_trace_id(value, f"metadata {TRACE_METADATA_KEY}")
        try:
            encode_metadata([(key, value)])  # grpclib's own rule, the one applied when sending
        except ValueError as err:
            raise ValueError(
                f"metadata {key!r}: {value!r} cannot be sent as gRPC metadata ({err}); keys are "
                "lowercase letters, digits, '-', '_', '.' (not grpc-*), values printable ASCII"
            ) from err
        except TypeError as err:
            raise TypeError(
                f"metadata {key!r}: a key ending in -bin takes bytes, any other a str ({err})"
            ) from err
    return pairs


def _check_timeout(value: float, name: str) -> None:
    """ValueError unless `value` is a positive, finite number of seconds: with NaN every call
    fails at once, and infinity cannot be sent as grpc-timeout."""
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive, finite number of seconds, got {value!r}")


def _check_call_deadline(timeout: float | None, deadline: Deadline | None) -> None:
    """ValueError for a call's `timeout` or `deadline` that is NaN or infinite (grpclib cannot
    send it). Zero or less is a deadline already passed: the call fails with
    DeadlineExceeded before anything is sent."""
    if timeout is not None and not math.isfinite(timeout):
        raise ValueError(f"timeout must be a finite number of seconds, got {timeout!r}")
    if deadline is not None and not math.isfinite(deadline.time_remaining()):
        raise ValueError("deadline must be a finite time from now")


def _body_trace(request: Any) -> str:
    """The trace id `request` carries in its body (`trace_id`; GenerateStreamRequest: its
    inner `request.trace_id`) when it is one the services take, else "".

    The servers log a call under its body's trace id before any `x-trace-id`
    (services.common.interceptors; the LLM service binds GenerateStream's inner one), so
    the call must be sent, and its failure named, under that id. A body trace id they would
    not take is refused by the server (INVALID_ARGUMENT on `trace_id`): "", and the usual
    `x-trace-id`."""
    if isinstance(request, GenerateStreamRequest):
        request = request.request
    trace = getattr(request, "trace_id", "")
    return trace if isinstance(trace, str) and valid_trace_id(trace) else ""


def _with_trace(pairs: list[tuple[str, str | bytes]], default: str) -> tuple[list[Any], str]:
    """`pairs` with exactly one `x-trace-id`: the last one given (the one the servers read),
    else `default`; and that trace id."""
    given = [value for key, value in pairs if key == TRACE_METADATA_KEY]
    trace = str(given[-1]) if given and given[-1] else default
    rest = [(key, value) for key, value in pairs if key != TRACE_METADATA_KEY]
    return [*rest, (TRACE_METADATA_KEY, trace)], trace


class _TypedStub(betterproto.ServiceStub):
    """A generated stub whose calls carry a deadline and the trace id, and raise VisiorRpcError.

    Per call: the deadline is the call's own (`timeout` and/or `deadline`, grpclib takes the
    earlier), else the client's timeout, else the RPC's budget (services.common.call_budgets,
    the timeouts of Envoy's JSON routes; a stream has none), capped by the remaining time of
    the request being served when this runs inside one of our servers
    (services.common.context). A stream also ends with DeadlineExceeded when no event comes
    for `stream_idle_timeout` seconds, as Envoy ends a silent JSON stream. `x-trace-id` is
    the request body's own `trace_id` (GenerateStreamRequest: `request.trace_id`) when it
    has one, the id the servers log the call under; else the call's own, else the
    client's, else the served request's, else a new one per call; a failure's
    VisiorRpcError.trace_id names it. Per-call metadata is merged into the
    client's (betterproto would replace it), so passing `metadata={...}` never drops the trace
    id; metadata gRPC cannot send raises ValueError (TypeError for a value of the wrong type)
    before anything is sent.
    """

    def __init__(
        self,
        channel: Channel,
        *,
        timeout: float | None,
        metadata: Metadata,
        stream_idle_timeout: float = STREAM_IDLE_TIMEOUT_S,
    ):
        # Not betterproto's own `timeout`: it would stand in for every call we send without
        # one (a call with only its own deadline, a stream), overriding them.
        super().__init__(channel)
        self.client_timeout = timeout
        """The client's timeout for every call; None: each RPC's own budget."""
        self.stream_idle_timeout = stream_idle_timeout
        """Seconds without an event before a stream fails (VisiorClient.stream_idle_timeout:
        a slower runtime, the local CPU model, needs longer than the default)."""
        self._base_metadata = _pairs(metadata)
        self.closed = False
        """Set by VisiorClient.close(): every later call raises RuntimeError (grpclib would
        open a new connection on the closed Channel, one that nothing closes)."""

    def _timeout(self, route: str, given: float | None, deadline: Deadline | None) -> float | None:
        """Seconds a call of `route` (its full method name) may take: `given`, else none of
        ours when the call has its own `deadline` (grpclib applies it), else the client's
        timeout, else the RPC's budget; capped by the served request's remaining time. None
        is no timeout (a stream given none, or a call given a deadline, outside a served
        request)."""
        own = given
        if own is None and deadline is None:
            own = self.client_timeout
            if own is None:
                own = grpc_method_timeout(route) or None
        if own is not None:
            return call_timeout(own)
        left = remaining_seconds()
        return None if left is None else max(0.0, left)

    def _call_options(
        self, route: str, request: Any, options: dict[str, Any]
    ) -> tuple[dict[str, Any], str]:
        """The generated stub's call options with our timeout and merged metadata, and the
        trace id the call of `request` is sent with. RuntimeError once the client is closed,
        ValueError for a timeout or deadline that is not finite, before anything is sent."""
        if self.closed:
            raise RuntimeError(f"{route}: VisiorClient is closed; open a client to call again")
        own, deadline = options.pop("timeout", None), options.get("deadline")
        _check_call_deadline(own, deadline)
        timeout = self._timeout(route, own, deadline)
        pairs = _pairs(options.pop("metadata", None))
        given = {key for key, _ in pairs}
        merged = [(k, v) for k, v in self._base_metadata if k not in given] + pairs
        body = _body_trace(request)
        if body:  # the servers take the body's over any x-trace-id: send that one alone
            merged = [(k, v) for k, v in merged if k != TRACE_METADATA_KEY]
        # A trace id of our own when nobody gave one: the caller's error then names the id the
        # server logged the call under (a server that made one up would not tell us).
        merged, trace = _with_trace(merged, body or current_trace_id() or new_trace_id())
        # grpclib turns a deadline already passed into asyncio.TimeoutError -> DeadlineExceeded.
        return {**options, "timeout": timeout, "metadata": merged}, trace

    async def _unary_unary(  # type: ignore[override]
        self, route: str, request: Any, response_type: Any, **options: Any
    ) -> Any:
        """`options`: timeout (sent as grpc-timeout), deadline, metadata."""
        call_options, trace = self._call_options(route, request, options)
        try:
            return await super()._unary_unary(route, request, response_type, **call_options)
        except Exception as exc:
            typed = _typed(exc, trace)
            if typed is None:
                raise
            raise typed from exc

    async def _unary_stream(  # type: ignore[override]
        self, route: str, request: Any, response_type: Any, **options: Any
    ) -> AsyncIterator[Any]:
        call_options, trace = self._call_options(route, request, options)
        stream: AsyncGenerator[Any, None] = super()._unary_stream(  # type: ignore[assignment]
            route, request, response_type, **call_options
        )
        # aclosing: when the caller closes this generator (contextlib.aclosing at the call site),
        # the inner one and its HTTP/2 stream close at once instead of whenever GC finalises it.
        async with aclosing(stream):
            while True:
                idle = asyncio.timeout(self.stream_idle_timeout)
                try:
                    # On expiry the wait is cancelled inside the inner generator, which closes
                    # its HTTP/2 stream (RST_STREAM: the server sees the call cancelled).
                    async with idle:
                        message = await anext(stream)
                except StopAsyncIteration:
                    return
                except Exception as exc:
                    if idle.expired():
                        raise DeadlineExceeded(
                            f"{route}: no stream event for {self.stream_idle_timeout:g} s "
                            "(the client's stream_idle_timeout)",
                            trace_id=trace,
                        ) from exc
                    typed = _typed(exc, trace)
                    if typed is None:
                        raise
                    raise typed from exc
                yield message


def _typed(exc: BaseException, trace_id: str) -> VisiorRpcError | None:
    """from_exception's typed error, naming the trace id the call was sent with."""
    typed = from_exception(exc)
    if typed is not None:
        typed.trace_id = trace_id
    return typed


class OrchestratorStub(_TypedStub, OrchestratorServiceStub):
    """OrchestratorService: Respond, GetConfig, UpdateConfig, GetHealth."""


class LlmStub(_TypedStub, LlmServiceStub):
    """LlmService: Generate, GenerateStream, GetHealth."""

    def generate_stream(  # type: ignore[override]
        self,
        generate_stream_request: GenerateStreamRequest,
        *,
        timeout: float | None = None,
        deadline: Deadline | None = None,
        metadata: Metadata | None = None,
    ) -> AsyncGenerator[GenerateStreamResponse, None]:
        """GenerateStream's events; to stop early, close it (`contextlib.aclosing`).

        No overall deadline unless `timeout` / `deadline` (or the client's timeout) gives
        one, but DeadlineExceeded when no event comes for the client's `stream_idle_timeout`.

        The generated method wraps `_unary_stream` in a second async generator that does not
        close it, so closing the outer one left the HTTP/2 stream open until GC; this returns
        the closable stream itself.
        """
        stream: AsyncGenerator[GenerateStreamResponse, None] = self._unary_stream(  # type: ignore[assignment]
            "/visior.llm.v1.LlmService/GenerateStream",
            generate_stream_request,
            GenerateStreamResponse,
            timeout=timeout,
            deadline=deadline,
            metadata=metadata,
        )
        return stream


class RetrievalStub(_TypedStub, RetrievalServiceStub):
    """RetrievalService: Search, GetHealth."""


class IngestionStub(_TypedStub, IngestionServiceStub):
    """IngestionService: IngestDocument, DeleteDocument, ListDocuments."""


class ToolsProxyStub(_TypedStub, ToolsProxyServiceStub):
    """ToolsProxyService: Execute, ListTools, GetHealth."""


STUB_TYPES: dict[str, type[_TypedStub]] = {
    "orchestrator": OrchestratorStub,
    "llm": LlmStub,
    "retrieval": RetrievalStub,
    "ingestion": IngestionStub,
    "toolsproxy": ToolsProxyStub,
}
"""The stub each target key gets."""

HEALTH_REQUESTS: dict[str, type[Any]] = {
    "orchestrator": OrchestratorGetHealthRequest,
    "llm": LlmGetHealthRequest,
    "retrieval": RetrievalGetHealthRequest,
    "toolsproxy": ToolsGetHealthRequest,
}
"""Each service's own GetHealthRequest type."""

S = TypeVar("S", bound=_TypedStub)


class _StubOf(Generic[S]):
    """A VisiorClient attribute: the stub of one target key, typed (its class says the RPCs).
    LookupError when the client has no target for it, RuntimeError before it is opened."""

    def __init__(self, key: str, stub_type: type[S]) -> None:
        self.key = key
        self.__doc__ = stub_type.__doc__

    @overload
    def __get__(self, client: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, client: VisiorClient, owner: type[Any]) -> S: ...
    def __get__(self, client: VisiorClient | None, owner: type[Any]) -> S | Self:
        if client is None:
            return self
        stub: S = client._stub(self.key)
        return stub


@dataclass(frozen=True)
class ServiceHealth:
    """A service's GetHealth answer; each service has its own response type with these fields."""

    status: str
    """"ok" when the service can serve, "down" when it cannot (see GetHealthResponse)."""
    service: str
    """The gRPC service that answered, e.g. visior.retrieval.v1.RetrievalService."""
    details: dict[str, str]
    """Per-dependency facts, e.g. {"backend": "keyword"}."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class ToolResult:
    """What ToolsProxy answered, with `result` as plain Python (from its google.protobuf.Value)."""

    status: str
    """"ok" or "error"; a tool's own failure is an answer, not an RPC error."""
    result: Any
    """The tool's JSON result when status is "ok" (dict, list, str, number, bool or None)."""
    error: ToolError | None
    """The tool's error (code such as ACCESS_DENIED, WINDOW_TOO_LARGE) when status is "error"."""
    trace_id: str
    """The trace id the proxy ran the call under."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class VisiorClient:
    """Typed async client for the Visior mesh over grpclib.

    `targets` maps service keys (orchestrator, llm, retrieval, toolsproxy and, when it runs
    apart from retrieval, ingestion) to a Target, "host:port" or a bare port on `host`; a
    `Ports` value (services.common.topology) names all four. Only the services named get a
    channel. A call's deadline is its own `timeout` and/or `deadline` (grpclib takes the
    earlier), else the client's `timeout` when given (for every call), else its RPC's
    budget, the timeout of its JSON route in Envoy (services.common.call_budgets;
    GenerateStream has none). Inside one of our servers the remaining deadline of the
    request being served caps it. A stream also fails with DeadlineExceeded after
    `stream_idle_timeout` seconds without an event (default: Envoy's idle timeout of the
    JSON streaming route, STREAM_IDLE_TIMEOUT_S, sized for the default runtime). A slower
    runtime needs a longer limit: with the local CPU model (MODEL=local) one model step can
    be silent for longer, and the mesh raises Envoy's stream idle timeout to
    `local_envoy_timeouts()[STREAM_IDLE]` (services.devtools.mesh /
    services.devtools.envoy_config); pass that as `stream_idle_timeout`, or the client cuts
    a stream the mesh would keep. Each call sends `x-trace-id` metadata: the request
    body's own `trace_id` when it has one (GenerateStreamRequest: `request.trace_id`; the
    servers log the call under it), else `trace_id`, else the trace id of the request
    being served there, else a new one per call; a failure's `trace_id` names it. Failures
    raise VisiorRpcError subclasses (services.client.errors).

    ValueError at construction for a `trace_id` the services would not take (1-128 of
    letters, digits, '.', '_', ':', '-'), for `metadata` gRPC cannot send, for a target that
    is not one (Target.parse), and for a timeout that is not a positive, finite number of
    seconds; a call's own `metadata=` is checked the same way and raises ValueError
    (TypeError for a value of the wrong type) before anything is sent, and so does a call's
    NaN or infinite `timeout` or infinite `deadline`. Once the client is closed, a call
    through a stub taken from it raises RuntimeError.

        async with VisiorClient(Ports(), trace_id="t-1") as visior:
            answer = await visior.respond("How do I back up?", tenant_id="demo", user_id="u1")
    """

    def __init__(
        self,
        targets: Mapping[str, TargetLike] | Ports,
        *,
        host: str = "127.0.0.1",
        timeout: float | None = None,
        stream_idle_timeout: float = STREAM_IDLE_TIMEOUT_S,
        trace_id: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        if isinstance(targets, Ports):
            targets = targets_from_ports(targets, host)
        unknown = set(targets) - set(TARGET_KEYS)
        if unknown:
            raise ValueError(f"unknown service keys {sorted(unknown)}; known: {TARGET_KEYS}")
        if timeout is not None:
            _check_timeout(timeout, "timeout")
        if not stream_idle_timeout > 0:  # also refuses NaN
            raise ValueError(f"stream_idle_timeout must be positive, got {stream_idle_timeout}")
        if trace_id:
            _check_trace_id(trace_id, "trace_id")
        self._metadata = _pairs(metadata)
        self.targets: dict[str, Target] = {k: Target.parse(v, host) for k, v in targets.items()}
        if "retrieval" in self.targets:
            self.targets.setdefault("ingestion", self.targets["retrieval"])
        self.timeout = timeout
        self.stream_idle_timeout = stream_idle_timeout
        """Seconds a stream may go without an event before DeadlineExceeded. The default,
        STREAM_IDLE_TIMEOUT_S, is Envoy's for the default runtime; a slower one needs more:
        with the local CPU model the mesh gives Envoy local_envoy_timeouts()[STREAM_IDLE]
        (services.devtools.mesh), and a held model step can be silent longer than the
        default."""
        self.trace_id = trace_id
        if trace_id:  # one x-trace-id on the wire; trace_id wins over metadata's
            self._metadata = [(k, v) for k, v in self._metadata if k != TRACE_METADATA_KEY]
            self._metadata.append((TRACE_METADATA_KEY, trace_id))
        self._channels: dict[Target, Channel] = {}
        self._stubs: dict[str, _TypedStub] = {}

    async def __aenter__(self) -> Self:
        self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def open(self) -> None:
        """Create the channels (grpclib connects on the first call). Needs a running loop.
        A key that has a stub already keeps it, so that close() reaches every stub handed out."""
        for key, target in self.targets.items():
            if key in self._stubs:
                continue
            channel = self._channels.get(target)
            if channel is None:
                # Explicit, although grpclib picks the same codec when googleapis-common-protos
                # is importable: without it, errors would lose their ErrorInfo silently.
                channel = Channel(
                    target.host, target.port, status_details_codec=ProtoStatusDetailsCodec()
                )
                self._channels[target] = channel
            self._stubs[key] = STUB_TYPES[key](
                channel,
                timeout=self.timeout,
                metadata=self._metadata,
                stream_idle_timeout=self.stream_idle_timeout,
            )

    def close(self) -> None:
        """Close every channel; in-flight calls fail, and a later call through a stub taken
        from this client raises RuntimeError instead of connecting again."""
        for stub in self._stubs.values():
            stub.closed = True
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        self._stubs.clear()

    def _stub(self, key: str) -> Any:
        stub = self._stubs.get(key)
        if stub is None:
            if key not in self.targets:
                raise LookupError(f"VisiorClient has no target for {key!r}")
            raise RuntimeError("VisiorClient is not open; use `async with VisiorClient(...)`")
        return stub

    orchestrator = _StubOf("orchestrator", OrchestratorStub)
    llm = _StubOf("llm", LlmStub)
    retrieval = _StubOf("retrieval", RetrievalStub)
    ingestion = _StubOf("ingestion", IngestionStub)
    tools = _StubOf("toolsproxy", ToolsProxyStub)

    async def respond(
        self,
        query: str,
        tenant_id: str,
        user_id: str,
        *,
        roles: Sequence[str] = (),
        history: Sequence[ChatMessage | tuple[str, str]] = (),
        doc_ids: Sequence[str] = (),
        section_ids: Sequence[str] = (),
        filters: SearchFilters | None = None,
        max_results: int | None = None,
        channel: str = "",
        locale: str = "",
        timeout: float | None = None,  # noqa: ASYNC109 (sent as grpc-timeout)
        deadline: Deadline | None = None,
        metadata: Metadata | None = None,
    ) -> RespondResponse:
        """Ask the orchestrator for an answer with sources; `history`: messages or (role, text)."""
        request = RespondRequest(
            query=query,
            user=UserContext(user_id=user_id, tenant_id=tenant_id, roles=list(roles)),
            channel=channel,
            locale=locale,
            doc_ids=list(doc_ids),
            section_ids=list(section_ids),
            max_results=max_results,
            history=[
                m if isinstance(m, ChatMessage) else ChatMessage(role=m[0], content=m[1])
                for m in history
            ],
        )
        if filters is not None:
            request.filters = filters
        return await self.orchestrator.respond(
            request, timeout=timeout, deadline=deadline, metadata=metadata
        )

    async def search(
        self,
        query: str,
        tenant_id: str,
        *,
        max_results: int | None = None,
        filters: SearchFilters | None = None,
        params: SearchParams | None = None,
        language: str = "",
        timeout: float | None = None,  # noqa: ASYNC109 (sent as grpc-timeout)
        deadline: Deadline | None = None,
        metadata: Metadata | None = None,
    ) -> SearchResponse:
        """Search one tenant's documents (max_results ≤ 50, else InvalidArgument LIMIT_EXCEEDED)."""
        request = SearchRequest(
            query=query, tenant_id=tenant_id, max_results=max_results, language=language
        )
        if filters is not None:
            request.filters = filters
        if params is not None:
            request.params = params
        return await self.retrieval.search(
            request, timeout=timeout, deadline=deadline, metadata=metadata
        )

    async def execute_tool(
        self,
        name: str,
        arguments: Mapping[str, Any],
        user: UserContext,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (sent as grpc-timeout)
        deadline: Deadline | None = None,
        metadata: Metadata | None = None,
    ) -> ToolResult:
        """Run one ToolsProxy tool for `user`; `arguments` is a plain JSON-like dict."""
        response = await self.tools.execute(
            ExecuteRequest(tool_name=name, arguments=to_struct(arguments), user=user),
            timeout=timeout,
            deadline=deadline,
            metadata=metadata,
        )
        has_error = betterproto.serialized_on_wire(response.error)
        return ToolResult(
            status=response.status,
            result=from_value(response.result),
            error=response.error if has_error else None,
            trace_id=response.trace_id,
        )

    async def health(
        self,
        service: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (sent as grpc-timeout)
        deadline: Deadline | None = None,
        metadata: Metadata | None = None,
    ) -> ServiceHealth:
        """GetHealth of one service: orchestrator, llm, retrieval or toolsproxy."""
        request_type = HEALTH_REQUESTS.get(service)
        if request_type is None:
            raise ValueError(f"no GetHealth for {service!r}; use one of {tuple(SERVICE_BY_KEY)}")
        response = await self._stub(service).get_health(
            request_type(), timeout=timeout, deadline=deadline, metadata=metadata
        )
        return ServiceHealth(response.status, response.service, dict(response.details))
