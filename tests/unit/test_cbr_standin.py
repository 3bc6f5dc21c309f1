"""The demo stand-in of the Bank of Russia, the demo label of fetch_cbr_data, the mesh option."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.common.retry import RetryPolicy
from services.common.settings import Env
from services.common.tool_args import check_arguments
from services.common.topology import Ports
from services.devtools.cbr_standin import (
    DEMO_CURRENCIES,
    DEMO_KEY_RATE_CHANGES,
    MOSCOW,
    PATH,
    BankStandIn,
    is_rate_day,
    key_rate_on,
    rate_day_on,
    rate_for,
)
from services.devtools.mesh import Mesh
from services.toolsproxy.cbr import (
    COMMON_CURRENCIES,
    DEFAULT_URL,
    DEMO_NOTICE,
    DEMO_SOURCE,
    CbrClient,
    CbrSettings,
    cbr_tool,
)
from services.toolsproxy.config import cbr_settings
from services.toolsproxy.tools import Caller, Tool
from tests.fakes.cbr_server import FakeCbrServer

CALLER = Caller(tenant_id="t1", user_id="u1", trace_id="tr")
NOW = datetime.now(UTC)
TODAY = NOW.astimezone(MOSCOW).date()
USD = next(c for c in DEMO_CURRENCIES if c.iso == "USD")


@pytest.fixture
def bank() -> Iterator[BankStandIn]:
    with BankStandIn() as server:
        yield server


def _client(http: httpx.AsyncClient, url: str, **fields: Any) -> CbrClient:
    return CbrClient(
        http,
        CbrSettings(url=url, retry=RetryPolicy(attempts=2, first_delay_s=0.0), **fields),
        now=lambda: NOW,
    )


async def _call(tool: Tool, **args: Any) -> dict[str, Any]:
    """What the executor does: check the schema, then run."""
    result = tool.run(CALLER, check_arguments(tool.schema, args))
    assert not isinstance(result, dict)
    return await result


# -- the stand-in, driven by the real client ---------------------------------------------


def test_listens_on_loopback_at_the_banks_path(bank: BankStandIn) -> None:
    assert bank.url == f"http://127.0.0.1:{bank.port}{PATH}"
    assert PATH == "/DailyInfoWebServ/DailyInfo.asmx"
    assert bank.port > 0
    page = httpx.get(bank.url, timeout=5)
    assert page.status_code == 200
    assert "DEMO" in page.text


async def test_rates_on_date_today_for_the_common_currencies(
    bank: BankStandIn, http: httpx.AsyncClient
) -> None:
    data = await _client(http, bank.url).rates_on_date(TODAY)
    isos = {row["VchCode"] for row in data.rows}
    assert {"USD", "EUR", "CNY", "GBP", "JPY", "CHF", "KZT", "BYN", "TRY"} <= isos
    usd = next(row for row in data.rows if row["VchCode"] == "USD")
    assert float(usd["Vcurs"]) == rate_for(USD, rate_day_on(TODAY))
    assert data.properties["OnDate"] == rate_day_on(TODAY).strftime("%Y%m%d")
    # Every demo currency carries the bank code the client's built-in table knows.
    for c in DEMO_CURRENCIES:
        assert COMMON_CURRENCIES.get(c.iso, c.code) == c.code


def test_the_demo_bank_quotes_every_currency_a_question_can_name() -> None:
    # A question naming one it lacked ("курс австралийского доллара") got NOT_FOUND in the demo.
    from services.common.currencies import CURRENCIES as NAMED

    named = {code for code, _ in NAMED}
    assert named <= {c.iso for c in DEMO_CURRENCIES}
    assert named <= set(COMMON_CURRENCIES)  # the client resolves each without EnumValutes


async def test_rates_dynamic_over_recent_days(bank: BankStandIn, http: httpx.AsyncClient) -> None:
    start = TODAY - timedelta(days=13)
    data = await _client(http, bank.url).rates_dynamic(start, TODAY, USD.code)
    days = [datetime.fromisoformat(row["CursDate"]).date() for row in data.rows]
    assert days and all(start <= d <= TODAY for d in days)
    assert len(days) == sum(1 for i in range(14) if (start + timedelta(i)).weekday() not in (0, 6))
    assert all(row["Vcode"] == USD.code for row in data.rows)


async def test_key_rate_history(bank: BankStandIn, http: httpx.AsyncClient) -> None:
    data = await _client(http, bank.url).key_rate(TODAY - timedelta(days=30), TODAY)
    assert data.rows
    newest = data.rows[0]  # the bank lists the newest first
    assert float(newest["Rate"]) == key_rate_on(
        datetime.fromisoformat(newest["DT"]).date(), DEMO_KEY_RATE_CHANGES
    )
    old = await _client(http, bank.url).key_rate(date(2024, 11, 1), date(2024, 11, 8))
    assert {float(row["Rate"]) for row in old.rows} == {21.0}


async def test_holidays_have_no_key_rate_and_no_rates_the_day_after(
    http: httpx.AsyncClient,
) -> None:
    holidays = frozenset(date(2025, 1, d) for d in range(1, 9))  # New Year: Jan 1-8
    with BankStandIn(holidays=holidays) as bank:
        client = _client(http, bank.url)
        key = await client.key_rate(date(2024, 12, 30), date(2025, 1, 10))
        usd = await client.rates_dynamic(date(2024, 12, 30), date(2025, 1, 11), USD.code)
        on = await client.rates_on_date(date(2025, 1, 5))
    assert [datetime.fromisoformat(r["DT"]).date().day for r in key.rows] == [10, 9, 31, 30]
    # Rates are dated the day after the working day that set them.
    assert [datetime.fromisoformat(r["CursDate"]).date().isoformat() for r in usd.rows] == [
        "2024-12-31",
        "2025-01-01",
        "2025-01-10",
        "2025-01-11",
    ]
    assert on.properties["OnDate"] == "20250101"
    # Without holidays, the usual week: rates dated Tuesday to Saturday, key rate Mon-Fri.
    assert [d.weekday() for d in (date(2025, 1, 7) + timedelta(i) for i in range(7))
            if is_rate_day(d)] == [1, 2, 3, 4, 5]  # fmt: skip


async def test_news_are_recent_and_labelled_demo(
    bank: BankStandIn, http: httpx.AsyncClient
) -> None:
    data = await _client(http, bank.url).news(TODAY - timedelta(days=7), TODAY)
    assert len(data.rows) >= 3
    assert all(row["Title"].startswith("[ДЕМО]") for row in data.rows)


async def test_enum_valutes(bank: BankStandIn, http: httpx.AsyncClient) -> None:
    data = await _client(http, bank.url).currencies()
    assert {row["VcharCode"] for row in data.rows} == {c.iso for c in DEMO_CURRENCIES}
    pln = await _client(http, bank.url).resolve_currency("PLN")  # not in the built-in table
    assert pln.code == "R01565"


def test_stop_closes_the_port() -> None:
    bank = BankStandIn().start()
    url = bank.url
    bank.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.post(url, content=b"", timeout=2)
    BankStandIn().stop()  # never started: closes its socket, no error


# -- the demo label in tool results --------------------------------------------------------


async def test_every_result_is_labelled_in_demo_mode(
    bank: BankStandIn, http: httpx.AsyncClient
) -> None:
    tool = cbr_tool(_client(http, bank.url, demo=True))
    assert "DEMO MODE" in tool.description
    results = [
        await _call(tool, mode="currency", code="USD"),
        await _call(tool, mode="currency", code="USD", date_from=str(TODAY - timedelta(days=7))),
        await _call(tool, mode="key_rate"),
        await _call(tool, mode="news"),
    ]
    for result in results:
        assert result["demo"] is True
        assert result["source"].startswith(DEMO_SOURCE)
        assert DEMO_SOURCE == "Bank of Russia DailyInfo (DEMO stand-in, not real data)"
        assert result["source_url"] == bank.url
        assert result["text"].startswith(DEMO_NOTICE)
        assert result["external_data"] is True
    assert results[0]["items"][0]["value"] == rate_for(USD, rate_day_on(TODAY))


async def test_no_label_without_demo_mode(http: httpx.AsyncClient) -> None:
    with FakeCbrServer() as fake:
        tool = cbr_tool(_client(http, fake.url))
        assert "DEMO" not in tool.description
        for args in (
            {"mode": "currency", "code": "USD", "date": "2025-07-30"},
            {"mode": "key_rate", "date": "2025-07-30"},
        ):
            result = await _call(tool, **args)
            assert result["demo"] is False
            assert "DEMO" not in result["source"]
            assert result["source"].startswith("Bank of Russia DailyInfo, ")
            assert result["source_url"] == DEFAULT_URL
            assert "DEMO" not in result["text"]


def test_demo_setting_from_env() -> None:
    assert cbr_settings(Env({})).demo is False
    assert cbr_settings(Env({})).url == DEFAULT_URL
    settings = cbr_settings(
        Env({"MCP_PROXY_CBR_DEMO": "true", "MCP_PROXY_CBR_URL": "http://127.0.0.1:1" + PATH})
    )
    assert settings.demo is True


# -- the mesh option -----------------------------------------------------------------------


def test_mesh_points_the_proxy_at_the_standin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MCP_PROXY_CBR_URL", "https://example.invalid/DailyInfo.asmx")
    mesh = Mesh(Ports.free(), tmp_path / "data", tmp_path / "run", bank_standin=True)
    env = mesh.env()
    assert mesh.bank_port > 0
    assert env["MCP_PROXY_CBR_URL"] == f"http://127.0.0.1:{mesh.bank_port}{PATH}"
    assert env["MCP_PROXY_CBR_URL"] == mesh.bank_url
    assert env["MCP_PROXY_CBR_DEMO"] == "true"
    assert cbr_settings(Env(env)).demo is True
    assert mesh.bank is None  # nothing runs before start()


def test_mesh_without_the_standin_leaves_the_bank_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MCP_PROXY_CBR_URL", raising=False)
    monkeypatch.delenv("MCP_PROXY_CBR_DEMO", raising=False)
    mesh = Mesh(Ports.free(), tmp_path / "data", tmp_path / "run")
    env = mesh.env()
    assert mesh.bank_url is None
    assert "MCP_PROXY_CBR_URL" not in env
    assert "MCP_PROXY_CBR_DEMO" not in env
    assert cbr_settings(Env(env)).url == DEFAULT_URL


def test_mesh_stop_stops_the_standin(tmp_path: Path) -> None:
    mesh = Mesh(Ports.free(), tmp_path / "data", tmp_path / "run", bank_standin=True)
    mesh.bank = BankStandIn(mesh.bank_port).start()  # what start() does before the services
    assert httpx.get(mesh.bank_url or "", timeout=5).status_code == 200
    mesh.stop()
    assert mesh.bank is None
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{mesh.bank_port}{PATH}", timeout=2)
