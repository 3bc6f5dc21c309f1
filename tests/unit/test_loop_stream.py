"""GenerateStream's events (services/llm/loop.py): a tool_call event ends every step whose
text was streamed before tool calls, executed or refused, so the answer is the deltas after
the last tool_call event (GenerateStreamResponse.delta)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from services.common import errors
from services.common.tool_contract import INVALID_ARGUMENT
from services.llm.loop import LoopSettings, ToolLoop
from services.llm.model import Anchor, ToolCallRecord, ToolPolicy
from services.llm.toolcalls import (
    INVALID_JSON,
    READ_TOOL_SPECS,
    REPEATED_CALL,
    SECTION_NOT_ALLOWED,
    TOOL_LIMIT_REACHED,
    TOOL_NOT_ALLOWED,
    UNKNOWN_TOOL,
)
from services.model_runtime.chat import LLM_RUNTIME_ERROR, Completion, ToolCall
from services.model_runtime.client import OpenAiChatRuntime, RuntimeSettings
from tests.fakes.clock import ManualClock
from tests.fakes.openai_chat import FakeChatServer, Reply, ScriptedCall, text
from tests.unit.test_loop import (
    POLICY,
    TOK,
    Events,
    FakeTools,
    ScriptedRuntime,
    call,
    loop,
    req,
    says,
    window,
)

PROSE = "Let me look in the guide. "
ANSWER = "LDAP is set up in Settings."
READ_C1 = call("read_chunk_window", {"doc_id": "guide", "anchor_chunk_id": "guide:c1"})


def prose_and(*calls: ToolCall) -> Completion:
    """A step that writes text, then calls tools."""
    return Completion(PROSE, calls, finish_reason="tool_calls", model="m1")


def texts_between_tool_calls(events: Events) -> list[str]:
    """The text of each step, split where a tool_call event ends one."""
    steps = [""]
    for event in events.order:
        if isinstance(event, str):
            steps[-1] += event
        else:
            steps.append("")
    return steps


async def _openai_run(stream: bool) -> tuple[Any, Events | None, FakeChatServer]:
    fake = FakeChatServer()
    fake.script(
        Reply(
            content=PROSE.strip(),
            tool_calls=(
                ScriptedCall(
                    "read_chunk_window", {"doc_id": "guide", "anchor_chunk_id": "guide:c1"}
                ),
            ),
        ),
        text(ANSWER),
    )
    async with httpx.AsyncClient(transport=fake.transport()) as http:
        runtime = OpenAiChatRuntime(RuntimeSettings(url="http://fake", default_model="m"), http)
        lp = ToolLoop(runtime, FakeTools(default=window()), READ_TOOL_SPECS, LoopSettings(),
                      clock=ManualClock(), tokenizer=TOK)  # fmt: skip
        events = Events() if stream else None
        out = await lp.run(req(), events)
    return out, events, fake


async def test_a_native_tool_call_after_prose_ends_the_step_of_that_prose():
    """The OpenAI-compatible runtime streams the words a model writes beside its tool call:
    they come before the call's tool_call event, and the answer is the text after it."""
    generated, _, _ = await _openai_run(stream=False)
    streamed, events, fake = await _openai_run(stream=True)
    assert events is not None
    assert fake.chat_requests[-1].stream  # the stream run really streamed
    assert generated.answer == streamed.answer == ANSWER
    assert events.answer() == streamed.answer
    assert texts_between_tool_calls(events) == [PROSE.strip(), ANSWER]
    assert [r.name for r in events.tools] == ["read_chunk_window"]
    assert "".join(events.deltas) != streamed.answer  # the prose was streamed, not dropped


def _refused(code: str, message_part: str = "") -> Any:
    def check(record: ToolCallRecord) -> None:
        assert record.result_summary.startswith(f"tool_error {code}: "), record
        assert message_part in record.result_summary

    return check


@pytest.mark.parametrize(
    ("bad", "policy", "code", "name", "arguments"),
    [
        (call("nope", {"x": 1}), POLICY, UNKNOWN_TOOL, "nope", {"x": 1}),
        (call("read_chunk_window", "{oops"), POLICY, INVALID_JSON, "read_chunk_window", {}),
        (call("read_chunk_window", {"doc_id": 1, "anchor_chunk_id": "c"}), POLICY,
         INVALID_ARGUMENT, "read_chunk_window", {"doc_id": 1, "anchor_chunk_id": "c"}),
        (call("read_chunk_window", {"doc_id": "secret", "anchor_chunk_id": "c"}), POLICY,
         SECTION_NOT_ALLOWED, "read_chunk_window", {"doc_id": "secret", "anchor_chunk_id": "c"}),
        # Only the window tool is allowed, and the anchor of "faq" has no chunk id.
        (call("read_chunk_window", {"doc_id": "faq", "anchor_chunk_id": "faq:c9"}),
         ToolPolicy(allowed_tools=("read_chunk_window",), anchors=(Anchor("faq", "f1", ""),)),
         TOOL_NOT_ALLOWED, "read_chunk_window", {"doc_id": "faq", "anchor_chunk_id": "faq:c9"}),
    ],
)  # fmt: skip
async def test_a_refused_call_after_prose_is_a_tool_call_event(bad, policy, code, name, arguments):
    rt = ScriptedRuntime([prose_and(bad), says(ANSWER)])
    events = Events()
    out = await loop(rt, FakeTools(default=window())).run(req(policy=policy), events)
    assert out.answer == ANSWER == events.answer()
    assert texts_between_tool_calls(events) == [PROSE, ANSWER]
    (record,) = events.tools
    assert (record.name, record.arguments) == (name, arguments)
    _refused(code)(record)
    assert out.tools_called == ()  # tools_called lists the tools executed


async def test_a_repeated_call_after_prose_is_a_tool_call_event():
    # (A window read again widens: a section read again is the repeat.)
    read = call("read_doc_section", {"doc_id": "faq", "section_id": "f1"})
    rt = ScriptedRuntime([prose_and(read), prose_and(read), says(ANSWER)])
    events = Events()
    out = await loop(rt, FakeTools(default=window())).run(req(), events)
    assert events.answer() == out.answer == ANSWER
    assert texts_between_tool_calls(events) == [PROSE, PROSE, ANSWER]
    executed, repeated = events.tools
    assert executed == out.tools_called[0] and len(out.tools_called) == 1
    _refused(REPEATED_CALL, "already called")(repeated)


async def test_a_call_past_the_step_limit_after_prose_is_a_tool_call_event():
    both = prose_and(READ_C1, call("read_doc_section", {"doc_id": "faq", "section_id": "f1"}, "c2"))
    rt = ScriptedRuntime([both, says(ANSWER)])
    events = Events()
    out = await loop(rt, FakeTools(default=window()), max_tool_steps=1).run(req(), events)
    assert events.answer() == out.answer == ANSWER
    assert texts_between_tool_calls(events) == [PROSE, "", ANSWER]
    executed, refused = events.tools
    assert [executed] == list(out.tools_called)
    _refused(TOOL_LIMIT_REACHED, "at most 1")(refused)
    assert refused.name == "read_doc_section"


async def test_a_refused_call_is_reported_before_the_abort_it_causes():
    rt = ScriptedRuntime([prose_and(call("nope", {})), prose_and(call("nope", {}, "c2"))])
    events = Events()
    with pytest.raises(errors.UnavailableError) as info:  # two refusals in a row
        await loop(rt, FakeTools()).run(req(), events)
    assert info.value.reason == LLM_RUNTIME_ERROR
    assert (info.value.metadata["tool"], info.value.metadata["tool_error"]) == (
        "nope",
        UNKNOWN_TOOL,
    )
    assert texts_between_tool_calls(events) == [PROSE, PROSE, ""]
    assert [r.name for r in events.tools] == ["nope", "nope"]


async def test_without_a_stream_nothing_changes_for_refused_calls():
    rt = ScriptedRuntime([prose_and(call("nope", {})), says(ANSWER)])
    out = await loop(rt, FakeTools()).run(req())
    assert out.answer == ANSWER and out.tools_called == ()


def test_a_refused_calls_name_is_reported_as_valid_text_and_cut():
    from services.llm.toolcalls import MAX_REFUSED_NAME_CHARS, refused_record

    record = refused_record(ToolCall("c1", "x\ud800" * 100, "[1]"), UNKNOWN_TOOL, "no \udc00")
    assert len(record.name) == MAX_REFUSED_NAME_CHARS and record.name.endswith("…")
    record.name.encode()  # valid UTF-8: a proto string takes it
    record.result_summary.encode()
    assert record.arguments == {}  # not a JSON object
    at_limit = "n" * MAX_REFUSED_NAME_CHARS
    assert refused_record(ToolCall("c1", at_limit, ""), UNKNOWN_TOOL, "").name == at_limit
    past = refused_record(ToolCall("c1", at_limit + "n", ""), UNKNOWN_TOOL, "").name
    assert len(past) == MAX_REFUSED_NAME_CHARS and past.endswith("…")
