"""A follow-up whose route comes from the conversation ("а для Беты?" after a question about a
contract) is searched with the earlier user question before it, within the query limits."""

import json
from datetime import date

import pytest

from services.common import errors
from services.common.generate_contract import MAX_MESSAGE_CHARS, last_question
from services.common.search_contract import MAX_QUERY_CHARS, normalise_query
from services.common.tool_contract import MAX_TOOL_QUERY_CHARS, SEARCH_GENERAL_KB
from services.orchestrator.model import (
    RespondInput,
    RetrievalOutcome,
    SectionCandidate,
    Turn,
    User,
)
from services.orchestrator.respond import Responder, follow_up_query
from services.orchestrator.runtime_config import ConfigHolder, RuntimeConfig
from tests.unit.test_orchestrator import FakeGenerator

TODAY = date(2026, 11, 28)
ALPHA = "Какой штраф за просрочку поставки в договоре с Альфой?"
HISTORY = (Turn("user", ALPHA), Turn("assistant", "Штраф 0,1% в день (договор alpha, с. 4)."))
SECTION = SectionCandidate("beta", "s-fines", "Штрафы", "Штраф за просрочку.", 0.8, 4, 4, "beta:c9")


class Retriever:
    def __init__(self, sections=(SECTION,)):
        self.sections = sections
        self.requests = []

    async def search(self, request):
        self.requests.append(request)
        if request.filters.source == "knowledge_base":
            return RetrievalOutcome((SECTION,), 1)
        return RetrievalOutcome(self.sections, 1)

    async def document_sizes(self, user, doc_ids):
        return {d: (200_000, 0, "t") for d in doc_ids}  # too big to read whole: S4


def make(sections=(SECTION,), routing=None):
    routed = None if routing is None else json.dumps(routing)
    retriever, generator = Retriever(sections), FakeGenerator(routed)
    responder = Responder(
        retriever, generator, ConfigHolder(RuntimeConfig(), 3),
        today=lambda: TODAY, model_routing=routing is not None,
    )  # fmt: skip
    return responder, retriever, generator


async def ask(responder, query, history=HISTORY, **kw):
    return await responder.respond(
        RespondInput(query=query, user=User("t1", "u1"), trace_id="tr", history=history, **kw)
    )


@pytest.mark.parametrize("follow_up", ["а для Беты?", "and for Beta?", "а на какой странице?"])
async def test_a_document_follow_up_is_searched_with_the_earlier_question(follow_up):
    responder, retriever, generator = make()
    out = await ask(responder, follow_up)
    assert (out.scenario, out.intent) == ("S1", "documents")
    assert [r.query for r in retriever.requests] == [f"{follow_up} {ALPHA}"]
    # The model is asked the follow-up itself, the earlier turns before it.
    assert last_question(generator.requests[-1].messages) == follow_up
    assert generator.requests[-1].messages[0] == HISTORY[0]


async def test_a_question_that_routes_on_its_own_is_searched_alone():
    responder, retriever, _ = make()
    await ask(responder, "Какой штраф за просрочку в договоре с Бетой?")
    assert [r.query for r in retriever.requests] == ["Какой штраф за просрочку в договоре с Бетой?"]


async def test_the_follow_up_continues_the_last_user_turn_that_says_something():
    responder, retriever, _ = make()
    history = (
        Turn("user", "Какая ставка НДС в договоре с Гаммой?"),
        Turn("user", ALPHA),
        Turn("user", "   "),
        Turn("assistant", "Штраф 0,1% в день."),
    )
    await ask(responder, "а для Беты?", history=history)
    assert [r.query for r in retriever.requests] == [f"а для Беты? {ALPHA}"]


async def test_the_earlier_question_is_searched_as_one_line():
    responder, retriever, _ = make()
    history = (Turn("user", "Какой штраф\n\tза просрочку   в договоре с Альфой?"),)
    await ask(responder, "а для Беты?", history=history)
    assert retriever.requests[0].query == f"а для Беты? {ALPHA.replace('поставки ', '')}"


async def test_without_an_earlier_user_question_a_follow_up_is_searched_alone():
    """Nothing earlier to lean on, but something to search: searched as it is (S5 only when
    there is nothing to search); an assistant's turn is no question to continue."""
    for history in ((Turn("assistant", ALPHA),), ()):
        responder, retriever, _ = make()
        out = await ask(responder, "а для Беты?", history=history)
        assert out.scenario == "S1" and [r.query for r in retriever.requests] == ["а для Беты?"]


async def test_a_follow_up_of_a_word_alone_is_searched_with_it():
    responder, retriever, _ = make(routing=ROUTED_TO_DOCUMENTS)
    out = await ask(responder, "а для Беты?", history=(Turn("user", "LDAP"),))
    assert out.scenario == "S1" and retriever.requests[0].query == "а для Беты? LDAP"
    # In a chain, the question before the word wins: the word was its follow-up.
    history = (Turn("user", ALPHA), Turn("user", "пени?"))
    await ask(responder, "а для Беты?", history=history)
    assert retriever.requests[1].query.startswith(f"а для Беты? {ALPHA[:20]}")


async def test_with_nothing_to_search_and_no_earlier_question_it_is_asked_back():
    responder, retriever, _ = make()
    out = await ask(responder, "а на вчера?", history=(Turn("assistant", ALPHA),))
    assert out.scenario == "S5" and retriever.requests == []


async def test_a_knowledge_base_follow_up_plans_and_searches_with_the_earlier_question():
    responder, retriever, generator = make()
    history = (Turn("user", "Какие налоговые ставки для ИП?"), Turn("assistant", "..."))
    out = await ask(responder, "а для ООО?", history=history)
    assert (out.scenario, out.intent) == ("S2", "knowledge_base")
    (planned,) = generator.requests[-1].planned_calls
    assert planned.tool_name == SEARCH_GENERAL_KB
    assert planned.arguments["query"] == "а для ООО? Какие налоговые ставки для ИП?"
    assert [r.query for r in retriever.requests] == ["а для ООО? Какие налоговые ставки для ИП?"]


async def test_a_definition_follow_up_falling_back_to_the_knowledge_base_keeps_the_question():
    # The documents find nothing for "а ставки? Что такое НДС?": the knowledge base answers.
    responder, retriever, generator = make(sections=())
    out = await ask(
        responder, "а ставки?", history=(Turn("user", "Что такое НДС?"), Turn("assistant", "..."))
    )
    assert (out.scenario, out.intent) == ("S2", "knowledge_base")
    assert [r.query for r in retriever.requests] == ["а ставки? Что такое НДС?"] * 2
    assert generator.requests[-1].planned_calls[0].arguments["query"] == "а ставки? Что такое НДС?"


ROUTED_TO_DOCUMENTS = {"scenario": "S1", "intent": "documents", "clarifications": [],
                       "currency": "", "date": "", "news_query": ""}  # fmt: skip


async def test_a_follow_up_the_model_routes_is_searched_with_the_earlier_question():
    responder, retriever, _ = make(routing=ROUTED_TO_DOCUMENTS)
    out = await ask(responder, "а для Беты?")
    assert out.decided_by == "model"
    assert [r.query for r in retriever.requests] == [f"а для Беты? {ALPHA}"]
    await ask(responder, "Какой штраф за просрочку в договоре с Бетой?")
    assert retriever.requests[-1].query == "Какой штраф за просрочку в договоре с Бетой?"


async def test_a_chain_of_follow_ups_is_searched_with_the_question_it_started_from():
    responder, retriever, _ = make(routing=ROUTED_TO_DOCUMENTS)
    history = (*HISTORY, Turn("user", "а для Беты?"), Turn("assistant", "Штраф 0,2% в день."))
    await ask(responder, "а для Гаммы?", history=history)
    assert [r.query for r in retriever.requests] == [f"а для Гаммы? {ALPHA}"]


async def test_small_talk_before_a_vague_question_is_not_searched_with_it():
    responder, retriever, _ = make(routing=ROUTED_TO_DOCUMENTS)
    await ask(responder, "а для Беты?", history=(Turn("user", "Привет!"), Turn("assistant", "Hi")))
    assert [r.query for r in retriever.requests] == ["а для Беты?"]


async def test_a_search_in_selected_documents_is_routed_by_the_selection_not_the_history():
    responder, retriever, _ = make()
    out = await ask(responder, "а для Беты?", selected_doc_ids=("beta",))
    assert out.scenario == "S4"
    assert [r.query for r in retriever.requests] == ["а для Беты?"]


# -- the query limits ----------------------------------------------------------------------


def vague(length: int) -> str:
    """A follow-up of `length` characters that routes only by the conversation."""
    return "а для Беты" + "?" * (length - len("а для Беты"))


@pytest.mark.parametrize("past", [0, 1])
async def test_the_search_holds_max_query_chars_by_cutting_the_earlier_question(past):
    # At the limit the earlier question is whole; one character more cuts its last word
    # («Альфой?»), never the follow-up.
    query = vague(MAX_QUERY_CHARS - len(ALPHA) - 1 + past)
    responder, retriever, _ = make()
    await ask(responder, query)
    kept = ALPHA if not past else ALPHA.removesuffix(" Альфой?")
    assert [r.query for r in retriever.requests] == [f"{query} {kept}"]
    assert len(retriever.requests[0].query) == MAX_QUERY_CHARS - past * len(" Альфой")


async def test_a_follow_up_at_max_query_chars_is_searched_alone_and_one_past_is_refused():
    responder, retriever, _ = make()
    await ask(responder, vague(MAX_QUERY_CHARS))
    assert [r.query for r in retriever.requests] == [vague(MAX_QUERY_CHARS)]
    with pytest.raises(errors.LimitExceededError) as info:
        await ask(responder, vague(MAX_QUERY_CHARS + 1))
    assert info.value.metadata == {"field": "query", "limit": str(MAX_QUERY_CHARS)}
    assert len(retriever.requests) == 1


@pytest.mark.parametrize("past", [0, 1])
async def test_the_planned_knowledge_base_query_holds_the_tool_limit_the_same_way(past):
    earlier = "Какие налоговые ставки для ИП?"
    query = "а для ООО" + "?" * (MAX_TOOL_QUERY_CHARS - len(earlier) - 1 + past - len("а для ООО"))
    responder, retriever, generator = make()
    await ask(responder, query, history=(Turn("user", earlier),))
    planned = generator.requests[-1].planned_calls[0].arguments["query"]
    kept = earlier if not past else earlier.removesuffix(" ИП?")
    assert planned == f"{query} {kept}" and len(planned) <= MAX_TOOL_QUERY_CHARS
    assert retriever.requests[0].query == f"{query} {earlier}"  # the search's limit is wider


def test_follow_up_query_at_and_past_its_limit():
    assert follow_up_query("ab cd", "q", 7) == "q ab cd"  # at the limit: whole
    assert follow_up_query("ab cd", "q", 6) == "q ab"  # one past: the cut word goes whole
    assert follow_up_query("ab cd", "q", 5) == "q ab"  # the cut at a space: no word lost
    assert follow_up_query("abcd", "q", 5) == "q"  # no whole word fits: the follow-up alone
    assert follow_up_query("ab cd", "qqq", 4) == "qqq"  # no room: the follow-up alone
    assert follow_up_query("ab cd", "qqqq", 4) == "qqqq"
    assert follow_up_query("ab cd", "qqqqq", 4) == "qqqq"  # longer than the tool takes
    assert follow_up_query("", "q", 7) == "q"
    assert follow_up_query(" \n ", "q", 7) == "q"


async def test_a_long_earlier_turn_is_cut_to_what_the_search_holds():
    responder, retriever, _ = make(routing=ROUTED_TO_DOCUMENTS)
    earlier = ALPHA + " Подробности:" + " текст" * (MAX_MESSAGE_CHARS // 6)
    await ask(responder, "а для Беты?", history=(Turn("user", earlier[:MAX_MESSAGE_CHARS]),))
    searched = retriever.requests[0].query
    assert MAX_QUERY_CHARS - len(" текст") < len(searched) <= MAX_QUERY_CHARS
    assert searched.startswith(f"а для Беты? {ALPHA}") and searched.endswith(" текст")


@pytest.mark.parametrize(("past", "routed"), [(0, True), (len("договор"), False)])
async def test_an_earlier_turn_is_judged_by_its_first_max_query_chars(past, routed):
    # "договор" routes a turn to the documents: within the first MAX_QUERY_CHARS, and just
    # past them (where the turn's first MAX_QUERY_CHARS name nothing).
    earlier = ("? " * MAX_QUERY_CHARS)[: MAX_QUERY_CHARS - len("договор") + past] + "договор"
    responder, retriever, _ = make(routing=ROUTED_TO_DOCUMENTS)
    await ask(responder, "а для Беты?", history=(Turn("user", earlier),))
    assert (retriever.requests[0].query != "а для Беты?") is routed


def test_the_follow_up_is_measured_as_the_search_measures_it():
    """NFKC lengthens "…" to "...": the combined query is held to the limit normalised, so
    Retrieval's own check (the normalised length) never refuses it."""
    earlier = "слово " * 1000
    query = "а для Беты…?"
    combined = follow_up_query(earlier, query, MAX_QUERY_CHARS)
    assert len(normalise_query(combined)) <= MAX_QUERY_CHARS
    assert combined.startswith("а для Беты...?")
