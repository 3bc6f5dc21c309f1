"""ToolsProxy's GetHealth answers its document store's health, as Retrieval's does: "down" with
the reason when the store does not answer, or does not answer before the caller's deadline."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from visior.toolsproxy.v1 import toolsproxy_pb2

from services.common.context import deadline_var
from services.common.settings import Env
from services.docstore.config import docstore_settings
from services.docstore.errors import StoreUnavailableError
from services.docstore.health import store_health
from services.docstore.sqlite_store import SqliteDocumentStore
from services.toolsproxy.app import open_store
from services.toolsproxy.servicer import ToolsProxyServicer


class Catalogue:
    def catalogue(self) -> list[object]:
        return [object(), object()]


class DownStore:
    kind = "postgresql"

    def ping(self) -> None:
        raise StoreUnavailableError("document store (PostgreSQL db:5432): connection refused")


async def _health(servicer: ToolsProxyServicer) -> toolsproxy_pb2.GetHealthResponse:
    return await servicer.GetHealth(toolsproxy_pb2.GetHealthRequest(), None)  # type: ignore[arg-type]


async def test_a_store_that_answers_is_ok(tmp_path) -> None:
    store = SqliteDocumentStore(tmp_path / "docs.sqlite")
    try:
        servicer = ToolsProxyServicer(Catalogue(), lambda: store_health(store))  # type: ignore[arg-type]
        answer = await _health(servicer)
    finally:
        store.close()
    assert answer.status == "ok"
    assert dict(answer.details) == {"docstore": "sqlite", "tools": "2"}


async def test_a_down_store_is_down_with_the_reason() -> None:
    servicer = ToolsProxyServicer(Catalogue(), lambda: store_health(DownStore()))  # type: ignore[arg-type]
    answer = await _health(servicer)
    assert answer.status == "down"
    assert answer.details["docstore"] == (
        "error: document store (PostgreSQL db:5432): connection refused"
    )
    assert answer.details["tools"] == "2"


async def test_a_hung_store_is_down_before_the_callers_deadline() -> None:
    release = threading.Event()

    def probe() -> dict[str, str]:
        release.wait(5)
        return {"status": "ok"}

    servicer = ToolsProxyServicer(Catalogue(), probe)  # type: ignore[arg-type]
    token = deadline_var.set(time.monotonic() + 1.0)
    started = time.monotonic()
    try:
        answer = await _health(servicer)
    finally:
        deadline_var.reset(token)
        release.set()
    assert time.monotonic() - started < 1.0
    assert answer.status == "down" and "the document store hangs" in answer.details["probe"]
    await asyncio.sleep(0.05)
    assert (await _health(servicer)).status == "ok"


def test_a_store_not_there_yet_is_opened_empty_and_said(tmp_path, caplog):
    """ToolsProxy may start before Retrieval writes the store, so the file is made; a wrong
    data directory looks the same, so the path is named at WARNING (once: the file exists
    from then on)."""
    settings = docstore_settings(Env({"VISIOR_DATA_DIR": str(tmp_path)}), "MCP_PROXY_")
    with caplog.at_level(logging.WARNING, logger="visior.toolsproxy"):
        open_store(settings).close()
        open_store(settings).close()
    [line] = [r for r in caplog.records if "no document store" in r.getMessage()]
    assert line.docstore == str(tmp_path / "docstore.sqlite")
