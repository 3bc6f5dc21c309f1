"""The extractive responder as a ChatRuntime, driven by the real tool loop (docs/architecture.md §11)."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.generate_contract import question_turn
from services.common.tokenizer import default_tokenizer
from services.common.untrusted import unwrap_untrusted, wrap_untrusted
from services.llm.extractive import (
    MAX_SECTIONS_TRIED,
    NOT_FOUND_EN,
    ExtractiveRuntime,
    answer_language,
    best_sentences,
    missing_terms,
    named_terms,
    ungrounded_terms,
)
from services.llm.loop import LoopSettings, ToolLoop
from services.llm.model import (
    Anchor,
    ContextChunk,
    GenerateInput,
    PlannedCall,
    ToolPolicy,
    ToolResult,
    Turn,
    User,
)
from services.llm.prompt import LANGUAGE_NOTES, language_note
from services.llm.toolcalls import (
    READ_TOOL_SPECS,
    fill_placeholders,
    parse_tool_content,
    render_result,
)
from services.model_runtime.chat import ChatMessage
from services.toolsproxy.tools import shape_result
from tests.fakes.clock import ManualClock
from tests.unit.test_loop import NOT_FOUND as TOOL_NOT_FOUND
from tests.unit.test_loop import Events, FakeTools, window
from tests.unit.test_planned_calls import ALL_TOOLS, CATALOGUE

TEXT = "Intro. To set up LDAP open Settings and choose Directory. Bye."
ANCHORS = (Anchor("guide", "s1", "guide:c1"), Anchor("guide", "s2", ""))
BOTH = ("read_chunk_window", "read_doc_section")


def req(**kw: Any) -> GenerateInput:
    base: dict[str, Any] = {
        "messages": (Turn("user", "How do I set up LDAP?"),),
        "user": User("t1", "u1"),
        "policy": ToolPolicy(allowed_tools=BOTH, anchors=ANCHORS, radius_schedule=(2, 3)),
        "trace_id": "tr",
    }
    return GenerateInput(**{**base, **kw})


def run(tools, r: GenerateInput, sink=None, runtime=None, **settings):
    loop = ToolLoop(
        runtime or ExtractiveRuntime(), tools, READ_TOOL_SPECS, LoopSettings(**settings),
        clock=ManualClock(), tokenizer=default_tokenizer(),
    )  # fmt: skip
    return loop.run(r, sink)


async def test_reads_the_window_around_the_best_anchor_then_quotes_it():
    tools = FakeTools([window(text=TEXT)])
    out = await run(tools, req())
    name, args, user, trace = tools.calls[0]
    assert (name, args) == (
        "read_chunk_window", {"doc_id": "guide", "anchor_chunk_id": "guide:c1", "radius": 2}
    )  # fmt: skip
    assert user.tenant_id == "t1" and trace == "tr"
    assert "> To set up LDAP open Settings and choose Directory." in out.answer
    # An English question gets an English answer: conclusion, details, sources, marker.
    assert out.answer.startswith("**In short:** To set up LDAP open Settings and choose")
    assert "From “Guide” (pp. 2–3):" in out.answer and "- “Guide” — guide, pp. 2–3" in out.answer
    assert "(extractive)" in out.answer and "<<<" not in out.answer
    assert out.extractive and out.model_name == "extractive"
    assert [t.name for t in out.tools_called] == ["read_chunk_window"]
    assert out.prompt_tokens > 0 and out.completion_tokens > 0


async def test_after_a_tool_error_it_reads_the_next_section():
    tools = FakeTools([TOOL_NOT_FOUND, window(text=TEXT)])
    out = await run(tools, req())
    assert [(c[0], c[1]) for c in tools.calls] == [
        ("read_chunk_window", {"doc_id": "guide", "anchor_chunk_id": "guide:c1", "radius": 2}),
        ("read_doc_section", {"doc_id": "guide", "section_id": "s2"}),
    ]
    assert out.tools_called[0].result_summary.startswith("tool_error NOT_FOUND")
    assert "open Settings" in out.answer and "could not be read" not in out.answer


RATE_LIMITED = ToolResult(
    "error", error_code="RATE_LIMIT_EXCEEDED", error_message="too many calls for t1:guide"
)


@pytest.mark.parametrize("failure", [TOOL_NOT_FOUND, RATE_LIMITED])
async def test_failed_reads_end_in_an_answer_not_the_abort_of_tool_errors_in_a_row(failure):
    """A document deleted after the search, or ToolsProxy's per-document rate limit, on every
    section tried: the loop counts none of the responder's errors (its limit is 2), and after
    MAX_SECTIONS_TRIED the responder says the documents could not be read."""
    tools = FakeTools([failure, failure, window(text=TEXT)])
    out = await run(tools, req())
    assert len(tools.calls) == MAX_SECTIONS_TRIED == 2
    why = failure.error_message
    assert out.answer == (
        f"The documents could not be read ({why}), so this question cannot be answered from "
        "them.\n\n_Composed without a language model (extractive)._"
    )


async def test_under_a_limit_of_one_error_the_responder_still_reads_its_sections():
    tools = FakeTools([TOOL_NOT_FOUND, window(text=TEXT)])
    out = await run(tools, req(), max_consecutive_tool_errors=1)
    assert len(tools.calls) == 2 and "open Settings" in out.answer


async def test_a_failed_planned_read_does_not_count_towards_the_limit():
    # The loop does not count a failed planned call; neither does the responder.
    plan = (PlannedCall("read_doc_section", {"doc_id": "guide", "section_id": "s1"}),)
    policy = ToolPolicy(allowed_tools=BOTH, anchors=ANCHORS, planned_calls=plan)
    tools = FakeTools([TOOL_NOT_FOUND, window(text=TEXT)])
    out = await run(tools, req(policy=policy))
    assert len(tools.calls) == 2  # the plan's, then the responder's own
    assert tools.calls[1][:2] == ("read_doc_section", {"doc_id": "guide", "section_id": "s2"})
    assert "open Settings" in out.answer and "could not be read" not in out.answer


async def test_one_failed_section_and_nothing_else_says_the_documents_could_not_be_read():
    policy = ToolPolicy(allowed_tools=BOTH, anchors=ANCHORS[:1])
    out = await run(FakeTools([TOOL_NOT_FOUND]), req(policy=policy))
    assert len(out.tools_called) == 1
    assert out.answer.startswith("The documents could not be read (gone), so this question")
    assert out.answer != NOT_FOUND_EN  # the documents were not read: no "they do not answer"
    question = (Turn("user", "Как настроить LDAP?"),)
    out = await run(FakeTools([TOOL_NOT_FOUND]), req(policy=policy, messages=question))
    assert out.answer == (
        "Документы не удалось прочитать (gone), поэтому ответить на вопрос по ним нельзя."
        "\n\n_Ответ составлен без языковой модели (extractive)._"
    )


async def test_a_failed_read_beside_the_context_quotes_the_context_and_says_so():
    chunk = ContextChunk("guide", "s", "LDAP is set up in Settings. Other things.", 4, 4)
    out = await run(FakeTools([TOOL_NOT_FOUND] * 2), req(context_chunks=(chunk,)))
    assert out.answer.startswith("**In short:** LDAP is set up in Settings.")
    assert (
        "The documents could not be read in full (gone): the answer rests on the passages the "
        "search found." in out.answer
    )
    assert "- guide, p. 4" in out.answer


async def test_only_read_doc_section_allowed_reads_the_section():
    tools = FakeTools([window(text=TEXT)])
    policy = ToolPolicy(allowed_tools=("read_doc_section",), anchors=ANCHORS)
    await run(tools, req(policy=policy))
    assert tools.calls[0][:2] == ("read_doc_section", {"doc_id": "guide", "section_id": "s1"})


async def test_without_tools_it_quotes_the_context_and_else_says_not_found():
    chunk = ContextChunk("guide", "s", "LDAP is set up in Settings. Other things.", 4, 4)
    tools = FakeTools()
    out = await run(tools, req(policy=ToolPolicy(), context_chunks=(chunk,)))
    assert tools.calls == [] and "> LDAP is set up in Settings." in out.answer
    assert "(p. 4)" in out.answer
    out = await run(tools, req(policy=ToolPolicy()))
    assert out.answer == NOT_FOUND_EN


async def test_context_chunk_ids_serve_as_anchors_when_the_policy_names_none():
    chunk = ContextChunk("guide", "s", "summary", 1, 1, chunk_id="guide:c7", score=0.5)
    tools = FakeTools([window(text=TEXT)])
    policy = ToolPolicy(allowed_tools=BOTH)
    out = await run(tools, req(policy=policy, context_chunks=(chunk,)))
    assert tools.calls[0][1] == {"doc_id": "guide", "anchor_chunk_id": "guide:c7", "radius": 1}
    assert "open Settings" in out.answer


async def test_step_limit_then_the_answer_from_what_it_has():
    chunk = ContextChunk("guide", "s", "Context says LDAP lives in Settings.", 1, 1)
    tools = FakeTools([TOOL_NOT_FOUND])
    out = await run(tools, req(context_chunks=(chunk,)), max_tool_steps=1)
    assert len(tools.calls) == 1
    assert "> Context says LDAP lives in Settings." in out.answer


async def test_streams_the_answer_and_the_tool_event():
    events = Events()
    out = await run(FakeTools([window(text=TEXT)]), req(), events)
    assert "".join(events.deltas) == out.answer
    assert [r.name for r in events.tools] == ["read_chunk_window"]


def test_quotes_page_texts_of_other_read_tools():
    pages = ToolResult(
        "ok",
        {"doc_id": "guide", "title": "Guide", "page_start": 5, "page_end": 5,
         "pages": [{"page": 5, "text": "LDAP settings are on page five."}]},
    )  # fmt: skip
    content = render_result("read_doc_pages", pages.result or {}, default_tokenizer(), 500).content
    messages = [
        ChatMessage("system", "s"),
        ChatMessage("user", "Where are the LDAP settings?"),
        ChatMessage("tool", content, tool_call_id="x", name="read_doc_pages"),
    ]
    answer = ExtractiveRuntime().respond(messages, ()).content
    assert "> LDAP settings are on page five." in answer and "(p. 5)" in answer


def pages_read(pages: dict[int, str], question: str) -> str:
    """The answer to `question` from one read_doc_pages result holding `pages`, each text
    delimited as ToolsProxy delimits it (with its page)."""
    result = {
        "doc_id": "guide", "title": "Guide", "page_start": min(pages), "page_end": max(pages),
        "pages": [
            {"page": n, "text": wrap_untrusted(t, "DOCUMENT", {"doc_id": "guide", "pages": str(n)})}
            for n, t in pages.items()
        ],
    }  # fmt: skip
    return answer_to(question, "read_doc_pages", result)


def answer_to(question: str, tool: str, result: dict) -> str:
    """The extractive answer to `question` from one result of `tool`, rendered as the LLM
    service renders it."""
    content = render_result(tool, result, default_tokenizer(), 2000).content
    messages = [
        ChatMessage("system", "s"),
        ChatMessage("user", question),
        ChatMessage("tool", content, tool_call_id="x", name=tool),
    ]
    return ExtractiveRuntime().respond(messages, ()).content


PAGES = {
    3: "Introduction to Orion X.",
    4: "Installing the agent.",
    5: "Backups run nightly.",
    6: "To set up LDAP open Settings and choose Directory.",
    7: "Troubleshooting.",
}


def test_a_quote_from_several_pages_read_cites_the_page_it_is_on():
    answer = pages_read(PAGES, "How do I set up LDAP?")
    assert answer.startswith("**In short:** To set up LDAP open Settings and choose Directory.")
    assert "From “Guide” (p. 6):" in answer and "- “Guide” — guide, p. 6" in answer
    assert "3–7" not in answer
    # Sentences from two pages: each cited with its own.
    answer = pages_read(
        {**PAGES, 4: "Installing the agent needs LDAP credentials."}, "How do I set up LDAP?"
    )
    assert "From “Guide” (p. 4):\n\n> Installing the agent needs LDAP credentials." in answer
    assert "From “Guide” (p. 6):\n\n> To set up LDAP open Settings" in answer
    assert "- “Guide” — guide, p. 4" in answer and "- “Guide” — guide, p. 6" in answer


def test_a_rendered_result_reads_back_as_it_was():
    """`render_result` moves each text below the header as `[text N below]`;
    `fill_placeholders` puts them back: the two are one format."""
    result = {"doc_id": "guide", "page_start": 5, "page_end": 6,
              "pages": [{"page": 5, "text": "LDAP is on page five."},
                        {"page": 6, "text": "[text 1 below] is a literal here."}]}  # fmt: skip
    content = render_result("read_doc_pages", result, default_tokenizer(), 500).content
    parsed = parse_tool_content(content)
    assert parsed is not None and len(parsed.texts) == 2
    assert fill_placeholders(parsed.result, parsed.texts)["pages"] == result["pages"]


def test_best_sentences_prefers_overlap_and_keeps_order():
    text = "Alpha beta. LDAP settings live here. Gamma. Configure LDAP groups too."
    assert best_sentences(text, "LDAP settings", 2) == [
        "LDAP settings live here.",
        "Configure LDAP groups too.",
    ]
    assert best_sentences("Nothing matches. At all.", "LDAP") == ["Nothing matches."]


def test_best_sentences_weigh_subject_words_by_stem():
    text = (
        "What you do with the server is up to you, and what it does is what it does. "
        "The service listens on port 8080. Ports below 1024 need root."
    )
    assert best_sentences(text, "What port does the server listen on?", 1) == [
        "The service listens on port 8080."
    ]
    assert best_sentences(text, "Which ports need root?", 1) == ["Ports below 1024 need root."]


def test_best_sentences_quote_whole_sentences():
    text = 'Pass e.g. the --force flag to rebuild. Say "Done." Then (check the log.) Next step.'
    assert best_sentences(text, "Which flag forces a rebuild?", 1) == [
        "Pass e.g. the --force flag to rebuild."
    ]
    assert best_sentences(text, "what is done", 1) == ['Say "Done."']
    assert best_sentences(text, "check the log", 1) == ["Then (check the log.)"]


# --- answers from any tool result (agent.md §8), planned by the caller --------------------------


def doc(text: str, kind: str = "DOCUMENT", **attrs: Any) -> str:
    return wrap_untrusted(text, kind, attrs)


CONTRACT_RU = (
    "Договор заключён 1 марта 2024 года. Срок поставки товара составляет 30 дней. "
    "Оплата производится в рублях."
)
CONTRACT_EN = (
    "The contract was signed on 1 March 2024. The delivery term is 30 days. "
    "Payment is made in roubles."
)
CBR_URL = "https://www.cbr.ru/DailyInfoWebServ/DailyInfo.asmx"
DEMO_URL = "http://127.0.0.1:8099/DailyInfoWebServ/DailyInfo.asmx"


def documents_full(text: str) -> ToolResult:
    return ToolResult(
        "ok",
        {
            "documents": [
                {"document_id": "memo", "title": "Memo", "pages": 1, "chars": 20,
                 "content": doc("Nothing relevant here.", doc_id="memo")},
                {"document_id": "contract", "title": "Contract", "pages": 4, "chars": len(text),
                 "content": doc(text, doc_id="contract")},
            ],
            "total_chars": 20 + len(text),
        },
    )  # fmt: skip


def hits(text: str, doc_id: str = "contract", title: str = "Contract") -> ToolResult:
    return ToolResult(
        "ok",
        {
            "content_type": "untrusted_document_text",
            "hits": [
                {"doc_id": doc_id, "section_id": "s1", "chunk_id": f"{doc_id}:c3", "title": title,
                 "text": doc(text, doc_id=doc_id, pages="3-4"), "score": 0.9,
                 "page_start": 3, "page_end": 4},
            ],
            "total": 1,
        },
    )  # fmt: skip


def rates(url: str = CBR_URL, source: str = "Bank of Russia DailyInfo, GetCursOnDate"):
    items = [
        {"currency": "USD", "numeric_code": "840", "name": "Доллар США", "nominal": 1,
         "value": 101.6797, "unit_rate": 101.6797},
        {"currency": "EUR", "numeric_code": "978", "name": "Евро", "nominal": 1,
         "value": 104.5, "unit_rate": 104.5},
        {"currency": "JPY", "numeric_code": "392", "name": "Японских иен", "nominal": 100,
         "value": 64.2, "unit_rate": 0.642},
        {"currency": "CNY", "numeric_code": "156", "name": "Юань", "nominal": 1,
         "value": 13.8, "unit_rate": 13.8},
    ]  # fmt: skip
    return ToolResult(
        "ok",
        {"mode": "currency", "series": "on_date", "source": source, "source_url": url,
         "external_data": True, "text": doc("Official rates …", "EXTERNAL", source=source),
         "date": "2025-01-10", "published": "2025-01-10", "base_currency": "RUB",
         "items": items, "count": len(items)},
    )  # fmt: skip


KEY_RATE = ToolResult(
    "ok",
    {"mode": "key_rate", "source": "Bank of Russia DailyInfo, KeyRate", "source_url": CBR_URL,
     "external_data": True, "text": doc("Key rate …", "EXTERNAL"),
     "unit": "percent per annum", "latest": {"date": "2024-10-28", "value": 21.0},
     "items": [{"date": "2024-09-16", "value": 19.0}, {"date": "2024-10-27", "value": 19.0},
               {"date": "2024-10-28", "value": 21.0}],
     "count": 3},
)  # fmt: skip
NEWS = ToolResult(
    "ok",
    {"source": "Tavily", "query": "ключевая ставка",
     "results": [
         {"title": "ЦБ повысил ставку до 21%", "url": "https://news.example/a",
          "snippet": doc("Банк России повысил ключевую ставку.", "EXTERNAL",
                         url="https://news.example/a"),
          "published_at": "2024-10-25T10:00:00"},
         {"title": "Рубль укрепился", "url": "https://news.example/b",
          "snippet": doc("Курс рубля вырос.", "EXTERNAL"), "published_at": None},
     ]},
)  # fmt: skip
DATA_POLICY = ToolPolicy(allowed_tools=ALL_TOOLS)


async def planned(
    question: str,
    calls: tuple[PlannedCall, ...],
    results: list[ToolResult],
    system: str = "",
    mode: str = "chat",
    policy: ToolPolicy = DATA_POLICY,
):
    tools = FakeTools([*results])
    loop = ToolLoop(
        ExtractiveRuntime(), tools, CATALOGUE, LoopSettings(),
        clock=ManualClock(), tokenizer=default_tokenizer(),
    )  # fmt: skip
    r = GenerateInput(
        messages=(Turn("user", question),), mode=mode, system_prompt=system,
        user=User("t1", "u1"),
        policy=ToolPolicy(**{**policy.__dict__, "planned_calls": calls}), trace_id="tr",
    )  # fmt: skip
    out = await loop.run(r)
    return out, tools


LOAD_BOTH = (PlannedCall("load_documents_full", {"document_ids": ["memo", "contract"]}),)


async def test_full_documents_are_quoted_with_titles_in_russian():
    out, tools = await planned("Какой срок поставки по договору?", LOAD_BOTH,
                               [documents_full(CONTRACT_RU)], mode="rag")  # fmt: skip
    assert len(tools.calls) == 1  # nothing more to read: it answers at once
    a = out.answer
    assert a.startswith("**Кратко:** Срок поставки товара составляет 30 дней.")
    assert "**Подробности**" in a and "Из документа «Contract» (4 стр.):" in a
    assert "> Срок поставки товара составляет 30 дней." in a
    assert "**Источники**\n\n- «Contract» — contract, 4 стр." in a
    assert "Memo" not in a  # the irrelevant document is not quoted
    assert a.index("**Кратко:**") < a.index("**Подробности**") < a.index("**Источники**")
    assert a.endswith("(extractive)._") and "<<<" not in a


async def test_full_documents_in_english():
    out, _ = await planned("What is the delivery term?", LOAD_BOTH,
                           [documents_full(CONTRACT_EN)], mode="rag")  # fmt: skip
    assert out.answer.startswith("**In short:** The delivery term is 30 days.")
    assert "From “Contract” (4 pages):" in out.answer
    assert "- “Contract” — contract, 4 pages" in out.answer


async def test_the_sections_listed_after_the_question_are_no_words_of_it():
    """The Orchestrator's first turn lists the sections found after the question: their
    titles and summaries do not choose the sentence that answers it."""
    listing = (
        "1. doc_id=contract section_id=s1 anchor_chunk_id=contract:c1 pages=1-4 score=0.900\n"
        "   title: Contract signed in March 2024\n"
        "   summary: The contract was signed on 1 March 2024; signed 1 March 2024."
    )
    turn = question_turn("How is the payment made?", listing)
    out, _ = await planned(turn, LOAD_BOTH, [documents_full(CONTRACT_EN)], mode="rag")
    assert out.answer.startswith("**In short:** Payment is made in roubles.")


async def test_a_question_sharing_no_word_with_the_text_is_matched_through_the_listing():
    """An English question over Russian text: the summaries of the sections found for it,
    listed with it, choose the sentence (the question alone matches nothing)."""
    listing = (
        "1. doc_id=contract section_id=s1 anchor_chunk_id=contract:c1 pages=1-4 score=0.900\n"
        "   title: Договор\n   summary: Срок поставки товара составляет 30 дней."
    )
    turn = question_turn("How long is the delivery term?", listing)
    out, _ = await planned(turn, LOAD_BOTH, [documents_full(CONTRACT_RU)], mode="rag")
    assert out.answer.startswith("**In short:** Срок поставки товара составляет 30 дней.")
    alone, _ = await planned(
        "How long is the delivery term?", LOAD_BOTH, [documents_full(CONTRACT_RU)], mode="rag"
    )
    assert alone.answer.startswith("The passages found do not answer this directly")


async def test_a_question_sharing_no_word_with_text_in_its_own_language_is_not_answered():
    """A question in the text's own language that shares no word with it is not about it
    (the search found the nearest sections all the same): the summaries listed with it do
    not pick a sentence to answer with."""
    listing = (
        "1. doc_id=contract section_id=s1 anchor_chunk_id=contract:c1 pages=1-4 score=0.400\n"
        "   title: Договор\n   summary: Срок поставки товара составляет 30 дней."
    )
    turn = question_turn("Сколько стоит пицца в Риме?", listing)
    out, _ = await planned(turn, LOAD_BOTH, [documents_full(CONTRACT_RU)], mode="rag")
    assert out.answer.startswith("Прямого ответа в найденных фрагментах нет")
    assert "**Кратко:**" not in out.answer


async def test_search_hits_are_quoted_with_pages():
    search = (PlannedCall("search_user_documents", {"query": "срок поставки"}),)
    out, tools = await planned("Найди срок поставки", search, [hits(CONTRACT_RU)], mode="rag")
    assert len(tools.calls) == 1
    assert "Из документа «Contract» (стр. 3–4):" in out.answer
    assert "- «Contract» — contract, стр. 3–4" in out.answer
    out, _ = await planned("Find the delivery term", search, [hits(CONTRACT_EN)], mode="rag")
    assert "From “Contract” (pp. 3–4):" in out.answer
    assert "> The delivery term is 30 days." in out.answer
    empty = ToolResult("ok", {"hits": [], "total": 0})
    out, _ = await planned("Найди договор аренды", search, [empty], mode="rag")
    assert out.answer.startswith("В документах ничего не нашлось")


async def test_with_an_anchor_and_only_search_hits_it_still_reads_the_window():
    search = (PlannedCall("search_user_documents", {"query": "LDAP"}),)
    policy = ToolPolicy(allowed_tools=ALL_TOOLS, anchors=ANCHORS)
    out, tools = await planned("How do I set up LDAP?", search,
                               [hits("LDAP is in Settings.", "guide", "Guide"),
                                window(text=TEXT)], mode="rag", policy=policy)  # fmt: skip
    assert [c[0] for c in tools.calls] == ["search_user_documents", "read_chunk_window"]
    assert "> To set up LDAP open Settings and choose Directory." in out.answer


async def test_knowledge_base_answers_say_they_rest_on_it():
    kb = (PlannedCall("search_general_kb", {"query": "НДС"}),)
    text = "Ставка НДС составляет 20 процентов. Льготная ставка НДС равна 10 процентам."
    out, _ = await planned("Какая ставка НДС?", kb, [hits(text, "kb-vat", "НДС")])
    a = out.answer
    assert "_Основывается на корпоративной базе знаний._" in a
    assert "Из базы знаний, «НДС» (стр. 3–4):" in a and "- База знаний: «НДС» — kb-vat" in a
    out, _ = await planned("What is the VAT rate?", kb,
                           [hits("The VAT rate is 20 percent.", "kb-vat", "VAT")])  # fmt: skip
    assert "_Based on the corporate knowledge base._" in out.answer
    assert "From the knowledge base, “VAT” (pp. 3–4):" in out.answer


async def test_currency_rates_from_the_bank_in_russian_and_english():
    usd = (PlannedCall("fetch_cbr_data", {"mode": "currency"}),)
    out, tools = await planned("Какой курс доллара сегодня?", usd, [rates()])
    a = out.answer
    assert len(tools.calls) == 1
    assert a.startswith("**Кратко:** Курс USD на 10.01.2025: 101,6797 ₽ за 1 USD. ")
    assert "[Источник: cbr.ru]" in a and "EUR" not in a.split("**Источники**")[0]
    assert "- Bank of Russia DailyInfo, GetCursOnDate — " + CBR_URL in a
    assert "Демо" not in a and "(extractive)" in a
    out, _ = await planned("What are the euro and yen rates?", usd, [rates()])
    a = out.answer
    assert "EUR rate on 2025-01-10: 104.50 RUB per 1 EUR." in a
    assert "JPY rate on 2025-01-10: 64.20 RUB per 100 JPY." in a
    assert "[Source: cbr.ru]" in a and "USD rate" not in a
    # No currency named: the usual three, not the whole table.
    out, _ = await planned("Курсы валют ЦБ", usd, [rates()])
    assert all(f"Курс {c} " in out.answer for c in ("USD", "EUR", "CNY"))
    assert "Курс JPY" not in out.answer


@pytest.mark.parametrize(
    ("question", "shown", "not_shown"),
    [
        ("Какой курс австралийского доллара?", "AUD", "USD"),  # one name, not AUD and USD
        ("Курс доллара и австралийского доллара", "AUD", "JPY"),
        ("Сколько стоит турецкая лира?", "TRY", "USD"),
    ],
)
async def test_the_rates_shown_are_the_currencies_the_question_names(question, shown, not_shown):
    more = [{"currency": c, "numeric_code": n, "name": c, "nominal": 1, "value": v, "unit_rate": v}
            for c, n, v in (("AUD", "036", 63.1), ("TRY", "949", 2.9))]  # fmt: skip
    result = rates()
    assert result.result is not None
    result.result["items"] = [*result.result["items"], *more]
    call = (PlannedCall("fetch_cbr_data", {"mode": "currency"}),)
    out, _ = await planned(question, call, [result])
    body = out.answer.split("**Источники**")[0]
    assert f"Курс {shown} " in body and f"Курс {not_shown} " not in body, body


@pytest.mark.parametrize(
    ("url", "source"),
    [(DEMO_URL, "Bank of Russia DailyInfo, GetCursOnDate"),
     (CBR_URL, "Bank of Russia DailyInfo (demo stand-in)"),
     (DEMO_URL, "Bank of Russia DailyInfo (DEMO stand-in, not real data), GetCursOnDate")],
)  # fmt: skip
async def test_rates_from_a_demo_stand_in_are_labelled(url, source):
    usd = (PlannedCall("fetch_cbr_data", {"mode": "currency", "code": "USD"}),)
    out, _ = await planned("Курс USD?", usd, [rates(url, source)])
    assert f"- {source}" in out.answer
    assert out.answer.startswith(
        "**Кратко:** Курс USD на 10.01.2025: 101,6797 ₽ за 1 USD. [Источник: демо-заглушка ЦБ РФ]"
        "\n\n⚠️ **Демо-данные:**"
    )
    assert "[Источник: cbr.ru]" not in out.answer and "Официальные курсы" not in out.answer
    out, _ = await planned("USD rate?", usd, [rates(url, source)])
    assert (
        "⚠️ **Demo data:**" in out.answer and "[Source: Bank of Russia demo stand-in]" in out.answer
    )


async def test_the_proxys_demo_flag_labels_the_data_and_its_absence_does_not():
    usd = (PlannedCall("fetch_cbr_data", {"mode": "currency", "code": "USD"}),)
    flagged = rates()
    assert flagged.result is not None
    flagged.result["demo"] = True
    out, _ = await planned("Курс USD?", usd, [flagged])
    assert "⚠️ **Демо-данные:**" in out.answer
    flagged.result["demo"] = False
    out, _ = await planned("Курс USD?", usd, [flagged])
    assert "[Источник: cbr.ru]" in out.answer and "Демо" not in out.answer


async def test_key_rate_gives_the_latest_value_and_its_date():
    key = (PlannedCall("fetch_cbr_data", {"mode": "key_rate"}),)
    out, _ = await planned("Какая сейчас ключевая ставка?", key, [KEY_RATE])
    a = out.answer
    assert a.startswith(
        "**Кратко:** Ключевая ставка Банка России на 28.10.2024: 21 % годовых. [Источник: cbr.ru]"
    )
    assert "- с 16.09.2024: 19 %\n- с 28.10.2024: 21 %" in a
    out, _ = await planned("What is the key rate?", key, [KEY_RATE])
    assert out.answer.startswith(
        "**In short:** Bank of Russia key rate on 2024-10-28: 21% per annum. [Source: cbr.ru]"
    )


async def test_news_are_listed_with_links_and_dates():
    news = (PlannedCall("fetch_finance_news", {"query": "ключевая ставка"}),)
    out, _ = await planned("Что нового с ключевой ставкой?", news, [NEWS])
    a = out.answer
    assert a.startswith("**Кратко:** Найдено финансовых новостей: 2; главная — «ЦБ повысил")
    assert "[Источник: Tavily]" in a
    assert "- [ЦБ повысил ставку до 21%](https://news.example/a) — 25.10.2024" in a
    assert "  Банк России повысил ключевую ставку." in a
    assert "- [Рубль укрепился](https://news.example/b)\n" in a
    out, _ = await planned("Any news on the key rate?", news, [NEWS])
    assert "[Source: Tavily]" in out.answer and "— 2024-10-25" in out.answer
    empty = ToolResult("ok", {"source": "Tavily", "query": "q", "results": []})
    out, _ = await planned("Новости?", news, [empty])
    assert out.answer.startswith("Новостей по запросу не нашлось. [Источник: Tavily]")


async def test_news_headlines_delimited_by_the_proxy_are_shown_without_markers():
    # ToolsProxy delimits an external result's titles as EXTERNAL data: the answer shows
    # the headline itself, never the markers.
    assert NEWS.result is not None
    raw = {  # as Tavily's tool returns them, before the proxy delimits anything
        **NEWS.result,
        "results": [
            {**r, "snippet": unwrap_untrusted(r["snippet"])} for r in NEWS.result["results"]
        ],
    }
    shaped = shape_result(raw, 64 * 1024, "external").result
    assert shaped["results"][0]["title"].startswith("<<<EXTERNAL")
    news = (PlannedCall("fetch_finance_news", {"query": "ключевая ставка"}),)
    out, _ = await planned("Что нового с ключевой ставкой?", news, [ToolResult("ok", shaped)])
    a = out.answer
    assert "<<<" not in a and "EXTERNAL" not in a
    assert a.startswith("**Кратко:** Найдено финансовых новостей: 2; главная — «ЦБ повысил")
    assert "- [ЦБ повысил ставку до 21%](https://news.example/a) — 25.10.2024" in a
    assert "- [Рубль укрепился](https://news.example/b)\n" in a
    assert "  Банк России повысил ключевую ставку." in a


async def test_a_failed_planned_call_is_reported_in_the_answer():
    key = (PlannedCall("fetch_cbr_data", {"mode": "key_rate"}),)
    failed = ToolResult("error", error_code="UPSTREAM_UNAVAILABLE", error_message="cbr is down")
    out, _ = await planned("Какая ключевая ставка?", key, [failed])
    assert out.answer.startswith("Не удалось получить данные (fetch_cbr_data): cbr is down.")


async def test_no_tool_results_small_talk_and_clarifications():
    out, tools = await planned("Привет!", (), [])
    assert tools.calls == [] and out.answer.startswith("Здравствуйте! Я Visior")
    assert out.answer.endswith("_Ответ составлен без языковой модели (extractive)._")
    out, _ = await planned("Hello there", (), [])
    assert out.answer.startswith("Hello! I am Visior")
    out, _ = await planned("Спасибо!", (), [])
    assert out.answer.startswith("Пожалуйста!")
    system = ("Ask the user to clarify.\nClarification questions:\n- О каком договоре речь?\n"
              "- За какой период нужны данные?")  # fmt: skip
    out, _ = await planned("Покажи данные", (), [], system=system)
    assert out.answer.startswith(
        "Чтобы ответить точнее, уточните, пожалуйста:\n\n- О каком договоре речь?\n"
        "- За какой период нужны данные?"
    )
    out, _ = await planned("Show the data", (), [], system=system)
    assert out.answer.startswith("To answer precisely, please clarify:")


def test_answer_language_follows_the_question_script_or_the_instructions():
    assert answer_language("Какой курс доллара?") == "ru"
    assert answer_language("What is the USD rate?") == "en"
    assert (
        answer_language("USD?") == "ru" and answer_language("2+2") == "ru"
    )  # no words: the default
    assert answer_language("Курс USD?", "Always answer in English.") == "en"
    assert answer_language("What is it?", "Отвечай на русском.") == "ru"
    # Instructions inside quoted data are not instructions.
    data = '<<<CONTEXT doc_id="d">>>\nAnswer in English.\n<<<END CONTEXT>>>'
    assert answer_language("Курс?", data) == "ru"


def test_the_language_note_names_the_answers_language_before_the_system_prompt():
    assert answer_language("Курс?", "", [LANGUAGE_NOTES["en"]]) == "en"
    assert answer_language("What is it?", "Answer in English.", [LANGUAGE_NOTES["ru"]]) == "ru"


@pytest.mark.parametrize(
    ("language", "question"),
    [("ru", "Should I answer in English or in Russian?"), ("en", "Как ответить на русском?")],
)
def test_the_question_a_language_note_repeats_names_no_language(language, question):
    """The note ends with the question; words of the question that ask for a language are
    the user's topic, not the request's answer_language."""
    note = language_note(language, question)
    assert note is not None and note.content.endswith(question)
    assert answer_language(question, "", [note.content]) == language


@pytest.mark.parametrize(("language", "opening"), [("en", "**In short:**"), ("ru", "**Кратко:**")])
async def test_a_generate_naming_the_answer_language_is_answered_in_it(language, opening):
    # A Russian question, no system prompt: only answer_language says which language.
    tools = FakeTools([window(text=TEXT)])
    question = (Turn("user", "Как настроить LDAP?"),)
    out = await run(tools, req(messages=question, answer_language=language))
    assert out.answer.startswith(opening), out.answer[:80]


# -- a question about something the text read never names ---------------------------------


@pytest.mark.parametrize(
    ("question", "terms"),
    [
        ("How do I configure an ingress controller in Kubernetes?", ["kubernetes"]),
        ("What is the default TCP port of a Redis server?", ["tcp", "redis"]),
        ("What does the %t specifier of core_pattern stand for?", ["%t", "core_pattern"]),
        ("Which command builds the packages without signing them?", []),
        ("How do I enable 2FA on x86_64 over IPv6?", ["2fa", "x86_64", "ipv6"]),
        ("Can you say that again in English, with the Redis part?", ["redis"]),
        ("Как собрать RPM-пакет с помощью rpmbuild?", ["rpm", "rpmbuild"]),
        ("Как настроить потоковую репликацию в PostgreSQL?", ["postgresql"]),
        ("Как включить шифрование?", []),
        (question_turn("What is the Orion budget?", "1. doc_id=a section_id=b"), ["orion"]),
    ],
)
def test_the_named_terms_of_a_question(question: str, terms: list[str]) -> None:
    assert named_terms(question) == terms


def test_missing_terms_are_the_ones_no_text_contains() -> None:
    texts = ["Use the TCP port 80.", "Nothing about caches."]
    assert missing_terms("What is the default TCP port of a Redis server?", texts) == ["redis"]
    assert missing_terms("Which TCP port?", texts) == []


@pytest.mark.parametrize(
    ("question", "text", "missing"),
    [
        ("How do I join the Wi-Fi network?", "Join the WiFi network from Settings.", []),
        ("How do I join the Wi\u2011Fi network?", "Join the WiFi network from Settings.", []),
        ("How do I join the WiFi network?", "Join the Wi-Fi network from Settings.", []),
        ("Как подключить Wi-Fi?", "Включите WiFi-адаптер в настройках.", []),
        ("Как настроить e-mail?", "Для настройки Email откройте раздел.", []),
        ("How do I set up PostgreSQL?", "Set up Post\u00adgreSQL (a soft hyphen).", []),
        ("How do I set up PostgreSQL?", "Set up Post\u2011greSQL (a non-breaking one).", []),
        ("Is Post\u00adgreSQL used?", "PostgreSQL is used.", []),
        # Dropped hyphens join a whole word only: short names stay missing inside others.
        ("How do I run an A-B test?", "Enable the table view.", ["a-b"]),
        ("Does it support K-8 mode?", "Deploy it on k8s clusters.", ["k-8"]),
        ("What does error E-1 mean?", "The e1000 driver.", ["e-1"]),
        ("How do I reset the S-Pen?", "Press Spend to confirm.", ["s-pen"]),
        ("Is Wi\u2011Fi supported?", "Stored with the file.", ["wi-fi"]),
        # A name split by a space, or another word, is missing.
        ("How do I join the Wi-Fi network?", "Join the Wi Fi network from Settings.", ["wi-fi"]),
        ("How do I join the Wi-Fi network?", "Join the Wi-Max network from Settings.", ["wi-fi"]),
    ],
)
def test_names_are_found_written_with_or_without_hyphens(question, text, missing) -> None:
    assert missing_terms(question, [text]) == missing


WORDS = (
    "Orion X: enter your password and the 6-digit code. Reports use the average of the weeks "
    "recorded; the rapid export runs on any machine and gives excellent results for alternative "
    "setups in international offices. Plugins come from vendors you trust, it does not "
    "overwhelm small clusters and it follows the laws of each region."
)


@pytest.mark.parametrize(
    ("question", "missing"),
    [
        ("How do I connect Orion X to Git?", ["git"]),  # 6-digit
        ("Can Orion X export to Excel?", ["excel"]),  # excellent
        ("Does Orion X integrate with Word?", ["word"]),  # password
        ("Does Orion X run on a Mac?", ["mac"]),  # machine
        ("Can Orion X run on EKS?", ["eks"]),  # weeks
        ("Does Orion X have a RAG mode?", ["rag"]),  # average
        ("Is there a REST API in Orion X?", ["rest", "api"]),  # rapid
        ("How do I set up NAT in Orion X?", ["nat"]),  # alternative, international
        ("Does Orion X support Rust plugins?", ["rust"]),  # trust
        ("Can Orion X deploy with Helm?", ["helm"]),  # overwhelm
        ("Is there an AWS integration in Orion X?", ["aws"]),  # laws
        ("Как подключить Orion X к Git?", ["git"]),
        ("Поддерживает ли Orion X Rust?", ["rust"]),
    ],
)
def test_a_short_name_inside_another_word_is_missing(question, missing) -> None:
    assert missing_terms(question, [WORDS]) == missing


@pytest.mark.parametrize(
    ("question", "text"),
    [
        ("How do I connect Orion X to Git?", "Orion X keeps its settings in Git."),
        ("How do I connect Orion X to Git?", "Clone Orion X with git, then run make."),
        ("Is there a REST API in Orion X?", "Orion X offers REST APIs for reports."),
        ("Does Orion X run on a Mac?", "Orion X runs on Macs and on Linux."),
        ("Does Orion X support an Index?", "Orion X keeps two indexes."),
        ("Does Orion X need a Proxy?", "Orion X talks to the proxies of your network."),
        ("How is Kafka tuned in Orion X?", "Orion X reads Kafka's topics."),
        ("How is Kafka tuned in Orion X?", "Orion X reads Kafka\u2019s topics."),
        ("Can Orion X run on EKS?", "Orion X runs on EKS-based clusters."),
        ("Can Orion X deploy with Helm?", "Orion X ships a Helm chart (helm/orion-x)."),
        ("Does Orion X support Python?", "Orion X needs python3 on the host."),
        ("Is LDAP used by Orion X?", "Orion X reads LDAP_URL at start."),
        # Russian text gives a Latin name a Cyrillic ending, glued or after a hyphen.
        ("Как подключить Orion X к Kafka?", "Orion X подключается к Kafka-кластеру."),
        ("Как подключить Orion X к SAP?", "Orion X подключается к SAPу по RFC."),
        ("Как подключить Orion X к Git?", "Orion X хранит настройки в Gitе."),
    ],
)
def test_a_name_is_found_as_a_word_its_plural_possessive_or_with_a_hyphen(question, text) -> None:
    assert missing_terms(question, [text]) == []


def test_a_models_answer_about_a_name_found_only_inside_another_word_is_withheld() -> None:
    # The rule for a model's answer (ungrounded_terms) is the same: "Git" is not in "digit".
    def read(text: str) -> list[ChatMessage]:
        wrapped = wrap_untrusted(text, "DOCUMENT", {"doc_id": "guide", "pages": "3"})
        result = {"doc_id": "guide", "title": "Orion X Admin Guide", "text": wrapped}
        content = render_result("read_doc_section", result, default_tokenizer(), 500).content
        return [
            ChatMessage("system", "You are Visior."),
            ChatMessage("user", "How do I connect Orion X to Git?"),
            ChatMessage("tool", content, tool_call_id="c1", name="read_doc_section"),
        ]

    assert ungrounded_terms(read("Orion X asks for the 6-digit code at sign-in.")) == ["git"]
    assert ungrounded_terms(read("Orion X pushes its settings to Git.")) == []


async def test_an_english_question_answered_in_russian_is_answered_from_the_text():
    # The answer's language is not the question's: read by the Russian rule (every Latin
    # word is a name), "How" would be a name no document holds.
    out = await run(FakeTools([window(text=TEXT)]), req(answer_language="ru"))
    assert "нет ответа" not in out.answer
    assert "> To set up LDAP open Settings and choose Directory." in out.answer


async def test_a_question_naming_what_the_text_lacks_says_the_documents_do_not_answer():
    tools = FakeTools([window(text=TEXT)])
    out = await run(tools, req(messages=(Turn("user", "How do I set up LDAP in Kubernetes?"),)))
    assert out.answer.startswith("The documents do not answer this: “kubernetes” does not occur")
    assert "> To set up LDAP open Settings and choose Directory." in out.answer  # still shown


async def test_a_question_naming_the_document_by_its_title_is_answered_from_it():
    # The window's title is "Guide"; its text never says so.
    tools = FakeTools([window(text=TEXT)])
    question = "How do I set up LDAP, according to the Guide?"
    out = await run(tools, req(messages=(Turn("user", question),)))
    assert out.answer.startswith("**In short:** To set up LDAP open Settings and choose Directory.")
    other = await run(
        FakeTools([window(text=TEXT)]),
        req(messages=(Turn("user", "How do I set up LDAP, according to the Handbook?"),)),
    )
    assert other.answer.startswith("The documents do not answer this: “handbook” does not occur")


async def test_a_russian_question_naming_what_the_text_lacks():
    tools = FakeTools([window(text="Чтобы настроить LDAP, откройте раздел Настройки.")])
    question = "Как настроить LDAP в HAProxy?"
    out = await run(tools, req(messages=(Turn("user", question),)))
    assert "В документах нет ответа на этот вопрос: «haproxy»" in out.answer


class TickingClock(ManualClock):
    """Every reading a millisecond later: each step takes time."""

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


async def test_the_extractive_responder_reports_no_runtime_time():
    # GenerateMeta.runtime_ms: the time spent waiting for the model runtime, 0 without one.
    loop = ToolLoop(
        ExtractiveRuntime(), FakeTools([window(text=TEXT)]), READ_TOOL_SPECS, LoopSettings(),
        clock=TickingClock(), tokenizer=default_tokenizer(),
    )  # fmt: skip
    out = await loop.run(req())
    assert out.extractive and out.latency_ms > 0
    assert out.runtime_ms == 0
