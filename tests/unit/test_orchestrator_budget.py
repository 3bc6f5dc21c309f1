"""The orchestrator's first prompts fit the LLM service's limit, counted the LLM's own way.

Every request the orchestrator builds is turned into the LLM service's GenerateInput and
priced with the LLM's prompt builder, its real tool definitions (ToolsProxy's catalogue) and
its budget (services/llm/budget.py): the LLM must never refuse it with LLM_LIMIT_EXCEEDED.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import httpx
import pytest

from services.common import errors
from services.common.generate_contract import MAX_MESSAGE_CHARS, turn_parts
from services.common.prompt_limits import LLM_PROMPT_RESERVE_TOKENS
from services.common.search_contract import MAX_QUERY_CHARS
from services.common.settings import Env
from services.common.shared_config import llm_prompt_limit
from services.common.tokenizer import default_tokenizer
from services.llm import budget as llm_budget
from services.llm import prompt as llm_prompt
from services.llm.extractive import asked
from services.llm.model import Anchor, GenerateInput, PlannedCall, ToolPolicy
from services.llm.model import User as LlmUser
from services.model_runtime.chat import ToolSpec
from services.orchestrator.config import OrchestratorSettings
from services.orchestrator.model import (
    LlmOutcome,
    RespondInput,
    RetrievalOutcome,
    SectionCandidate,
    Turn,
    User,
)
from services.orchestrator.prompt_budget import MIN_SUMMARY_TOKENS, PromptFitter
from services.orchestrator.respond import Responder
from services.orchestrator.runtime_config import ConfigHolder, RuntimeConfig
from services.orchestrator.scenarios import decision_prompt
from services.toolsproxy.cbr import CbrClient, CbrSettings, cbr_tool
from services.toolsproxy.search_tools import SearchTools
from services.toolsproxy.tavily import TavilyClient, TavilySettings, tavily_tool
from services.toolsproxy.tools import DocumentTools, ToolLimits

TOK = default_tokenizer()
RU = (
    "Сервер управления хранит конфигурацию кластера, журналирует изменения и раздаёт "
    "политики агентам; при отказе основного узла роль переходит к резервному, а клиенты "
    "переподключаются автоматически без потери сессий. "
)


def _catalogue() -> dict[str, ToolSpec]:
    http = httpx.AsyncClient()
    tools = {
        **DocumentTools(None, ToolLimits()).tools,  # type: ignore[arg-type]
        **SearchTools(None).tools,  # type: ignore[arg-type]
        "fetch_cbr_data": cbr_tool(CbrClient(http, CbrSettings())),
        "fetch_finance_news": tavily_tool(TavilyClient(TavilySettings(), http)),
    }
    return {n: ToolSpec(t.name, t.description, t.schema) for n, t in tools.items()}


CATALOGUE = _catalogue()


def _section(i: int, summary: str, score: float, ids: str = "") -> SectionCandidate:
    return SectionCandidate(
        f"doc-{ids}{i:02d}", f"sec-{ids}{i:02d}", f"Раздел {i}: настройка кластера", summary,
        score, i, i + 1, f"doc-{ids}{i:02d}:c{i}",
    )  # fmt: skip


class Retriever:
    def __init__(self, sections):
        self.sections = tuple(sections)

    async def search(self, request):
        return RetrievalOutcome(self.sections, 1)

    async def document_sizes(self, user, doc_ids):
        return {d: (1000, 400, "Title") for d in doc_ids}


class Generator:
    def __init__(self):
        self.requests = []

    async def generate(self, request):
        self.requests.append(request)
        return LlmOutcome("ответ", (), 0, 1)


def llm_count(request, *, max_prompt_tokens: int) -> int:
    """What the LLM service counts for `request`'s first prompt; raises as the LLM would."""
    offered = [CATALOGUE[t] for t in request.allowed_tools] if request.max_tool_steps else []
    anchors = tuple(Anchor(s.doc_id, s.section_id, s.anchor_chunk_id) for s in request.context)
    req = GenerateInput(
        messages=tuple(Turn(m.role, m.content) for m in request.messages),
        mode=request.mode,
        system_prompt=request.system_prompt,
        user=LlmUser(request.user.tenant_id, request.user.user_id),
        policy=ToolPolicy(
            allowed_tools=request.allowed_tools,
            anchors=anchors,
            max_tool_steps=request.max_tool_steps,
            context_token_budget=request.context_token_budget,
            planned_calls=tuple(
                PlannedCall(p.tool_name, p.arguments) for p in request.planned_calls
            ),
        ),
    )
    budget = llm_budget.TokenBudget(
        TOK, max_prompt_tokens=max_prompt_tokens, max_completion_tokens=512,
        max_total_tokens=max(32_768, max_prompt_tokens + 512),
        context_token_budget=request.context_token_budget,
    )  # fmt: skip

    def build(chunks):
        return llm_prompt.build_prompt(
            req, chunks, tools=offered, anchors=anchors if offered else (), max_tool_calls=3
        )

    messages, _ = llm_budget.fit_prompt(
        build, (), tools=offered, limit=budget.prompt_limit, tokenizer=TOK,
        render_chunk=llm_prompt.render_chunk,
    )  # fmt: skip
    return budget.start(messages, offered)


async def respond(sections, *, limit=4096, config=None, routing=False, **kw):
    generator = Generator()
    responder = Responder(
        Retriever(sections), generator, ConfigHolder(config or RuntimeConfig(), 3),
        model_routing=routing, llm_prompt_limit=limit,
    )  # fmt: skip
    req = RespondInput(**{"query": "Что делает сервер управления?", "user": User("t", "u"), **kw})
    out = await responder.respond(req)
    return out, generator.requests


def _old_section_list(sections, budget_chars):
    """The list as it was built before: prompt_token_budget*4 characters."""
    share = max(40, budget_chars // len(sections))
    return "\n".join(
        f"{i}. doc_id={s.doc_id} section_id={s.section_id} anchor_chunk_id={s.anchor_chunk_id} "
        f"pages={s.page_start}-{s.page_end} score={s.score:.3f}\n   title: {s.title}\n"
        f"   summary: {s.summary[:share]}"
        for i, s in enumerate(sections, 1)
    )


TEN_RUSSIAN = [_section(i, RU * 8, 0.9 - i / 100) for i in range(10)]


async def test_ten_russian_summaries_at_budget_times_four_characters_overflowed_the_llm():
    """The issue's reproduction: 2048 x 4 characters of Cyrillic (~2 a token) as the list
    made the LLM refuse an ordinary question (400 "the prompt is N tokens without context")."""
    _, requests = await respond(TEN_RUSSIAN)
    listing = _old_section_list(TEN_RUSSIAN, 2048 * 4)
    old = replace(
        requests[0],
        messages=(Turn("user", f"Question: Что делает сервер?\n\nSections found:\n{listing}"),),
        context=tuple(TEN_RUSSIAN),
    )
    assert TOK.count(listing) > 4096 - LLM_PROMPT_RESERVE_TOKENS
    with pytest.raises(errors.LimitExceededError, match="without context"):
        llm_count(old, max_prompt_tokens=4096)


async def test_ten_long_russian_summaries_fit_the_llm_prompt_limit():
    out, requests = await respond(TEN_RUSSIAN)
    (request,) = requests
    assert llm_count(request, max_prompt_tokens=4096) <= 4096
    # Trimmed, not refused: the best section is listed whole-ish, the worst went first.
    prompt = request.messages[-1].content
    assert "doc-00" in prompt and len(request.context) >= 1
    assert out.sources[0].doc_id == "doc-00"


@pytest.mark.parametrize("limit", [2048, 3000, 4096, 8192])
@pytest.mark.parametrize("n", [1, 10, 50])
async def test_s1_first_prompts_fit_whatever_the_sections(limit, n):
    rng = random.Random(n * limit)
    sections = [
        _section(i, RU * rng.randint(1, 12), rng.random(), ids="x" * rng.randint(0, 60))
        for i in range(n)
    ]
    _, requests = await respond(sections, limit=limit, max_results=50)
    assert llm_count(requests[-1], max_prompt_tokens=limit) <= limit


@pytest.mark.parametrize(("budget", "dropped"), [(1200, False), (600, True)])
async def test_lowest_scored_summaries_are_shortened_then_dropped_first(budget, dropped):
    sections = [_section(i, RU * 8, 1.0 - i / 10) for i in range(10)]
    fitter = PromptFitter(TOK, 4096)
    fitted = fitter.fit(
        system="s", history=(), query="q", context_token_budget=8192,
        sections=sections, list_budget=budget,
    )  # fmt: skip
    kept = fitted.sections
    assert kept == tuple(sections[: len(kept)])  # the best ones stay, in order
    assert (len(kept) < len(sections)) == dropped
    lines = [ln for ln in fitted.question.split("\n") if ln.startswith("   summary: ")]
    sizes = [TOK.count(ln) for ln in lines]
    assert sizes == sorted(sizes, reverse=True)  # the best summaries are the longest
    assert sizes[0] > sizes[-1] or dropped  # dropping starts once all are at the minimum
    listing = fitted.question.partition("Sections found:\n")[2]
    assert TOK.count(listing) <= budget


async def test_a_list_at_its_budget_is_kept_whole_and_one_token_less_trims_it():
    sections = [_section(i, RU, 1.0 - i / 10) for i in range(3)]
    fitter = PromptFitter(TOK, 1 << 20, reserve=0)
    whole = fitter.fit(
        system="", history=(), query="q", context_token_budget=1 << 20, sections=sections,
        list_budget=1 << 20,
    )  # fmt: skip
    size = TOK.count(whole.question.partition("Sections found:\n")[2])
    at = fitter.fit(
        system="", history=(), query="q", context_token_budget=1 << 20, sections=sections,
        list_budget=size,
    )  # fmt: skip
    assert at.question == whole.question
    past = fitter.fit(
        system="", history=(), query="q", context_token_budget=1 << 20, sections=sections,
        list_budget=size - 1,
    )  # fmt: skip
    assert past.question != whole.question
    assert TOK.count(past.question.partition("Sections found:\n")[2]) <= size - 1


async def test_the_best_section_stays_even_past_a_tiny_list_budget():
    _, requests = await respond(TEN_RUSSIAN, config=RuntimeConfig(prompt_token_budget=1))
    assert [s.doc_id for s in requests[0].context] == ["doc-00"]
    summary = requests[0].messages[-1].content.split("summary: ")[1].partition("\n\n(")[0]
    assert TOK.count(summary) <= MIN_SUMMARY_TOKENS + 1


async def test_long_history_is_trimmed_oldest_first_in_every_scenario():
    history = tuple(
        Turn("user" if i % 2 == 0 else "assistant", f"turn {i}: " + RU * 6) for i in range(20)
    )
    cases: list[dict[str, Any]] = [
        {},  # S1
        {"selected_doc_ids": ("d1",)},  # S3 (1,000 characters)
        {"query": "Какая ставка НДС на услуги?"},  # S2 knowledge base
        {"query": "курс доллара"},  # S2 rates
        {"query": "помоги"},  # S5
    ]
    for kw in cases:
        _, requests = await respond(TEN_RUSSIAN, history=history, **kw)
        request = requests[-1]
        assert llm_count(request, max_prompt_tokens=4096) <= 4096, kw
        kept = [m for m in request.messages[:-1]]
        assert kept == list(history[len(history) - len(kept) :]), kw  # the newest turns


async def test_the_routing_prompt_fits_too():
    history = tuple(Turn("user", RU * 10) for _ in range(20))
    _, requests = await respond(TEN_RUSSIAN, history=history, routing=True)
    routing = requests[0]
    assert routing.system_prompt.startswith("You route")
    assert llm_count(routing, max_prompt_tokens=4096) <= 4096


async def test_a_question_too_long_for_the_routing_prompt_is_routed_by_the_rules():
    # The routing prompt holds the question twice (as data and as the user's turn): a
    # question the answering prompt holds is answered, routed by the rules, never a 400.
    query = "Как настроить сервер управления кластера для резервного копирования? " * 55
    assert len(query) <= MAX_QUERY_CHARS
    with pytest.raises(errors.LimitExceededError):  # what the routing call would need
        PromptFitter(TOK, 4096).fit(
            system=decision_prompt(query), history=(), query=query, context_token_budget=4096
        )
    out, requests = await respond(TEN_RUSSIAN, routing=True, query=query)
    assert (out.scenario, out.decided_by) == ("S1", "rules")
    assert not any(r.system_prompt.startswith("You route") for r in requests)
    assert llm_count(requests[-1], max_prompt_tokens=4096) <= 4096
    # A question neither prompt holds is still the caller's 400.
    with pytest.raises(errors.LimitExceededError) as info:
        await respond(TEN_RUSSIAN, routing=True, query="䷀" * 4000)
    assert info.value.reason == "LLM_LIMIT_EXCEEDED"


def _long_sections(n: int) -> list[SectionCandidate]:
    return [_section(i, f"{i} " + RU * 5, 0.9 - i / 100) for i in range(n)]


def test_the_question_with_its_list_stays_one_message_the_llm_takes():
    # Token limits far above the defaults (MAX_PROMPT_TOKENS 32768, prompt_token_budget
    # 16000): 50 long summaries make more characters than the one message the LLM service
    # takes (MAX_MESSAGE_CHARS), which it refused.
    sections = _long_sections(50)
    assert sum(len(s.summary) for s in sections) > MAX_MESSAGE_CHARS
    fitted = PromptFitter(TOK, 1 << 20, reserve=0).fit(
        system="", history=(), query="q", context_token_budget=1 << 20, sections=sections,
        list_budget=1 << 20,
    )  # fmt: skip
    assert len(fitted.question) <= MAX_MESSAGE_CHARS
    assert not all(s.summary.strip() in fitted.question for s in sections)  # cut to fit


def test_a_list_at_the_message_limit_is_kept_whole_and_one_character_more_cuts_it():
    sections = _long_sections(24)
    fitter = PromptFitter(TOK, 1 << 20, reserve=0)

    def fit(query: str):
        return fitter.fit(
            system="", history=(), query=query, context_token_budget=1 << 20,
            sections=sections, list_budget=1 << 20,
        )  # fmt: skip

    short = fit("q").question
    assert len(fit("q").sections) == 24 and all(s.summary.strip() in short for s in sections)
    at_limit = "q" * (MAX_MESSAGE_CHARS - len(short) + 1)
    at = fit(at_limit)
    assert len(at.question) == MAX_MESSAGE_CHARS and len(at.sections) == 24
    assert turn_parts(at.question)[1] == turn_parts(short)[1]  # every summary whole
    past = fit(at_limit + "q")
    assert len(past.question) <= MAX_MESSAGE_CHARS
    assert turn_parts(past.question)[1] != turn_parts(short)[1]


async def test_a_lower_context_budget_lowers_the_room():
    config = RuntimeConfig(context_token_budget=2500)
    _, requests = await respond(TEN_RUSSIAN, config=config)
    assert llm_count(requests[0], max_prompt_tokens=4096) <= 2500


async def test_a_question_that_alone_cannot_fit_is_the_callers_400():
    # 4,000 characters is within the query limit (4,096) but ~4,000 tokens of emoji-like text.
    with pytest.raises(errors.LimitExceededError) as info:
        await respond(TEN_RUSSIAN, query="䷀" * 4000)
    assert info.value.reason == "LLM_LIMIT_EXCEEDED"
    metadata = info.value.metadata
    assert metadata["field"] == "query" and metadata["limit_name"] == "max_prompt_tokens"
    assert int(metadata["limit"]) > 0  # the room in tokens, as every limit error says it


async def test_a_question_at_the_room_passes_and_one_token_more_is_refused():
    fitter = PromptFitter(TOK, 1000, reserve=0)
    fixed = fitter.fit(system="", history=(), query="", context_token_budget=1000).tokens
    words = 1000 - fixed  # "word word …" is one token a word
    at = " ".join(["word"] * words)
    assert TOK.count(at) == words
    assert fitter.fit(system="", history=(), query=at, context_token_budget=1000).tokens == 1000
    with pytest.raises(errors.LimitExceededError) as info:
        fitter.fit(system="", history=(), query=at + " word", context_token_budget=1000)
    assert info.value.metadata["field"] == "query"


def test_the_limit_is_read_from_the_llm_services_own_setting():
    assert llm_prompt_limit(Env({})) == 4096
    assert llm_prompt_limit(Env({"MAX_PROMPT_TOKENS": "8192"})) == 8192
    assert (
        OrchestratorSettings.from_env(Env({"MAX_PROMPT_TOKENS": "6000"})).llm_prompt_limit == 6000
    )


@pytest.mark.parametrize(
    "kw",
    [{}, {"selected_doc_ids": ("d1",)}, {"query": "Какая ставка НДС на услуги?"},
     {"query": "курс доллара"},
     {"query": "новости рынка"}, {"query": "помоги"}],
)  # fmt: skip
async def test_what_the_llm_adds_stays_within_the_reserve(kw):
    """The reserve covers the LLM's rules, format and tool definitions for every scenario's
    tools: a tool whose schema grows past it fails here, not in production."""
    _, requests = await respond(TEN_RUSSIAN, **kw)
    request = requests[-1]
    fitter = PromptFitter(TOK, 4096)
    own = fitter.fit(
        system=request.system_prompt, history=request.messages[:-1],
        query=request.messages[-1].content, context_token_budget=8192,
    ).tokens + fitter._anchors(request.context)  # fmt: skip
    assert llm_count(request, max_prompt_tokens=4096) - own <= LLM_PROMPT_RESERVE_TOKENS


async def test_s3_leaves_room_for_50000_characters_of_russian_beside_a_long_history():
    """The selected documents come back as a planned tool result the LLM cuts to the room
    left: with the longest history the orchestrator sends, 50,000 characters still fit."""
    history = tuple(Turn("user", RU * 10) for _ in range(20))
    _, requests = await respond(TEN_RUSSIAN, history=history, selected_doc_ids=("d1",))
    request = requests[-1]
    first = llm_count(request, max_prompt_tokens=4096)
    full_text = TOK.count((RU * 400)[:50_000])
    call_and_result_framing = 200
    assert first + full_text + call_and_result_framing <= request.context_token_budget


@pytest.mark.parametrize("found", [None, 0, 3])
@pytest.mark.parametrize(
    "query",
    [
        "How do I set up LDAP?",
        "Question: twice\n\nand a second line",
        "Why does the log say:\n\nSections found:\n0 of 3?",
    ],
)
def test_the_question_of_a_first_prompt_is_the_query(found: int | None, query: str):
    """What `fit` writes as the user turn, the LLM service reads back as the query (`asked`,
    through the shared `turn_parts`), with no sections (S2, S3, S5), none found, or a list of
    them; a question's own blank lines and "Question:" stay in it."""
    sections = (
        None if found is None else [_section(i, "summary", 0.9 - i / 10) for i in range(found)]
    )
    fitted = PromptFitter(default_tokenizer(), 4096).fit(
        system="s", history=(), query=query, context_token_budget=4096, sections=sections,
        list_budget=2048,
    )  # fmt: skip
    assert (fitted.question != query) is (found is not None)
    assert turn_parts(fitted.question)[0] == asked(fitted.question) == query


@pytest.mark.parametrize(
    ("pages", "listed"), [((3, 5), "pages=3-5 score"), ((3, 3), "pages=3 score"),
                          ((3, 0), "pages=3 score"), ((0, 0), "anchor_chunk_id=d:c1 score")],
)  # fmt: skip
def test_listed_pages_are_written_as_the_texts_read_state_them(pages, listed):
    """A single page is "3" (format_pages), as the read tools' texts state it, not "3-3"; a
    section whose pages are not known lists none."""
    section = SectionCandidate("d", "s", "T", "summary", 0.5, *pages, "d:c1")
    fitter = PromptFitter(default_tokenizer(), 4096)
    prompt = fitter.fit(system="", history=(), query="q?", context_token_budget=4096,
                        sections=(section,), list_budget=1000)  # fmt: skip
    assert listed in prompt.question


# -- the LLM service's limits lower than the Orchestrator was told --------------------------


class StricterLlm(Generator):
    """An LLM service whose MAX_PROMPT_TOKENS / MAX_COMPLETION_TOKENS are below what the
    Orchestrator's environment says: it refuses as the real one does, and the error reaches the
    Responder as status.from_rpc_error makes it (downstream "llm", limit and limit_name)."""

    def __init__(self, max_prompt_tokens: int, max_completion_tokens: int = 512):
        super().__init__()
        self.max_prompt_tokens = max_prompt_tokens
        self.max_completion_tokens = max_completion_tokens
        self.refused = 0

    def _refuse(self, message: str, limit: int, name: str) -> errors.LimitExceededError:
        self.refused += 1
        meta = {"downstream": "llm", "downstream_code": "INVALID_ARGUMENT"}
        return errors.LimitExceededError(
            f"llm: {message}", reason="LLM_LIMIT_EXCEEDED",
            metadata={**meta, "limit": str(limit), "limit_name": name},
        )  # fmt: skip

    async def generate(self, request):
        self.requests.append(request)
        if request.max_tokens and request.max_tokens > self.max_completion_tokens:
            raise self._refuse("max_tokens", self.max_completion_tokens, "max_completion_tokens")
        try:
            llm_count(request, max_prompt_tokens=self.max_prompt_tokens)
        except errors.LimitExceededError as exc:
            raise self._refuse(exc.message, self.max_prompt_tokens, "max_prompt_tokens") from None
        return LlmOutcome("ответ", (), 0, 1)


async def test_a_lower_llm_prompt_limit_is_learned_and_the_request_answered(caplog):
    llm = StricterLlm(max_prompt_tokens=1500)
    responder = Responder(
        Retriever(TEN_RUSSIAN), llm, ConfigHolder(RuntimeConfig(), 3), model_routing=False,
        llm_prompt_limit=4096,
    )  # fmt: skip
    req = RespondInput("Что делает сервер управления?", User("t", "u"))
    with caplog.at_level("ERROR", logger="visior.orchestrator"):
        out = await responder.respond(req)
    assert out.answer == "ответ" and llm.refused == 1 and len(llm.requests) == 2
    assert llm_count(llm.requests[1], max_prompt_tokens=1500) <= 1500
    [record] = [r for r in caplog.records if "MAX_PROMPT_TOKENS" in r.getMessage()]
    assert (record.limit_name, record.llm_limit, record.ours) == ("max_prompt_tokens", 1500, 4096)
    await responder.respond(req)  # fitted to the LLM's limit from the start now
    assert llm.refused == 1 and len(llm.requests) == 3


async def test_a_lower_llm_answer_limit_is_learned_by_the_routing_call():
    llm = StricterLlm(max_prompt_tokens=4096, max_completion_tokens=64)
    responder = Responder(
        Retriever(TEN_RUSSIAN), llm, ConfigHolder(RuntimeConfig(), 3), model_routing=True,
        llm_prompt_limit=4096,
    )  # fmt: skip
    req = RespondInput("Что делает сервер управления?", User("t", "u"))
    await responder.respond(req)  # the routing call is refused: the rules route
    assert llm.refused == 1
    await responder.respond(req)
    routing = [r for r in llm.requests if r.max_tokens]
    assert [r.max_tokens <= 64 for r in routing] == [False, True] and llm.refused == 1


async def test_an_llm_limit_not_below_the_orchestrators_stays_the_error_it_was():
    """The LLM refusing at a limit no lower than the Orchestrator's own: nothing to learn
    (its count differs, or the caller's budget bound); the refusal reaches the caller."""
    llm = StricterLlm(max_prompt_tokens=1500)
    responder = Responder(
        Retriever(TEN_RUSSIAN), llm, ConfigHolder(RuntimeConfig(), 3), model_routing=False,
        llm_prompt_limit=1400,
    )  # fmt: skip

    async def refuse(request):
        raise llm._refuse("the prompt", 1500, "max_prompt_tokens")

    llm.generate = refuse  # type: ignore[method-assign]
    with pytest.raises(errors.LimitExceededError) as info:
        await responder.respond(RespondInput("Что делает сервер?", User("t", "u")))
    assert info.value.metadata["limit"] == "1500" and llm.refused == 1
