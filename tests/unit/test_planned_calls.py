"""Planned tool calls (ToolPolicy.planned_calls): run first, in order, as tool steps."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from visior.llm.v1 import llm_pb2

from services.common import errors
from services.llm.engine import LlmEngine
from services.llm.loop import PLANNED_FIELD, LoopSettings, ToolLoop
from services.llm.model import Anchor, GenerateInput, PlannedCall, ToolPolicy, Turn, User
from services.llm.prompt import FINAL_ANSWER_NOTE
from services.llm.servicer import generate_input
from services.llm.toolcalls import READ_TOOL_SPECS
from services.model_runtime.chat import ToolSpec
from services.toolsproxy.cbr import CbrSettings, cbr_schema
from services.toolsproxy.tavily import tavily_schema
from tests.fakes.clock import ManualClock
from tests.unit.test_loop import (
    NOT_FOUND,
    TOK,
    Events,
    FakeTools,
    ScriptedRuntime,
    asks,
    call,
    says,
    tool_messages,
    window,
)

CBR = "fetch_cbr_data"
LOAD = "load_documents_full"
KB = "search_general_kb"
DATA_TOOL_SPECS = (
    ToolSpec(CBR, "Official data of the Bank of Russia.", cbr_schema(CbrSettings())),
    ToolSpec(
        LOAD,
        "Whole documents.",
        {
            "type": "object",
            "properties": {"document_ids": {"type": "array", "items": {"type": "string"}}},
            "required": ["document_ids"],
            "additionalProperties": False,
        },
    ),
    ToolSpec(KB, "Search the knowledge base.", {"type": "object", "required": ["query"]}),
    ToolSpec("search_user_documents", "Search the user's documents.", {"type": "object"}),
    ToolSpec("fetch_finance_news", "Finance news (Tavily).", tavily_schema()),
)
CATALOGUE = (*READ_TOOL_SPECS, *DATA_TOOL_SPECS)
ALL_TOOLS = tuple(t.name for t in CATALOGUE)
RATES = PlannedCall(CBR, {"mode": "currency", "code": "USD"})
KEY_RATE = PlannedCall(CBR, {"mode": "key_rate"})
OK = window()  # any ok result: the loop does not look inside


def req(planned: tuple[PlannedCall, ...], **policy: Any) -> GenerateInput:
    base: dict[str, Any] = {"allowed_tools": ALL_TOOLS, "planned_calls": planned}
    return GenerateInput(
        messages=(Turn("user", "Какой курс доллара?"),),
        user=User("t1", "u1"),
        policy=ToolPolicy(**{**base, **policy}),
        trace_id="tr",
    )


def loop(runtime, tools, **settings) -> ToolLoop:
    return ToolLoop(
        runtime, tools, CATALOGUE, LoopSettings(**settings), clock=ManualClock(), tokenizer=TOK
    )


async def test_planned_calls_run_first_in_order_and_reach_the_model_as_tool_results():
    rt = ScriptedRuntime([says("Курс USD …")])
    tools = FakeTools([OK, OK])
    events = Events()
    out = await loop(rt, tools).run(req((RATES, KEY_RATE)), events)
    # Executed in order, on the request's user, before the model was asked.
    assert [(c[0], c[1]) for c in tools.calls] == [
        (CBR, {"mode": "currency", "code": "USD"}),
        (CBR, {"mode": "key_rate"}),
    ]
    assert all(c[2] == User("t1", "u1") and c[3] == "tr" for c in tools.calls)
    assert len(rt.calls) == 1
    sent = rt.calls[0]["messages"]
    # As if the model had called them: one assistant turn with both calls, then the results.
    turn = sent[-3]
    assert turn.role == "assistant" and turn.content == ""
    assert [(c.id, c.name) for c in turn.tool_calls] == [("planned-1", CBR), ("planned-2", CBR)]
    assert json.loads(turn.tool_calls[0].arguments) == RATES.arguments
    assert [(m.role, m.tool_call_id) for m in sent[-2:]] == [
        ("tool", "planned-1"),
        ("tool", "planned-2"),
    ]
    assert [m["status"] for m in tool_messages(sent)] == ["ok", "ok"]
    assert [r.name for r in out.tools_called] == [CBR, CBR]
    assert out.tools_called[0].arguments == RATES.arguments
    assert events.tools == list(out.tools_called)
    # One step is left of the three: the model may still call a tool.
    assert rt.calls[0]["tools"] != [] and rt.calls[0]["params"].tool_choice == "auto"
    assert "at most 1 tool call(s)" in sent[0].content


async def test_planned_calls_count_as_steps():
    read = call("read_doc_section", {"doc_id": "guide", "section_id": "s2"})
    rt = ScriptedRuntime([asks(read), says("done")])
    tools = FakeTools(default=OK)
    out = await loop(rt, tools, max_tool_steps=3).run(req((RATES, KEY_RATE)))
    assert [c[0] for c in tools.calls] == [CBR, CBR, "read_doc_section"]
    assert len(out.tools_called) == 3 and out.answer == "done"
    assert rt.calls[1]["params"].tool_choice == "none"  # the third step was the last
    # Planned calls that take every step: the model answers without tools at once.
    rt = ScriptedRuntime([says("answer")])
    await loop(rt, FakeTools(default=OK), max_tool_steps=2).run(req((RATES, KEY_RATE)))
    assert rt.calls[0]["params"].tool_choice == "none"
    assert rt.calls[0]["messages"][-1].content == FINAL_ANSWER_NOTE


@pytest.mark.parametrize(
    ("planned", "policy", "says_"),
    [
        ((RATES,), {"allowed_tools": ("read_doc_section",)}, "not in tool_policy.allowed_tools"),
        ((PlannedCall("delete_all", {}),), {"allowed_tools": ("delete_all",)}, "no such tool"),
        ((PlannedCall(CBR, {"mode": "bribe"}),), {}, "INVALID_ARGUMENT"),
        ((PlannedCall(CBR, {"tenant_id": "other", "mode": "news"}),), {}, "unknown field"),
        ((RATES, RATES), {}, "planned twice"),
        (
            (PlannedCall(CBR, {"operation": "key_rate"}),),
            {},
            "arguments.operation is not accepted: use arguments.mode",
        ),
        (
            (PlannedCall(CBR, {"mode": "currency", "currency": "USD"}),),
            {},
            "arguments.currency is not accepted: use arguments.code",
        ),
        (
            (PlannedCall("fetch_finance_news", {"query": "rates", "search_depth": "deep"}),),
            {},
            "search_depth must be one of basic, advanced",
        ),
    ],
)
async def test_a_planned_call_the_request_may_not_make_refuses_the_request(planned, policy, says_):
    rt = ScriptedRuntime([says("never")])
    tools = FakeTools(default=OK)
    with pytest.raises(errors.InvalidArgumentError) as info:
        await loop(rt, tools).run(req(planned, **policy))
    assert info.value.reason == "INVALID_ARGUMENT"
    assert info.value.metadata["field"] == PLANNED_FIELD
    assert says_ in info.value.message
    assert tools.calls == [] and rt.calls == []  # nothing ran


@pytest.mark.parametrize(("server", "policy"), [(2, None), (3, 2), (3, 0)])
async def test_more_planned_calls_than_steps_is_a_limit_error(server, policy):
    tools = FakeTools(default=OK)
    three = (RATES, KEY_RATE, PlannedCall(CBR, {"mode": "news"}))
    with pytest.raises(errors.LimitExceededError) as info:
        await loop(ScriptedRuntime([]), tools, max_tool_steps=server).run(
            req(three, max_tool_steps=policy)
        )
    assert info.value.reason == "LLM_LIMIT_EXCEEDED"
    assert info.value.metadata["field"] == PLANNED_FIELD
    assert info.value.metadata["limit_name"] == "max_tool_steps"
    assert tools.calls == []
    # At the limit it runs.
    out = await loop(ScriptedRuntime([says("ok")]), FakeTools(default=OK), max_tool_steps=3).run(
        req(three)
    )
    assert len(out.tools_called) == 3


async def test_a_failed_planned_call_is_fed_back_as_a_tool_error():
    rt = ScriptedRuntime([says("Данные недоступны")])
    # Two failures in a row: the model did not make them, so the request is not aborted.
    refused = errors.NotFoundError("no rate", reason="NOT_FOUND")
    out = await loop(rt, FakeTools([NOT_FOUND, refused])).run(req((RATES, KEY_RATE)))
    fed = tool_messages(rt.calls[0]["messages"])
    assert [m["tool_error"]["code"] for m in fed] == ["NOT_FOUND", "NOT_FOUND"]
    assert [r.result_summary.split(":")[0] for r in out.tools_called] == [
        "tool_error NOT_FOUND",
        "tool_error NOT_FOUND",
    ]
    assert out.answer == "Данные недоступны"


async def test_a_toolsproxy_outage_during_planned_calls_propagates():
    down = errors.UnavailableError("toolsproxy down", reason="UPSTREAM_UNAVAILABLE")
    rt = ScriptedRuntime([says("never")])
    with pytest.raises(errors.UnavailableError) as info:
        await loop(rt, FakeTools([down])).run(req((RATES,)))
    assert info.value.reason == "UPSTREAM_UNAVAILABLE" and rt.calls == []


async def test_the_model_repeating_a_planned_call_is_stopped_as_a_runaway():
    again = call(CBR, {"mode": "currency", "code": "USD"})
    rt = ScriptedRuntime([asks(again), says("answer")])
    tools = FakeTools(default=OK)
    out = await loop(rt, tools).run(req((RATES,)))
    assert len(tools.calls) == 1 and out.answer == "answer"
    assert tool_messages(rt.calls[1]["messages"])[-1]["tool_error"]["code"] == "REPEATED_CALL"


async def test_planned_reads_follow_the_policy_like_the_models_reads():
    planned = (PlannedCall("read_chunk_window", {"doc_id": "guide", "anchor_chunk_id": "c1"}),)
    policy = {"anchors": (Anchor("guide", "s1", "c1"),), "radius_schedule": (2, 3)}
    tools = FakeTools(default=OK)
    await loop(ScriptedRuntime([says("ok")]), tools).run(req(planned, **policy))
    assert tools.calls[0][1] == {"doc_id": "guide", "anchor_chunk_id": "c1", "radius": 2}


async def test_the_engine_refuses_planned_calls_without_allowed_tools():
    engine = LlmEngine(loop(ScriptedRuntime([says("x")]), FakeTools(default=OK)))
    with pytest.raises(errors.InvalidArgumentError) as info:
        await engine.generate(req((RATES,), allowed_tools=()))
    assert info.value.metadata["field"] == PLANNED_FIELD


def test_the_servicer_maps_planned_calls_with_integers_kept():
    pb = llm_pb2.GenerateRequest(messages=[{"role": "user", "content": "q"}])
    first = pb.tool_policy.planned_calls.add(tool_name=LOAD)
    first.arguments.update({"document_ids": ["a", "b"], "limit": 3})
    pb.tool_policy.planned_calls.add(tool_name=KB)
    policy = generate_input(pb).policy
    assert policy.planned_calls == (
        PlannedCall(LOAD, {"document_ids": ["a", "b"], "limit": 3}),
        PlannedCall(KB, {}),
    )
    assert isinstance(policy.planned_calls[0].arguments["limit"], int)


async def test_planned_results_share_the_room_so_each_is_fed():
    big = window(text="word " * 3000)
    rt = ScriptedRuntime([says("ok")])
    # Without sharing, the first result would take all the room and the second would fail.
    settings = {"max_total_tokens": 2600, "max_completion_tokens": 100, "max_tool_steps": 3}
    out = await loop(rt, FakeTools([big, big]), **settings).run(req((RATES, KEY_RATE)))
    fed = [m for m in rt.calls[0]["messages"] if m.role == "tool"]
    sizes = [TOK.count(m.content) for m in fed]
    assert len(fed) == 2 and min(sizes) >= 0.8 * max(sizes)
    assert all(r.result_summary.endswith("truncated to the token budget") for r in out.tools_called)


# --- per-tool deadlines ---------------------------------------------------------------------

NEWS = PlannedCall("fetch_finance_news", {"query": "ставка", "search_depth": "advanced"})
READ = call("read_doc_section", {"doc_id": "guide", "section_id": "s2"})


async def test_external_tools_get_their_own_deadline_and_document_tools_keep_theirs():
    rt = ScriptedRuntime([asks(READ), says("done")])
    tools = FakeTools(default=OK)
    settings = {"tool_timeout_s": 5.0, "external_tool_timeout_s": 10.0, "watchdog_s": 60.0}
    await loop(rt, tools, max_tool_steps=3, **settings).run(req((NEWS, KEY_RATE)))
    assert [c[0] for c in tools.calls] == ["fetch_finance_news", CBR, "read_doc_section"]
    assert tools.timeouts == [10.0, 10.0, 5.0]


@pytest.mark.parametrize(
    ("request_s", "external", "document"),
    # The request's time less the hop's margin (CALLER_MARGIN_S): its answer reaches the caller.
    [(60.0, 10.0, 5.0), (10.25, 10.0, 5.0), (10.0, 9.75, 5.0), (7.0, 6.75, 5.0), (3.0, 2.75, 2.75)],
)
async def test_a_tools_deadline_never_passes_the_requests_time_left(request_s, external, document):
    rt = ScriptedRuntime([asks(READ), says("done")])
    tools = FakeTools(default=OK)
    settings = {"tool_timeout_s": 5.0, "external_tool_timeout_s": 10.0, "watchdog_s": 60.0}
    await loop(rt, tools, **settings).run(req((NEWS,)), timeout_s=request_s)
    assert tools.timeouts == pytest.approx([external, document])


async def test_the_deadline_shrinks_with_the_time_the_request_has_spent():
    clock = ManualClock()

    class Slow(FakeTools):
        async def execute(self, request, *, timeout_s=None):
            clock.now += 4.0  # each call takes 4 s
            return await super().execute(request, timeout_s=timeout_s)

    tools = Slow(default=OK)
    run = ToolLoop(
        ScriptedRuntime([says("done")]),
        tools,
        CATALOGUE,
        LoopSettings(tool_timeout_s=5.0, external_tool_timeout_s=10.0, watchdog_s=13.0),
        clock=clock,
        tokenizer=TOK,
    )
    await run.run(req((NEWS, KEY_RATE, RATES)))
    # 13 s for the request: 10 s (the tool's own), then 9 s left, then 5 s left.
    assert tools.timeouts == [10.0, 9.0, 5.0]


async def test_an_answer_from_fetched_data_is_not_withheld_for_what_documents_lack():
    # The rates name USD, the document read does not: the answer is the data's.
    rt = ScriptedRuntime([asks(call("read_doc_section", {"doc_id": "guide", "section_id": "s1"})),
                          says("USD is 101.68 RUB.")])  # fmt: skip
    r = replace(req((RATES,)), messages=(Turn("user", "What is the USD rate?"),))
    out = await loop(rt, FakeTools([OK, window()])).run(r)
    assert out.answer == "USD is 101.68 RUB." and out.withheld_for == ()


async def test_a_planned_read_that_fills_the_room_still_gets_its_final_answer():
    """The planned call takes the last step and its result every token left: the note asking
    for the final answer then rides on top, out of the answer's share, like the language note
    (it was counted into the conversation, which it pushed past its limit: LLM_LIMIT_EXCEEDED).
    With room left it is counted there, and the answer keeps its share."""
    big = window(text="word " * 3000)
    rt = ScriptedRuntime([says("answer")])
    settings = {"max_total_tokens": 2600, "max_completion_tokens": 100, "max_tool_steps": 1}
    out = await loop(rt, FakeTools([big]), **settings).run(req((RATES,)))
    assert out.answer == "answer"
    assert out.tools_called[0].result_summary.endswith("truncated to the token budget")
    sent = rt.calls[0]
    assert sent["messages"][-1].content == FINAL_ANSWER_NOTE
    note = TOK.count(FINAL_ANSWER_NOTE)
    assert note < 100 - sent["params"].max_tokens < note + 16
    # with room left, the answer keeps its whole share
    rt = ScriptedRuntime([says("answer")])
    await loop(rt, FakeTools([OK]), **settings).run(req((RATES,)))
    assert rt.calls[0]["messages"][-1].content == FINAL_ANSWER_NOTE
    assert rt.calls[0]["params"].max_tokens == 100
