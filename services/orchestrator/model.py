"""The orchestrator's domain types and the ports it calls through (no grpc here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from services.common.generate_contract import PlannedCall, ToolCallRecord, Turn, User
from services.common.search_contract import Filters


@dataclass(frozen=True)
class RespondInput:
    """A Respond request after the user context is resolved."""

    query: str
    user: User
    channel: str = ""
    locale: str = ""
    trace_id: str = ""
    filters: Filters = field(default_factory=Filters)
    max_results: int | None = None
    history: tuple[Turn, ...] = ()
    selected_doc_ids: tuple[str, ...] = ()
    """Documents the user attached to the question (the request's top-level doc_ids)."""
    safety_input: str = "allowed"
    """The gateway's input-safety verdict, passed through (orchestrator.md §6)."""


@dataclass(frozen=True)
class SectionCandidate:
    """A section from Retrieval, with what the first prompt and the tool policy need."""

    doc_id: str
    section_id: str
    title: str
    summary: str
    score: float
    page_start: int
    page_end: int
    anchor_chunk_id: str


@dataclass(frozen=True)
class RetrievalRequest:
    """What the orchestrator asks Retrieval for: one search over the user's sections."""

    query: str
    user: User
    filters: Filters
    max_results: int
    trace_id: str
    expand_query: bool = False
    """Search the query's expansion variants too, merged by RRF (S4)."""


@dataclass(frozen=True)
class RetrievalOutcome:
    sections: tuple[SectionCandidate, ...]
    latency_ms: int
    passages: tuple[tuple[str, str], ...] = ()
    """(section_id, text) of the hits: never prompted (only summaries are), read only to see
    whether the sections found speak of what a definitional question asks about."""


@dataclass(frozen=True)
class LlmRequest:
    """What the orchestrator asks the LLM service for."""

    system_prompt: str
    messages: tuple[Turn, ...]
    context: tuple[SectionCandidate, ...]
    """The sections of the first prompt: their anchors go into the tool policy. Their
    summaries are already in the prompt text, so they are not sent again as context."""
    user: User
    allowed_tools: tuple[str, ...]
    radius_schedule: tuple[int, ...]
    max_tool_steps: int
    context_token_budget: int
    model: str
    trace_id: str
    planned_calls: tuple[PlannedCall, ...] = ()
    mode: str = "rag"
    response_schema: dict[str, Any] | None = field(default=None, compare=False, hash=False)
    """The answer must be one JSON object matching this schema (routing); no tools."""
    max_tokens: int | None = None
    """Caps the answer (routing needs a short one)."""
    require_tool_call: bool = False
    """The model's first step must be a tool call: it reads before it answers."""
    answer_language: str = ""
    """"ru" or "en": the LLM service closes every model call with that instruction."""
    timeout_s: float | None = None
    """The call's own time at most (the routing call's share); None: the service's."""


@dataclass(frozen=True)
class ModelUsage:
    """What the model runtime did for a request, over every Generate it made."""

    runtime_ms: int = 0
    calls: int = 0
    prompt_tokens: int = 0
    prompt_cached: int = 0
    final_prompt: int = 0
    """The prompt tokens of the last call (the answer's)."""

    def __add__(self, other: ModelUsage) -> ModelUsage:
        return ModelUsage(
            runtime_ms=self.runtime_ms + other.runtime_ms,
            calls=self.calls + other.calls,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            prompt_cached=self.prompt_cached + other.prompt_cached,
            final_prompt=other.final_prompt or self.final_prompt,
        )


@dataclass(frozen=True)
class LlmOutcome:
    answer: str
    tools: tuple[ToolCallRecord, ...]
    tool_steps: int
    latency_ms: int
    extractive: bool = False
    usage: ModelUsage = field(default_factory=ModelUsage)
    withheld_for: tuple[str, ...] = ()
    """The question's names nothing read mentions: the model's answer was withheld."""


@dataclass(frozen=True)
class Source:
    doc_id: str
    section_id: str
    page_start: int
    page_end: int
    score: float


@dataclass(frozen=True)
class RespondOutput:
    answer: str
    sources: tuple[Source, ...]
    tools: tuple[ToolCallRecord, ...]
    safety_input: str
    safety_output: str
    trace_id: str
    retrieval_latency_ms: int
    llm_latency_ms: int | None
    tool_steps: int
    scenario: str = ""
    intent: str = ""
    decided_by: str = ""
    model_usage: ModelUsage = field(default_factory=ModelUsage)
    withheld_for: tuple[str, ...] = ()


class Retriever(Protocol):
    async def search(self, request: RetrievalRequest) -> RetrievalOutcome: ...

    async def document_sizes(
        self, user: User, doc_ids: tuple[str, ...]
    ) -> dict[str, tuple[int, int, str]]:
        """(characters, tokens, title) of each of the user's documents among `doc_ids`
        (absent: not found): its whole text's size, tokens 0 when Retrieval holds no count."""
        ...


class Generator(Protocol):
    async def generate(self, request: LlmRequest) -> LlmOutcome: ...
