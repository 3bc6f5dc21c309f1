"""The OpenAI-compatible chat runtime client (vLLM, OpenRouter, ...): tools, JSON mode, SSE, resilience.

`OpenAiChatRuntime` implements the `ChatRuntime` port of services/model_runtime/chat.py over
``POST {LLM_RUNTIME_URL}/v1/chat/completions``.

Tool calling has two wire forms:

* native (default): ``tools`` in the request, ``message.tool_calls`` in the answer;
* JSON mode (``ENABLE_JSON_MODE``, for runtimes without native tool calling, llm-service.md
  §5.1/§6): no ``tools`` field; a system instruction lists the tools and their JSON schemas
  and asks for exactly one JSON object, ``{"tool_name": ..., "arguments": {...}}`` to call a
  tool or ``{"answer": "..."}`` to finish, with ``response_format: {"type": "json_object"}``.
  Earlier tool calls and results in the conversation are rewritten as text in that format,
  results as *user* messages ``{"tool_name", "tool_result"}`` (the spec says assistant; many
  chat templates refuse two assistant turns in a row). Reading the answer back
  (`parse_json_mode`):

  - ``{"tool_name": str, "arguments": object | JSON text | absent}`` -> one ToolCall with a
    generated id (arguments passed on as JSON text; the tool loop validates them);
  - ``{"answer": str}`` -> the final answer;
  - text that does not start like JSON (``{``/``[``, after stripping a Markdown code fence)
    -> the model ignored the format but answered: that text is the final answer;
  - an ``{"answer": "…`` that max_tokens cut off (finish_reason ``length``) -> the answer
    as far as it got, with "…" (`truncated_answer`);
  - a tool call whose JSON does not parse (a brace missing, or cut by max_tokens) that still
    names its tool (``"tool_name": "<name>"``) -> that ToolCall with the unparsed text as its
    arguments, which the tool loop refuses as INVALID_JSON and tells the model, as it does a
    native call's bad arguments (`_NAMED_CALL`);
  - empty text, other JSON that does not parse, or a JSON value of any other shape -> it
    cannot be read at all: UnavailableError LLM_RUNTIME_ERROR
    (``kind=bad_response``), not retried; the runtime answered, so it is no outage for the
    breaker (`BadModelOutput`).

Resilience. ``timeout_s`` bounds the whole call, the retry included (clamped to
LLM_RUNTIME_TIMEOUT_S). Exactly one retry (``retry``) on transient errors: a
connection refused/reset/dropped, 429 (honouring a short ``Retry-After``), 500/502/503/504.
Timeouts are not retried (a second full timeout would double the latency the caller waits),
nor are other 4xx (the same request fails the same way). A 200 answer that is the runtime's
error, ``{"error": {"message", "type", "code"}}`` instead of a completion (proxy-style
runtimes: OpenRouter, LiteLLM, vLLM), is judged as the status its ``code`` names (400..599),
or as a 500 when it names none (a ``server_error``), its message (one line, 300 characters,
key scrubbed) in the error and the log (`answer_error`). A circuit breaker counts failed
calls (timeouts, unreachable, 429/5xx after the retry, answers that are no chat completion);
a 4xx answer means the runtime is up and does not count, nor does a completion whose
JSON-mode content the model got wrong. A call ended at its deadline is the runtime's
timeout and counts, whichever timer fired first: the client's, or its caller's set to the
same instant (a cancellation, or a stream it stops reading). Except where a caller's
deadline shorter than ``timeout_s`` ended it: a call it left under 1 s (cancelled, or a
stream) and a stream whose runtime was still sending (a chunk, or its 200, within
``stall_s``) give no verdict, a stream the client's timer ended so being DEADLINE_EXCEEDED
(``kind=deadline``); a stream that had stalled counts. A call cancelled before its deadline
gives no verdict, even after a stream's 200. A call that finds no free connection in the
HTTP client's pool before its deadline gives none either: the service is busy
(``ResourceExhaustedError`` SERVER_BUSY, ``kind=busy``). Nor does a timeout while this
process itself stood still (its event loop stalled for ``loop_lag.STALL_S`` or more:
the breaker's TIMEOUT verdict); and a deadline the loop reaches late waits
``loop_lag.GRACE_S`` more for an answer that arrived meanwhile (`stall_tolerant_timeout`,
which alone bounds reads and writes: httpx's own read and write timers, which would fire
first on resuming, are off). Every other failure is
``UnavailableError(reason="LLM_RUNTIME_ERROR")`` with metadata ``kind`` (timeout,
unreachable, overloaded, rejected, bad_response, circuit_open), ``status`` when an HTTP
status arrived, and ``attempts``.

The API key travels only in ``Authorization: Bearer``; it is never logged, never in an error
or a repr. Message texts are never logged either.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from services.common import errors
from services.common.bounded_cache import BoundedCache
from services.common.breaker import (
    ANSWERED,
    NO_VERDICT,
    OUTAGE,
    TIMEOUT,
    BreakerPolicy,
    CircuitBreaker,
    CircuitOpenError,
    Ticket,
)
from services.common.context import MIN_VERDICT_S
from services.common.http import (
    TRANSIENT_STATUSES,
    check_base_url,
    endpoint_url,
    read_capped,
    retry_after_seconds,
    settled,
)
from services.common.loop_lag import stall_tolerant_timeout
from services.common.retry import (
    AttemptFailed,
    Clock,
    RetryPolicy,
    Sleep,
    run_with_retry,
    whole_seconds,
)
from services.common.settings import SettingsError
from services.model_runtime.chat import (
    LENGTH,
    LLM_RUNTIME_ERROR,
    ROLES,
    SAMPLING_RANGES,
    ChatMessage,
    ChatRequest,
    Completion,
    GenerationParams,
    StreamDelta,
    StreamEvent,
    ToolCall,
    ToolSpec,
    before_stop,
    message_chars,
    valid_text,
)

log = logging.getLogger(__name__)

CHAT_PATH = "/v1/chat/completions"
MAX_RESPONSE_BYTES = 8 * 1024 * 1024
"""A larger answer or stream (in bytes) is a bad response (a chat completion is far smaller)."""
MAX_TOKEN_COUNT = 2**24
"""The largest token count of a runtime's usage taken as one: past any model's context
window, and the totals of a request's calls stay within the API's int32 fields. A larger
one is no count."""
DEADLINE_SLACK_S = 0.01
"""A call its caller cancels this close to the call's deadline, or later, was ended by that
deadline: the caller's own timer (the tool loop's, the RPC's) is set to the same instant as
the client's, a hair sooner, and whichever fires first the runtime did not answer in time."""
POOL_MARGIN_S = 0.1
"""A call waits for a free connection until this long before its deadline (at most half its
time), so that the wait ends as the service being busy before any timer at the deadline ends
it as a timeout."""
_LINE_END = re.compile(rb"\r\n|\r|\n")


async def sse_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The lines of an event stream's body (ended by CRLF, LF or CR, as SSE allows), decoded
    as UTF-8 (an undecodable byte becomes U+FFFD). A CR at the end of a chunk waits for the
    next one, which may start with the LF of the same line end."""
    pending = b""
    async for chunk in chunks:
        pending += chunk
        if b"\n" not in chunk and b"\r" not in chunk:
            continue  # no line ends here: the line so far is not scanned again
        held = pending.endswith(b"\r")
        *lines, pending = _LINE_END.split(pending[:-1] if held else pending)
        if held:
            pending += b"\r"
        for line in lines:
            yield line.decode("utf-8", "replace")
    *lines, last = _LINE_END.split(pending)
    for line in lines:
        yield line.decode("utf-8", "replace")
    if last:
        yield last.decode("utf-8", "replace")


# -- settings --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RuntimeSettings:
    """How the LLM service reaches an OpenAI-compatible runtime; validated on construction."""

    url: str
    """Runtime base URL (LLM_RUNTIME_URL), with or without ``/v1``; http(s) only."""
    default_model: str
    """Model name when the request names none (DEFAULT_MODEL_NAME); required."""
    api_key: str | None = field(default=None, repr=False)
    """Bearer key (LLM_RUNTIME_API_KEY, or LLM_RUNTIME_API_KEY_FILE naming a file holding it);
    None sends none."""
    enable_json_mode: bool = False
    """Tools through the JSON-mode instruction instead of native ``tools`` (ENABLE_JSON_MODE)."""
    json_schema: bool = True
    """In JSON mode, constrain the answer with ``response_format`` ``json_schema`` (a schema
    naming the offered tools and their arguments, or the answer) instead of ``json_object``
    (LLM_RUNTIME_JSON_SCHEMA; off for runtimes that offer only ``json_object``)."""
    timeout_s: float = 30.0
    """Longest one call may take, the retry included (LLM_RUNTIME_TIMEOUT_S); callers'
    shorter timeouts win."""
    connect_timeout_s: float = 3.0
    """Longest a TCP/TLS connect may take."""
    retry: RetryPolicy = RetryPolicy(attempts=2, first_delay_s=0.2, max_retry_after_s=2.0)
    """Attempts after a transient failure: one retry (the spec's), 0.2 s after the first
    when the runtime gives no Retry-After; a 429/503 asking to wait over 2 s fails at once.
    The call's timeout is its deadline."""
    breaker: BreakerPolicy = BreakerPolicy(failures=5, reset_s=30.0)
    """Consecutive failed calls that open the breaker, and how long it then refuses calls
    before a trial."""
    stall_s: float = 3.0
    """A stream whose runtime sent nothing for this long (no chunk since the last one, or
    since its 200) has stalled: ended at the caller's deadline, it counts as the runtime's
    timeout; one still sending is the caller's deadline and no verdict."""
    temperature: float | None = None
    """Sampling temperature when the request sets none (LLM_RUNTIME_TEMPERATURE, 0..2);
    unset leaves it to the runtime. 0 makes a local model's answers repeatable."""
    stream_usage: bool = True
    """Ask streams for a final usage chunk, ``stream_options.include_usage``
    (LLM_RUNTIME_STREAM_USAGE; turn off for servers that refuse stream_options)."""

    def __post_init__(self) -> None:
        check_base_url(self.url, "LLM_RUNTIME_URL")
        if not self.default_model.strip():
            raise SettingsError("DEFAULT_MODEL_NAME is required when LLM_RUNTIME_URL is set")
        if self.timeout_s <= 0 or self.connect_timeout_s <= 0 or self.stall_s <= 0:
            raise SettingsError("LLM runtime timeouts must be positive")
        if not 1 <= self.retry.attempts <= 4:
            raise SettingsError("RuntimeSettings.retry.attempts must be within 1..4")
        low, high = SAMPLING_RANGES["temperature"]
        if self.temperature is not None and not low <= self.temperature <= high:
            raise SettingsError(f"LLM_RUNTIME_TEMPERATURE must be within {low:g}..{high:g}")

    @property
    def endpoint(self) -> str:
        """The chat-completions URL (services.common.http.endpoint_url)."""
        return endpoint_url(self.url, CHAT_PATH)


# -- request building ------------------------------------------------------------------------

JSON_MODE_INSTRUCTIONS = """\
# Tools
You may use the following tools. Each is listed with its description and the JSON schema \
of its arguments:
{tools}

Reply with exactly one JSON object and nothing else:
- to call a tool: {{"tool_name": "<tool name>", "arguments": {{...}}}}
- to give your final answer: {{"answer": "<your answer to the user>"}}
Call one tool at a time; its result comes back as a message {{"tool_name": ..., \
"tool_result": ...}}."""

JSON_MODE_ANSWER_ONLY = (
    'Reply with exactly one JSON object and nothing else: {"answer": "<your answer to the user>"}'
)


def _schema(tool: ToolSpec) -> dict[str, Any]:
    return tool.parameters or {"type": "object", "properties": {}}


def json_mode_instruction(tools: Sequence[ToolSpec]) -> str:
    """The system instruction of JSON mode (mentions JSON, as json_object requires).

    In JSON mode it presents the tools as ``tools`` does in native mode: each tool's name,
    description and argument schema (services/llm/prompt.py's tool-use block names the
    tools too, with their descriptions, in both modes)."""
    if not tools:
        return JSON_MODE_ANSWER_ONLY
    listing = "\n".join(
        f"- {t.name}: {' '.join(t.description.split())}\n"
        f"  arguments schema: {json.dumps(_schema(t), ensure_ascii=False, sort_keys=True)}"
        for t in tools
    )
    return JSON_MODE_INSTRUCTIONS.format(tools=listing)


_KEPT_KEYWORDS = frozenset({"type", "required", "items", "enum", "const", "anyOf", "oneOf"})
_ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
    "additionalProperties": False,
}


def _constrainable(schema: Any) -> Any:
    """`schema` with only the keywords a runtime's grammar needs to shape the JSON (types,
    properties, required, items, enum, const, anyOf): length, range and pattern limits are
    left to the tool loop's own check (grammars of `maxLength: 2000` grow large), and unknown
    properties are refused so the model cannot invent arguments."""
    if isinstance(schema, list):
        return [_constrainable(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _constrainable(v) for k, v in schema.items() if k in _KEPT_KEYWORDS}
    properties = schema.get("properties")
    if isinstance(properties, dict):
        # Property names are the arguments themselves, not keywords: each value is a schema.
        out["properties"] = {k: _constrainable(v) for k, v in properties.items()}
        out["additionalProperties"] = False
    elif properties is not None:
        out["properties"] = properties
    return out


def step_schema(
    tools: Sequence[ToolSpec], *, allow_tools: bool = True, require_call: bool = False
) -> dict[str, Any]:
    """The JSON schema of one JSON-mode step: a call of one of `tools` (its name as a
    constant, its arguments by its own schema) or, unless `require_call`, the final answer."""
    if not tools or not allow_tools:
        return _ANSWER_SCHEMA
    calls = [
        {
            "type": "object",
            "properties": {
                "tool_name": {"const": t.name},
                "arguments": _constrainable(_schema(t)),
            },
            "required": ["tool_name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    return {"anyOf": calls if require_call else [*calls, _ANSWER_SCHEMA]}


def _json_schema_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def _check_roles(messages: Sequence[ChatMessage]) -> None:
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise ValueError(f"messages[{i}].role {m.role!r} is not one of {', '.join(ROLES)}")
        if m.role == "tool" and not m.tool_call_id:
            raise ValueError(f"messages[{i}] has role 'tool' but no tool_call_id")


def _native_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content})
        elif m.role == "assistant" and m.tool_calls:
            out.append(
                {
                    "role": "assistant",
                    "content": m.content or None,
                    "tool_calls": [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments},
                        }
                        for c in m.tool_calls
                    ],
                }
            )
        else:
            out.append({"role": m.role, "content": m.content})
    return out


def _json_call_text(call: ToolCall) -> str:
    try:
        arguments: Any = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        arguments = call.arguments
    return json.dumps({"tool_name": call.name, "arguments": arguments}, ensure_ascii=False)


def _json_mode_messages(
    messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
) -> list[dict[str, Any]]:
    names = {c.id: c.name for m in messages for c in m.tool_calls}
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            name = m.name or names.get(m.tool_call_id, "")
            result = json.dumps({"tool_name": name, "tool_result": m.content}, ensure_ascii=False)
            out.append({"role": "user", "content": result})
        elif m.role == "assistant" and m.tool_calls:
            text = "\n".join(_json_call_text(c) for c in m.tool_calls)
            out.append({"role": "assistant", "content": text})
        else:
            out.append({"role": m.role, "content": m.content})
    instruction = json_mode_instruction(tools)
    # One leading system message: several chat templates accept no other.
    if out and out[0]["role"] == "system":
        out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{instruction}".lstrip()}
    else:
        out.insert(0, {"role": "system", "content": instruction})
    return out


@dataclass(frozen=True)
class WireForm:
    """How a ChatRequest is put on the wire (the runtime's settings decide)."""

    json_mode: bool = False
    """Tools as a system instruction and calls as JSON text (ENABLE_JSON_MODE), not ``tools``."""
    json_schema: bool = False
    """In JSON mode, constrain each step to `step_schema` (else ``json_object``)."""
    stream: bool = False
    stream_usage: bool = True
    """With `stream`, ask for a final usage chunk (``stream_options.include_usage``)."""


NATIVE = WireForm()


def build_request(request: ChatRequest, form: WireForm = NATIVE) -> dict[str, Any]:
    """The chat-completions body: only the generation params that are set are sent.

    With `params.response_schema` the answer is constrained to that schema (no tools). In
    JSON mode `form.json_schema` constrains each step to `step_schema` (else ``json_object``).
    With `params.tool_choice` "none" the tools stay in the prompt, unchanged, so the
    runtime's prompt cache still covers it, but the answer may not call them.
    """
    messages, tools, params = request.messages, request.tools, request.params
    _check_roles(messages)
    body: dict[str, Any] = {"model": request.model}
    allow_tools = params.tool_choice != "none"
    if params.response_schema is not None:
        body["messages"] = _native_messages(messages)
        body["response_format"] = _json_schema_format("response", params.response_schema)
    elif form.json_mode:
        body["messages"] = _json_mode_messages(messages, tools)
        if form.json_schema:
            body["response_format"] = _json_schema_format(
                "visior_step",
                step_schema(
                    tools, allow_tools=allow_tools, require_call=params.tool_choice == "required"
                ),
            )
        else:
            body["response_format"] = {"type": "json_object"}
    else:
        body["messages"] = _native_messages(messages)
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": _schema(t),
                    },
                }
                for t in tools
            ]
            if params.tool_choice in ("none", "required"):
                body["tool_choice"] = params.tool_choice
    body.update(_options(params, form))
    return body


def _options(params: GenerationParams, form: WireForm) -> dict[str, Any]:
    """The body's fields after the messages and tools: the generation params that are set,
    and the stream's."""
    options: dict[str, Any] = {}
    for name in ("max_tokens", "temperature", "top_p", "presence_penalty", "frequency_penalty"):
        value = getattr(params, name)
        if value is not None:
            options[name] = value
    if params.stop and not form.json_mode:  # in JSON mode: `held_to_stop`
        options["stop"] = list(params.stop)
    if form.stream:
        options["stream"] = True
        if form.stream_usage:
            options["stream_options"] = {"include_usage": True}
    return options


def _dumps(value: Any) -> str:
    # As httpx encodes `json=` bodies: compact, UTF-8, no NaN.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


# The conversation grows by a few messages per step and is sent whole at every model call:
# each message's JSON is encoded once (keyed by the frozen message's value, bounded by the
# characters the message and its JSON hold, since a request may bring 64 messages of 32,768
# characters), likewise the tool definitions (keyed by the catalogue's parameters objects,
# kept alive).
_JSON_CACHE_LIMIT = 1024
_JSON_CACHE_CHARS = 1 << 23
"""Characters the message cache keeps, messages and their JSON (8,388,608: at most 32 MB)."""
_MESSAGE_JSON: BoundedCache[ChatMessage, str] = BoundedCache(_JSON_CACHE_LIMIT, _JSON_CACHE_CHARS)
_TOOLS_JSON: dict[tuple[tuple[str, str, int], ...], tuple[tuple[object, ...], str]] = {}


def _message_json(m: ChatMessage) -> str:
    found = _MESSAGE_JSON.get(m)
    if found is None:
        found = _dumps(_native_messages((m,))[0])
        _MESSAGE_JSON.put(m, found, message_chars(m) + len(found))
    return found


def _tools_json(tools: Sequence[ToolSpec]) -> str:
    key = tuple((t.name, t.description, id(t.parameters)) for t in tools)
    hit = _TOOLS_JSON.get(key)
    if hit is not None and all(a is t.parameters for a, t in zip(hit[0], tools, strict=True)):
        return hit[1]
    found = _dumps(build_request(ChatRequest((), tools))["tools"])
    if len(_TOOLS_JSON) >= _JSON_CACHE_LIMIT:
        _TOOLS_JSON.clear()
    _TOOLS_JSON[key] = (tuple(t.parameters for t in tools), found)
    return found


def encode_request(request: ChatRequest, form: WireForm = NATIVE) -> bytes:
    """`build_request`'s body as the JSON bytes sent (what httpx's `json=` would send),
    built from per-message encodings that are reused from one model call to the next."""
    messages, tools, params = request.messages, request.tools, request.params
    if form.json_mode or params.response_schema is not None:
        return _dumps(build_request(request, form)).encode()
    _check_roles(messages)
    rest = _options(params, form)
    parts = ['{"model":', _dumps(request.model), ',"messages":[']
    parts.append(",".join([_message_json(m) for m in messages]))
    parts.append("]")
    if tools:
        parts += [',"tools":', _tools_json(tools)]
        if params.tool_choice in ("none", "required"):
            parts.append(f',"tool_choice":"{params.tool_choice}"')
    if rest:
        parts += [",", _dumps(rest)[1:-1]]
    parts.append("}")
    return "".join(parts).encode()


MAX_JOINING_MODELS = 64
"""Models remembered as wanting strictly alternating turns: a caller names the model, so the
set is bounded; past it a refused call is still sent again joined, each time."""


def joined_user_turns(body: bytes) -> bytes | None:
    """`body` with each run of adjacent user turns of text joined into one (a blank line
    between them), for a chat template that wants user and assistant turns to alternate;
    None when no two user turns are adjacent."""
    data = json.loads(body)
    messages = data.get("messages") or []
    joined: list[dict[str, Any]] = []
    for m in messages:
        last = joined[-1] if joined else None
        if (
            last is not None
            and m.get("role") == last.get("role") == "user"
            and isinstance(m.get("content"), str)
            and isinstance(last.get("content"), str)
        ):
            joined[-1] = {**last, "content": f"{last['content']}\n\n{m['content']}"}
        else:
            joined.append(m)
    if len(joined) == len(messages):
        return None
    return _dumps({**data, "messages": joined}).encode()


# -- answer parsing --------------------------------------------------------------------------


class BadResponse(Exception):
    """The runtime's answer cannot be read; the message says why (never echoes the key)."""


class BadModelOutput(BadResponse):
    """The runtime's answer is a well-formed completion, but the model's JSON-mode content
    in it cannot be read (`parse_json_mode`): the model's output, not a runtime failure, so
    no outage for the breaker (the runtime answered)."""


def new_call_id() -> str:
    """An id for a tool call the runtime sent without one (JSON mode, lax servers)."""
    return "call_" + secrets.token_hex(12)


def _strip_fence(text: str) -> str:
    body = text.strip()
    if body.startswith("```"):
        body = body[3:]
        if body[:4].lower() == "json":
            body = body[4:]
        body = body.removesuffix("```") if body.rstrip().endswith("```") else body
        body = body.strip().removesuffix("```").strip()
    return body


_NAMED_CALL = re.compile(r'\{\s*"tool_name"\s*:\s*"([^"\\]{1,200})"')
"""The opening of a JSON-mode tool call that names its tool, read where the rest does not
parse (`parse_json_mode`)."""


def parse_json_mode(text: str) -> tuple[str, tuple[ToolCall, ...]]:
    """(answer text, tool calls) from a JSON-mode answer; raises BadModelOutput when
    unreadable.

    The rule is in the module docstring.
    """
    body = _strip_fence(text)
    if not body:
        raise BadModelOutput("the model's JSON-mode answer is empty")
    if body[0] not in "{[":
        return text.strip(), ()
    try:
        value, _ = json.JSONDecoder().raw_decode(body)
    except ValueError:
        named = _NAMED_CALL.match(body)
        if named is not None:
            return "", (ToolCall(id=new_call_id(), name=named.group(1).strip(), arguments=body),)
        raise BadModelOutput("the model's JSON-mode answer is not valid JSON") from None
    if isinstance(value, dict):
        name = value.get("tool_name")
        if isinstance(name, str) and name.strip():
            arguments = value.get("arguments", {})
            if isinstance(arguments, str):
                arguments_text = arguments
            else:
                arguments_text = json.dumps(arguments, ensure_ascii=False)
            return "", (ToolCall(id=new_call_id(), name=name.strip(), arguments=arguments_text),)
        answer = value.get("answer")
        if isinstance(answer, str):
            return answer, ()
    raise BadModelOutput(
        'the model\'s JSON-mode answer has neither "tool_name" nor a string "answer"'
    )


_TAGGED_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_FENCED_JSON = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.S)


def _written_call(body: str, offered: frozenset[str]) -> ToolCall | None:
    """One ``{"name"|"tool_name": <offered tool>, "arguments"|"parameters": {...}}``."""
    try:
        value, end = json.JSONDecoder().raw_decode(body.strip())
    except ValueError:
        return None
    if not isinstance(value, dict) or body.strip()[end:].strip():
        return None
    fn = value.get("function")
    if isinstance(fn, dict):  # {"function": {"name": ..., "arguments": ...}}
        value = fn
    name = value.get("name", value.get("tool_name"))
    if not isinstance(name, str) or name.strip() not in offered:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        text = arguments
    elif isinstance(arguments, dict):
        text = json.dumps(arguments, ensure_ascii=False)
    else:
        return None
    return ToolCall(id=new_call_id(), name=name.strip(), arguments=text)


def content_tool_calls(content: str, offered: frozenset[str]) -> tuple[ToolCall, ...]:
    """Tool calls a model wrote into its message text instead of ``tool_calls``.

    Small models offered native tools often answer with the call as JSON: the whole text, a
    Markdown ```json block, or Hermes-style ``<tool_call>…</tool_call>`` tags. It is taken as
    a call only when it names one of the `offered` tools and nothing but the call is written
    (prose around a fenced block is allowed); anything else stays the answer.
    """
    text = content.strip()
    if not offered or not text:
        return ()
    tagged = _TAGGED_CALL.findall(text)
    if tagged:
        calls = [_written_call(body, offered) for body in tagged]
        return tuple(c for c in calls if c is not None) if all(calls) else ()
    fenced = _FENCED_JSON.findall(text)
    if len(fenced) == 1:
        call = _written_call(fenced[0], offered)
        return (call,) if call else ()
    if text.startswith("{"):
        call = _written_call(text, offered)
        return (call,) if call else ()
    return ()


_ANSWER_OPENING = re.compile(r'^\{\s*"answer"\s*:\s*"')


def held_to_stop(completion: Completion, stop: Sequence[str]) -> Completion:
    """A JSON-mode answer ended before the first of the caller's `stop` sequences. They are
    not sent to the runtime in JSON mode: one would end the ``{"answer": …}`` object before it
    closes, and nothing could be read."""
    cut = before_stop(completion.content, stop) if not completion.tool_calls else None
    return completion if cut is None else replace(completion, content=cut, finish_reason="stop")


def truncated_answer(text: str) -> str | None:
    """The answer text of a JSON-mode ``{"answer": "...`` that max_tokens cut off ("" when
    the cut left none of it), or None when the text is not one (a cut tool call stays
    unreadable: its arguments are lost)."""
    body = _strip_fence(text)
    opening = _ANSWER_OPENING.match(body)
    if opening is None:
        return None
    rest = body[opening.end() :]
    for end in range(len(rest), max(len(rest) - 8, -1), -1):
        try:  # drop a cut escape sequence (\u04, a lone backslash) at the end
            value = json.loads(f'"{rest[:end]}"')
        except ValueError:
            continue
        return value.rstrip() + "…" if value.strip() else ""
    return None


def _tool_call(raw: Any, index: int) -> ToolCall:
    if not isinstance(raw, dict):
        raise BadResponse(f"tool_calls[{index}] is not an object")
    fn = raw.get("function")
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str) or not name:
        raise BadResponse(f"tool_calls[{index}] has no function name")
    assert isinstance(fn, dict)
    arguments = fn.get("arguments")
    if arguments is None:
        arguments = ""
    elif not isinstance(arguments, str):  # some servers send the object itself
        arguments = json.dumps(arguments, ensure_ascii=False)
    call_id = raw.get("id")
    return ToolCall(
        id=valid_text(call_id) if isinstance(call_id, str) and call_id else new_call_id(),
        name=valid_text(name),
        arguments=arguments,
    )


def _count(usage: Any, name: str) -> int | None:
    """A token count the usage object gives, None when it gives none (or no usable one: not
    a whole number in 0..MAX_TOKEN_COUNT)."""
    value = usage.get(name) if isinstance(usage, dict) else None
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    return value if 0 <= value <= MAX_TOKEN_COUNT else None


def _tokens(usage: Any, name: str) -> int:
    return _count(usage, name) or 0


def _cached_tokens(usage: Any) -> int:
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    return _tokens(details, "cached_tokens")


def _finish(
    content: str,
    calls: tuple[ToolCall, ...],
    finish_reason: Any,
    usage: Any,
    model: str,
    json_mode: bool,
    offered: frozenset[str] = frozenset(),
) -> Completion:
    if json_mode and not calls:
        try:
            content, calls = parse_json_mode(content)
        except BadResponse:
            cut = truncated_answer(content) if finish_reason == LENGTH else None
            if cut is None:
                raise
            content = cut
    elif offered and not calls:
        calls = content_tool_calls(content, offered)
        if calls:
            content = ""
    reason = finish_reason if isinstance(finish_reason, str) and finish_reason else "stop"
    if calls and reason == "stop":
        reason = "tool_calls"
    return Completion(
        content=valid_text(content),
        tool_calls=calls,
        finish_reason=reason,
        prompt_tokens=_tokens(usage, "prompt_tokens"),
        completion_tokens=_count(usage, "completion_tokens"),
        model=model,
        cached_prompt_tokens=_cached_tokens(usage),
    )


def parse_completion(
    payload: Any, *, model: str, json_mode: bool, offered: frozenset[str] = frozenset()
) -> Completion:
    """A Completion from a ``chat.completion`` object; raises BadResponse when unreadable."""
    if not isinstance(payload, dict):
        raise BadResponse("the answer is not a JSON object")
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise BadResponse("the answer has no choices")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise BadResponse("choices[0].message is not an object")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise BadResponse("choices[0].message.content is not a string")
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise BadResponse("choices[0].message.tool_calls is not an array")
    calls = tuple(_tool_call(c, i) for i, c in enumerate(raw_calls))
    answered = payload.get("model")
    return _finish(
        content or "",
        calls,
        choices[0].get("finish_reason"),
        payload.get("usage"),
        answered if isinstance(answered, str) and answered else model,
        json_mode,
        offered,
    )


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class StreamAssembler:
    """Folds ``chat.completion.chunk`` objects into text deltas and the final Completion.

    Tool-call fragments are joined by their ``index`` (id and name from the first fragment
    that has them, arguments concatenated), as the official client does.
    """

    model: str
    json_mode: bool = False
    offered: frozenset[str] = frozenset()
    """Tools offered in native mode: text that is a call of one of them is taken as one."""
    content: list[str] = field(default_factory=list)
    calls: dict[int, _PartialCall] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: Any = None

    def feed(self, chunk: Any) -> str:
        """Take one chunk; returns its content text ("" when none). Raises BadResponse."""
        if not isinstance(chunk, dict):
            raise BadResponse("a stream chunk is not a JSON object")
        if "error" in chunk:
            raise BadResponse("the runtime reported an error in the stream")
        if isinstance(chunk.get("model"), str) and chunk["model"]:
            self.model = chunk["model"]
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise BadResponse("a stream chunk's choices is not an array")
        text = ""
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if isinstance(choice.get("finish_reason"), str):
                self.finish_reason = choice["finish_reason"]
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise BadResponse("a stream chunk's delta is not an object")
            piece = delta.get("content")
            if isinstance(piece, str) and piece:
                piece = valid_text(piece)
                self.content.append(piece)
                text += piece
            for fragment in delta.get("tool_calls") or []:
                self._fold(fragment)
        return text

    def _fold(self, fragment: Any) -> None:
        if not isinstance(fragment, dict):
            raise BadResponse("a tool-call fragment is not an object")
        index = fragment.get("index", len(self.calls))
        if not isinstance(index, int):
            raise BadResponse("a tool-call fragment has no integer index")
        call = self.calls.setdefault(index, _PartialCall())
        if isinstance(fragment.get("id"), str) and fragment["id"] and not call.id:
            call.id = fragment["id"]
        fn = fragment.get("function") or {}
        if isinstance(fn, dict):
            if isinstance(fn.get("name"), str):
                call.name += fn["name"]
            if isinstance(fn.get("arguments"), str):
                call.arguments.append(fn["arguments"])

    def completion(self) -> Completion:
        """The assembled Completion (raises BadResponse for a call without a name)."""
        calls = []
        for index in sorted(self.calls):
            c = self.calls[index]
            if not c.name:
                raise BadResponse(f"streamed tool call {index} has no function name")
            calls.append(
                ToolCall(
                    id=valid_text(c.id) or new_call_id(),
                    name=valid_text(c.name),
                    arguments="".join(c.arguments),
                )
            )
        return _finish(
            "".join(self.content),
            tuple(calls),
            self.finish_reason,
            self.usage,
            self.model,
            self.json_mode,
            self.offered,
        )


# -- the client ------------------------------------------------------------------------------


BUSY = "busy"
"""The `kind` of a call that found no free connection to the runtime in time: every one was
taken by the service's other calls. The service is busy, not the runtime failing."""
DEADLINE = "deadline"
"""The `kind` of a call its caller's deadline ended with no word on the runtime
(`OpenAiChatRuntime._cut_by_caller`)."""


class _Failure(AttemptFailed):
    """One failed attempt: the error to raise if it is the last, whether to retry, and its
    verdict on the runtime for the breaker (OUTAGE, ANSWERED or NO_VERDICT; unless given, a
    timeout's is TIMEOUT, which the breaker judges by the process's own stalls)."""

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        status: int | None = None,
        retry: bool = False,
        verdict: str | None = None,
        delay: float | None = None,
    ) -> None:
        super().__init__(message, retry=retry, delay=delay)
        self.kind = kind
        self.message = message
        self.status = status
        if verdict is None:
            verdict = TIMEOUT if kind == "timeout" else OUTAGE
        self.breaker_verdict = verdict
        self.attempts = 1

    def error(self, attempts: int, runtime: str) -> errors.ServiceError:
        """What the caller is told: UNAVAILABLE LLM_RUNTIME_ERROR for the runtime's failures;
        RESOURCE_EXHAUSTED SERVER_BUSY when no connection was free (`attempts` then counts
        only those that reached the runtime); DEADLINE_EXCEEDED when the caller's deadline
        ended the call."""
        if self.kind == BUSY:
            attempts -= 1
        metadata = {"kind": self.kind, "attempts": str(attempts), "runtime": runtime}
        if self.status is not None:
            metadata["status"] = str(self.status)
        message = self.message
        if self.delay is not None:  # the runtime's Retry-After: when to try again
            wait = whole_seconds(self.delay)
            metadata["retry_after_s"] = str(wait)
            message += f"; it asks to wait {wait} s"
        if self.kind == BUSY:
            return errors.ResourceExhaustedError(
                message, reason=errors.SERVER_BUSY, metadata=metadata
            )
        if self.kind == DEADLINE:
            return errors.DeadlineExceededError(message, metadata=metadata)
        return errors.UnavailableError(message, reason=LLM_RUNTIME_ERROR, metadata=metadata)


def _unreadable(exc: BadResponse) -> _Failure:
    """The failure of an answer that cannot be read: ``bad_response`` either way, but only a
    broken envelope (no chat completion: HTML from a proxy, no choices, ...) is the runtime
    failing; a completion whose JSON-mode content does not parse (`BadModelOutput`) is the
    model's output from a runtime that answered: ANSWERED, like a 4xx, so that a model's bad
    turns never open the breaker for every tenant."""
    verdict = ANSWERED if isinstance(exc, BadModelOutput) else OUTAGE
    return _Failure(
        "bad_response", f"LLM runtime sent an unreadable answer: {exc}", verdict=verdict
    )


def _log_retry(failed: _Failure, attempt: int, delay: float) -> None:
    log.warning(
        "llm runtime attempt failed; retrying",
        extra={"attempt": attempt, "kind": failed.kind, "status": failed.status,
               "delay_s": delay},
    )  # fmt: skip


def _status_failure(
    status: int, retry_after: str | None = None, *, label: str = "", detail: str = ""
) -> _Failure:
    """The failure of an answer with HTTP `status` (or of a 200 answer carrying an error the
    runtime reported as `status`: `label` then says so, instead of "HTTP <status>"). `detail`,
    the runtime's own message (`_error_text`), is appended, except to a refusal of the
    credentials."""
    label = label or f"HTTP {status}"
    said = f": {detail}" if detail else ""
    if status in TRANSIENT_STATUSES:
        # A wait over the policy's max_retry_after_s ends the run at once.
        return _Failure(
            "overloaded",
            f"LLM runtime is overloaded ({label}){said}",
            status=status,
            retry=True,
            delay=retry_after_seconds(retry_after),
        )
    if status in (401, 403):
        # The runtime's own message may quote part of the key: it is not passed on.
        return _Failure(
            "rejected",
            f"LLM runtime refused the credentials ({label})",
            status=status,
            verdict=ANSWERED,
        )
    if 400 <= status < 500:
        return _Failure(
            "rejected", f"LLM runtime rejected the request ({label}){said}", status=status,
            verdict=ANSWERED,
        )  # fmt: skip
    return _Failure("bad_response", f"LLM runtime answered {label}{said}", status=status)


def _error_text(err: Any, secret: str | None) -> str:
    """The message of the runtime's error object (short, one line, key scrubbed, no lone
    surrogates); "" when it has none."""
    text = err.get("message") if isinstance(err, dict) else None
    if not isinstance(text, str):
        return ""
    text = valid_text(" ".join(text.split())[:300])
    return text.replace(secret, "***") if secret else text


def _detail(content: bytes, secret: str | None) -> str:
    """The runtime's error message (short, one line, key scrubbed) for 400/404/422 logs."""
    try:
        body = json.loads(content)
    except ValueError:
        return ""
    return _error_text(body.get("error") if isinstance(body, dict) else None, secret)


def answer_error(content: bytes) -> dict[str, Any] | None:
    """The error object of a 200 answer that is the runtime's error instead of a completion
    (proxy-style runtimes, OpenRouter, LiteLLM, vLLM, answer an upstream failure so):
    ``{"error": {"message", "type", "code"}}`` (or ``{"error": "<message>"}``) or vLLM's
    ``{"object": "error", "message", "type", "code"}``, with no ``choices``; None for any
    other body (a completion, or one `parse_completion` judges)."""
    if b'"error"' not in content:  # a completion's text never holds it unescaped
        return None
    try:
        payload = json.loads(content)
    except ValueError:
        return None
    if not isinstance(payload, dict) or payload.get("choices"):
        return None
    err = payload.get("error")
    if isinstance(err, dict):
        return err
    if isinstance(err, str) and err.strip():
        return {"message": err}
    if payload.get("object") == "error":
        return payload
    return None


def error_status(err: dict[str, Any]) -> int | None:
    """The HTTP status a runtime's error object names in its ``code`` (a number, or digits,
    within 400..599); None when it names none (a ``server_error``, a code such as
    ``"model_not_found"``)."""
    code = err.get("code")
    if isinstance(code, str) and code.strip().isdigit():
        code = int(code)
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 599:
        return code
    return None


_TAG_OPEN = "<tool_call>"
_FENCE = "```"
_FENCE_OPENING = re.compile(r"```(?:json)?\s*")


def _fence_kind(text: str, at: int) -> str:
    """What the fence opening at `at` holds: "json" (optionally a ``json`` tag, then ``{``:
    a call `_FENCED_JSON` may read), "tag" (a ``<tool_call>`` tag opens its first line),
    "plain" (anything else: a code block), or "open" (the text ends before that shows)."""
    start = at + len(_FENCE)
    tail = text[start : start + 4]
    if len(tail) < 4 and "json".startswith(tail):
        return "open"
    info = _FENCE_OPENING.match(text, at)
    end = info.end() if info else start
    if end >= len(text):
        return "open"
    if text[end] == "{":
        return "json"
    line = text.find("\n", start)  # the block's first line, after the language name
    first = len(text) if line < 0 else line + 1 + _leading_space(text, line + 1)
    head = text[first : first + len(_TAG_OPEN)]
    if first >= len(text) or (_TAG_OPEN.startswith(head) and len(head) < len(_TAG_OPEN)):
        return "open"
    return "tag" if head == _TAG_OPEN else "plain"


def _leading_space(text: str, at: int) -> int:
    """How many whitespace characters stand at `at`."""
    return len(text) - at - len(text[at:].lstrip())


class _Holdback:
    """Streamed text that may be a tool call the model wrote out (see `content_tool_calls`)
    is held back until it plainly is not one: an answer that opens with ``{``, and within
    the text a ``<tool_call>`` tag or a fenced block from its opening until it closes. Text
    from a call on is held to the end; `rest` is what the stream has not yet sent, for the
    caller to send when the completed answer is text after all."""

    def __init__(self, offered: frozenset[str]) -> None:
        self._offered = offered
        self._held: list[str] = []  # the text not sent
        self._seen = 0  # characters of it known to be plain text
        self._started = False  # some text was sent
        self._call = False  # a written call has begun: nothing more is sent

    def release(self, piece: str) -> str:
        """What of the text so far can go out now ("" while it is held)."""
        if not self._offered:
            return piece
        self._held.append(piece)
        if self._call:
            return ""
        text = "".join(self._held)
        end = self._plain_end(text)
        self._held, self._seen = [text[end:]], self._seen - end
        self._started = self._started or end > 0
        return text[:end]

    def rest(self) -> str:
        """The text not sent."""
        return "".join(self._held)

    def _plain_end(self, text: str) -> int:
        """Where the text that cannot be part of a written call ends."""
        if not self._started and text.lstrip()[:1] in ("", "{"):
            self._call = text.lstrip()[:1] == "{"  # the whole answer may be a call
            return 0
        i = self._seen
        while True:
            j = min((k for k in (text.find("<", i), text.find("`", i)) if k >= 0), default=-1)
            if j < 0:
                self._seen = len(text)
                return len(text)
            self._seen = j
            if text[j] == "<":
                opening = text[j : j + len(_TAG_OPEN)]
                if not _TAG_OPEN.startswith(opening):
                    i = j + 1
                    continue
                self._call = opening == _TAG_OPEN
                return j  # a tag, or what may become one
            if not _FENCE.startswith(text[j : j + len(_FENCE)]):
                i = j + 1
                continue
            kind = _fence_kind(text, j)
            if kind in ("open", "tag"):
                self._call = kind == "tag"  # a call written as a tag inside a fence
                return j  # (or not yet known what the fence holds, or whether it is one)
            if kind == "json":  # may be a call written as a JSON block: held until it closes
                close = text.find(_FENCE, j + len(_FENCE))
                if close < 0:
                    return j
                call = _FENCED_JSON.match(text, j, close + len(_FENCE))
                if call and _written_call(call.group(1), self._offered):
                    self._call = True
                    return j
            # A code block (or JSON that is no call) streams; a tag inside it is still a call.
            i = j + len(_FENCE)


def _is_json(response: httpx.Response) -> bool:
    """Whether a 200 to a stream is one JSON answer (a chat.completion from a server that
    ignores ``stream: true``, or the runtime's error), not an event stream."""
    return response.headers.get("content-type", "").startswith("application/json")


class _Progress:
    """When a streamed answer last showed the runtime at work: its 200, then each chunk of
    its body (a clock reading; None before the 200)."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: float | None = None


class OpenAiChatRuntime:
    """`ChatRuntime` over an OpenAI-compatible ``/v1/chat/completions`` (see module docstring).

    The HTTP client, clock (monotonic seconds) and sleep are injected; tests step time.
    """

    def __init__(
        self,
        settings: RuntimeSettings,
        http: httpx.AsyncClient,
        *,
        breaker: CircuitBreaker | None = None,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.settings = settings
        self.name = settings.default_model
        self._http = http
        self._clock = clock
        self._sleep = sleep
        self._url = settings.endpoint
        # Parsed once, not at every request (httpx would parse the string each time).
        self._request_url: httpx.URL | str = self._url
        try:
            self._request_url = httpx.URL(self._url)
        except (httpx.InvalidURL, TypeError, ValueError):
            pass  # left to httpx at request time, where it was always reported
        self.breaker = breaker or CircuitBreaker(
            "llm-runtime",
            settings.breaker,
            clock=clock,
        )
        self._joining: set[str] = set()
        """The models whose runtime refused adjacent user turns (`_send_turns`)."""
        # The wire forms of this runtime's calls (JSON mode or not, streamed or not).
        self._forms = {
            (json_mode, stream): WireForm(
                json_mode, settings.json_schema, stream, settings.stream_usage
            )
            for json_mode in (False, True)
            for stream in (False, True)
        }

    def __repr__(self) -> str:
        return (
            f"OpenAiChatRuntime(url={self._url!r}, model={self.name!r}, "
            f"json_mode={self.settings.enable_json_mode})"
        )

    # -- the port ----------------------------------------------------------------------------

    async def complete(self, request: ChatRequest, *, timeout_s: float) -> Completion:
        """One completion. `timeout_s` bounds the call including its retry; `request.model`
        overrides DEFAULT_MODEL_NAME. Raises UnavailableError(LLM_RUNTIME_ERROR) on any runtime
        failure, ValueError for messages the port does not allow (unknown role, tool without
        id)."""
        start = self._clock()
        model, body, json_mode, offered = self._prepare(request, False)
        budget_s = min(timeout_s, self.settings.timeout_s)
        ticket = self._enter(timeout_s)
        attempts = 0
        try:
            _, content, attempts = await self._send_turns(
                model, body, start, budget_s, stream=False
            )
            completion = self._completion(content, model, json_mode, offered, request)
        except _Failure as failed:
            attempts = attempts or failed.attempts
            self.breaker.settle(failed, ticket)
            self._log("error", model, start, attempts, kind=failed.kind, status=failed.status)
            raise failed.error(attempts, self.name) from None
        except asyncio.CancelledError:
            self._cut_short(ticket, model, start, budget_s, timeout_s, attempts)
            raise
        except BaseException as exc:
            # A bug: counted, so a half-open trial is not left taken.
            self.breaker.settle(exc, ticket)
            raise
        self._answered(ticket, model, completion, start, attempts)
        return completion

    async def stream(
        self, request: ChatRequest, *, timeout_s: float
    ) -> AsyncGenerator[StreamEvent, None]:
        """Text deltas as the runtime sends them, then the assembled Completion.

        Retries (once) only before the first chunk; a failure after it raises
        UnavailableError(LLM_RUNTIME_ERROR). In JSON mode the deltas would be JSON text, so
        the answer is yielded as one delta once the whole object has arrived.
        """
        start = self._clock()
        model, body, json_mode, offered = self._prepare(request, True)
        budget_s = min(timeout_s, self.settings.timeout_s)
        deadline = start + budget_s
        ticket = self._enter(timeout_s)
        attempts = 0
        response: httpx.Response | None = None
        settled = False
        progress = _Progress()
        try:
            response, content, attempts = await self._send_turns(
                model, body, start, budget_s, stream=True
            )
            if _is_json(response):
                # A server that ignores `stream: true` answers with one chat.completion.
                completion = self._completion(content, model, json_mode, offered, request)
                self.breaker.settle(None, ticket)
                settled = True
                self._log("ok", model, start, attempts, stream=False)
                if completion.content:
                    yield StreamDelta(completion.content)
                yield completion
                return
            progress.last = self._clock()  # the 200: the stream has begun
            assembler = StreamAssembler(model=model, json_mode=json_mode, offered=offered)
            holdback = _Holdback(offered)
            async for piece in self._stream_text(response, deadline, assembler, progress):
                if not json_mode and (piece := holdback.release(piece)):
                    yield StreamDelta(piece)
            try:
                completion = assembler.completion()
            except BadResponse as exc:
                raise _unreadable(exc) from None
            if json_mode:
                completion = held_to_stop(completion, request.params.stop)
            self._answered(ticket, model, completion, start, attempts, stream=True)
            settled = True
            if json_mode and completion.content:
                yield StreamDelta(completion.content)
            elif completion.content and (rest := holdback.rest()):
                yield StreamDelta(rest)
            yield completion
        except _Failure as failed:
            attempts = attempts or failed.attempts
            failed = self._judged(failed, start, budget_s, timeout_s, progress)
            self.breaker.settle(failed, ticket)
            self._log(
                "error", model, start, attempts, stream=True, kind=failed.kind,
                status=failed.status,
            )  # fmt: skip
            raise failed.error(attempts, self.name) from None
        except (asyncio.CancelledError, GeneratorExit):
            # Cancelled, or the consumer stopped reading: never a success, since a stream that
            # stalled after its 200 is the runtime failing (it is a timeout at the deadline).
            if not settled:
                self._cut_short(
                    ticket, model, start, budget_s, timeout_s, attempts, progress, stream=True
                )
            raise
        except BaseException as exc:
            # A bug: before the 200 it is counted (a half-open trial is not left taken);
            # after it, the runtime was answering.
            if not settled:
                self.breaker.settle(exc if response is None else None, ticket)
            raise
        finally:
            if response is not None:
                await response.aclose()

    # -- internals ---------------------------------------------------------------------------

    def _prepare(
        self, request: ChatRequest, stream: bool
    ) -> tuple[str, bytes, bool, frozenset[str]]:
        """(the model, the request body, JSON mode?, the tool names a written call may name)."""
        model = request.model or self.settings.default_model
        params = request.params
        if params.temperature is None and self.settings.temperature is not None:
            params = replace(params, temperature=self.settings.temperature)
        json_mode, tools, offered = self._wire_form(request.tools, params)
        body = encode_request(
            ChatRequest(request.messages, tools, params, model), self._forms[json_mode, stream]
        )
        return model, body, json_mode, offered

    async def _stream_text(
        self,
        response: httpx.Response,
        deadline: float,
        assembler: StreamAssembler,
        progress: _Progress,
    ) -> AsyncIterator[str]:
        """The answer text of each SSE chunk as it arrives; `assembler` collects the rest.
        Raises _Failure for an unreadable chunk or a stream that ends before it finished."""
        done = False
        async for data in self._events(response, deadline, progress):
            if data == "[DONE]":
                done = True
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                raise _Failure(
                    "bad_response", "LLM runtime sent an unreadable stream chunk"
                ) from None
            try:
                piece = assembler.feed(chunk)
            except BadResponse as exc:
                raise _Failure("bad_response", f"LLM runtime stream failed: {exc}") from None
            if piece:
                yield piece
        if not done and assembler.finish_reason is None:
            raise _Failure("unreachable", "LLM runtime stream ended before it finished")

    def _wire_form(
        self, tools: Sequence[ToolSpec], params: GenerationParams
    ) -> tuple[bool, Sequence[ToolSpec], frozenset[str]]:
        """(JSON mode?, the tools to send, the tool names a written call may name)."""
        if params.response_schema is not None:
            return False, (), frozenset()
        allow = params.tool_choice != "none"
        json_mode = self.settings.enable_json_mode
        if json_mode and not self.settings.json_schema and not allow:
            # json_object cannot forbid a call: the answer-only instruction must.
            tools = ()
        offered = frozenset(t.name for t in tools) if allow and not json_mode else frozenset()
        return json_mode, tools, offered

    def _enter(self, timeout_s: float) -> Ticket:
        """The breaker's Ticket for one call; UnavailableError when there is no time left or
        the breaker is open."""
        if not timeout_s > 0:
            raise _Failure("timeout", "no time left to call the LLM runtime").error(0, self.name)
        try:
            return self.breaker.before_call()
        except CircuitOpenError as exc:
            self._log("circuit_open", self.settings.default_model, self._clock(), 0)
            raise errors.UnavailableError(
                "LLM runtime is unavailable: too many recent failures; "
                f"next try in {exc.retry_after_s} s",
                reason=LLM_RUNTIME_ERROR,
                metadata={"kind": "circuit_open", "attempts": "0", "runtime": self.name},
            ) from None

    def _cut_short(
        self,
        ticket: Ticket,
        model: str,
        start: float,
        budget_s: float,
        timeout_s: float,
        attempts: int,
        progress: _Progress | None = None,
        **extra: Any,
    ) -> None:
        """Settle a call its caller ended before the runtime had answered. Before the call's
        deadline that says nothing about the runtime (the caller went away): no verdict. At
        the deadline it is judged as the client's own timer's end would be (the caller's
        timer set to the same instant fires first): see `_cut_by_caller`."""
        at_deadline = self._at_deadline(start, budget_s)
        if not at_deadline or self._cut_by_caller(budget_s, timeout_s, progress):
            self.breaker.release(ticket)
            # A line for every call, this one too: its caller stopped reading (the tool loop
            # closing a runaway answer, a request cancelled) or its deadline ended it.
            self._log("closed", model, start, attempts or 1, **extra)
            return
        failed = _Failure("timeout", "LLM runtime did not answer in time")
        self.breaker.settle(failed, ticket)
        self._log("error", model, start, attempts or 1, kind=failed.kind, **extra)

    def _at_deadline(self, start: float, budget_s: float) -> bool:
        """Whether a call begun at `start` with `budget_s` seconds has reached its deadline."""
        return self._clock() >= start + budget_s - DEADLINE_SLACK_S

    def _cut_by_caller(self, budget_s: float, timeout_s: float, progress: _Progress | None) -> bool:
        """Whether a call ended at its deadline says nothing about the runtime, its caller's
        deadline having ended it (docs/operations.md, "Failure handling"): a deadline shorter
        than LLM_RUNTIME_TIMEOUT_S that left the call under MIN_VERDICT_S (a caller with tiny
        deadlines must not open the breaker for everyone), or that cut a stream the runtime
        was still sending (its last chunk, or its 200, within `stall_s`). A call the runtime's
        own timeout ended, a stream that had stalled, and any other call the caller's
        deadline gave MIN_VERDICT_S or more are the runtime's timeout."""
        if timeout_s >= self.settings.timeout_s:
            return False
        if budget_s < MIN_VERDICT_S:
            return True
        last = None if progress is None else progress.last
        return last is not None and self._clock() - last < self.settings.stall_s

    def _judged(
        self, failed: _Failure, start: float, budget_s: float, timeout_s: float, progress: _Progress
    ) -> _Failure:
        """`failed`, or, for a stream's timeout at a deadline its caller's ended
        (`_cut_by_caller`), the caller's deadline: no verdict, DEADLINE_EXCEEDED."""
        if failed.kind != "timeout" or not self._at_deadline(start, budget_s):
            return failed
        if not self._cut_by_caller(budget_s, timeout_s, progress):
            return failed
        judged = _Failure(
            DEADLINE,
            "the caller's deadline passed while the LLM runtime was answering",
            verdict=NO_VERDICT,
        )
        judged.attempts = failed.attempts
        return judged

    def _headers(self, stream: bool) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream" if stream else "application/json",
        }
        if self.settings.api_key:
            headers["Authorization"] = f"Bearer {self.settings.api_key}"
        return headers

    async def _send_turns(
        self, model: str, body: bytes, start: float, budget_s: float, *, stream: bool
    ) -> tuple[httpx.Response, bytes, int]:
        """`_send`, adjacent user turns joined for a model whose runtime refused them: a chat
        template that wants user and assistant turns to alternate strictly (Mistral's, Llama
        2's) answers 400 to the loop's notes and JSON mode's tool results, which are user
        turns of their own. The refusal is met once per model (remembered for up to
        MAX_JOINING_MODELS of them), then every call of that model is sent joined."""
        if model in self._joining and (joined := joined_user_turns(body)) is not None:
            body = joined
        try:
            return await self._send(body, start, budget_s, stream=stream)
        except _Failure as failed:
            if failed.kind != "rejected" or failed.status not in (400, 422):
                raise
            if model in self._joining or (joined := joined_user_turns(body)) is None:
                raise
            status = failed.status
        answered = await self._send(joined, start, budget_s, stream=stream)
        # Remembered once the joined call is answered: a 400 of another cause (a prompt too
        # long) is no sign of a strict template.
        if len(self._joining) < MAX_JOINING_MODELS:
            self._joining.add(model)
        log.warning(
            "llm runtime refused adjacent user turns and took them joined; joining them for "
            "this model",
            extra={"model": model, "status": status},
        )
        return answered

    async def _send(
        self, body: bytes, start: float, budget_s: float, *, stream: bool
    ) -> tuple[httpx.Response, bytes, int]:
        """A 200 response, its body (b"" for an event stream: left unread) and the attempts it
        took, all within `budget_s` seconds from `start`: no retry whose pause reaches past
        it."""
        deadline = start + budget_s
        (response, content), attempts = await run_with_retry(
            lambda: self._attempt(body, deadline, stream=stream),
            replace(self.settings.retry, deadline_s=budget_s),
            retry_on=_Failure,
            on_retry=_log_retry,
            clock=self._clock,
            sleep=self._pause,
            started=start,
        )
        return response, content, attempts

    async def _pause(self, delay: float) -> None:
        if delay > 0:
            await self._sleep(delay)

    async def _attempt(
        self, body: bytes, deadline: float, *, stream: bool
    ) -> tuple[httpx.Response, bytes]:
        remaining = deadline - self._clock()
        if remaining <= 0:
            raise _Failure("timeout", "LLM runtime did not answer in time")
        # No read or write timer of httpx's: the deadline (`stall_tolerant_timeout`) bounds
        # them, and one would fire first when the process resumes from a stall.
        timeout = httpx.Timeout(
            None,
            connect=min(remaining, self.settings.connect_timeout_s),
            pool=remaining - min(POOL_MARGIN_S, remaining / 2),
        )
        request = self._http.build_request(
            "POST", self._request_url, content=body, headers=self._headers(stream), timeout=timeout
        )
        try:
            async with stall_tolerant_timeout(remaining):
                response = await settled(
                    self._http.send(request, stream=True, follow_redirects=False),
                    orphan=httpx.Response.aclose,  # a response nobody will read
                )
        except httpx.PoolTimeout:
            # Every connection is taken by the service's other calls: no word on the runtime.
            raise _Failure(
                BUSY,
                "the LLM service is busy: no connection to the LLM runtime came free in time; "
                "retry later",
                verdict=NO_VERDICT,
            ) from None
        except (TimeoutError, httpx.TimeoutException):
            raise _Failure("timeout", "LLM runtime did not answer in time") from None
        except httpx.TransportError:
            raise _Failure("unreachable", "LLM runtime cannot be reached", retry=True) from None
        if response.status_code == 200 and stream and not _is_json(response):
            return response, b""
        try:
            content = await self._read_body(response, deadline)
        finally:
            await response.aclose()
        if response.status_code == 200:
            err = answer_error(content)
            if err is None:
                return response, content
            raise self._reported_failure(err, response)
        failed = _status_failure(response.status_code, response.headers.get("retry-after"))
        if failed.kind == "rejected" and response.status_code not in (401, 403):
            log.warning(
                "llm runtime rejected the request",
                extra={"status": response.status_code,
                       "detail": _detail(content, self.settings.api_key)},
            )  # fmt: skip
        raise failed

    def _reported_failure(self, err: dict[str, Any], response: httpx.Response) -> _Failure:
        """The failure of a 200 answer carrying the runtime's error `err` (`answer_error`):
        judged as the status its ``code`` names would be (`_status_failure`: retried, and
        counted by the breaker, alike), a ``server_error`` or one naming no status as a 500.
        The runtime's message reaches the error and the log (not for 401/403, whose
        message may quote the key)."""
        code = error_status(err)
        status = code or 500
        detail = "" if status in (401, 403) else _error_text(err, self.settings.api_key)
        failed = _status_failure(
            status,
            response.headers.get("retry-after"),
            label=f"HTTP 200 with error code {code}" if code else "HTTP 200 with an error",
            detail=detail,
        )
        failed.status = code or 200  # the status that arrived, unless the error named one
        log.warning(
            "llm runtime answered HTTP 200 with an error",
            extra={"status": 200, "error_code": code, "kind": failed.kind, "detail": detail},
        )
        return failed

    async def _read_body(self, response: httpx.Response, deadline: float) -> bytes:
        """The body, read within the deadline; more than MAX_RESPONSE_BYTES is refused."""
        try:
            remaining = max(0.0, deadline - self._clock())
            async with stall_tolerant_timeout(remaining):
                read = read_capped(response, MAX_RESPONSE_BYTES)
                # Past the deadline (the answer came in a stall's grace) a body in hand is read
                # inline, with no suspension for the timer to cut; else in a task of its own.
                body = await (settled(read) if remaining > 0 else read)
        except (TimeoutError, httpx.TimeoutException):
            raise _Failure("timeout", "LLM runtime did not answer in time") from None
        except httpx.TransportError:
            raise _Failure(
                "unreachable", "LLM runtime dropped the connection", retry=True
            ) from None
        except httpx.DecodingError:
            raise _Failure("bad_response", "LLM runtime sent a body that does not decode") from None
        if body is None:
            raise _Failure("bad_response", "LLM runtime sent an oversized answer")
        return body

    def _completion(
        self,
        content: bytes,
        model: str,
        json_mode: bool,
        offered: frozenset[str],
        request: ChatRequest,
    ) -> Completion:
        """The Completion of one chat.completion body: a call's answer, or a stream's from a
        server that ignores ``stream: true`` (in JSON mode held to `request`'s stop
        sequences); an unreadable one is a `_Failure` (`_unreadable`)."""
        try:
            completion = parse_completion(
                self._json(content), model=model, json_mode=json_mode, offered=offered
            )
        except BadResponse as exc:
            raise _unreadable(exc) from None
        return held_to_stop(completion, request.params.stop) if json_mode else completion

    @staticmethod
    def _json(content: bytes) -> Any:
        try:
            return json.loads(content)
        except ValueError:
            raise _Failure("bad_response", "LLM runtime sent an answer that is not JSON") from None

    async def _body_chunks(self, response: httpx.Response, deadline: float) -> AsyncIterator[bytes]:
        """A streamed body's chunks, each read within the deadline; more than
        MAX_RESPONSE_BYTES in all is refused, as `_read_body` refuses an answer."""
        chunks = response.aiter_bytes()
        size = 0
        while True:
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise _Failure("timeout", "LLM runtime did not finish in time")
            try:
                async with stall_tolerant_timeout(remaining):
                    chunk = await settled(anext(chunks))
            except StopAsyncIteration:
                return
            except (TimeoutError, httpx.TimeoutException):
                raise _Failure("timeout", "LLM runtime did not finish in time") from None
            except httpx.TransportError:
                raise _Failure("unreachable", "LLM runtime dropped the stream") from None
            size += len(chunk)
            if size > MAX_RESPONSE_BYTES:
                raise _Failure("bad_response", "LLM runtime sent an oversized stream")
            yield chunk

    async def _events(
        self, response: httpx.Response, deadline: float, progress: _Progress
    ) -> AsyncIterator[str]:
        """The ``data:`` payloads of an SSE body (`_body_chunks`: the deadline, the size),
        each one's arrival kept in `progress`: a comment (a proxy's keep-alive while the model
        is stuck) is no sign of the runtime at work."""
        data: list[str] = []
        async for line in sse_lines(self._body_chunks(response, deadline)):
            if not line:
                if data:
                    progress.last = self._clock()
                    yield "\n".join(data)
                    data = []
                continue
            if line.startswith(":"):
                continue  # an SSE comment (keep-alive)
            field_name, _, value = line.partition(":")
            if field_name == "data":
                data.append(value.removeprefix(" "))
        if data:
            progress.last = self._clock()
            yield "\n".join(data)

    def _answered(
        self, ticket: Ticket, model: str, completion: Completion, start: float, attempts: int,
        **extra: Any,
    ) -> None:  # fmt: skip
        """A call that answered: a success for the breaker, and its "ok" line with the counts."""
        self.breaker.settle(None, ticket)
        self._log(
            "ok",
            model,
            start,
            attempts,
            **extra,
            prompt_tokens=completion.prompt_tokens,
            completion_tokens=completion.completion_tokens,
            tool_calls=len(completion.tool_calls),
        )

    def _log(self, outcome: str, model: str, start: float, attempts: int, **extra: Any) -> None:
        # A call that went well is one step of the request: DEBUG (the tool loop logs one
        # INFO line per request with every step's latency). Failures stay at INFO.
        level = logging.DEBUG if outcome == "ok" else logging.INFO
        if not log.isEnabledFor(level):
            return
        log.log(
            level,
            "llm runtime call",
            extra={
                "outcome": outcome,
                "model": model,
                "attempts": attempts,
                "latency_ms": int((self._clock() - start) * 1000),
                "breaker": self.breaker.state,
                **{k: v for k, v in extra.items() if v is not None},
            },
        )
