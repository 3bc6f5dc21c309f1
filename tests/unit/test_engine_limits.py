"""Generate's request limits (services/llm/engine.py validate): the caller's context budget,
and the sizes of the system prompt and the context chunks' texts, refused before anything
is tokenised."""

from __future__ import annotations

from dataclasses import replace

import pytest

from services.common import errors
from services.common.tokenizer import default_tokenizer
from services.common.tool_contract import TOOL_NAMES
from services.llm.engine import (
    MAX_CONTEXT_CHUNK_CHARS,
    MAX_CONTEXT_CHUNKS,
    MAX_SYSTEM_PROMPT_CHARS,
    LlmEngine,
    validate,
)
from services.llm.loop import LoopSettings, ToolLoop
from services.llm.model import ContextChunk, ToolPolicy
from services.llm.toolcalls import READ_TOOL_SPECS
from tests.fakes.clock import ManualClock
from tests.unit.test_loop import POLICY, FakeTools, ScriptedRuntime, req, says

LIMITS = LoopSettings()


class CountingTokenizer:
    """The real tokenizer, counting the calls made to it."""

    def __init__(self) -> None:
        self._tok = default_tokenizer()
        self.name = "counting-" + self._tok.name  # its own cache entries
        self.calls = 0

    def count(self, text: str) -> int:
        self.calls += 1
        return self._tok.count(text)

    def encode(self, text: str) -> list[int]:
        self.calls += 1
        return self._tok.encode(text)

    def decode(self, tokens: list[int]) -> str:
        return self._tok.decode(tokens)

    def truncate(self, text: str, max_tokens: int) -> str:
        self.calls += 1
        return self._tok.truncate(text, max_tokens)


def engine(tokenizer=None) -> LlmEngine:
    rt = ScriptedRuntime([says("ok")])
    loop = ToolLoop(rt, FakeTools(), READ_TOOL_SPECS, LoopSettings(), clock=ManualClock(),
                    tokenizer=tokenizer or default_tokenizer())  # fmt: skip
    return LlmEngine(loop)


# --- tool_policy.context_token_budget ------------------------------------------------------


@pytest.mark.parametrize("budget", [0, -5, -(2**31)])
def test_a_context_budget_below_one_is_an_invalid_argument(budget):
    with pytest.raises(errors.InvalidArgumentError) as info:
        validate(req(policy=replace(POLICY, context_token_budget=budget)), LIMITS)
    assert not isinstance(info.value, errors.LimitExceededError)
    assert info.value.reason == "INVALID_ARGUMENT"
    assert info.value.metadata == {"field": "tool_policy.context_token_budget"}


@pytest.mark.parametrize("budget", [1, 100])
async def test_a_context_budget_too_small_for_the_prompt_is_named_as_the_limit(budget):
    validate(req(policy=replace(POLICY, context_token_budget=budget)), LIMITS)  # taken
    with pytest.raises(errors.LimitExceededError) as info:
        await engine().generate(req(policy=replace(POLICY, context_token_budget=budget)))
    assert info.value.reason == "LLM_LIMIT_EXCEEDED"
    assert info.value.metadata["limit_name"] == "context_token_budget"
    assert info.value.metadata["limit"] == str(budget)
    assert info.value.metadata["field"] == "messages"


async def test_a_context_budget_too_small_with_context_chunks_is_named_too():
    chunks = (ContextChunk("guide", "s1", "LDAP is set up in Settings.", score=0.9),)
    r = req(policy=replace(POLICY, context_token_budget=100), context_chunks=chunks)
    with pytest.raises(errors.LimitExceededError) as info:
        await engine().generate(r)
    assert info.value.metadata["limit_name"] == "context_token_budget"


async def test_without_a_context_budget_the_prompt_limit_is_named():
    r = req(system_prompt="word " * 5000, policy=ToolPolicy())
    with pytest.raises(errors.LimitExceededError) as info:
        await engine().generate(r)
    assert info.value.metadata["limit_name"] == "max_prompt_tokens"
    assert info.value.metadata["limit"] == str(LIMITS.max_prompt_tokens)


# --- system_prompt and context_chunks[].text -----------------------------------------------


@pytest.mark.parametrize("past", [0, 1])
def test_the_system_prompt_is_capped(past):
    r = req(system_prompt="ж" * (MAX_SYSTEM_PROMPT_CHARS + past))
    if not past:
        validate(r, LIMITS)
        return
    with pytest.raises(errors.LimitExceededError) as info:
        validate(r, LIMITS)
    assert info.value.reason == "LLM_LIMIT_EXCEEDED"
    assert info.value.metadata == {"field": "system_prompt", "limit": str(MAX_SYSTEM_PROMPT_CHARS)}


@pytest.mark.parametrize("past", [0, 1])
def test_a_context_chunks_text_is_capped(past):
    chunks = [ContextChunk(f"d{i}", "s", "ok") for i in range(MAX_CONTEXT_CHUNKS)]
    chunks[7] = ContextChunk("d7", "s", "ж" * (MAX_CONTEXT_CHUNK_CHARS + past))
    r = req(context_chunks=tuple(chunks))
    if not past:
        validate(r, LIMITS)
        return
    with pytest.raises(errors.LimitExceededError) as info:
        validate(r, LIMITS)
    assert info.value.reason == "LLM_LIMIT_EXCEEDED"
    assert info.value.metadata == {
        "field": "context_chunks[7].text",
        "limit": str(MAX_CONTEXT_CHUNK_CHARS),
    }


def test_the_caps_sit_well_above_what_the_orchestrator_sends():
    from services.common.search_contract import MAX_QUERY_CHARS
    from services.orchestrator.scenarios import decision_prompt

    longest = decision_prompt("я" * MAX_QUERY_CHARS)  # the routing prompt, the longest
    assert 4 * len(longest) < MAX_SYSTEM_PROMPT_CHARS


OVERSIZED_CHUNKS = tuple(
    ContextChunk(f"d{i}", "s", "ж" * (MAX_CONTEXT_CHUNK_CHARS * 8))
    for i in range(MAX_CONTEXT_CHUNKS)
)


@pytest.mark.parametrize(
    "kw",
    [
        {"system_prompt": "ж" * (MAX_SYSTEM_PROMPT_CHARS * 300)},
        {"context_chunks": OVERSIZED_CHUNKS},
    ],
)
async def test_an_oversized_text_is_refused_before_anything_is_tokenised(kw):
    tokenizer = CountingTokenizer()
    with pytest.raises(errors.LimitExceededError):
        await engine(tokenizer).generate(req(policy=ToolPolicy(), **kw))
    assert tokenizer.calls == 0


# --- the caller's model name and response schema ---------------------------------------------


def runtime_404(*_args):
    raise errors.UnavailableError(
        "LLM runtime rejected the request (HTTP 404)",
        reason="LLM_RUNTIME_ERROR",
        metadata={"kind": "rejected", "status": "404"},
    )


def engine_answering(step) -> LlmEngine:
    loop = ToolLoop(ScriptedRuntime([step]), FakeTools(), READ_TOOL_SPECS, LoopSettings(),
                    clock=ManualClock(), tokenizer=default_tokenizer())  # fmt: skip
    return LlmEngine(loop)


async def test_a_model_the_runtime_does_not_serve_is_the_callers_invalid_argument():
    """An OpenAI-compatible runtime answers 404 for a model it does not serve: with the
    caller's `model`, that is the caller's mistake (400 naming model), not our outage (502)."""
    with pytest.raises(errors.InvalidArgumentError) as info:
        await engine_answering(runtime_404).generate(req(model="qwen-typo"))
    assert info.value.metadata == {"field": "model"} and "'qwen-typo'" in info.value.message


async def test_a_404_for_the_services_own_model_stays_a_runtime_failure():
    with pytest.raises(errors.UnavailableError) as info:
        await engine_answering(runtime_404).generate(req())
    assert info.value.reason == "LLM_RUNTIME_ERROR"


@pytest.mark.parametrize(
    "schema",
    [{"type": "objekt"}, {"type": "object", "required": "answer"},
     {"properties": {"a": {"minLength": -1}}}],
)  # fmt: skip
def test_a_response_schema_that_is_no_json_schema_is_refused(schema):
    from services.llm.model import GenerationParams

    ok = req(params=GenerationParams(response_schema={"type": "object"}), policy=ToolPolicy())
    validate(ok, LIMITS)
    with pytest.raises(errors.InvalidArgumentError) as info:
        validate(replace(ok, params=GenerationParams(response_schema=schema)), LIMITS)
    assert info.value.metadata == {"field": "generation_params.response_schema"}
    assert "not a JSON schema" in info.value.message


def test_a_response_schema_pattern_in_another_regex_dialect_is_taken():
    """A pattern is the runtime's to read (named groups, Unicode classes): not refused by
    Python's regex syntax."""
    from services.llm.model import GenerationParams

    schema = {"type": "object", "properties": {"year": {"type": "string",
              "pattern": "(?<year>\\d{4})"}, "name": {"type": "string", "pattern": "\\p{L}+"}}}  # fmt: skip
    validate(req(params=GenerationParams(response_schema=schema), policy=ToolPolicy()), LIMITS)


# --- tool_policy.allowed_tools ---------------------------------------------------------------


@pytest.mark.parametrize(
    "names",
    [("read_chunk_windw",), ("read_chunk_window", "no_such_tool"), ("x" * 10_000,), ("",)],
)
def test_a_tool_name_no_tool_has_is_refused(names):
    # A typo would run the request without that tool and say nothing.
    with pytest.raises(errors.InvalidArgumentError) as info:
        validate(req(policy=replace(POLICY, allowed_tools=names)), LIMITS)
    assert info.value.metadata == {"field": "tool_policy.allowed_tools"}
    assert info.value.message.startswith("no such tool: ")
    assert "read_chunk_window, read_doc_section" in info.value.message  # what there is
    assert len(info.value.message) < 500  # a long name is cut in the message


def test_every_tool_of_the_contract_is_taken():
    validate(req(policy=replace(POLICY, allowed_tools=TOOL_NAMES)), LIMITS)
