"""The arguments the orchestrator plans agree with ToolsProxy's rules (services/common/
tool_contract.py): the Bank of Russia's "today", the key-rate range, the search and news
defaults; and a breaker's wait is shown to a caller in whole seconds, at least 1."""

from __future__ import annotations

import sys
from datetime import UTC, date, datetime
from typing import Any

import httpx
import pytest

from services.common.breaker import BreakerPolicy, CircuitBreaker, CircuitOpenError
from services.common.tool_args import check_arguments
from services.common.tool_contract import (
    KEY_RATE_DAYS,
    NEWS_MAX_RESULTS,
    NEWS_SEARCH_DEPTH,
    SEARCH_TOP_K,
    bank_today,
)
from services.orchestrator.respond import Responder
from services.orchestrator.runtime_config import ConfigHolder, RuntimeConfig
from services.toolsproxy.cbr import CbrClient, CbrSettings, CbrUnavailableError, cbr_tool
from services.toolsproxy.search_tools import SearchCall, SearchHitView, SearchTools
from services.toolsproxy.tavily import TavilyClient, TavilyError, TavilySettings, tavily_schema
from services.toolsproxy.tools import Caller
from tests.fakes.cbr_server import FakeCbrServer
from tests.unit.test_orchestrator import FakeGenerator, FakeRetriever, inp

LATE_EVENING = datetime(2025, 7, 31, 22, 30, tzinfo=UTC)
"""01:30 on 1 August in Moscow: the bank's today is 2025-08-01, the UTC date 2025-07-31."""
CALLER = Caller(tenant_id="t1", user_id="u1", trace_id="tr")
UNREACHABLE = "http://127.0.0.1:9/DailyInfoWebServ/DailyInfo.asmx"
"""Never called: every test below that uses it has the breaker refuse first."""


class _Frozen(datetime):
    """datetime whose now() is LATE_EVENING."""

    @classmethod
    def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
        return LATE_EVENING.astimezone(tz) if tz else LATE_EVENING.replace(tzinfo=None)


async def _plan(query: str, today: date | None = None) -> dict[str, Any]:
    """The arguments of the one call the orchestrator plans for `query` (`today`: the
    Responder's own clock when None)."""
    generator = FakeGenerator()
    kw: dict[str, Any] = {} if today is None else {"today": lambda: today}
    holder = ConfigHolder(RuntimeConfig(), 3)
    responder = Responder(FakeRetriever(), generator, holder, model_routing=False, **kw)
    await responder.respond(inp(query=query))
    [planned] = generator.requests[-1].planned_calls
    return dict(planned.arguments)


# -- the bank's calendar -----------------------------------------------------------------------


def test_bank_today_is_the_moscow_date() -> None:
    assert bank_today(LATE_EVENING) == date(2025, 8, 1)
    assert bank_today(datetime(2025, 7, 31, 20, 59, tzinfo=UTC)) == date(2025, 7, 31)


async def test_todays_rate_is_planned_for_the_banks_today_late_in_the_utc_evening(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for module in ("services.common.tool_contract", "services.orchestrator.respond"):
        monkeypatch.setattr(sys.modules[module], "datetime", _Frozen, raising=False)
    args = await _plan("Какой курс доллара сегодня?")
    assert args == {"mode": "currency", "date": "2025-08-01", "code": "USD"}


async def test_the_planned_key_rate_range_is_the_tools_own_default(
    http: httpx.AsyncClient,
) -> None:
    planned = await _plan("Какая сейчас ключевая ставка ЦБ?", today=bank_today(LATE_EVENING))
    with FakeCbrServer() as fake:
        client = CbrClient(http, CbrSettings(url=fake.url), now=lambda: LATE_EVENING)
        tool = cbr_tool(client)
        run = tool.run(CALLER, check_arguments(tool.schema, {"mode": "key_rate"}))
        assert not isinstance(run, dict)
        default = await run
    assert (planned["date_from"], planned["date_to"]) == (
        default["date_from"],
        default["date_to"],
    )
    assert (
        date.fromisoformat(planned["date_to"]) - date.fromisoformat(planned["date_from"])
    ).days == KEY_RATE_DAYS


# -- search and news defaults ------------------------------------------------------------------


class _Searcher:
    def __init__(self) -> None:
        self.calls: list[SearchCall] = []

    async def search(self, call: SearchCall) -> list[SearchHitView]:
        self.calls.append(call)
        return []


async def test_the_planned_kb_search_asks_for_the_tools_default_top_k() -> None:
    planned = await _plan("Какая ставка НДС на услуги?", today=date(2025, 8, 1))
    searcher = _Searcher()
    tools = SearchTools(searcher)
    await tools.search_general_kb(CALLER, {"query": "НДС"})
    await tools.search_user_documents(CALLER, {"query": "НДС"})
    assert planned["top_k"] == SEARCH_TOP_K
    assert [c.top_k for c in searcher.calls] == [SEARCH_TOP_K, SEARCH_TOP_K]


async def test_the_planned_news_search_asks_for_the_tools_defaults() -> None:
    planned = await _plan("Последние новости о рынке облигаций", today=date(2025, 8, 1))
    schema = tavily_schema()["properties"]
    assert (planned["max_results"], planned["search_depth"]) == (
        NEWS_MAX_RESULTS,
        NEWS_SEARCH_DEPTH,
    )
    assert schema["max_results"]["maximum"] == NEWS_MAX_RESULTS
    assert f"default {NEWS_SEARCH_DEPTH}" in schema["search_depth"]["description"]
    check_arguments(tavily_schema(), planned)


# -- a breaker's wait, shown to a caller -------------------------------------------------------


@pytest.mark.parametrize(
    ("retry_in", "shown"), [(0.0, 1), (0.2, 1), (1.0, 1), (1.01, 2), (29.5, 30), (30.0, 30)]
)
def test_circuit_open_wait_is_whole_seconds_at_least_one(retry_in: float, shown: int) -> None:
    assert CircuitOpenError("x", retry_in).retry_after_s == shown


def _trial_running() -> CircuitBreaker:
    """An open breaker past its reset whose one half-open trial is under way: retry_in 0."""
    clock = [0.0]
    breaker = CircuitBreaker("dep", BreakerPolicy(failures=1, reset_s=10.0), clock=lambda: clock[0])
    breaker.record_failure()
    clock[0] = 10.0
    breaker.before_call()  # the trial
    with pytest.raises(CircuitOpenError) as info:
        breaker.before_call()
    assert info.value.retry_in == 0
    return breaker


async def test_tavily_says_at_least_one_second_while_a_trial_runs(
    http: httpx.AsyncClient,
) -> None:
    settings = TavilySettings(api_key="k", base_url="http://127.0.0.1:9")
    client = TavilyClient(settings, http, breaker=_trial_running())
    with pytest.raises(TavilyError) as info:
        await client.search("rates", tenant_id="t1", user_id="u1")
    assert "try again in 1 s" in info.value.message


async def test_cbr_says_at_least_one_second_while_a_trial_runs(
    http: httpx.AsyncClient,
) -> None:
    client = CbrClient(http, CbrSettings(url=UNREACHABLE), breaker=_trial_running())
    with pytest.raises(CbrUnavailableError) as info:
        await client.rates_on_date(date(2025, 7, 30))
    assert info.value.retry_in_s == 1
    assert "try again in 1 s" in info.value.message
