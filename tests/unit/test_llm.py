from dataclasses import replace
from typing import Any

import pytest

from services.common import errors
from services.common.search_contract import KB_TENANT
from services.common.settings import Env
from services.llm.config import LlmSettings
from services.llm.engine import MAX_MESSAGES, LlmEngine
from services.llm.extractive import ExtractiveRuntime, best_sentences
from services.llm.loop import LoopSettings, ToolLoop
from services.llm.model import (
    Anchor,
    ContextChunk,
    GenerateInput,
    ToolPolicy,
    ToolResult,
    Turn,
    User,
)
from services.llm.prompt import ANSWER_FORMAT, build_prompt
from services.llm.toolcalls import READ_TOOL_SPECS
from services.model_runtime.chat import GenerationParams


class FakeTools:
    def __init__(self, results: list[ToolResult]) -> None:
        self.results = results
        self.calls: list[tuple[str, dict[str, Any], User]] = []

    async def execute(self, request, *, timeout_s=None):
        self.calls.append((request.name, request.arguments, request.user))
        return self.results.pop(0)


WINDOW = ToolResult(
    "ok",
    {"doc_id": "guide", "title": "Guide", "text": "Intro. To set up LDAP open Settings. Bye.",
     "page_start": 2, "page_end": 3},
)  # fmt: skip


def engine(tools, **limits):
    b = LoopSettings(**limits)
    settings = replace(
        b,
        max_total_tokens=b.max_prompt_tokens + b.max_completion_tokens + 2048,
        default_model="extractive",
    )
    return LlmEngine(ToolLoop(ExtractiveRuntime(), tools, READ_TOOL_SPECS, settings))


def req(**kw):
    base = {
        "messages": (Turn("user", "How do I set up LDAP?"),),
        "user": User("t1", "u1"),
        "policy": ToolPolicy(
            allowed_tools=("read_chunk_window", "read_doc_section"),
            anchors=(Anchor("guide", "sec", "guide:c1"),),
            radius_schedule=(2, 3),
        ),
        "trace_id": "tr",
    }
    return GenerateInput(**{**base, **kw})


async def test_extractive_reads_the_window_then_quotes_it():
    tools = FakeTools([WINDOW])
    out = await engine(tools).generate(req())
    name, args, user = tools.calls[0]
    assert name == "read_chunk_window"
    assert args == {"doc_id": "guide", "anchor_chunk_id": "guide:c1", "radius": 2}
    assert user.tenant_id == "t1"
    assert "To set up LDAP open Settings." in out.answer
    assert "pp. 2–3" in out.answer
    assert out.extractive and out.model_name == "extractive"
    assert [t.name for t in out.tools_called] == ["read_chunk_window"]


async def test_falls_back_to_the_section_without_an_anchor_and_after_a_tool_error():
    tools = FakeTools([ToolResult("error", error_code="NOT_FOUND", error_message="gone"), WINDOW])
    policy = ToolPolicy(
        allowed_tools=("read_chunk_window", "read_doc_section"),
        anchors=(Anchor("guide", "s1", "guide:c1"), Anchor("guide", "s2", "")),
    )
    out = await engine(tools).generate(req(policy=policy))
    assert [c[0] for c in tools.calls] == ["read_chunk_window", "read_doc_section"]
    assert out.tools_called[0].result_summary.startswith("tool_error NOT_FOUND")


async def test_no_tools_allowed_means_no_tool_calls():
    tools = FakeTools([])
    chunk = ContextChunk("guide", "s", "LDAP is set up in Settings.", 1, 1)
    out = await engine(tools).generate(req(policy=ToolPolicy(), context_chunks=(chunk,)))
    assert tools.calls == [] and "LDAP is set up in Settings." in out.answer


async def test_max_tool_steps_zero_and_the_service_cap():
    tools = FakeTools([WINDOW])
    anchors = (Anchor("g", "s1", "c1"), Anchor("g", "s2", "c2"))
    policy = ToolPolicy(allowed_tools=("read_chunk_window",), anchors=anchors, max_tool_steps=0)
    await engine(tools).generate(req(policy=policy))
    assert tools.calls == []
    # A policy asking for more than MAX_TOOL_STEPS gets the service's cap, not an error.
    failing = [ToolResult("error", error_code="NOT_FOUND", error_message="x")] * 2
    tools = FakeTools(list(failing))
    policy = ToolPolicy(allowed_tools=("read_chunk_window",), anchors=anchors, max_tool_steps=20)
    await engine(tools, max_tool_steps=1).generate(req(policy=policy))
    assert len(tools.calls) == 1
    with pytest.raises(errors.InvalidArgumentError):
        await engine(tools).generate(req(policy=ToolPolicy(max_tool_steps=-1)))


async def test_context_is_cut_to_the_prompt_budget_lowest_score_first():
    tools = FakeTools([])
    chunks = (
        ContextChunk("d", "low", "low " * 120, score=0.1),
        ContextChunk("d", "high", "high " * 120, score=0.9),
        ContextChunk("d", "mid", "mid " * 120, score=0.5),
    )
    e = engine(tools, max_prompt_tokens=450)
    out = await e.generate(req(policy=ToolPolicy(), context_chunks=chunks))
    # The instructions take about 210 tokens and each chunk about 140: only one of the three
    # fits in 450. The lowest score goes first, the best is quoted.
    assert "high" in out.answer and "mid" not in out.answer
    assert out.prompt_tokens <= 450


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"mode": "poem"}, "mode"),
        ({"messages": ()}, "messages"),
        ({"messages": (Turn("wizard", "hi"),)}, "messages[0].role"),
        ({"messages": (Turn("assistant", "hi"),)}, "messages"),
        ({"params": GenerationParams(temperature=2.5)}, "generation_params.temperature"),
        ({"params": GenerationParams(stop=("a",) * 5)}, "generation_params.stop"),
        ({"user": None}, "user.tenant_id"),
        ({"user": User("t1", "")}, "user.user_id"),
        ({"user": User("t1", " ")}, "user.user_id"),
    ],
)
async def test_bad_requests_name_the_field(kw, field):
    with pytest.raises(errors.InvalidArgumentError) as info:
        await engine(FakeTools([])).generate(req(**kw))
    assert info.value.metadata["field"] == field


@pytest.mark.parametrize(
    ("user", "field", "reason"),
    [
        (None, "user.tenant_id", "MISSING_USER_CONTEXT"),
        (User(" ", "u1"), "user.tenant_id", "MISSING_USER_CONTEXT"),
        (User("t1", " "), "user.user_id", "MISSING_USER_CONTEXT"),
        (User(KB_TENANT, "u1"), "user.tenant_id", "INVALID_ARGUMENT"),
    ],
)
async def test_tools_need_a_caller_toolsproxy_accepts_refused_as_it_refuses(user, field, reason):
    with pytest.raises(errors.InvalidArgumentError) as info:
        await engine(FakeTools([])).generate(req(user=user))
    assert (info.value.reason, info.value.metadata["field"]) == (reason, field)


async def test_limits_at_and_past():
    e = engine(FakeTools([WINDOW] * 2), max_completion_tokens=100, max_prompt_tokens=1000)
    await e.generate(req(params=GenerationParams(max_tokens=100)))
    with pytest.raises(errors.LimitExceededError):
        await e.generate(req(params=GenerationParams(max_tokens=101)))
    with pytest.raises(errors.LimitExceededError):
        await e.generate(req(messages=(Turn("user", "word " * 1200),)))
    many = tuple(Turn("user", "q") for _ in range(MAX_MESSAGES + 1))
    with pytest.raises(errors.LimitExceededError):
        await e.generate(req(messages=many))


def test_best_sentences_prefers_overlap_and_keeps_order():
    text = "Alpha beta. LDAP settings live here. Gamma. Configure LDAP groups too."
    assert best_sentences(text, "LDAP settings", 2) == [
        "LDAP settings live here.",
        "Configure LDAP groups too.",
    ]


def test_every_prompt_carries_the_answer_format():
    for mode in ("rag", "chat"):
        system = build_prompt(req(mode=mode))[0].content
        assert ANSWER_FORMAT in system
    assert "[Источник: cbr.ru]" in ANSWER_FORMAT
    assert "conclusion" in ANSWER_FORMAT and "list of sources" in ANSWER_FORMAT
    for section in ("General Facts", "User Documents", "Knowledge Base", "External Data"):
        assert section in ANSWER_FORMAT


def test_tool_results_come_out_in_one_key_order_whatever_the_struct_map_order() -> None:
    """A Struct's map iterates in an order that changes from process to process; a tool
    result is rendered into the model's prompt, so its keys come out sorted (at every depth),
    and the same result makes the same prompt in every run."""
    from visior.toolsproxy.v1 import toolsproxy_pb2

    from services.common.structs import struct_to_dict
    from services.llm.tools_client import result_to_dict

    keys = ["title", "doc_id", "text", "page_start", "page_end", "chunk_ids", "radius", "max"]
    response = toolsproxy_pb2.ExecuteResponse()
    response.result.struct_value.update({k: {k2: 1 for k2 in reversed(keys)} for k in keys})
    for converted in (result_to_dict(response.result), struct_to_dict(response.result)):
        assert list(converted) == sorted(keys)
        assert all(list(inner) == sorted(keys) for inner in converted.values())


def test_tool_results_convert_as_struct_to_dict_does() -> None:
    from visior.toolsproxy.v1 import toolsproxy_pb2

    from services.common.structs import struct_to_dict
    from services.llm.tools_client import result_to_dict

    response = toolsproxy_pb2.ExecuteResponse()
    assert result_to_dict(response.result) is None  # no kind set
    response.result.struct_value.update(
        {"doc_id": "d", "page_start": 2.0, "score": 0.5, "big": 2.0**60, "none": None,
         "ok": True, "chunks": [{"text": "<<<DOCUMENT>>>", "n": 3}, [], "x"], "meta": {}}
    )  # fmt: skip
    converted = result_to_dict(response.result)
    assert converted == struct_to_dict(response.result)
    assert type(converted["page_start"]) is int and type(converted["big"]) is float
    response.result.list_value.extend([1, "a"])
    assert result_to_dict(response.result) == struct_to_dict(response.result) == [1, "a"]
    response.result.number_value = float("nan")
    with pytest.raises(ValueError):
        result_to_dict(response.result)


def test_the_loop_takes_every_limit_from_the_environment() -> None:
    """Each of the loop's limits is read into the LoopSettings the loop runs with (one
    declaration, on LoopSettings' fields); the document tools' deadline is ToolsProxy's."""
    env = {
        "MAX_TOOL_STEPS": "7",
        "MAX_PROMPT_TOKENS": "3001",
        "MAX_COMPLETION_TOKENS": "301",
        "LLM_SERVICE_MAX_TOTAL_TOKENS": "9001",
        "LLM_SERVICE_WATCHDOG_SECONDS": "41",
        "LLM_SERVICE_EXTERNAL_TOOL_TIMEOUT_S": "8.5",
        "LLM_SERVICE_MCP_TIMEOUT_SECONDS": "3.5",
    }
    got = LlmSettings.from_env(Env(env)).loop
    assert (got.max_tool_steps, got.max_prompt_tokens, got.max_completion_tokens) == (7, 3001, 301)
    assert (got.max_total_tokens, got.watchdog_s, got.external_tool_timeout_s) == (9001, 41.0, 8.5)
    assert got.tool_timeout_s == 3.5
    assert got.max_tool_result_tokens == 9001 - 3001 - 301
    assert got.default_model == "extractive"
    defaults = LlmSettings.from_env(Env({})).loop
    assert (defaults.max_tool_steps, defaults.watchdog_s) == (LoopSettings.max_tool_steps, 60.0)
