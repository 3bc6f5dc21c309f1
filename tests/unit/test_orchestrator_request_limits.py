"""The Orchestrator refuses what the LLM service would refuse, naming the caller's own field:
a history turn past the one per-message limit, and a context_token_budget no first prompt
fits in."""

from __future__ import annotations

import json

import pytest

from services.common import errors
from services.common.generate_contract import MAX_MESSAGE_CHARS
from services.common.prompt_limits import LLM_PROMPT_RESERVE_TOKENS
from services.common.search_contract import MAX_QUERY_CHARS
from services.common.settings import Env, SettingsError
from services.common.shared_config import MIN_PROMPT_ROOM_TOKENS
from services.llm import engine as llm_engine
from services.llm.loop import LoopSettings
from services.llm.model import GenerateInput
from services.orchestrator.config import OrchestratorSettings
from services.orchestrator.model import LlmOutcome, RespondInput, Turn, User
from services.orchestrator.prompt_budget import MIN_CONTEXT_TOKEN_BUDGET
from services.orchestrator.respond import Responder, validate
from services.orchestrator.runtime_config import ConfigHolder, ConfigUpdate, RuntimeConfig
from tests.unit.test_orchestrator_budget import RU, Retriever, _section, llm_count, respond


def _request(*history: Turn) -> RespondInput:
    return RespondInput(query="Что нового?", user=User("t", "u"), history=history)


# --- one per-message limit -------------------------------------------------------------------


def test_the_llm_service_and_the_orchestrator_hold_messages_to_one_limit():
    assert llm_engine.MAX_MESSAGE_CHARS is MAX_MESSAGE_CHARS
    # The question is held lower by the search contract, so it never reaches this limit.
    assert MAX_QUERY_CHARS <= MAX_MESSAGE_CHARS


def test_a_history_turn_past_the_message_limit_is_the_callers_limit_exceeded():
    turns = [Turn("user", "hi"), Turn("assistant", "ok"), Turn("user", "more")]
    long = Turn("assistant", "-" * 40_000)  # ~625 tokens: prompt trimming would keep it
    with pytest.raises(errors.LimitExceededError) as info:
        validate(_request(*turns, long))
    assert info.value.reason == "LIMIT_EXCEEDED"
    assert info.value.metadata["field"] == "history[3].content"
    assert info.value.metadata["limit"] == str(MAX_MESSAGE_CHARS)


def test_a_history_turn_at_the_limit_passes_both_ends_and_one_more_character_neither():
    at, past = "-" * MAX_MESSAGE_CHARS, "-" * (MAX_MESSAGE_CHARS + 1)
    validate(_request(Turn("assistant", at)))
    llm_engine.validate(
        GenerateInput(messages=(Turn("assistant", at), Turn("user", "q"))), LoopSettings()
    )
    with pytest.raises(errors.LimitExceededError) as orch:
        validate(_request(Turn("assistant", past)))
    with pytest.raises(errors.LimitExceededError) as llm:
        llm_engine.validate(
            GenerateInput(messages=(Turn("assistant", past), Turn("user", "q"))), LoopSettings()
        )
    assert orch.value.metadata["limit"] == llm.value.metadata["limit"]


async def test_a_long_history_turn_never_reaches_the_llm_service():
    with pytest.raises(errors.LimitExceededError) as info:
        await respond((), history=(Turn("assistant", "-" * 40_000),))
    assert info.value.metadata["field"] == "history[0].content"


# --- the lowest context_token_budget ---------------------------------------------------------


def test_the_lowest_context_budget_leaves_the_room_over_the_reserve():
    assert MIN_CONTEXT_TOKEN_BUDGET == LLM_PROMPT_RESERVE_TOKENS + MIN_PROMPT_ROOM_TOKENS


@pytest.mark.parametrize("value", [1, 1090, MIN_CONTEXT_TOKEN_BUDGET - 1])
def test_a_context_budget_no_prompt_fits_is_refused_by_update_config_and_the_env(value):
    with pytest.raises(errors.InvalidArgumentError, match="context_token_budget must be within"):
        ConfigHolder(RuntimeConfig(), 3).update(ConfigUpdate(context_token_budget=value))
    with pytest.raises(SettingsError, match="ORCH_CONTEXT_TOKEN_BUDGET"):
        OrchestratorSettings.from_env(Env({"ORCH_CONTEXT_TOKEN_BUDGET": str(value)}))


ROUTE_DOCUMENTS = json.dumps({"scenario": "S1", "intent": "documents"})


class RoutingGenerator:
    """Answers the routing prompt with `decision`, every other request with text."""

    def __init__(self, decision: str) -> None:
        self.decision = decision
        self.requests: list = []

    async def generate(self, request):
        self.requests.append(request)
        if request.system_prompt.startswith("You route"):
            return LlmOutcome(self.decision, (), 0, 1)
        return LlmOutcome("ответ", (), 0, 1)


@pytest.mark.parametrize(
    ("sections", "kw"),
    [
        ((), {}),  # no sections found
        ((_section(1, RU * 3, 0.9),), {}),  # S1 with one section
        ((), {"query": "курс доллара"}),  # S2
        ((), {"selected_doc_ids": ("d1",)}),  # S3
    ],
)
async def test_a_short_question_fits_the_lowest_context_budget(sections, kw):
    config = RuntimeConfig(context_token_budget=MIN_CONTEXT_TOKEN_BUDGET)
    # With model routing: its prompt is the longest the Orchestrator sends.
    _, requests = await respond(sections, config=config, routing=True, **kw)
    assert requests[0].system_prompt.startswith("You route")
    for request in requests:
        assert llm_count(request, max_prompt_tokens=4096) <= request.context_token_budget


async def test_the_routing_prompt_with_a_short_question_fits_the_lowest_budget_with_the_model():
    generator = RoutingGenerator(ROUTE_DOCUMENTS)
    responder = Responder(
        Retriever((_section(1, RU, 0.9),)), generator,
        ConfigHolder(RuntimeConfig(context_token_budget=MIN_CONTEXT_TOKEN_BUDGET), 3),
        model_routing=True,
    )  # fmt: skip
    out = await responder.respond(
        RespondInput(query="Что делает сервер управления?", user=User("t", "u"))
    )
    assert out.scenario == "S1" and out.decided_by == "model"
    assert [len(r.context) for r in generator.requests] == [0, 1]
