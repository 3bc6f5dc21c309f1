"""A fetch_cbr_data series that does not fit its room (services/llm/toolcalls.py
render_result): its header stays, its items are thinned to what fits (the first and the last,
the lowest and the highest, the changes, a spread of the rest) and the header counts the
items left out. It used to go "compact": the tool's name and status alone, every item gone,
and a rates question over a year was answered "not in the documents"."""

from __future__ import annotations

import asyncio
import json
from datetime import date, timedelta
from typing import Any

import pytest

from services.common.tokenizer import default_tokenizer
from services.llm.loop import LoopSettings
from services.llm.model import ToolResult
from services.llm.toolcalls import (
    fill_placeholders,
    parse_tool_content,
    render_result,
    summarise,
)
from services.toolsproxy.cbr import CbrSettings, CbrTool, Currency, DataSet
from services.toolsproxy.tools import shape_result

TOK = default_tokenizer()
CBR = "fetch_cbr_data"
ROOM = LoopSettings().max_tool_result_tokens
"""One tool result's room by default (2048 tokens)."""
YEAR = {"date_from": "2024-01-01", "date_to": "2024-12-31"}
USD_YEAR = {"mode": "currency", "code": "USD", **YEAR}
KEY_RATE_YEAR = {"mode": "key_rate", **YEAR}
LOW, HIGH = 80.1234, 110.5678
"""The USD series' lowest and highest values, set mid-year."""
KEY_RATES = ((date(2024, 1, 1), 16.0), (date(2024, 3, 25), 17.0), (date(2024, 6, 17), 18.0),
             (date(2024, 9, 9), 19.0), (date(2024, 12, 2), 21.0))  # fmt: skip
"""The key rate series' changes: the day each value takes effect."""


def _days(first: date, last: date) -> list[date]:
    """Every weekday from `first` to `last`: the days the bank sets values on."""
    n = (last - first).days + 1
    return [d for d in (first + timedelta(days=i) for i in range(n)) if d.weekday() < 5]


def usd_value(i: int) -> float:
    """The USD rate of the i-th day of the series: 90 rising, its lowest on day 100 and its
    highest on day 150."""
    return {100: LOW, 150: HIGH}.get(i, round(90 + i * 0.05, 4))


class _Bank:
    """A CbrClient answering from the series above."""

    settings = CbrSettings()

    def today(self) -> date:
        return date(2025, 6, 1)

    async def resolve_currency(self, code: str) -> Currency:
        return Currency(code, "R01235")

    async def rates_dynamic(self, first: date, last: date, code: str) -> DataSet:
        rows = [
            {"CursDate": f"{d.isoformat()}T00:00:00+03:00", "Vnom": "1",
             "Vcurs": f"{usd_value(i):.4f}".replace(".", ",")}
            for i, d in enumerate(_days(first, last))
        ]  # fmt: skip
        return DataSet(tuple(rows))

    async def key_rate(self, first: date, last: date) -> DataSet:
        rows = []
        for d in _days(first, last):
            rate = [v for since, v in KEY_RATES if since <= d][-1]
            rows.append({"DT": f"{d.isoformat()}T00:00:00", "Rate": f"{rate:.2f}"})
        return DataSet(tuple(rows))


async def fetch(args: dict[str, Any]) -> dict[str, Any]:
    """fetch_cbr_data's result for `args` as ToolsProxy hands it to the LLM service: made by
    the proxy's own tool, its text delimited by the executor."""
    raw = await CbrTool(_Bank()).run(None, dict(args))  # type: ignore[arg-type]
    return shape_result(raw, 64 * 1024, "external").result


def cbr_result(args: dict[str, Any]) -> dict[str, Any]:
    return asyncio.run(fetch(args))


def header_of(content: str) -> dict[str, Any]:
    return json.loads(content.partition("\n")[0])


@pytest.fixture(scope="module")
def usd_year() -> dict[str, Any]:
    return cbr_result(USD_YEAR)


@pytest.fixture(scope="module")
def key_rate_year() -> dict[str, Any]:
    return cbr_result(KEY_RATE_YEAR)


@pytest.mark.parametrize("room", [ROOM, 1000, 6000])
def test_a_year_of_rates_keeps_its_header_and_the_items_that_fit(usd_year, room):
    whole = usd_year["items"]
    assert len(whole) == 262 and TOK.count(json.dumps(usd_year)) > room  # it cannot fit
    rendered = render_result(CBR, usd_year, TOK, room)
    assert TOK.count(rendered.content) <= room and rendered.truncated
    parsed = parse_tool_content(rendered.content)
    assert parsed is not None and parsed.ok
    head = header_of(rendered.content)
    assert head["truncated"] is True and "result" in head
    result = fill_placeholders(parsed.result, parsed.texts)
    for key in ("mode", "series", "currency", "bank_code", "date_from", "date_to", "source",
                "source_url", "count"):  # fmt: skip
        assert result[key] == usd_year[key], key
    assert result["text"].startswith("USD rate of the Bank of Russia, 262 values")
    kept = result["items"]
    assert 2 < len(kept) < len(whole)
    assert result["items_omitted"] == len(whole) - len(kept)
    assert kept[0] == whole[0] and kept[-1] == whole[-1]  # the period's first and last values
    assert {i["value"] for i in kept} >= {LOW, HIGH}  # its lowest and highest
    assert [i["date"] for i in kept] == sorted(i["date"] for i in kept)  # in date order
    assert all(i in whole for i in kept)


def test_more_room_keeps_more_items_and_a_spread_over_the_period(usd_year):
    counts = []
    for room in (600, 1000, ROOM, 4000):
        result = parse_tool_content(render_result(CBR, usd_year, TOK, room).content)
        assert result is not None
        counts.append(len(result.result["items"]))
    assert counts == sorted(counts) and counts[0] < counts[-1]
    kept = parse_tool_content(render_result(CBR, usd_year, TOK, ROOM).content)
    assert kept is not None
    months = {i["date"][:7] for i in kept.result["items"]}
    assert len(months) == 12, months  # every month of the year has a value kept


def test_a_key_rate_series_keeps_every_change(key_rate_year):
    whole = key_rate_year["items"]
    rendered = render_result(CBR, key_rate_year, TOK, 600)
    assert TOK.count(rendered.content) <= 600
    parsed = parse_tool_content(rendered.content)
    assert parsed is not None
    result = parsed.result
    assert result["mode"] == "key_rate" and result["latest"] == key_rate_year["latest"]
    assert (result["date_from"], result["date_to"]) == ("2024-01-01", "2024-12-31")
    kept = result["items"]
    assert kept[0] == whole[0] and kept[-1] == whole[-1]
    assert result["items_omitted"] == len(whole) - len(kept) > 0
    changes = [i for n, i in enumerate(whole) if n and i["value"] != whole[n - 1]["value"]]
    assert len(changes) == len(KEY_RATES) - 1 and all(c in kept for c in changes)


def test_only_a_cbr_series_that_does_not_fit_is_thinned(usd_year):
    rendered = render_result(CBR, usd_year, TOK, ROOM)
    assert '"items_omitted": ' in rendered.content
    summary = summarise(ToolResult("ok", usd_year), rendered.truncated, rendered.texts)
    assert summary.endswith("truncated to the token budget")
    # A series that fits is whole.
    short = {**usd_year, "items": usd_year["items"][:20], "count": 20}
    rendered = render_result(CBR, short, TOK, ROOM)
    assert not rendered.truncated and "items_omitted" not in rendered.content
    # Another tool's items are cut as any result is.
    assert "items_omitted" not in render_result("some_other_tool", usd_year, TOK, ROOM).content
    # With no room for the first and last values, the result is cut as any result is.
    rendered = render_result(CBR, usd_year, TOK, 80)
    assert TOK.count(rendered.content) <= 80 and rendered.truncated
    assert "items_omitted" not in rendered.content
