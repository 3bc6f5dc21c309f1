"""The extractive responder as a ChatRuntime, driven by the real tool loop (DESIGN §2.9)."""

from __future__ import annotations

from typing import Any

import pytest

from services.common import errors
from services.common.tokenizer import default_tokenizer
from services.llm.chat import ChatMessage
from services.llm.extractive import NOT_FOUND, ExtractiveRuntime, best_sentences
from services.llm.loop import LoopSettings, ToolLoop
from services.llm.model import (
    Anchor,
    ContextChunk,
    GenerateInput,
    Message,
    ToolPolicy,
    ToolResult,
    User,
)
from services.llm.toolcalls import READ_TOOL_SPECS, render_result
from tests.unit.test_loop import NOT_FOUND as TOOL_NOT_FOUND
from tests.unit.test_loop import Events, FakeClock, FakeTools, window

TEXT = "Intro. To set up LDAP open Settings and choose Directory. Bye."
ANCHORS = (Anchor("guide", "s1", "guide:c1"), Anchor("guide", "s2", ""))
BOTH = ("read_chunk_window", "read_doc_section")


def req(**kw: Any) -> GenerateInput:
    base: dict[str, Any] = {
        "messages": (Message("user", "How do I set up LDAP?"),),
        "user": User("t1", "u1"),
        "policy": ToolPolicy(allowed_tools=BOTH, anchors=ANCHORS, radius_schedule=(2, 3)),
        "trace_id": "tr",
    }
    return GenerateInput(**{**base, **kw})


def run(tools, r: GenerateInput, sink=None, **settings):
    loop = ToolLoop(
        ExtractiveRuntime(), tools, READ_TOOL_SPECS, LoopSettings(**settings),
        clock=FakeClock(), tokenizer=default_tokenizer(),
    )  # fmt: skip
    return loop.run(r, sink)


async def test_reads_the_window_around_the_best_anchor_then_quotes_it():
    tools = FakeTools([window(text=TEXT)])
    out = await run(tools, req())
    name, args, user, trace = tools.calls[0]
    assert (name, args) == (
        "read_chunk_window", {"doc_id": "guide", "anchor_chunk_id": "guide:c1", "radius": 2}
    )  # fmt: skip
    assert user.tenant_id == "t1" and trace == "tr"
    assert "> To set up LDAP open Settings and choose Directory." in out.answer
    assert "«Guide» (стр. 2–3)" in out.answer and "**Источник:** guide, стр. 2–3." in out.answer
    assert "(extractive)" in out.answer and "<<<" not in out.answer
    assert out.extractive and out.model_name == "extractive"
    assert [t.name for t in out.tools_called] == ["read_chunk_window"]
    assert out.prompt_tokens > 0 and out.completion_tokens > 0


async def test_after_a_tool_error_it_reads_the_next_section():
    tools = FakeTools([TOOL_NOT_FOUND, window(text=TEXT)])
    out = await run(tools, req())
    assert [(c[0], c[1]) for c in tools.calls] == [
        ("read_chunk_window", {"doc_id": "guide", "anchor_chunk_id": "guide:c1", "radius": 2}),
        ("read_doc_section", {"doc_id": "guide", "section_id": "s2"}),
    ]
    assert out.tools_called[0].result_summary.startswith("tool_error NOT_FOUND")
    assert "open Settings" in out.answer


async def test_two_failed_sections_abort_as_the_spec_says():
    with pytest.raises(errors.LimitExceededError) as info:
        await run(FakeTools([TOOL_NOT_FOUND, TOOL_NOT_FOUND]), req())
    assert info.value.reason == "LLM_LIMIT_EXCEEDED"


async def test_one_failed_section_and_nothing_else_answers_not_found():
    policy = ToolPolicy(allowed_tools=BOTH, anchors=ANCHORS[:1])
    out = await run(FakeTools([TOOL_NOT_FOUND]), req(policy=policy))
    assert out.answer == NOT_FOUND and len(out.tools_called) == 1


async def test_only_read_doc_section_allowed_reads_the_section():
    tools = FakeTools([window(text=TEXT)])
    policy = ToolPolicy(allowed_tools=("read_doc_section",), anchors=ANCHORS)
    await run(tools, req(policy=policy))
    assert tools.calls[0][:2] == ("read_doc_section", {"doc_id": "guide", "section_id": "s1"})


async def test_without_tools_it_quotes_the_context_and_else_says_not_found():
    chunk = ContextChunk("guide", "s", "LDAP is set up in Settings. Other things.", 4, 4)
    tools = FakeTools()
    out = await run(tools, req(policy=ToolPolicy(), context_chunks=(chunk,)))
    assert tools.calls == [] and "> LDAP is set up in Settings." in out.answer
    assert "стр. 4)" in out.answer
    out = await run(tools, req(policy=ToolPolicy()))
    assert out.answer == NOT_FOUND


async def test_context_chunk_ids_serve_as_anchors_when_the_policy_names_none():
    chunk = ContextChunk("guide", "s", "summary", 1, 1, chunk_id="guide:c7", score=0.5)
    tools = FakeTools([window(text=TEXT)])
    policy = ToolPolicy(allowed_tools=BOTH)
    out = await run(tools, req(policy=policy, context_chunks=(chunk,)))
    assert tools.calls[0][1] == {"doc_id": "guide", "anchor_chunk_id": "guide:c7", "radius": 1}
    assert "open Settings" in out.answer


async def test_step_limit_then_the_answer_from_what_it_has():
    chunk = ContextChunk("guide", "s", "Context says LDAP lives in Settings.", 1, 1)
    tools = FakeTools([TOOL_NOT_FOUND])
    out = await run(tools, req(context_chunks=(chunk,)), max_tool_steps=1)
    assert len(tools.calls) == 1
    assert "> Context says LDAP lives in Settings." in out.answer


async def test_streams_the_answer_and_the_tool_event():
    events = Events()
    out = await run(FakeTools([window(text=TEXT)]), req(), events)
    assert "".join(events.deltas) == out.answer
    assert [r.name for r in events.tools] == ["read_chunk_window"]


def test_quotes_page_texts_of_other_read_tools():
    pages = ToolResult(
        "ok",
        {"doc_id": "guide", "title": "Guide", "page_start": 5, "page_end": 5,
         "pages": [{"page": 5, "text": "LDAP settings are on page five."}]},
    )  # fmt: skip
    content = render_result("read_doc_pages", pages.result or {}, default_tokenizer(), 500).content
    messages = [
        ChatMessage("system", "s"),
        ChatMessage("user", "Where are the LDAP settings?"),
        ChatMessage("tool", content, tool_call_id="x", name="read_doc_pages"),
    ]
    answer = ExtractiveRuntime().respond(messages, ()).content
    assert "> LDAP settings are on page five." in answer and "(стр. 5)" in answer


def test_best_sentences_prefers_overlap_and_keeps_order():
    text = "Alpha beta. LDAP settings live here. Gamma. Configure LDAP groups too."
    assert best_sentences(text, "LDAP settings", 2) == [
        "LDAP settings live here.",
        "Configure LDAP groups too.",
    ]
    assert best_sentences("Nothing matches. At all.", "LDAP") == ["Nothing matches."]
