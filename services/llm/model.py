"""The LLM service's domain types: requests, tool calls and results, events."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from services.common.generate_contract import PlannedCall, ToolCallRecord, Turn, User
from services.model_runtime.chat import GenerationParams


@dataclass(frozen=True)
class ContextChunk:
    doc_id: str
    section_id: str
    text: str
    page_start: int = 0
    page_end: int = 0
    chunk_id: str = ""
    score: float = 0.0


@dataclass(frozen=True)
class Anchor:
    doc_id: str
    section_id: str
    anchor_chunk_id: str = ""


@dataclass(frozen=True)
class ToolPolicy:
    """What the caller allows the tool loop to do (docs/architecture.md §7)."""

    allowed_tools: tuple[str, ...] = ()
    anchors: tuple[Anchor, ...] = ()
    radius_schedule: tuple[int, ...] = (1,)
    max_tool_steps: int | None = None
    context_token_budget: int | None = None
    planned_calls: tuple[PlannedCall, ...] = ()
    """Run first, in order, before the model is asked; each counts as a tool step and each
    must be in `allowed_tools`. Their results reach the model as tool results."""
    require_tool_call: bool = False
    """The model's first step must be a tool call (it reads before it answers); ignored when
    nothing is offered or planned calls ran."""


@dataclass(frozen=True)
class GenerateInput:
    messages: tuple[Turn, ...]
    mode: str = "rag"
    system_prompt: str = ""
    context_chunks: tuple[ContextChunk, ...] = ()
    params: GenerationParams = field(default_factory=GenerationParams)
    user: User | None = None
    policy: ToolPolicy = field(default_factory=ToolPolicy)
    model: str = ""
    trace_id: str = ""
    answer_language: str = ""
    """"ru" or "en": every model call ends with that instruction, in that language."""


@dataclass(frozen=True)
class ToolResult:
    """What ToolsProxy answered: status ok with a result, or error with a code."""

    status: str
    result: dict[str, Any] | None = None
    error_code: str = ""
    error_message: str = ""


@dataclass(frozen=True)
class GenerateOutput:
    answer: str
    prompt_tokens: int
    completion_tokens: int
    tools_called: tuple[ToolCallRecord, ...]
    model_name: str
    latency_ms: int
    extractive: bool
    trace_id: str
    prompt_cached: int = 0
    """Prompt tokens the runtime reported it took from its prompt cache, over all calls."""
    final_prompt_tokens: int = 0
    """The last runtime call's prompt tokens."""
    runtime_ms: int = 0
    """Time spent waiting for the runtime, over all calls."""
    model_calls: int = 0
    withheld_for: tuple[str, ...] = ()
    """The question's names no document text read mentions: the model's answer was withheld
    and `answer` is the extractive one (services/llm/extractive.ungrounded_terms)."""
    finish_reason: str = "stop"
    """How the answer ended: "stop", "length" (cut at max_tokens) or "content_filter"."""


@dataclass(frozen=True)
class ToolRequest:
    """One tool call to run through ToolsProxy on `user`'s behalf (its ExecuteRequest)."""

    name: str
    arguments: dict[str, Any]
    user: User
    trace_id: str = ""


class ToolRunner(Protocol):
    """Executes a tool through ToolsProxy on the user's behalf."""

    async def execute(self, request: ToolRequest, *, timeout_s: float | None = None) -> ToolResult:
        """`timeout_s`: the call's deadline (None: the runner's default)."""
        ...


class EventSink(Protocol):
    """Receives streaming events: each step's text and a tool call event, executed or refused,
    for each of its tool calls (which ends the step)."""

    async def delta(self, text: str) -> None: ...

    async def tool_call(self, record: ToolCallRecord) -> None: ...
