"""Optional OpenTelemetry tracing: one SERVER span per RPC, tied to the mesh's trace_id.

Off by default. It is on when OTEL_TRACES_EXPORTER names an exporter (console, otlp) and
OTEL_SDK_DISABLED is not true (TracingSettings, services/common/settings.py). When off,
nothing here imports opentelemetry: the server interceptor holds None and the client
interceptor reads one context variable (`traceparent_var`, empty).

When on:
- the OpenTelemetry trace id of a request is its mesh trace_id when that is 32 hex digits
  (the ids the mesh generates; dashes ignored), else the first 128 bits of its SHA-256, so
  logs (trace_id) and spans (trace id, attribute visior.trace_id) name the same request;
- an incoming W3C `traceparent` with that trace id is the span's parent; one with another
  trace id (the caller sent an x-trace-id that disagrees) becomes a span link;
- the span is current while the handler runs; each outgoing call on a mesh channel opened
  with the Tracing gets a CLIENT span, its child, whose `traceparent` goes out with the
  call, so the next hop's SERVER span is the CLIENT span's child (a channel opened without
  it sends the SERVER span's own traceparent, and the hop is its child).
"""

from __future__ import annotations

import contextvars
import hashlib
import re
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from services.common.logging import bind_span_id, unbind_span_id
from services.common.settings import TracingSettings

if TYPE_CHECKING:  # pragma: no cover
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

TRACEPARENT_METADATA_KEY = "traceparent"

traceparent_var: contextvars.ContextVar[str] = contextvars.ContextVar("traceparent", default="")
"""The `traceparent` of the span being served ('' when tracing is off): outgoing calls send it."""

# The trace id the next root span must take (read by _MeshIdGenerator).
_forced_trace_id: contextvars.ContextVar[int] = contextvars.ContextVar("otel_trace_id", default=0)

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_HEX32 = re.compile(r"^[0-9a-fA-F]{32}$")

# gRPC codes a server span reports as errors (OpenTelemetry's RPC semantic conventions).
_SERVER_ERROR_CODES = frozenset(
    {"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"}
)


def otel_trace_id(mesh_trace_id: str) -> int:
    """The 128-bit OpenTelemetry trace id of a mesh trace_id (never 0)."""
    plain = mesh_trace_id.replace("-", "")
    if _HEX32.match(plain):
        value = int(plain, 16)
        if value:
            return value
    digest = hashlib.sha256(mesh_trace_id.encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1


def parse_traceparent(value: str) -> tuple[int, int, int] | None:
    """(trace_id, span_id, flags) of a valid W3C traceparent header, else None."""
    match = _TRACEPARENT.match(value.strip().lower()) if value else None
    if match is None or match.group(1) == "ff":
        return None
    trace_id, span_id = int(match.group(2), 16), int(match.group(3), 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, int(match.group(4), 16)


def format_traceparent(trace_id: int, span_id: int, flags: int) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"


class ServerSpan:
    """One RPC's span: current (OpenTelemetry context and traceparent_var) until `end`."""

    def __init__(
        self, span: Any, tokens: tuple[Any, contextvars.Token[str], Mapping[str, Any]]
    ) -> None:
        self._span = span
        self._tokens = tokens

    def end(self, code_name: str, code_number: int) -> None:
        from opentelemetry import context as otel_context
        from opentelemetry.trace import Status, StatusCode

        span = self._span
        span.set_attribute("rpc.grpc.status_code", code_number)
        if code_name in _SERVER_ERROR_CODES:
            span.set_status(Status(StatusCode.ERROR, code_name))
        span.end()
        otel_token, var_token, span_tokens = self._tokens
        try:
            unbind_span_id(span_tokens)
            traceparent_var.reset(var_token)
            otel_context.detach(otel_token)
        except ValueError:  # ended in another context (a cancelled stream): nothing to undo
            pass


class ClientSpan:
    """One outgoing call's span. Its traceparent goes out with the call, so the next hop's
    SERVER span is its child; it is never made current (nothing runs inside). Ends once:
    later ends are ignored."""

    def __init__(self, span: Any) -> None:
        self._span = span
        self._ended = False
        sc = span.get_span_context()
        self.traceparent = format_traceparent(sc.trace_id, sc.span_id, int(sc.trace_flags))

    @property
    def ended(self) -> bool:
        return self._ended

    def set_attribute(self, key: str, value: Any) -> None:
        self._span.set_attribute(key, value)

    def finish(self, error_type: str | None) -> None:
        """End the span; `error_type` (a status or exception name) marks it an error."""
        if self._ended:
            return
        self._ended = True
        if error_type is not None:
            from opentelemetry.trace import Status, StatusCode

            self._span.set_attribute("error.type", error_type)
            self._span.set_status(Status(StatusCode.ERROR, error_type))
        self._span.end()

    def end(self, code_name: str, code_number: int) -> None:
        """End a gRPC call's span with its status (an error unless OK)."""
        if not self._ended:
            self._span.set_attribute("rpc.grpc.status_code", code_number)
        self.finish(None if code_name == "OK" else code_name)


class Tracing:
    """A TracerProvider of the mesh's own (ids tied to trace_id): SERVER spans of the RPCs
    served, CLIENT spans of the calls made to other services."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self._tracer = provider.get_tracer("visior.rpc")

    def start_server_span(
        self, service: str, method: str, mesh_trace_id: str, traceparent: str
    ) -> ServerSpan:
        from opentelemetry import context as otel_context
        from opentelemetry import trace

        trace_id = otel_trace_id(mesh_trace_id)
        parent = parse_traceparent(traceparent)
        links: list[trace.Link] = []
        ctx = otel_context.Context()
        if parent is not None:
            remote = trace.SpanContext(
                parent[0], parent[1], is_remote=True, trace_flags=trace.TraceFlags(parent[2])
            )
            if parent[0] == trace_id:
                ctx = trace.set_span_in_context(trace.NonRecordingSpan(remote), ctx)
            else:
                links.append(trace.Link(remote))
        forced = _forced_trace_id.set(trace_id)
        try:
            span = self._tracer.start_span(
                f"{service}/{method}",
                context=ctx,
                kind=trace.SpanKind.SERVER,
                attributes={
                    "rpc.system": "grpc",
                    "rpc.service": service,
                    "rpc.method": method,
                    "visior.trace_id": mesh_trace_id,
                },
                links=links,
            )
        finally:
            _forced_trace_id.reset(forced)
        sc = span.get_span_context()
        var_token = traceparent_var.set(
            format_traceparent(sc.trace_id, sc.span_id, int(sc.trace_flags))
        )
        span_tokens = bind_span_id(f"{sc.span_id:016x}")  # log lines name the SERVER span
        otel_token = otel_context.attach(trace.set_span_in_context(span))
        return ServerSpan(span, (otel_token, var_token, span_tokens))

    def start_client_span(
        self, service: str, method: str, mesh_trace_id: str, target: str
    ) -> ClientSpan:
        """A CLIENT span for a gRPC call of `service`/`method` to `target` (start_span's
        parent rules)."""
        return self.start_span(
            f"{service}/{method}",
            mesh_trace_id,
            {
                "rpc.system": "grpc",
                "rpc.service": service,
                "rpc.method": method,
                "server.address": target,
            },
        )

    def start_span(self, name: str, mesh_trace_id: str, attributes: dict[str, Any]) -> ClientSpan:
        """A CLIENT span, the child of the span being served (OpenTelemetry's current
        context); outside any RPC (start-up work), a root span of the mesh trace id, when
        there is one. `visior.trace_id` is added to `attributes`."""
        from opentelemetry import trace

        forced = _forced_trace_id.set(otel_trace_id(mesh_trace_id) if mesh_trace_id else 0)
        try:
            span = self._tracer.start_span(
                name,
                kind=trace.SpanKind.CLIENT,
                attributes={**attributes, "visior.trace_id": mesh_trace_id},
            )
        finally:
            _forced_trace_id.reset(forced)
        return ClientSpan(span)

    def shutdown(self) -> None:
        self.provider.shutdown()


def _id_generator() -> Any:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class MeshIdGenerator(RandomIdGenerator):
        """Root spans take the trace id derived from the request's mesh trace_id."""

        def generate_trace_id(self) -> int:
            return _forced_trace_id.get() or super().generate_trace_id()

        def is_trace_id_random(self) -> bool:
            return False

    return MeshIdGenerator()


def _one_line(span: Any) -> str:
    return str(span.to_json(indent=None)) + "\n"


def _exporters(settings: TracingSettings) -> list[SpanExporter]:
    out: list[SpanExporter] = []
    for name in settings.exporters:
        if name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            # One JSON object per line on stderr, alongside the JSON logs.
            out.append(ConsoleSpanExporter(out=sys.stderr, formatter=_one_line))
        elif name == "otlp" and settings.otlp_protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter,
            )

            out.append(OTLPSpanExporter())
        elif name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter as HttpExporter,
            )

            out.append(HttpExporter())
    return out


def create_tracing(
    service: str, exporter: SpanExporter | None = None, settings: TracingSettings | None = None
) -> Tracing:
    """A Tracing exporting to `exporter` (synchronously: tests) or to the settings' exporters
    (batched). The resource's service.name is the settings' (OTEL_SERVICE_NAME), else
    visior-<service>."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    name = settings.service_name if settings is not None else ""
    resource = Resource.create({"service.name": name or f"visior-{service}"})
    provider = TracerProvider(resource=resource, id_generator=_id_generator())
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    for each in _exporters(settings) if settings is not None else ():
        provider.add_span_processor(BatchSpanProcessor(each))
    return Tracing(provider)


_installed: Tracing | None = None


def install_tracing(settings: TracingSettings, service: str) -> Tracing | None:
    """The process's Tracing when `settings` enable it (made once, also set as OpenTelemetry's
    global provider), else None without importing opentelemetry."""
    global _installed
    if not settings.enabled:
        return None
    if _installed is None:
        from opentelemetry import trace

        _installed = create_tracing(service, settings=settings)
        trace.set_tracer_provider(_installed.provider)
    return _installed


def installed_tracing() -> Tracing | None:
    """The Tracing install_tracing made in this process, if any."""
    return _installed
