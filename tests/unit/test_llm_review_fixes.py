"""Review fixes of the LLM service: GenerateStream's inner trace_id, the size of the token-count
caches, and runtime timeouts that the tool loop's own timer ends (the runtime's breaker)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import grpc
import httpx
import pytest
from prometheus_client import CollectorRegistry
from visior.common.v1 import common_pb2
from visior.llm.v1 import llm_pb2, llm_pb2_grpc

from services.common import errors
from services.common.bounded_cache import BoundedCache
from services.common.breaker import CLOSED, OPEN, BreakerPolicy
from services.common.context import MIN_VERDICT_S
from services.common.interceptors import ServerInterceptor
from services.common.metrics import RpcMetrics
from services.common.retry import RetryPolicy
from services.common.status import error_info
from services.common.tokenizer import default_tokenizer
from services.llm import budget
from services.llm.budget import count_tokens, message_tokens
from services.llm.engine import LlmEngine
from services.llm.loop import LoopSettings, ToolLoop
from services.llm.model import GenerateInput, ToolCallRecord, Turn
from services.llm.servicer import LlmServicer
from services.model_runtime.chat import (
    LLM_RUNTIME_ERROR,
    ChatMessage,
    ChatRequest,
    Completion,
    StreamDelta,
    ToolCall,
)
from services.model_runtime.client import DEADLINE_SLACK_S, OpenAiChatRuntime, RuntimeSettings
from tests.fakes.clock import ManualClock

TOK = default_tokenizer()
USER = [ChatMessage("user", "Как настроить LDAP?")]

# -- 1. GenerateStream checks the trace_id of its inner request --------------------------------


class AnsweringRuntime:
    """Answers every call at once; counts them."""

    name = "fake"

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, request: ChatRequest, *, timeout_s: float) -> Completion:
        self.calls += 1
        return Completion("answer", completion_tokens=1, prompt_tokens=10)

    async def stream(self, request: ChatRequest, *, timeout_s: float) -> AsyncIterator[Any]:
        self.calls += 1
        yield StreamDelta("answer")
        yield Completion("answer", completion_tokens=1, prompt_tokens=10)


def loop_settings(**kw: Any) -> LoopSettings:
    base = LoopSettings()
    total = base.max_prompt_tokens + base.max_completion_tokens + 2048
    return replace(base, max_total_tokens=total, **kw)


@pytest.fixture
async def llm_stub() -> AsyncIterator[tuple[llm_pb2_grpc.LlmServiceStub, AnsweringRuntime]]:
    runtime = AnsweringRuntime()
    engine = LlmEngine(ToolLoop(runtime, None, (), loop_settings()))  # type: ignore[arg-type]
    server = grpc.aio.server(
        interceptors=[ServerInterceptor("visior.llm", RpcMetrics(CollectorRegistry()))]
    )
    llm_pb2_grpc.add_LlmServiceServicer_to_server(LlmServicer(engine, runtime.name), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield llm_pb2_grpc.LlmServiceStub(channel), runtime
    finally:
        await server.stop(0)


def generate_request(trace_id: str) -> llm_pb2.GenerateRequest:
    return llm_pb2.GenerateRequest(
        messages=[common_pb2.ChatMessage(role="user", content="What does the guide say?")],
        mode="chat",
        trace_id=trace_id,
    )


async def refusal(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call()
    info = error_info(caught.value)
    assert info is not None
    return caught.value.code(), info.reason, dict(info.metadata)


@pytest.mark.parametrize("bad", ["bad trace!", "x" * 129, "tr\n"])
async def test_generate_stream_refuses_a_bad_inner_trace_id_as_generate_does(
    llm_stub: tuple[llm_pb2_grpc.LlmServiceStub, AnsweringRuntime], bad: str
) -> None:
    stub, runtime = llm_stub

    async def stream() -> None:
        request = llm_pb2.GenerateStreamRequest(request=generate_request(bad))
        _ = [e async for e in stub.GenerateStream(request, timeout=10)]

    unary = await refusal(lambda: stub.Generate(generate_request(bad), timeout=10))
    streamed = await refusal(stream)
    assert unary == streamed
    assert unary[0] == grpc.StatusCode.INVALID_ARGUMENT and unary[2]["field"] == "trace_id"
    assert runtime.calls == 0  # refused before the model (or a tool) is called


async def test_a_trace_id_at_the_limit_is_taken_by_both(
    llm_stub: tuple[llm_pb2_grpc.LlmServiceStub, AnsweringRuntime],
) -> None:
    stub, _ = llm_stub
    longest = "x" * 128
    out = await stub.Generate(generate_request(longest), timeout=10)
    request = llm_pb2.GenerateStreamRequest(request=generate_request(longest))
    events = [e async for e in stub.GenerateStream(request, timeout=10)]
    assert out.meta.trace_id == events[-1].final.meta.trace_id == longest


# -- 2. the token-count caches are bounded by the characters they hold ------------------------


def test_the_service_caches_are_bounded_by_characters() -> None:
    for cache in (budget._TEXT_CACHE, budget._MESSAGE_CACHE):
        assert isinstance(cache, BoundedCache)
        assert (cache.max_entries, cache.max_chars) == (budget._CACHE_LIMIT, budget._CACHE_CHARS)
    assert budget._CACHE_CHARS * 4 <= 16 * 1024 * 1024  # 4 bytes a character at worst


def test_many_long_texts_keep_the_text_cache_under_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """64 messages of 32,768 characters a request, request after request: before, 4,096 of
    them were kept (268 MB as Cyrillic)."""
    cache: BoundedCache[tuple[str, str], int] = BoundedCache(
        budget._CACHE_LIMIT, budget._CACHE_CHARS
    )
    monkeypatch.setattr(budget, "_TEXT_CACHE", cache)
    base = "абвгдежзийклмнопрстуфхцчшщыэюя "
    long = (base * (32_768 // len(base) + 1))[:32_760]
    for i in range(2 * budget._CACHE_CHARS // 32_768 + 8):
        text = f"{i:07d}:{long}"
        count_tokens(TOK, text)
        assert cache.chars <= budget._CACHE_CHARS
    assert cache.get((TOK.name, text)) is not None  # the latest is kept
    assert cache.chars > budget._CACHE_CHARS - 32_768  # and the bound is used, not wasted


class CountingTokenizer:
    """The default tokenizer, counting its calls."""

    name = "counting"

    def __init__(self) -> None:
        self.counted: list[str] = []

    def count(self, text: str) -> int:
        self.counted.append(text)
        return TOK.count(text)


def test_messages_are_bounded_by_their_texts_and_ordinary_ones_counted_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    texts: BoundedCache[tuple[str, str], int] = BoundedCache(100, 1000)
    messages: BoundedCache[tuple[str, ChatMessage], int] = BoundedCache(100, 1000)
    monkeypatch.setattr(budget, "_TEXT_CACHE", texts)
    monkeypatch.setattr(budget, "_MESSAGE_CACHE", messages)
    tk: Any = CountingTokenizer()
    call = ToolCall("c1", "read_doc_section", '{"doc_id": "guide"}')
    turn = ChatMessage("assistant", "x" * 960, (call,))  # 960 + 2 + 16 + 19 = 997 characters
    result = ChatMessage("tool", "y" * 980, tool_call_id="c1", name="read_doc_section")
    first = message_tokens(tk, turn)
    assert messages.chars == 997 and message_tokens(tk, turn) == first
    message_tokens(tk, result)  # 980 + 2 + 16 = 998: the turn goes to make room
    assert messages.chars == 998 and len(messages) == 1
    calls = len(tk.counted)
    message_tokens(tk, result)  # an ordinary tool result, re-counted at the next step
    assert len(tk.counted) == calls  # from the cache
    assert message_tokens(tk, ChatMessage("user", "z" * 1001)) > 0  # past the bound: not kept
    assert messages.chars == 998 and texts.chars <= 1000


# -- 3. runtime timeouts count towards the runtime's breaker ----------------------------------


def sse(obj: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


CHUNK = {"choices": [{"index": 0, "delta": {"content": "hello "}, "finish_reason": None}]}


class HangingRuntime:
    """An in-process OpenAI-compatible runtime whose next answers are scripted: "fail" (503),
    "hang" (no status line), "stall" (a 200 and one chunk, then nothing)."""

    def __init__(self) -> None:
        self.script: list[str] = []
        self.arrived = asyncio.Event()
        self.http = httpx.AsyncClient(transport=httpx.MockTransport(self.handler))

    async def handler(self, request: httpx.Request) -> httpx.Response:
        kind = self.script.pop(0) if self.script else "hang"
        self.arrived.set()
        if kind == "fail":
            return httpx.Response(503, json={"error": {"message": "down"}})
        if kind == "hang":
            await asyncio.Event().wait()

        async def body() -> AsyncIterator[bytes]:
            yield sse(CHUNK)
            await asyncio.Event().wait()

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    def client(
        self, failures: int, clock: Callable[[], float] | None = None, stall_s: float = 3.0
    ) -> OpenAiChatRuntime:
        settings = RuntimeSettings(
            url="http://runtime:8000/v1",
            default_model="m",
            retry=RetryPolicy(attempts=1, first_delay_s=0.0),
            breaker=BreakerPolicy(failures, 30.0),
            stall_s=stall_s,
        )
        if clock is None:
            return OpenAiChatRuntime(settings, self.http)
        return OpenAiChatRuntime(settings, self.http, clock=clock)


@pytest.fixture
async def fake() -> AsyncIterator[HangingRuntime]:
    runtime = HangingRuntime()
    async with runtime.http:
        yield runtime


async def cut(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def consume(rt: OpenAiChatRuntime, timeout_s: float) -> list[Any]:
    return [e async for e in rt.stream(ChatRequest(USER), timeout_s=timeout_s)]


@pytest.mark.parametrize(
    ("early", "state"),
    [
        (0.0, OPEN),  # at the deadline
        (DEADLINE_SLACK_S, OPEN),  # at the slack's limit
        (DEADLINE_SLACK_S + 0.001, CLOSED),  # one past it: the caller went away
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_a_call_its_caller_cancels_at_the_deadline_is_a_timeout(
    fake: HangingRuntime, early: float, state: str, stream: bool
) -> None:
    clock = ManualClock()
    rt = fake.client(1, clock)
    if stream:
        fake.script.append("stall")  # a 200, then the stream stalls
        task = asyncio.ensure_future(consume(rt, 5.0))
    else:
        task = asyncio.ensure_future(rt.complete(ChatRequest(USER), timeout_s=5.0))
    await asyncio.wait_for(fake.arrived.wait(), 5)
    await asyncio.sleep(0.01)
    clock.now = 1000.0 + 5.0 - early  # start + budget - early, as the client reckons it
    await cut(task)
    assert rt.breaker.state == state


@pytest.mark.parametrize(("timeout_s", "state"), [(MIN_VERDICT_S, OPEN), (0.999, CLOSED)])
async def test_a_deadline_the_caller_cut_below_a_second_is_not_counted(
    fake: HangingRuntime, timeout_s: float, state: str
) -> None:
    clock = ManualClock()
    rt = fake.client(1, clock)
    task = asyncio.ensure_future(rt.complete(ChatRequest(USER), timeout_s=timeout_s))
    await asyncio.wait_for(fake.arrived.wait(), 5)
    clock.now += timeout_s
    await cut(task)
    assert rt.breaker.state == state


async def test_a_stream_cancelled_after_its_200_is_no_success(fake: HangingRuntime) -> None:
    """Before, the cancelled stream reset the failure count: a runtime that stalls every
    stream never opened its breaker."""
    rt = fake.client(2, ManualClock())
    fake.script += ["fail", "stall", "fail"]
    with pytest.raises(errors.UnavailableError):
        await rt.complete(ChatRequest(USER), timeout_s=5.0)
    fake.arrived.clear()
    task = asyncio.ensure_future(consume(rt, 5.0))
    await asyncio.wait_for(fake.arrived.wait(), 5)
    await asyncio.sleep(0.05)  # the chunk is read: the stream is past its 200
    await cut(task)  # the caller went away before the deadline: no verdict
    assert rt.breaker.state == CLOSED
    with pytest.raises(errors.UnavailableError):
        await rt.complete(ChatRequest(USER), timeout_s=5.0)
    assert rt.breaker.state == OPEN  # two failures in a row: the stream did not reset them


WATCHDOG_S = MIN_VERDICT_S + 0.2
"""The tool loop's watchdog in these tests: real seconds, and above MIN_VERDICT_S."""


def watchdog_error(err: errors.ServiceError) -> None:
    """The loop's "Model timeout", as before the fix."""
    assert isinstance(err, errors.UnavailableError) and err.reason == LLM_RUNTIME_ERROR
    assert err.message.startswith("Model timeout") and err.metadata["limit_name"] == "watchdog_s"


class Sink:
    def __init__(self) -> None:
        self.deltas: list[str] = []

    async def delta(self, text: str) -> None:
        self.deltas.append(text)

    async def tool_call(self, record: ToolCallRecord) -> None:
        pass


async def test_generates_the_watchdog_ends_open_the_runtime_breaker(fake: HangingRuntime) -> None:
    rt = fake.client(2)
    engine = LlmEngine(ToolLoop(rt, None, (), loop_settings(watchdog_s=WATCHDOG_S)))  # type: ignore[arg-type]
    question = GenerateInput(messages=(Turn("user", "hi"),))
    for state in (CLOSED, OPEN):
        with pytest.raises(errors.UnavailableError) as caught:
            await engine.generate(question)
        watchdog_error(caught.value)
        assert rt.breaker.state == state
    with pytest.raises(errors.UnavailableError) as caught:
        await engine.generate(question)
    assert caught.value.metadata["kind"] == "circuit_open"


async def test_a_stalled_stream_the_watchdog_ends_counts_as_a_failure(
    fake: HangingRuntime,
) -> None:
    rt = fake.client(2, stall_s=WATCHDOG_S / 2)  # silent for the watchdog's second half: stalled
    fake.script += ["fail", "stall"]
    engine = LlmEngine(ToolLoop(rt, None, (), loop_settings(watchdog_s=WATCHDOG_S)))  # type: ignore[arg-type]
    question = GenerateInput(messages=(Turn("user", "hi"),))
    with pytest.raises(errors.UnavailableError) as caught:
        await engine.generate(question, Sink())
    assert caught.value.metadata["kind"] == "overloaded"
    sink = Sink()
    with pytest.raises(errors.UnavailableError) as caught:
        await engine.generate(question, sink)
    watchdog_error(caught.value)
    assert sink.deltas  # the stream was past its 200
    assert rt.breaker.state == OPEN  # before the fix: reset to no failures
