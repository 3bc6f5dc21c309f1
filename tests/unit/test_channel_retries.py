"""The mesh channel's retries (services/common/channels.py): a read cut off by a stopping peer
is run again on its replacement; a call that does work is not, since grpc cannot tell whether
its handler ran."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.protobuf import descriptor_pool
from prometheus_client import CollectorRegistry
from visior.llm.v1 import llm_pb2  # noqa: F401  (its services in the pool)
from visior.orchestrator.v1 import orchestrator_pb2  # noqa: F401
from visior.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc
from visior.toolsproxy.v1 import toolsproxy_pb2, toolsproxy_pb2_grpc

from services.common.channels import READ_METHODS, open_channel
from services.common.interceptors import ServerInterceptor
from services.common.metrics import RpcMetrics
from services.common.settings import DownstreamSettings
from services.common.topology import free_ports

RUNS: list[str] = []
STARTED: list[asyncio.Event] = []
"""The event of the call running now: set when its handler starts."""


class SlowSearch(retrieval_pb2_grpc.RetrievalServiceServicer):
    async def Search(self, request, context):
        RUNS.append("Search")
        STARTED[-1].set()
        await asyncio.sleep(0.6 if len(RUNS) == 1 else 0)
        return retrieval_pb2.SearchResponse()


class SlowExecute(toolsproxy_pb2_grpc.ToolsProxyServiceServicer):
    async def Execute(self, request, context):
        RUNS.append("Execute")
        STARTED[-1].set()
        await asyncio.sleep(0.6 if len(RUNS) == 1 else 0)
        return toolsproxy_pb2.ExecuteResponse(status="ok")


async def _serve(port: int = 0) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(
        interceptors=[ServerInterceptor("visior.test", RpcMetrics(CollectorRegistry()))]
    )
    retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(SlowSearch(), server)
    toolsproxy_pb2_grpc.add_ToolsProxyServiceServicer_to_server(SlowExecute(), server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, port


async def _cut_off(call_of) -> tuple[object, list[str]]:
    """Start one call, stop the server under it (a rolling restart: the replacement is up on
    the same port at once), and return the call's outcome and the handler runs."""
    RUNS.clear()
    STARTED.append(asyncio.Event())
    server, port = await _serve()
    channel = open_channel(DownstreamSettings(f"127.0.0.1:{port}", 10.0, 3), 4 << 20)
    try:
        call = asyncio.ensure_future(call_of(channel))
        await STARTED[-1].wait()
        await server.stop(0.05)
        replacement, _ = await _serve(port)
        try:
            outcome: object = await call
        except grpc.aio.AioRpcError as exc:
            outcome = exc.code()
        await replacement.stop(0)
        return outcome, list(RUNS)
    finally:
        await channel.close()


async def test_a_read_cut_off_by_a_stopping_peer_runs_again_on_its_replacement():
    outcome, runs = await _cut_off(
        lambda ch: retrieval_pb2_grpc.RetrievalServiceStub(ch).Search(
            retrieval_pb2.SearchRequest(query="q", tenant_id="t")
        )
    )
    assert isinstance(outcome, retrieval_pb2.SearchResponse) and runs == ["Search", "Search"]


async def test_a_call_that_does_work_is_not_run_twice():
    """A tool call (or a Generate, a Respond) cut off as its peer stops fails UNAVAILABLE: it
    may have done its work, so it is not repeated on the replacement."""
    outcome, runs = await _cut_off(
        lambda ch: toolsproxy_pb2_grpc.ToolsProxyServiceStub(ch).Execute(
            toolsproxy_pb2.ExecuteRequest(tool_name="fetch_finance_news")
        )
    )
    assert outcome == grpc.StatusCode.UNAVAILABLE and runs == ["Execute"]


@pytest.mark.parametrize("name", READ_METHODS, ids=lambda n: n.get("method", n["service"]))
def test_every_read_method_named_exists(name):
    service = descriptor_pool.Default().FindServiceByName(name["service"])
    if "method" in name:
        assert service.FindMethodByName(name["method"]) is not None


async def test_a_call_that_reached_no_server_is_sent_again_when_it_comes_up():
    """A neighbour restarting: the connection is refused, so no handler ran, and the tool call
    (or Generate, Respond) is sent again once the server is up, within the call's deadline."""
    RUNS.clear()
    STARTED.append(asyncio.Event())
    port = free_ports(1)[0]
    channel = open_channel(DownstreamSettings(f"127.0.0.1:{port}", 10.0, 3), 4 << 20)
    try:
        call = asyncio.ensure_future(
            toolsproxy_pb2_grpc.ToolsProxyServiceStub(channel).Execute(
                toolsproxy_pb2.ExecuteRequest(tool_name="fetch_finance_news")
            )
        )
        await asyncio.sleep(0.1)  # the first attempt has found nothing listening
        RUNS.append("warm")  # the handler answers at once (its first run sleeps)
        server, _ = await _serve(port)
        assert (await call).status == "ok" and RUNS == ["warm", "Execute"]
        await server.stop(0)
    finally:
        await channel.close()


async def test_with_one_attempt_a_call_that_reached_no_server_fails_at_once():
    port = free_ports(1)[0]
    channel = open_channel(DownstreamSettings(f"127.0.0.1:{port}", 10.0, 1), 4 << 20)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await toolsproxy_pb2_grpc.ToolsProxyServiceStub(channel).Execute(
                toolsproxy_pb2.ExecuteRequest(tool_name="x")
            )
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await channel.close()
