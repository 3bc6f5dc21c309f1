"""ToolsProxy's health follows its document store, as Retrieval's does (services/common/health.py):
with PostgreSQL unreachable GetHealth says "down" with the reason and ToolsProxyService is
NOT_SERVING for a readiness probe, while the server's own status (liveness) stays SERVING;
both come back with the store."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from visior.toolsproxy.v1 import toolsproxy_pb2 as pb
from visior.toolsproxy.v1 import toolsproxy_pb2_grpc as pbg

from services.common import health
from services.common.settings import Env
from services.toolsproxy import app
from services.toolsproxy.config import ToolsProxySettings
from tests.pg_server import PgCluster


async def _serving(channel: grpc.aio.Channel, name: str) -> str:
    reply = await health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=name)
    )
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


async def _until(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 20.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never {what}")


async def test_a_down_store_is_down_with_the_reason_and_not_ready(tmp_path, monkeypatch):
    monkeypatch.setattr(health, "PROBE_EVERY_S", 0.1)
    cluster = PgCluster()  # its own: it is stopped mid-test
    try:
        env = {
            "MCP_PROXY_PORT": "0", "VISIOR_DATA_DIR": str(tmp_path),
            "METADATA_DB_URL": cluster.url(), "MCP_PROXY_DOCSTORE_TIMEOUT_S": "1",
        }  # fmt: skip
        running, close = await app.start(ToolsProxySettings.from_env(Env(env)))
        service = app.SERVICE_NAMES[0]
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
                stub = pbg.ToolsProxyServiceStub(channel)

                async def status() -> pb.GetHealthResponse:
                    return await stub.GetHealth(pb.GetHealthRequest(), timeout=10)

                up = await status()
                assert up.status == "ok" and up.details["docstore"] == "postgresql"
                assert await _serving(channel, service) == "SERVING"

                await asyncio.to_thread(cluster.stop, "immediate")
                down = await status()
                assert down.status == "down", down
                assert down.details["docstore"].startswith("error: document store (PostgreSQL")
                assert "tools" in down.details

                async def not_ready() -> bool:
                    return await _serving(channel, service) == "NOT_SERVING"

                await _until(not_ready, "NOT_SERVING with the store down")
                assert await _serving(channel, "") == "SERVING"  # liveness: no restart

                await asyncio.to_thread(cluster.start)

                async def ready() -> bool:
                    return (await status()).status == "ok" and (
                        await _serving(channel, service) == "SERVING"
                    )

                await _until(ready, "ok and SERVING with the store back")
        finally:
            await running.server.stop(0)
            await close()
    finally:
        cluster.destroy()
