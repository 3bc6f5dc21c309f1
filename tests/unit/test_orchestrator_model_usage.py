"""The orchestrator's side of a real model: constrained routing, the first read, telemetry."""

from __future__ import annotations

import json

import pytest
from visior.orchestrator.v1 import orchestrator_pb2 as pb

from services.common import errors
from services.orchestrator.model import LlmOutcome, ModelUsage
from services.orchestrator.respond import DECISION_MAX_TOKENS
from services.orchestrator.scenarios import (
    INTENTS,
    MAX_CONTEXT_CHARS,
    SCENARIO_OF_INTENT,
    Selection,
    decision_schema,
    parse_model_decision,
)
from services.orchestrator.servicer import respond_response
from tests.unit.test_orchestrator import TODAY, FakeGenerator, _many_sections, inp, make

ROUTE = {
    "scenario": "S1",
    "intent": "documents",
    "clarifications": [],
    "currency": "",
    "date": "",
    "news_query": "",
}


def _intents(schema: dict) -> list[str]:
    return [o["properties"]["intent"]["const"] for o in schema["anyOf"]]


def test_the_decision_schema_offers_only_the_intents_the_facts_allow() -> None:
    free = decision_schema()
    assert _intents(free) == [i for i in INTENTS if not i.startswith("selected_")]
    fits = decision_schema(Selection(("d",), MAX_CONTEXT_CHARS))
    assert _intents(fits) == ["selected_full", "clarify"]
    big = decision_schema(Selection(("d",), MAX_CONTEXT_CHARS + 1))
    assert _intents(big) == ["selected_search", "clarify"]
    for option in free["anyOf"]:
        props = option["properties"]
        assert props["scenario"]["const"] == SCENARIO_OF_INTENT[props["intent"]["const"]]
        assert set(option["required"]) == set(ROUTE)


def test_an_answer_shaped_by_the_schema_is_a_usable_decision() -> None:
    decided = parse_model_decision(
        json.dumps({**ROUTE, "scenario": "S2", "intent": "currency_rates", "currency": "EUR"}),
        query="Какой курс евро?",
        today=TODAY,
    )
    assert decided is not None and (decided.intent, decided.currency) == ("currency_rates", "EUR")


async def test_routing_asks_for_the_schema_and_a_short_answer() -> None:
    responder, _, gen, _ = make(routing=True, routing_answer=json.dumps(ROUTE))
    await responder.respond(inp())
    route, answer = gen.requests
    assert route.response_schema == decision_schema()
    assert route.max_tokens == DECISION_MAX_TOKENS and route.allowed_tools == ()
    assert answer.response_schema is None and answer.max_tokens is None


async def test_s1_asks_the_model_to_read_before_it_answers() -> None:
    responder, _, gen, _ = make()
    await responder.respond(inp())
    (answer,) = gen.requests
    assert answer.context and answer.require_tool_call is True


async def test_general_questions_do_not_force_a_read() -> None:
    responder, _, gen, _ = make()
    await responder.respond(inp(query="Какой курс доллара сегодня?"))
    assert [r.require_tool_call for r in gen.requests] == [False]


class _MeteredGenerator(FakeGenerator):
    """Each Generate reports its own model usage, as the LLM service's response does."""

    def __init__(self, routing_answer: str) -> None:
        super().__init__(routing_answer)
        self.usages = [
            ModelUsage(
                runtime_ms=900, calls=1, prompt_tokens=600, prompt_cached=0, final_prompt=600
            ),
            ModelUsage(
                runtime_ms=4000, calls=2, prompt_tokens=2600, prompt_cached=1150, final_prompt=1450
            ),
        ]

    async def generate(self, request):  # type: ignore[no-untyped-def]
        outcome = await super().generate(request)
        return LlmOutcome(
            outcome.answer, outcome.tools, outcome.tool_steps, outcome.latency_ms,
            usage=self.usages.pop(0),
        )  # fmt: skip


async def test_telemetry_sums_the_model_usage_of_every_generate() -> None:
    responder, _, _, _ = make(routing=True, routing_answer=json.dumps(ROUTE))
    gen = _MeteredGenerator(json.dumps(ROUTE))
    responder._generator = gen  # the routing call and the answer, each with its usage
    out = await responder.respond(inp())
    assert out.model_usage == ModelUsage(
        runtime_ms=4900, calls=3, prompt_tokens=3200, prompt_cached=1150, final_prompt=1450
    )
    telemetry = respond_response(out).telemetry
    assert (
        telemetry.llm_runtime_ms,
        telemetry.model_calls,
        telemetry.prompt_tokens,
        telemetry.prompt_tokens_cached,
        telemetry.final_prompt_tokens,
    ) == (4900, 3, 3200, 1150, 1450)


async def test_requests_do_not_share_their_usage() -> None:
    responder, _, _, _ = make()
    first = await responder.respond(inp())
    second = await responder.respond(inp())
    assert first.model_usage == second.model_usage == ModelUsage()
    assert isinstance(respond_response(second).telemetry, pb.Telemetry)


@pytest.mark.parametrize("kept", [0, 700])
def test_usage_adds_up_and_keeps_the_last_calls_prompt(kept: int) -> None:
    total = ModelUsage(1, 1, 10, 0, 10) + ModelUsage(2, 1, 30, 5, kept)
    assert (total.runtime_ms, total.calls, total.prompt_tokens, total.prompt_cached) == (
        3,
        2,
        40,
        5,
    )
    assert total.final_prompt == (kept or 10)


async def test_the_default_top_k_sets_the_sections_when_the_request_gives_none() -> None:
    responder, retriever, gen, _ = make()
    retriever.search = _many_sections(retriever.search)
    responder._default_top_k = 2
    await responder.respond(inp())
    assert len(gen.requests[-1].context) == 2
    await responder.respond(inp(max_results=3))
    assert len(gen.requests[-1].context) == 3


@pytest.mark.parametrize(("value", "ok"), [("1", True), ("50", True), ("0", False), ("51", False)])
def test_orch_default_top_k_from_the_environment(value: str, ok: bool) -> None:
    from services.common.settings import Env, SettingsError
    from services.orchestrator.config import OrchestratorSettings

    env = Env({"ORCH_DEFAULT_TOP_K": value})
    if ok:
        assert OrchestratorSettings.from_env(env).default_top_k == int(value)
    else:
        with pytest.raises(SettingsError):
            OrchestratorSettings.from_env(env)
    assert OrchestratorSettings.from_env(Env({})).default_top_k == 10


@pytest.mark.parametrize(
    ("query", "locale", "language"),
    [
        ("Как настроить LDAP?", "", "ru"),
        ("How to set up LDAP?", "", "en"),
        ("How to set up LDAP?", "ru-RU", "ru"),
        ("Какой курс доллара сегодня?", "", "ru"),
        ("Какой курс доллара сегодня?", "en", "en"),
        ("Что это?", "", "ru"),
    ],
)
async def test_every_answering_generate_names_the_answer_language(query, locale, language) -> None:
    responder, _, gen, _ = make()
    await responder.respond(inp(query=query, locale=locale))
    assert [r.answer_language for r in gen.requests] == [language]
    # The user's own words are sent as they are.
    assert gen.requests[-1].messages[-1].content.startswith(query) or "Sections" in (
        gen.requests[-1].messages[-1].content
    )


async def test_the_routing_call_names_no_answer_language() -> None:
    responder, _, gen, _ = make(routing=True, routing_answer=json.dumps(ROUTE))
    await responder.respond(inp())
    assert [r.answer_language for r in gen.requests] == ["", "en"]


@pytest.mark.parametrize(("completion", "asked"), [("512", DECISION_MAX_TOKENS), ("100", 100)])
async def test_routing_asks_for_no_more_than_the_llm_services_answer_limit(completion, asked):
    # Both services read MAX_COMPLETION_TOKENS; a routing call past it would be refused
    # (LLM_LIMIT_EXCEEDED) and fail every Respond.
    from services.common.settings import Env
    from services.llm.config import LlmSettings
    from services.orchestrator.config import OrchestratorSettings
    from services.orchestrator.respond import Responder
    from services.orchestrator.runtime_config import ConfigHolder, RuntimeConfig
    from tests.unit.test_orchestrator import FakeRetriever

    env = Env({"MAX_COMPLETION_TOKENS": completion})
    limit = OrchestratorSettings.from_env(env).llm_completion_limit
    assert limit == LlmSettings.from_env(env).loop.max_completion_tokens == int(completion)
    gen = FakeGenerator(json.dumps(ROUTE))
    responder = Responder(
        FakeRetriever(None), gen, ConfigHolder(RuntimeConfig(), 3), model_routing=True,
        today=lambda: TODAY, llm_completion_limit=limit,
    )  # fmt: skip
    await responder.respond(inp())
    assert gen.requests[0].max_tokens == asked


@pytest.mark.parametrize(
    "failure",
    [errors.UnavailableError("llm: runtime timed out", reason="LLM_RUNTIME_ERROR"),
     errors.LimitExceededError("routing prompt too long", reason="LLM_LIMIT_EXCEEDED"),
     errors.ResourceExhaustedError("busy", reason="SERVER_BUSY")],
)  # fmt: skip
async def test_a_failed_routing_call_falls_back_on_the_rules(failure):
    """agent.md §4: rule_guess_scenario is the fallback of the model's routing. The request
    goes on to its answering call, routed by the rules."""
    from services.orchestrator.model import LlmOutcome
    from services.orchestrator.respond import Responder
    from services.orchestrator.runtime_config import ConfigHolder, RuntimeConfig
    from tests.unit.test_orchestrator import FakeRetriever

    class RoutingFails(FakeGenerator):
        async def generate(self, request):
            self.requests.append(request)
            if request.response_schema is not None:
                raise failure
            return LlmOutcome("answer", (), 1, 7)

    gen = RoutingFails()
    responder = Responder(
        FakeRetriever(), gen, ConfigHolder(RuntimeConfig(), 3), model_routing=True,
        today=lambda: TODAY,
    )  # fmt: skip
    out = await responder.respond(inp())
    assert len(gen.requests) == 2 and gen.requests[1].response_schema is None
    assert out.answer == "answer" and out.decided_by == "rules"


async def test_a_withheld_answer_is_named_in_the_telemetry():
    """The LLM service withheld the model's answer (the question names what nothing read
    mentions): the Respond says so, over gRPC and JSON alike."""

    class Withholding(FakeGenerator):
        async def generate(self, request):
            self.requests.append(request)
            return LlmOutcome("Документы не отвечают на вопрос.", (), 1, 7,
                              withheld_for=("Kubernetes",))  # fmt: skip

    from services.orchestrator.respond import Responder
    from services.orchestrator.runtime_config import ConfigHolder, RuntimeConfig
    from tests.unit.test_orchestrator import FakeRetriever

    responder = Responder(
        FakeRetriever(), Withholding(), ConfigHolder(RuntimeConfig(), 3), model_routing=False,
        today=lambda: TODAY,
    )  # fmt: skip
    out = await responder.respond(inp(query="Как настроить Kubernetes в Orion X?"))
    assert out.withheld_for == ("Kubernetes",)
    assert list(respond_response(out).telemetry.withheld_for) == ["Kubernetes"]
    plain = await make()[0].respond(inp())
    assert list(respond_response(plain).telemetry.withheld_for) == []
