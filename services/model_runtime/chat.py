"""The chat-model port: messages, tool calls, generation params and completions.

Implemented by the OpenAI-compatible runtime client (services/model_runtime/client.py) and
by the LLM service's built-in extractive responder; driven by the LLM service's tool loop
and by Retrieval's summaries and query variants.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

ROLES = ("system", "user", "assistant", "tool")
"""The roles of a chat message."""
SAMPLING_RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}
"""The sampling parameters an OpenAI-compatible chat completion takes, and their ranges."""
LLM_RUNTIME_ERROR = "LLM_RUNTIME_ERROR"
"""The reason of the UnavailableError a chat model's failure is (llm-service.md §9.1)."""


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stop: tuple[str, ...] = ()
    response_schema: dict[str, Any] | None = field(default=None, compare=False, hash=False)
    """Ask for one JSON object matching this JSON schema (constrained output); no tools."""
    tool_choice: str = "auto"
    """"auto": the offered tools may be called; "required": one must be; "none": they stay
    in the prompt (so its prefix is unchanged and the runtime's prompt cache still holds) but
    the model must answer."""


@dataclass(frozen=True)
class ToolCall:
    """A tool call the model asked for; `arguments` is the raw JSON text the model wrote."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ChatMessage:
    """One message of the conversation sent to the model (OpenAI chat roles)."""

    role: str  # "system" | "user" | "assistant" | "tool"
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""  # for role "tool": which call this answers
    name: str = ""  # for role "tool": the tool's name


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """`text` with every unpaired surrogate as U+FFFD. JSON may escape one ("\\ud800"), and
    json.loads keeps it, but no UTF-8 carries it: the tokenizer, protobuf and the stores refuse
    such text. A pair json.loads has already joined, so any surrogate left is unpaired."""
    return text if text.isascii() else _LONE_SURROGATE.sub("\ufffd", text)


def message_chars(message: ChatMessage) -> int:
    """Characters of text a message holds (what keeping it as a cache key keeps alive)."""
    n = len(message.content) + len(message.name) + len(message.tool_call_id)
    for call in message.tool_calls:
        n += len(call.id) + len(call.name) + len(call.arguments)
    return n


@dataclass(frozen=True)
class ToolSpec:
    """A tool offered to the model: its name, description and JSON-schema parameters."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)


LENGTH = "length"
"""A completion's finish_reason when max_tokens cut it."""
CONTENT_FILTER = "content_filter"
"""A completion's finish_reason when the runtime's filter withheld (some of) it."""


def before_stop(text: str, stop: Sequence[str]) -> str | None:
    """`text` up to the first of the `stop` sequences, as a runtime ends an answer there;
    None when none of them occurs in it."""
    cut = min((i for s in stop if s and (i := text.find(s)) >= 0), default=-1)
    return text[:cut] if cut >= 0 else None


@dataclass(frozen=True)
class Completion:
    """One model answer: text and/or tool calls, and the runtime's token counts."""

    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str = "stop"
    """The runtime's: "stop", LENGTH (cut at max_tokens), "tool_calls", "content_filter"."""
    prompt_tokens: int = 0
    """The runtime's count of the prompt; 0 when it gives none (no prompt is 0 tokens)."""
    completion_tokens: int | None = None
    """The runtime's count of the answer, 0 included (an empty answer); None when it gives
    none (no usage, or a usage without the key), so the caller estimates it."""
    model: str = ""
    cached_prompt_tokens: int = 0
    """Of prompt_tokens, those the runtime took from its prompt cache
    (``usage.prompt_tokens_details.cached_tokens``; 0 when it does not say)."""


@dataclass(frozen=True)
class StreamDelta:
    """A piece of answer text as the model produces it."""

    text: str


StreamEvent = StreamDelta | Completion
"""A stream yields deltas and ends with the assembled Completion."""


class ChatRequest(NamedTuple):
    """What one model call asks: the conversation, the tools offered and the generation
    params, for `model` (empty: the runtime's default). A NamedTuple, not a frozen
    dataclass: it is built at every model call, and a tuple builds in half the time."""

    messages: Sequence[ChatMessage]
    tools: Sequence[ToolSpec] = ()
    params: GenerationParams = GenerationParams()
    model: str = ""


class ChatRuntime(Protocol):
    """A chat model. A failed call (timeout, overload, malformed answer, breaker open)
    raises services.common.errors.UnavailableError with reason LLM_RUNTIME_ERROR (502).
    `timeout_s` bounds the whole call."""

    name: str

    async def complete(self, request: ChatRequest, *, timeout_s: float) -> Completion:
        """The model's answer: text and/or tool calls."""
        ...

    def stream(self, request: ChatRequest, *, timeout_s: float) -> AsyncIterator[StreamEvent]:
        """The answer's text as it is written (StreamDelta), then the whole Completion."""
        ...
