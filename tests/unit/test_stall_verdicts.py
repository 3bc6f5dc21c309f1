"""A dependency's timeout while this process stood still (its event loop stalled: SIGSTOP, CPU
starvation, a long GC, a VM pause) is no verdict for its breaker; the same timeout without a
stall still counts; the caller's error is the same either way. For the LLM runtime client,
the bank (cbr) and Tavily, each behind a one-failure breaker whose stall watch the test
steps: the fake upstream makes the process "stand still" (steps the clock, a late beat) and
then never answers in time, or its read times out.

And the runtime client reads an answer that arrives as the process resumes past its
deadline instead of discarding it (a real stall of the loop).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import date

import httpx
import pytest

from services.common import errors
from services.common.breaker import CLOSED, OPEN, BreakerPolicy, CircuitBreaker
from services.common.loop_lag import BEAT_S, STALL_S, StallWatch
from services.common.retry import RetryPolicy
from services.model_runtime.chat import LLM_RUNTIME_ERROR, ChatMessage, ChatRequest, StreamEvent
from services.model_runtime.client import OpenAiChatRuntime, RuntimeSettings
from services.toolsproxy.cbr import CbrClient, CbrSettings, CbrUnavailableError
from services.toolsproxy.tavily import TavilyClient, TavilyError, TavilySettings
from tests.fakes.clock import ManualClock

NO_RETRY = RetryPolicy(attempts=1, first_delay_s=0.0)
USER = [ChatMessage("user", "hi")]
ANSWER = {
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}
    ]
}

Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]


class Stalls:
    """A stall watch on a manual clock, and the upstream behaviours the tests need."""

    def __init__(self) -> None:
        self.clock = ManualClock()
        self.watch = StallWatch(clock=self.clock)
        self.watch.tick()

    def breaker(self, name: str) -> CircuitBreaker:
        return CircuitBreaker(name, BreakerPolicy(1, 30.0), clock=self.clock, stalls=self.watch)

    def stand_still(self) -> None:
        """The process stands still for longer than STALL_S; its heartbeat then beats late."""
        self.clock.now += BEAT_S + STALL_S + 1.0
        self.watch.tick()

    def hanging(self, *, stall: bool) -> Handler:
        """An upstream that never answers, the process standing still meanwhile or not."""

        async def handle(request: httpx.Request) -> httpx.Response:
            if stall:
                self.stand_still()
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        return handle

    def timing_out(self, *, stall: bool) -> Handler:
        """An upstream whose read times out (httpx's own timer), with or without a stall."""

        async def handle(request: httpx.Request) -> httpx.Response:
            if stall:
                self.stand_still()
            raise httpx.ReadTimeout("timed out", request=request)

        return handle


def http(handler: Handler) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


# -- the LLM runtime ------------------------------------------------------------------------


def runtime(
    handler: Handler, breaker: CircuitBreaker | None = None, timeout_s: float = 0.5
) -> OpenAiChatRuntime:
    settings = RuntimeSettings(
        url="http://runtime:8000/v1", default_model="m", retry=NO_RETRY, timeout_s=timeout_s
    )
    return OpenAiChatRuntime(settings, http(handler), breaker=breaker)


async def runtime_error(call: Awaitable[object]) -> errors.ServiceError:
    with pytest.raises(errors.UnavailableError) as info:
        await call
    assert info.value.reason == LLM_RUNTIME_ERROR
    assert info.value.metadata["kind"] == "timeout"  # what the caller is told, stall or not
    return info.value


async def drained(events: object) -> list[StreamEvent]:
    return [e async for e in events]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("stall", "state"), [(True, CLOSED), (False, OPEN)])
async def test_a_runtime_timeout_in_a_stall_is_no_verdict(stall: bool, state: str) -> None:
    s = Stalls()
    rt = runtime(s.hanging(stall=stall), s.breaker("llm-runtime"))
    await runtime_error(rt.complete(ChatRequest(USER), timeout_s=0.5))
    assert rt.breaker.state == state


@pytest.mark.parametrize(("stall", "state"), [(True, CLOSED), (False, OPEN)])
async def test_a_stream_that_timed_out_in_a_stall_is_no_verdict(stall: bool, state: str) -> None:
    s = Stalls()

    async def handle(request: httpx.Request) -> httpx.Response:
        async def body():  # type: ignore[no-untyped-def]
            yield b'data: {"choices": [{"index": 0, "delta": {"content": "w"}}]}\n\n'
            if stall:
                s.stand_still()
            raise httpx.ReadTimeout("timed out", request=request)

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    rt = runtime(handle, s.breaker("llm-runtime"), timeout_s=30.0)
    await runtime_error(drained(rt.stream(ChatRequest(USER), timeout_s=30.0)))
    assert rt.breaker.state == state


async def test_an_answer_arriving_as_the_process_resumes_past_its_deadline_is_used() -> None:
    """The process stands still (for real) across the call's deadline; the runtime's answer
    is there 10 ms after it resumes: it is read, not discarded as a timeout."""

    async def handle(request: httpx.Request) -> httpx.Response:
        time.sleep(0.8)  # noqa: ASYNC251 - the process standing still, past the deadline
        await asyncio.sleep(0.01)
        return httpx.Response(200, json=ANSWER)

    rt = runtime(handle, timeout_s=0.3)
    completion = await rt.complete(ChatRequest(USER), timeout_s=0.3)
    assert completion.content == "hello"
    assert rt.breaker.state == CLOSED


async def test_a_runtime_read_has_no_httpx_timer_to_fire_first() -> None:
    """httpx's read and write timeouts are off: the call's deadline alone bounds them."""
    seen: list[dict[str, float | None]] = []

    async def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.extensions["timeout"])
        return httpx.Response(200, json=ANSWER)

    await runtime(handle).complete(ChatRequest(USER), timeout_s=0.5)
    assert seen[0]["read"] is None and seen[0]["write"] is None
    assert seen[0]["connect"] is not None and seen[0]["pool"] is not None


# -- the bank and Tavily --------------------------------------------------------------------


@pytest.mark.parametrize(("stall", "state"), [(True, CLOSED), (False, OPEN)])
async def test_a_bank_timeout_in_a_stall_is_no_verdict(stall: bool, state: str) -> None:
    s = Stalls()
    client = CbrClient(
        http(s.timing_out(stall=stall)),
        CbrSettings(url="http://127.0.0.1:9/DailyInfo.asmx", retry=NO_RETRY),
        breaker=s.breaker("cbr"),
    )
    with pytest.raises(CbrUnavailableError) as info:
        await client.key_rate(date(2025, 7, 1), date(2025, 7, 2))
    assert "no answer within" in info.value.message
    assert client.breaker.state == state


@pytest.mark.parametrize(("stall", "state"), [(True, CLOSED), (False, OPEN)])
async def test_a_tavily_timeout_in_a_stall_is_no_verdict(stall: bool, state: str) -> None:
    s = Stalls()
    client = TavilyClient(
        TavilySettings(api_key="tvly-test", base_url="http://127.0.0.1:9", retry=NO_RETRY),
        http(s.timing_out(stall=stall)),
        breaker=s.breaker("tavily"),
    )
    with pytest.raises(TavilyError) as info:
        await client.search("rates", tenant_id="t", user_id="u")
    assert "did not answer in time" in info.value.message
    assert client.breaker.state == state
