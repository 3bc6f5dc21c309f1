"""GenerateStream when the server stops (SIGTERM: RunningServer.stop(grace)).

A stream still running when the grace is about to run out ends with an UNAVAILABLE DRAINING
error event, its last: a JSON caller's array then ends with {"error": …} (docs/transcoding.md)
instead of looking like a short finished answer, and a gRPC caller learns why. Before, grpc
cancelled the call at the end of the grace: no error event, UNAVAILABLE "Cancelling all
calls". A stream that finishes within the grace ends as usual.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from prometheus_client import CollectorRegistry
from visior.common.v1 import common_pb2
from visior.llm.v1 import llm_pb2, llm_pb2_grpc

from services.common.errors import DRAINING
from services.common.server import RunningServer, start_server
from services.common.settings import ServerSettings
from services.common.status import error_info
from services.common.topology import SERVICE_BY_KEY
from services.llm.engine import LlmEngine
from services.llm.loop import LoopSettings, ToolLoop
from services.llm.servicer import ERROR_DOMAIN, LlmServicer
from services.model_runtime.chat import ChatRequest, Completion, StreamDelta

GRACE_S = 2.0
STOP_BOUND_S = 10.0
"""Far past the grace: a stop that takes this long is stuck."""


class SlowModel:
    """A chat runtime whose stream writes a word every 0.05 s: `words` of them (0: without
    end), after `first_s` s."""

    name = "slow"

    def __init__(self, words: int = 0, first_s: float = 0.0) -> None:
        self.words, self.first_s = words, first_s
        self.started = asyncio.Event()

    async def complete(self, request: ChatRequest, *, timeout_s: float) -> Completion:
        """A unary Generate's call: silent for `first_s` s (the tests stop the server first)."""
        self.started.set()
        await asyncio.sleep(self.first_s)
        raise AssertionError("the server was to stop first")

    async def stream(self, request: ChatRequest, *, timeout_s: float) -> AsyncIterator[Any]:
        self.started.set()
        await asyncio.sleep(self.first_s)
        n = 0
        while not self.words or n < self.words:
            yield StreamDelta("w ")
            n += 1
            await asyncio.sleep(0.05)
        yield Completion("w " * n, completion_tokens=n, prompt_tokens=10)


async def serve(model: SlowModel) -> RunningServer:
    """The LLM servicer on a server started as the service starts it (services/llm/app.py)."""
    servicer = LlmServicer(LlmEngine(ToolLoop(model, None, (), LoopSettings())), model.name)  # type: ignore[arg-type]

    def register(server: grpc.aio.Server) -> None:
        llm_pb2_grpc.add_LlmServiceServicer_to_server(servicer, server)

    return await start_server(
        ServerSettings("llm", port=0),
        register,
        SERVICE_BY_KEY["llm"].grpc_services,
        CollectorRegistry(),
        domain=ERROR_DOMAIN,
    )


REQUEST = llm_pb2.GenerateStreamRequest(
    request=llm_pb2.GenerateRequest(
        messages=[common_pb2.ChatMessage(role="user", content="How do I set up LDAP?")],
        mode="chat",
    )
)


async def events_until_end(
    call: grpc.aio.UnaryStreamCall,
) -> tuple[list[llm_pb2.GenerateStreamResponse], grpc.aio.AioRpcError | None]:
    events: list[llm_pb2.GenerateStreamResponse] = []
    try:
        while (event := await call.read()) is not grpc.aio.EOF:
            events.append(event)
    except grpc.aio.AioRpcError as exc:
        return events, exc
    return events, None


def reason_of(status: Any) -> str:
    info = error_details_pb2.ErrorInfo()
    assert status.details and status.details[0].Unpack(info)
    return info.reason


async def test_a_stream_running_when_the_server_stops_ends_with_an_error_event() -> None:
    running = await serve(SlowModel())
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        call = llm_pb2_grpc.LlmServiceStub(channel).GenerateStream(REQUEST)
        first = await call.read()
        assert first.WhichOneof("event") == "delta"
        stop = asyncio.ensure_future(running.stop(GRACE_S))
        events, failed = await events_until_end(call)
        await asyncio.wait_for(stop, STOP_BOUND_S)
    last = events[-1]
    assert last.WhichOneof("event") == "error"
    assert last.error.code == grpc.StatusCode.UNAVAILABLE.value[0]
    assert reason_of(last.error) == DRAINING
    assert all(e.WhichOneof("event") == "delta" for e in events[:-1])
    assert failed is not None and failed.code() == grpc.StatusCode.UNAVAILABLE
    info = error_info(failed)
    assert info is not None and info.reason == DRAINING


async def test_a_stream_that_has_sent_nothing_when_the_server_stops_fails_draining() -> None:
    """No event yet: the error is the call's status alone (over JSON, an HTTP error)."""
    model = SlowModel(first_s=60.0)
    running = await serve(model)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        call = llm_pb2_grpc.LlmServiceStub(channel).GenerateStream(REQUEST)
        await asyncio.wait_for(model.started.wait(), STOP_BOUND_S)
        stop = asyncio.ensure_future(running.stop(GRACE_S))
        events, failed = await events_until_end(call)
        await asyncio.wait_for(stop, STOP_BOUND_S)
    assert events == []
    assert failed is not None and failed.code() == grpc.StatusCode.UNAVAILABLE
    info = error_info(failed)
    assert info is not None and info.reason == DRAINING


@pytest.mark.parametrize("words", [10])
async def test_a_stream_that_ends_within_the_grace_ends_as_usual(words: int) -> None:
    running = await serve(SlowModel(words=words))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        call = llm_pb2_grpc.LlmServiceStub(channel).GenerateStream(REQUEST)
        await call.read()
        stop = asyncio.ensure_future(running.stop(GRACE_S))
        events, failed = await events_until_end(call)
        await asyncio.wait_for(stop, STOP_BOUND_S)
    assert failed is None
    assert events[-1].WhichOneof("event") == "final"
    assert events[-1].final.answer == "w " * words


async def test_a_generate_running_when_the_server_stops_fails_draining() -> None:
    """A unary Generate ends as the streams do, not with grpc's bare cancel at the grace."""
    model = SlowModel(first_s=60.0)
    running = await serve(model)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        call = llm_pb2_grpc.LlmServiceStub(channel).Generate(REQUEST.request)
        await asyncio.wait_for(model.started.wait(), STOP_BOUND_S)
        stop = asyncio.ensure_future(running.stop(GRACE_S))
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await call
        await asyncio.wait_for(stop, STOP_BOUND_S)
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    info = error_info(failed.value)
    assert info is not None and info.reason == DRAINING
