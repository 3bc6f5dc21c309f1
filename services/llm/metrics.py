"""LLM service metrics under the spec's names (llm-service.md §10)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from services.llm.model import GenerateOutput

_MS_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)


class LlmMetrics:
    """llm_requests_total, llm_latency_ms, llm_tool_call_count, llm_token_usage, llm_mcp_errors_total."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "llm_requests_total", "Generate requests, by outcome.", ["outcome"], registry=registry
        )
        self.latency = Histogram(
            "llm_latency_ms", "Generate time in milliseconds.", buckets=_MS_BUCKETS,
            registry=registry,
        )  # fmt: skip
        self.tool_calls = Counter(
            "llm_tool_call_count", "Tool calls made by the loop, by tool.", ["tool"],
            registry=registry,
        )  # fmt: skip
        self.tokens = Counter(
            "llm_token_usage", "Tokens used, by kind (prompt, completion).", ["kind"],
            registry=registry,
        )  # fmt: skip
        self.mcp_errors = Counter(
            "llm_mcp_errors_total", "Tool calls that came back as errors.", registry=registry
        )

    def observe(self, out: GenerateOutput) -> None:
        self.requests.labels("ok").inc()
        self.latency.observe(out.latency_ms)
        self.tokens.labels("prompt").inc(out.prompt_tokens)
        self.tokens.labels("completion").inc(out.completion_tokens)
        for call in out.tools_called:
            self.tool_calls.labels(call.name).inc()
            if call.result_summary.startswith("tool_error"):
                self.mcp_errors.inc()

    def failed(self, reason: str) -> None:
        self.requests.labels(reason or "error").inc()
