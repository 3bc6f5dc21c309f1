"""A server's start and stop: an open health Watch no longer holds a stop for its whole grace
period, and an address the server cannot listen on is one clear ListenError naming it."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from services.common.server import ListenError, start_server
from services.common.settings import ServerSettings

GRACE_SECONDS = 30.0
STOP_BOUND_SECONDS = 10.0
"""Far below the grace: a stop that waits for the Watch runs into it."""
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _register_nothing(server: grpc.aio.Server) -> None:
    pass


@pytest.mark.parametrize("drain", [0.0, 0.05])
async def test_an_open_watch_ends_at_stop_instead_of_holding_it_for_the_grace(
    drain: float,
) -> None:
    settings = ServerSettings("toy", port=0)
    running = await start_server(
        settings, _register_nothing, ("toy.v1.Toy",), CollectorRegistry(), domain="visior.toy"
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service="toy.v1.Toy")
        )
        assert (await watch.read()).status == SERVING
        await asyncio.wait_for(running.stop(GRACE_SECONDS, drain), STOP_BOUND_SECONDS)
        seen = [answer.status async for answer in _answers(watch)]
        # The watcher hears the server go NOT_SERVING before its stream ends, drain or none.
        assert seen[-1:] == [NOT_SERVING]
        assert await watch.code() == grpc.StatusCode.UNAVAILABLE


async def _answers(watch: grpc.aio.UnaryStreamCall) -> AsyncIterator[Any]:
    """The Watch's answers until it ends, whatever its status."""
    while True:
        try:
            answer = await watch.read()
        except grpc.aio.AioRpcError:
            return
        if answer is grpc.aio.EOF:
            return
        yield answer


async def test_health_stays_not_serving_once_the_stop_began() -> None:
    settings = ServerSettings("toy", port=0)
    running = await start_server(
        settings, _register_nothing, ("toy.v1.Toy",), CollectorRegistry(), domain="visior.toy"
    )
    try:
        stopping = asyncio.ensure_future(running.stop(0, drain=STOP_BOUND_SECONDS))
        await asyncio.sleep(0)  # the stop has set NOT_SERVING and is draining
        await running.set_serving(True)  # e.g. a backend probe that recovered meanwhile
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            answer = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=STOP_BOUND_SECONDS
            )
        assert answer.status == NOT_SERVING
    finally:
        stopping.cancel()
        await running.server.stop(0)


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another socket listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


async def _start(settings: ServerSettings) -> None:
    running = await start_server(
        settings, _register_nothing, (), CollectorRegistry(), domain="visior.toy"
    )
    await running.stop(0)  # only when the test fails


async def test_a_taken_port_is_a_listen_error_naming_the_address(taken_port: int) -> None:
    with pytest.raises(ListenError, match=rf"cannot listen for gRPC on 127\.0\.0\.1:{taken_port}"):
        await _start(ServerSettings("toy", port=taken_port))


async def test_a_host_of_another_machine_is_a_listen_error_naming_it() -> None:
    # 192.0.2.0/24 is TEST-NET-1: never an address of this machine.
    with pytest.raises(ListenError, match=r"cannot listen for gRPC on 192\.0\.2\.1:0"):
        await _start(ServerSettings("toy", host="192.0.2.1", port=0))


async def test_a_taken_metrics_port_is_a_listen_error_naming_it(taken_port: int) -> None:
    with pytest.raises(
        ListenError, match=rf"cannot listen for metrics on 127\.0\.0\.1:{taken_port}"
    ):
        await _start(ServerSettings("toy", port=0, metrics_port=taken_port))
