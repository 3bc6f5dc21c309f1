"""Generate: validate the request, run the responder within the budgets, report tokens and tools."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import Any, Protocol

from jsonschema import Draft202012Validator, SchemaError

from services.common import errors
from services.common.context import remaining_seconds
from services.common.generate_contract import (
    ANSWER_LANGUAGES,
    MAX_MESSAGE_CHARS,
    MAX_MODEL_CHARS,
    MODEL_NAME_RULE,
    is_model_name,
)
from services.common.outcomes import outcome_of
from services.common.prompt_limits import COMPLETION_LIMIT_NAME, LLM_LIMIT_EXCEEDED
from services.common.shared_config import text_body_bytes
from services.common.tool_contract import TOOL_NAMES, check_tool_user
from services.llm.loop import LoopSettings, ToolLoop
from services.llm.metrics import USAGE, LlmMetrics, begin_request, end_request
from services.llm.model import EventSink, GenerateInput, GenerateOutput
from services.llm.prompt import CHAT, RAG
from services.model_runtime.chat import LLM_RUNTIME_ERROR, ROLES, SAMPLING_RANGES

MODES = (RAG, CHAT)
MAX_MESSAGES = 64
MAX_CONTEXT_CHUNKS = 50
MAX_STOP_SEQUENCES = 4
MAX_STOP_CHARS = 256
"""The longest stop sequence."""
MAX_SYSTEM_PROMPT_CHARS = MAX_MESSAGE_CHARS
"""The longest system prompt: as long as a message. The Orchestrator's longest is about
6,100 characters (the routing prompt with a question of MAX_QUERY_CHARS); the limit is
checked before anything is counted, so a huge one costs no tokenising."""
MAX_CONTEXT_CHUNK_CHARS = MAX_MESSAGE_CHARS
"""The longest text of one context chunk (the Orchestrator sends none; other callers send
retrieved chunks of a few thousand characters), checked likewise."""


def _over_limit(
    field_name: str, message: str, limit: int, name: str = ""
) -> errors.LimitExceededError:
    return errors.over_limit(message, limit, field=field_name, name=name, reason=LLM_LIMIT_EXCEEDED)


MAX_RESPONSE_SCHEMA_BYTES = 16 * 1024
GENERATE_MAX_REQUEST_BYTES = text_body_bytes(
    MAX_MESSAGES * MAX_MESSAGE_CHARS + MAX_RESPONSE_SCHEMA_BYTES
)
"""The largest Generate (and GenerateStream) request, as JSON (the body limit of `POST
/internal/llm/generate` and `generate:stream`) and as a gRPC message
(LLM_SERVICE_MAX_MESSAGE_BYTES' default): MAX_MESSAGES messages of the longest text `validate`
takes and its largest response schema (bounded in UTF-8 bytes, so in characters too), with the
envelope. The system prompt and the context chunk texts share the envelope: each within its
own limit, a body with more of them than it holds is refused with 413."""


def _validate_response_schema(schema: Any, allowed_tools: Sequence[str]) -> None:
    field_name = "generation_params.response_schema"
    size = len(json.dumps(schema, ensure_ascii=False).encode())
    if size > MAX_RESPONSE_SCHEMA_BYTES:
        raise _over_limit(
            field_name,
            f"{field_name} is {size} bytes as JSON; the limit is {MAX_RESPONSE_SCHEMA_BYTES}",
            MAX_RESPONSE_SCHEMA_BYTES,
        )
    if not schema:
        raise errors.invalid(field_name, "response_schema must not be empty")
    try:
        # No format checks: a pattern is checked by the runtime's regex dialect, not
        # Python's, which refuses (?<name>…) and \p{L}.
        Draft202012Validator.check_schema(schema, format_checker=None)
    except SchemaError as exc:
        # The runtime would refuse it as its own 400, which reaches the caller as our 502.
        raise errors.invalid(
            field_name, f"response_schema is not a JSON schema: {exc.message[:200]}"
        ) from None
    if allowed_tools:
        raise errors.invalid(field_name, "response_schema cannot be combined with allowed_tools")


def _validate_texts(req: GenerateInput) -> None:
    """The sizes of the texts besides the messages, before anything counts their tokens."""
    if len(req.system_prompt) > MAX_SYSTEM_PROMPT_CHARS:
        raise _over_limit(
            "system_prompt",
            f"system_prompt is longer than {MAX_SYSTEM_PROMPT_CHARS} characters",
            MAX_SYSTEM_PROMPT_CHARS,
        )
    if len(req.context_chunks) > MAX_CONTEXT_CHUNKS:
        raise _over_limit(
            "context_chunks", f"at most {MAX_CONTEXT_CHUNKS} context chunks", MAX_CONTEXT_CHUNKS
        )
    for i, c in enumerate(req.context_chunks):
        if len(c.text) > MAX_CONTEXT_CHUNK_CHARS:
            raise _over_limit(
                f"context_chunks[{i}].text",
                f"context_chunks[{i}].text is longer than {MAX_CONTEXT_CHUNK_CHARS} characters",
                MAX_CONTEXT_CHUNK_CHARS,
            )


def validate(req: GenerateInput, limits: LoopSettings) -> None:
    """Raise InvalidArgumentError / LimitExceededError for a request the service refuses;
    `limits` are the service's own (the tool loop's settings)."""
    if req.mode not in MODES:
        raise errors.invalid("mode", "mode must be 'rag' or 'chat'")
    if not req.messages:
        raise errors.invalid("messages", "messages must hold at least the user's question")
    if len(req.messages) > MAX_MESSAGES:
        raise _over_limit("messages", f"at most {MAX_MESSAGES} messages", MAX_MESSAGES)
    for i, m in enumerate(req.messages):
        if m.role not in ROLES:
            raise errors.invalid(f"messages[{i}].role", f"role must be one of {', '.join(ROLES)}")
        if len(m.content) > MAX_MESSAGE_CHARS:
            raise _over_limit(
                f"messages[{i}].content",
                f"messages[{i}] is longer than {MAX_MESSAGE_CHARS} characters",
                MAX_MESSAGE_CHARS,
            )
    if not any(m.role == "user" and m.content.strip() for m in req.messages):
        raise errors.invalid("messages", "no user message with content")
    _validate_texts(req)
    p = req.params
    if p.max_tokens is not None and not 1 <= p.max_tokens <= limits.max_completion_tokens:
        raise _over_limit(
            "generation_params.max_tokens",
            f"generation_params.max_tokens must be 1..{limits.max_completion_tokens}",
            limits.max_completion_tokens,
            COMPLETION_LIMIT_NAME,
        )
    for name, (lo, hi) in SAMPLING_RANGES.items():
        value = getattr(p, name)
        if value is not None and not lo <= value <= hi:
            raise errors.invalid(f"generation_params.{name}", f"{name} must be within {lo}..{hi}")
    if len(p.stop) > MAX_STOP_SEQUENCES:
        raise errors.invalid(
            "generation_params.stop", f"at most {MAX_STOP_SEQUENCES} stop sequences"
        )
    if any(not 1 <= len(stop) <= MAX_STOP_CHARS for stop in p.stop):
        raise errors.invalid(
            "generation_params.stop", f"each stop sequence is 1-{MAX_STOP_CHARS} characters"
        )
    if len(req.model) > MAX_MODEL_CHARS:
        raise _over_limit(
            "model", f"model is longer than {MAX_MODEL_CHARS} characters", MAX_MODEL_CHARS
        )
    if req.model and not is_model_name(req.model):
        raise errors.invalid("model", f"model must be {MODEL_NAME_RULE}")
    if p.response_schema is not None:
        _validate_response_schema(p.response_schema, req.policy.allowed_tools)
    if req.answer_language and req.answer_language not in ANSWER_LANGUAGES:
        raise errors.invalid(
            "answer_language", f"answer_language must be one of {', '.join(ANSWER_LANGUAGES)}"
        )
    if req.policy.allowed_tools:
        # ToolsProxy runs a tool for a tenant and a user (docs/architecture.md §16): what it
        # would refuse is refused here, as it refuses it.
        user = req.user
        check_tool_user(
            user.tenant_id if user else "", user.user_id if user else "", user.roles if user else ()
        )
        _check_tool_names(req.policy.allowed_tools)
    steps = req.policy.max_tool_steps
    if steps is not None and steps < 0:
        raise errors.invalid("tool_policy.max_tool_steps", "max_tool_steps must not be negative")
    budget = req.policy.context_token_budget
    if budget is not None and budget < 1:
        raise errors.invalid(
            "tool_policy.context_token_budget", "context_token_budget must be at least 1"
        )
    if any(r < 0 for r in req.policy.radius_schedule):
        raise errors.invalid("tool_policy.window_radius_schedule", "radii must not be negative")


def _check_tool_names(names: Sequence[str]) -> None:
    """Refuse a name no tool of the contract has (a typo would otherwise run the request
    without that tool, saying nothing). A tool of the contract that this ToolsProxy does not
    list yet (a deploy rolling out) is simply not offered."""
    unknown = [n for n in dict.fromkeys(names) if n not in TOOL_NAMES]
    if unknown:
        shown = ", ".join(repr(n[:64]) for n in unknown[:3]) + (", …" if len(unknown) > 3 else "")
        raise errors.invalid(
            "tool_policy.allowed_tools",
            f"no such tool: {shown}; the tools are {', '.join(TOOL_NAMES)}",
        )


class Catalogue(Protocol):
    """The tool catalogue the loop offers (services.llm.tools_client.ToolCatalogue)."""

    async def require(self, names: Collection[str]) -> None: ...


def needed_tools(req: GenerateInput) -> tuple[str, ...]:
    """The tools a request may use, which the catalogue must list (planned calls are among
    them: a planned tool outside allowed_tools is the caller's error, found by the loop)."""
    if req.policy.max_tool_steps == 0:
        return ()
    return req.policy.allowed_tools


class LlmEngine:
    """Runs one generation: validate, then the tool loop over the configured chat runtime
    (the OpenAI-compatible runtime, or the extractive responder when none is configured).
    With `metrics`, the loop tells the metrics' observer of each model and tool call so that
    every request is counted with what it used, whatever its outcome; with `catalogue`, a request that needs
    tools the catalogue lacks has it loaded again first (a missing ToolsProxy is a 502)."""

    def __init__(
        self,
        loop: ToolLoop,
        metrics: LlmMetrics | None = None,
        *,
        catalogue: Catalogue | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._loop = loop
        self._metrics = metrics
        self._catalogue = catalogue
        self._clock = clock
        if metrics is not None:
            loop.observer = USAGE

    async def generate(self, req: GenerateInput, sink: EventSink | None = None) -> GenerateOutput:
        if self._metrics is None:
            return await self._generate(req, sink)
        started = self._clock()
        usage, token = begin_request()
        out: GenerateOutput | None = None
        failure: BaseException | None = None
        try:
            out = await self._generate(req, sink)
            return out
        except BaseException as exc:
            failure = exc
            raise
        finally:
            end_request(token)
            latency_ms = (self._clock() - started) * 1000
            self._metrics.record(outcome_of(failure), latency_ms, usage, self._loop.tokenizer, out)

    async def _generate(self, req: GenerateInput, sink: EventSink | None) -> GenerateOutput:
        validate(req, self._loop.settings)
        if not req.policy.allowed_tools:
            # No tools allowed: the loop offers none.
            req = replace(req, policy=replace(req.policy, max_tool_steps=0))
        elif self._catalogue is not None:
            await self._catalogue.require(needed_tools(req))
        try:
            return await self._loop.run(req, sink, timeout_s=remaining_seconds())
        except errors.UnavailableError as exc:
            if req.model and _runtime_has_no_such_model(exc):
                raise errors.invalid(
                    "model", f"the model runtime serves no model {req.model!r} (HTTP 404)"
                ) from None
            raise


def _runtime_has_no_such_model(exc: errors.UnavailableError) -> bool:
    """Whether the runtime refused the call with 404, which an OpenAI-compatible runtime
    answers for a model it does not serve: with the caller's `model`, the caller's mistake."""
    return exc.reason == LLM_RUNTIME_ERROR and exc.metadata.get("status") == "404"
