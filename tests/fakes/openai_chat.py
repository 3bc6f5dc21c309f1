"""A local OpenAI-compatible /v1/chat/completions server for tests: real HTTP, scripted replies, faults.

It speaks the wire format the official ``openai`` client expects (tests/unit/test_runtime.py
drives it once with that client to prove it): request validation with OpenAI's error body
``{"error": {"message", "type", "param", "code"}}``, ``chat.completion`` objects with
``tool_calls``, SSE ``chat.completion.chunk`` streams ending in ``data: [DONE]`` (with a
usage chunk when ``stream_options.include_usage`` is set), and ``response_format``
``json_object`` (refused, as OpenAI does, unless a message mentions JSON).

What the "model" says is scripted: a FIFO of `Reply` values (`script`), or a callable that
decides from the request (`respond_with`), else it echoes the last user message. Faults are
queued the same way and each spoils one chat request: `fail` (429/500/503 ...), `hang`
(before the headers or after N stream chunks), `malformed` bodies, `close_connection`,
`cut_stream`. `requests` records every request. `transport()` serves the same logic
in-process (no sockets, no threads) for benchmarks that want a zero-latency runtime.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import string
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx

from tests.fakes.threaded_http import ThreadedHttpFake

CHAT_PATH = "/v1/chat/completions"
ROLES = ("system", "developer", "user", "assistant", "tool")
KNOWN_PARAMS = frozenset(
    {
        "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
        "presence_penalty", "frequency_penalty", "stop", "stream", "stream_options", "tools",
        "tool_choice", "parallel_tool_calls", "response_format", "n", "seed", "user",
        "logprobs", "top_logprobs", "logit_bias", "metadata", "store", "service_tier",
    }
)  # fmt: skip
"""Top-level request fields the fake accepts; others get OpenAI's "Unrecognized request argument"."""
MALFORMED_KINDS = (
    "not_json",  # 200 with an HTML body
    "truncated",  # 200 with JSON cut in the middle
    "no_choices",  # a chat.completion without `choices`
    "bad_message",  # choices[0].message is a string
    "bad_tool_call",  # a tool call without function.name
    "bad_sse",  # (stream) a data: line that is not JSON
    "error_event",  # (stream) a data: {"error": ...} event after the first chunk
)
"""Kinds accepted by `FakeChatServer.malformed`."""
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def count_tokens(text: str) -> int:
    """The fake's token count: words and punctuation marks (deterministic, not a real BPE)."""
    return len(_TOKEN.findall(text))


def call_id() -> str:
    """A tool-call id shaped like OpenAI's (``call_`` + 24 alphanumerics)."""
    alphabet = string.ascii_letters + string.digits
    return "call_" + "".join(secrets.choice(alphabet) for _ in range(24))


# -- scripting -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScriptedCall:
    """A tool call the fake model makes; `arguments` is sent as the JSON text OpenAI sends."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    id: str = ""
    """Empty: a fresh ``call_...`` id is generated."""

    def arguments_text(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class Reply:
    """One scripted answer of the fake model."""

    content: str | None = None
    tool_calls: tuple[ScriptedCall, ...] = ()
    finish_reason: str | None = None
    """Default: "tool_calls" with tool calls, "length" when max_tokens cut it, else "stop"."""
    prompt_tokens: int | None = None
    """Default: `count_tokens` over the request's messages and tools."""
    completion_tokens: int | None = None
    """Default: `count_tokens` over the content and tool arguments."""
    chunk_chars: int = 8
    """Streaming: characters of content or arguments per chunk."""
    cached_tokens: int | None = None
    """Reported as ``usage.prompt_tokens_details.cached_tokens`` when set (a prompt cache)."""


def text(content: str, **kw: Any) -> Reply:
    """A plain text answer."""
    return Reply(content=content, **kw)


def tool_call(name: str, arguments: dict[str, Any] | str | None = None, **kw: Any) -> Reply:
    """A native tool call (``message.tool_calls``), no content."""
    return Reply(tool_calls=(ScriptedCall(name, {} if arguments is None else arguments),), **kw)


def json_tool_call(name: str, arguments: dict[str, Any]) -> Reply:
    """A JSON-mode tool call: the content is ``{"tool_name": ..., "arguments": {...}}``."""
    return Reply(content=json.dumps({"tool_name": name, "arguments": arguments}))


def json_answer(answer: str) -> Reply:
    """A JSON-mode final answer: the content is ``{"answer": "..."}``."""
    return Reply(content=json.dumps({"answer": answer}, ensure_ascii=False))


@dataclass(frozen=True)
class Fault:
    """One spoiled request. kind: status | hang | stall | malformed | close | cut_stream."""

    kind: str
    status: int = 503
    retry_after: str | None = None
    seconds: float = 30.0
    """hang: how long to hold the request (stop() releases it early)."""
    after_chunks: int = 0
    """hang / cut_stream on a stream: chunks sent before stalling or closing."""
    malformed: str = "not_json"


@dataclass(frozen=True)
class ChatRequest:
    """One request the fake received."""

    method: str
    path: str
    headers: dict[str, str]
    """Header names lower-cased."""
    body: Any
    """The parsed JSON body, or the raw text when it was not JSON."""

    @property
    def json(self) -> dict[str, Any]:
        """The body as a dict (asserts it was a JSON object)."""
        assert isinstance(self.body, dict), self.body
        return self.body

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.json.get("messages") or [])

    @property
    def stream(self) -> bool:
        return self.json.get("stream") is True


Responder = Callable[[ChatRequest], Reply]


# -- the protocol, independent of the transport -----------------------------------------------


@dataclass
class _Outcome:
    """What to send: a JSON body, an SSE event list, or a fault action."""

    status: int = 200
    payload: Any = None
    raw: bytes | None = None
    events: list[str] | None = None
    """SSE: the data: payloads, in order (the last is "[DONE]" unless cut)."""
    headers: dict[str, str] = field(default_factory=dict)
    hang_s: float = 0.0
    hang_after: int | None = None
    """Hang before the response (None) or after this many SSE events."""
    close_after: int | None = None
    """Close the connection after this many SSE events (0 with no events: no response)."""


def _error(message: str, type_: str, code: str | None = None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _bad(message: str, param: str | None = None, code: str | None = None) -> _Outcome:
    return _Outcome(400, _error(message, "invalid_request_error", code, param))


def _mask(key: str) -> str:
    return key[:3] + "*" * 4 + key[-2:] if len(key) > 6 else "***"


def _number(body: dict[str, Any], name: str, lo: float, hi: float) -> _Outcome | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _bad(f"Invalid type for '{name}': expected a decimal.", name, "invalid_type")
    if not lo <= value <= hi:
        return _bad(
            f"Invalid '{name}': decimal above maximum value. Expected a value <= {hi}."
            if value > hi
            else f"Invalid '{name}': decimal below minimum value. Expected a value >= {lo}.",
            name,
            "decimal_above_max_value" if value > hi else "decimal_below_min_value",
        )
    return None


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def validate(body: Any) -> _Outcome | None:
    """OpenAI's answer to a bad chat-completions body (400/404), or None when it is fine."""
    if not isinstance(body, dict):
        return _bad(
            "We could not parse the JSON body of your request. (HINT: This likely means you "
            "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload.)"
        )
    unknown = sorted(set(body) - KNOWN_PARAMS)
    if unknown:
        return _bad(f"Unrecognized request argument supplied: {unknown[0]}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return _bad("you must provide a model parameter", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return _bad(
            "Invalid 'messages': empty array. Expected an array with minimum length 1.",
            "messages",
            "empty_array",
        )
    pending: list[str] = []  # tool_call ids of the last assistant message not yet answered
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            role = m.get("role") if isinstance(m, dict) else None
            return _bad(
                f"Invalid value: '{role}'. Supported values are: 'system', 'assistant', "
                "'user', 'tool', 'function', and 'developer'.",
                f"{where}.role",
                "invalid_value",
            )
        role = m["role"]
        content = m.get("content")
        if role != "tool" and pending:
            return _bad(
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(pending)}",
                "messages",
            )
        if role == "tool":
            tcid = m.get("tool_call_id")
            if not isinstance(tcid, str) or not tcid:
                return _bad(
                    f"Missing required parameter: '{where}.tool_call_id'.",
                    f"{where}.tool_call_id",
                    "missing_required_parameter",
                )
            if tcid not in pending:
                return _bad(
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.",
                    f"{where}.role",
                )
            pending.remove(tcid)
            if not isinstance(content, str | list):
                return _bad(
                    f"Invalid type for '{where}.content': expected one of a string or array "
                    "of objects.",
                    f"{where}.content",
                    "invalid_type",
                )
            continue
        if role == "assistant":
            calls = m.get("tool_calls")
            if calls is not None:
                if not isinstance(calls, list) or not calls:
                    return _bad(
                        f"Invalid 'messages[{i}].tool_calls': empty array.",
                        f"{where}.tool_calls",
                        "empty_array",
                    )
                for j, c in enumerate(calls):
                    fn = c.get("function") if isinstance(c, dict) else None
                    if (
                        not isinstance(c, dict)
                        or not isinstance(c.get("id"), str)
                        or c.get("type") != "function"
                        or not isinstance(fn, dict)
                        or not isinstance(fn.get("name"), str)
                        or not isinstance(fn.get("arguments"), str)
                    ):
                        return _bad(
                            f"Invalid '{where}.tool_calls[{j}]': expected an object with id, "
                            "type 'function' and function{name, arguments (a string)}.",
                            f"{where}.tool_calls[{j}]",
                            "invalid_type",
                        )
                    pending.append(c["id"])
            if content is None and calls is None:
                return _bad(
                    f"Missing required parameter: '{where}.content'.",
                    f"{where}.content",
                    "missing_required_parameter",
                )
            if content is not None and not isinstance(content, str | list):
                return _bad(
                    f"Invalid type for '{where}.content'.", f"{where}.content", "invalid_type"
                )
            continue
        if not isinstance(content, str | list):
            return _bad(
                f"Invalid type for '{where}.content': expected one of a string or array of "
                "objects, but got "
                + ("null" if content is None else type(content).__name__)
                + " instead.",
                f"{where}.content",
                "invalid_type",
            )
    if pending:
        return _bad(
            "An assistant message with 'tool_calls' must be followed by tool messages "
            "responding to each 'tool_call_id'. The following tool_call_ids did not have "
            f"response messages: {', '.join(pending)}",
            "messages",
        )
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            return _bad(f"Invalid type for '{name}': expected an integer.", name, "invalid_type")
        if isinstance(value, int) and value < 1:
            return _bad(
                f"Invalid '{name}': integer below minimum value. Expected a value >= 1, "
                f"but got {value} instead.",
                name,
                "integer_below_min_value",
            )
    for name, lo, hi in (
        ("temperature", 0.0, 2.0),
        ("top_p", 0.0, 1.0),
        ("presence_penalty", -2.0, 2.0),
        ("frequency_penalty", -2.0, 2.0),
    ):
        problem = _number(body, name, lo, hi)
        if problem is not None:
            return problem
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            return _bad("Invalid type for 'stop'.", "stop", "invalid_type")
        if len(stops) > 4:
            return _bad(
                "Invalid 'stop': array too long. Expected an array with maximum length 4.",
                "stop",
                "array_above_max_length",
            )
    if "stream" in body and not isinstance(body["stream"], bool):
        return _bad("Invalid type for 'stream': expected a boolean.", "stream", "invalid_type")
    if body.get("stream_options") is not None and body.get("stream") is not True:
        return _bad(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            "stream_options",
        )
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            return _bad("Invalid type for 'tools': expected an array.", "tools", "invalid_type")
        for j, t in enumerate(tools):
            fn = t.get("function") if isinstance(t, dict) else None
            if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
                return _bad(
                    f"Missing required parameter: 'tools[{j}].function'.",
                    f"tools[{j}].function",
                    "missing_required_parameter",
                )
            tool_name = fn.get("name")
            if not isinstance(tool_name, str) or not _TOOL_NAME.match(tool_name):
                return _bad(
                    f"Invalid 'tools[{j}].function.name': string does not match pattern. "
                    "Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'.",
                    f"tools[{j}].function.name",
                    "invalid_value",
                )
            params = fn.get("parameters")
            if params is not None and not isinstance(params, dict):
                return _bad(
                    f"Invalid type for 'tools[{j}].function.parameters': expected an object.",
                    f"tools[{j}].function.parameters",
                    "invalid_type",
                )
    response_format = body.get("response_format")
    if response_format is not None:
        kind = response_format.get("type") if isinstance(response_format, dict) else None
        if kind not in ("text", "json_object", "json_schema"):
            return _bad(
                f"Invalid value: '{kind}'. Supported values are: 'text', 'json_object', and "
                "'json_schema'.",
                "response_format.type",
                "invalid_value",
            )
        if kind == "json_schema":
            spec = response_format.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
                return _bad(
                    "Missing required parameter: 'response_format.json_schema.name'.",
                    "response_format.json_schema.name",
                    "missing_required_parameter",
                )
            if not isinstance(spec.get("schema"), dict):
                return _bad(
                    "Invalid type for 'response_format.json_schema.schema': expected an object.",
                    "response_format.json_schema.schema",
                    "invalid_type",
                )
        if kind == "json_object" and not any(
            "json" in _message_text(m.get("content")).lower() for m in messages
        ):
            return _bad(
                "'messages' must contain the word 'json' in some form, to use "
                "'response_format' of type 'json_object'.",
                "messages",
            )
    return None


def _last_user_text(body: dict[str, Any]) -> str:
    for m in reversed(body.get("messages") or []):
        if isinstance(m, dict) and m.get("role") == "user":
            return _message_text(m.get("content"))
    return ""


@dataclass
class _Answer:
    """A Reply resolved against the request: ids, truncation, token counts."""

    content: str | None
    calls: list[tuple[str, str, str]]  # (id, name, arguments)
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    chunk_chars: int
    cached_tokens: int | None = None


def _resolve(reply: Reply, body: dict[str, Any]) -> _Answer:
    content = reply.content
    finish = reply.finish_reason
    stops = body.get("stop")
    for s in [stops] if isinstance(stops, str) else stops or []:
        if content is not None and s and s in content:
            content = content[: content.index(s)]
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    if content is not None and isinstance(limit, int) and count_tokens(content) > limit:
        # Cut after the limit-th token, as a real model stops mid-sentence.
        cut = [m.end() for m in _TOKEN.finditer(content)][limit - 1]
        content = content[:cut]
        finish = finish or "length"
    calls = [(c.id or call_id(), c.name, c.arguments_text()) for c in reply.tool_calls]
    prompt = reply.prompt_tokens
    if prompt is None:
        prompt = sum(count_tokens(_message_text(m.get("content"))) for m in body["messages"])
        prompt += count_tokens(json.dumps(body.get("tools") or []))
    completion = reply.completion_tokens
    if completion is None:
        completion = count_tokens(content or "") + sum(count_tokens(a) for _, _, a in calls)
    return _Answer(
        content=content,
        calls=calls,
        finish_reason=finish or ("tool_calls" if calls else "stop"),
        prompt_tokens=prompt,
        completion_tokens=completion,
        chunk_chars=max(1, reply.chunk_chars),
        cached_tokens=reply.cached_tokens,
    )


def _usage(a: _Answer) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": a.prompt_tokens,
        "completion_tokens": a.completion_tokens,
        "total_tokens": a.prompt_tokens + a.completion_tokens,
    }
    if a.cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": a.cached_tokens}
    return usage


def _completion_object(a: _Answer, rid: str, created: int, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": a.content,
        "refusal": None,
        "annotations": [],
    }
    if a.calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": args}}
            for i, n, args in a.calls
        ]
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": a.finish_reason}
        ],
        "usage": _usage(a),
        "service_tier": "default",
        "system_fingerprint": "fp_fake",
    }


def _pieces(value: str, size: int) -> Iterator[str]:
    for start in range(0, len(value), size):
        yield value[start : start + size]


def _chunk_events(a: _Answer, rid: str, created: int, model: str, include_usage: bool) -> list[str]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        obj: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "service_tier": "default",
            "system_fingerprint": "fp_fake",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if include_usage:
            obj["usage"] = None
        return json.dumps(obj, ensure_ascii=False)

    events = [chunk({"role": "assistant", "content": "", "refusal": None})]
    for piece in _pieces(a.content or "", a.chunk_chars):
        events.append(chunk({"content": piece}))
    for index, (cid, name, args) in enumerate(a.calls):
        events.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": cid,
                            "type": "function",
                            "function": {"name": name, "arguments": ""},
                        }
                    ]
                }
            )
        )
        for piece in _pieces(args, a.chunk_chars):
            events.append(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            )
    events.append(chunk({}, a.finish_reason))
    if include_usage:
        events.append(
            json.dumps(
                {
                    "id": rid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "system_fingerprint": "fp_fake",
                    "choices": [],
                    "usage": _usage(a),
                }
            )
        )
    events.append("[DONE]")
    return events


def _malformed(kind: str, a: _Answer, rid: str, created: int, model: str) -> _Outcome:
    good = _completion_object(a, rid, created, model)
    if kind == "not_json":
        return _Outcome(200, raw=b"<html><body>502 Bad Gateway</body></html>")
    if kind == "truncated":
        return _Outcome(200, raw=json.dumps(good).encode()[:40])
    if kind == "no_choices":
        del good["choices"]
        return _Outcome(200, good)
    if kind == "bad_message":
        good["choices"][0]["message"] = "oops"
        return _Outcome(200, good)
    if kind == "bad_tool_call":
        good["choices"][0]["message"]["tool_calls"] = [
            {"id": "call_x", "type": "function", "function": {"arguments": "{}"}}
        ]
        return _Outcome(200, good)
    raise ValueError(f"malformed kind {kind!r} does not apply to a non-streamed answer")


class FakeChatServer(ThreadedHttpFake):
    """An OpenAI-compatible chat-completions server on 127.0.0.1:<free port>, in a thread.

    ``POST /v1/chat/completions`` (JSON or SSE) and ``GET /v1/models``. Set `api_key` to
    require ``Authorization: Bearer <key>`` (401 ``invalid_api_key`` otherwise, with the key
    masked as OpenAI does). Set `models` to refuse other model names (404
    ``model_not_found``). `latency_s` delays every answer (0: none).
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        models: tuple[str, ...] = (),
        latency_s: float = 0.0,
    ) -> None:
        self.api_key = api_key
        self.models = models
        self.latency_s = latency_s
        self.requests: list[ChatRequest] = []
        self._replies: deque[Reply] = deque()
        self._faults: deque[Fault] = deque()
        self._responder: Responder | None = None
        self._lock = threading.Lock()
        super().__init__(_Handler)

    # -- lifecycle ------------------------------------------------------------------------

    def transport(self) -> httpx.AsyncBaseTransport:
        """The same server in-process, for ``httpx.AsyncClient(transport=...)``: no socket.

        Use it as the zero-latency runtime of benchmarks (base URL: any, e.g.
        ``http://fake``). Hangs sleep on the event loop; ``close`` faults raise
        ``httpx.RemoteProtocolError`` as a dropped connection does.
        """
        return _InProcessTransport(self)

    # -- scripting ------------------------------------------------------------------------

    def script(self, *replies: Reply) -> FakeChatServer:
        """Queue replies; each chat request takes the next (FIFO)."""
        with self._lock:
            self._replies.extend(replies)
        return self

    def respond_with(self, responder: Responder | None) -> FakeChatServer:
        """Decide replies from the request when the script queue is empty (None: echo)."""
        self._responder = responder
        return self

    def fail(self, status: int = 503, times: int = 1, *, retry_after: str | None = None) -> None:
        """The next `times` chat requests get `status` with OpenAI's error body."""
        self._queue(Fault("status", status=status, retry_after=retry_after), times)

    def hang(
        self, seconds: float = 30.0, times: int = 1, *, after_chunks: int | None = None
    ) -> None:
        """Hold the next `times` requests `seconds` before answering; with `after_chunks`, a
        stream sends that many chunks first and then stalls."""
        kind = "hang" if after_chunks is None else "stall"
        self._queue(Fault(kind, seconds=seconds, after_chunks=after_chunks or 0), times)

    def malformed(self, kind: str = "not_json", times: int = 1) -> None:
        """Answer the next `times` requests 200 with a broken body (see MALFORMED_KINDS)."""
        if kind not in MALFORMED_KINDS:
            raise ValueError(f"unknown malformed kind {kind!r}")
        self._queue(Fault("malformed", malformed=kind), times)

    def close_connection(self, times: int = 1) -> None:
        """Drop the connection of the next `times` requests without answering."""
        self._queue(Fault("close"), times)

    def cut_stream(self, after_chunks: int = 2, times: int = 1) -> None:
        """Streams: send `after_chunks` chunks, then drop the connection (no [DONE])."""
        self._queue(Fault("cut_stream", after_chunks=after_chunks), times)

    def _queue(self, fault: Fault, times: int) -> None:
        with self._lock:
            self._faults.extend([fault] * times)

    @property
    def chat_requests(self) -> list[ChatRequest]:
        """The POST /v1/chat/completions requests received so far."""
        with self._lock:
            return [r for r in self.requests if r.path == CHAT_PATH and r.method == "POST"]

    # -- the protocol -----------------------------------------------------------------------

    def _serve(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> _Outcome:
        try:
            body: Any = json.loads(raw.decode("utf-8")) if raw else None
        except (UnicodeDecodeError, ValueError):
            body = raw.decode("utf-8", "replace")
        request = ChatRequest(method, path.split("?")[0], headers, body)
        with self._lock:
            self.requests.append(request)
        if self.api_key is not None:
            auth = headers.get("authorization", "")
            if not auth.startswith("Bearer ") or not auth[7:].strip():
                return _Outcome(
                    401,
                    _error(
                        "You didn't provide an API key. You need to provide your API key in an "
                        "Authorization header using Bearer auth (i.e. Authorization: Bearer "
                        "YOUR_KEY).",
                        "invalid_request_error",
                    ),
                )
            if auth[7:].strip() != self.api_key:
                return _Outcome(
                    401,
                    _error(
                        f"Incorrect API key provided: {_mask(auth[7:].strip())}.",
                        "invalid_request_error",
                        "invalid_api_key",
                    ),
                )
        if method == "GET" and request.path == "/v1/models":
            names = self.models or ("fake-model",)
            data = [{"id": n, "object": "model", "created": 0, "owned_by": "fake"} for n in names]
            return _Outcome(200, {"object": "list", "data": data})
        if method != "POST" or request.path != CHAT_PATH:
            return _Outcome(
                404,
                _error(f"Invalid URL ({method} {request.path})", "invalid_request_error"),
            )
        with self._lock:
            fault = self._faults.popleft() if self._faults else None
        if fault is not None and fault.kind == "status":
            out = _Outcome(
                fault.status,
                _error(
                    "Rate limit reached for requests"
                    if fault.status == 429
                    else "The server had an error while processing your request. Sorry about that!",
                    "requests" if fault.status == 429 else "server_error",
                    "rate_limit_exceeded" if fault.status == 429 else None,
                ),
            )
            if fault.retry_after is not None:
                out.headers["retry-after"] = fault.retry_after
            return out
        if fault is not None and fault.kind == "close":
            return _Outcome(close_after=0)
        problem = validate(body)
        if problem is not None:
            return problem
        assert isinstance(body, dict)
        if self.models and body["model"] not in self.models:
            return _Outcome(
                404,
                _error(
                    f"The model `{body['model']}` does not exist or you do not have access to it.",
                    "invalid_request_error",
                    "model_not_found",
                ),
            )
        answer = _resolve(self._next_reply(request), body)
        rid = "chatcmpl-" + secrets.token_hex(12)
        created = int(time.time())
        model = body["model"]
        if body.get("stream") is True:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            out = _Outcome(200, events=_chunk_events(answer, rid, created, model, include_usage))
            assert out.events is not None
            if fault is not None and fault.kind == "malformed":
                if fault.malformed == "bad_sse":
                    out.events.insert(1, "{not json")
                elif fault.malformed == "error_event":
                    err = _error("The model crashed.", "server_error")
                    out.events[1:] = [json.dumps(err)]
                else:
                    return _malformed(fault.malformed, answer, rid, created, model)
            elif fault is not None and fault.kind == "cut_stream":
                out.close_after = fault.after_chunks
            elif fault is not None and fault.kind in ("hang", "stall"):
                out.hang_s = fault.seconds
                out.hang_after = fault.after_chunks if fault.kind == "stall" else None
            return out
        if fault is not None and fault.kind == "malformed":
            return _malformed(fault.malformed, answer, rid, created, model)
        out = _Outcome(200, _completion_object(answer, rid, created, model))
        if fault is not None and fault.kind in ("hang", "stall"):
            out.hang_s = fault.seconds
        return out

    def _next_reply(self, request: ChatRequest) -> Reply:
        with self._lock:
            if self._replies:
                return self._replies.popleft()
        if self._responder is not None:
            return self._responder(request)
        return Reply(content=f"echo: {_last_user_text(request.json)}")


class _Handler(BaseHTTPRequestHandler):
    fake: FakeChatServer
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle on, the body waits for the client's
    # delayed ACK (~40 ms per call, found by bench/llm_overhead.py). Real servers set NODELAY.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def _handle(self, method: str) -> None:
        fake = self.fake
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        out = fake._serve(method, self.path, headers, raw)
        if out.close_after == 0 and out.events is None:
            self.close_connection = True  # no status line at all
            return
        if fake.latency_s:
            fake._stopping.wait(fake.latency_s)
        if out.hang_s and out.hang_after is None:
            fake._stopping.wait(out.hang_s)  # past the client's timeout; stop() releases it
        if out.events is None:
            body = out.raw if out.raw is not None else json.dumps(out.payload).encode("utf-8")
            self.send_response(out.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for k, v in out.headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for n, event in enumerate(out.events):
                if out.close_after is not None and n >= out.close_after:
                    self.close_connection = True
                    self.wfile.flush()
                    return
                if out.hang_after is not None and n == out.hang_after:
                    self.wfile.flush()
                    fake._stopping.wait(out.hang_s)
                data = f"data: {event}\n\n".encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class _InProcessTransport(httpx.AsyncBaseTransport):
    """Serves FakeChatServer's protocol without a socket (benchmarks: zero network latency)."""

    def __init__(self, fake: FakeChatServer) -> None:
        self.fake = fake

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        raw = await request.aread()
        headers = {k.lower(): v for k, v in request.headers.items()}
        out = self.fake._serve(request.method, request.url.raw_path.decode(), headers, raw)
        if out.close_after == 0 and out.events is None:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        if self.fake.latency_s:
            await asyncio.sleep(self.fake.latency_s)
        if out.hang_s and out.hang_after is None:
            await asyncio.sleep(out.hang_s)
        if out.events is None:
            body = out.raw if out.raw is not None else json.dumps(out.payload).encode("utf-8")
            return httpx.Response(
                out.status,
                headers={"content-type": "application/json", **out.headers},
                content=body,
            )
        return httpx.Response(
            200,
            headers={"content-type": "text/event-stream; charset=utf-8"},
            stream=_EventStream(out),
        )


class _EventStream(httpx.AsyncByteStream):
    """An SSE body produced on the event loop, with the stall and cut faults of the socket server."""

    def __init__(self, out: _Outcome) -> None:
        self._out = out

    async def __aiter__(self) -> AsyncIterator[bytes]:
        out = self._out
        assert out.events is not None
        for n, event in enumerate(out.events):
            if out.close_after is not None and n >= out.close_after:
                raise httpx.RemoteProtocolError(
                    "peer closed connection without sending complete message body"
                )
            if out.hang_after is not None and n == out.hang_after:
                await asyncio.sleep(out.hang_s)
            yield f"data: {event}\n\n".encode()
