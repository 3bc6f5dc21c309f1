"""A stand-in OpenTelemetry collector: the OTLP trace receiver over both transports.

OTLP/gRPC: `opentelemetry.proto.collector.trace.v1.TraceService/Export` (grpcio server).
OTLP/HTTP: `POST /v1/traces`, an `ExportTraceServiceRequest` in binary protobuf
(`application/x-protobuf`), optionally gzip- or deflate-encoded; the answer is an
`ExportTraceServiceResponse` of the same type, as the OTLP specification says
(opentelemetry.io/docs/specs/otlp). Both keep every span they receive, flattened with its
resource's attributes, for tests to read.
"""

from __future__ import annotations

import gzip
import threading
import zlib
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any, Self

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2

from tests.fakes.threaded_http import ThreadedHttpFake


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span, as the collector saw it."""

    service: str
    """The resource's service.name."""
    name: str
    trace_id: str
    """32 hex digits."""
    span_id: str
    parent_span_id: str
    """16 hex digits, "" for a root span."""
    kind: int
    """opentelemetry.proto.trace.v1.Span.SpanKind (2 = SERVER)."""
    attributes: dict[str, Any]
    transport: str
    """"grpc" or "http"."""


def _value(v: common_pb2.AnyValue) -> Any:
    field = v.WhichOneof("value")
    return getattr(v, field) if field else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


class _Sink:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self.requests = 0

    def add(self, request: trace_service_pb2.ExportTraceServiceRequest, transport: str) -> None:
        found = []
        for rs in request.resource_spans:
            service = str(_attrs(rs.resource.attributes).get("service.name", ""))
            for ss in rs.scope_spans:
                for s in ss.spans:
                    found.append(
                        ReceivedSpan(
                            service=service,
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            kind=s.kind,
                            attributes=_attrs(s.attributes),
                            transport=transport,
                        )
                    )
        with self._lock:
            self.requests += 1
            self._spans.extend(found)

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, sink: _Sink) -> None:
        self._sink = sink

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self._sink.add(request, "grpc")
        return trace_service_pb2.ExportTraceServiceResponse()


class _HttpHandler(BaseHTTPRequestHandler):
    fake: OtlpCollector

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        if self.path != "/v1/traces":
            self._reply(404, b"")
            return
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        encoding = (self.headers.get("content-encoding") or "").lower()
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        elif encoding:
            self._reply(415, b"")
            return
        if self.headers.get("content-type") != "application/x-protobuf":
            self._reply(415, b"")
            return
        request = trace_service_pb2.ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
        except Exception:
            self._reply(400, b"")
            return
        self.fake.sink.add(request, "http")
        self._reply(200, trace_service_pb2.ExportTraceServiceResponse().SerializeToString())

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class OtlpCollector(ThreadedHttpFake):
    """Receives OTLP traces on a gRPC port (`grpc_endpoint`) and an HTTP one (`url`)."""

    def __init__(self) -> None:
        super().__init__(_HttpHandler)
        self.sink = _Sink()
        self._grpc: grpc.Server | None = None
        self._grpc_port = 0

    @property
    def grpc_endpoint(self) -> str:
        """http://127.0.0.1:<port>: OTEL_EXPORTER_OTLP_ENDPOINT for the gRPC exporter."""
        return f"http://127.0.0.1:{self._grpc_port}"

    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far, over either transport."""
        return self.sink.spans()

    def start(self) -> Self:
        super().start()
        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(
            _TraceService(self.sink), self._grpc
        )
        self._grpc_port = self._grpc.add_insecure_port("127.0.0.1:0")
        self._grpc.start()
        return self

    def stop(self) -> None:
        if self._grpc is not None:
            self._grpc.stop(grace=None)
        super().stop()
