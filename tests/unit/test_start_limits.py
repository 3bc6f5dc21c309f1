"""Start-time limits that keep a mesh from refusing its callers' ordinary requests.

MAX_TOOL_STEPS is at least MIN_TOOL_STEPS: the Orchestrator plans one tool call (S2, S3), and
the LLM service refuses a plan past its limit as the caller's error. MAX_PROMPT_TOKENS is at
least MIN_FIRST_PROMPT_TOKENS: below it the Orchestrator's room (the limit less what the LLM
service adds) holds no short question, and every Respond is refused.
"""

from __future__ import annotations

import pytest

from services.common.prompt_limits import LLM_PROMPT_RESERVE_TOKENS
from services.common.settings import Env, SettingsError
from services.common.shared_config import (
    MIN_FIRST_PROMPT_TOKENS,
    MIN_PROMPT_ROOM_TOKENS,
    llm_prompt_limit,
)
from services.common.tokenizer import default_tokenizer
from services.devtools.mesh import local_model_env
from services.llm.config import MIN_TOOL_STEPS, LlmSettings
from services.orchestrator.config import OrchestratorSettings
from services.orchestrator.prompt_budget import MIN_CONTEXT_TOKEN_BUDGET, PromptFitter
from services.orchestrator.runtime_config import RuntimeConfig
from tests.unit.test_orchestrator_budget import RU, _section, llm_count, respond

# --- MAX_TOOL_STEPS --------------------------------------------------------------------------


def test_max_tool_steps_zero_is_refused_at_start() -> None:
    with pytest.raises(SettingsError, match="MAX_TOOL_STEPS=0 is below the minimum 1"):
        LlmSettings.from_env(Env({"MAX_TOOL_STEPS": "0"}))


def test_max_tool_steps_one_is_accepted() -> None:
    assert MIN_TOOL_STEPS == 1
    loop = LlmSettings.from_env(Env({"MAX_TOOL_STEPS": str(MIN_TOOL_STEPS)})).loop
    assert loop.max_tool_steps == 1


def test_the_orchestrators_own_steps_may_stay_zero() -> None:
    """It limits the model's own calls; the call the Orchestrator plans is made anyway."""
    s = OrchestratorSettings.from_env(Env({"ORCH_MAX_TOOL_STEPS": "0"}))
    assert s.runtime.max_tool_steps == 0


@pytest.mark.parametrize("kw", [{"query": "курс доллара"}, {"selected_doc_ids": ("d1",)}])
async def test_with_no_steps_of_its_own_the_orchestrator_plans_within_the_least_llm_limit(kw):
    """S2 and S3 at ORCH max_tool_steps 0 ask for no more calls than they plan, and at most
    MIN_TOOL_STEPS, which the LLM service always allows."""
    _, requests = await respond((), config=RuntimeConfig(max_tool_steps=0), **kw)
    (request,) = requests
    assert len(request.planned_calls) == 1
    assert len(request.planned_calls) <= request.max_tool_steps <= MIN_TOOL_STEPS


# --- MAX_PROMPT_TOKENS -----------------------------------------------------------------------


def test_the_least_prompt_limit_is_the_reserve_and_the_least_room() -> None:
    assert MIN_FIRST_PROMPT_TOKENS == LLM_PROMPT_RESERVE_TOKENS + MIN_PROMPT_ROOM_TOKENS
    assert MIN_CONTEXT_TOKEN_BUDGET == MIN_FIRST_PROMPT_TOKENS  # one rule, both inputs of room
    fitter = PromptFitter(default_tokenizer(), MIN_FIRST_PROMPT_TOKENS)
    assert fitter.room(RuntimeConfig().context_token_budget) == MIN_PROMPT_ROOM_TOKENS


@pytest.mark.parametrize(
    "start", [LlmSettings.from_env, OrchestratorSettings.from_env, llm_prompt_limit]
)
def test_max_prompt_tokens_at_the_minimum_is_accepted_and_one_below_refused(start) -> None:
    start(Env({"MAX_PROMPT_TOKENS": str(MIN_FIRST_PROMPT_TOKENS)}))
    below = MIN_FIRST_PROMPT_TOKENS - 1
    with pytest.raises(SettingsError, match=f"MAX_PROMPT_TOKENS={below} is below the minimum"):
        start(Env({"MAX_PROMPT_TOKENS": str(below)}))


@pytest.mark.parametrize("routing", [False, True])
async def test_a_default_s1_request_fits_the_least_prompt_limit(routing: bool) -> None:
    """At MAX_PROMPT_TOKENS = MIN_FIRST_PROMPT_TOKENS and the default runtime config, the
    Orchestrator's fitted prompts (the routing one included) pass the LLM service's count."""
    sections = [_section(i, RU * 8, 0.9 - i / 100) for i in range(10)]
    out, requests = await respond(sections, limit=MIN_FIRST_PROMPT_TOKENS, routing=routing)
    assert out.sources  # S1 answered, with at least the best section listed
    s1 = requests[-1]
    assert s1.context and s1.require_tool_call
    for request in requests:
        assert llm_count(request, max_prompt_tokens=MIN_FIRST_PROMPT_TOKENS) <= (
            MIN_FIRST_PROMPT_TOKENS
        )


def test_the_local_models_default_context_meets_the_least_prompt_limit() -> None:
    """`visior run --model local` at its default n_ctx (8192) and at 4096."""
    for n_ctx in (8192, 4096):
        env = local_model_env("http://127.0.0.1:1", "m", n_ctx, env={})
        assert int(env["MAX_PROMPT_TOKENS"]) >= MIN_FIRST_PROMPT_TOKENS
        LlmSettings.from_env(Env(env))
        OrchestratorSettings.from_env(Env(env))
