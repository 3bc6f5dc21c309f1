"""The OpenAI-compatible runtime client against a real local server speaking the wire format."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from services.common import errors
from services.common.breaker import CLOSED, OPEN, BreakerPolicy
from services.common.retry import RetryPolicy
from services.common.settings import Env, SettingsError
from services.common.topology import free_ports
from services.model_runtime.chat import (
    LLM_RUNTIME_ERROR,
    ChatMessage,
    ChatRequest,
    Completion,
    GenerationParams,
    StreamDelta,
    ToolCall,
    ToolSpec,
)
from services.model_runtime.client import (
    BadResponse,
    OpenAiChatRuntime,
    RuntimeSettings,
    WireForm,
    build_request,
    encode_request,
    json_mode_instruction,
    parse_completion,
    parse_json_mode,
)
from services.model_runtime.config import RUNTIME, runtime_settings
from tests.fakes.clock import ManualClock
from tests.fakes.openai_chat import (
    FakeChatServer,
    Reply,
    ScriptedCall,
    json_answer,
    json_tool_call,
    text,
    tool_call,
)

KEY = "sk-SECRET-runtime-0123456789abcdef"
MODEL = "fake-llama-3-8b"
USER = [ChatMessage("user", "Как настроить LDAP?")]
NO_PARAMS = GenerationParams()
READ_SECTION = ToolSpec(
    "read_doc_section",
    "Read a section of a document.",
    {
        "type": "object",
        "properties": {"doc_id": {"type": "string"}, "section_id": {"type": "string"}},
        "required": ["doc_id", "section_id"],
    },
)
READ_WINDOW = ToolSpec(
    "read_chunk_window",
    "Read the chunks around an anchor.",
    {"type": "object", "properties": {"anchor_chunk_id": {"type": "string"}}},
)


@pytest.fixture
def fake() -> Iterator[FakeChatServer]:
    with FakeChatServer(api_key=KEY) as server:
        yield server


class Harness:
    """Builds runtimes against the fake with an injected clock and a recording sleep."""

    def __init__(self, fake: FakeChatServer, http: httpx.AsyncClient) -> None:
        self.fake = fake
        self.http = http
        self.clock = ManualClock()
        self.delays: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.delays.append(seconds)
        self.clock.now += seconds

    def runtime(self, **overrides: Any) -> OpenAiChatRuntime:
        fields: dict[str, Any] = {"url": self.fake.url, "default_model": MODEL, "api_key": KEY}
        fields.update(overrides)
        return OpenAiChatRuntime(
            RuntimeSettings(**fields), self.http, clock=self.clock, sleep=self.sleep
        )


@pytest.fixture
def h(fake: FakeChatServer, http: httpx.AsyncClient) -> Harness:
    return Harness(fake, http)


async def complete(
    runtime: OpenAiChatRuntime,
    messages: list[ChatMessage] | None = None,
    tools: tuple[ToolSpec, ...] = (),
    params: GenerationParams = NO_PARAMS,
    timeout_s: float = 5.0,
    model: str = "",
) -> Completion:
    request = ChatRequest(messages or USER, tools, params, model)
    return await runtime.complete(request, timeout_s=timeout_s)


async def collect(
    runtime: OpenAiChatRuntime,
    tools: tuple[ToolSpec, ...] = (),
    timeout_s: float = 5.0,
    messages: list[ChatMessage] | None = None,
) -> tuple[list[str], Completion]:
    deltas: list[str] = []
    events = [
        e async for e in runtime.stream(ChatRequest(messages or USER, tools), timeout_s=timeout_s)
    ]
    for e in events[:-1]:
        assert isinstance(e, StreamDelta)
        deltas.append(e.text)
    assert isinstance(events[-1], Completion)
    return deltas, events[-1]


async def runtime_error(awaitable: Any) -> errors.UnavailableError:
    with pytest.raises(errors.UnavailableError) as caught:
        await awaitable
    assert caught.value.reason == LLM_RUNTIME_ERROR
    return caught.value


# -- settings -------------------------------------------------------------------------------


def test_settings_from_env_read_the_spec_names(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    s = RUNTIME.read(
        Env(
            {
                "LLM_RUNTIME_URL": "http://vllm:8000/v1",
                "DEFAULT_MODEL_NAME": MODEL,
                "LLM_RUNTIME_API_KEY_FILE": str(key_file),
                "ENABLE_JSON_MODE": "true",
                "LLM_RUNTIME_TIMEOUT_S": "12.5",
                "LLM_RUNTIME_STREAM_USAGE": "false",
            }
        )
    )
    assert s.endpoint == "http://vllm:8000/v1/chat/completions"
    assert (s.default_model, s.api_key, s.enable_json_mode) == (MODEL, KEY, True)
    # The retries and the breaker are constants (RuntimeSettings' defaults), not settings.
    assert (s.timeout_s, s.retry.attempts, s.breaker.failures, s.breaker.reset_s) == (
        12.5,
        2,
        5,
        30.0,
    )
    assert s.stream_usage is False
    assert KEY not in repr(s)


def test_settings_api_key_and_no_runtime_without_its_url() -> None:
    env = {"LLM_RUNTIME_URL": "https://openrouter.ai/api/v1", "DEFAULT_MODEL_NAME": "m"}
    assert RUNTIME.read(Env(env)).api_key is None
    assert RUNTIME.read(Env({**env, "LLM_RUNTIME_API_KEY": "sk-o"})).api_key == "sk-o"
    assert runtime_settings(Env(env)) is not None
    assert runtime_settings(Env({})) is None


@pytest.mark.parametrize(
    ("url", "endpoint"),
    [
        ("http://h:1", "http://h:1/v1/chat/completions"),
        ("http://h:1/", "http://h:1/v1/chat/completions"),
        ("http://h:1/v1", "http://h:1/v1/chat/completions"),
        ("http://h:1/v1/", "http://h:1/v1/chat/completions"),
        ("http://h:1/v1/chat/completions", "http://h:1/v1/chat/completions"),
        ("https://openrouter.ai/api/v1", "https://openrouter.ai/api/v1/chat/completions"),
    ],
)
def test_base_url_with_or_without_v1(url: str, endpoint: str) -> None:
    assert RuntimeSettings(url=url, default_model="m").endpoint == endpoint


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"LLM_RUNTIME_URL": "vllm:8000", "DEFAULT_MODEL_NAME": "m"},
        {"LLM_RUNTIME_URL": "http://u:p@h:1", "DEFAULT_MODEL_NAME": "m"},
        {"LLM_RUNTIME_URL": "http://h:1"},
        {
            "LLM_RUNTIME_URL": "http://h:1",
            "DEFAULT_MODEL_NAME": "m",
            "LLM_RUNTIME_STREAM_USAGE": "9",
        },
        {"LLM_RUNTIME_URL": "http://h:1", "DEFAULT_MODEL_NAME": "m", "LLM_RUNTIME_TIMEOUT_S": "x"},
        {"LLM_RUNTIME_URL": "http://h:1", "DEFAULT_MODEL_NAME": "m", "ENABLE_JSON_MODE": "maybe"},
        {
            "LLM_RUNTIME_URL": "http://h:1",
            "DEFAULT_MODEL_NAME": "m",
            "LLM_RUNTIME_API_KEY_FILE": "/nx",
        },
    ],
)
def test_settings_refuse_bad_values(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError):
        RUNTIME.read(Env(env))


def test_settings_refuse_an_empty_key_file(tmp_path: Path) -> None:
    (tmp_path / "k").write_text("  \n")
    env = {"LLM_RUNTIME_URL": "http://h:1", "DEFAULT_MODEL_NAME": "m"}
    with pytest.raises(SettingsError, match="empty"):
        RUNTIME.read(Env({**env, "LLM_RUNTIME_API_KEY_FILE": str(tmp_path / "k")}))


# -- request shape --------------------------------------------------------------------------


async def test_unset_params_are_not_sent(h: Harness) -> None:
    await complete(h.runtime())
    body = h.fake.chat_requests[0].json
    assert body == {"model": MODEL, "messages": [{"role": "user", "content": USER[0].content}]}


async def test_set_params_are_sent_and_the_request_model_wins(h: Harness) -> None:
    params = GenerationParams(
        max_tokens=64,
        temperature=0.0,
        top_p=0.95,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        stop=("</answer>",),
    )
    await complete(h.runtime(), params=params, model="qwen-2.5")
    body = h.fake.chat_requests[0].json
    assert body["model"] == "qwen-2.5"
    assert {k: body[k] for k in body if k not in ("model", "messages")} == {
        "max_tokens": 64,
        "temperature": 0.0,
        "top_p": 0.95,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "stop": ["</answer>"],
    }


async def test_tools_and_tool_messages_use_the_native_wire_form(h: Harness) -> None:
    h.fake.script(text("done"))
    call = ToolCall("call_1", "read_doc_section", '{"doc_id": "d1", "section_id": "s1"}')
    messages = [
        ChatMessage("system", "You are Visior."),
        *USER,
        ChatMessage("assistant", "", tool_calls=(call,)),
        ChatMessage("tool", "section text", tool_call_id="call_1", name="read_doc_section"),
    ]
    out = await complete(h.runtime(), messages, (READ_SECTION,))
    assert out.content == "done"
    body = h.fake.chat_requests[0].json
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "read_doc_section",
                "description": "Read a section of a document.",
                "parameters": READ_SECTION.parameters,
            },
        }
    ]
    assert body["messages"][2:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read_doc_section", "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "section text"},
    ]


@pytest.mark.parametrize("json_mode", [False, True])
@pytest.mark.parametrize("stream", [False, True])
def test_the_encoded_body_is_the_request_as_httpx_would_encode_it(
    json_mode: bool, stream: bool
) -> None:
    messages = [
        ChatMessage("system", "Отвечай «кратко»."),
        *USER,
        ChatMessage("assistant", "", (ToolCall("call_1", "read", '{"id": "s1"}'),)),
        ChatMessage("tool", "section <<<text>>>", tool_call_id="call_1", name="read"),
    ]
    tools = (ToolSpec("read", "Read.", {"type": "object"}), ToolSpec("ping", "Ping."))
    params = GenerationParams(max_tokens=64, temperature=0.2, stop=("###",))
    for _ in range(2):  # the second time from the cached per-message encodings
        for t in ((), tools):
            request = ChatRequest(messages, t, params, "m")
            form = WireForm(json_mode=json_mode, stream=stream)
            body = build_request(request, form)
            expected = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
            encoded = encode_request(request, form)
            assert encoded == expected.encode()


def test_a_tool_without_parameters_gets_an_empty_object_schema() -> None:
    body = build_request(ChatRequest(USER, (ToolSpec("ping", "Ping."),), NO_PARAMS, "m"))
    assert body["tools"][0]["function"]["parameters"] == {"type": "object", "properties": {}}


@pytest.mark.parametrize(
    "message",
    [ChatMessage("function", "x"), ChatMessage("tool", "result without an id")],
)
async def test_messages_the_port_does_not_allow_are_refused_before_any_call(
    h: Harness, message: ChatMessage
) -> None:
    with pytest.raises(ValueError):
        await complete(h.runtime(), [*USER, message])
    assert h.fake.chat_requests == []


# -- answers --------------------------------------------------------------------------------


async def test_tool_calls_are_parsed_with_ids_names_arguments_and_usage(h: Harness) -> None:
    h.fake.script(
        Reply(
            tool_calls=(
                ScriptedCall("read_doc_section", {"doc_id": "d1", "section_id": "s1"}, "call_a"),
                ScriptedCall("read_chunk_window", '{"anchor_chunk_id": "c7"}', "call_b"),
            ),
            prompt_tokens=120,
            completion_tokens=30,
        )
    )
    out = await complete(h.runtime(), tools=(READ_SECTION, READ_WINDOW))
    assert out.tool_calls == (
        ToolCall("call_a", "read_doc_section", '{"doc_id": "d1", "section_id": "s1"}'),
        ToolCall("call_b", "read_chunk_window", '{"anchor_chunk_id": "c7"}'),
    )
    assert (out.content, out.finish_reason, out.model) == ("", "tool_calls", MODEL)
    assert (out.prompt_tokens, out.completion_tokens) == (120, 30)


async def test_a_length_cut_answer_keeps_its_finish_reason(h: Harness) -> None:
    h.fake.script(text("one two three four five"))
    out = await complete(h.runtime(), params=GenerationParams(max_tokens=2))
    assert (out.content, out.finish_reason, out.completion_tokens) == ("one two", "length", 2)


@pytest.mark.parametrize(
    "kind", ["not_json", "truncated", "no_choices", "bad_message", "bad_tool_call"]
)
async def test_an_unreadable_answer_is_a_runtime_error_without_retry(h: Harness, kind: str) -> None:
    h.fake.malformed(kind)
    err = await runtime_error(complete(h.runtime()))
    assert err.metadata["kind"] == "bad_response"
    assert len(h.fake.chat_requests) == 1


# -- JSON mode ------------------------------------------------------------------------------


async def test_json_mode_request_lists_tools_in_the_system_message(h: Harness) -> None:
    h.fake.script(json_answer("Готово."))
    call = ToolCall("call_1", "read_doc_section", '{"doc_id": "d1", "section_id": "s1"}')
    messages = [
        ChatMessage("system", "You are Visior."),
        *USER,
        ChatMessage("assistant", "", tool_calls=(call,)),
        ChatMessage("tool", "section text", tool_call_id="call_1"),
    ]
    out = await complete(
        h.runtime(enable_json_mode=True, json_schema=False), messages, (READ_SECTION, READ_WINDOW)
    )
    assert out.content == "Готово." and out.tool_calls == ()
    body = h.fake.chat_requests[0].json
    assert "tools" not in body
    assert body["response_format"] == {"type": "json_object"}
    system = body["messages"][0]
    assert system["role"] == "system" and system["content"].startswith("You are Visior.")
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]
    for tool in (READ_SECTION, READ_WINDOW):
        assert f"- {tool.name}: {tool.description}" in system["content"]
        assert json.dumps(tool.parameters, sort_keys=True) in system["content"]
    assert '{"tool_name": "<tool name>", "arguments": {...}}' in system["content"]
    assert '{"answer": "<your answer to the user>"}' in system["content"]
    assert json.loads(body["messages"][2]["content"]) == {
        "tool_name": "read_doc_section",
        "arguments": {"doc_id": "d1", "section_id": "s1"},
    }
    assert json.loads(body["messages"][3]["content"]) == {
        "tool_name": "read_doc_section",
        "tool_result": "section text",
    }


def test_json_mode_without_a_system_message_adds_one() -> None:
    body = build_request(ChatRequest(USER, (), NO_PARAMS, "m"), WireForm(json_mode=True))
    assert body["messages"][0] == {"role": "system", "content": json_mode_instruction(())}
    assert "JSON" in body["messages"][0]["content"]


async def test_json_mode_tool_call_becomes_a_tool_call_with_a_generated_id(h: Harness) -> None:
    h.fake.script(json_tool_call("read_chunk_window", {"anchor_chunk_id": "c7"}))
    h.fake.script(json_tool_call("read_chunk_window", {"anchor_chunk_id": "c8"}))
    runtime = h.runtime(enable_json_mode=True)
    first = await complete(runtime, tools=(READ_WINDOW,))
    second = await complete(runtime, tools=(READ_WINDOW,))
    (call,) = first.tool_calls
    assert (call.name, json.loads(call.arguments)) == (
        "read_chunk_window",
        {"anchor_chunk_id": "c7"},
    )
    assert call.id.startswith("call_") and call.id != second.tool_calls[0].id
    assert (first.content, first.finish_reason) == ("", "tool_calls")


@pytest.mark.parametrize(
    ("answer", "content", "call"),
    [
        ('{"answer": "Да."}', "Да.", None),
        ('```json\n{"answer": "Да."}\n```', "Да.", None),
        ('{"answer": "Да."}\n(trailing chatter)', "Да.", None),
        (
            "Plain prose: the model ignored the format.",
            "Plain prose: the model ignored the format.",
            None,
        ),
        ('{"tool_name": "read", "arguments": {"a": 1}}', "", ("read", {"a": 1})),
        ('{"tool_name": "read"}', "", ("read", {})),
        ('{"tool_name": "read", "arguments": "{\\"a\\": 2}"}', "", ("read", {"a": 2})),
        # Wrong argument types pass through: the tool loop validates them against the schema.
        ('{"tool_name": "read", "arguments": [1, 2]}', "", ("read", [1, 2])),
        ('{"tool_name": "no_such_tool", "arguments": {}}', "", ("no_such_tool", {})),
    ],
)
def test_parse_json_mode_readable_answers(
    answer: str, content: str, call: tuple[str, Any] | None
) -> None:
    got_content, calls = parse_json_mode(answer)
    assert got_content == content
    if call is None:
        assert calls == ()
    else:
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [call]


@pytest.mark.parametrize(
    "answer",
    [
        "",
        "   ",
        '{"tool_nam',  # cut by max_tokens before it names its tool
        "{not json}",
        '{"result": "unknown shape"}',
        '{"tool_name": "", "arguments": {}}',
        '{"answer": 42}',
        "[1, 2]",
    ],
)
def test_parse_json_mode_unreadable_answers(answer: str) -> None:
    with pytest.raises(BadResponse):
        parse_json_mode(answer)


@pytest.mark.parametrize("content", ['{"tool": "read", "argu', '{"unknown": "shape"}'])
async def test_unreadable_json_mode_answer_is_a_runtime_error(h: Harness, content: str) -> None:
    h.fake.script(text(content))
    err = await runtime_error(complete(h.runtime(enable_json_mode=True), tools=(READ_WINDOW,)))
    assert err.metadata["kind"] == "bad_response"


async def test_json_mode_keeps_native_tool_calls_if_the_runtime_sends_them(h: Harness) -> None:
    h.fake.script(tool_call("read_chunk_window", {"anchor_chunk_id": "c1"}))
    out = await complete(h.runtime(enable_json_mode=True), tools=(READ_WINDOW,))
    assert out.tool_calls[0].name == "read_chunk_window"


# -- streaming ------------------------------------------------------------------------------


async def test_stream_yields_content_deltas_then_the_completion_with_usage(h: Harness) -> None:
    answer = "Чтобы настроить LDAP, откройте раздел «Интеграции»."
    h.fake.script(text(answer, chunk_chars=5, prompt_tokens=11, completion_tokens=9))
    deltas, done = await collect(h.runtime())
    assert len(deltas) > 3 and "".join(deltas) == answer
    assert (done.content, done.finish_reason, done.model) == (answer, "stop", MODEL)
    assert (done.prompt_tokens, done.completion_tokens) == (11, 9)
    body = h.fake.chat_requests[0].json
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert h.fake.chat_requests[0].headers["accept"] == "text/event-stream"


async def test_stream_reassembles_tool_call_fragments_by_index(h: Harness) -> None:
    h.fake.script(
        Reply(
            tool_calls=(
                ScriptedCall("read_doc_section", {"doc_id": "d1", "section_id": "s1"}, "call_a"),
                ScriptedCall("read_chunk_window", {"anchor_chunk_id": "c7"}, "call_b"),
            ),
            chunk_chars=3,
        )
    )
    deltas, done = await collect(h.runtime(), tools=(READ_SECTION, READ_WINDOW))
    assert deltas == []
    assert done.tool_calls == (
        ToolCall("call_a", "read_doc_section", '{"doc_id": "d1", "section_id": "s1"}'),
        ToolCall("call_b", "read_chunk_window", '{"anchor_chunk_id": "c7"}'),
    )
    assert done.finish_reason == "tool_calls"


async def test_stream_without_usage_option(h: Harness) -> None:
    deltas, done = await collect(h.runtime(stream_usage=False))
    assert "".join(deltas) == done.content and done.prompt_tokens == 0
    assert "stream_options" not in h.fake.chat_requests[0].json


async def test_stream_in_json_mode_yields_the_answer_not_the_json(h: Harness) -> None:
    h.fake.script(json_answer("Ответ."))
    deltas, done = await collect(h.runtime(enable_json_mode=True), tools=(READ_WINDOW,))
    assert deltas == ["Ответ."] and done.content == "Ответ."
    h.fake.script(json_tool_call("read_chunk_window", {"anchor_chunk_id": "c1"}))
    deltas, done = await collect(h.runtime(enable_json_mode=True), tools=(READ_WINDOW,))
    assert deltas == [] and done.tool_calls[0].name == "read_chunk_window"


@pytest.mark.parametrize("kind", ["bad_sse", "error_event"])
async def test_stream_with_a_broken_chunk_is_a_runtime_error(h: Harness, kind: str) -> None:
    h.fake.malformed(kind)
    err = await runtime_error(collect(h.runtime()))
    assert err.metadata["kind"] == "bad_response"


async def test_stream_cut_before_done_is_a_runtime_error_without_retry(h: Harness) -> None:
    h.fake.script(text("a long answer that will be cut", chunk_chars=4))
    h.fake.cut_stream(after_chunks=3)
    with pytest.raises(errors.UnavailableError) as caught:
        async for _ in h.runtime().stream(ChatRequest(USER), timeout_s=5):
            pass
    assert caught.value.reason == LLM_RUNTIME_ERROR
    assert caught.value.metadata["kind"] == "unreachable"
    assert len(h.fake.chat_requests) == 1


async def test_stream_stalling_mid_way_times_out(h: Harness) -> None:
    h.fake.hang(seconds=10, after_chunks=2)
    err = await runtime_error(collect(h.runtime(), timeout_s=0.3))
    assert err.metadata["kind"] == "timeout"


async def test_stream_retries_once_before_the_first_chunk(h: Harness) -> None:
    h.fake.fail(503)
    deltas, done = await collect(h.runtime())
    assert "".join(deltas) == done.content
    assert len(h.fake.chat_requests) == 2 and h.delays == [0.2]


async def test_a_server_that_ignores_stream_true_still_gives_deltas_and_a_completion() -> None:
    payload = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "whole"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5},
    }
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=payload))
    async with httpx.AsyncClient(transport=transport) as http:
        runtime = OpenAiChatRuntime(RuntimeSettings(url="http://x", default_model=MODEL), http)
        deltas, done = await collect(runtime)
    assert deltas == ["whole"] and (done.content, done.prompt_tokens) == ("whole", 4)


@pytest.mark.parametrize(
    ("usage", "counts"),
    [
        ({"prompt_tokens": 4, "completion_tokens": 0}, (4, 0)),
        ({"prompt_tokens": 4}, (4, None)),
        ({"prompt_tokens": 4, "completion_tokens": "7"}, (4, None)),
        (None, (0, None)),
    ],
)
def test_a_completion_count_the_runtime_gives_is_kept_and_one_it_does_not_give_is_none(
    usage: dict[str, Any] | None, counts: tuple[int, int | None]
) -> None:
    payload: dict[str, Any] = {"choices": [{"message": {"content": ""}, "finish_reason": "stop"}]}
    if usage is not None:
        payload["usage"] = usage
    done = parse_completion(payload, model=MODEL, json_mode=False)
    assert (done.prompt_tokens, done.completion_tokens) == counts


async def test_a_stream_closed_early_by_the_consumer_does_not_count_as_a_failure(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = h.runtime(breaker=BreakerPolicy(1, 30.0))
    h.fake.script(text("many words in this answer", chunk_chars=2))
    events = runtime.stream(ChatRequest(USER), timeout_s=5)
    first = await anext(events)
    assert isinstance(first, StreamDelta)
    with caplog.at_level(logging.INFO, logger="services.model_runtime.client"):
        await events.aclose()
    assert runtime.breaker.state == CLOSED
    # The call still has its log line (the tool loop closes a runaway answer this way).
    [line] = [r for r in caplog.records if r.getMessage() == "llm runtime call"]
    assert (line.outcome, line.stream) == ("closed", True)


# -- auth and secrets -----------------------------------------------------------------------


async def test_the_key_goes_as_bearer_and_nowhere_else(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    runtime = h.runtime()
    await complete(runtime)
    _ = [e async for e in runtime.stream(ChatRequest(USER), timeout_s=5)]
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in h.fake.chat_requests)
    assert KEY not in repr(runtime) and KEY not in repr(runtime.settings)
    assert caplog.records  # the calls were logged
    for record in caplog.records:
        assert KEY not in record.getMessage() and KEY not in str(record.__dict__)


async def test_no_key_sends_no_authorization_header(h: Harness) -> None:
    h.fake.api_key = None
    await complete(h.runtime(api_key=None))
    assert "authorization" not in h.fake.chat_requests[0].headers


async def test_a_refused_key_is_a_runtime_error_that_does_not_leak_it(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "sk-WRONG-key-9876543210"
    runtime = h.runtime(api_key=wrong, breaker=BreakerPolicy(1, 30.0))
    err = await runtime_error(complete(runtime))
    assert err.metadata["kind"] == "rejected" and err.metadata["status"] == "401"
    assert len(h.fake.chat_requests) == 1  # no retry
    for text_ in (str(err), repr(err), json.dumps(err.metadata), caplog.text):
        assert wrong not in text_ and wrong[:3] + "****" not in text_
    assert runtime.breaker.state == CLOSED  # the runtime is up


async def test_a_400_from_the_runtime_is_not_retried_and_does_not_open_the_breaker(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = h.runtime(breaker=BreakerPolicy(1, 30.0))
    bad_tool = ToolSpec("bad name!", "A name OpenAI refuses.")
    err = await runtime_error(complete(runtime, tools=(bad_tool,)))
    assert (err.metadata["kind"], err.metadata["status"]) == ("rejected", "400")
    assert len(h.fake.chat_requests) == 1 and h.delays == []
    assert runtime.breaker.state == CLOSED
    # The runtime's reason is logged for the operator.
    assert any("does not match pattern" in getattr(r, "detail", "") for r in caplog.records)


async def test_an_unknown_model_is_a_runtime_error(h: Harness) -> None:
    h.fake.models = (MODEL,)
    err = await runtime_error(complete(h.runtime(), model="no-such-model"))
    assert err.metadata["status"] == "404"


# -- retries, timeouts, breaker -------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
async def test_one_retry_then_success(h: Harness, status: int) -> None:
    h.fake.fail(status)
    h.fake.script(text("recovered"))
    out = await complete(h.runtime())
    assert out.content == "recovered"
    assert len(h.fake.chat_requests) == 2 and h.delays == [0.2]


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
async def test_retry_exhausted_is_a_runtime_error(h: Harness, status: int) -> None:
    h.fake.fail(status, times=2)
    err = await runtime_error(complete(h.runtime()))
    assert err.metadata == {
        "kind": "overloaded",
        "status": str(status),
        "attempts": "2",
        "runtime": MODEL,
    }
    assert len(h.fake.chat_requests) == 2


async def test_a_501_is_not_retried(h: Harness) -> None:
    h.fake.fail(501)
    err = await runtime_error(complete(h.runtime()))
    assert (err.metadata["kind"], err.metadata["status"], err.metadata["attempts"]) == (
        "bad_response", "501", "1",
    )  # fmt: skip
    assert len(h.fake.chat_requests) == 1


async def test_one_attempt_means_no_retry(h: Harness) -> None:
    h.fake.fail(503)
    await runtime_error(complete(h.runtime(retry=RetryPolicy(attempts=1, first_delay_s=0.2))))
    assert len(h.fake.chat_requests) == 1


@pytest.mark.parametrize(("attempts", "accepted"), [(1, True), (4, True), (5, False)])
def test_the_runtime_makes_at_most_four_attempts(attempts: int, accepted: bool) -> None:
    def build() -> RuntimeSettings:
        retry = RetryPolicy(attempts=attempts, first_delay_s=0.2)
        return RuntimeSettings(url="http://127.0.0.1:9", default_model=MODEL, retry=retry)

    if accepted:
        assert build().retry.attempts == attempts
    else:
        with pytest.raises(SettingsError, match=r"retry.attempts must be within 1\.\.4"):
            build()


async def test_a_short_retry_after_is_honoured_and_a_long_one_fails_at_once(h: Harness) -> None:
    h.fake.fail(429, retry_after="1.5")
    await complete(h.runtime())
    assert h.delays == [1.5]
    h.fake.fail(429, retry_after="60")
    err = await runtime_error(complete(h.runtime()))
    assert err.metadata["attempts"] == "1" and h.delays == [1.5]


@pytest.mark.parametrize(("header", "told"), [("60", "60"), ("2.5", "3"), ("0", "1")])
async def test_the_runtimes_retry_after_reaches_the_caller(
    h: Harness, header: str, told: str
) -> None:
    """The last answer's Retry-After, in whole seconds (never 0), rides on the error."""
    h.fake.fail(429, times=2, retry_after=header)
    err = await runtime_error(complete(h.runtime()))
    assert err.metadata["retry_after_s"] == told
    assert err.message.endswith(f"; it asks to wait {told} s")


async def test_no_retry_after_when_the_runtime_names_none(h: Harness) -> None:
    h.fake.fail(503, times=2)
    err = await runtime_error(complete(h.runtime()))
    assert "retry_after_s" not in err.metadata and "asks to wait" not in err.message


async def test_no_retry_when_the_backoff_does_not_fit_the_budget(h: Harness) -> None:
    h.fake.fail(503)
    await runtime_error(
        complete(h.runtime(retry=RetryPolicy(attempts=2, first_delay_s=1.0)), timeout_s=0.5)
    )
    assert len(h.fake.chat_requests) == 1


async def test_a_dropped_connection_is_retried(h: Harness) -> None:
    h.fake.close_connection()
    out = await complete(h.runtime())
    assert out.content.startswith("echo:") and len(h.fake.requests) == 2


async def test_an_unreachable_runtime_is_retried_then_a_runtime_error(
    http: httpx.AsyncClient,
) -> None:
    delays: list[float] = []

    async def sleep(s: float) -> None:
        delays.append(s)

    settings = RuntimeSettings(url=f"http://127.0.0.1:{free_ports(1)[0]}", default_model=MODEL)
    runtime = OpenAiChatRuntime(settings, http, sleep=sleep)
    err = await runtime_error(complete(runtime))
    assert (err.metadata["kind"], err.metadata["attempts"]) == ("unreachable", "2")
    assert delays == [0.2]


async def test_a_timeout_is_a_runtime_error_and_not_retried(h: Harness) -> None:
    h.fake.hang(seconds=10)
    err = await runtime_error(complete(h.runtime(), timeout_s=0.3))
    assert err.metadata["kind"] == "timeout"
    assert len(h.fake.chat_requests) == 1


async def test_the_configured_timeout_caps_the_callers(h: Harness) -> None:
    h.fake.hang(seconds=10)
    err = await runtime_error(complete(h.runtime(timeout_s=0.3), timeout_s=60))
    assert err.metadata["kind"] == "timeout"


@pytest.mark.parametrize("timeout_s", [0.0, -1.0])
async def test_no_time_left_fails_without_calling(h: Harness, timeout_s: float) -> None:
    err = await runtime_error(complete(h.runtime(), timeout_s=timeout_s))
    assert err.metadata["kind"] == "timeout"
    assert h.fake.chat_requests == []


async def test_breaker_opens_after_the_configured_failures_and_recovers(h: Harness) -> None:
    runtime = h.runtime(breaker=BreakerPolicy(3, 10.0))
    h.fake.fail(503, times=6)
    for _ in range(3):
        await runtime_error(complete(runtime))
    assert runtime.breaker.state == OPEN and len(h.fake.chat_requests) == 6

    err = await runtime_error(complete(runtime))
    assert err.metadata["kind"] == "circuit_open"
    err = await runtime_error(collect(runtime))
    assert err.metadata["kind"] == "circuit_open"
    assert len(h.fake.chat_requests) == 6  # nothing was sent

    h.clock.now += 10.0  # half-open: one trial goes through, and fails
    h.fake.malformed("not_json")
    await runtime_error(complete(runtime))
    assert runtime.breaker.state == OPEN

    h.clock.now += 10.0  # the next trial succeeds and closes the breaker
    assert (await complete(runtime)).content.startswith("echo:")
    assert runtime.breaker.state == CLOSED
    assert (await complete(runtime)).content.startswith("echo:")


# -- in-process transport (benchmarks) ------------------------------------------------------


async def test_the_in_process_transport_speaks_the_same_protocol() -> None:
    fake = FakeChatServer(api_key=KEY)
    async with httpx.AsyncClient(transport=fake.transport()) as http:
        runtime = OpenAiChatRuntime(
            RuntimeSettings(url="http://fake/v1", default_model=MODEL, api_key=KEY), http
        )
        fake.script(tool_call("read_chunk_window", {"anchor_chunk_id": "c1"}), text("ok"))
        assert (await complete(runtime, tools=(READ_WINDOW,))).tool_calls[0].id.startswith("call_")
        fake.close_connection()
        deltas, done = await collect(runtime)
        assert "".join(deltas) == done.content == "ok"
        fake.script(text("a cut answer", chunk_chars=2))
        fake.cut_stream(after_chunks=2)
        await runtime_error(collect(runtime))


# -- the fake is faithful -------------------------------------------------------------------


async def test_the_official_openai_client_reads_the_fake(fake: FakeChatServer) -> None:
    client = AsyncOpenAI(base_url=fake.url + "/v1", api_key=KEY, max_retries=0)
    fake.script(
        text("Привет, мир.", prompt_tokens=5, completion_tokens=3),
        tool_call("read_doc_section", {"doc_id": "d1", "section_id": "s1"}),
        text("streamed answer", chunk_chars=4),
    )
    plain = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], temperature=0.2
    )
    assert plain.choices[0].message.content == "Привет, мир."
    assert plain.choices[0].finish_reason == "stop"
    assert plain.usage is not None and plain.usage.total_tokens == 8

    tools: Any = [{"type": "function", "function": {"name": "read_doc_section", "parameters": {}}}]
    called = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], tools=tools
    )
    (call,) = called.choices[0].message.tool_calls or []
    assert call.type == "function" and call.function.name == "read_doc_section"
    assert json.loads(call.function.arguments) == {"doc_id": "d1", "section_id": "s1"}
    assert called.choices[0].finish_reason == "tool_calls"

    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage = [], None
    async for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
        usage = chunk.usage or usage
    assert "".join(pieces) == "streamed answer" and usage is not None

    fake.script(tool_call("read_doc_section", {"doc_id": "d2"}, chunk_chars=3))
    async with client.chat.completions.stream(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], tools=tools
    ) as streamed:
        final = await streamed.get_final_completion()
    (call,) = final.choices[0].message.tool_calls or []
    assert (call.function.name, call.function.arguments) == ("read_doc_section", '{"doc_id": "d2"}')

    with pytest.raises(Exception) as refused:  # the client maps 400 to BadRequestError
        await client.chat.completions.create(model=MODEL, messages=[])
    assert type(refused.value).__name__ == "BadRequestError"
    assert getattr(refused.value, "code", None) == "empty_array"
