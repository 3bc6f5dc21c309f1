"""A stub kept past VisiorClient.close() refuses to call instead of opening a connection
nothing would close; a server's own SERVER_BUSY refusal at its concurrency cap reaches the
caller as retryable."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from prometheus_client import CollectorRegistry
from visior.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc
from visior_sdk.visior.llm.v1 import GenerateStreamRequest
from visior_sdk.visior.retrieval.v1 import SearchRequest

from services.client import ResourceExhausted, Unavailable, VisiorClient
from services.common.server import RunningServer, start_server
from services.common.settings import ServerSettings
from services.common.topology import free_ports

CLOSED = "VisiorClient is closed"
WAIT_BOUND_SECONDS = 10.0
"""How long a test waits for the server to start a handler: a bound on a hang."""


@pytest.fixture
def port() -> int:
    """A port nobody listens on: a call that tries to connect fails with Unavailable."""
    (free,) = free_ports(1)
    return free


async def test_a_stub_kept_past_close_refuses_to_call_and_a_reopened_client_calls(
    port: int,
) -> None:
    visior = VisiorClient({"retrieval": port, "llm": port}, timeout=5)
    async with visior:
        retrieval = visior.retrieval
        stream = visior.llm.generate_stream(GenerateStreamRequest())
    with pytest.raises(RuntimeError, match=CLOSED):
        await retrieval.search(SearchRequest(query="q"))
    with pytest.raises(RuntimeError, match=CLOSED):
        await anext(stream)
    async with visior:
        assert visior.retrieval is not retrieval
        with pytest.raises(Unavailable):  # it tried to connect: nobody listens
            await visior.retrieval.search(SearchRequest(query="q"))


async def test_a_stub_taken_before_a_second_open_is_closed_with_the_client(port: int) -> None:
    visior = VisiorClient({"retrieval": port})
    visior.open()
    first = visior.retrieval
    visior.open()
    assert visior.retrieval is first
    visior.close()
    with pytest.raises(RuntimeError, match=CLOSED):
        await first.search(SearchRequest(query="q"))


class Held(retrieval_pb2_grpc.RetrievalServiceServicer):
    """Search waits until released; each call it starts is counted."""

    def __init__(self) -> None:
        self.started: asyncio.Queue[str] = asyncio.Queue()
        self.release = asyncio.Event()

    async def Search(
        self, request: retrieval_pb2.SearchRequest, context: grpc.aio.ServicerContext
    ) -> retrieval_pb2.SearchResponse:
        self.started.put_nowait(request.query)
        await self.release.wait()
        return retrieval_pb2.SearchResponse()


@pytest.fixture
async def capped() -> AsyncIterator[tuple[Held, RunningServer]]:
    """A retrieval server holding one call at a time (max_concurrent_rpcs=1)."""
    held = Held()
    running = await start_server(
        ServerSettings("retrieval", port=0, max_concurrent_rpcs=1),
        lambda server: retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(held, server),
        ("visior.retrieval.v1.RetrievalService",),
        CollectorRegistry(),
        domain="visior.retrieval",
    )
    try:
        yield held, running
    finally:
        held.release.set()
        await running.stop(0)


async def test_the_servers_own_busy_refusal_is_retryable(
    capped: tuple[Held, RunningServer],
) -> None:
    held, running = capped
    async with VisiorClient({"retrieval": running.port}, timeout=30) as visior:
        first = asyncio.ensure_future(visior.search("first", "t"))
        assert await asyncio.wait_for(held.started.get(), WAIT_BOUND_SECONDS) == "first"
        with pytest.raises(ResourceExhausted) as caught:
            await visior.search("second", "t")
        held.release.set()
        await first
    assert held.started.empty()  # the refused call ran no handler
    assert caught.value.reason == "SERVER_BUSY"
    assert caught.value.retryable is True
