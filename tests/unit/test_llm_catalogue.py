"""The tool catalogue is asked for again when a request needs a tool it lacks; a ToolsProxy
that never answered makes such a request a 502, never the caller's 400 (issue 20 §4.4)."""

from __future__ import annotations

import asyncio

import pytest

from services.common import errors
from services.llm.engine import LlmEngine
from services.llm.extractive import ExtractiveRuntime
from services.llm.loop import LoopSettings, ToolLoop
from services.llm.model import PlannedCall, ToolPolicy, ToolResult
from services.llm.toolcalls import READ_TOOL_SPECS
from services.llm.tools_client import ToolCatalogue
from services.model_runtime.chat import ToolSpec
from tests.fakes.clock import ManualClock
from tests.unit.test_llm import FakeTools, req

CBR = ToolSpec(
    "fetch_cbr_data", "The bank's rates.",
    {"type": "object", "properties": {"mode": {"type": "string"}}},
)  # fmt: skip
FULL = (*READ_TOOL_SPECS, CBR)


class Source:
    """ToolsProxy's ListTools: down (raises) or up (answers `specs`); counts the calls."""

    def __init__(self, specs: tuple[ToolSpec, ...] | None) -> None:
        self.specs = specs
        self.calls = 0
        self.gate: asyncio.Event | None = None

    async def list_tools(self) -> list[ToolSpec]:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.specs is None:
            raise errors.UnavailableError("toolsproxy failed: UNAVAILABLE")
        return list(self.specs)


def stack(source: Source, clock: ManualClock | None = None):
    loop = ToolLoop(ExtractiveRuntime(), FakeTools([]), READ_TOOL_SPECS, LoopSettings())

    def offer(specs):
        loop.catalogue = tuple(specs)

    catalogue = ToolCatalogue(
        source, offer, READ_TOOL_SPECS, refresh_s=60, clock=clock or ManualClock(0.0)
    )
    return loop, catalogue


async def test_a_needed_tool_while_the_proxy_never_answered_is_unavailable():
    source = Source(None)
    _, catalogue = stack(source)
    await catalogue.require(["read_chunk_window"])  # built in: no need to ask
    assert source.calls == 0
    with pytest.raises(errors.UnavailableError) as info:
        await catalogue.require(["read_chunk_window", "fetch_cbr_data"])
    assert info.value.reason == "UPSTREAM_UNAVAILABLE"
    assert info.value.metadata["tools"] == "fetch_cbr_data"
    assert source.calls == 1
    # The proxy comes up: the next request asks again and gets the tool.
    source.specs = FULL
    loop, catalogue = stack(source)
    await catalogue.require(["fetch_cbr_data"])
    assert [t.name for t in loop.catalogue] == [t.name for t in FULL]


async def test_once_loaded_a_missing_tool_is_asked_for_at_most_every_refresh():
    source, clock = Source(READ_TOOL_SPECS), ManualClock(0.0)
    loop, catalogue = stack(source, clock)
    await catalogue.load()
    assert source.calls == 1
    await catalogue.require(["fetch_cbr_data"])  # fresh: the proxy said it has none
    assert source.calls == 1
    clock.now = 59.9
    await catalogue.require(["fetch_cbr_data"])
    assert source.calls == 1
    source.specs = FULL
    clock.now = 60.0
    await catalogue.require(["fetch_cbr_data"])
    assert source.calls == 2 and "fetch_cbr_data" in catalogue.names
    # Stale again and the proxy is down: the request goes on with what was loaded.
    source.specs, clock.now = None, 200.0
    await catalogue.require(["fetch_finance_news"])
    assert source.calls == 3 and "fetch_cbr_data" in {t.name for t in loop.catalogue}


async def test_requests_waiting_for_one_answer_share_it():
    source = Source(FULL)
    source.gate = asyncio.Event()
    _, catalogue = stack(source)
    waiting = [asyncio.create_task(catalogue.require(["fetch_cbr_data"])) for _ in range(5)]
    await asyncio.sleep(0)
    source.gate.set()
    await asyncio.gather(*waiting)
    assert source.calls == 1


def engine_with(source: Source, tools: FakeTools) -> LlmEngine:
    loop = ToolLoop(ExtractiveRuntime(), tools, READ_TOOL_SPECS, LoopSettings())

    def offer(specs):
        loop.catalogue = tuple(specs)

    catalogue = ToolCatalogue(source, offer, READ_TOOL_SPECS)
    return LlmEngine(loop, catalogue=catalogue)


PLANNED = ToolPolicy(
    allowed_tools=("fetch_cbr_data",),
    planned_calls=(PlannedCall("fetch_cbr_data", {"mode": "key_rate"}),),
)


async def test_a_planned_call_waits_for_the_catalogue_not_refused():
    # Before the fix: the planned tool was not in the built-in catalogue, and the request
    # was refused as the caller's INVALID_ARGUMENT (500 DOWNSTREAM_REJECTED at the edge).
    source = Source(None)
    tools = FakeTools([ToolResult("ok", {"key_rate": 16.0})])
    e = engine_with(source, tools)
    with pytest.raises(errors.UnavailableError):
        await e.generate(req(policy=PLANNED))
    assert tools.calls == []
    source.specs = FULL
    out = await e.generate(req(policy=PLANNED))
    assert [t.name for t in out.tools_called] == ["fetch_cbr_data"]
    assert tools.calls[0][:2] == ("fetch_cbr_data", {"mode": "key_rate"})


async def test_the_callers_own_mistakes_stay_400_while_the_proxy_is_down():
    e = engine_with(Source(None), FakeTools([]))
    outside = ToolPolicy(
        allowed_tools=("read_chunk_window",),
        planned_calls=(PlannedCall("fetch_cbr_data", {"mode": "key_rate"}),),
    )
    with pytest.raises(errors.InvalidArgumentError) as info:
        await e.generate(req(policy=outside))
    assert info.value.metadata["field"] == "tool_policy.planned_calls"
    # A tool the proxy answered it does not have: the caller's planned call is refused.
    source = Source(READ_TOOL_SPECS)
    e = engine_with(source, FakeTools([]))
    with pytest.raises(errors.InvalidArgumentError):
        await e.generate(req(policy=PLANNED))
    assert source.calls == 1
