"""Assembles the LLM service process: runtime (model or extractive), tool loop, servicer."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import httpx
from prometheus_client import CollectorRegistry
from visior.llm.v1 import llm_pb2_grpc

from services.common.channels import open_channel
from services.common.http import quiet_http_client_logs
from services.common.http_tracing import traced_async_client
from services.common.metrics import ClientRpcMetrics
from services.common.runner import Closer
from services.common.server import RunningServer, start_server
from services.common.topology import SERVICE_BY_KEY
from services.common.tracing import install_tracing
from services.llm.config import LlmSettings
from services.llm.engine import LlmEngine
from services.llm.extractive import ExtractiveRuntime
from services.llm.loop import ToolLoop
from services.llm.metrics import LlmMetrics
from services.llm.servicer import ERROR_DOMAIN, LlmServicer
from services.llm.toolcalls import READ_TOOL_SPECS
from services.llm.tools_client import GrpcToolRunner, ToolCatalogue
from services.model_runtime.chat import ChatRuntime, ToolSpec
from services.model_runtime.client import OpenAiChatRuntime

SERVICE_NAMES = SERVICE_BY_KEY["llm"].grpc_services
CATALOGUE_RETRY_S = 1.0
"""Until ToolsProxy first answers, its catalogue is asked for this often."""
CATALOGUE_REFRESH_S = 60.0
"""Then this often, and on a request needing a tool it lacks at most this often."""


async def start(settings: LlmSettings) -> tuple[RunningServer, Closer]:
    quiet_http_client_logs()
    registry = CollectorRegistry()
    tracing = install_tracing(settings.server.tracing, settings.server.service)
    channel = open_channel(
        settings.tools_proxy,
        settings.server.max_message_bytes,
        ClientRpcMetrics(registry),
        tracing,
    )
    runner = GrpcToolRunner(channel)
    http: httpx.AsyncClient | None = None
    runtime: ChatRuntime
    if settings.runtime is not None:
        # A Generate makes one runtime call at a time: a connection for each call the server
        # admits, so that no call waits for one (the default pool holds 100).
        cap = settings.server.max_concurrent_rpcs
        http = traced_async_client(
            tracing,
            peer="llm-runtime",
            propagate=True,
            follow_redirects=False,
            limits=httpx.Limits(max_connections=cap, max_keepalive_connections=cap),
        )
        runtime = OpenAiChatRuntime(settings.runtime, http)
    else:
        runtime = ExtractiveRuntime()
    loop = ToolLoop(
        runtime,
        runner,
        READ_TOOL_SPECS,
        settings.loop,
    )

    def offer(specs: Sequence[ToolSpec]) -> None:
        loop.catalogue = tuple(specs)

    # Until ToolsProxy answers, the loop offers the two read tools with built-in schemas.
    catalogue = ToolCatalogue(
        runner, offer, READ_TOOL_SPECS, refresh_s=CATALOGUE_REFRESH_S, retry_s=CATALOGUE_RETRY_S
    )
    engine = LlmEngine(loop, LlmMetrics(registry), catalogue=catalogue)
    catalogue_task = asyncio.create_task(catalogue.keep_loaded())

    servicer = LlmServicer(engine, runtime.name)

    def register(server):  # type: ignore[no-untyped-def]
        llm_pb2_grpc.add_LlmServiceServicer_to_server(servicer, server)

    running = await start_server(
        settings.server, register, SERVICE_NAMES, registry, domain=ERROR_DOMAIN, tracing=tracing
    )

    async def close() -> None:
        catalogue_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await catalogue_task
        await channel.close()
        if http is not None:
            await http.aclose()

    return running, close
