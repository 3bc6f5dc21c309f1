"""The typed client's deadlines and trace ids against a real grpcio server: a silent stream
ends, a caller's own deadline is the one sent, and every call names its trace id (a
request body's own one, which the mesh's servers log the call under, first)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import grpc
import pytest
from grpclib.metadata import Deadline
from prometheus_client import CollectorRegistry
from visior.llm.v1 import llm_pb2, llm_pb2_grpc
from visior_sdk.visior.common.v1 import ChatMessage
from visior_sdk.visior.llm.v1 import GenerateRequest, GenerateStreamRequest

from services.client import DeadlineExceeded, Internal, InvalidArgument, VisiorClient
from services.common.context import (
    TRACE_METADATA_KEY,
    current_trace_id,
    deadline_var,
    valid_trace_id,
)
from services.common.server import start_server
from services.common.settings import ServerSettings
from services.common.topology import SERVICE_BY_KEY
from services.llm.servicer import LlmServicer

GENERATE_BUDGET_S = 120.0
"""Generate's budget (services.common.call_budgets.GENERATE), what the client used to cut to."""
WAIT_S = 10.0
"""Bound on a wait that must end; far above the 1 s idle limit the stall test configures."""


class FakeLlm(llm_pb2_grpc.LlmServiceServicer):
    """Generate records what each call arrived with; GenerateStream sends one event and then
    stays silent until the caller gives up."""

    def __init__(self) -> None:
        self.time_remaining: list[float | None] = []
        self.trace_ids: list[list[str]] = []
        self.stream_cancelled = asyncio.Event()

    async def Generate(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.time_remaining.append(context.time_remaining())
        metadata = context.invocation_metadata() or ()
        self.trace_ids.append([str(v) for k, v in metadata if k == TRACE_METADATA_KEY])
        if request.messages and request.messages[0].content == "refuse":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "refused")
        return llm_pb2.GenerateResponse()

    async def GenerateStream(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        yield llm_pb2.GenerateStreamResponse(delta="first")
        try:
            await asyncio.Event().wait()  # a stalled model: nothing more, ever
        except asyncio.CancelledError:
            self.stream_cancelled.set()
            raise


@pytest.fixture
def fake() -> FakeLlm:
    return FakeLlm()


@pytest.fixture
async def llm_port(fake: FakeLlm) -> AsyncIterator[int]:
    server = grpc.aio.server()
    llm_pb2_grpc.add_LlmServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield port
    finally:
        await server.stop(0)


def _request(content: str = "hello") -> GenerateRequest:
    return GenerateRequest(messages=[ChatMessage(role="user", content=content)])


async def test_a_silent_stream_ends_with_deadline_exceeded(fake: FakeLlm, llm_port: int) -> None:
    events: list[str] = []

    async def consume(visior: VisiorClient) -> None:
        async for event in visior.llm.generate_stream(GenerateStreamRequest(request=_request())):
            events.append(event.delta)

    async with VisiorClient({"llm": llm_port}, stream_idle_timeout=1.0) as visior:
        with pytest.raises(DeadlineExceeded) as caught:
            await asyncio.wait_for(consume(visior), WAIT_S)
    assert events == ["first"]  # the limit is between events, not on the whole stream
    assert caught.value.error_info is None and valid_trace_id(caught.value.trace_id)
    # The client reset the stream: the handler was cancelled, not left waiting.
    await asyncio.wait_for(fake.stream_cancelled.wait(), WAIT_S)


@pytest.mark.parametrize("client_timeout", [None, 10.0])
async def test_an_explicit_deadline_wins_over_the_default(
    fake: FakeLlm, llm_port: int, client_timeout: float | None
) -> None:
    async with VisiorClient({"llm": llm_port}, timeout=client_timeout) as visior:
        await visior.llm.generate(_request(), deadline=Deadline.from_timeout(600))
    (remaining,) = fake.time_remaining
    assert remaining is not None and remaining > 300 > GENERATE_BUDGET_S


async def test_the_served_requests_deadline_still_caps_an_explicit_one(
    fake: FakeLlm, llm_port: int
) -> None:
    # Inside one of our handlers (the interceptor sets deadline_var), 5 s are left.
    token = deadline_var.set(time.monotonic() + 5.0)
    try:
        async with VisiorClient({"llm": llm_port}) as visior:
            await visior.llm.generate(_request(), deadline=Deadline.from_timeout(600))
    finally:
        deadline_var.reset(token)
    (remaining,) = fake.time_remaining
    assert remaining is not None and remaining <= 5.0


async def test_every_call_sends_one_valid_trace_id(fake: FakeLlm, llm_port: int) -> None:
    # No trace_id configured and no request being served: the client makes one per call.
    async with VisiorClient({"llm": llm_port}) as visior:
        await visior.llm.generate(_request())
        await visior.llm.generate(_request())
    first, second = fake.trace_ids
    assert len(first) == len(second) == 1
    assert valid_trace_id(first[0]) and valid_trace_id(second[0])
    assert first != second


async def test_a_failures_trace_id_is_the_one_the_server_saw(fake: FakeLlm, llm_port: int) -> None:
    async with VisiorClient({"llm": llm_port}) as visior:
        with pytest.raises(InvalidArgument) as caught:
            await visior.llm.generate(_request("refuse"))
    assert fake.trace_ids == [[caught.value.trace_id]]


async def test_trace_id_wins_over_metadata_and_is_sent_once(fake: FakeLlm, llm_port: int) -> None:
    metadata = {"X-Trace-Id": "from-metadata"}
    async with VisiorClient({"llm": llm_port}, trace_id="t-1", metadata=metadata) as visior:
        await visior.llm.generate(_request())
        await visior.llm.generate(_request(), metadata={"x-trace-id": "per-call"})
    assert fake.trace_ids == [["t-1"], ["per-call"]]


class FailingEngine:
    """An LlmEngine whose generation fails as a bug does (INTERNAL), after noting the trace
    id it ran under (the one the server's log lines carry)."""

    def __init__(self) -> None:
        self.ran_under: list[str] = []

    async def generate(self, req: Any, sink: Any = None) -> Any:
        self.ran_under.append(current_trace_id())
        raise RuntimeError("bug")


class RecordingLlm(LlmServicer):
    """The LLM service's own servicer, noting the x-trace-id each call arrived with."""

    def __init__(self, engine: FailingEngine) -> None:
        super().__init__(engine, "fake")  # type: ignore[arg-type]
        self.sent: list[list[str]] = []

    def _note(self, context: grpc.aio.ServicerContext) -> None:
        metadata = context.invocation_metadata() or ()
        self.sent.append([str(v) for k, v in metadata if k == TRACE_METADATA_KEY])

    async def Generate(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self._note(context)
        return await super().Generate(request, context)

    async def GenerateStream(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self._note(context)
        async for event in super().GenerateStream(request, context):
            yield event


@pytest.fixture
def engine() -> FailingEngine:
    return FailingEngine()


@pytest.fixture
async def mesh_llm(engine: FailingEngine) -> AsyncIterator[tuple[RecordingLlm, int]]:
    """The LLM servicer behind the mesh's server (its interceptor takes a body's trace id)."""
    servicer = RecordingLlm(engine)
    running = await start_server(
        ServerSettings("llm", port=0, metrics_port=0),
        lambda s: llm_pb2_grpc.add_LlmServiceServicer_to_server(servicer, s),
        SERVICE_BY_KEY["llm"].grpc_services,
        CollectorRegistry(),
        domain="visior.llm",
    )
    try:
        yield servicer, running.port
    finally:
        await running.stop(0)


@pytest.mark.parametrize(
    ("client_trace", "call_metadata"),
    [(None, None), ("client-1", {"x-trace-id": "per-call"})],
    ids=["no-other-id", "over-the-client-and-call-ids"],
)
async def test_a_failures_trace_id_is_the_request_bodys_own(
    engine: FailingEngine,
    mesh_llm: tuple[RecordingLlm, int],
    client_trace: str | None,
    call_metadata: dict[str, str] | None,
) -> None:
    servicer, port = mesh_llm
    request = _request()
    request.trace_id = "body-trace-1"
    async with VisiorClient({"llm": port}, trace_id=client_trace) as visior:
        with pytest.raises(Internal) as caught:
            await visior.llm.generate(request, metadata=call_metadata)
    assert caught.value.trace_id == "body-trace-1"
    assert servicer.sent == [["body-trace-1"]]
    assert engine.ran_under == ["body-trace-1"]


async def test_a_streams_failure_names_its_inner_requests_trace_id(
    engine: FailingEngine, mesh_llm: tuple[RecordingLlm, int]
) -> None:
    servicer, port = mesh_llm
    inner = _request()
    inner.trace_id = "body-trace-2"
    async with VisiorClient({"llm": port}) as visior:
        stream = visior.llm.generate_stream(GenerateStreamRequest(request=inner))
        with pytest.raises(Internal) as caught:
            async with aclosing(stream):
                async for _event in stream:
                    pass
    assert caught.value.trace_id == "body-trace-2"
    assert servicer.sent == [["body-trace-2"]]
    assert engine.ran_under == ["body-trace-2"]


async def test_a_body_trace_id_the_services_refuse_is_not_sent(
    engine: FailingEngine, mesh_llm: tuple[RecordingLlm, int]
) -> None:
    servicer, port = mesh_llm
    inner = _request()
    inner.trace_id = "not a trace id"
    async with VisiorClient({"llm": port}, trace_id="client-1") as visior:
        stream = visior.llm.generate_stream(GenerateStreamRequest(request=inner))
        with pytest.raises(InvalidArgument) as caught:
            async with aclosing(stream):
                async for _event in stream:
                    pass
    assert caught.value.metadata == {"field": "trace_id"}
    assert caught.value.trace_id == "client-1"
    assert servicer.sent == [["client-1"]]
    assert engine.ran_under == []
