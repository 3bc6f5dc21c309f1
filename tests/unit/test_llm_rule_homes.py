"""Where the LLM service writes each rule: the runtime client presents the tools' argument
schemas once (the tools field natively, the JSON-mode instruction otherwise) while the
prompt's tool-use block names every tool with its description in both modes, and one
function (services.llm.loop.outcome_of) labels a Generate's outcome for the metrics and
the `generate` log line alike."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client import CollectorRegistry

from services.common import errors
from services.common.outcomes import outcome_of
from services.common.prompt_limits import LLM_LIMIT_EXCEEDED
from services.llm.engine import LlmEngine
from services.llm.loop import LoopSettings, ToolLoop
from services.llm.metrics import LlmMetrics
from services.llm.toolcalls import READ_TOOL_SPECS
from services.model_runtime.chat import LLM_RUNTIME_ERROR
from services.model_runtime.client import OpenAiChatRuntime, RuntimeSettings
from tests.fakes.openai_chat import FakeChatServer, json_answer, text
from tests.unit.test_llm import FakeTools, req
from tests.unit.test_llm_metrics import sample

KEY = "sk-rule-homes-0123456789abcdef"
SETTINGS = LoopSettings(max_total_tokens=8192, default_model="m")

# -- the tool listing ----------------------------------------------------------------------


@pytest.fixture
def fake() -> Iterator[FakeChatServer]:
    with FakeChatServer(api_key=KEY) as server:
        yield server


async def first_body(fake: FakeChatServer, http: httpx.AsyncClient, json_mode: bool) -> dict:
    """The body the runtime receives for the first model call of a Generate with tools."""
    fake.script(json_answer("Готово.") if json_mode else text("Готово."))
    settings = RuntimeSettings(
        url=fake.url, default_model="m", api_key=KEY, enable_json_mode=json_mode
    )
    runtime = OpenAiChatRuntime(settings, http)
    out = await LlmEngine(ToolLoop(runtime, FakeTools([]), READ_TOOL_SPECS, SETTINGS)).generate(
        req()
    )
    assert out.answer == "Готово."
    return fake.chat_requests[0].json


async def test_json_mode_sends_each_schema_once_and_the_tools_in_both_listings(fake, http) -> None:
    body = await first_body(fake, http, json_mode=True)
    assert "tools" not in body
    system = body["messages"][0]
    assert system["role"] == "system"
    for tool in READ_TOOL_SPECS:
        # the prompt's tool-use block and the runtime's JSON-mode instruction
        assert system["content"].count(f"- {tool.name}: {tool.description}") == 2
        schema = json.dumps(tool.parameters, ensure_ascii=False, sort_keys=True)
        assert system["content"].count(schema) == 1
    # The prompt's own tool-use block is still there: the call budget and the sections.
    assert "at most 3 tool call(s)" in system["content"]
    assert 'anchor_chunk_id="guide:c1"' in system["content"]


async def test_native_mode_sends_the_schemas_only_in_the_tools_field(fake, http) -> None:
    body = await first_body(fake, http, json_mode=False)
    system = body["messages"][0]["content"]
    sent = {t["function"]["name"]: t["function"] for t in body["tools"]}
    for tool in READ_TOOL_SPECS:
        assert system.count(f"- {tool.name}: {tool.description}") == 1
        assert json.dumps(tool.parameters, ensure_ascii=False, sort_keys=True) not in system
        assert sent[tool.name]["description"] == tool.description
        assert sent[tool.name]["parameters"] == tool.parameters
    assert "at most 3 tool call(s)" in system


# -- the outcome label ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failure", "outcome"),
    [
        (None, "ok"),
        (errors.InvalidArgumentError("bad"), "INVALID_ARGUMENT"),
        (errors.over_limit("too big", 1, reason=LLM_LIMIT_EXCEEDED), LLM_LIMIT_EXCEEDED),
        (errors.UnavailableError("down", reason=LLM_RUNTIME_ERROR), LLM_RUNTIME_ERROR),
        (asyncio.CancelledError(), "CANCELLED"),
        (RuntimeError("boom"), "INTERNAL"),
    ],
)
def test_outcome_of(failure: BaseException | None, outcome: str) -> None:
    assert outcome_of(failure) == outcome


class FailingRuntime:
    """A ChatRuntime whose call raises `failure`, or (None) waits until it is cancelled."""

    name = "m"

    def __init__(self, failure: BaseException | None) -> None:
        self.failure = failure
        self.entered = asyncio.Event()

    async def complete(self, request, *, timeout_s):
        self.entered.set()
        if self.failure is not None:
            raise self.failure
        await asyncio.Event().wait()

    async def stream(self, request, *, timeout_s):
        yield await self.complete(request, timeout_s=timeout_s)


def generate_lines(caplog: pytest.LogCaptureFixture) -> list[str | None]:
    """The `outcome` of each `generate` log line."""
    return [getattr(r, "outcome", None) for r in caplog.records if r.getMessage() == "generate"]


@pytest.mark.parametrize(
    ("failure", "outcome"),
    [
        (errors.UnavailableError("down", reason=LLM_RUNTIME_ERROR), LLM_RUNTIME_ERROR),
        (RuntimeError("boom"), "INTERNAL"),
    ],
)
async def test_a_failed_generate_has_one_outcome_in_metrics_and_log(
    caplog: pytest.LogCaptureFixture, failure: BaseException, outcome: str
) -> None:
    registry = CollectorRegistry()
    loop = ToolLoop(FailingRuntime(failure), FakeTools([]), READ_TOOL_SPECS, SETTINGS)
    with caplog.at_level(logging.INFO, logger="visior.llm.loop"):
        with pytest.raises(type(failure)):
            await LlmEngine(loop, LlmMetrics(registry)).generate(req())
    assert generate_lines(caplog) == [outcome]
    assert sample(registry, "llm_requests_total", outcome=outcome) == 1


async def test_a_cancelled_generate_has_one_outcome_in_metrics_and_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    runtime = FailingRuntime(None)
    engine = LlmEngine(
        ToolLoop(runtime, FakeTools([]), READ_TOOL_SPECS, SETTINGS), LlmMetrics(registry)
    )
    with caplog.at_level(logging.INFO, logger="visior.llm.loop"):
        task = asyncio.create_task(engine.generate(req()))
        await runtime.entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert generate_lines(caplog) == ["CANCELLED"]
    assert sample(registry, "llm_requests_total", outcome="CANCELLED") == 1
