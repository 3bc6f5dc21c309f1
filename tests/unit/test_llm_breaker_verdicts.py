"""Which ends of an LLM runtime call are a verdict on the runtime (its breaker), and what the
request's outcome says.

A wait for a free connection in the HTTP client's pool is the service being busy
(RESOURCE_EXHAUSTED SERVER_BUSY), not the runtime failing. A stream its caller's deadline
cuts while the runtime is still sending is the caller's deadline (no verdict,
DEADLINE_EXCEEDED); one that had stalled, a call the runtime's own timeout ends, and a
non-streamed call the caller's deadline ends past MIN_VERDICT_S are the runtime's timeout.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from typing import Any

import grpc
import httpx
import pytest
from prometheus_client import CollectorRegistry
from visior.common.v1 import common_pb2
from visior.llm.v1 import llm_pb2, llm_pb2_grpc

from services.common import errors
from services.common.breaker import CLOSED, OPEN, BreakerPolicy
from services.common.context import deadline_var
from services.common.interceptors import ServerInterceptor
from services.common.metrics import RpcMetrics
from services.common.outcomes import CANCELLED, DEADLINE_EXCEEDED, outcome_of
from services.common.retry import RetryPolicy
from services.common.settings import Env, ServerSettings
from services.llm import app
from services.llm.config import LlmSettings
from services.llm.engine import LlmEngine
from services.llm.loop import LoopSettings, ToolLoop
from services.llm.metrics import LlmMetrics
from services.llm.model import GenerateInput, Turn
from services.llm.servicer import LlmServicer
from services.model_runtime.chat import LLM_RUNTIME_ERROR, ChatMessage, ChatRequest, StreamDelta
from services.model_runtime.client import OpenAiChatRuntime, RuntimeSettings
from tests.fakes.clock import ManualClock
from tests.fakes.openai_chat import FakeChatServer
from tests.unit.test_llm_metrics import sample
from tests.unit.test_llm_review_fixes import Sink

USER = [ChatMessage("user", "Как настроить LDAP?")]
QUESTION = GenerateInput(messages=(Turn("user", "How do I set up LDAP?"),), mode="chat")
NO_RETRY = RetryPolicy(attempts=1, first_delay_s=0.0)
CHUNK = {"choices": [{"index": 0, "delta": {"content": "w "}, "finish_reason": None}]}
LAST = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}


def sse(obj: dict[str, Any] | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj)
    return f"data: {data}\n\n".encode()


class SlowRuntime:
    """An in-process OpenAI-compatible runtime: a stream sends a chunk at once, then one
    every `every` s ("flowing"; it finishes after `chunks` of them when that is set),
    nothing more ("stalled"), or only SSE comments every `every` s ("keepalive": a proxy
    whose model is stuck). A call that is not a stream hangs."""

    def __init__(self, kind: str = "flowing", every: float = 0.05, chunks: int = 0) -> None:
        self.kind, self.every, self.chunks = kind, every, chunks
        self.calls = 0
        self.http = httpx.AsyncClient(transport=httpx.MockTransport(self.handler))

    async def handler(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        if not json.loads(request.content).get("stream"):
            await asyncio.Event().wait()

        async def body() -> AsyncIterator[bytes]:
            yield sse(CHUNK)
            sent = 1
            while not self.chunks or sent < self.chunks:
                if self.kind == "stalled":
                    await asyncio.Event().wait()
                await asyncio.sleep(self.every)
                if self.kind == "keepalive":
                    yield b": PROCESSING\n\n"
                    continue
                yield sse(CHUNK)
                sent += 1
            yield sse(LAST) + sse("[DONE]")

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    def client(
        self,
        *,
        failures: int = 1,
        stall_s: float = 3.0,
        timeout_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> OpenAiChatRuntime:
        return runtime(self.http, "http://runtime:8000/v1", failures, stall_s, timeout_s, clock)


def runtime(
    http: httpx.AsyncClient,
    url: str,
    failures: int = 1,
    stall_s: float = 3.0,
    timeout_s: float = 30.0,
    clock: Callable[[], float] = time.monotonic,
) -> OpenAiChatRuntime:
    settings = RuntimeSettings(
        url=url,
        default_model="m",
        retry=NO_RETRY,
        breaker=BreakerPolicy(failures, 30.0),
        stall_s=stall_s,
        timeout_s=timeout_s,
    )
    return OpenAiChatRuntime(settings, http, clock=clock)


@pytest.fixture
async def flowing() -> AsyncIterator[SlowRuntime]:
    rt = SlowRuntime("flowing")
    async with rt.http:
        yield rt


@pytest.fixture
async def stalled() -> AsyncIterator[SlowRuntime]:
    rt = SlowRuntime("stalled")
    async with rt.http:
        yield rt


async def drain(rt: OpenAiChatRuntime, timeout_s: float) -> list[Any]:
    return [e async for e in rt.stream(ChatRequest(USER), timeout_s=timeout_s)]


async def call(rt: OpenAiChatRuntime, stream: bool, timeout_s: float) -> Any:
    if stream:
        return await drain(rt, timeout_s)
    return await rt.complete(ChatRequest(USER), timeout_s=timeout_s)


# -- 1. a wait for a free connection ---------------------------------------------------------


@pytest.fixture
def chat() -> Iterator[FakeChatServer]:
    with FakeChatServer() as server:
        yield server


@pytest.mark.parametrize("stream", [False, True])
async def test_a_call_that_waits_for_a_free_connection_is_the_service_busy(
    chat: FakeChatServer, stream: bool
) -> None:
    """One connection, held by a call the runtime has not answered: the next call waits for
    it until its deadline. Before, that wait ended as a runtime timeout and opened the
    breaker, though the runtime never saw the call."""
    chat.hang(seconds=30)
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=1), trust_env=False) as http:
        rt = runtime(http, chat.url)
        holder = asyncio.ensure_future(rt.complete(ChatRequest(USER), timeout_s=20))
        for _ in range(500):
            if chat.chat_requests:
                break
            await asyncio.sleep(0.01)
        with pytest.raises(errors.ResourceExhaustedError) as caught:
            await call(rt, stream, 1.0)  # past MIN_VERDICT_S: a timeout would count
        holder.cancel()
        with pytest.raises(asyncio.CancelledError):
            await holder
    err = caught.value
    assert err.reason == errors.SERVER_BUSY
    assert (err.metadata["kind"], err.metadata["attempts"]) == ("busy", "0")
    assert rt.breaker.state == CLOSED
    assert len(chat.chat_requests) == 1  # the waiting call never reached the runtime


@pytest.mark.parametrize("stream", [False, True])
async def test_a_pool_timeout_is_no_verdict_on_the_runtime(stream: bool) -> None:
    def full(request: httpx.Request) -> httpx.Response:
        raise httpx.PoolTimeout("no connection came free")

    async with httpx.AsyncClient(transport=httpx.MockTransport(full)) as http:
        rt = runtime(http, "http://runtime:8000/v1")
        for _ in range(3):
            with pytest.raises(errors.ResourceExhaustedError):
                await call(rt, stream, 5.0)
    assert rt.breaker.state == CLOSED


async def test_the_service_sizes_the_runtime_pool_to_its_concurrency_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default pool holds 100 connections while the server admits 256 calls."""
    made: list[dict[str, Any]] = []
    real = app.traced_async_client

    def recording(*args: Any, **kw: Any) -> httpx.AsyncClient:
        made.append(kw)
        return real(*args, **kw)

    monkeypatch.setattr(app, "traced_async_client", recording)
    base = LlmSettings.from_env(Env({}))
    settings = replace(
        base,
        server=ServerSettings("llm", port=0, max_concurrent_rpcs=7),
        runtime=RuntimeSettings(url="http://127.0.0.1:9", default_model="m"),
    )
    running, close = await app.start(settings)
    try:
        assert len(made) == 1
        limits = made[0]["limits"]
        assert (limits.max_connections, limits.max_keepalive_connections) == (7, 7)
    finally:
        await running.stop(0)
        await close()


# -- 2. a call its caller's deadline ends ----------------------------------------------------


async def test_a_stream_the_callers_deadline_cuts_while_chunks_arrive_is_no_verdict(
    flowing: SlowRuntime,
) -> None:
    rt = flowing.client(stall_s=0.5)
    for _ in range(3):  # a breaker that opens at the first failure stays closed
        with pytest.raises(errors.DeadlineExceededError) as caught:
            await drain(rt, 1.0)
        assert caught.value.metadata["kind"] == "deadline"
    assert rt.breaker.state == CLOSED
    assert flowing.calls == 3


async def test_a_stream_that_stalled_before_the_callers_deadline_counts(
    stalled: SlowRuntime,
) -> None:
    rt = stalled.client(stall_s=0.3)
    with pytest.raises(errors.UnavailableError) as caught:
        await drain(rt, 1.0)
    assert caught.value.reason == LLM_RUNTIME_ERROR
    assert caught.value.metadata["kind"] == "timeout"
    assert rt.breaker.state == OPEN


async def test_a_stream_sending_only_keepalive_comments_has_stalled() -> None:
    # OpenRouter-style ": PROCESSING" comments while the model is stuck are no chunk.
    keepalive = SlowRuntime("keepalive")
    async with keepalive.http:
        rt = keepalive.client(stall_s=0.3)
        with pytest.raises(errors.UnavailableError) as caught:
            await drain(rt, 1.0)
    assert caught.value.metadata["kind"] == "timeout"
    assert rt.breaker.state == OPEN


async def test_a_stream_still_sending_at_the_runtimes_own_timeout_counts(
    flowing: SlowRuntime,
) -> None:
    """LLM_RUNTIME_TIMEOUT_S is the longest a call may take, a stream's too."""
    rt = flowing.client(stall_s=0.5, timeout_s=1.0)
    with pytest.raises(errors.UnavailableError) as caught:
        await drain(rt, 5.0)
    assert caught.value.metadata["kind"] == "timeout"
    assert rt.breaker.state == OPEN


async def test_a_call_not_streamed_that_the_callers_deadline_ends_still_counts(
    flowing: SlowRuntime,
) -> None:
    rt = flowing.client()
    with pytest.raises(errors.UnavailableError) as caught:
        await rt.complete(ChatRequest(USER), timeout_s=1.0)
    assert caught.value.metadata["kind"] == "timeout"
    assert rt.breaker.state == OPEN


@pytest.mark.parametrize(
    ("silent_s", "state"),
    [
        (2.0, CLOSED),  # the last chunk within stall_s: the runtime was sending
        (5.0, OPEN),  # none for stall_s or longer: it had stalled
    ],
)
async def test_a_stream_cancelled_at_the_callers_deadline_is_judged_by_its_last_chunk(
    stalled: SlowRuntime, silent_s: float, state: str
) -> None:
    """The caller's timer fires first (the tool loop's, the RPC's): the client is cancelled
    at the deadline, `silent_s` after the stream's one chunk."""
    clock = ManualClock()
    rt = stalled.client(stall_s=3.0, clock=clock)
    events = rt.stream(ChatRequest(USER), timeout_s=silent_s)
    assert isinstance(await anext(events), StreamDelta)
    waiting = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0.01)
    clock.now += silent_s  # the call's deadline
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert rt.breaker.state == state


def engine(rt: OpenAiChatRuntime, registry: CollectorRegistry) -> LlmEngine:
    return LlmEngine(ToolLoop(rt, None, (), LoopSettings()), LlmMetrics(registry))  # type: ignore[arg-type]


@pytest.mark.parametrize(("kind", "state"), [("flowing", CLOSED), ("stalled", OPEN)])
async def test_a_generate_the_callers_deadline_ends_is_deadline_exceeded(
    kind: str, state: str
) -> None:
    """Whichever timer ends it (the client's, the loop's), the request's outcome is the
    caller's deadline, not LLM_RUNTIME_ERROR; the breaker hears only of the stall."""
    slow = SlowRuntime(kind)
    async with slow.http:
        rt = slow.client(stall_s=0.3)
        registry = CollectorRegistry()
        token = deadline_var.set(time.monotonic() + 1.2)
        try:
            with pytest.raises(errors.ServiceError):
                await engine(rt, registry).generate(QUESTION, Sink())
        finally:
            deadline_var.reset(token)
    assert sample(registry, "llm_requests_total", outcome=DEADLINE_EXCEEDED) == 1
    assert sample(registry, "llm_requests_total", outcome=LLM_RUNTIME_ERROR) == 0
    assert rt.breaker.state == state


def test_the_outcome_of_a_request_past_its_callers_deadline() -> None:
    runtime_error = errors.UnavailableError("late", reason=LLM_RUNTIME_ERROR)
    assert outcome_of(asyncio.CancelledError()) == CANCELLED
    assert outcome_of(runtime_error) == LLM_RUNTIME_ERROR
    token = deadline_var.set(time.monotonic() - 0.001)
    try:
        assert outcome_of(asyncio.CancelledError()) == DEADLINE_EXCEEDED
        assert outcome_of(runtime_error) == DEADLINE_EXCEEDED
        assert outcome_of(None) == "ok"
    finally:
        deadline_var.reset(token)


async def test_callers_with_short_deadlines_on_a_slow_healthy_stream_open_no_breaker() -> None:
    """The review's case over gRPC: five callers with deadlines shorter than a slow stream
    (a chunk every 0.05 s, 60 of them); before, each cut counted and the breaker opened for
    every tenant. Then a caller without a deadline gets its whole answer."""
    slow = SlowRuntime("flowing", chunks=60)
    registry = CollectorRegistry()
    async with slow.http:
        rt = slow.client(failures=5, stall_s=0.5)
        servicer = LlmServicer(engine(rt, registry), rt.name)
        server = grpc.aio.server(
            interceptors=[ServerInterceptor("visior.llm", RpcMetrics(CollectorRegistry()))]
        )
        llm_pb2_grpc.add_LlmServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = llm_pb2_grpc.LlmServiceStub(channel)
                request = llm_pb2.GenerateStreamRequest(
                    request=llm_pb2.GenerateRequest(
                        messages=[common_pb2.ChatMessage(role="user", content="LDAP?")],
                        mode="chat",
                    )
                )

                async def cut() -> grpc.StatusCode:
                    with pytest.raises(grpc.aio.AioRpcError) as caught:
                        _ = [e async for e in stub.GenerateStream(request, timeout=1.2)]
                    return caught.value.code()

                codes = await asyncio.gather(*(cut() for _ in range(5)))
                assert codes == [grpc.StatusCode.DEADLINE_EXCEEDED] * 5
                assert rt.breaker.state == CLOSED
                events = [e async for e in stub.GenerateStream(request)]
        finally:
            await server.stop(0)
    assert events[-1].WhichOneof("event") == "final"
    await asyncio.sleep(0.05)  # the last cut request's metrics are written as its task ends
    assert sample(registry, "llm_requests_total", outcome=DEADLINE_EXCEEDED) == 5
    assert sample(registry, "llm_requests_total", outcome="ok") == 1
