"""Retrieval health reports the vector store; in production mode a down store fails health."""

from __future__ import annotations

import asyncio
import queue

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from visior.retrieval.v1 import retrieval_pb2 as pb
from visior.retrieval.v1 import retrieval_pb2_grpc as pbg

from services.common import errors
from services.common.health import watch_probe
from services.common.server import RunningServer
from services.common.status import error_info
from services.common.topology import free_ports
from services.retrieval import app
from tests.retrieval_server import retrieval_channel


async def _health(tmp_path, production: bool):
    env = {
        "RETR_INDEX_BACKEND": "qdrant", "QDRANT_URL": f"http://127.0.0.1:{free_ports(1)[0]}",
        "RETR_INDEX_TIMEOUT_S": "0.2", "RETR_PRODUCTION": str(production).lower(),
    }  # fmt: skip
    async with retrieval_channel(tmp_path, **env) as channel:
        return await pbg.RetrievalServiceStub(channel).GetHealth(pb.GetHealthRequest())


async def test_a_down_store_is_reported_but_served_outside_production(tmp_path):
    health = await _health(tmp_path, production=False)
    assert health.status == "ok"
    assert health.details["index"] == "down" and health.details["backend"] == "qdrant"


async def test_a_down_store_fails_health_in_production(tmp_path):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _health(tmp_path, production=True)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert error_info(info.value).reason == "backend_unavailable"


async def _statuses(channel, names) -> list[str]:
    stub = health_pb2_grpc.HealthStub(channel)
    out = []
    for name in names:
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=name))
            out.append(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
        except grpc.aio.AioRpcError as err:
            out.append(err.code().name)
    return out


@pytest.mark.parametrize("production", [True, False])
async def test_in_production_a_down_store_takes_the_services_out_but_not_the_server(
    tmp_path, production: bool
):
    """A readiness probe asking for RetrievalService sees the store; a liveness probe ("")
    does not, so a store outage does not restart the replica."""
    env = {
        "RETR_INDEX_BACKEND": "qdrant", "QDRANT_URL": f"http://127.0.0.1:{free_ports(1)[0]}",
        "RETR_INDEX_TIMEOUT_S": "0.2", "RETR_PRODUCTION": str(production).lower(),
    }  # fmt: skip
    names = ["", *app.SERVICE_NAMES]
    async with retrieval_channel(tmp_path, **env) as channel:
        for _ in range(100):  # the watcher's first look comes at start
            statuses = await _statuses(channel, names)
            if not production or statuses[1] == "NOT_SERVING":
                break
            await asyncio.sleep(0.05)
    down = "NOT_SERVING" if production else "SERVING"
    assert statuses == ["SERVING", down, down]


async def test_the_watcher_follows_the_probe_both_ways():
    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    running = RunningServer(server, port, servicer, tuple(app.SERVICE_NAMES), None)  # type: ignore[arg-type]
    answers: queue.Queue[dict[str, str] | None] = queue.Queue()

    def probe() -> dict[str, str]:
        answer = answers.get(timeout=10)
        if answer is None:
            raise errors.BackendUnavailableError("the vector store is down")
        return answer

    async def after(answer: dict[str, str] | None, expected: str) -> None:
        answers.put(answer)
        for _ in range(400):
            if await _statuses(channel, app.SERVICE_NAMES) == [expected] * 2:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{answer} never gave {expected}")

    watcher = asyncio.create_task(watch_probe(running, probe, every_s=0))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await after({"status": "ok"}, "SERVING")
            await after({"status": "down"}, "NOT_SERVING")
            await after({"status": "ok"}, "SERVING")
            await after(None, "NOT_SERVING")
            assert await _statuses(channel, [""]) == ["SERVING"]  # the server's own, for liveness
            await after({"status": "ok"}, "SERVING")
    finally:
        watcher.cancel()
        answers.put({"status": "ok"})  # the probe's thread waits for one more
        await server.stop(0)


async def test_mock_mode_advertises_only_the_search_service(tmp_path):
    async with retrieval_channel(tmp_path, RETR_MOCK_MODE="true") as channel:
        statuses = await _statuses(channel, ["", *app.SERVICE_NAMES])
    assert statuses == ["SERVING", "SERVING", "NOT_FOUND"]
