"""A caller's cancellation is no verdict on a dependency: it never opens a circuit breaker.

Found by bench/load.py: the requests in flight when a load step ended were cancelled (the
client hung up, Envoy reset the streams, the orchestrator's Generate calls were cancelled);
the LLM service counted each cancelled runtime call as a runtime failure, so its breaker
opened and every Generate failed UNAVAILABLE for the breaker's reset time (30 s). The
Bank of Russia and Tavily clients had the same rule. A cancelled half-open trial must still
free the trial for the next call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime

import httpx
import pytest

from services.common.breaker import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    BreakerPolicy,
    CircuitBreaker,
    CircuitOpenError,
)
from services.common.retry import RetryPolicy
from services.common.tool_args import check_arguments
from services.model_runtime.chat import ChatMessage, ChatRequest
from services.model_runtime.client import OpenAiChatRuntime, RuntimeSettings
from services.toolsproxy.cbr import CbrClient, CbrSettings, cbr_tool
from services.toolsproxy.tavily import TavilyClient, TavilySettings
from services.toolsproxy.tools import Caller
from tests.fakes.cbr_server import FakeCbrServer
from tests.fakes.clock import ManualClock
from tests.fakes.openai_chat import FakeChatServer
from tests.fakes.tavily_server import FakeTavilyServer

USER = [ChatMessage("user", "Как настроить LDAP?")]
NO_RETRY = RetryPolicy(attempts=1, first_delay_s=0.0)
WAIT_S = 10.0
"""How long a loaded machine may take to deliver a request to a fake."""


async def arrived(count: Callable[[], int], n: int) -> None:
    """Until the fake has received `n` requests (they are then in flight, held by it)."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while count() < n:
        assert asyncio.get_running_loop().time() < deadline, f"{count()} of {n} requests arrived"
        await asyncio.sleep(0.01)


async def cancel_all(tasks: list[asyncio.Task[object]]) -> None:
    for t in tasks:
        t.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results), results


# -- the breaker ---------------------------------------------------------------------------


def test_release_keeps_the_count_and_frees_the_half_open_trial() -> None:
    clock = ManualClock()
    b = CircuitBreaker("dep", BreakerPolicy(2, 10.0), clock=clock)
    b.record_failure()
    b.release()
    assert b.state == CLOSED
    b.record_failure()  # the released call neither reset nor added to the count
    assert b.state == OPEN
    clock.now += 10.0
    b.before_call()  # the half-open trial
    with pytest.raises(CircuitOpenError):
        b.before_call()  # one trial at a time
    b.release()  # the trial was cancelled
    assert b.state == HALF_OPEN
    b.before_call()  # the next call is the trial


# -- the LLM runtime -----------------------------------------------------------------------


@pytest.fixture
def chat() -> Iterator[FakeChatServer]:
    with FakeChatServer() as server:
        yield server


def runtime(
    chat: FakeChatServer, http: httpx.AsyncClient, clock: Callable[[], float] | None = None
) -> OpenAiChatRuntime:
    """No retries, a breaker that opens at the first failure, reset after 10 s."""
    settings = RuntimeSettings(
        url=chat.url, default_model="fake", retry=NO_RETRY, breaker=BreakerPolicy(1, 10.0)
    )
    return OpenAiChatRuntime(settings, http, clock=clock or ManualClock())


async def test_cancelled_completions_do_not_open_the_llm_runtime_breaker(
    chat: FakeChatServer, http: httpx.AsyncClient
) -> None:
    rt = runtime(chat, http)
    chat.hang(seconds=30, times=3)
    tasks: list[asyncio.Task[object]] = [
        asyncio.create_task(rt.complete(ChatRequest(USER), timeout_s=20)) for _ in range(3)
    ]
    await arrived(lambda: len(chat.chat_requests), 3)
    await cancel_all(tasks)
    assert rt.breaker.state == CLOSED
    answer = await rt.complete(ChatRequest(USER), timeout_s=20)
    assert answer.content.startswith("echo:")
    assert len(chat.chat_requests) == 4


async def test_a_cancelled_stream_does_not_open_the_llm_runtime_breaker(
    chat: FakeChatServer, http: httpx.AsyncClient
) -> None:
    rt = runtime(chat, http)
    chat.hang(seconds=30)  # before the status line: no answer yet

    async def consume() -> object:
        return [e async for e in rt.stream(ChatRequest(USER), timeout_s=20)]

    task: asyncio.Task[object] = asyncio.create_task(consume())
    await arrived(lambda: len(chat.chat_requests), 1)
    await cancel_all([task])
    assert rt.breaker.state == CLOSED
    assert (await rt.complete(ChatRequest(USER), timeout_s=20)).content


async def test_a_cancelled_half_open_trial_lets_the_next_call_try(
    chat: FakeChatServer, http: httpx.AsyncClient
) -> None:
    clock = ManualClock()
    rt = runtime(chat, http, clock)
    chat.fail(503)
    with pytest.raises(Exception, match="LLM runtime"):
        await rt.complete(ChatRequest(USER), timeout_s=20)
    assert rt.breaker.state == OPEN
    clock.now += 10.0
    chat.hang(seconds=30)
    trial: asyncio.Task[object] = asyncio.create_task(rt.complete(ChatRequest(USER), timeout_s=20))
    await arrived(lambda: len(chat.chat_requests), 2)
    await cancel_all([trial])
    assert rt.breaker.state == HALF_OPEN
    assert (await rt.complete(ChatRequest(USER), timeout_s=20)).content
    assert rt.breaker.state == CLOSED


# -- the Bank of Russia client -------------------------------------------------------------


async def test_a_cancelled_bank_call_does_not_open_its_breaker() -> None:
    caller = Caller(tenant_id="t1", user_id="u1", trace_id="tr")
    now = datetime(2025, 8, 1, 9, 0, tzinfo=UTC)
    with FakeCbrServer() as bank:
        async with httpx.AsyncClient() as http:
            settings = CbrSettings(
                url=bank.url, timeout_s=20.0, retry=NO_RETRY, breaker=BreakerPolicy(1, 30.0)
            )
            client = CbrClient(http, settings, now=lambda: now)
            tool = cbr_tool(client)

            async def key_rate() -> object:
                result = tool.run(caller, check_arguments(tool.schema, {"mode": "key_rate"}))
                assert not isinstance(result, dict)
                return await result

            bank.hang_next(1)
            task: asyncio.Task[object] = asyncio.create_task(key_rate())
            await arrived(lambda: len(bank.requests), 1)
            await cancel_all([task])
            assert client.breaker.state == CLOSED
            assert await key_rate()
            assert len(bank.requests) == 2


# -- the Tavily client ---------------------------------------------------------------------


async def test_a_cancelled_tavily_search_does_not_open_its_breaker() -> None:
    key = "tvly-test-key"
    with FakeTavilyServer(api_key=key) as tavily:
        async with httpx.AsyncClient(trust_env=False) as http:
            settings = TavilySettings(
                api_key=key,
                base_url=tavily.url,
                retry=replace(TavilySettings.retry, attempts=1),
                breaker=BreakerPolicy(1, 30.0),
            )
            client = TavilyClient(settings, http)

            async def news() -> object:
                return await client.search("ключевая ставка", tenant_id="t1", user_id="u1")

            tavily.hang_next(1)
            task: asyncio.Task[object] = asyncio.create_task(news())
            await arrived(lambda: len(tavily.requests), 1)
            await cancel_all([task])
            assert client.breaker.state == CLOSED
            assert await news()
            assert len(tavily.requests) == 2
