"""LLM service metrics under the spec's names (llm-service.md §10.4).

Every Generate counts, whatever its outcome (`ok`, or the error's reason): its latency, the
tokens its model calls used and the tool calls it made are recorded when it ends, under the
request's outcome. The tool loop tells `USAGE` (its LoopObserver) of every model call it made
(one that failed or was cancelled with the text it streamed so far) and every tool call, so
that what a failed request used is known too: each adds to the current request's
RequestUsage (a contextvar the engine sets per request).
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram

from services.common.tokenizer import Tokenizer
from services.llm.budget import message_tokens
from services.llm.model import GenerateOutput
from services.model_runtime.chat import ChatMessage, Completion

_MS_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)


@dataclass
class _ModelCall:
    """One model call: the runtime's counts, and what to estimate from when it reported none
    (the loop's own rule: the conversation sent, the answer written; for a call that failed or
    was cancelled, the text written so far, nothing when there was none)."""

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
            if c.completion_tokens is not None:
                completion += c.completion_tokens
            elif c.content or c.tool_calls:
                answer = ChatMessage("assistant", c.content, c.tool_calls)
                completion += message_tokens(tokenizer, answer)
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


class UsageObserver:
    """The tool loop's observer that adds each call to the current request's usage (none
    outside a request begun with begin_request)."""

    def model_call(self, messages: tuple[ChatMessage, ...], completion: Completion) -> None:
        usage = _USAGE.get()
        if usage is not None:
            usage.model_calls.append(_ModelCall(messages, completion))

    def tool_call(self, name: str, code: str) -> None:
        usage = _USAGE.get()
        if usage is not None:
            usage.tool_calls.append((name, code))


USAGE = UsageObserver()


class LlmMetrics:
    """llm_requests_total{outcome}, llm_latency_ms{outcome}, llm_tool_call_count{tool,outcome},
    llm_token_usage{kind,outcome}, llm_mcp_errors_total{tool,code}, and the service's own
    llm_answers_withheld_total."""

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
        self.withheld = Counter(
            "llm_answers_withheld",
            "Model answers withheld: the question named what nothing read mentions.",
            registry=registry,
        )

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
            if out.withheld_for:
                self.withheld.inc()
        else:
            prompt, completion = usage.tokens(tokenizer)
        self.tokens.labels("prompt", outcome).inc(prompt)
        self.tokens.labels("completion", outcome).inc(completion)
        for name, code in usage.tool_calls:
            self.tool_calls.labels(name, outcome).inc()
            if code:
                self.mcp_errors.labels(name, code).inc()
