"""How an answer ends (GenerateMeta.finish_reason, services/llm/loop.py): a runtime that
ignores max_tokens is cut where no answer of max_tokens tokens reaches (LONGEST_TOKEN_BYTES
characters a token), whole or streamed, and says "length"; the runtime's own "length" and
"content_filter" are passed on. The extractive responder holds its answer to the caller's
stop sequences and max_tokens as a runtime would, and to nothing else."""

from __future__ import annotations

import pytest

from services.common.tokenizer import LONGEST_TOKEN_BYTES
from services.llm.extractive import ExtractiveRuntime
from services.llm.loop import answer_chars
from services.llm.model import ToolPolicy
from services.model_runtime.chat import GenerationParams
from tests.unit.test_loop import (
    TOK,
    Events,
    FakeTools,
    ScriptedRuntime,
    asks,
    call,
    loop,
    redis_req,
    req,
    says,
    window,
)

NO_TOOLS = ToolPolicy()
RUNAWAY = "word " * 40_000  # 200,000 characters for a max_tokens of 100


async def test_a_runtime_ignoring_max_tokens_is_cut_and_says_length():
    rt = ScriptedRuntime([says(RUNAWAY)])
    params = GenerationParams(max_tokens=100)
    out = await loop(rt, FakeTools()).run(req(policy=NO_TOOLS, params=params))
    assert out.answer == RUNAWAY[: 100 * LONGEST_TOKEN_BYTES] and out.finish_reason == "length"
    assert answer_chars(100) == 100 * LONGEST_TOKEN_BYTES


async def test_a_streamed_runaway_answer_stops_at_the_cap_and_its_deltas_are_the_answer():
    closed: list[bool] = []

    class Runaway(ScriptedRuntime):
        async def stream(self, request, *, timeout_s):
            try:
                async for event in super().stream(request, timeout_s=timeout_s):
                    yield event
            finally:
                closed.append(True)

    events = Events()
    rt = Runaway([says(RUNAWAY)])
    out = await loop(rt, FakeTools()).run(
        req(policy=NO_TOOLS, params=GenerationParams(max_tokens=10)), events
    )
    assert out.answer == RUNAWAY[: 10 * LONGEST_TOKEN_BYTES] == events.answer()
    assert out.finish_reason == "length" and closed == [True]


async def test_an_answer_within_the_cap_is_whole():
    text = "LDAP is set up in Settings. " * 20
    out = await loop(ScriptedRuntime([says(text)]), FakeTools()).run(
        req(policy=NO_TOOLS, params=GenerationParams(max_tokens=100))
    )
    assert out.answer == text and out.finish_reason == "stop"


@pytest.mark.parametrize(
    ("reason", "reported"),
    [("length", "length"), ("content_filter", "content_filter"), ("stop", "stop"),
     ("eos", "stop"), ("", "stop")],
)  # fmt: skip
async def test_the_runtimes_finish_reason_is_passed_on(reason, reported):
    out = await loop(ScriptedRuntime([says("Cut", finish_reason=reason)]), FakeTools()).run(
        req(policy=NO_TOOLS)
    )
    assert out.finish_reason == reported


async def extractive(params: GenerationParams, sink: Events | None = None):
    tools = FakeTools([window(text="LDAP is set up in Settings. Then restart the sync job.")])
    return await loop(ExtractiveRuntime(), tools).run(req(params=params), sink)


async def test_the_extractive_answer_ends_before_a_stop_sequence():
    whole = await extractive(GenerationParams())
    assert "Sources" in whole.answer and whole.finish_reason == "stop"
    events = Events()
    out = await extractive(GenerationParams(stop=("Sources",)), events)
    assert out.answer == whole.answer[: whole.answer.index("Sources")] == events.answer()
    assert out.finish_reason == "stop"


async def test_the_extractive_answer_is_held_to_the_callers_max_tokens_only():
    whole = await extractive(GenerationParams())
    assert TOK.count(whole.answer) > 20
    events = Events()
    out = await extractive(GenerationParams(max_tokens=20), events)
    assert TOK.count(out.answer) <= 20 and whole.answer.startswith(out.answer)
    assert out.answer == events.answer() and out.finish_reason == "length"


async def test_the_extractive_answer_is_not_cut_to_the_services_share():
    """Unset, max_tokens is the service's share of the answer (MAX_COMPLETION_TOKENS): a
    quoting answer longer than it stays whole (answers of 800 tokens quote three passages)."""
    tools = FakeTools([window(text="LDAP is set up in Settings. " * 30)])
    rt = ExtractiveRuntime()
    out = await loop(rt, tools, max_completion_tokens=64).run(req())
    assert TOK.count(out.answer) > 64 and out.finish_reason == "stop"


async def test_a_withheld_answer_is_held_to_the_callers_params_too():
    """The quoted answer that replaces a model's is an extractive answer like any other."""
    redis = call("read_doc_section", {"doc_id": "guide", "section_id": "s1"})
    script = [asks(redis), says("Redis listens on port 6379.")]
    whole = await loop(ScriptedRuntime(list(script)), FakeTools(default=window())).run(redis_req())
    assert whole.withheld_for == ("redis",) and whole.finish_reason == "stop"
    events = Events()
    params = GenerationParams(max_tokens=8, stop=("LDAP",))
    out = await loop(ScriptedRuntime(list(script)), FakeTools(default=window())).run(
        redis_req(params=params), events
    )
    assert out.withheld_for == ("redis",) and "LDAP" not in out.answer
    assert TOK.count(out.answer) <= 8 and out.finish_reason == "length"
    assert events.answer() == out.answer


async def test_an_answer_counted_by_estimate_is_never_more_than_max_tokens():
    """A runtime that reports no usage is counted by estimate, which errs high (a message's
    template tokens): at max_tokens the count is max_tokens, as a runtime would report it."""
    at_cap = " ".join(["word"] * 20)
    assert TOK.count(at_cap) == 20
    params = GenerationParams(max_tokens=20)
    out = await loop(ScriptedRuntime([says(at_cap)]), FakeTools()).run(
        req(policy=NO_TOOLS, params=params)
    )
    assert out.completion_tokens == 20
    out = await loop(ScriptedRuntime([says(" ".join(["word"] * 19))]), FakeTools()).run(
        req(policy=NO_TOOLS, params=params)
    )
    assert 19 < out.completion_tokens <= 20
    # A runtime that ignores max_tokens is counted for all it sent (the service cuts only
    # past what max_tokens can hold: answer_chars).
    runaway = " ".join(["word"] * 100)
    out = await loop(ScriptedRuntime([says(runaway)]), FakeTools()).run(
        req(policy=NO_TOOLS, params=params)
    )
    assert out.answer == runaway and out.completion_tokens >= 100
