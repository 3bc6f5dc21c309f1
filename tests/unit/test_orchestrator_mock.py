"""Mock mode (orchestrator.md §3.6) runs the real Respond path over the in-process stand-ins;
agent.md §10's thresholds (max_context_chars, score_threshold, default_top_k) from settings."""

from datetime import date

import pytest

from services.common.search_contract import Filters
from services.common.settings import Env, SettingsError
from services.common.shared_config import entry_tokens, whole_read_tokens
from services.common.tokenizer import count_tokens
from services.orchestrator.config import MAX_CONTEXT_CHARS_LIMIT, OrchestratorSettings
from services.orchestrator.mock import (
    BASE_SCORE,
    SAMPLE_DOCUMENTS,
    MockGenerator,
    MockRetriever,
    MockTools,
    overlap_score,
)
from services.orchestrator.model import LlmOutcome, RespondInput, RetrievalRequest, User
from services.orchestrator.respond import (
    Responder,
    full_context_tokens,
)
from services.orchestrator.runtime_config import ConfigHolder, ConfigUpdate, RuntimeConfig
from services.orchestrator.scenarios import (
    MAX_CONTEXT_CHARS,
    Selection,
    decision_prompt,
    decision_schema,
    rule_decision,
)

TODAY = date(2026, 11, 22)
USER = User("t1", "u1")


class Unreachable:
    """The real ports: mock mode must never touch them."""

    def __init__(self):
        self.calls = 0

    async def search(self, *args, **kwargs):
        self.calls += 1
        raise AssertionError("retrieval called in mock mode")

    async def document_sizes(self, *args, **kwargs):
        self.calls += 1
        raise AssertionError("retrieval called in mock mode")

    async def generate(self, request):
        self.calls += 1
        return LlmOutcome("live answer", (), 0, 5)


def make(mock_mode=True, **kw):
    live = Unreachable()
    holder = ConfigHolder(RuntimeConfig(mock_mode=mock_mode), 3)
    responder = Responder(live, live, holder, today=lambda: TODAY, **kw)
    return responder, live, holder


def ask(query, **kw):
    return RespondInput(query=query, user=USER, trace_id="tr-1", **kw)


async def test_s1_reads_the_best_section_and_cites_it_with_pages():
    responder, live, _ = make()
    out = await responder.respond(ask("How do I set up LDAP integration?"))
    assert live.calls == 0
    assert out.scenario == "S1" and out.intent == "documents" and out.decided_by == "rules"
    top = out.sources[0]
    # The window read pp. 2-6: of sec_ldap (pp. 6-7) it read page 6, which the answer cites.
    assert (top.doc_id, top.section_id, top.page_start, top.page_end) == ("doc_1", "sec_ldap", 6, 6)
    assert top.score > BASE_SCORE
    assert [s.score for s in out.sources] == sorted((s.score for s in out.sources), reverse=True)
    (tool,) = out.tools
    assert tool.name == "read_chunk_window"
    assert tool.arguments == {"doc_id": "doc_1", "anchor_chunk_id": "doc_1:c3", "radius": 1}
    assert tool.result_summary.startswith("read ") and "of doc_1 (pp. 2–6)" in tool.result_summary
    assert out.tool_steps == 1 and out.trace_id == "tr-1"
    assert "Settings > Auth > LDAP" in out.answer and "Mock mode" in out.answer


async def test_the_tool_loop_follows_the_configured_window_radius():
    responder, _, holder = make()
    holder.update(ConfigUpdate(window_radius=0))  # the anchor alone
    out = await responder.respond(ask("How do I set up LDAP integration?"))
    assert out.tools[0].arguments["radius"] == 0
    assert out.tools[0].result_summary == "read 56 characters of doc_1 (pp. 6–6)"


async def test_no_tool_steps_still_reads_once_in_a_document_scenario():
    """max_tool_steps 0 would leave S1 citing sections it never read, answering "nothing
    found": a document scenario reads at least once, as S3 does."""
    responder, _, holder = make()
    holder.update(ConfigUpdate(max_tool_steps=0))
    out = await responder.respond(ask("How do I set up LDAP integration?"))
    assert out.tool_steps == 1 and len(out.tools) == 1 and out.sources
    assert out.sources[0].doc_id == out.tools[0].arguments["doc_id"]


async def test_answers_follow_the_question_language():
    responder, _, _ = make()
    out = await responder.respond(ask("Какая стоимость лицензий по договору поставки?"))
    assert out.scenario == "S1" and out.sources[0].doc_id == "doc_2"
    assert "1 200 000 рублей" in out.answer and "Демо-режим" in out.answer


async def test_s3_loads_the_selected_documents_whole():
    responder, _, _ = make()
    out = await responder.respond(ask("Какие сроки оплаты?", selected_doc_ids=("doc_2",)))
    assert out.scenario == "S3" and out.intent == "selected_full"
    assert [t.name for t in out.tools] == ["load_documents_full"]
    assert out.tools[0].arguments == {"document_ids": ["doc_2"]}
    assert out.sources and all(s.doc_id == "doc_2" for s in out.sources)
    assert "10 рабочих дней" in out.answer


async def test_s4_when_the_selection_is_over_the_configured_limit():
    size = len(SAMPLE_DOCUMENTS[1].text)
    responder, _, _ = make(max_context_chars=size - 1)
    out = await responder.respond(ask("Какие сроки оплаты?", selected_doc_ids=("doc_2",)))
    assert out.scenario == "S4" and out.intent == "selected_search"
    assert {s.doc_id for s in out.sources} == {"doc_2"}
    assert out.tools[0].name == "read_chunk_window"


@pytest.mark.parametrize(("max_documents", "scenario"), [(2, "S3"), (1, "S4")])
async def test_a_whole_read_takes_no_more_documents_than_one_load_documents_full_call(
    max_documents, scenario
):
    # Two small documents: S3 while one load_documents_full call takes both, S4 past it
    # (a planned call over ToolsProxy's maxItems would be refused, not answered).
    responder, _, _ = make(max_documents=max_documents)
    out = await responder.respond(ask("Какие сроки оплаты?", selected_doc_ids=("doc_1", "doc_2")))
    assert out.scenario == scenario
    if scenario == "S3":
        assert out.tools[0].arguments == {"document_ids": ["doc_1", "doc_2"]}
    else:
        assert "load_documents_full" not in {t.name for t in out.tools}


async def test_an_unknown_selected_document_is_not_found():
    from services.common import errors

    responder, _, _ = make()
    with pytest.raises(errors.NotFoundError):
        await responder.respond(ask("Что в нём?", selected_doc_ids=("nope",)))


@pytest.mark.parametrize(
    ("query", "intent", "tool", "fact"),
    [
        ("Какой курс доллара сегодня?", "currency_rates", "fetch_cbr_data", "USD/RUB"),
        ("Какая сейчас ключевая ставка ЦБ?", "key_rate", "fetch_cbr_data", "Key rate"),
        ("Последние новости рынка облигаций", "finance_news", "fetch_finance_news", "Demo"),
        ("Какая ставка НДС?", "knowledge_base", "search_general_kb", "20 процентов"),
    ],
)
async def test_s2_runs_the_planned_tool_on_demo_data(query, intent, tool, fact):
    responder, live, _ = make()
    out = await responder.respond(ask(query))
    assert live.calls == 0
    assert out.scenario == "S2" and out.intent == intent
    assert [t.name for t in out.tools] == [tool]
    assert not out.tools[0].result_summary.startswith("tool_error")
    assert fact in out.answer


async def test_s5_asks_the_clarifying_questions():
    responder, _, _ = make()
    out = await responder.respond(ask("помоги"))
    assert out.scenario == "S5" and out.tools == ()
    assert "?" in out.answer


async def test_update_config_switches_mock_mode_at_runtime():
    responder, live, holder = make(mock_mode=False, model_routing=False)
    holder.update(ConfigUpdate(mock_mode=True))
    mocked = await responder.respond(ask("How do I set up LDAP integration?"))
    assert live.calls == 0 and mocked.tools
    holder.update(ConfigUpdate(mock_mode=False))
    with pytest.raises(AssertionError, match="retrieval called"):
        await responder.respond(ask("How do I set up LDAP integration?"))


async def test_mock_routing_never_silences_the_live_model_routing():
    """The stand-in answers routing extractively; the live Responder still asks its model."""

    class Live(Unreachable):
        def __init__(self):
            super().__init__()
            self.routing = 0

        async def generate(self, request):
            if request.response_schema is not None:
                self.routing += 1
                return LlmOutcome('{"scenario": "S2", "intent": "small_talk"}', (), 0, 1)
            return LlmOutcome("hi", (), 0, 1)

    live = Live()
    holder = ConfigHolder(RuntimeConfig(mock_mode=True), 3)
    responder = Responder(live, live, holder, today=lambda: TODAY, model_routing=True)
    await responder.respond(ask("Привет!"))
    holder.update(ConfigUpdate(mock_mode=False))
    out = await responder.respond(ask("Привет!"))
    assert live.routing == 1 and out.decided_by == "model"


async def test_injected_mock_ports_are_used():
    retriever = MockRetriever(min_score=0.99)
    responder, _, _ = make(mock=(retriever, MockGenerator()))
    out = await responder.respond(ask("How do I set up LDAP integration?"))
    assert out.sources == () and out.tools == ()


# -- the stand-ins ---------------------------------------------------------------------------


async def test_mock_retriever_is_deterministic_and_applies_filters():
    r = MockRetriever()
    a = await r.search(RetrievalRequest("backup restore", USER, Filters(), 10, "t"))
    b = await r.search(RetrievalRequest("backup restore", USER, Filters(), 10, "t"))
    assert a == b and a.sections[0].section_id == "sec_backup"
    only = await r.search(RetrievalRequest("backup", USER, Filters(doc_ids=("doc_2",)), 10, "t"))
    assert {s.doc_id for s in only.sections} == {"doc_2"}
    kb = await r.search(RetrievalRequest("НДС", USER, Filters(source="knowledge_base"), 10, "t"))
    assert kb.sections[0].doc_id == "kb_vat"
    assert len((await r.search(RetrievalRequest("backup", USER, Filters(), 2, "t"))).sections) == 2


@pytest.mark.parametrize("limit", [BASE_SCORE, BASE_SCORE + 0.0001])
async def test_mock_retriever_min_score_at_the_limit_and_past_it(limit):
    r = MockRetriever(min_score=limit)
    found = await r.search(
        RetrievalRequest("zzzz qqqq", USER, Filters(), 50, "t")
    )  # shares no word: BASE_SCORE
    assert bool(found.sections) == (limit == BASE_SCORE)


def test_mock_tools_report_errors_as_the_llm_service_does():
    tools = MockTools()
    assert tools.call("read_chunk_window", {"doc_id": "x", "anchor_chunk_id": "x:c0"}).summary == (
        "tool_error NOT_FOUND: document 'x' not found"
    )
    assert not tools.call("read_doc_pages", {}).ok
    assert tools.call("fetch_cbr_data", {"mode": "currency", "code": "XXX"}).ok is False
    ok = tools.call("read_doc_section", {"doc_id": "doc_1", "section_id": "sec_backup"})
    assert ok.summary.endswith("of doc_1 (pp. 9–10)")


# -- agent.md §10 thresholds ------------------------------------------------------------------


def settings(**env):
    return OrchestratorSettings.from_env(Env(env))


def test_thresholds_default_to_the_spec_values():
    s = settings()
    assert s.max_context_chars == MAX_CONTEXT_CHARS == 50_000
    assert s.score_threshold is None and s.default_top_k == 10


@pytest.mark.parametrize(
    ("name", "value", "ok"),
    [
        ("ORCH_MAX_CONTEXT_CHARS", "1", True),
        ("ORCH_MAX_CONTEXT_CHARS", "0", False),
        ("ORCH_MAX_CONTEXT_CHARS", str(MAX_CONTEXT_CHARS_LIMIT), True),
        ("ORCH_MAX_CONTEXT_CHARS", str(MAX_CONTEXT_CHARS_LIMIT + 1), False),
        ("ORCH_SCORE_THRESHOLD", "0", True),
        ("ORCH_SCORE_THRESHOLD", "1", True),
        ("ORCH_SCORE_THRESHOLD", "1.0001", False),
        ("ORCH_SCORE_THRESHOLD", "-0.1", False),
        ("ORCH_SCORE_THRESHOLD", "nan", False),
        ("ORCH_DEFAULT_TOP_K", "50", True),
        ("ORCH_DEFAULT_TOP_K", "51", False),
        ("ORCH_DEFAULT_TOP_K", "0", False),
    ],
)
def test_threshold_settings_at_their_limits_and_past_them(name, value, ok):
    if ok:
        # ToolsProxy's largest whole read and an LLM total that holds it, so
        # ORCH_MAX_CONTEXT_CHARS's ceiling is not held lower.
        s = settings(**{name: value, "MCP_PROXY_MAX_FULL_TEXT_BYTES": str(3 << 20),
                        "LLM_SERVICE_MAX_TOTAL_TOKENS": "400000"})  # fmt: skip
        field = {"ORCH_MAX_CONTEXT_CHARS": "max_context_chars",
                 "ORCH_SCORE_THRESHOLD": "score_threshold",
                 "ORCH_DEFAULT_TOP_K": "default_top_k"}[name]  # fmt: skip
        assert getattr(s, field) == type(getattr(s, field))(float(value))
    else:
        with pytest.raises(SettingsError, match=name):
            settings(**{name: value})


PROXY_WHY = "MCP_PROXY_MAX_FULL_TEXT_BYTES / 4"
SMALL_LLM = {"LLM_SERVICE_MAX_TOTAL_TOKENS": "7168"}
"""The local model's total at n_ctx 8192: 7,168 - 4,096 - 512 = 2,560 tokens for one tool
result, 2,560 - 300 - 140 = 2,120 tokens of one document's text read whole."""


def _held(asked, limit, why):
    return (f"ORCH_MAX_CONTEXT_CHARS={asked} is held to {limit} ({why})",)


@pytest.mark.parametrize(
    ("env", "chars", "held"),
    [
        # the defaults agree: 200,000 bytes hold 50,000 characters, 25,600 tokens too
        ({}, 50_000, ()),
        # more than ToolsProxy returns whole
        ({"ORCH_MAX_CONTEXT_CHARS": "150000"}, 50_000, _held(150000, 50_000, PROXY_WHY)),
        ({"ORCH_MAX_CONTEXT_CHARS": "40000", "MCP_PROXY_MAX_FULL_TEXT_BYTES": "160000"},
         40_000, ()),
        ({"ORCH_MAX_CONTEXT_CHARS": "40000", "MCP_PROXY_MAX_FULL_TEXT_BYTES": "159999"},
         39_999, _held(40000, 39_999, PROXY_WHY)),
        # the default, not a setting asked for, is held too, and said
        ({"MCP_PROXY_MAX_FULL_TEXT_BYTES": "100000"}, 25_000, _held(50000, 25_000, PROXY_WHY)),
        # the LLM service's room holds no setting: each selection is weighed against it in
        # tokens (scenarios.Selection.fits_whole)
        ({"ORCH_MAX_CONTEXT_CHARS": "150000", "MCP_PROXY_MAX_FULL_TEXT_BYTES": "600000"},
         150_000, ()),
        ({**SMALL_LLM}, 50_000, ()),
        # the tighter of the two says why
        ({**SMALL_LLM, "MCP_PROXY_MAX_FULL_TEXT_BYTES": "16000"}, 4000, _held(50000, 4000, PROXY_WHY)),
    ],
)  # fmt: skip
def test_a_whole_read_is_held_to_what_reaches_the_model_whole(env, chars, held):
    s = settings(**env)
    assert s.max_context_chars == chars
    assert s.held == held


async def test_the_service_warns_at_start_of_each_setting_it_held(caplog):
    from services.orchestrator.app import start

    s = settings(ORCH_WINDOW_RADIUS="3", MCP_PROXY_MAX_WINDOW_RADIUS="2", ORCH_PORT="0")
    assert s.held == ("ORCH_WINDOW_RADIUS=3 is held to 2 (MCP_PROXY_MAX_WINDOW_RADIUS)",)
    with caplog.at_level("WARNING", logger="visior.orchestrator"):
        running, close = await start(s)
        await running.stop(0)
        await close()
    assert [r.getMessage() for r in caplog.records if r.name == "visior.orchestrator"] == list(
        s.held
    )


@pytest.mark.parametrize(
    ("env", "documents"),
    [
        ({}, 10),
        ({"MCP_PROXY_MAX_FULL_DOCUMENTS": "3"}, 3),
        ({"MCP_PROXY_MAX_FULL_DOCUMENTS": "50"}, 50),
    ],
)
def test_the_orchestrator_reads_toolsproxys_document_limit_under_its_name(env, documents):
    from services.toolsproxy.config import ToolsProxySettings

    assert settings(**env).max_full_documents == documents
    assert ToolsProxySettings.from_env(Env(env)).limits.max_full_documents == documents


@pytest.mark.parametrize("value", ["0", "51"])
def test_a_document_limit_out_of_range_is_refused_by_both_services(value):
    from services.toolsproxy.config import ToolsProxySettings

    with pytest.raises(SettingsError, match="MCP_PROXY_MAX_FULL_DOCUMENTS"):
        settings(MCP_PROXY_MAX_FULL_DOCUMENTS=value)
    with pytest.raises(SettingsError, match="MCP_PROXY_MAX_FULL_DOCUMENTS"):
        ToolsProxySettings.from_env(Env({"MCP_PROXY_MAX_FULL_DOCUMENTS": value}))


@pytest.mark.parametrize(("count", "scenario"), [(10, "S3"), (11, "S4")])
def test_rule_decision_holds_a_whole_read_to_the_document_limit(count, scenario):
    ids = tuple(f"d{i}" for i in range(count))
    selection = Selection(ids, 60, max_documents=10)
    d = rule_decision("q", selection=selection, today=TODAY)
    assert d.scenario == scenario
    schema = decision_schema(selection)
    intents = {o["properties"]["intent"]["const"] for o in schema["anyOf"]}
    assert ("selected_full" in intents) == (scenario == "S3")
    prompt = decision_prompt("q", selection)
    assert ("characters and 10 documents" in prompt) == (scenario == "S4")


@pytest.mark.parametrize(("limit", "scenario"), [(60, "S3"), (59, "S4")])
def test_rule_decision_uses_the_configured_limit(limit, scenario):
    d = rule_decision("q", selection=Selection(("a",), 60, max_context_chars=limit), today=TODAY)
    assert d.scenario == scenario


def test_the_routing_prompt_and_schema_state_the_configured_limit():
    prompt = decision_prompt("q", Selection(("a",), 60, max_context_chars=59))
    assert "limit for reading them whole is 59 characters" in prompt
    assert '"selected_search"' in prompt
    schema = decision_schema(Selection(("a",), 60, max_context_chars=60))
    intents = {o["properties"]["intent"]["const"] for o in schema["anyOf"]}
    assert "selected_full" in intents and "selected_search" not in intents


@pytest.mark.parametrize(("delta", "scenario"), [(0, "S3"), (1, "S4")])
async def test_responder_switches_at_the_configured_limit(delta, scenario):
    size = len(SAMPLE_DOCUMENTS[1].text)
    responder, _, _ = make(max_context_chars=size - delta)
    out = await responder.respond(ask("Какие сроки оплаты?", selected_doc_ids=("doc_2",)))
    assert out.scenario == scenario


def test_s3_token_budget_is_the_whole_read_and_its_prompt():
    # the read is weighed against one tool result of the LLM service: that is the largest
    assert full_context_tokens(MAX_CONTEXT_CHARS, 10, 4096, 28_160) == 4096 + 28_160
    assert full_context_tokens(MAX_CONTEXT_CHARS, 10, 4096, 2560) == 4096 + 2560
    # without that room, a read of the characters at the estimate
    assert full_context_tokens(MAX_CONTEXT_CHARS, 10, 4096, None) == 4096 + 25_000 + 300 + 1400
    assert full_context_tokens(2 * MAX_CONTEXT_CHARS, 10, 4096, None) == 4096 + 50_000 + 1700
    assert full_context_tokens(1, 1, 2048, None) == 2048 + 1 + 300 + 140


async def test_s3_asks_the_budget_of_the_configured_limit():
    class Recorder(Unreachable):
        def __init__(self):
            super().__init__()
            self.requests = []

        async def document_sizes(self, user, doc_ids):
            return {d: (10, 4, "D") for d in doc_ids}

        async def search(self, *args, **kwargs):
            from services.orchestrator.model import RetrievalOutcome

            return RetrievalOutcome((), 0)

        async def generate(self, request):
            self.requests.append(request)
            return LlmOutcome("answer", (), 1, 1)

    live = Recorder()
    holder = ConfigHolder(RuntimeConfig(), 3)
    responder = Responder(live, live, holder, today=lambda: TODAY, model_routing=False,
                          max_context_chars=200_000)  # fmt: skip
    out = await responder.respond(ask("Что там?", selected_doc_ids=("d",)))
    assert out.scenario == "S3"
    assert (
        live.requests[-1].context_token_budget
        == full_context_tokens(200_000, 10, 4096, None)
        == 105_796
    )


class FakeChannel:
    """Records the requests the generated stubs send."""

    def __init__(self):
        self.requests = []

    def unary_unary(self, method, *args, **kwargs):
        async def call(request, **_):
            from visior.retrieval.v1 import retrieval_pb2

            self.requests.append(request)
            return retrieval_pb2.SearchResponse()

        return call

    def unary_stream(self, method, *args, **kwargs):
        return self.unary_unary(method)


@pytest.mark.parametrize("threshold", [None, 0.0, 0.42, 1.0])
async def test_the_score_threshold_goes_to_retrieval_as_min_score(threshold):
    from services.orchestrator.clients import GrpcRetriever

    channel = FakeChannel()
    retriever = GrpcRetriever(channel, min_score=threshold)  # type: ignore[arg-type]
    await retriever.search(RetrievalRequest("q", USER, Filters(), 5, "t"))
    (request,) = channel.requests
    assert request.params.HasField("min_score") == (threshold is not None)
    if threshold is not None:
        assert request.params.min_score == threshold


async def test_every_filter_and_the_expansion_flag_reach_retrieval():
    from services.orchestrator.clients import GrpcRetriever

    channel = FakeChannel()
    filters = Filters(product="orion", version="2", tags=("a", "b"), doc_ids=("d1",),
                      section_ids=("s1", "s2"), source="user")  # fmt: skip
    await GrpcRetriever(channel).search(  # type: ignore[arg-type]
        RetrievalRequest("q", USER, filters, 7, "t", expand_query=True)
    )
    (request,) = channel.requests
    f = request.filters
    sent = Filters(f.product, f.version, tuple(f.tags), tuple(f.doc_ids), tuple(f.section_ids),
                   f.source)  # fmt: skip
    assert sent == filters
    assert (request.query, request.tenant_id, request.max_results, request.trace_id) == (
        "q", USER.tenant_id, 7, "t",
    )  # fmt: skip
    assert request.params.expand_query is True


def test_mock_overlap_counts_subject_words_by_stem():
    text = "Retention policy: backups are kept for 30 days."
    assert overlap_score("retention policies", text) == round(BASE_SCORE + 0.6, 4)  # both, by stem
    assert overlap_score("what is the retention period", text) == round(BASE_SCORE + 0.3, 4)
    assert overlap_score("what is it", text) == BASE_SCORE  # no subject word


TITLE = "Orion X — руководство администратора, издание 2"


def _text_room(*doc_ids: str) -> int:
    """What one tool result of 2,560 tokens (the local model's) leaves the texts of `doc_ids`
    titled TITLE: the call around them and their entries, ids and titles counted."""
    entries = sum(entry_tokens(count_tokens, d, TITLE) for d in doc_ids)
    return 2560 - whole_read_tokens(0, entries)


@pytest.mark.parametrize(
    ("sizes", "scenario"),
    [({"a": (9000, _text_room("a"))}, "S3"), ({"a": (4000, _text_room("a") + 1)}, "S4"),
     ({"a": (2000, 1000), "b": (2000, _text_room("a", "b") - 1000)}, "S3"),
     ({"a": (2000, 1000), "b": (2000, _text_room("a", "b") - 999)}, "S4"),
     # no count from Retrieval: estimated at two characters a token
     ({"a": (2 * _text_room("a"), 0)}, "S3"), ({"a": (2 * _text_room("a") + 1, 0)}, "S4")],
)  # fmt: skip
async def test_a_selection_is_read_whole_only_when_one_llm_result_holds_it(sizes, scenario):
    """By Retrieval's count of the texts, their ids and titles counted too: 9,000 characters
    of English may be read whole in the local model's tool result, 4,000 of dense text not."""
    sizes = {d: (chars, tokens, TITLE) for d, (chars, tokens) in sizes.items()}

    class Sizes(Unreachable):
        async def document_sizes(self, user, doc_ids):
            return {d: sizes[d] for d in doc_ids}

        async def search(self, *args, **kwargs):
            from services.orchestrator.model import RetrievalOutcome

            return RetrievalOutcome((), 0)

        async def generate(self, request):
            return LlmOutcome("answer", (), 1, 1)

    live = Sizes()
    responder = Responder(live, live, ConfigHolder(RuntimeConfig(), 3), today=lambda: TODAY,
                          model_routing=False, max_context_chars=50_000, result_tokens=2560)  # fmt: skip
    out = await responder.respond(ask("Что там?", selected_doc_ids=tuple(sizes)))
    assert out.scenario == scenario
