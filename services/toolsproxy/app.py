"""Assembles the tools proxy process: every tool behind one executor, gRPC and (optionally) MCP."""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry
from visior.toolsproxy.v1 import toolsproxy_pb2_grpc

from services.common.channels import open_channel
from services.common.health import watch_probe
from services.common.http_tracing import traced_async_client
from services.common.metrics import ClientRpcMetrics
from services.common.runner import Closer
from services.common.server import ListenError, RunningServer, start_server
from services.common.tool_contract import FETCH_CBR_DATA, FETCH_FINANCE_NEWS
from services.common.topology import SERVICE_BY_KEY
from services.common.tracing import install_tracing
from services.docstore.config import DocstoreSettings
from services.docstore.health import store_health
from services.docstore.store import DocumentStore
from services.toolsproxy.cbr import CbrClient, cbr_tool
from services.toolsproxy.clients import GrpcSearcher
from services.toolsproxy.config import ToolsProxySettings
from services.toolsproxy.mcp_server import McpEndpoint
from services.toolsproxy.ratelimit import RateLimiter
from services.toolsproxy.search_tools import SearchTools
from services.toolsproxy.servicer import ToolsProxyServicer
from services.toolsproxy.tavily import TavilyClient, tavily_tool
from services.toolsproxy.tools import DocumentTools, PrometheusToolMetrics, ToolExecutor

SERVICE_NAMES = SERVICE_BY_KEY["toolsproxy"].grpc_services
log = logging.getLogger("visior.toolsproxy")


def open_store(settings: DocstoreSettings) -> DocumentStore:
    """The document store the tools read. A SQLite file not there yet is made empty, so
    ToolsProxy may start before Retrieval writes it; that is said at WARNING with the path, as
    it is also what a data directory or URL other than Retrieval's looks like."""
    fresh = (
        settings.kind == "sqlite"
        and settings.target != ":memory:"
        and not Path(settings.target).exists()
    )
    store = settings.open()
    if fresh:
        log.warning(
            "no document store at this path yet: started with an empty one, which Retrieval "
            "fills; give both services the same METADATA_DB_URL or VISIOR_DATA_DIR",
            extra={"docstore": settings.display},
        )
    return store


async def start(settings: ToolsProxySettings) -> tuple[RunningServer, Closer]:
    registry = CollectorRegistry()
    tracing = install_tracing(settings.server.tracing, settings.server.service)
    store = open_store(settings.docstore)
    retrieval = open_channel(
        settings.retrieval,
        settings.server.max_message_bytes,
        ClientRpcMetrics(registry),
        tracing,
    )

    def third_party(peer: str, timeout_s: float) -> httpx.AsyncClient:
        # One HTTP client per external service: its own timeouts, no redirects to elsewhere;
        # spans of its calls (tracing on), but no traceparent sent to a third party.
        return traced_async_client(
            tracing, peer=peer, propagate=False, timeout=timeout_s, follow_redirects=False
        )

    cbr_http = third_party("cbr", settings.cbr.timeout_s)
    tavily_http = third_party("tavily", settings.tavily.timeout_s)
    executor = ToolExecutor(
        {
            **DocumentTools(store, settings.limits).tools,
            **SearchTools(GrpcSearcher(retrieval)).tools,
            FETCH_CBR_DATA: cbr_tool(CbrClient(cbr_http, settings.cbr)),
            FETCH_FINANCE_NEWS: tavily_tool(TavilyClient(settings.tavily, tavily_http)),
        },
        limits=settings.limits,
        rate_limiter=RateLimiter(settings.rate_limits),
        metrics=PrometheusToolMetrics(registry),
    )

    # The document tools read the store: it being down is the proxy's health's "down", with
    # the reason (GetHealth), and its services' NOT_SERVING (readiness).
    probe = partial(store_health, store)

    def register(server):  # type: ignore[no-untyped-def]
        toolsproxy_pb2_grpc.add_ToolsProxyServiceServicer_to_server(
            ToolsProxyServicer(executor, probe), server
        )

    running = await start_server(
        settings.server,
        register,
        SERVICE_NAMES,
        registry,
        domain="visior.toolsproxy",
        tracing=tracing,
    )

    # grpc.health.v1: ToolsProxyService follows the store; the server's own "" stays SERVING.
    watcher = asyncio.create_task(watch_probe(running, probe))

    async def close_clients() -> None:
        watcher.cancel()
        await retrieval.close()
        await cbr_http.aclose()
        await tavily_http.aclose()
        store.close()

    endpoint: McpEndpoint | None = None
    if settings.mcp.enabled:
        endpoint = McpEndpoint(executor, settings.mcp)
        try:
            await endpoint.start()
        except ListenError:
            await running.stop(0)  # let go of the gRPC port too
            await close_clients()
            raise
        running.companions.append(endpoint.stop)  # stops with gRPC, in the same grace

    async def close() -> None:
        if endpoint is not None:
            await endpoint.stop()
        await close_clients()

    return running, close
