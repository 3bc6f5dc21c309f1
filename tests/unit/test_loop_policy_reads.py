"""The policy decides what is read (services/llm/toolcalls.py, services/llm/loop.py):

- a window the model over-asks is the schedule's, not a tool_error (orchestrator.md §3.5);
- a first step that had to read but came back as text gets the policy's own first read in
  its place (orchestrator.md §3.3: the first prompt holds only summaries);
- a budget spent after a read withdraws the tools, as the step limit does, and the model
  answers from what it read (orchestrator.md §3.5: the loop cuts at context_token_budget).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import httpx
import pytest

from services.common import errors
from services.common.tool_contract import INVALID_ARGUMENT, read_chunk_window_arguments
from services.llm.loop import LoopSettings, ToolLoop
from services.llm.model import Anchor, ToolPolicy, ToolResult
from services.llm.prompt import FINAL_ANSWER_NOTE
from services.llm.toolcalls import (
    READ_TOOL_SPECS,
    TOOL_LIMIT_REACHED,
    Approved,
    CallGate,
    Rejected,
)
from services.model_runtime.chat import ChatMessage, ToolSpec
from services.model_runtime.client import OpenAiChatRuntime, RuntimeSettings
from tests.fakes.clock import ManualClock
from tests.fakes.openai_chat import FakeChatServer, text
from tests.unit.test_loop import (
    POLICY,
    TOK,
    Events,
    FakeTools,
    ScriptedRuntime,
    asks,
    call,
    loop,
    req,
    says,
    tool_messages,
    window,
)

MAX_RADIUS = 3
PROXY_SPECS = (
    ToolSpec(
        "read_chunk_window",
        "Read the chunks around an anchor chunk.",
        read_chunk_window_arguments({"type": "integer", "minimum": 0, "maximum": MAX_RADIUS}),
    ),
    READ_TOOL_SPECS[1],
)
"""The read tools as ToolsProxy lists them: its schema states the radius' maximum."""


def proxy_loop(runtime: Any, tools: FakeTools, **settings: Any) -> ToolLoop:
    return ToolLoop(runtime, tools, PROXY_SPECS, LoopSettings(**settings),
                    clock=ManualClock(), tokenizer=TOK)  # fmt: skip


# --- 1. the window is the policy's ------------------------------------------------------------


@pytest.mark.parametrize(
    "asked",
    [
        {"radius": 10},
        {"window_before": 7, "window_after": 9},
        {"radius": -1},
        {"radius": "wide"},
    ],
)
def test_a_window_past_the_schemas_maximum_is_the_schedules(asked):
    g = CallGate(PROXY_SPECS, POLICY)
    v = g.review(
        call("read_chunk_window", {"doc_id": "guide", "anchor_chunk_id": "guide:c1", **asked})
    )
    assert isinstance(v, Approved), v
    assert v.arguments == {"doc_id": "guide", "anchor_chunk_id": "guide:c1", "radius": 1}


def test_without_anchors_an_over_asked_radius_is_the_schedules_too():
    g = CallGate(PROXY_SPECS, ToolPolicy(allowed_tools=("read_chunk_window",),
                                         radius_schedule=(2,)))  # fmt: skip
    v = g.review(call("read_chunk_window", {"doc_id": "d", "anchor_chunk_id": "c", "radius": 10}))
    assert isinstance(v, Approved)
    assert v.arguments == {"doc_id": "d", "anchor_chunk_id": "c", "radius": 2}


@pytest.mark.parametrize(
    "arguments",
    [
        {"anchor_chunk_id": "guide:c1", "radius": 10},  # no doc_id
        {"doc_id": 7, "anchor_chunk_id": "guide:c1", "radius": 10},  # not a string
        {"doc_id": "guide", "radius": 10},  # no anchor chunk
        {"doc_id": "guide", "anchor_chunk_id": "guide:c1", "radius": 10, "tenant_id": "t2"},
    ],
)
def test_the_schema_still_checks_what_the_policy_does_not_set(arguments):
    v = CallGate(PROXY_SPECS, POLICY).review(call("read_chunk_window", arguments))
    assert isinstance(v, Rejected) and v.code == INVALID_ARGUMENT


async def test_a_model_over_asking_the_radius_reads_the_scheduled_window():
    """The reviewer's case: radius 10 against a maximum of 3 was a tool_error, nothing was read."""
    over = call("read_chunk_window",
                {"doc_id": "guide", "anchor_chunk_id": "guide:c1", "radius": 10})  # fmt: skip
    rt = ScriptedRuntime([asks(over), says("LDAP is set up in Settings.")])
    tools = FakeTools(default=window())
    out = await proxy_loop(rt, tools).run(req())
    assert [(name, args) for name, args, *_ in tools.calls] == [
        ("read_chunk_window", {"doc_id": "guide", "anchor_chunk_id": "guide:c1", "radius": 1})
    ]
    assert len(out.tools_called) == 1 and out.tools_called[0].arguments["radius"] == 1
    assert tool_messages(rt.calls[1]["messages"])[0]["status"] == "ok"


# --- 2. a first step that had to read -----------------------------------------------------------

REQUIRED = replace(POLICY, require_tool_call=True)
UNREAD = "The sections say LDAP is under Settings."


async def test_a_text_answer_to_a_required_read_gets_the_policys_read_in_its_place():
    rt = ScriptedRuntime([says(UNREAD), says("LDAP: Settings.")])
    tools = FakeTools(default=window())
    out = await loop(rt, tools).run(req(policy=REQUIRED))
    # The read the policy schedules for its top anchor, as if the model had asked for it.
    assert [(name, args) for name, args, *_ in tools.calls] == [
        ("read_chunk_window", {"doc_id": "guide", "anchor_chunk_id": "guide:c1", "radius": 1})
    ]
    assert out.answer == "LDAP: Settings." and len(out.tools_called) == 1
    assert [c["params"].tool_choice for c in rt.calls] == ["required", "auto"]
    sent = rt.calls[1]["messages"]
    turn = next(m for m in sent if m.role == "assistant")
    assert turn.content == "" and [c.name for c in turn.tool_calls] == ["read_chunk_window"]
    result = next(m for m in sent if m.role == "tool")
    assert result.tool_call_id == turn.tool_calls[0].id
    assert json.loads(result.content.partition("\n")[0])["status"] == "ok"
    assert not any(UNREAD in m.content for m in sent)  # the unread answer is discarded


async def test_the_policys_read_is_a_tool_step_within_the_limit():
    rt = ScriptedRuntime([says(UNREAD), says("from the read")])
    tools = FakeTools(default=window())
    out = await loop(rt, tools, max_tool_steps=1).run(req(policy=REQUIRED))
    assert len(tools.calls) == 1 and out.answer == "from the read"
    # The one step is spent: the tools are withdrawn for the answer.
    assert rt.calls[1]["params"].tool_choice == "none"
    assert rt.calls[1]["messages"][-1].content == FINAL_ANSWER_NOTE


async def test_the_policy_reads_the_section_when_its_top_anchor_has_no_chunk():
    policy = replace(REQUIRED, anchors=(Anchor("faq", "f1", ""), *POLICY.anchors))
    rt = ScriptedRuntime([says(UNREAD), says("ok")])
    tools = FakeTools(default=window("faq"))
    await loop(rt, tools).run(req(policy=policy))
    assert [(name, args) for name, args, *_ in tools.calls] == [
        ("read_doc_section", {"doc_id": "faq", "section_id": "f1"})
    ]


async def test_a_model_that_keeps_answering_gets_one_read_in_its_place():
    rt = ScriptedRuntime([says(UNREAD), says("still no call")])
    tools = FakeTools(default=window())
    out = await loop(rt, tools).run(req(policy=REQUIRED))
    assert len(tools.calls) == 1 and out.answer == "still no call" and len(rt.calls) == 2


async def test_with_nothing_for_the_policy_to_read_the_text_is_the_answer():
    policy = ToolPolicy(allowed_tools=POLICY.allowed_tools, require_tool_call=True)
    rt = ScriptedRuntime([says("plain")])
    tools = FakeTools(default=window())
    out = await loop(rt, tools).run(req(policy=policy))
    assert out.answer == "plain" and tools.calls == [] and out.tools_called == ()


async def test_a_stream_ends_the_discarded_step_with_the_reads_event():
    rt = ScriptedRuntime([says(UNREAD), says("LDAP: Settings.")])
    events = Events()
    out = await loop(rt, FakeTools(default=window())).run(req(policy=REQUIRED), events)
    assert events.answer() == out.answer == "LDAP: Settings."
    assert UNREAD not in "".join(events.deltas)
    assert [r.name for r in events.tools] == ["read_chunk_window"]


async def test_a_runtime_ignoring_tool_choice_over_http_still_reads():
    """The reviewer's case on the wire: the OpenAI-compatible runtime is sent tool_choice
    "required" and answers with text anyway."""
    fake = FakeChatServer()
    fake.script(text(UNREAD), text("LDAP: Settings."))
    tools = FakeTools(default=window())
    async with httpx.AsyncClient(transport=fake.transport()) as http:
        runtime = OpenAiChatRuntime(RuntimeSettings(url="http://fake", default_model="m"), http)
        out = await proxy_loop(runtime, tools).run(req(policy=REQUIRED))
    assert fake.chat_requests[0].json["tool_choice"] == "required"
    assert out.answer == "LDAP: Settings." and len(out.tools_called) == 1
    assert len(tools.calls) == 1
    roles = [m["role"] for m in fake.chat_requests[1].messages]
    assert roles.count("tool") == 1


# --- 3. the budget spent after a read ----------------------------------------------------------

BUDGET = 2048
TIGHT = replace(POLICY, context_token_budget=BUDGET)
LONG = window(text="LDAP is set up in Settings. " * 800)
READ_C1 = call("read_chunk_window", {"doc_id": "guide", "anchor_chunk_id": "guide:c1"}, "a")
READ_FAQ = call("read_doc_section", {"doc_id": "faq", "section_id": "f1"}, "b")


def _closed_for_the_answer(sent: list[ChatMessage]) -> None:
    assert sent[-1].content == FINAL_ANSWER_NOTE


async def test_a_spent_budget_after_a_read_withdraws_the_tools_for_the_answer():
    """The reviewer's case: one window read fills context_token_budget, the model asks for a
    second; it was a 400 and the first read was thrown away."""
    rt = ScriptedRuntime([asks(READ_C1), asks(READ_FAQ), says("from the window")])
    tools = FakeTools(default=LONG)
    events = Events()
    out = await loop(rt, tools, max_tool_steps=3).run(req(policy=TIGHT), events)
    assert out.answer == "from the window" and len(tools.calls) == 1
    assert len(out.tools_called) == 1
    last = rt.calls[2]
    assert last["params"].tool_choice == "none" and last["tools"] == rt.calls[0]["tools"]
    _closed_for_the_answer(last["messages"])
    # The call no room was left for is reported as a call past the step limit is.
    refused = events.tools[-1]
    assert refused.name == "read_doc_section"
    assert refused.result_summary.startswith(f"tool_error {TOOL_LIMIT_REACHED}: ")
    assert "token budget" in refused.result_summary
    # Each call kept within the budget: the conversation with the answer's share.
    assert last["params"].max_tokens >= 128


async def test_a_spent_budget_mid_turn_refuses_the_rest_and_asks_for_the_answer():
    both = asks(READ_C1, READ_FAQ)
    rt = ScriptedRuntime([both, says("from the window")])
    tools = FakeTools(default=LONG)
    events = Events()
    out = await loop(rt, tools, max_tool_steps=3).run(req(policy=TIGHT), events)
    assert out.answer == "from the window" and len(tools.calls) == 1
    last = rt.calls[1]
    assert last["params"].tool_choice == "none"
    _closed_for_the_answer(last["messages"])
    fed = tool_messages(last["messages"])
    assert [f["status"] for f in fed] == ["ok", "error"]
    assert fed[1]["tool_error"]["code"] == TOOL_LIMIT_REACHED
    assert [r.name for r in events.tools] == ["read_chunk_window", "read_doc_section"]


async def test_with_nothing_read_a_budget_with_no_room_for_a_result_is_still_a_400():
    # The only result so far was a tool error: nothing was read to answer from.
    failed = FakeTools([ToolResult("error", error_code="NOT_FOUND", error_message="gone")])
    chatty = asks(call("read_doc_section", {"doc_id": "faq", "section_id": "f1"}, "b"))
    chatty = replace(chatty, content="thinking " * 1500)
    rt = ScriptedRuntime([asks(READ_C1), chatty, says("never")])
    with pytest.raises(errors.LimitExceededError) as info:
        await loop(rt, failed, max_tool_steps=3).run(req(policy=TIGHT))
    assert info.value.reason == "LLM_LIMIT_EXCEEDED"
    assert info.value.metadata["limit_name"] == "context_token_budget"
    assert len(failed.calls) == 1


async def test_a_spent_budget_is_one_info_line_as_a_refused_call_is(caplog):
    caplog.set_level("INFO", logger="visior.llm.loop")
    rt = ScriptedRuntime([asks(READ_C1), asks(READ_FAQ), says("from the window")])
    await loop(rt, FakeTools(default=LONG), max_tool_steps=3).run(req(policy=TIGHT))
    refused = [r for r in caplog.records if r.getMessage() == "tool call refused"]
    assert [(r.tool, r.code) for r in refused] == [("read_doc_section", TOOL_LIMIT_REACHED)]
    summary = [r for r in caplog.records if r.getMessage() == "generate"]
    assert summary[0].outcome == "ok" and summary[0].tool_steps == 1


async def test_a_model_insisting_after_the_budget_closed_the_tools_is_told_which_limit():
    again = call("read_doc_section", {"doc_id": "guide", "section_id": "s2"}, "c")
    rt = ScriptedRuntime([asks(READ_C1), asks(READ_FAQ), asks(again)])
    with pytest.raises(errors.LimitExceededError) as info:
        await loop(rt, FakeTools(default=LONG), max_tool_steps=3).run(req(policy=TIGHT))
    assert info.value.reason == "LLM_LIMIT_EXCEEDED"
    assert "Tool-call limit reached" in info.value.message
    assert info.value.metadata["limit_name"] == "context_token_budget"
