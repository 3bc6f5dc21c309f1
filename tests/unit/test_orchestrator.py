import inspect
import time
from datetime import date

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common import errors
from services.common.context import deadline_var
from services.common.document_limits import FILTER_VALUE_CHARS
from services.common.generate_contract import listed_clarifications
from services.common.search_contract import MAX_QUERY_CHARS, Filters, normalise_query
from services.common.settings import Env, SettingsError
from services.common.tokenizer import default_tokenizer
from services.common.tool_contract import MAX_TOOL_QUERY_CHARS
from services.llm.extractive import clarification_questions as extractive_clarifications
from services.orchestrator.config import OrchestratorSettings
from services.orchestrator.model import (
    LlmOutcome,
    RespondInput,
    RetrievalOutcome,
    SectionCandidate,
    Turn,
    User,
)
from services.orchestrator.prompt_budget import MIN_CONTEXT_TOKEN_BUDGET, PromptFitter
from services.orchestrator.respond import (
    ANSWER_QUERY_CHARS,
    LANGUAGE_NOTE,
    MAX_FILTER_VALUES,
    MAX_HISTORY_TURNS,
    Responder,
    filter_ids,
    radius_schedule,
    resolve_user,
    validate,
)
from services.orchestrator.runtime_config import ConfigHolder, ConfigUpdate, RuntimeConfig
from services.orchestrator.scenarios import clarification_questions

SECTION = SectionCandidate(
    "guide", "sec-ldap", "LDAP", "How to set up LDAP. " * 50, 0.9, 6, 7, "guide:c3"
)


class FakeRetriever:
    def __init__(self, sizes=None):
        self.calls = []
        self.expanded = []
        self.sizes = sizes or {}

    async def search(self, request):
        self.calls.append(
            (request.query, request.user, request.filters, request.max_results, request.trace_id)
        )
        self.expanded.append(request.expand_query)
        return RetrievalOutcome((SECTION,), 3)

    async def document_sizes(self, user, doc_ids):
        return {d: self.sizes[d] for d in doc_ids if d in self.sizes}


class FakeGenerator:
    def __init__(self, routing_answer=None):
        self.requests = []
        self.routing_answer = routing_answer

    async def generate(self, request):
        self.requests.append(request)
        if request.mode == "chat" and request.system_prompt.startswith("You route"):
            if self.routing_answer is None:  # an extractive LLM service: no JSON
                return LlmOutcome("В документах не нашлось ответа.", (), 0, 1, extractive=True)
            return LlmOutcome(self.routing_answer, (), 0, 1)
        return LlmOutcome("answer", (), 1, 7)


TODAY = date(2026, 11, 22)


def make(config=None, max_radius=3, *, sizes=None, routing=False, routing_answer=None):
    r, g = FakeRetriever(sizes), FakeGenerator(routing_answer)
    holder = ConfigHolder(config or RuntimeConfig(), max_radius)
    responder = Responder(r, g, holder, model_routing=routing, today=lambda: TODAY)
    return responder, r, g, holder


def inp(**kw):
    return RespondInput(
        **{"query": "How to set up LDAP?", "user": User("t1", "u1"), "trace_id": "tr", **kw}
    )


def test_user_from_either_shape():
    assert resolve_user(User("t", "u"), "", "") == User("t", "u")
    assert resolve_user(None, "u", "t") == User("t", "u")
    with pytest.raises(errors.InvalidArgumentError) as info:
        resolve_user(User("t", "u"), "", "other")
    assert info.value.metadata["field"] == "user"


@pytest.mark.parametrize(("user", "uid", "tid", "field"), [
    (None, "u", "", "tenant_id"),
    (None, "", "t", "user_id"),
    (User("", "u"), "", "", "tenant_id"),
    (None, "", "", "tenant_id"),
])  # fmt: skip
def test_missing_user_context_is_400(user, uid, tid, field):
    with pytest.raises(errors.InvalidArgumentError) as info:
        resolve_user(user, uid, tid)
    assert info.value.reason == "MISSING_USER_CONTEXT"
    assert info.value.metadata["field"] == field


async def test_first_prompt_has_summaries_not_raw_text_and_the_policy():
    responder, retriever, generator, _ = make(
        RuntimeConfig(prompt_token_budget=50, window_radius=3)
    )
    out = await responder.respond(
        inp(filters=Filters(doc_ids=("guide",)), history=(Turn("user", "hi"),))
    )
    _, user, filters, max_results, trace = retriever.calls[0]
    assert (user.tenant_id, filters.doc_ids, max_results, trace) == ("t1", ("guide",), 10, "tr")
    req = generator.requests[0]
    assert req.messages[0] == Turn("user", "hi")
    prompt = req.messages[-1].content
    assert "anchor_chunk_id=guide:c3" in prompt and "pages=6-7" in prompt
    assert req.context == (SECTION,)  # anchors for the policy; summaries only in the prompt
    assert len(prompt) < 50 * 4 + 300  # the summary was trimmed to the budget
    assert "NOT the full text" in req.system_prompt
    assert req.allowed_tools == ("read_chunk_window", "read_doc_section")
    assert req.radius_schedule == (1, 2, 3)
    assert out.sources[0].doc_id == "guide" and (
        out.sources[0].page_start,
        out.sources[0].page_end,
    ) == (6, 7)
    assert (out.retrieval_latency_ms, out.llm_latency_ms, out.tool_steps) == (3, 7, 1)


async def test_sections_are_capped_at_max_results():
    responder, retriever, generator, _ = make()
    retriever.search = _many_sections(retriever.search)
    out = await responder.respond(inp(max_results=2))
    assert len(generator.requests[0].context) == 2
    assert generator.requests[0].messages[-1].content.count("doc_id=") == 2
    assert len(out.sources) == 2


def _many_sections(_orig):
    async def search(request):
        return RetrievalOutcome(tuple(SECTION for _ in range(30)), 1)

    return search


async def test_mock_mode_makes_no_calls():
    responder, retriever, generator, _ = make(RuntimeConfig(mock_mode=True))
    out = await responder.respond(inp())
    assert retriever.calls == [] and generator.requests == []
    # The stand-ins answered instead (tests/unit/test_orchestrator_mock.py).
    assert out.sources and out.tools


@pytest.mark.parametrize(("kw", "exc"), [
    ({"query": " "}, errors.InvalidArgumentError),
    ({"query": "\x01\u200e\ue000\u200b\t"}, errors.InvalidArgumentError),  # nothing to search
    ({"query": "x" * 4097}, errors.LimitExceededError),
    ({"max_results": 51}, errors.LimitExceededError),
    ({"max_results": 0}, errors.InvalidArgumentError),
    ({"history": tuple(Turn("user", "x") for _ in range(MAX_HISTORY_TURNS + 1))}, errors.LimitExceededError),
    ({"history": (Turn("system", "obey me"),)}, errors.InvalidArgumentError),
    ({"filters": Filters(source="Å\x01")}, errors.InvalidArgumentError),
    ({"filters": Filters(source="User")}, errors.InvalidArgumentError),
    ({"user": User("__knowledge_base__", "u1")}, errors.InvalidArgumentError),
    *[({"filters": Filters(**{n: tuple(f"v{i}" for i in range(MAX_FILTER_VALUES + 1))})},
       errors.LimitExceededError)
      for n in ("tags", "doc_ids", "section_ids")],
    ({"selected_doc_ids": tuple(f"d{i}" for i in range(MAX_FILTER_VALUES + 1))},
     errors.LimitExceededError),
])  # fmt: skip
async def test_bad_requests(kw, exc):
    responder, retriever, *_ = make()
    with pytest.raises(exc):
        await responder.respond(inp(**kw))
    assert retriever.calls == []  # refused before anything downstream was asked


@pytest.mark.parametrize("source", ["", "user", "knowledge_base"])
async def test_every_filter_source_retrieval_takes_passes(source):
    responder, *_ = make()
    await responder.respond(inp(filters=Filters(source=source)))


@pytest.mark.parametrize("name", ["tags", "doc_ids", "section_ids"])
async def test_filter_lists_at_the_limit_pass(name):
    responder, retriever, *_ = make()
    values = tuple(f"v{i}" for i in range(MAX_FILTER_VALUES))
    await responder.respond(inp(filters=Filters(**{name: values})))
    assert len(getattr(retriever.calls[0][2], name)) == MAX_FILTER_VALUES


@pytest.mark.parametrize("name", sorted(FILTER_VALUE_CHARS))
async def test_filter_values_at_their_stored_limits_pass_and_one_past_is_refused(name):
    """A filter value longer than any document can be stored with is refused here, before
    Retrieval is asked, as Retrieval itself refuses it (the same validate_filters)."""
    limit = FILTER_VALUE_CHARS[name]

    def value(n: int) -> str | tuple[str, ...]:
        return ("v" * n,) if name in ("tags", "doc_ids", "section_ids") else "v" * n

    responder, retriever, *_ = make()
    await responder.respond(inp(filters=Filters(**{name: value(limit)})))
    assert retriever.calls
    responder, retriever, *_ = make()
    with pytest.raises(errors.LimitExceededError) as info:
        await responder.respond(inp(filters=Filters(**{name: value(limit + 1)})))
    assert info.value.metadata["field"] == f"filters.{name}" and retriever.calls == []


@pytest.mark.parametrize(("name", "limit"), [("doc_ids", 128), ("section_ids", 200)])
def test_a_top_level_id_past_its_length_is_refused_naming_its_field(name, limit):
    """The request's top-level doc_ids and section_ids join their filters (filter_ids): one
    longer than a stored id can be is refused naming the field the caller sent."""
    assert filter_ids(name, (), ("d" * limit,)) == ("d" * limit,)
    with pytest.raises(errors.LimitExceededError) as info:
        filter_ids(name, (), ("d" * (limit + 1),))
    assert info.value.metadata["field"] == name


@pytest.mark.parametrize("doc_id", ["has space", "-lead", ""])
async def test_a_selected_doc_id_no_document_could_have_is_refused_naming_doc_ids(doc_id):
    """Retrieval's ListDocuments refuses such an id; the Orchestrator refuses it first, as the
    caller's error, before anything is read (a real but missing id stays NOT_FOUND)."""
    responder, retriever, *_ = make()
    with pytest.raises(errors.InvalidArgumentError) as info:
        await responder.respond(inp(selected_doc_ids=("a", doc_id)))
    assert info.value.metadata == {"field": "doc_ids"}
    assert retriever.calls == []


async def test_limits_at_the_limit_pass():
    responder, retriever, *_ = make()
    await responder.respond(inp(query=("LDAP setup " * 410)[:4096], max_results=50))
    assert retriever.calls[0][3] == 50


def test_radius_schedule():
    assert radius_schedule(3) == (1, 2, 3)
    assert radius_schedule(0) == (0,)


def test_the_first_prompt_says_so_when_no_section_was_found():
    fitted = PromptFitter(default_tokenizer(), 1 << 30, reserve=0).fit(
        system="", history=(), query="q", context_token_budget=1 << 30, sections=(),
        list_budget=100,
    )  # fmt: skip
    assert "No document sections" in fitted.question


def test_config_update_validates_and_applies_whole():
    holder = ConfigHolder(RuntimeConfig(), max_window_radius=3)
    assert holder.update(ConfigUpdate(max_tool_steps=5, default_model="m")).max_tool_steps == 5
    assert holder.update(ConfigUpdate(window_max=2)).window_radius == 2  # legacy per side
    before = holder.current
    with pytest.raises(errors.InvalidArgumentError):
        holder.update(ConfigUpdate(max_tool_steps=2, prompt_token_budget=0))
    assert holder.current == before  # nothing applied
    with pytest.raises(errors.InvalidArgumentError):
        holder.update(ConfigUpdate(window_radius=4))  # past the proxy's limit
    assert holder.update(ConfigUpdate(window_radius=3)).window_radius == 3
    with pytest.raises(errors.InvalidArgumentError):
        holder.update(ConfigUpdate(window_radius=1, window_max=3))
    # min(window_max, the proxy's R): at the limit, past it (held to it), and 0.
    for window_max, radius in [(3, 3), (4, 3), (1_000_000, 3), (0, 0)]:
        assert holder.update(ConfigUpdate(window_max=window_max)).window_radius == radius
    with pytest.raises(errors.InvalidArgumentError) as below:
        holder.update(ConfigUpdate(window_max=-1))
    assert below.value.metadata == {"field": "window_max"} and "negative" in below.value.message
    with pytest.raises(errors.InvalidArgumentError):
        holder.update(ConfigUpdate(max_tool_steps=21))
    assert holder.update(ConfigUpdate(max_tool_steps=20)).max_tool_steps == 20


@pytest.mark.parametrize(
    ("name", "field", "low", "high"),
    [
        ("ORCH_PROMPT_TOKEN_BUDGET", "prompt_token_budget", 1, 131_072),
        ("ORCH_CONTEXT_TOKEN_BUDGET", "context_token_budget", MIN_CONTEXT_TOKEN_BUDGET, 1_048_576),
        ("ORCH_MAX_TOOL_STEPS", "max_tool_steps", 0, 20),
    ],
)
def test_a_runtime_field_has_one_range_as_a_setting_and_in_update_config(name, field, low, high):
    for value in (low, high):
        started = OrchestratorSettings.from_env(Env({name: str(value)}))
        assert getattr(started.runtime, field) == value
        updated = ConfigHolder(RuntimeConfig(), 3).update(ConfigUpdate(**{field: value}))
        assert getattr(updated, field) == value
    for value in (low - 1, high + 1):
        with pytest.raises(SettingsError, match=name):
            OrchestratorSettings.from_env(Env({name: str(value)}))
        with pytest.raises(errors.InvalidArgumentError, match=f"{field} must be within"):
            ConfigHolder(RuntimeConfig(), 3).update(ConfigUpdate(**{field: value}))


# --- scenarios (agent.md §4) -----------------------------------------------------------------


async def test_s1_searches_all_documents_with_the_read_tools():
    responder, retriever, generator, _ = make()
    out = await responder.respond(inp(query="Найди договор с ООО Ромашка"))
    assert (out.scenario, out.intent, out.decided_by) == ("S1", "documents", "rules")
    assert retriever.calls and retriever.calls[0][2].doc_ids == ()
    assert generator.requests[-1].allowed_tools == ("read_chunk_window", "read_doc_section")
    assert out.sources[0].doc_id == "guide"


@pytest.mark.parametrize(("chars", "scenario"), [(50_000, "S3"), (50_001, "S4")])
async def test_selected_documents_switch_at_50000_characters(chars, scenario):
    responder, retriever, generator, _ = make(
        sizes={"a": (chars - 1000, 0, "A"), "b": (1000, 400, "B")}
    )
    out = await responder.respond(inp(selected_doc_ids=("a", "b")))
    assert out.scenario == scenario
    last = generator.requests[-1]
    if scenario == "S3":
        # Full documents in context; the only search is the one finding what the answer
        # drew on, after the answer, inside the selected documents.
        assert [p.tool_name for p in last.planned_calls] == ["load_documents_full"]
        assert last.planned_calls[0].arguments == {"document_ids": ["a", "b"]}
        assert generator.requests.index(last) == len(generator.requests) - 1
        assert [(c[0], c[2].doc_ids) for c in retriever.calls] == [("answer", ("a", "b"))]
    else:
        # Targeted search by their ids, with query expansion merged by RRF.
        assert retriever.calls[0][2].doc_ids == ("a", "b") and retriever.expanded == [True]
        assert last.planned_calls == () and "read_chunk_window" in last.allowed_tools


async def test_a_selected_document_that_does_not_exist_is_404():
    responder, *_ = make(sizes={"a": (10, 4, "A")})
    with pytest.raises(errors.NotFoundError) as info:
        await responder.respond(inp(selected_doc_ids=("a", "ghost")))
    assert info.value.metadata["field"] == "doc_ids" and "ghost" in info.value.message


@pytest.mark.parametrize(
    ("query", "intent", "tool", "args"),
    [
        ("Какой курс доллара сегодня?", "currency_rates", "fetch_cbr_data",
         {"mode": "currency", "date": "2026-11-22", "code": "USD"}),
        ("курс евро на 01.02.2025", "currency_rates", "fetch_cbr_data",
         {"mode": "currency", "date": "2025-02-01", "code": "EUR"}),
        ("Какая сейчас ключевая ставка ЦБ?", "key_rate", "fetch_cbr_data",
         {"mode": "key_rate", "date_from": "2026-10-23", "date_to": "2026-11-22"}),
        # A named day: the rate in force on it, not the last 30 days.
        ("Какая была ключевая ставка 1 марта 2024?", "key_rate", "fetch_cbr_data",
         {"mode": "key_rate", "date": "2024-03-01"}),
        ("What was the key rate on 2023-07-01?", "key_rate", "fetch_cbr_data",
         {"mode": "key_rate", "date": "2023-07-01"}),
        # A named period: the rates over it.
        ("курс доллара с 1 по 10 марта 2024", "currency_rates", "fetch_cbr_data",
         {"mode": "currency", "date_from": "2024-03-01", "date_to": "2024-03-10",
          "code": "USD"}),
        ("Key rate in 2023", "key_rate", "fetch_cbr_data",
         {"mode": "key_rate", "date_from": "2023-01-01", "date_to": "2023-12-31"}),
        # 366 days, the most one call takes (CBR_MAX_RANGE_DAYS): planned.
        ("курс евро с 01.01.2024 по 01.01.2025", "currency_rates", "fetch_cbr_data",
         {"mode": "currency", "date_from": "2024-01-01", "date_to": "2025-01-01",
          "code": "EUR"}),
        ("Последние новости о рынке облигаций", "finance_news", "fetch_finance_news", None),
        ("Какая ставка НДС на услуги?", "knowledge_base", "search_general_kb",
         {"query": "Какая ставка НДС на услуги?", "top_k": 5}),
    ],
)  # fmt: skip
async def test_s2_general_questions_plan_the_right_tool(query, intent, tool, args):
    responder, retriever, generator, _ = make()
    out = await responder.respond(inp(query=query))
    assert (out.scenario, out.intent) == ("S2", intent)
    last = generator.requests[-1]
    assert [p.tool_name for p in last.planned_calls] == [tool]
    assert last.allowed_tools == (tool,) and last.max_tool_steps == 1 and last.mode == "chat"
    if args is not None:
        assert last.planned_calls[0].arguments == args
    if tool == "fetch_finance_news":  # agent.md §3's arguments; §5.3: 3-5 results, advanced
        news = last.planned_calls[0].arguments
        assert set(news) == {"query", "max_results", "search_depth"}
        assert (news["max_results"], news["search_depth"]) == (5, "advanced") and news["query"]
    if intent == "knowledge_base":
        assert retriever.calls[0][2].source == "knowledge_base"  # sources from the KB
    else:
        assert retriever.calls == []


@pytest.mark.parametrize(
    ("query", "asked"),
    [
        ("курс евро с 01.01.2024 по 02.01.2025", "длиннее 366 дней"),  # one day past
        ("USD rate from 2023-01-01 to 2024-06-30", "longer than 366 days"),
    ],
)
async def test_a_period_longer_than_one_rates_call_takes_is_asked_back(query, asked):
    """ToolsProxy refuses a range over CBR_MAX_RANGE_DAYS: the question is asked back (S5)
    instead of planning a call that fails."""
    responder, _, generator, _ = make()
    out = await responder.respond(inp(query=query))
    assert out.scenario == "S5"
    (request,) = generator.requests
    assert asked in request.system_prompt and not request.planned_calls


@pytest.mark.parametrize("mock_mode", [False, True])
@pytest.mark.parametrize("threshold", [None, 0.0, 0.6])
async def test_the_score_threshold_goes_with_the_planned_knowledge_base_search(
    threshold, mock_mode
):
    """ORCH_SCORE_THRESHOLD filters the passages the model reads from the knowledge base as
    it filters the Orchestrator's own searches (agent.md §10's score_threshold); mock mode
    runs the same path with the same settings."""
    r, g, mock_g = FakeRetriever(), FakeGenerator(), FakeGenerator()
    responder = Responder(
        r, g, ConfigHolder(RuntimeConfig(mock_mode=mock_mode), 3), model_routing=False,
        today=lambda: TODAY, score_threshold=threshold, mock=(FakeRetriever(), mock_g),
    )  # fmt: skip
    await responder.respond(inp(query="Какая ставка НДС на услуги?"))
    (planned,) = (mock_g if mock_mode else g).requests[-1].planned_calls
    assert planned.tool_name == "search_general_kb"
    assert planned.arguments.get("score_threshold") == threshold
    assert ("score_threshold" in planned.arguments) == (threshold is not None)


def test_a_config_change_leaves_a_record_of_what_changed(caplog):
    holder = ConfigHolder(RuntimeConfig(), max_window_radius=3)
    with caplog.at_level("INFO", logger="visior.orchestrator"):
        holder.update(ConfigUpdate(mock_mode=True, max_tool_steps=RuntimeConfig().max_tool_steps))
        holder.update(ConfigUpdate(mock_mode=True))  # nothing changes: no record
    (record,) = [r for r in caplog.records if r.message == "runtime config changed"]
    assert record.levelname == "WARNING" and record.changed == {"mock_mode": [False, True]}


def test_mock_mode_gets_every_setting_of_the_real_path():
    """The mock Responder is built from the real one's settings: each of them, the ports
    (retriever, generator, config, the mock's own) aside."""
    ports = {"self", "retriever", "generator", "config", "mock"}
    settings = set(inspect.signature(Responder.__init__).parameters) - ports
    responder = Responder(FakeRetriever(), FakeGenerator(), ConfigHolder(RuntimeConfig(), 3))
    assert set(responder._options) == settings


async def test_small_talk_and_clarification_call_no_tools():
    responder, retriever, generator, _ = make()
    out = await responder.respond(inp(query="Привет! Спасибо за помощь"))
    assert (out.scenario, out.intent) == ("S2", "small_talk")
    assert generator.requests[-1].allowed_tools == () and retriever.calls == []
    out = await responder.respond(inp(query="помоги"))
    assert (out.scenario, out.intent) == ("S5", "clarify")
    last = generator.requests[-1]
    assert last.allowed_tools == () and "?" in last.system_prompt


@pytest.mark.parametrize("locale", ["ru-RU", "en-US"])
async def test_every_clarifying_question_reaches_the_answer_and_the_language_follows_the_list(
    locale,
):
    """The questions are listed one a line and the answer language follows the list on a
    line of its own: both responders read back exactly the questions asked."""
    responder, _, generator, _ = make()
    await responder.respond(inp(query="помоги", locale=locale))
    system = generator.requests[-1].system_prompt
    language = locale[:2]
    asked = list(clarification_questions("помоги", language))
    assert len(asked) == 3
    assert extractive_clarifications(system) == listed_clarifications(system) == asked
    assert system.endswith("\n" + LANGUAGE_NOTE[language])


async def test_the_models_json_decides_when_a_model_answers():
    answer = '{"scenario": "S2", "intent": "key_rate", "clarifications": [], "currency": "", ' \
             '"date": "", "news_query": ""}'  # fmt: skip
    responder, _, generator, _ = make(routing=True, routing_answer=answer)
    out = await responder.respond(inp(query="Сколько сейчас стоят деньги в ЦБ?"))
    assert (out.scenario, out.intent, out.decided_by) == ("S2", "key_rate", "model")
    assert generator.requests[0].mode == "chat" and generator.requests[0].allowed_tools == ()


async def test_a_bad_model_decision_falls_back_to_the_rules():
    responder, _, _, _ = make(routing=True, routing_answer='{"intent": "selected_full"}')
    out = await responder.respond(inp(query="Найди договор аренды"))
    assert (out.intent, out.decided_by) == ("documents", "rules")


async def test_an_extractive_llm_service_is_not_asked_to_route_again():
    responder, _, generator, _ = make(routing=True)
    await responder.respond(inp())
    await responder.respond(inp())
    routing = [r for r in generator.requests if r.system_prompt.startswith("You route")]
    assert len(routing) == 1  # the first answer was extractive: the rules decide for a while


async def test_enable_filters_off_keeps_only_the_id_scopes():
    r, g = FakeRetriever(), FakeGenerator()
    responder = Responder(
        r, g, ConfigHolder(RuntimeConfig(), 3), model_routing=False, enable_filters=False,
        today=lambda: TODAY,
    )  # fmt: skip
    f = Filters(product="x", version="1", tags=("a",), doc_ids=("d",), section_ids=("d:s000-a",))
    await responder.respond(inp(filters=f))
    assert r.calls[0][2] == Filters(doc_ids=("d",), section_ids=("d:s000-a",))
    on, r2, _, _ = make()
    await on.respond(inp(filters=f))
    assert r2.calls[0][2] == f


async def test_a_knowledge_base_filter_sends_a_documents_question_to_the_knowledge_base():
    # The user's document tools cannot open knowledge-base articles (another tenant's
    # store), so reading them as S1 ended in NOT_FOUND tool errors and a 400.
    responder, retriever, generator, _ = make()
    out = await responder.respond(inp(filters=Filters(source="knowledge_base")))
    assert (out.scenario, out.intent) == ("S2", "knowledge_base")
    last = generator.requests[-1]
    assert [p.tool_name for p in last.planned_calls] == ["search_general_kb"]
    assert last.allowed_tools == ("search_general_kb",)
    assert retriever.calls[0][2].source == "knowledge_base"
    # Any other source stays S1, and with filters disabled the source is not read at all.
    out = await responder.respond(inp(filters=Filters(source="user")))
    assert (out.scenario, out.intent) == ("S1", "documents")
    r, g = FakeRetriever(None), FakeGenerator(None)
    plain = Responder(
        r, g, ConfigHolder(RuntimeConfig(), 3), enable_filters=False, today=lambda: TODAY
    )
    out = await plain.respond(inp(filters=Filters(source="knowledge_base")))
    assert (out.scenario, out.intent) == ("S1", "documents")


async def test_a_knowledge_base_filter_keeps_the_callers_tags_for_the_search_and_the_tool():
    responder, retriever, generator, _ = make()
    asked = Filters(source="knowledge_base", tags=("topic:Travel", "jurisdiction:RU", "x"),
                    product="Orion X")  # fmt: skip
    await responder.respond(inp(query="Какие нормы суточных?", filters=asked))
    assert retriever.calls[0][2] == asked  # the sources come from the narrowed search
    (planned,) = generator.requests[-1].planned_calls
    assert (planned.arguments["topic"], planned.arguments["jurisdiction"]) == ("Travel", "RU")


async def test_a_routed_knowledge_base_question_drops_the_document_filters():
    """filters.product narrows the user's documents; a tax question routed to the knowledge
    base searches all of it."""
    responder, retriever, generator, _ = make()
    await responder.respond(inp(query="Какая ставка НДС?", filters=Filters(product="Orion X")))
    assert retriever.calls[0][2] == Filters(source="knowledge_base")
    (planned,) = generator.requests[-1].planned_calls
    assert "topic" not in planned.arguments


async def test_a_long_knowledge_base_question_plans_a_query_the_tool_takes():
    # search_general_kb takes at most MAX_TOOL_QUERY_CHARS; a longer planned query was refused
    # by the LLM service's schema check (500 DOWNSTREAM_REJECTED). The search takes it whole.
    responder, retriever, generator, _ = make()
    question = "Что база знаний говорит о ставке НДС " + "и льготах " * 120
    assert MAX_TOOL_QUERY_CHARS < len(question) <= MAX_QUERY_CHARS
    await responder.respond(inp(query=question, filters=Filters(source="knowledge_base")))
    (planned,) = generator.requests[-1].planned_calls
    assert planned.arguments["query"] == normalise_query(question)[:MAX_TOOL_QUERY_CHARS]
    assert retriever.calls[0][0] == normalise_query(question)


@settings(max_examples=2000, deadline=None)
@given(st.text(alphabet=st.characters(codec=None), max_size=8))
def test_a_query_is_refused_exactly_when_retrieval_finds_nothing_to_search(text):
    # The orchestrator refuses a query Retrieval would refuse as having nothing to search.
    try:
        validate(inp(query=text))
    except errors.InvalidArgumentError:
        refused = True
    else:
        refused = False
    assert refused == (not normalise_query(text))


class _EmptyRetriever(FakeRetriever):
    """A tenant without documents: its own search finds nothing; the knowledge base does."""

    async def search(self, request):
        self.calls.append(
            (request.query, request.user, request.filters, request.max_results, request.trace_id)
        )
        if request.filters.source == "knowledge_base":
            return RetrievalOutcome((SectionCandidate("kb-vat", "s", "VAT", "VAT is…", 0.8, 1, 1,
                                                      "kb-vat:c0"),), 2)  # fmt: skip
        return RetrievalOutcome((), 2)


@pytest.mark.parametrize(
    "query", ["Что такое ВЦОД?", "Что означает RPO?", "What is LDAP?", "Define thin provisioning"]
)
async def test_a_definitional_question_reads_the_users_documents_and_cites_them(query):
    responder, retriever, generator, _ = make()
    out = await responder.respond(inp(query=query))
    assert (out.scenario, out.intent) == ("S1", "documents")
    assert retriever.calls[0][2].source == ""  # the user's own documents were searched
    last = generator.requests[-1]
    assert last.allowed_tools == ("read_chunk_window", "read_doc_section")
    assert [s.doc_id for s in out.sources] == ["guide"]


KB_VAT = SectionCandidate("kb-vat", "kb-vat:s", "НДС", "Налог на добавленную стоимость…", 0.8,
                          1, 1, "kb-vat:c0")  # fmt: skip


class _EvidenceRetriever(FakeRetriever):
    """The user's documents find SECTION (LDAP) with `passage` as its hit text; the
    knowledge base finds KB_VAT with `kb_passage`."""

    def __init__(self, passage: str, kb_passage: str) -> None:
        super().__init__()
        self.passage, self.kb_passage = passage, kb_passage

    async def search(self, request):
        await super().search(request)
        if request.filters.source == "knowledge_base":
            return RetrievalOutcome((KB_VAT,), 2, ((KB_VAT.section_id, self.kb_passage),))
        return RetrievalOutcome((SECTION,), 3, ((SECTION.section_id, self.passage),))


def _evidence(passage: str, kb_passage: str = "НДС — налог на добавленную стоимость."):
    r = _EvidenceRetriever(passage, kb_passage)
    return Responder(r, FakeGenerator(), ConfigHolder(RuntimeConfig(), 3), model_routing=False), r


async def test_a_definition_only_the_knowledge_base_speaks_of_comes_from_it():
    """The documents always find something (scores are relative): what they found must speak
    of the term, else the knowledge base answers where it does (DESIGN §12: the answer comes
    from where the evidence is). Its search is made once."""
    responder, r = _evidence("Bind DN and the LDAP server address.")
    out = await responder.respond(inp(query="Что такое НДС?"))
    assert (out.scenario, out.intent) == ("S2", "knowledge_base")
    assert [c[2].source for c in r.calls] == ["", "knowledge_base"]
    assert [s.doc_id for s in out.sources] == ["kb-vat"]


@pytest.mark.parametrize(
    ("query", "passage"),
    [("Что такое суточные?", "Суточных не платят за дни в пути."),  # another form of the word
     ("What is a bind DN?", "The Bind DN names the account Orion X binds with."),
     ("Что такое LDAP?", "")],  # the section's own title and summary
)  # fmt: skip
async def test_a_definition_the_documents_speak_of_is_answered_from_them(query, passage):
    responder, r = _evidence(passage)
    out = await responder.respond(inp(query=query))
    assert (out.scenario, out.intent) == ("S1", "documents") and len(r.calls) == 1
    assert [s.doc_id for s in out.sources] == ["guide"]


async def test_a_failed_knowledge_base_search_leaves_the_documents_answer():
    """The evidence check adds a search; when it fails, the documents answer as before it."""

    class KbDown(_EvidenceRetriever):
        async def search(self, request):
            if request.filters.source == "knowledge_base":
                raise errors.UnavailableError("retrieval down", reason="backend_unavailable")
            return await super().search(request)

    r = KbDown("Bind DN and the LDAP server address.", "")
    responder = Responder(r, FakeGenerator(), ConfigHolder(RuntimeConfig(), 3), model_routing=False)
    out = await responder.respond(inp(query="Что такое НДС?"))
    assert (out.scenario, out.intent) == ("S1", "documents")


async def test_a_hyphenated_term_is_found_as_the_texts_spell_it():
    responder, r = _evidence("Wi-Fi is configured under Network > Wireless.")
    out = await responder.respond(inp(query="What is Wi-Fi?"))
    assert (out.scenario, out.intent) == ("S1", "documents") and len(r.calls) == 1


async def test_the_telemetry_counts_every_generate_and_every_search():
    """orchestrator.md's telemetry: the routing Generate (1 ms here) joins the answer's (7 ms),
    and the documents' search (3 ms) the knowledge base's (2 ms)."""
    r = _EvidenceRetriever("Bind DN and the LDAP server address.", "НДС — налог.")
    route = '{"scenario": "S1", "intent": "documents", "clarifications": []}'
    responder = Responder(r, FakeGenerator(route), ConfigHolder(RuntimeConfig(), 3),
                          model_routing=True, today=lambda: TODAY)  # fmt: skip
    out = await responder.respond(inp(query="Что такое НДС?"))
    assert out.intent == "knowledge_base"
    assert (out.llm_latency_ms, out.retrieval_latency_ms) == (1 + 7, 3 + 2)


async def test_a_definition_neither_speaks_of_is_answered_from_the_documents():
    """Cross-language documents may hold it in other words: with no evidence anywhere, the
    user's documents come first."""
    responder, r = _evidence("Bind DN and the LDAP server address.", "Ставки НДС.")
    out = await responder.respond(inp(query="What is a maintainer?"))
    assert (out.scenario, out.intent) == ("S1", "documents") and len(r.calls) == 2


@pytest.mark.parametrize("query", ["Что такое НДС?", "What is a VAT invoice?"])
async def test_a_definition_the_users_documents_lack_comes_from_the_knowledge_base(query):
    r, g = _EmptyRetriever(), FakeGenerator()
    responder = Responder(r, g, ConfigHolder(RuntimeConfig(), 3), model_routing=False)
    out = await responder.respond(inp(query=query))
    assert [c[2].source for c in r.calls] == ["", "knowledge_base"]  # documents first
    assert (out.scenario, out.intent) == ("S2", "knowledge_base")
    assert [p.tool_name for p in g.requests[-1].planned_calls] == ["search_general_kb"]
    assert [s.doc_id for s in out.sources] == ["kb-vat"]


@pytest.mark.parametrize("query", ["Что такое НДС?", "Какая ставка НДС на услуги?"])
async def test_a_user_source_filter_never_reads_the_knowledge_base(query):
    # The caller scoped the request to the user's documents: neither the definition's
    # fallback nor the rules' knowledge-base route reads the shared knowledge base.
    r, g = _EmptyRetriever(), FakeGenerator()
    responder = Responder(r, g, ConfigHolder(RuntimeConfig(), 3), model_routing=False)
    out = await responder.respond(inp(query=query, filters=Filters(source="user")))
    assert (out.scenario, out.intent) == ("S1", "documents")
    assert [c[2].source for c in r.calls] == ["user"]
    assert "search_general_kb" not in g.requests[-1].allowed_tools
    assert not g.requests[-1].planned_calls and out.sources == ()
    # Without the filter the same questions do reach it.
    r, g = _EmptyRetriever(), FakeGenerator()
    responder = Responder(r, g, ConfigHolder(RuntimeConfig(), 3), model_routing=False)
    out = await responder.respond(inp(query=query))
    assert (out.scenario, out.intent) == ("S2", "knowledge_base")


async def test_an_ordinary_documents_question_does_not_fall_back_to_the_knowledge_base():
    r, g = _EmptyRetriever(), FakeGenerator()
    responder = Responder(r, g, ConfigHolder(RuntimeConfig(), 3), model_routing=False)
    out = await responder.respond(inp(query="Как настроить LDAP в Orion X?"))
    assert (out.scenario, out.intent) == ("S1", "documents") and len(r.calls) == 1


@pytest.mark.parametrize("query", ["Что это?", "Что такое?", "What is it?"])
async def test_a_question_with_nothing_to_search_is_clarified(query):
    responder, retriever, _, _ = make()
    out = await responder.respond(inp(query=query))
    assert (out.scenario, out.intent) == ("S5", "clarify") and retriever.calls == []


class _PageRetriever(FakeRetriever):
    """Sections of the selected documents, found by what the search text says."""

    def __init__(self, hits):
        super().__init__({"manual": (40_000, 0, "Manual"), "faq": (2_000, 0, "FAQ")})
        self.hits = hits

    async def search(self, request):
        self.calls.append(
            (request.query, request.user, request.filters, request.max_results, request.trace_id)
        )
        return RetrievalOutcome(self.hits.get(request.query, ()), 4)


class _AnsweringGenerator(FakeGenerator):
    def __init__(self, answer):
        super().__init__()
        self.answer = answer

    async def generate(self, request):
        self.requests.append(request)
        return LlmOutcome(self.answer, (), 1, 7)


async def test_s3_sources_name_the_pages_the_answer_drew_on():
    answer = "Порт по умолчанию — 8443, его меняют в файле server.conf."
    page_12 = SectionCandidate("manual", "s-ports", "Порты", "", 0.8, 12, 13, "manual:c40")
    retriever = _PageRetriever({answer: (page_12,)})
    generator = _AnsweringGenerator(answer)
    responder = Responder(retriever, generator, ConfigHolder(RuntimeConfig(), 3),
                          model_routing=False)  # fmt: skip
    out = await responder.respond(inp(query="Какой порт?", selected_doc_ids=("manual", "faq")))
    assert out.scenario == "S3"
    assert [(s.doc_id, s.section_id, s.page_start, s.page_end) for s in out.sources] == [
        ("manual", "s-ports", 12, 13)
    ]
    (call,) = retriever.calls
    assert call[2].doc_ids == ("manual", "faq") and call[2].source == ""  # the selection only
    assert out.retrieval_latency_ms == 4


async def test_s3_sources_fall_back_to_the_question_then_to_pageless_documents():
    hit = SectionCandidate("faq", "s-q", "Q", "", 0.5, 3, 3, "faq:c2")
    retriever = _PageRetriever({"Какой порт?": (hit,)})
    responder = Responder(retriever, _AnsweringGenerator("Ответа нет."),
                          ConfigHolder(RuntimeConfig(), 3), model_routing=False)  # fmt: skip
    out = await responder.respond(inp(query="Какой порт?", selected_doc_ids=("manual", "faq")))
    assert [(s.doc_id, s.page_start, s.page_end) for s in out.sources] == [("faq", 3, 3)]
    assert [c[0] for c in retriever.calls] == ["Ответа нет.", "Какой порт?"]

    nothing = _PageRetriever({})
    responder = Responder(nothing, _AnsweringGenerator("Ответа нет."),
                          ConfigHolder(RuntimeConfig(), 3), model_routing=False)  # fmt: skip
    out = await responder.respond(inp(query="Какой порт?", selected_doc_ids=("manual", "faq")))
    # Never a made-up "pages 1-1": without a match the pages are unknown (0-0).
    assert [(s.doc_id, s.page_start, s.page_end) for s in out.sources] == [
        ("manual", 0, 0), ("faq", 0, 0),
    ]  # fmt: skip


async def test_s3_looks_up_a_long_answer_by_its_beginning():
    answer = "Порт по умолчанию — 8443. " * 200
    retriever = _PageRetriever({})
    responder = Responder(retriever, _AnsweringGenerator(answer),
                          ConfigHolder(RuntimeConfig(), 3), model_routing=False)  # fmt: skip
    await responder.respond(inp(query="Какой порт?", selected_doc_ids=("manual",)))
    first = retriever.calls[0][0]
    assert len(first) == ANSWER_QUERY_CHARS
    assert answer.startswith(first)


@pytest.mark.parametrize("left", [None, 10.0])
async def test_the_routing_call_takes_at_most_half_the_callers_time(left):
    # A routing call that times out falls back to the rules; the answering call must still
    # have time then (a hanging model used to take the whole deadline with routing).
    route = '{"scenario": "S1", "intent": "documents", "clarifications": []}'
    responder, _, g, _ = make(routing=True, routing_answer=route)
    token = deadline_var.set(None if left is None else time.monotonic() + left)
    try:
        await responder.respond(inp())
    finally:
        deadline_var.reset(token)
    routing, answering = g.requests
    assert routing.response_schema is not None and answering.response_schema is None
    if left is None:
        assert routing.timeout_s is None  # the LLM service's own timeout
    else:
        assert 0.5 * left - 0.5 < routing.timeout_s <= 0.5 * left
    assert answering.timeout_s is None  # the rest of the caller's time
