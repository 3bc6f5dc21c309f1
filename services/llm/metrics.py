"""LLM service metrics under the spec's names (llm-service.md §10.4).

Every Generate counts, whatever its outcome (`ok`, or the error's reason): its latency, the
tokens its model calls used and the tool calls it made are recorded when it ends, under the
request's outcome. The runtime and the tool runner are wrapped (MeteredRuntime,
MeteredTools) so that what a failed request used is known too: each wrapper adds to the
current request's RequestUsage (a contextvar the engine sets per request).
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from services.common import errors
from services.common.tokenizer import Tokenizer
from services.llm.budget import message_tokens
from services.llm.model import GenerateOutput, ToolResult, ToolRunner, User
from services.model_runtime.chat import (
    ChatMessage,
    ChatRuntime,
    Completion,
    GenerationParams,
    ToolSpec,
)

_MS_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)
OK = "ok"


@dataclass
class _ModelCall:
    """One completed model call: the runtime's counts, and what to estimate from when it
    reported none (the loop's own rule: the conversation sent, the answer written)."""

    messages: tuple[ChatMessage, ...]
    completion: Completion


@dataclass
class RequestUsage:
    """What one Generate used so far: model calls and tool calls (name, error code or "")."""

    model_calls: list[_ModelCall] = field(default_factory=list)
    tool_calls: list[tuple[str, str]] = field(default_factory=list)

    def tokens(self, tokenizer: Tokenizer) -> tuple[int, int]:
        """(prompt, completion) tokens: the runtime's counts, else estimated."""
        prompt = completion = 0
        for call in self.model_calls:
            c = call.completion
            prompt += c.prompt_tokens or sum(message_tokens(tokenizer, m) for m in call.messages)
            completion += c.completion_tokens or message_tokens(
                tokenizer, ChatMessage("assistant", c.content, c.tool_calls)
            )
        return prompt, completion


_USAGE: contextvars.ContextVar[RequestUsage | None] = contextvars.ContextVar(
    "llm_request_usage", default=None
)


def begin_request() -> tuple[RequestUsage, contextvars.Token[RequestUsage | None]]:
    """Start recording a request's usage in this context; end it with end_request(token)."""
    usage = RequestUsage()
    return usage, _USAGE.set(usage)


def end_request(token: contextvars.Token[RequestUsage | None]) -> None:
    _USAGE.reset(token)


class MeteredRuntime:
    """A ChatRuntime that records each completed call in the current request's usage."""

    def __init__(self, inner: ChatRuntime) -> None:
        self.inner = inner
        self.name = inner.name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)  # extractive, and whatever else the loop reads

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        params: GenerationParams,
        *,
        timeout_s: float,
        model: str = "",
    ) -> Completion:
        sent = tuple(messages)
        out = await self.inner.complete(messages, tools, params, timeout_s=timeout_s, model=model)
        _record_model_call(sent, out)
        return out

    async def stream(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        params: GenerationParams,
        *,
        timeout_s: float,
        model: str = "",
    ) -> AsyncIterator[Any]:
        sent = tuple(messages)
        async for event in self.inner.stream(
            messages, tools, params, timeout_s=timeout_s, model=model
        ):
            if isinstance(event, Completion):
                _record_model_call(sent, event)
            yield event


def _record_model_call(messages: tuple[ChatMessage, ...], completion: Completion) -> None:
    usage = _USAGE.get()
    if usage is not None:
        usage.model_calls.append(_ModelCall(messages, completion))


class MeteredTools:
    """A ToolRunner that records each executed call (and its error code) in the request's
    usage; a call that raised (ToolsProxy down, timeout) counts as an error too."""

    def __init__(self, inner: ToolRunner) -> None:
        self.inner = inner

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    async def execute(
        self,
        name: str,
        arguments: dict[str, Any],
        user: User,
        trace_id: str,
        *,
        timeout_s: float | None = None,
    ) -> ToolResult:
        usage = _USAGE.get()
        try:
            result = await self.inner.execute(name, arguments, user, trace_id, timeout_s=timeout_s)
        except errors.ServiceError as exc:
            if usage is not None:
                usage.tool_calls.append((name, exc.reason or "error"))
            raise
        except TimeoutError:
            if usage is not None:
                usage.tool_calls.append((name, "DEADLINE_EXCEEDED"))
            raise
        if usage is not None:
            code = "" if result.status == "ok" else (result.error_code or "error")
            usage.tool_calls.append((name, code))
        return result


class LlmMetrics:
    """llm_requests_total{outcome}, llm_latency_ms{outcome}, llm_tool_call_count{tool,outcome},
    llm_token_usage{kind,outcome}, llm_mcp_errors_total{tool,code}."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "llm_requests_total", "Generate requests, by outcome (ok, or the error's reason).",
            ["outcome"], registry=registry,
        )  # fmt: skip
        self.latency = Histogram(
            "llm_latency_ms", "Generate time in milliseconds, by outcome.", ["outcome"],
            buckets=_MS_BUCKETS, registry=registry,
        )  # fmt: skip
        self.tool_calls = Counter(
            "llm_tool_call_count",
            "Tool calls executed through ToolsProxy, by tool and the request's outcome.",
            ["tool", "outcome"], registry=registry,
        )  # fmt: skip
        self.tokens = Counter(
            "llm_token_usage",
            "Tokens used, by kind (prompt, completion) and the request's outcome.",
            ["kind", "outcome"], registry=registry,
        )  # fmt: skip
        self.mcp_errors = Counter(
            "llm_mcp_errors_total",
            "Tool calls that came back as errors or failed to reach ToolsProxy, by tool and code.",
            ["tool", "code"], registry=registry,
        )  # fmt: skip

    def metered_runtime(self, runtime: ChatRuntime) -> ChatRuntime:
        return runtime if isinstance(runtime, MeteredRuntime) else MeteredRuntime(runtime)

    def metered_tools(self, tools: ToolRunner) -> ToolRunner:
        return tools if isinstance(tools, MeteredTools) else MeteredTools(tools)

    def record(
        self,
        outcome: str,
        latency_ms: float,
        usage: RequestUsage,
        tokenizer: Tokenizer,
        out: GenerateOutput | None = None,
    ) -> None:
        """One finished request. `out` (a success) gives the tokens the caller was told."""
        self.requests.labels(outcome).inc()
        self.latency.labels(outcome).observe(latency_ms)
        if out is not None:
            prompt, completion = out.prompt_tokens, out.completion_tokens
        else:
            prompt, completion = usage.tokens(tokenizer)
        self.tokens.labels("prompt", outcome).inc(prompt)
        self.tokens.labels("completion", outcome).inc(completion)
        for name, code in usage.tool_calls:
            self.tool_calls.labels(name, outcome).inc()
            if code:
                self.mcp_errors.labels(name, code).inc()
