"""Optional OpenTelemetry tracing: settings, spans across two in-process servers, off by default;
and the client-side RPC metrics of the same mesh channels."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import textwrap
import time

import grpc
import pytest
from grpc_health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from grpc_health.v1.health_pb2_grpc import HealthStub
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry
from visior.toolsproxy.v1 import toolsproxy_pb2 as pb
from visior.toolsproxy.v1 import toolsproxy_pb2_grpc as pbg

from services.common import errors, settings
from services.common.channels import open_channel
from services.common.context import current_trace_id, deadline_var, trace_id_var
from services.common.metrics import ClientRpcMetrics
from services.common.server import start_server
from services.common.settings import DownstreamSettings, Env, ServerSettings, SettingsError
from services.common.tracing import (
    create_tracing,
    installed_tracing,
    otel_trace_id,
    parse_traceparent,
)
from services.devtools.envoy import REPO_ROOT
from tests.unit.json_logs import json_lines

NAME = "visior.toolsproxy.v1.ToolsProxyService"
METHOD = f"{NAME}/Execute"
HEX_TRACE = "0af7651916cd43dd8448eb211c80319c"


class Back(pbg.ToolsProxyServiceServicer):
    """The second hop: records the trace id and traceparent it was called with."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    async def Execute(self, request, context):
        meta = dict(context.invocation_metadata())
        self.seen.append((current_trace_id(), meta.get("traceparent", "")))
        if request.tool_name == "bug":
            raise RuntimeError("boom")
        if request.tool_name == "bad":
            raise errors.InvalidArgumentError("no")
        return pb.ExecuteResponse(status="ok", trace_id=request.trace_id)


class Front(pbg.ToolsProxyServiceServicer):
    """The first hop: forwards tool_name to Back over a mesh channel (no trace id in the body)."""

    def __init__(self) -> None:
        self.channel: grpc.aio.Channel | None = None

    async def Execute(self, request, context):
        assert self.channel is not None
        stub = pbg.ToolsProxyServiceStub(self.channel)
        try:
            await stub.Execute(pb.ExecuteRequest(tool_name=request.tool_name))
        except grpc.aio.AioRpcError as exc:
            raise errors.UnavailableError(f"back said {exc.code().name}") from None
        return pb.ExecuteResponse(status="ok", trace_id=request.trace_id)


async def _start(servicer, tracing):
    return await start_server(
        ServerSettings("toy", port=0),
        lambda s: pbg.add_ToolsProxyServiceServicer_to_server(servicer, s),
        (NAME,),
        CollectorRegistry(),
        domain="visior.toy",
        tracing=tracing,
    )


@pytest.fixture
async def two_hops():
    """Front -> Back, each with its own provider (as two processes), one span exporter."""
    exporter = InMemorySpanExporter()
    back, front = Back(), Front()
    back_server = await _start(back, create_tracing("back", exporter))
    front_server = await _start(front, create_tracing("front", exporter))
    front.channel = open_channel(DownstreamSettings(f"127.0.0.1:{back_server.port}", 5.0), 1 << 20)
    client = grpc.aio.insecure_channel(f"127.0.0.1:{front_server.port}")
    yield pbg.ToolsProxyServiceStub(client), back, exporter
    await client.close()
    await front.channel.close()
    await front_server.stop(0)
    await back_server.stop(0)


@pytest.fixture
async def traced_hops():
    """two_hops with Front's channel opened with Front's Tracing: its calls are CLIENT spans."""
    exporter = InMemorySpanExporter()
    back, front = Back(), Front()
    back_server = await _start(back, create_tracing("back", exporter))
    front_tracing = create_tracing("front", exporter)
    front_server = await _start(front, front_tracing)
    target = f"127.0.0.1:{back_server.port}"
    front.channel = open_channel(DownstreamSettings(target, 5.0), 1 << 20, None, front_tracing)
    client = grpc.aio.insecure_channel(f"127.0.0.1:{front_server.port}")
    yield pbg.ToolsProxyServiceStub(client), back, exporter, front_tracing, back_server.port
    await client.close()
    await front.channel.close()
    await front_server.stop(0)
    await back_server.stop(0)


def _by_service(exporter: InMemorySpanExporter) -> dict[str, list]:
    out: dict[str, list] = {}
    for span in exporter.get_finished_spans():
        out.setdefault(span.resource.attributes["service.name"], []).append(span)
    return out


async def _finished(exporter: InMemorySpanExporter, *services: str) -> dict[str, list]:
    """_by_service once every named service has ended a span. A failed call's status reaches
    the caller when the server aborts, a moment before its interceptor ends the span."""
    for _ in range(200):
        spans = _by_service(exporter)
        if all(name in spans for name in services):
            return spans
        await asyncio.sleep(0.01)
    raise AssertionError(f"no finished span of {services}: {sorted(_by_service(exporter))}")


async def test_a_call_across_two_servers_is_one_trace_with_parent_and_child(two_hops):
    stub, back, exporter = two_hops
    await stub.Execute(pb.ExecuteRequest(tool_name="ok", trace_id=HEX_TRACE))
    spans = _by_service(exporter)
    [front], [child] = spans["visior-front"], spans["visior-back"]
    assert front.name == child.name == METHOD
    assert front.kind == child.kind == SpanKind.SERVER
    # One trace id, equal to the mesh's trace_id; Back's span is the child of Front's.
    assert front.context.trace_id == child.context.trace_id == int(HEX_TRACE, 16)
    assert front.parent is None
    assert child.parent is not None and child.parent.span_id == front.context.span_id
    assert back.seen[0][0] == HEX_TRACE  # the logs' trace id is the span's
    assert parse_traceparent(back.seen[0][1])[:2] == (int(HEX_TRACE, 16), front.context.span_id)
    for span in (front, child):
        assert span.attributes["rpc.system"] == "grpc"
        assert span.attributes["rpc.service"] == NAME
        assert span.attributes["rpc.method"] == "Execute"
        assert span.attributes["rpc.grpc.status_code"] == 0
        assert span.attributes["visior.trace_id"] == HEX_TRACE
        assert span.status.status_code == StatusCode.UNSET


async def test_a_trace_id_that_is_not_hex_maps_to_one_otel_trace_id(two_hops):
    stub, _, exporter = two_hops
    await stub.Execute(pb.ExecuteRequest(tool_name="ok", trace_id="order-42:retry.1"))
    [front], [child] = _by_service(exporter).values()
    assert front.context.trace_id == child.context.trace_id == otel_trace_id("order-42:retry.1")
    assert child.attributes["visior.trace_id"] == "order-42:retry.1"
    assert otel_trace_id("order-42:retry.1") != otel_trace_id("order-42:retry.2")


async def test_a_callers_traceparent_is_the_parent_and_names_the_request(two_hops):
    stub, back, exporter = two_hops
    parent = f"00-{HEX_TRACE}-00f067aa0ba902b7-01"
    r = await stub.Execute(pb.ExecuteRequest(tool_name="ok"), metadata=(("traceparent", parent),))
    assert r.trace_id == HEX_TRACE  # no x-trace-id: the W3C trace id is the mesh's
    assert back.seen[0][0] == HEX_TRACE
    front = _by_service(exporter)["visior-front"][0]
    assert front.context.trace_id == int(HEX_TRACE, 16)
    assert front.parent is not None and front.parent.span_id == 0x00F067AA0BA902B7
    assert front.parent.is_remote


async def test_a_traceparent_of_another_trace_is_a_link_not_the_parent(two_hops):
    stub, _, exporter = two_hops
    other = "4bf92f3577b34da6a3ce929d0e0e4736"
    await stub.Execute(
        pb.ExecuteRequest(tool_name="ok", trace_id=HEX_TRACE),
        metadata=(("traceparent", f"00-{other}-00f067aa0ba902b7-01"),),
    )
    front = _by_service(exporter)["visior-front"][0]
    assert front.context.trace_id == int(HEX_TRACE, 16) and front.parent is None
    assert [link.context.trace_id for link in front.links] == [int(other, 16)]


@pytest.mark.parametrize(
    "value",
    [
        "garbage",
        f"00-{'0' * 32}-00f067aa0ba902b7-01",  # all-zero trace id
        f"00-{HEX_TRACE}-{'0' * 16}-01",  # all-zero span id
        f"ff-{HEX_TRACE}-00f067aa0ba902b7-01",  # forbidden version
        f"00-{HEX_TRACE[:-1]}-00f067aa0ba902b7-01",  # short trace id
    ],
)
async def test_an_invalid_traceparent_is_ignored(two_hops, value):
    stub, back, exporter = two_hops
    r = await stub.Execute(pb.ExecuteRequest(tool_name="ok"), metadata=(("traceparent", value),))
    front = _by_service(exporter)["visior-front"][0]
    assert front.parent is None and not front.links
    assert len(r.trace_id) == 32 and front.context.trace_id == int(r.trace_id, 16)
    assert back.seen[0][0] == r.trace_id


@pytest.mark.parametrize(
    ("tool", "back_code", "back_status"),
    [("bug", 13, StatusCode.ERROR), ("bad", 3, StatusCode.UNSET)],
)
async def test_the_status_code_is_an_attribute_and_server_errors_mark_the_span(
    two_hops, tool, back_code, back_status
):
    stub, _, exporter = two_hops
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.Execute(pb.ExecuteRequest(tool_name=tool, trace_id=HEX_TRACE))
    spans = await _finished(exporter, "visior-back", "visior-front")
    child, front = spans["visior-back"][0], spans["visior-front"][0]
    assert child.attributes["rpc.grpc.status_code"] == back_code
    assert child.status.status_code == back_status
    assert front.attributes["rpc.grpc.status_code"] == 14  # UNAVAILABLE
    assert front.status.status_code == StatusCode.ERROR


async def test_a_refused_trace_id_still_gets_a_span(two_hops):
    stub, _, exporter = two_hops
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Execute(pb.ExecuteRequest(tool_name="ok", trace_id="no spaces"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    [front] = _by_service(exporter)["visior-front"]
    assert front.attributes["rpc.grpc.status_code"] == 3


async def test_with_default_settings_no_tracer_provider_is_installed_nor_traceparent_sent():
    back, front = Back(), Front()
    back_server = await _start(back, None)
    front_server = await _start(front, None)
    front.channel = open_channel(DownstreamSettings(f"127.0.0.1:{back_server.port}", 5.0), 1 << 20)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{front_server.port}") as client:
        await pbg.ToolsProxyServiceStub(client).Execute(
            pb.ExecuteRequest(tool_name="ok", trace_id=HEX_TRACE)
        )
    await front.channel.close()
    await front_server.stop(0)
    await back_server.stop(0)
    assert back.seen == [(HEX_TRACE, "")]  # the trace id travelled, no traceparent
    assert installed_tracing() is None
    assert not isinstance(trace.get_tracer_provider(), TracerProvider)


_SERVE_ONE_CALL = """
import asyncio, sys
import grpc
from grpc_health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from grpc_health.v1.health_pb2_grpc import HealthStub
from prometheus_client import CollectorRegistry
from visior.toolsproxy.v1 import toolsproxy_pb2 as pb, toolsproxy_pb2_grpc as pbg
from services.common.channels import open_channel
from services.common.logging import configure_logging
from services.common.server import start_server
from services.common.settings import DownstreamSettings, Env, ServerSettings

class Echo(pbg.ToolsProxyServiceServicer):
    async def Execute(self, request, context):
        return pb.ExecuteResponse(status="ok", trace_id=request.trace_id)

async def main():
    configure_logging("toy", "WARNING")
    settings = ServerSettings.from_env("toy", "TOY_", Env(), 0)
    running = await start_server(settings,
        lambda s: pbg.add_ToolsProxyServiceServicer_to_server(Echo(), s),
        ("visior.toolsproxy.v1.ToolsProxyService",), CollectorRegistry(), domain="visior.toy")
    channel = open_channel(DownstreamSettings(f"127.0.0.1:{running.port}", 5.0), 1 << 20)
    await pbg.ToolsProxyServiceStub(channel).Execute(
        pb.ExecuteRequest(tool_name="ok", trace_id=sys.argv[1]))
    await channel.close()
    await running.stop(0)
    print("OTEL_LOADED" if any(m.startswith("opentelemetry") for m in sys.modules) else "NO_OTEL")

asyncio.run(main())
"""


def _serve_one_call(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_SERVE_ONE_CALL), HEX_TRACE],
        cwd=REPO_ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_by_default_a_serving_process_never_imports_opentelemetry():
    done = _serve_one_call({})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "NO_OTEL", done.stderr


def test_the_console_exporter_prints_the_span_of_a_served_call():
    done = _serve_one_call({"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "toy-svc"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "OTEL_LOADED"
    # The exporter's JSON object opens with a quoted key; grpc's core may print its own
    # braces to stderr first ("{http2_error:2}" at shutdown, seen once in CI).
    start = done.stderr.index('{"')
    span, _ = json.JSONDecoder().raw_decode(done.stderr[start:])
    assert span["name"] == METHOD
    assert span["context"]["trace_id"] == "0x" + HEX_TRACE
    assert span["kind"] == "SpanKind.SERVER"
    assert span["resource"]["attributes"]["service.name"] == "toy-svc"


# --- settings ---------------------------------------------------------------------------


def _tracing(env: dict[str, str]) -> settings.TracingSettings:
    return ServerSettings.from_env("toy", "TOY_", Env(env), 0).tracing


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"OTEL_TRACES_EXPORTER": "none"},
        {"OTEL_TRACES_EXPORTER": " , none"},
        {"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"},
        {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"},  # no package needed
    ],
)
def test_tracing_is_off(env):
    assert not _tracing(env).enabled


def test_tracing_on_with_the_console_exporter():
    t = _tracing({"OTEL_TRACES_EXPORTER": "Console,console", "OTEL_SERVICE_NAME": "svc"})
    assert (t.enabled, t.exporters, t.service_name) == (True, ("console",), "svc")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "'zipkin' is not one of none, console, otlp"),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "maybe"}, "not a boolean"),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, "needs opentelemetry-exporter-otlp-proto-grpc or"),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
            "'http/json' is not grpc or http/protobuf",
        ),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"},
            "needs opentelemetry-exporter-otlp-proto-grpc, which is not installed",
        ),
    ],
)
def test_a_bad_tracing_setting_is_refused_at_start(monkeypatch, env, message):
    real = settings._module_available
    monkeypatch.setattr(
        settings, "_module_available", lambda name: "exporter" not in name and real(name)
    )
    with pytest.raises(SettingsError, match=message):
        _tracing(env)


def test_otlp_picks_the_installed_exporter_package(monkeypatch):
    monkeypatch.setattr(settings, "_module_available", lambda name: "grpc" not in name)
    t = _tracing({"OTEL_TRACES_EXPORTER": "otlp"})
    assert (t.exporters, t.otlp_protocol) == (("otlp",), "http/protobuf")


def test_without_the_sdk_tracing_is_refused_at_start(monkeypatch):
    monkeypatch.setattr(settings, "_module_available", lambda name: False)
    with pytest.raises(SettingsError, match="opentelemetry-sdk is not installed"):
        _tracing({"OTEL_TRACES_EXPORTER": "console"})


def test_otel_trace_ids():
    assert otel_trace_id(HEX_TRACE) == int(HEX_TRACE, 16)
    assert otel_trace_id("0af76519-16cd-43dd-8448-eb211c80319c") == int(HEX_TRACE, 16)
    assert otel_trace_id("0" * 32) != 0  # the invalid all-zero id is hashed instead
    assert 0 < otel_trace_id("x") < 1 << 128


# --- client RPC metrics -----------------------------------------------------------------


async def test_client_metrics_count_each_call_by_code_in_seconds():
    back_server = await _start(Back(), None)
    registry = CollectorRegistry()
    channel = open_channel(
        DownstreamSettings(f"127.0.0.1:{back_server.port}", 5.0, 1),
        1 << 20,
        ClientRpcMetrics(registry),
    )
    stub = pbg.ToolsProxyServiceStub(channel)
    r = await stub.Execute(pb.ExecuteRequest(tool_name="ok", trace_id=HEX_TRACE))
    assert r.trace_id == HEX_TRACE  # the caller still gets the response
    for _ in range(2):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Execute(pb.ExecuteRequest(tool_name="bad"))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # and the error
    watch = HealthStub(channel).Watch(HealthCheckRequest())
    assert (await watch.read()).status == HealthCheckResponse.SERVING
    watch.cancel()
    await asyncio.sleep(0.05)  # the stream's done callback records it
    await channel.close()
    await back_server.stop(0)

    def sample(name: str, method: str = "Execute", kind: str = "unary", **extra: str) -> float:
        service = NAME if method == "Execute" else "grpc.health.v1.Health"
        labels = {"grpc_service": service, "grpc_method": method, "grpc_type": kind, **extra}
        return registry.get_sample_value(name, labels) or 0.0

    assert sample("grpc_client_started_total") == 3
    assert sample("grpc_client_handled_total", grpc_code="OK") == 1
    assert sample("grpc_client_handled_total", grpc_code="INVALID_ARGUMENT") == 2
    assert sample("grpc_client_handling_seconds_count") == 3
    assert 0 < sample("grpc_client_handling_seconds_sum") < 5
    assert sample("grpc_client_handling_seconds_bucket", le="30.0") == 3
    watch_labels = {"method": "Watch", "kind": "server_stream"}
    assert sample("grpc_client_started_total", **watch_labels) == 1
    assert sample("grpc_client_handled_total", **watch_labels, grpc_code="CANCELLED") == 1


async def test_server_streaming_calls_through_a_mesh_channel_get_the_deadline_too():
    # grpc.aio applies an interceptor to its first matching call kind only: a stream used to
    # go out with no deadline (and no trace id). Health/Watch streams until cancelled.
    back_server = await _start(Back(), None)
    registry = CollectorRegistry()
    channel = open_channel(
        DownstreamSettings(f"127.0.0.1:{back_server.port}", 0.3, 1),
        1 << 20,
        ClientRpcMetrics(registry),
    )
    watch = HealthStub(channel).Watch(HealthCheckRequest())
    assert (await watch.read()).status == HealthCheckResponse.SERVING
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await asyncio.wait_for(watch.read(), timeout=10)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await asyncio.sleep(0.05)
    await channel.close()
    await back_server.stop(0)
    labels = {"grpc_service": "grpc.health.v1.Health", "grpc_method": "Watch"}
    labels |= {"grpc_type": "server_stream", "grpc_code": "DEADLINE_EXCEEDED"}
    assert registry.get_sample_value("grpc_client_handled_total", labels) == 1


# --- CLIENT spans of the calls a service makes --------------------------------------------


def _kinds(spans: list, kind: SpanKind) -> list:
    return [s for s in spans if s.kind == kind]


async def test_a_traced_channel_makes_a_client_span_between_the_two_server_spans(traced_hops):
    stub, back, exporter, _, back_port = traced_hops
    await stub.Execute(pb.ExecuteRequest(tool_name="ok", trace_id=HEX_TRACE))
    spans = await _finished(exporter, "visior-back", "visior-front")
    [server] = _kinds(spans["visior-front"], SpanKind.SERVER)
    [client] = _kinds(spans["visior-front"], SpanKind.CLIENT)
    [child] = spans["visior-back"]
    # Front's SERVER span -> its CLIENT span -> Back's SERVER span, one trace.
    assert server.context.trace_id == client.context.trace_id == child.context.trace_id
    assert client.parent is not None and client.parent.span_id == server.context.span_id
    assert child.parent is not None and child.parent.span_id == client.context.span_id
    assert parse_traceparent(back.seen[0][1])[1] == client.context.span_id
    assert client.name == METHOD
    assert client.attributes["rpc.system"] == "grpc"
    assert client.attributes["rpc.service"] == NAME
    assert client.attributes["rpc.method"] == "Execute"
    assert client.attributes["rpc.grpc.status_code"] == 0
    assert client.attributes["server.address"] == f"127.0.0.1:{back_port}"
    assert client.attributes["visior.trace_id"] == HEX_TRACE
    assert client.status.status_code == StatusCode.UNSET
    # The client span lies inside the server span, and the callee's inside it.
    assert server.start_time <= client.start_time <= child.start_time
    assert child.end_time <= client.end_time <= server.end_time


@pytest.mark.parametrize(("tool", "code"), [("bug", 13), ("bad", 3)])
async def test_a_failed_call_is_an_error_client_span_whatever_the_code(traced_hops, tool, code):
    # Unlike a SERVER span, a CLIENT span is an error for every code but OK (the caller's
    # INVALID_ARGUMENT here is the callee's verdict on the call it made).
    stub, _, exporter, _, _ = traced_hops
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.Execute(pb.ExecuteRequest(tool_name=tool, trace_id=HEX_TRACE))
    spans = await _finished(exporter, "visior-back", "visior-front")
    [client] = _kinds(spans["visior-front"], SpanKind.CLIENT)
    assert client.attributes["rpc.grpc.status_code"] == code
    assert client.status.status_code == StatusCode.ERROR


async def test_a_call_made_outside_any_rpc_is_a_root_client_span_of_the_mesh_trace(traced_hops):
    _, _, exporter, tracing, back_port = traced_hops
    channel = open_channel(
        DownstreamSettings(f"127.0.0.1:{back_port}", 5.0), 1 << 20, None, tracing
    )
    token = trace_id_var.set(HEX_TRACE)
    try:
        await pbg.ToolsProxyServiceStub(channel).Execute(pb.ExecuteRequest(tool_name="ok"))
    finally:
        trace_id_var.reset(token)
        await channel.close()
    spans = await _finished(exporter, "visior-back", "visior-front")
    [client] = spans["visior-front"]
    assert client.kind == SpanKind.CLIENT and client.parent is None
    assert client.context.trace_id == int(HEX_TRACE, 16)
    [child] = spans["visior-back"]
    assert child.parent is not None and child.parent.span_id == client.context.span_id


async def test_a_call_past_the_callers_deadline_ends_its_client_span(traced_hops):
    _, _, exporter, tracing, back_port = traced_hops
    channel = open_channel(
        DownstreamSettings(f"127.0.0.1:{back_port}", 5.0), 1 << 20, None, tracing
    )
    token = deadline_var.set(time.monotonic() - 1)
    try:
        with pytest.raises(errors.DeadlineExceededError):
            await pbg.ToolsProxyServiceStub(channel).Execute(pb.ExecuteRequest(tool_name="ok"))
    finally:
        deadline_var.reset(token)
        await channel.close()
    [client] = _by_service(exporter)["visior-front"]
    assert client.kind == SpanKind.CLIENT
    assert client.attributes["rpc.grpc.status_code"] == 4  # DEADLINE_EXCEEDED
    assert client.status.status_code == StatusCode.ERROR


async def test_a_server_stream_call_is_a_client_span_that_ends_with_the_stream(traced_hops):
    _, _, exporter, tracing, back_port = traced_hops
    channel = open_channel(
        DownstreamSettings(f"127.0.0.1:{back_port}", 5.0), 1 << 20, None, tracing
    )
    watch = HealthStub(channel).Watch(HealthCheckRequest(service=NAME), timeout=0.5)
    first = await watch.read()
    assert first.status == HealthCheckResponse.SERVING
    assert not _by_service(exporter).get("visior-front")  # still streaming: not ended
    with pytest.raises(grpc.aio.AioRpcError):
        while True:
            await watch.read()  # ends at the 0.5 s deadline
    spans = await _finished(exporter, "visior-front")
    await channel.close()
    [client] = spans["visior-front"]
    assert client.kind == SpanKind.CLIENT and client.name == "grpc.health.v1.Health/Watch"
    assert client.attributes["rpc.grpc.status_code"] == 4  # DEADLINE_EXCEEDED
    assert client.status.status_code == StatusCode.ERROR


async def test_log_lines_carry_the_span_id_of_the_rpc_being_served(two_hops):
    stub, _, exporter = two_hops
    with json_lines("toy") as logs:
        logging.getLogger("visior.toy").info("before")
        await stub.Execute(pb.ExecuteRequest(tool_name="ok", trace_id=HEX_TRACE))
        logging.getLogger("visior.toy").info("after")
    spans = await _finished(exporter, "visior-back", "visior-front")
    ids = {f"{s.context.span_id:016x}" for v in spans.values() for s in v}
    rpc = logs.events("rpc")
    assert len(rpc) == 2  # one per hop, each inside its SERVER span
    assert {line["span_id"] for line in rpc} == ids
    assert {line["trace_id"] for line in rpc} == {HEX_TRACE}
    # Outside an RPC: no span, no trace (the ids were bound for the RPC's context only).
    for line in logs.events("before") + logs.events("after"):
        assert "span_id" not in line and line["trace_id"] is None
