"""Every Generate counts in the LLM metrics, whatever its outcome (issue 21 item 1): the
request, its latency, the tokens and tool calls it used, the tool errors; read from the
/metrics text."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.common import errors
from services.common.outcomes import CANCELLED
from services.common.tokenizer import default_tokenizer
from services.llm.budget import message_tokens
from services.llm.engine import LlmEngine
from services.llm.extractive import ExtractiveRuntime
from services.llm.loop import LoopSettings, ToolLoop
from services.llm.metrics import LlmMetrics
from services.llm.model import Anchor, ToolPolicy, ToolResult, Turn
from services.llm.toolcalls import READ_TOOL_SPECS
from services.model_runtime.chat import LLM_RUNTIME_ERROR, ChatMessage, Completion, StreamDelta
from tests.unit.test_llm import WINDOW, FakeTools, req
from tests.unit.test_loop import ScriptedRuntime, asks, call


def metered(tools, registry: CollectorRegistry, runtime=None) -> LlmEngine:
    settings = LoopSettings(default_model="extractive")
    loop = ToolLoop(runtime or ExtractiveRuntime(), tools, READ_TOOL_SPECS, settings)
    return LlmEngine(loop, LlmMetrics(registry))


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """The sum of `name` over the series whose labels include `labels`, as /metrics prints."""
    total = 0.0
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


class DownTools:
    """ToolsProxy unreachable: every call raises, as GrpcToolRunner does."""

    def __init__(self) -> None:
        self.calls = 0

    async def execute(self, request, *, timeout_s=None):
        self.calls += 1
        raise errors.UnavailableError("toolsproxy failed: UNAVAILABLE")


NOT_FOUND = ToolResult("error", error_code="NOT_FOUND", error_message="gone")
TWO_READS = ToolPolicy(
    allowed_tools=("read_chunk_window", "read_doc_section"),
    anchors=(Anchor("guide", "s1", "guide:c1"), Anchor("guide", "s2", "")),
)
"""Two sections to read: the window, then (after an error) the next section."""
ABORTED = "UPSTREAM_UNAVAILABLE"
"""The reason of the abort after two tool errors in a row that are not rate limits."""


async def test_two_tool_errors_in_a_row_count_everywhere():
    registry = CollectorRegistry()
    tools = FakeTools([NOT_FOUND, NOT_FOUND])
    # A model that reads a second section after the first failed: the abort.
    runtime = ScriptedRuntime([
        asks(call("read_chunk_window", {"doc_id": "guide", "anchor_chunk_id": "guide:c1"})),
        asks(call("read_doc_section", {"doc_id": "guide", "section_id": "s2"}, id="c2")),
    ])  # fmt: skip
    with pytest.raises(errors.UnavailableError) as info:
        await metered(tools, registry, runtime).generate(req(policy=TWO_READS))
    assert info.value.reason == ABORTED and len(tools.calls) == 2
    assert sample(registry, "llm_requests_total", outcome=ABORTED) == 1
    assert sample(registry, "llm_requests_total", outcome="ok") == 0
    assert sample(registry, "llm_latency_ms_count", outcome=ABORTED) == 1
    assert sample(registry, "llm_mcp_errors_total", code="NOT_FOUND") == 2
    assert sample(registry, "llm_tool_call_count_total", outcome=ABORTED) == 2
    # Two model calls were made before the abort: their tokens count (estimated, as the
    # scripted runtime reports none).
    assert sample(registry, "llm_token_usage_total", kind="prompt", outcome=ABORTED) > 0


async def test_a_proxy_that_is_down_counts_as_a_tool_error_and_a_failed_request():
    registry = CollectorRegistry()
    tools = DownTools()
    with pytest.raises(errors.UnavailableError):
        await metered(tools, registry).generate(req())
    assert tools.calls == 1
    reason = "UPSTREAM_UNAVAILABLE"
    assert sample(registry, "llm_requests_total", outcome=reason) == 1
    assert sample(registry, "llm_latency_ms_count", outcome=reason) == 1
    assert sample(registry, "llm_mcp_errors_total", tool="read_chunk_window", code=reason) == 1
    assert sample(registry, "llm_tool_call_count_total", tool="read_chunk_window") == 1
    assert sample(registry, "llm_token_usage_total", kind="prompt", outcome=reason) > 0


async def test_a_refused_request_counts_with_its_reason():
    registry = CollectorRegistry()
    with pytest.raises(errors.InvalidArgumentError):
        await metered(FakeTools([]), registry).generate(req(mode="poem"))
    assert sample(registry, "llm_requests_total", outcome="INVALID_ARGUMENT") == 1
    assert sample(registry, "llm_latency_ms_count", outcome="INVALID_ARGUMENT") == 1
    assert sample(registry, "llm_token_usage_total") == 0


async def test_an_answered_request_counts_what_the_caller_was_told():
    registry = CollectorRegistry()
    tools = FakeTools([NOT_FOUND, WINDOW])
    out = await metered(tools, registry).generate(req(policy=TWO_READS))
    assert sample(registry, "llm_requests_total", outcome="ok") == 1
    assert sample(registry, "llm_latency_ms_count", outcome="ok") == 1
    assert sample(registry, "llm_token_usage_total", kind="prompt", outcome="ok") == (
        out.prompt_tokens
    )
    assert sample(registry, "llm_token_usage_total", kind="completion", outcome="ok") == (
        out.completion_tokens
    )
    assert sample(registry, "llm_tool_call_count_total", outcome="ok") == len(out.tools_called)
    assert sample(registry, "llm_mcp_errors_total") == 1


async def test_a_withheld_answer_counts():
    registry = CollectorRegistry()
    rt = ScriptedRuntime([asks(call("read_chunk_window", {"doc_id": "guide",
                                                         "anchor_chunk_id": "guide:c1"})),
                          Completion("Redis listens on 6379.", model="m1"),
                          Completion("LDAP is in Settings.", model="m1")])  # fmt: skip
    engine = LlmEngine(ToolLoop(rt, FakeTools([WINDOW]), READ_TOOL_SPECS, LoopSettings()),
                       LlmMetrics(registry))  # fmt: skip
    out = await engine.generate(req(messages=(Turn("user", "Which port does Redis use?"),)))
    assert out.withheld_for == ("redis",)
    assert sample(registry, "llm_answers_withheld_total") == 1
    # An answer the text read grounds is not counted (nothing read yet: the rule is off).
    await engine.generate(req(policy=ToolPolicy()))
    assert sample(registry, "llm_answers_withheld_total") == 1
    assert sample(registry, "llm_requests_total", outcome="ok") == 2


# -- a model call that fails or is cancelled once made counts its tokens ---------------------


class BrokenStream:
    """A runtime whose stream writes two words, then fails as `then` says: "fail" (the runtime
    dropped it), "hang" (until cancelled); whose completion fails once sent; or that refuses
    every call without making it ("refuse": the breaker open)."""

    name = "broken"

    def __init__(self, then: str) -> None:
        self.then = then
        self.wrote = asyncio.Event()

    def _refusal(self) -> errors.UnavailableError:
        return errors.UnavailableError(
            "LLM runtime is unavailable", reason=LLM_RUNTIME_ERROR,
            metadata={"kind": "circuit_open", "attempts": "0"},
        )  # fmt: skip

    async def complete(self, request, *, timeout_s):
        if self.then == "refuse":
            raise self._refusal()
        raise errors.UnavailableError(
            "LLM runtime did not answer in time", reason=LLM_RUNTIME_ERROR,
            metadata={"kind": "timeout", "attempts": "1"},
        )  # fmt: skip

    async def stream(self, request, *, timeout_s):
        if self.then == "refuse":
            raise self._refusal()
        yield StreamDelta("LDAP is set up ")
        yield StreamDelta("in the Settings page")
        self.wrote.set()
        if self.then == "hang":
            await asyncio.Event().wait()
        raise errors.UnavailableError(
            "LLM runtime dropped the stream", reason=LLM_RUNTIME_ERROR,
            metadata={"kind": "unreachable", "attempts": "1"},
        )  # fmt: skip


class Sink:
    async def delta(self, text):
        pass

    async def tool_call(self, record):
        pass


WRITTEN = message_tokens(
    default_tokenizer(), ChatMessage("assistant", "LDAP is set up in the Settings page")
)
"""The estimate of what the broken stream wrote."""


async def test_a_stream_that_fails_counts_the_prompt_sent_and_the_text_so_far():
    registry = CollectorRegistry()
    engine = metered(FakeTools([]), registry, BrokenStream("fail"))
    with pytest.raises(errors.UnavailableError):
        await engine.generate(req(policy=ToolPolicy()), Sink())
    outcome = LLM_RUNTIME_ERROR
    assert sample(registry, "llm_token_usage_total", kind="prompt", outcome=outcome) > 0
    assert sample(registry, "llm_token_usage_total", kind="completion", outcome=outcome) == WRITTEN


async def test_a_cancelled_stream_counts_the_prompt_sent_and_the_text_so_far():
    registry = CollectorRegistry()
    runtime = BrokenStream("hang")
    task = asyncio.ensure_future(
        metered(FakeTools([]), registry, runtime).generate(req(policy=ToolPolicy()), Sink())
    )
    await asyncio.wait_for(runtime.wrote.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sample(registry, "llm_requests_total", outcome=CANCELLED) == 1
    assert sample(registry, "llm_token_usage_total", kind="prompt", outcome=CANCELLED) > 0
    assert sample(registry, "llm_token_usage_total", kind="completion", outcome=CANCELLED) == (
        WRITTEN
    )


async def test_a_completion_that_fails_once_sent_counts_its_prompt():
    registry = CollectorRegistry()
    with pytest.raises(errors.UnavailableError):
        await metered(FakeTools([]), registry, BrokenStream("fail")).generate(
            req(policy=ToolPolicy())
        )
    outcome = LLM_RUNTIME_ERROR
    assert sample(registry, "llm_token_usage_total", kind="prompt", outcome=outcome) > 0
    assert sample(registry, "llm_token_usage_total", kind="completion", outcome=outcome) == 0


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_call_the_runtime_client_refused_without_making_it_counts_no_tokens(streamed):
    registry = CollectorRegistry()
    engine = metered(FakeTools([]), registry, BrokenStream("refuse"))
    with pytest.raises(errors.UnavailableError):
        await engine.generate(req(policy=ToolPolicy()), Sink() if streamed else None)
    assert sample(registry, "llm_requests_total", outcome=LLM_RUNTIME_ERROR) == 1
    assert sample(registry, "llm_token_usage_total") == 0
