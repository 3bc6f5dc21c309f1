"""Answers of an LLM runtime that are no usable completion, and what they say about the runtime.

1. A well-formed chat.completion whose JSON-mode content does not parse (a tool call missing
   its closing brace, one cut by max_tokens) is the model's output from a runtime that
   answered: the caller still gets ``bad_response``, but the breaker hears ANSWERED, so a
   model's bad turns never open the runtime's circuit for every tenant. A body that is no
   chat completion at all (HTML from a proxy, no choices) still counts as an outage.
2. A 200 answer that is the runtime's error (``{"error": {"message", "type", "code"}}``, as
   OpenRouter, LiteLLM and vLLM send for upstream failures) is read as that error: judged as
   the status its ``code`` names (a server_error or no code: a 500), retried and counted
   alike, its message in the error and the log.

Driven against tests/fakes/openai_chat.py's real-HTTP fake of the chat-completions protocol.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from services.common import errors
from services.common.breaker import CLOSED, OPEN, BreakerPolicy
from services.model_runtime.chat import (
    LLM_RUNTIME_ERROR,
    ChatRequest,
    Completion,
    StreamDelta,
    ToolSpec,
)
from services.model_runtime.client import OpenAiChatRuntime
from tests.fakes.openai_chat import ChatRequest as SentRequest
from tests.fakes.openai_chat import FakeChatServer, Reply, _Outcome, json_answer, text
from tests.unit.test_runtime import KEY, MODEL, USER
from tests.unit.test_runtime import Harness as RuntimeHarness

READ_META = ToolSpec(
    "read_doc_metadata",
    "Read a document's metadata.",
    {"type": "object", "properties": {"doc_id": {"type": "string"}}, "required": ["doc_id"]},
)
CUT_CALL = '{"tool_name": "read_doc_metadata", "arguments": {"doc_id": "orion-x-admin-guide"}'
OOM = "CUDA out of memory. Tried to allocate 2.00 GiB"


class ErrorBodyServer(FakeChatServer):
    """The fake, plus queued raw 200 bodies (`answer_200`): each spoils one chat request, as
    a proxy-style runtime answers an upstream failure with HTTP 200 and an error object."""

    def __init__(self) -> None:
        super().__init__(api_key=KEY)
        self._bodies: deque[Any] = deque()

    def answer_200(self, body: Any, times: int = 1) -> None:
        with self._lock:
            self._bodies.extend([body] * times)

    def _serve(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> _Outcome:
        with self._lock:
            body = self._bodies.popleft() if self._bodies and method == "POST" else None
            if body is not None:
                sent = json.loads(raw) if raw else None
                self.requests.append(SentRequest(method, path.split("?")[0], headers, sent))
        if body is None:
            return super()._serve(method, path, headers, raw)
        return _Outcome(200, body)


@pytest.fixture
def fake() -> Iterator[ErrorBodyServer]:
    with ErrorBodyServer() as server:
        yield server


class Harness(RuntimeHarness):
    """test_runtime's harness, with a breaker that opens after `failures`."""

    fake: ErrorBodyServer

    def runtime(self, failures: int = 3, **overrides: Any) -> OpenAiChatRuntime:
        return super().runtime(breaker=BreakerPolicy(failures, 30.0), **overrides)


@pytest.fixture
def h(fake: ErrorBodyServer, http: httpx.AsyncClient) -> Harness:
    return Harness(fake, http)


def request(tools: tuple[ToolSpec, ...] = ()) -> ChatRequest:
    return ChatRequest(USER, tools)


async def answer(rt: OpenAiChatRuntime, stream: bool, tools: tuple[ToolSpec, ...] = ()) -> str:
    """The answer text of one call (streamed or not)."""
    if not stream:
        return (await rt.complete(request(tools), timeout_s=5.0)).content
    events = [e async for e in rt.stream(request(tools), timeout_s=5.0)]
    assert isinstance(events[-1], Completion)
    deltas = "".join(e.text for e in events if isinstance(e, StreamDelta))
    assert deltas == events[-1].content
    return events[-1].content


async def runtime_error(rt: OpenAiChatRuntime, stream: bool = False) -> errors.UnavailableError:
    with pytest.raises(errors.UnavailableError) as caught:
        await answer(rt, stream, (READ_META,))
    assert caught.value.reason == LLM_RUNTIME_ERROR
    return caught.value


# -- 1. the model's unreadable JSON-mode content is no runtime outage ------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "reply",
    [
        Reply(content="{not json}"),
        Reply(content='{"result": "unknown shape"}'),
        Reply(content='{"answer": 42'),
    ],
    ids=["not_json", "other_shape", "cut_non_call"],
)
async def test_malformed_json_mode_answers_in_a_row_leave_the_breaker_closed(
    h: Harness, stream: bool, reply: Reply
) -> None:
    rt = h.runtime(failures=3, enable_json_mode=True)
    h.fake.script(*[reply] * 6, json_answer("LDAP ok"))
    for _ in range(6):  # twice the breaker's threshold
        err = await runtime_error(rt, stream)
        # The caller-visible error is unchanged: an unreadable answer, not retried.
        assert (err.metadata["kind"], err.metadata["attempts"]) == ("bad_response", "1")
        assert "unreadable answer: the model's JSON-mode answer" in err.message
        assert rt.breaker.state == CLOSED
    assert await answer(rt, stream, (READ_META,)) == "LDAP ok"
    assert len(h.fake.chat_requests) == 7  # each once: none refused by an open breaker


async def test_a_malformed_json_mode_answer_is_the_half_open_trial_answered(h: Harness) -> None:
    """The runtime sent a well-formed completion: it is up, as a 4xx says it is."""
    rt = h.runtime(failures=2, enable_json_mode=True)
    h.fake.fail(503, times=4)
    for _ in range(2):
        await runtime_error(rt)
    assert rt.breaker.state == OPEN
    h.clock.now += 30.0
    h.fake.script(Reply(content="{not json}"))
    await runtime_error(rt)
    assert rt.breaker.state == CLOSED


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "reply",
    [
        Reply(content=CUT_CALL),  # the closing brace missing
        Reply(content=CUT_CALL[:-12], finish_reason="length"),  # a call cut by max_tokens
        Reply(content=f"```json\n{CUT_CALL}\n```"),
    ],
    ids=["missing_brace", "cut_call", "fenced"],
)
async def test_a_malformed_call_naming_its_tool_is_that_call_with_its_text(
    h: Harness, stream: bool, reply: Reply
) -> None:
    """The tool loop refuses the call's unparsed arguments as INVALID_JSON and tells the model,
    as it does a native call's bad arguments: the request goes on, nothing fails."""
    rt = h.runtime(failures=3, enable_json_mode=True)
    h.fake.script(reply)
    if stream:
        events = [e async for e in rt.stream(request((READ_META,)), timeout_s=5.0)]
        completion = events[-1]
    else:
        completion = await rt.complete(request((READ_META,)), timeout_s=5.0)
    assert isinstance(completion, Completion) and completion.content == ""
    [call] = completion.tool_calls
    assert call.name == "read_doc_metadata" and call.arguments.startswith(CUT_CALL[:30])
    with pytest.raises(ValueError):
        json.loads(call.arguments)
    assert rt.breaker.state == CLOSED


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("kind", ["not_json", "truncated", "no_choices", "bad_message"])
async def test_a_broken_envelope_still_counts_as_an_outage(
    h: Harness, stream: bool, kind: str
) -> None:
    rt = h.runtime(failures=3, enable_json_mode=True)
    h.fake.malformed(kind, times=3)
    for _ in range(3):
        err = await runtime_error(rt, stream)
        assert err.metadata["kind"] == "bad_response"
    assert rt.breaker.state == OPEN
    assert (await runtime_error(rt, stream)).metadata["kind"] == "circuit_open"


@pytest.mark.parametrize("kind", ["bad_sse", "error_event"])
async def test_a_broken_stream_still_counts_as_an_outage(h: Harness, kind: str) -> None:
    rt = h.runtime(failures=2, enable_json_mode=True)
    h.fake.malformed(kind, times=2)
    for _ in range(2):
        assert (await runtime_error(rt, True)).metadata["kind"] == "bad_response"
    assert rt.breaker.state == OPEN


# -- 2. a 200 answer that is the runtime's error ---------------------------------------------


def error_body(message: str = OOM, type_: str = "server_error", code: Any = None) -> Any:
    err: dict[str, Any] = {"message": message, "type": type_}
    if code is not None:
        err["code"] = code
    return {"error": err}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "body",
    [
        error_body(code=503),
        error_body(),  # a server_error naming no status: a 500
        error_body(code="502"),
        error_body(code=429, type_="rate_limit_error"),
        {"error": "upstream provider failed"},
        {"object": "error", "message": OOM, "type": "InternalServerError", "code": 500},
    ],
    ids=["code_503", "no_code", "code_text", "code_429", "error_text", "vllm_form"],
)
async def test_a_transient_error_in_a_200_answer_is_retried_once(
    h: Harness, stream: bool, body: Any
) -> None:
    rt = h.runtime(failures=1)
    h.fake.answer_200(body)
    h.fake.script(text("Ответ после повтора"))
    assert await answer(rt, stream) == "Ответ после повтора"
    assert len(h.fake.chat_requests) == 2
    assert len(h.delays) == 1
    assert rt.breaker.state == CLOSED


async def test_the_runtimes_message_reaches_the_error_and_the_log(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    rt = h.runtime(failures=1)
    h.fake.answer_200(error_body(code=503), times=2)
    with caplog.at_level(logging.INFO, logger="services.model_runtime.client"):
        err = await runtime_error(rt)
    assert (err.metadata["kind"], err.metadata["attempts"], err.metadata["status"]) == (
        "overloaded",
        "2",
        "503",
    )
    assert OOM in err.message and "HTTP 200" in err.message
    assert "no choices" not in err.message
    details = [r.__dict__.get("detail") for r in caplog.records]
    assert details.count(OOM) == 2  # one line per attempt
    assert rt.breaker.state == OPEN  # counted as a 5xx after its retry is


async def test_a_200_error_naming_no_status_counts_as_a_5xx(h: Harness) -> None:
    rt = h.runtime(failures=2)
    h.fake.answer_200(error_body(), times=4)
    for _ in range(2):
        err = await runtime_error(rt)
        assert (err.metadata["kind"], err.metadata["status"]) == ("overloaded", "200")
        assert OOM in err.message
    assert len(h.fake.chat_requests) == 4 and rt.breaker.state == OPEN


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("code", [400, "404", 422])
async def test_a_4xx_in_a_200_answer_is_a_refusal_not_retried(
    h: Harness, stream: bool, code: Any
) -> None:
    rt = h.runtime(failures=1)
    h.fake.answer_200(error_body("This model's maximum context length is 8192 tokens", code=code))
    err = await runtime_error(rt, stream)
    assert (err.metadata["kind"], err.metadata["status"]) == ("rejected", str(code))
    assert "maximum context length is 8192 tokens" in err.message
    assert len(h.fake.chat_requests) == 1
    assert rt.breaker.state == CLOSED  # the runtime answered


@pytest.mark.parametrize("code", [401, 403])
async def test_a_credentials_error_in_a_200_answer_never_passes_its_message_on(
    h: Harness, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    rt = h.runtime(failures=1)
    h.fake.answer_200(error_body(f"Incorrect API key provided: {KEY[:8]}****", code=code))
    with caplog.at_level(logging.DEBUG, logger="services.model_runtime.client"):
        err = await runtime_error(rt)
    assert (err.metadata["kind"], err.metadata["status"]) == ("rejected", str(code))
    assert "refused the credentials" in err.message
    assert KEY[:8] not in err.message and KEY[:8] not in caplog.text
    assert rt.breaker.state == CLOSED


async def test_the_runtimes_message_is_one_short_line_without_the_key(h: Harness) -> None:
    rt = h.runtime(failures=5)
    long = f"upstream said:\n  bad\tthings with {KEY} " + "x" * 1000
    h.fake.answer_200(error_body(long, code=400))
    err = await runtime_error(rt)
    assert KEY not in err.message and "***" in err.message
    assert "\n" not in err.message and "\t" not in err.message
    assert "upstream said: bad things with ***" in err.message
    assert len(err.message) < 400


async def test_a_completion_that_mentions_an_error_is_served(h: Harness) -> None:
    h.fake.script(text('The log shows {"error": "disk full"}.'))
    out = await h.runtime().complete(request(), timeout_s=5.0)
    assert out.content == 'The log shows {"error": "disk full"}.'
    body = {
        "id": "x",
        "object": "chat.completion",
        "model": MODEL,
        "error": None,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
    }
    h.fake.answer_200(body)
    assert (await h.runtime().complete(request(), timeout_s=5.0)).content == "ok"


async def test_a_200_error_body_without_a_message_still_reads_as_an_error(h: Harness) -> None:
    rt = h.runtime(failures=5)
    h.fake.answer_200({"error": {"type": "server_error"}}, times=2)
    err = await runtime_error(rt)
    assert (err.metadata["kind"], err.metadata["attempts"]) == ("overloaded", "2")
    assert json.dumps(err.metadata)  # plain strings
