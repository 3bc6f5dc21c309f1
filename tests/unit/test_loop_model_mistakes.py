"""The model's mistakes in the tool loop (services/llm/loop.py) are the model's failure, never
the caller's 400 nor the tools' UPSTREAM_UNAVAILABLE (docs/architecture.md, the LLM service's
errors): calls it got wrong two in a row, tools asked for where none are offered, a call it
keeps repeating. And the usage the loop reports keeps the runtime's own counts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from services.common import errors
from services.llm.budget import message_tokens, prompt_tokens
from services.llm.extractive import ExtractiveRuntime
from services.llm.loop import LoopSettings, ToolLoop
from services.llm.model import GenerateInput, ToolPolicy, ToolResult
from services.llm.prompt import FINAL_ANSWER_NOTE
from services.llm.toolcalls import READ_TOOL_SPECS, REPEATED_CALL, UNKNOWN_TOOL
from services.model_runtime.chat import ChatMessage, Completion, ToolSpec
from tests.fakes.clock import ManualClock
from tests.unit.test_loop import (
    NOT_FOUND,
    TOK,
    Events,
    FakeTools,
    ScriptedRuntime,
    asks,
    call,
    loop,
    req,
    says,
    window,
)

METADATA_SPEC = ToolSpec(
    "read_doc_metadata",
    "The metadata of one document.",
    {
        "type": "object",
        "properties": {"doc_id": {"type": "string", "minLength": 1}},
        "required": ["doc_id"],
        "additionalProperties": False,
    },
)
METADATA_ONLY = ToolPolicy(allowed_tools=("read_doc_metadata",))
NO_TOOLS = ToolPolicy()


def meta_loop(runtime: Any, tools: FakeTools, **settings: Any) -> ToolLoop:
    return ToolLoop(
        runtime, tools, (*READ_TOOL_SPECS, METADATA_SPEC), LoopSettings(**settings),
        clock=ManualClock(), tokenizer=TOK,
    )  # fmt: skip


def made_up(doc_id: str, id: str) -> Any:
    return call("read_doc_metadata", {"doc_id": doc_id}, id)


def failed(code: str) -> ToolResult:
    return ToolResult("error", error_code=code, error_message="no")


# --- defect A: two tool errors in a row -----------------------------------------------------


@pytest.mark.parametrize("code", ["NOT_FOUND", "INVALID_ARGUMENT"])
async def test_two_calls_the_model_got_wrong_abort_as_the_models_failure(code):
    """The model names documents that do not exist: ToolsProxy rightly says NOT_FOUND; that is
    the model failing at its task, not ToolsProxy failing (no `downstream`)."""
    rt = ScriptedRuntime([asks(made_up("no-such-doc", "c1")), asks(made_up("no-such-2", "c2"))])
    tools = FakeTools([failed(code), failed(code)])
    with pytest.raises(errors.UnavailableError) as info:
        await meta_loop(rt, tools).run(req(policy=METADATA_ONLY))
    assert info.value.reason == "LLM_RUNTIME_ERROR"
    assert info.value.metadata["tool_error"] == code
    assert info.value.metadata["tool"] == "read_doc_metadata"
    assert info.value.metadata["limit_name"] == "max_consecutive_tool_errors"
    assert info.value.metadata["limit"] == "2"
    assert "downstream" not in info.value.metadata
    assert len(tools.calls) == 2


@pytest.mark.parametrize(
    ("code", "exception"),
    [
        ("UPSTREAM_UNAVAILABLE", None),
        ("INTERNAL", None),
        ("ACCESS_DENIED", None),
        ("DEADLINE_EXCEEDED", errors.ServiceError("slow", reason="DEADLINE_EXCEEDED")),
    ],
)
async def test_tools_that_failed_stay_upstream_unavailable_naming_toolsproxy(code, exception):
    rt = ScriptedRuntime([asks(made_up("d1", "c1")), asks(made_up("d2", "c2"))])
    last: ToolResult | Exception = exception if exception is not None else failed(code)
    tools = FakeTools([NOT_FOUND, last])
    with pytest.raises(errors.UnavailableError) as info:
        await meta_loop(rt, tools).run(req(policy=METADATA_ONLY))
    assert info.value.reason == "UPSTREAM_UNAVAILABLE"
    assert info.value.metadata["downstream"] == "toolsproxy"
    assert info.value.metadata["tool_error"] == code
    assert info.value.metadata["limit_name"] == "max_consecutive_tool_errors"


async def test_a_section_the_policy_chose_gone_is_the_tools_failure():
    """A read the policy rewrote to the caller's anchor: NOT_FOUND is the store changed since
    the search, not the model's mistake."""
    first = call("read_doc_section", {"doc_id": "faq", "section_id": "f1"}, "c1")
    second = call("read_doc_section", {"doc_id": "guide", "section_id": "s2"}, "c2")
    rt = ScriptedRuntime([asks(first), asks(second)])
    with pytest.raises(errors.UnavailableError) as info:
        await loop(rt, FakeTools([NOT_FOUND, NOT_FOUND])).run(req())
    assert info.value.reason == "UPSTREAM_UNAVAILABLE"
    assert info.value.metadata["downstream"] == "toolsproxy"


async def test_a_read_without_anchors_names_what_the_model_chose():
    """Without the caller's anchors the model chose the document: its NOT_FOUND is its own."""
    no_anchors = ToolPolicy(allowed_tools=("read_doc_section",))
    first = call("read_doc_section", {"doc_id": "x", "section_id": "s1"}, "c1")
    second = call("read_doc_section", {"doc_id": "y", "section_id": "s1"}, "c2")
    rt = ScriptedRuntime([asks(first), asks(second)])
    with pytest.raises(errors.UnavailableError) as info:
        await loop(rt, FakeTools([NOT_FOUND, NOT_FOUND])).run(req(policy=no_anchors))
    assert info.value.reason == "LLM_RUNTIME_ERROR"
    assert "downstream" not in info.value.metadata


async def test_the_last_error_decides_a_mixed_pair():
    """A model's mistake after a tool that failed, and the other way round."""
    rt = ScriptedRuntime([asks(made_up("d1", "c1")), asks(made_up("d2", "c2"))])
    tools = FakeTools([failed("UPSTREAM_UNAVAILABLE"), NOT_FOUND])
    with pytest.raises(errors.UnavailableError) as info:
        await meta_loop(rt, tools).run(req(policy=METADATA_ONLY))
    assert info.value.reason == "LLM_RUNTIME_ERROR"
    rt = ScriptedRuntime([asks(made_up("d1", "c1")), asks(made_up("d2", "c2"))])
    tools = FakeTools([NOT_FOUND, failed("UPSTREAM_UNAVAILABLE")])
    with pytest.raises(errors.UnavailableError) as info:
        await meta_loop(rt, tools).run(req(policy=METADATA_ONLY))
    assert info.value.reason == "UPSTREAM_UNAVAILABLE"


async def test_one_wrong_call_then_an_answer_is_an_answer():
    rt = ScriptedRuntime([asks(made_up("no-such-doc", "c1")), says("There is no such document.")])
    out = await meta_loop(rt, FakeTools([NOT_FOUND])).run(req(policy=METADATA_ONLY))
    assert out.answer == "There is no such document."


# --- defect B: tools asked for where none are offered, a repeated call ----------------------


async def test_a_tool_call_without_tools_gets_one_request_for_the_answer():
    rt = ScriptedRuntime([asks(made_up("orion-x-admin-guide", "c1")), says("Answer")])
    tools = FakeTools()
    events = Events()
    out = await meta_loop(rt, tools).run(req(policy=NO_TOOLS), events)
    assert out.answer == "Answer" and tools.calls == [] and out.tools_called == ()
    assert len(rt.calls) == 2
    second = rt.calls[1]
    assert second["tools"] == [] and second["params"].tool_choice == "none"
    assert any(m.content == FINAL_ANSWER_NOTE for m in second["messages"])
    # The model's call is neither run nor kept in the conversation; the stream hears of it
    # refused (its event ends the step), and the answer is the text after it.
    assert not any(m.tool_calls or m.role == "tool" for m in second["messages"])
    assert [(r.name, r.result_summary.split(":")[0]) for r in events.tools] == [
        ("read_doc_metadata", f"tool_error {UNKNOWN_TOOL}")
    ]
    assert events.answer() == "Answer"


async def test_a_model_insisting_on_tools_that_were_never_offered_is_its_failure():
    again = asks(made_up("orion-x-admin-guide", "c1"))
    rt = ScriptedRuntime([again, again])
    with pytest.raises(errors.UnavailableError) as info:
        await meta_loop(rt, FakeTools()).run(req(policy=NO_TOOLS))
    assert not isinstance(info.value, errors.LimitExceededError)
    assert (info.value.code, info.value.reason) == (errors.UNAVAILABLE, "LLM_RUNTIME_ERROR")
    assert info.value.metadata["limit_name"] == "tools_offered"
    assert info.value.metadata["limit"] == "0"
    assert info.value.metadata["tool"] == "read_doc_metadata"
    assert "Tool-call limit" not in info.value.message
    assert "no tools are offered" in info.value.message
    assert len(rt.calls) == 2


async def test_tools_the_step_limit_of_zero_withholds_are_not_offered_either():
    rt = ScriptedRuntime([asks(made_up("d", "c1")), asks(made_up("d", "c1"))])
    policy = replace(METADATA_ONLY, max_tool_steps=0)
    with pytest.raises(errors.UnavailableError) as info:
        await meta_loop(rt, FakeTools()).run(req(policy=policy))
    assert info.value.reason == "LLM_RUNTIME_ERROR"
    assert info.value.metadata["limit_name"] == "tools_offered"


async def test_a_model_repeating_one_call_is_named_by_the_repeated_call_guard():
    same = call("read_doc_section", {"doc_id": "faq", "section_id": "f1"})
    rt = ScriptedRuntime([asks(same), asks(same), asks(same)])
    tools = FakeTools(default=window("faq"))
    with pytest.raises(errors.UnavailableError) as info:
        await loop(rt, tools).run(req())
    assert not isinstance(info.value, errors.LimitExceededError)
    assert info.value.reason == "LLM_RUNTIME_ERROR"
    assert info.value.metadata["limit_name"] == "repeated_call"
    assert info.value.metadata["limit"] == "1"
    assert "repeated" in info.value.message and "1 tool call(s)" in info.value.message
    assert len(tools.calls) == 1 and len(rt.calls) == 3
    assert rt.calls[2]["params"].tool_choice == "none"
    assert REPEATED_CALL in rt.calls[2]["messages"][-2].content


async def test_the_step_limit_reached_stays_the_callers_limit():
    """The caller's max_tool_steps reached and the model still insisting after the request
    for its answer: 400 LLM_LIMIT_EXCEEDED (llm-service.md §9.3), as test_loop pins it."""

    def read(i: int) -> Completion:
        return asks(call("read_doc_section", {"doc_id": "guide", "section_id": "s2"}, f"c{i}"))

    reads = [read(1), asks(call("read_doc_section", {"doc_id": "faq", "section_id": "f1"}, "c2"))]
    rt = ScriptedRuntime([*reads, read(3)])
    with pytest.raises(errors.LimitExceededError) as info:
        await loop(rt, FakeTools(default=window()), max_tool_steps=2).run(req())
    assert info.value.reason == "LLM_LIMIT_EXCEEDED"
    assert info.value.metadata["limit_name"] == "max_tool_steps"
    assert info.value.metadata["limit"] == "2"


# --- defect C: usage --------------------------------------------------------------------------


def no_tools_req() -> GenerateInput:
    return req(policy=NO_TOOLS)


async def test_a_reported_completion_of_zero_stays_zero():
    rt = ScriptedRuntime([says("ok", prompt_tokens=150, completion_tokens=0)])
    out = await loop(rt, FakeTools()).run(no_tools_req())
    assert (out.prompt_tokens, out.completion_tokens) == (150, 0)
    assert out.final_prompt_tokens == 150


async def test_no_usage_is_estimated_and_the_final_prompt_is_that_estimate():
    rt = ScriptedRuntime([says("An answer without usage")])
    out = await loop(rt, FakeTools()).run(no_tools_req())
    assert out.prompt_tokens > 0 and out.completion_tokens > 0
    assert out.final_prompt_tokens == out.prompt_tokens
    estimate = message_tokens(TOK, ChatMessage("assistant", "An answer without usage"))
    assert out.completion_tokens == estimate


async def test_the_final_prompt_is_the_last_calls_estimate_over_several_calls():
    read = call("read_chunk_window", {"doc_id": "guide", "anchor_chunk_id": "guide:c1"})
    rt = ScriptedRuntime([asks(read), says("done")])
    out = await loop(rt, FakeTools(default=window())).run(req())
    sent = rt.calls[1]
    assert 0 < out.final_prompt_tokens < out.prompt_tokens
    # The estimate counts the conversation as sent, the loop's notes riding on it included.
    assert out.final_prompt_tokens == prompt_tokens(TOK, sent["messages"], sent["tools"])


async def test_cached_tokens_never_exceed_the_prompt():
    rt = ScriptedRuntime([says("ok", prompt_tokens=100, completion_tokens=1,
                                cached_prompt_tokens=150)])  # fmt: skip
    out = await loop(rt, FakeTools()).run(no_tools_req())
    assert (out.prompt_tokens, out.prompt_cached, out.final_prompt_tokens) == (100, 100, 100)


async def test_the_extractive_responder_reports_its_estimated_final_prompt():
    """The extractive responder reports no usage; it goes through the same step: its final
    prompt is the estimate its prompt is counted with."""
    policy = ToolPolicy()
    r = req(policy=policy)
    out = await ToolLoop(
        ExtractiveRuntime(), FakeTools(), READ_TOOL_SPECS, LoopSettings(),
        clock=ManualClock(), tokenizer=TOK,
    ).run(r)  # fmt: skip
    assert out.extractive and out.model_calls == 1
    assert out.final_prompt_tokens == out.prompt_tokens > 0


async def test_a_prompt_count_without_a_completion_count_has_the_completion_estimated():
    """A usage with the prompt's count but no `completion_tokens` key: the answer is
    estimated, not counted 0 (the runtime's missing count is not its count)."""
    rt = ScriptedRuntime([says("An answer with half a usage", prompt_tokens=150)])
    out = await loop(rt, FakeTools()).run(no_tools_req())
    estimate = message_tokens(TOK, ChatMessage("assistant", "An answer with half a usage"))
    assert (out.prompt_tokens, out.completion_tokens) == (150, estimate)


@pytest.mark.parametrize("blank", ["", " \n\t"])
async def test_an_answer_with_no_text_is_the_models_failure(blank):
    # No answer is no answer: a 502 the caller can retry, never a 200 with an empty answer
    # beside the sources it was to come from.
    rt = ScriptedRuntime([says(blank)])
    with pytest.raises(errors.UnavailableError) as info:
        await loop(rt, FakeTools(default=window())).run(req())
    assert info.value.reason == "LLM_RUNTIME_ERROR"
    assert info.value.message == "the model answered with no text (finish_reason stop)"


@pytest.mark.parametrize("ended", ["length", "content_filter"])
async def test_an_empty_answer_max_tokens_or_the_filter_ended_is_reported_not_failed(ended):
    """Cut at max_tokens before its first word, or withheld by the runtime's filter: the
    runtime did its work, and finish_reason says what happened."""
    rt = ScriptedRuntime([says("", finish_reason=ended)])
    out = await loop(rt, FakeTools()).run(no_tools_req())
    assert (out.answer, out.finish_reason) == ("", ended)


async def test_an_answer_a_callers_stop_sequence_ended_before_it_began_is_the_callers():
    rt = ScriptedRuntime([says("")])
    ask = no_tools_req()
    ask = replace(ask, params=replace(ask.params, stop=("Answer:",)))
    out = await loop(rt, FakeTools()).run(ask)
    assert out.answer == ""
