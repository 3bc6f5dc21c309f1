"""The common server stack on a real grpc.aio server: errors, trace ids, deadlines, retries, shutdown."""

import asyncio
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import CollectorRegistry
from visior.toolsproxy.v1 import toolsproxy_pb2 as pb
from visior.toolsproxy.v1 import toolsproxy_pb2_grpc as pbg

from services.common import errors
from services.common.channels import open_channel
from services.common.context import current_trace_id, remaining_seconds
from services.common.server import start_server
from services.common.settings import DownstreamSettings, ServerSettings
from services.common.status import error_info, from_rpc_error

NAME = "visior.toolsproxy.v1.ToolsProxyService"


class Toy(pbg.ToolsProxyServiceServicer):
    """Execute does what tool_name says, so each test drives the server stack directly."""

    def __init__(self):
        self.calls = 0
        self.seen = []
        self.release = asyncio.Event()

    async def Execute(self, request, context):
        self.calls += 1
        self.seen.append((current_trace_id(), remaining_seconds()))
        match request.tool_name:
            case "limit":
                raise errors.LimitExceededError(
                    "too many", metadata={"field": "x", "limit": "5", "limit_name": "max_x"}
                )
            case "bug":
                raise RuntimeError("secret internals")
            case "flaky" if self.calls == 1:
                raise errors.UnavailableError("try again")
            case "bad_once" if self.calls == 1:
                raise errors.InvalidArgumentError("no")
            case "slow":
                await self.release.wait()
        return pb.ExecuteResponse(status="ok", trace_id=request.trace_id)


@pytest.fixture
async def toy():
    servicer = Toy()
    registry = CollectorRegistry()
    settings = ServerSettings("toy", port=0, max_message_bytes=64 * 1024, metrics_port=0)
    running = await start_server(
        settings,
        lambda s: pbg.add_ToolsProxyServiceServicer_to_server(servicer, s),
        (NAME,),
        registry,
        domain="visior.toy",
    )
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
    yield servicer, running, channel, registry
    await channel.close()
    await running.stop(0)


async def test_service_error_becomes_status_with_one_error_info(toy):
    _, _, channel, _ = toy
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await pbg.ToolsProxyServiceStub(channel).Execute(pb.ExecuteRequest(tool_name="limit"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    ei = error_info(info.value)
    assert (ei.reason, ei.domain, dict(ei.metadata)) == (
        "LIMIT_EXCEEDED",
        "visior.toy",
        {"field": "x", "limit": "5", "limit_name": "max_x"},
    )


async def test_a_downstream_limit_reaches_the_caller_with_its_limit_not_its_field(toy):
    _, _, channel, _ = toy
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await pbg.ToolsProxyServiceStub(channel).Execute(pb.ExecuteRequest(tool_name="limit"))
    err = from_rpc_error(info.value, "toy")
    assert isinstance(err, errors.LimitExceededError) and err.reason == "LIMIT_EXCEEDED"
    assert err.metadata == {
        "downstream": "toy", "downstream_code": "INVALID_ARGUMENT",
        "limit": "5", "limit_name": "max_x",
    }  # fmt: skip


async def test_unexpected_exception_is_a_generic_internal_error(toy):
    _, _, channel, _ = toy
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await pbg.ToolsProxyServiceStub(channel).Execute(pb.ExecuteRequest(tool_name="bug"))
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert "secret" not in info.value.details()
    assert error_info(info.value).reason == "INTERNAL"


async def test_trace_id_from_request_then_metadata_then_generated(toy):
    servicer, _, channel, _ = toy
    stub = pbg.ToolsProxyServiceStub(channel)
    r = await stub.Execute(pb.ExecuteRequest(tool_name="ok", trace_id="from-body"),
                           metadata=(("x-trace-id", "from-meta"),))  # fmt: skip
    assert r.trace_id == "from-body"
    r = await stub.Execute(
        pb.ExecuteRequest(tool_name="ok"), metadata=(("x-trace-id", "from-meta"),)
    )
    assert r.trace_id == "from-meta"
    r = await stub.Execute(pb.ExecuteRequest(tool_name="ok"))
    assert len(r.trace_id) == 32
    assert [s[0] for s in servicer.seen] == ["from-body", "from-meta", r.trace_id]


async def test_caller_deadline_is_visible_to_the_handler_and_absent_without_one(toy):
    servicer, _, channel, _ = toy
    stub = pbg.ToolsProxyServiceStub(channel)
    await stub.Execute(pb.ExecuteRequest(tool_name="ok"), timeout=5)
    await stub.Execute(pb.ExecuteRequest(tool_name="ok"))
    with_deadline, without = servicer.seen[0][1], servicer.seen[1][1]
    # The grpc-timeout header is rounded up to a few digits, so allow a little over 5 s.
    assert 4 < with_deadline <= 5.1
    assert without is None


async def test_downstream_channel_never_reruns_a_handler_that_answered(toy):
    servicer, running, _, _ = toy
    channel = open_channel(DownstreamSettings(f"127.0.0.1:{running.port}", 5.0, 3), 1 << 20)
    stub = pbg.ToolsProxyServiceStub(channel)
    # A handler's UNAVAILABLE means it ran and its own dependency failed after its own
    # retries: not run again (no retry amplification down the mesh).
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Execute(pb.ExecuteRequest(tool_name="flaky"))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE and servicer.calls == 1
    servicer.calls = 0
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Execute(pb.ExecuteRequest(tool_name="bad_once"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and servicer.calls == 1
    await channel.close()


async def test_downstream_channel_puts_a_deadline_on_every_call(toy):
    servicer, running, _, _ = toy
    channel = open_channel(DownstreamSettings(f"127.0.0.1:{running.port}", 0.2, 1), 1 << 20)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await pbg.ToolsProxyServiceStub(channel).Execute(pb.ExecuteRequest(tool_name="slow"))
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert 0 < servicer.seen[0][1] <= 0.21  # grpc-timeout is rounded up a little
    err = from_rpc_error(info.value, "toy")
    assert isinstance(err, errors.UnavailableError) and err.metadata["downstream"] == "toy"
    servicer.release.set()
    await channel.close()


async def test_a_neighbour_that_accepts_but_never_answers_costs_the_deadline_not_a_fast_fail():
    """A stopped (SIGSTOP) or overloaded neighbour: the kernel accepts the TCP connection, the
    HTTP/2 handshake never comes. The call waits for it until its deadline; with a 100 ms
    connect timeout it failed at once with "failed to connect to all addresses"."""
    import socket
    import time

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)  # accepted by the kernel, never read
    port = listener.getsockname()[1]
    channel = open_channel(DownstreamSettings(f"127.0.0.1:{port}", 1.5, 3), 1 << 20)
    try:
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await pbg.ToolsProxyServiceStub(channel).Execute(pb.ExecuteRequest(tool_name="ok"))
        elapsed = time.monotonic() - started
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, info.value
        assert 1.4 <= elapsed < 5.0
    finally:
        await channel.close()
        listener.close()


async def test_message_size_limit(toy):
    _, _, channel, _ = toy
    stub = pbg.ToolsProxyServiceStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Execute(pb.ExecuteRequest(tool_name="x" * (65 * 1024)))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_health_reflection_and_metrics(toy):
    _, _, channel, registry = toy
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", NAME):
        r = await health.Check(health_pb2.HealthCheckRequest(service=service))
        assert r.status == health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(channel)
    call = refl.ServerReflectionInfo()
    await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
    listed = {s.name for s in (await call.read()).list_services_response.service}
    await call.done_writing()
    assert {NAME, "grpc.health.v1.Health"} <= listed
    stub = pbg.ToolsProxyServiceStub(channel)
    await stub.Execute(pb.ExecuteRequest(tool_name="ok"))
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.Execute(pb.ExecuteRequest(tool_name="limit"))
    labels = {"grpc_service": NAME, "grpc_method": "Execute", "grpc_type": "unary"}
    assert (
        registry.get_sample_value("grpc_server_handled_total", {**labels, "grpc_code": "OK"}) == 1
    )
    assert (
        registry.get_sample_value(
            "grpc_server_handled_total", {**labels, "grpc_code": "INVALID_ARGUMENT"}
        )
        == 1
    )
    assert registry.get_sample_value("grpc_server_handling_seconds_count", labels) == 2


async def test_metrics_are_served_over_http():
    registry = CollectorRegistry()
    running = await start_server(
        ServerSettings("toy", port=0, metrics_port=0),
        lambda s: pbg.add_ToolsProxyServiceServicer_to_server(Toy(), s),
        (NAME,),
        registry,
        domain="visior.toy",
    )
    from services.common.server import MetricsExporter

    exporter = MetricsExporter(registry, "127.0.0.1", 0)
    port = exporter.port
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
    await pbg.ToolsProxyServiceStub(channel).Execute(pb.ExecuteRequest(tool_name="ok"))
    body = await asyncio.to_thread(
        lambda: (
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        )
    )
    assert 'grpc_server_handled_total{grpc_code="OK",grpc_method="Execute"' in body
    await channel.close()
    await exporter.stop()
    await running.stop(0)


async def test_graceful_stop_finishes_in_flight_and_refuses_new_work(toy):
    servicer, running, channel, _ = toy
    stub = pbg.ToolsProxyServiceStub(channel)
    in_flight = asyncio.ensure_future(stub.Execute(pb.ExecuteRequest(tool_name="slow")))
    while servicer.calls == 0:  # noqa: ASYNC110 - polling a counter the handler bumps
        await asyncio.sleep(0.01)
    stopping = asyncio.ensure_future(running.stop(grace=5, drain=0.5))
    await asyncio.sleep(0.1)
    health = health_pb2_grpc.HealthStub(channel)
    status = (await health.Check(health_pb2.HealthCheckRequest())).status
    assert status == health_pb2.HealthCheckResponse.NOT_SERVING
    # The service's own GetHealth (JSON GET /health) says so too, while work is still taken.
    with pytest.raises(grpc.aio.AioRpcError) as draining:
        await stub.GetHealth(pb.GetHealthRequest(), timeout=2)
    assert draining.value.code() == grpc.StatusCode.UNAVAILABLE
    assert error_info(draining.value).reason == "DRAINING"
    assert (await stub.Execute(pb.ExecuteRequest(tool_name="ok"), timeout=2)).status == "ok"
    await asyncio.sleep(0.6)  # past the drain: the server now refuses new RPCs
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Execute(pb.ExecuteRequest(tool_name="ok"), timeout=2)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    servicer.release.set()
    assert (await in_flight).status == "ok"
    await stopping


@pytest.mark.parametrize("bad", ["трасса-1", "a\nb", "x" * 129])
async def test_a_bad_trace_id_in_the_request_is_invalid_argument(toy, bad):
    _, _, channel, _ = toy
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await pbg.ToolsProxyServiceStub(channel).Execute(
            pb.ExecuteRequest(tool_name="ok", trace_id=bad)
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(error_info(info.value).metadata) == {"field": "trace_id"}


async def test_a_bad_trace_id_in_metadata_is_replaced(toy):
    _, _, channel, _ = toy
    r = await pbg.ToolsProxyServiceStub(channel).Execute(
        pb.ExecuteRequest(tool_name="ok"), metadata=(("x-trace-id", "no spaces allowed"),)
    )
    assert len(r.trace_id) == 32 and " " not in r.trace_id
    ok = await pbg.ToolsProxyServiceStub(channel).Execute(
        pb.ExecuteRequest(tool_name="ok", trace_id="x" * 128)
    )
    assert ok.trace_id == "x" * 128


async def test_a_bad_x_trace_id_gives_way_to_a_traceparent(toy):
    """An x-trace-id no trace id can be is ignored, not also the W3C id beside it."""
    _, _, channel, _ = toy
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    r = await pbg.ToolsProxyServiceStub(channel).Execute(
        pb.ExecuteRequest(tool_name="ok"),
        metadata=(("x-trace-id", "checkout/42"), ("traceparent", parent)),
    )
    assert r.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"


async def test_a_failed_call_names_its_trace_id_in_its_trailers(toy):
    """A caller who sent no trace id can still quote the failed call's to an operator."""
    _, _, channel, _ = toy
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await pbg.ToolsProxyServiceStub(channel).Execute(pb.ExecuteRequest(tool_name="bug"))
    trailers = dict(info.value.trailing_metadata() or ())
    assert len(trailers["x-trace-id"]) == 32
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await pbg.ToolsProxyServiceStub(channel).Execute(
            pb.ExecuteRequest(tool_name="bug"), metadata=(("x-trace-id", "mine-1"),)
        )
    assert dict(info.value.trailing_metadata() or ())["x-trace-id"] == "mine-1"


async def test_transport_failures_do_not_leak_addresses():
    channel = grpc.aio.insecure_channel("127.0.0.1:1")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await pbg.ToolsProxyServiceStub(channel).Execute(
            pb.ExecuteRequest(tool_name="ok"), timeout=2
        )
    err = from_rpc_error(info.value, "toolsproxy")
    assert isinstance(err, errors.UnavailableError)
    assert "127.0.0.1" not in err.message and err.message == "toolsproxy failed: UNAVAILABLE"
    await channel.close()
