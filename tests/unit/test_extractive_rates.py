"""The extractive responder on Bank of Russia series longer than one tool result holds: it
answers with the period's first and last values and their dates, how many values there were
and how many the result left out; and a rates result it cannot read is never answered with
the documents' "not found"."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from services.common.tokenizer import default_tokenizer
from services.common.untrusted import wrap_untrusted
from services.llm.extractive import ExtractiveRuntime, compose
from services.llm.loop import LoopSettings, ToolLoop
from services.llm.model import GenerateInput, PlannedCall, ToolPolicy, ToolResult, Turn, User
from services.model_runtime.chat import ChatMessage, ToolCall
from tests.fakes.clock import ManualClock
from tests.unit.test_loop import FakeTools
from tests.unit.test_planned_calls import ALL_TOOLS, CATALOGUE
from tests.unit.test_toolcalls_series import HIGH, KEY_RATE_YEAR, LOW, USD_YEAR, fetch, usd_value

DEFAULT = LoopSettings()
"""The loop's own defaults: 2048 tokens for one tool result."""
MESH = LoopSettings(max_total_tokens=32768, max_tool_result_tokens=32768 - 4096 - 512)
"""The mesh's defaults (LLM_SERVICE_MAX_TOTAL_TOKENS less MAX_PROMPT_TOKENS and
MAX_COMPLETION_TOKENS), under the Orchestrator's context budget of 8192 tokens."""
BUDGETS = [pytest.param(DEFAULT, None, id="loop-defaults"), pytest.param(MESH, 8192, id="mesh")]
NOT_FOUND_WORDS = ("документ", "document")


async def ask(question: str, args: dict[str, Any], settings: LoopSettings, budget: int | None):
    tools = FakeTools([ToolResult("ok", await fetch(args))])
    loop = ToolLoop(
        ExtractiveRuntime(), tools, CATALOGUE, settings,
        clock=ManualClock(), tokenizer=default_tokenizer(),
    )  # fmt: skip
    policy = ToolPolicy(
        allowed_tools=ALL_TOOLS, planned_calls=(PlannedCall("fetch_cbr_data", args),),
        context_token_budget=budget,
    )  # fmt: skip
    r = GenerateInput(messages=(Turn("user", question),), mode="chat", user=User("t1", "u1"),
                      policy=policy, trace_id="tr")  # fmt: skip
    out = await loop.run(r)
    assert [c[0] for c in tools.calls] == ["fetch_cbr_data"]
    return out


@pytest.mark.parametrize(("settings", "budget"), BUDGETS)
async def test_a_year_of_dollar_rates_is_answered_with_its_first_and_last_values(settings, budget):
    out = await ask("курс доллара с 01.01.2024 по 31.12.2024", USD_YEAR, settings, budget)
    a = out.answer
    assert a.startswith(
        "**Кратко:** Курс USD с 01.01.2024 по 31.12.2024: 90,00 ₽ → 103,05 ₽ за 1 USD. "
        "Значений за период: 262; минимум 80,1234 ₽ (20.05.2024), максимум 110,5678 ₽ "
        "(29.07.2024). [Источник: cbr.ru]"
    ), a
    assert usd_value(261) == 103.05 and (usd_value(100), usd_value(150)) == (LOW, HIGH)
    assert not any(w in a.lower() for w in NOT_FOUND_WORDS), a
    # The result was thinned to its room: the answer says how many values it left out.
    m = re.search(r"здесь (\d+) из 262 значений .*; не вошло значений: (\d+)\.", a)
    assert m is not None, a
    assert int(m.group(1)) + int(m.group(2)) == 262 and int(m.group(2)) > 0
    assert out.tools_called[0].result_summary.endswith("truncated to the token budget")


async def test_the_same_in_english():
    out = await ask("USD rate in 2024", USD_YEAR, DEFAULT, None)
    assert out.answer.startswith(
        "**In short:** USD rate from 2024-01-01 to 2024-12-31: 90.00 → 103.05 RUB per 1 USD. "
        "Values in the period: 262; lowest 80.1234 RUB (2024-05-20), highest 110.5678 RUB "
        "(2024-07-29). [Source: cbr.ru]"
    ), out.answer
    assert re.search(r"(\d+) of its 262 values are here .*, (\d+) left out\.", out.answer)
    assert "The available documents" not in out.answer


@pytest.mark.parametrize(("settings", "budget"), BUDGETS)
async def test_a_year_of_the_key_rate_is_answered_with_its_first_and_last_values(settings, budget):
    out = await ask("ключевая ставка за 2024 год", KEY_RATE_YEAR, settings, budget)
    a = out.answer
    assert a.startswith(
        "**Кратко:** Ключевая ставка Банка России на 31.12.2024: 21 % годовых. [Источник: cbr.ru]"
    ), a
    assert (
        "С 01.01.2024 по 31.12.2024: 16 % → 21 % годовых. Значений за период: 262; "
        "минимум 16 % (01.01.2024), максимум 21 % (02.12.2024)."
    ) in a
    changes = "- с 01.01.2024: 16 %\n- с 25.03.2024: 17 %\n- с 17.06.2024: 18 %\n"
    assert changes + "- с 09.09.2024: 19 %\n- с 02.12.2024: 21 %" in a
    assert "В доступных документах" not in a


def conversation(result: dict[str, Any] | None, texts: tuple[str, ...] = ()) -> list[ChatMessage]:
    """A question, the planned fetch_cbr_data call and its result message as render_result
    writes it (`result` None: a header cut to the tool's name and status)."""
    header: dict[str, Any] = {"tool_name": "fetch_cbr_data", "status": "ok"}
    if result is not None:
        header["result"] = result
    header["truncated"] = True
    content = "\n".join([json.dumps(header, ensure_ascii=False), *texts])
    call = ToolCall("planned-1", "fetch_cbr_data", "{}")
    return [
        ChatMessage("assistant", "", tool_calls=(call,)),
        ChatMessage("tool", content, tool_call_id="planned-1", name="fetch_cbr_data"),
    ]


def test_a_thinned_result_says_how_many_values_it_left_out():
    items = [{"date": f"2024-0{m}-01", "nominal": 1, "value": 90.0 + m} for m in (1, 4, 9)]
    result = {"mode": "currency", "series": "dynamic", "currency": "USD",
              "date_from": "2024-01-01", "date_to": "2024-09-30", "source_url": "",
              "items": items, "count": 200, "items_omitted": 197}  # fmt: skip
    a = compose("курс доллара за 9 месяцев", conversation(result))
    assert "здесь 3 из 200 значений" in a and "не вошло значений: 197." in a, a
    assert "Значений за период: 200;" in a and "91,00 ₽ → 99,00 ₽" in a
    whole = {**result, "items_omitted": 0}
    assert "не вошло" not in compose("курс доллара за 9 месяцев", conversation(whole))


@pytest.mark.parametrize(
    ("question", "said"),
    [
        ("курс доллара за 2020 год",
         "**Кратко:** Данные Банка России получены, но прочитать из них курсы или ставку не "
         "удалось. [Источник: cbr.ru]"),
        ("USD rate in 2020",
         "**In short:** The Bank of Russia data arrived, but no rates could be read from it. "
         "[Source: cbr.ru]"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("result", [None, {"truncated": True}])
def test_an_unreadable_rates_result_is_not_answered_as_missing_from_the_documents(
    question, said, result
):
    a = compose(question, conversation(result))
    assert a.startswith(said), a
    assert not any(w in a.lower() for w in NOT_FOUND_WORDS), a


def test_a_header_cut_to_its_name_leaves_the_text_to_answer_from():
    text = wrap_untrusted(
        "USD rate of the Bank of Russia, 262 values from 2024-01-09 to 2024-12-28",
        "EXTERNAL", {"source": "Bank of Russia DailyInfo, GetCursDynamic"},
    )  # fmt: skip
    a = compose("курс доллара за 2024 год", conversation(None, (text,)))
    assert a.startswith("**Кратко:** USD rate of the Bank of Russia, 262 values from"), a
    assert "- Bank of Russia DailyInfo, GetCursDynamic" in a
    assert "В доступных документах" not in a
