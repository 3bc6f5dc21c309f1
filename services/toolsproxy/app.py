"""Assembles the tools proxy process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from visior.toolsproxy.v1 import toolsproxy_pb2_grpc

from services.common.runner import Closer
from services.common.server import RunningServer, start_server
from services.docstore.sqlite_store import SqliteDocumentStore
from services.toolsproxy.config import ToolsProxySettings
from services.toolsproxy.servicer import ToolsProxyServicer
from services.toolsproxy.tools import DocumentTools, ToolExecutor

SERVICE_NAMES = ("visior.toolsproxy.v1.ToolsProxyService",)


async def start(settings: ToolsProxySettings) -> tuple[RunningServer, Closer]:
    store = SqliteDocumentStore(settings.docstore_path)
    executor = ToolExecutor(DocumentTools(store, settings.limits).tools)

    def register(server):  # type: ignore[no-untyped-def]
        toolsproxy_pb2_grpc.add_ToolsProxyServiceServicer_to_server(
            ToolsProxyServicer(executor), server
        )

    running = await start_server(
        settings.server, register, SERVICE_NAMES, CollectorRegistry(), domain="visior.toolsproxy"
    )

    async def close() -> None:
        store.close()

    return running, close
