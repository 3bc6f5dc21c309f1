"""The runtime client's constrained output and prompt-cache support, against the fake server.

JSON mode with ``json_schema`` steps, tool calls a model writes into its text, withdrawn tools
kept in the prompt (``tool_choice`` none), ``response_schema`` answers, cached prompt tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest

from services.common import errors
from services.llm.engine import MAX_RESPONSE_SCHEMA_BYTES, validate
from services.llm.loop import LoopSettings
from services.llm.model import GenerateInput, ToolPolicy, Turn, User
from services.model_runtime.chat import (
    ChatMessage,
    ChatRequest,
    Completion,
    GenerationParams,
    StreamDelta,
    ToolSpec,
)
from services.model_runtime.client import (
    OpenAiChatRuntime,
    RuntimeSettings,
    build_request,
    content_tool_calls,
    encode_request,
    step_schema,
    truncated_answer,
)
from tests.fakes.openai_chat import FakeChatServer, Reply, json_answer, json_tool_call, text

MODEL = "fake-qwen"
USER = [ChatMessage("system", "You are Visior."), ChatMessage("user", "Как настроить LDAP?")]
READ_SECTION = ToolSpec(
    "read_doc_section",
    "Read a section of a document.",
    {
        "type": "object",
        "properties": {
            "doc_id": {"type": "string", "maxLength": 128},
            "section_id": {"type": "string", "pattern": "^[a-z0-9:-]+$"},
        },
        "required": ["doc_id", "section_id"],
    },
)
READ_WINDOW = ToolSpec(
    "read_chunk_window",
    "Read the chunks around an anchor.",
    {
        "type": "object",
        "properties": {
            "doc_id": {"type": "string"},
            "anchor_chunk_id": {"type": "string"},
            "radius": {"type": "integer", "minimum": 0, "maximum": 3},
        },
        "required": ["doc_id", "anchor_chunk_id"],
    },
)
TOOLS = (READ_SECTION, READ_WINDOW)
OFFERED = frozenset(t.name for t in TOOLS)
ROUTE_SCHEMA = {
    "type": "object",
    "properties": {"intent": {"enum": ["documents", "knowledge_base"]}},
    "required": ["intent"],
}


@pytest.fixture
def fake() -> Iterator[FakeChatServer]:
    with FakeChatServer() as server:
        yield server


def runtime(fake: FakeChatServer, http: httpx.AsyncClient, **kw: Any) -> OpenAiChatRuntime:
    return OpenAiChatRuntime(RuntimeSettings(url=fake.url, default_model=MODEL, **kw), http)


async def complete(
    rt: OpenAiChatRuntime, tools: tuple[ToolSpec, ...] = TOOLS, **params: Any
) -> Completion:
    return await rt.complete(ChatRequest(USER, tools, GenerationParams(**params)), timeout_s=5.0)


async def stream(
    rt: OpenAiChatRuntime, tools: tuple[ToolSpec, ...] = TOOLS
) -> tuple[list[str], Completion]:
    events = [e async for e in rt.stream(ChatRequest(USER, tools), timeout_s=5.0)]
    assert isinstance(events[-1], Completion)
    deltas = [e.text for e in events[:-1] if isinstance(e, StreamDelta)]
    return deltas, events[-1]


# -- the step schema ---------------------------------------------------------------------


def test_step_schema_names_each_offered_tool_with_its_arguments_or_the_answer() -> None:
    schema = step_schema(TOOLS)
    calls, answer = schema["anyOf"][:-1], schema["anyOf"][-1]
    assert [c["properties"]["tool_name"] for c in calls] == [
        {"const": "read_doc_section"},
        {"const": "read_chunk_window"},
    ]
    assert answer["required"] == ["answer"] and answer["additionalProperties"] is False
    args = calls[0]["properties"]["arguments"]
    # Shape kept (types, required), limits left to the loop's check, no invented arguments.
    assert args["required"] == ["doc_id", "section_id"]
    assert args["properties"]["doc_id"] == {"type": "string"}
    assert args["properties"]["section_id"] == {"type": "string"}
    assert args["additionalProperties"] is False
    assert calls[1]["properties"]["arguments"]["properties"]["radius"] == {"type": "integer"}
    # The tool's own schema is left as it was.
    assert READ_SECTION.parameters["properties"]["doc_id"]["maxLength"] == 128


def test_without_tools_or_with_tools_withdrawn_the_step_schema_is_the_answer_alone() -> None:
    assert step_schema(()) == step_schema(TOOLS, allow_tools=False)
    assert step_schema(())["required"] == ["answer"]


async def test_json_mode_sends_the_step_schema_and_reads_the_call(fake, http) -> None:
    fake.script(json_tool_call("read_chunk_window", {"doc_id": "g", "anchor_chunk_id": "g:c1"}))
    out = await complete(runtime(fake, http, enable_json_mode=True))
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        ("read_chunk_window", {"doc_id": "g", "anchor_chunk_id": "g:c1"})
    ]
    body = fake.chat_requests[0].json
    assert "tools" not in body
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["schema"] == step_schema(TOOLS)


async def test_withdrawn_tools_keep_the_prompt_and_allow_only_the_answer(fake, http) -> None:
    fake.script(json_answer("first"), json_answer("Готово."))
    rt = runtime(fake, http, enable_json_mode=True)
    await complete(rt)
    out = await complete(rt, tool_choice="none")
    assert out.content == "Готово." and out.tool_calls == ()
    auto, none = (r.json for r in fake.chat_requests)
    assert none["messages"] == auto["messages"]  # the same prefix for the prompt cache
    assert none["response_format"]["json_schema"]["schema"] == step_schema(())


async def test_json_object_mode_withdraws_tools_from_the_instruction(fake, http) -> None:
    # json_object cannot forbid a call: there the answer-only instruction must.
    fake.script(json_answer("ok"))
    await complete(
        runtime(fake, http, enable_json_mode=True, json_schema=False), tool_choice="none"
    )
    body = fake.chat_requests[0].json
    assert body["response_format"] == {"type": "json_object"}
    assert "read_doc_section" not in body["messages"][0]["content"]


async def test_native_mode_withdrawn_tools_are_sent_with_tool_choice_none(fake, http) -> None:
    fake.script(text("the answer"))
    out = await complete(runtime(fake, http), tool_choice="none")
    assert out.content == "the answer"
    body = fake.chat_requests[0].json
    assert [t["function"]["name"] for t in body["tools"]] == [
        "read_doc_section",
        "read_chunk_window",
    ]
    assert body["tool_choice"] == "none"
    params = GenerationParams(tool_choice="none")
    request = ChatRequest(USER, TOOLS, params, MODEL)
    assert json.loads(encode_request(request)) == build_request(request)
    assert "tool_choice" not in build_request(ChatRequest(USER, TOOLS, GenerationParams(), MODEL))


# -- calls written into the text -------------------------------------------------------------

CALL = {"name": "read_doc_section", "arguments": {"doc_id": "g", "section_id": "s2"}}


@pytest.mark.parametrize(
    "content",
    [
        json.dumps(CALL),
        f"```json\n{json.dumps(CALL)}\n```",
        f"I will read the section.\n```json\n{json.dumps(CALL)}\n```",
        f"<tool_call>\n{json.dumps(CALL)}\n</tool_call>",
        json.dumps({"tool_name": "read_doc_section", "arguments": CALL["arguments"]}),
        json.dumps({"function": CALL}),
        json.dumps({"name": "read_doc_section", "arguments": json.dumps(CALL["arguments"])}),
    ],
)
def test_a_call_written_as_json_is_taken_as_a_call(content: str) -> None:
    (call,) = content_tool_calls(content, OFFERED)
    assert call.name == "read_doc_section"
    assert json.loads(call.arguments) == CALL["arguments"]
    assert call.id.startswith("call_")


@pytest.mark.parametrize(
    "content",
    [
        "Настройте LDAP в разделе Settings.",
        json.dumps({"name": "delete_everything", "arguments": {}}),  # not offered
        json.dumps(CALL) + " and then I answer",  # text after the object
        '{"name": "read_doc_section", "arguments": [1]}',  # arguments not an object
        "```json\n{broken\n```",
        json.dumps({"answer": 42}),
        "",
    ],
)
def test_text_that_is_not_a_call_of_an_offered_tool_stays_the_answer(content: str) -> None:
    assert content_tool_calls(content, OFFERED) == ()


def test_nothing_offered_nothing_taken() -> None:
    assert content_tool_calls(json.dumps(CALL), frozenset()) == ()


async def test_native_mode_takes_a_written_call_when_tools_were_offered(fake, http) -> None:
    fake.script(text(f"```json\n{json.dumps(CALL)}\n```"), text(json.dumps(CALL)))
    rt = runtime(fake, http)
    out = await complete(rt)
    assert [c.name for c in out.tool_calls] == ["read_doc_section"] and out.content == ""
    assert out.finish_reason == "tool_calls"
    # Withdrawn tools: the same text is the answer, not a call.
    out = await complete(rt, tool_choice="none")
    assert out.tool_calls == () and out.content == json.dumps(CALL)


async def test_a_streamed_written_call_is_not_streamed_as_text(fake, http) -> None:
    fake.script(Reply(content=json.dumps(CALL), chunk_chars=5))
    deltas, out = await stream(runtime(fake, http))
    assert deltas == [] and [c.name for c in out.tool_calls] == ["read_doc_section"]


async def test_a_streamed_answer_that_looks_like_json_arrives_whole(fake, http) -> None:
    answer = '{"status": "ok"} is what the API returns.'
    fake.script(Reply(content=answer, chunk_chars=4))
    deltas, out = await stream(runtime(fake, http))
    assert "".join(deltas) == answer and out.content == answer and out.tool_calls == ()


async def test_a_streamed_plain_answer_still_streams_piece_by_piece(fake, http) -> None:
    answer = "Откройте Settings, затем Directory."
    fake.script(Reply(content=answer, chunk_chars=4))
    deltas, out = await stream(runtime(fake, http))
    assert "".join(deltas) == answer == out.content and len(deltas) > 3


@pytest.mark.parametrize("chunk_chars", [1, 3, 7, 1000])
@pytest.mark.parametrize(
    "call_text",
    [
        f"<tool_call>\n{json.dumps(CALL)}\n</tool_call>",
        f"```json\n{json.dumps(CALL)}\n```",
        f"```\n{json.dumps(CALL)}\n```",
        f"```xml\n<tool_call>\n{json.dumps(CALL)}\n</tool_call>\n```",  # a tag in a fence
    ],
)
async def test_a_call_written_after_prose_streams_the_prose_but_never_the_call(
    fake, http, call_text: str, chunk_chars: int
) -> None:
    """The prose streams; nothing of the call does, nor the fence around it."""
    prose = "Прочитаю раздел <b>LDAP</b>, `ldapsearch` и ``x``.\n"
    fake.script(Reply(content=prose + call_text, chunk_chars=chunk_chars))
    deltas, out = await stream(runtime(fake, http))
    assert "".join(deltas) == prose
    assert [c.name for c in out.tool_calls] == ["read_doc_section"] and out.content == ""


@pytest.mark.parametrize("chunk_chars", [1, 4, 1000])
@pytest.mark.parametrize(
    "answer",
    [
        "Run:\n```bash\nldapsearch -x\n```\nthen <b>check</b> the log.",
        'The API answers:\n```json\n{"status": "ok"}\n```\nas shown.',
        "Use <tool> and <tool_caller> tags; the `<tool_call>` tag is not supported here.",
        "An open fence at the end: ```",
        "<tool_call>not a call</tool_call> is what the model printed.",
    ],
)
async def test_an_answer_with_fences_or_tags_that_are_no_call_arrives_whole_and_in_order(
    fake, http, answer: str, chunk_chars: int
) -> None:
    fake.script(Reply(content=answer, chunk_chars=chunk_chars))
    deltas, out = await stream(runtime(fake, http))
    assert "".join(deltas) == answer == out.content and out.tool_calls == ()


@pytest.mark.parametrize("language", ["bash", "", "json"])
async def test_a_code_block_streams_as_it_is_written_not_when_it_closes(
    fake, http, language: str
) -> None:
    """A fence is held only while it may be a call (a ``json`` tag or none, then ``{``)."""
    body = "\n".join(f"ldapsearch -x -b dc=example{i}" for i in range(40))
    if language == "json":
        body = '["not", "an", "object"]\n' + body
    answer = f"Run:\n```{language}\n{body}\n```\nDone."
    fake.script(Reply(content=answer, chunk_chars=4))
    deltas, out = await stream(runtime(fake, http))
    assert "".join(deltas) == answer == out.content
    assert max(len(d) for d in deltas) <= 16  # no delta holds the block whole


async def test_text_after_a_code_block_that_is_no_call_streams_before_the_answer_ends(
    fake, http
) -> None:
    answer = "Run:\n```bash\nldapsearch -x\n```\n" + "then check the log. " * 5
    fake.script(Reply(content=answer, chunk_chars=4))
    deltas, _ = await stream(runtime(fake, http))
    assert len(deltas) > 10 and "".join(deltas) == answer


# -- response_schema and cached tokens -------------------------------------------------------


@pytest.mark.parametrize("json_mode", [False, True])
async def test_a_response_schema_constrains_the_answer_and_returns_it_raw(
    fake, http, json_mode: bool
) -> None:
    fake.script(text('{"intent": "documents"}'))
    out = await complete(
        runtime(fake, http, enable_json_mode=json_mode), (), response_schema=ROUTE_SCHEMA
    )
    assert json.loads(out.content) == {"intent": "documents"} and out.tool_calls == ()
    body = fake.chat_requests[0].json
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "response", "schema": ROUTE_SCHEMA, "strict": True},
    }
    assert [m["content"] for m in body["messages"]] == [m.content for m in USER]


async def test_cached_prompt_tokens_are_read_from_the_usage(fake, http) -> None:
    fake.script(Reply(content="a", prompt_tokens=900, cached_tokens=850), text("b"))
    rt = runtime(fake, http)
    first = await complete(rt, ())
    assert (first.prompt_tokens, first.cached_prompt_tokens) == (900, 850)
    second = await complete(rt, ())
    assert second.cached_prompt_tokens == 0  # not reported: nothing assumed


# -- the request's response_schema is checked ------------------------------------------------


def _input(schema: Any, tools: tuple[str, ...] = ()) -> GenerateInput:
    return GenerateInput(
        messages=(Turn("user", "q"),),
        mode="chat",
        params=GenerationParams(response_schema=schema),
        user=User("t", "u"),
        policy=ToolPolicy(allowed_tools=tools),
    )


BUDGETS = LoopSettings(max_tool_steps=5, max_prompt_tokens=4096, max_completion_tokens=512)


def test_a_response_schema_at_the_size_limit_passes_one_byte_past_it_does_not() -> None:
    def schema_of(size: int) -> dict[str, Any]:
        base = {"description": ""}
        pad = size - len(json.dumps(base).encode())
        return {"description": "x" * pad}

    at = schema_of(MAX_RESPONSE_SCHEMA_BYTES)
    assert len(json.dumps(at).encode()) == MAX_RESPONSE_SCHEMA_BYTES
    validate(_input(at), BUDGETS)
    with pytest.raises(errors.LimitExceededError) as info:
        validate(_input(schema_of(MAX_RESPONSE_SCHEMA_BYTES + 1)), BUDGETS)
    assert info.value.reason == "LLM_LIMIT_EXCEEDED"
    assert info.value.metadata["field"] == "generation_params.response_schema"


@pytest.mark.parametrize(("schema", "tools"), [({}, ()), (ROUTE_SCHEMA, ("read_doc_section",))])
def test_an_empty_response_schema_or_one_with_tools_is_refused(schema, tools) -> None:
    with pytest.raises(errors.InvalidArgumentError) as info:
        validate(_input(schema, tools), BUDGETS)
    assert info.value.metadata["field"] == "generation_params.response_schema"


def test_params_with_a_schema_still_replace_cleanly() -> None:
    params = GenerationParams(response_schema=ROUTE_SCHEMA)
    assert replace(params, max_tokens=5).response_schema == ROUTE_SCHEMA


async def test_a_required_call_leaves_the_answer_out_of_the_step_schema(fake, http) -> None:
    fake.script(json_tool_call("read_doc_section", {"doc_id": "g", "section_id": "s1"}))
    await complete(runtime(fake, http, enable_json_mode=True), tool_choice="required")
    schema = fake.chat_requests[0].json["response_format"]["json_schema"]["schema"]
    assert schema == step_schema(TOOLS, require_call=True)
    assert all("tool_name" in option["properties"] for option in schema["anyOf"])


async def test_a_required_call_is_asked_natively_with_tool_choice_required(fake, http) -> None:
    fake.script(text(json.dumps(CALL)))
    out = await complete(runtime(fake, http), tool_choice="required")
    assert fake.chat_requests[0].json["tool_choice"] == "required"
    assert [c.name for c in out.tool_calls] == ["read_doc_section"]


async def test_the_default_temperature_applies_when_the_request_sets_none(fake, http) -> None:
    fake.script(text("a"), text("b"))
    rt = runtime(fake, http, temperature=0.0)
    await complete(rt, ())
    await complete(rt, (), temperature=0.7)
    assert [r.json["temperature"] for r in fake.chat_requests] == [0.0, 0.7]


def test_the_default_temperature_comes_from_the_environment_within_0_to_2() -> None:
    from services.common.settings import Env, SettingsError
    from services.model_runtime.config import RUNTIME

    base = {"LLM_RUNTIME_URL": "http://127.0.0.1:1", "DEFAULT_MODEL_NAME": "m"}
    assert RUNTIME.read(Env(base)).temperature is None
    for value, expected in (("0", 0.0), ("2", 2.0)):
        env = Env({**base, "LLM_RUNTIME_TEMPERATURE": value})
        assert RUNTIME.read(env).temperature == expected
    for bad in ("2.01", "-0.1", "warm"):
        with pytest.raises(SettingsError):
            RUNTIME.read(Env({**base, "LLM_RUNTIME_TEMPERATURE": bad}))


@pytest.mark.parametrize(
    ("language", "ok"), [("", True), ("ru", True), ("en", True), ("de", False)]
)
def test_the_answer_language_is_ru_en_or_unset(language: str, ok: bool) -> None:
    request = GenerateInput(messages=(Turn("user", "q"),), answer_language=language)
    if ok:
        validate(request, BUDGETS)
    else:
        with pytest.raises(errors.InvalidArgumentError) as info:
            validate(request, BUDGETS)
        assert info.value.metadata["field"] == "answer_language"


# -- a JSON-mode answer cut by max_tokens ------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '{"answer": "Используйте dpkg-buildpackage -us -uc, чтобы',
            "Используйте dpkg-buildpackage -us -uc, чтобы…",
        ),
        ('{"answer": "abc \\u04', "abc…"),
        ('{\n  "answer": "line\\nnext', "line\nnext…"),
        ('```json\n{"answer": "fenced', "fenced…"),
        ('{"answer": "', ""),  # cut before its first character: an empty answer, not a failure
        ('{"answer": "  ', ""),
    ],
)
def test_a_cut_answer_keeps_what_was_written(text: str, expected: str) -> None:
    assert truncated_answer(text) == expected


@pytest.mark.parametrize("text", ['{"tool_name": "read_doc_section", "argu', '{"answ', "plain"])
def test_a_cut_call_is_not_an_answer(text: str) -> None:
    assert truncated_answer(text) is None


async def test_a_json_mode_answer_cut_by_max_tokens_is_the_answer_so_far(fake, http) -> None:
    fake.script(
        Reply(content='{"answer": "Настройте LDAP в разделе Settings и', finish_reason="length")
    )
    out = await complete(runtime(fake, http, enable_json_mode=True), ())
    assert out.content == "Настройте LDAP в разделе Settings и…" and out.finish_reason == "length"


async def test_unreadable_json_that_was_not_cut_is_still_a_bad_response(fake, http) -> None:
    fake.script(Reply(content='{"answer": "Настройте LDAP в разделе', finish_reason="stop"))
    with pytest.raises(errors.UnavailableError) as info:
        await complete(runtime(fake, http, enable_json_mode=True), ())
    assert info.value.metadata["kind"] == "bad_response"


ANSWER = "one two STOP three"


@pytest.mark.parametrize(
    ("stop", "expected"),
    [(("STOP",), "one two "), (("}",), ANSWER), (('"',), ANSWER), (("x", "two"), "one ")],
)
async def test_json_mode_holds_the_answer_to_the_callers_stop_sequences(
    fake, http, stop, expected
) -> None:
    """In JSON mode the stop sequences are not sent (the runtime would end the object before
    it closes, "}" or '"' at once): the answer read from it ends before the first of them,
    whole and streamed."""
    rt = runtime(fake, http, enable_json_mode=True)
    fake.script(json_answer(ANSWER), json_answer(ANSWER))
    out = await complete(rt, (), stop=stop)
    assert (out.content, out.finish_reason) == (expected, "stop")
    request = ChatRequest(USER, (), GenerationParams(stop=stop))
    events = [e async for e in rt.stream(request, timeout_s=5.0)]
    deltas = "".join(e.text for e in events if isinstance(e, StreamDelta))
    assert deltas == events[-1].content == expected
    assert all("stop" not in r.json for r in fake.chat_requests)


@pytest.mark.parametrize("stop", [(), ("STOP",)])
async def test_without_json_mode_the_runtime_gets_the_stop_sequences(fake, http, stop) -> None:
    fake.script(text(ANSWER))
    out = await complete(runtime(fake, http), (), stop=stop)
    assert out.content == ("one two " if stop else ANSWER)
    assert fake.chat_requests[-1].json.get("stop") == (list(stop) or None)


@pytest.mark.parametrize(
    ("reported", "counted"), [(2**24, 2**24), (2**24 + 1, None), (3_000_000_000, None)]
)
async def test_a_usage_count_past_any_context_window_is_no_count(
    fake, http, reported, counted
) -> None:
    """A count past MAX_TOKEN_COUNT is none: the service estimates instead, and a request's
    totals stay within the API's int32 fields."""
    fake.script(text("hello", prompt_tokens=reported, completion_tokens=reported))
    out = await complete(runtime(fake, http), ())
    assert (out.prompt_tokens, out.completion_tokens) == (counted or 0, counted)
