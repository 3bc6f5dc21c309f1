"""Mock mode (orchestrator.md §3.6): deterministic in-process stand-ins of Retrieval, the LLM
service and the tools, over a small built-in sample corpus, with no network call.

The Responder runs its real Respond path against them (the scenario decision, the
summaries-only first prompt, the tool policy), so a caller without any backend gets the
shapes of a real answer: sources with pages, the tools called with their result summaries,
telemetry with the scenario.

The stand-ins live here rather than reusing the LLM service's tool loop and extractive
responder (services/llm/loop.py, services/llm/extractive.py): services meet on the wire and
never import one another's packages (docs/architecture.md §2). `MockGenerator` follows what the LLM
service does without a model: the planned calls first, then one read of the first listed
section (read_chunk_window on its anchor at the first radius of the schedule, else
read_doc_section), then an answer quoting the sentences that share the most words with the
question, with the document and pages, marked as a mock answer. Its `result_summary` strings
have the LLM service's format ("read N characters of doc (pp. a–b)").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.common.generate_contract import (
    failed_call_summary,
    last_question,
    listed_clarifications,
)
from services.common.lexical import search_terms, sentences
from services.common.search_contract import KB_SOURCE, Filters
from services.common.tokenizer import count_tokens
from services.common.tool_contract import NOT_FOUND, READ_CHUNK_WINDOW, READ_DOC_SECTION
from services.orchestrator.model import (
    LlmOutcome,
    LlmRequest,
    RetrievalOutcome,
    RetrievalRequest,
    SectionCandidate,
    ToolCallRecord,
    User,
)

BASE_SCORE = 0.35
"""A section sharing no word with the query still comes back (nearest neighbours always
exist), at this score; each shared word lifts it toward 0.95."""
MAX_QUOTES = 3
MOCK_DATE = "2026-01-15"
"""The date of the demo Bank of Russia and news data: fixed, so answers are deterministic."""


@dataclass(frozen=True)
class SampleChunk:
    chunk_id: str
    text: str
    page: int


@dataclass(frozen=True)
class SampleSection:
    section_id: str
    title: str
    summary: str
    chunks: tuple[SampleChunk, ...]

    @property
    def page_start(self) -> int:
        return self.chunks[0].page

    @property
    def page_end(self) -> int:
        return self.chunks[-1].page


@dataclass(frozen=True)
class SampleDocument:
    doc_id: str
    title: str
    sections: tuple[SampleSection, ...]
    product: str = ""
    version: str = ""
    tags: tuple[str, ...] = ()

    @property
    def chunks(self) -> tuple[SampleChunk, ...]:
        return tuple(c for s in self.sections for c in s.chunks)

    @property
    def text(self) -> str:
        return "\n\n".join(c.text for c in self.chunks)


def _section(doc_id: str, section_id: str, title: str, first: int, pages: tuple[int, ...],
             texts: tuple[str, ...]) -> SampleSection:  # fmt: skip
    chunks = tuple(
        SampleChunk(f"{doc_id}:c{first + i}", text, page)
        for i, (text, page) in enumerate(zip(texts, pages, strict=True))
    )
    return SampleSection(section_id, title, texts[0], chunks)


SAMPLE_DOCUMENTS: tuple[SampleDocument, ...] = (
    SampleDocument(
        "doc_1",
        "Orion X administrator guide",
        (
            _section(
                "doc_1",
                "sec_intro",
                "Introduction",
                0,
                (1, 1, 2),
                (
                    "Orion X is configured through the admin console at https://orion.local/admin.",
                    "The console needs an administrator account; the first one is created at "
                    "installation.",
                    "Every change in the console is written to the audit log.",
                ),
            ),
            _section(
                "doc_1",
                "sec_ldap",
                "LDAP integration",
                3,
                (6, 6, 7),
                (
                    "LDAP integration is set up under Settings > Auth > LDAP.",
                    "Give the server address, the base DN and a service account with read access.",
                    "Users log in with their directory password once LDAP synchronisation has run.",
                ),
            ),
            _section(
                "doc_1",
                "sec_backup",
                "Backup and restore",
                6,
                (9, 10),
                (
                    "Backups run every night at 02:00 and are kept for 14 days.",
                    "To restore a backup, stop the service and run orion-restore with the "
                    "backup's date.",
                ),
            ),
        ),
        product="orion-x",
        version="2.1",
        tags=("admin", "guide"),
    ),
    SampleDocument(
        "doc_2",
        "Договор поставки № 17",
        (
            _section(
                "doc_2",
                "sec_subject",
                "Предмет договора",
                0,
                (1, 1),
                (
                    "Поставщик передаёт покупателю 40 лицензий Orion X сроком на один год.",
                    "Стоимость лицензий составляет 1 200 000 рублей, включая НДС.",
                ),
            ),
            _section(
                "doc_2",
                "sec_terms",
                "Сроки и оплата",
                2,
                (2, 3),
                (
                    "Оплата производится в течение 10 рабочих дней после подписания акта.",
                    "Срок поставки лицензий — 5 рабочих дней с даты оплаты.",
                ),
            ),
        ),
        product="orion-x",
        tags=("contract",),
    ),
)
"""The user's documents in mock mode: the same for every tenant."""

KNOWLEDGE_BASE: tuple[SampleDocument, ...] = (
    SampleDocument(
        "kb_vat",
        "НДС: основные положения",
        (
            _section(
                "kb_vat",
                "sec_rate",
                "Ставки НДС",
                0,
                (1, 1),
                (
                    "Основная ставка НДС в России составляет 20 процентов (НК РФ, статья 164).",
                    "Льготная ставка 10 процентов применяется к отдельным продовольственным и "
                    "детским товарам.",
                ),
            ),
        ),
    ),
    SampleDocument(
        "kb_depreciation",
        "Depreciation basics",
        (
            _section(
                "kb_depreciation",
                "sec_methods",
                "Methods",
                0,
                (1, 2),
                (
                    "Depreciation spreads the cost of an asset over its useful life.",
                    "The straight-line method charges the same amount every year.",
                ),
            ),
        ),
    ),
)
"""The shared knowledge base in mock mode (filters.source=knowledge_base, search_general_kb)."""


def overlap_score(query: str, text: str) -> float:
    """BASE_SCORE plus up to 0.6 for the share of the query's words (by stem) found in the
    text."""
    wanted = set(search_terms(query))
    if not wanted:
        return BASE_SCORE
    return round(BASE_SCORE + 0.6 * len(wanted & set(search_terms(text))) / len(wanted), 4)


def _documents(filters: Filters) -> tuple[SampleDocument, ...]:
    docs = KNOWLEDGE_BASE if filters.source == KB_SOURCE else SAMPLE_DOCUMENTS
    return tuple(
        d
        for d in docs
        if (not filters.doc_ids or d.doc_id in filters.doc_ids)
        and (not filters.product or d.product == filters.product)
        and (not filters.version or d.version == filters.version)
        and (not filters.tags or set(filters.tags) & set(d.tags))
    )


def _find(doc_id: str) -> SampleDocument | None:
    return next((d for d in (*SAMPLE_DOCUMENTS, *KNOWLEDGE_BASE) if d.doc_id == doc_id), None)


class MockRetriever:
    """Retriever over the sample corpus: sections ranked by the words they share with the
    query (ties by document and section id), the request's filters and `min_score` applied."""

    def __init__(self, *, min_score: float | None = None) -> None:
        self._min_score = min_score or 0.0

    async def search(self, request: RetrievalRequest) -> RetrievalOutcome:
        filters = request.filters
        found: list[SectionCandidate] = []
        for doc in _documents(filters):
            for s in doc.sections:
                if filters.section_ids and s.section_id not in filters.section_ids:
                    continue
                text = " ".join((doc.title, s.title, *(c.text for c in s.chunks)))
                score = overlap_score(request.query, text)
                if score < self._min_score:
                    continue
                found.append(
                    SectionCandidate(doc.doc_id, s.section_id, s.title, s.summary, score,
                                     s.page_start, s.page_end, s.chunks[0].chunk_id)
                )  # fmt: skip
        found.sort(key=lambda c: (-c.score, c.doc_id, c.section_id))
        return RetrievalOutcome(tuple(found[: max(0, request.max_results)]), 0)

    async def document_sizes(
        self, user: User, doc_ids: tuple[str, ...]
    ) -> dict[str, tuple[int, int, str]]:
        return {
            d.doc_id: (len(d.text), count_tokens(d.text), d.title)
            for d in SAMPLE_DOCUMENTS
            if d.doc_id in doc_ids
        }


@dataclass(frozen=True)
class Passage:
    """Text a tool returned, with where it comes from."""

    doc_id: str
    title: str
    text: str
    page_start: int
    page_end: int


@dataclass(frozen=True)
class ToolResult:
    summary: str
    passages: tuple[Passage, ...] = ()
    facts: tuple[str, ...] = ()
    """Lines of non-document data (demo rates, demo news)."""
    ok: bool = True


def _read(doc: SampleDocument, chunks: tuple[SampleChunk, ...]) -> ToolResult:
    """The chunks' text, one passage per chunk (so a quote cites its own page)."""
    size = len(" ".join(c.text for c in chunks))
    first, last = chunks[0].page, chunks[-1].page
    return ToolResult(
        f"read {size} characters of {doc.doc_id} (pp. {first}–{last})",
        tuple(Passage(doc.doc_id, doc.title, c.text, c.page, c.page) for c in chunks),
    )


def _error(code: str, message: str) -> ToolResult:
    return ToolResult(failed_call_summary(code, message), ok=False)


class MockTools:
    """The tools over the sample corpus and fixed demo data (no network)."""

    def call(self, name: str, args: dict[str, Any]) -> ToolResult:
        handler: Callable[[dict[str, Any]], ToolResult] | None = getattr(self, f"_{name}", None)
        if handler is None:
            return _error("UNKNOWN_TOOL", f"tool {name!r} is not available in mock mode")
        return handler(args)

    def _read_chunk_window(self, args: dict[str, Any]) -> ToolResult:
        doc = _find(str(args.get("doc_id", "")))
        if doc is None:
            return _error(NOT_FOUND, f"document {args.get('doc_id')!r} not found")
        chunks = doc.chunks
        ids = [c.chunk_id for c in chunks]
        anchor = str(args.get("anchor_chunk_id", ""))
        if anchor not in ids:
            return _error(NOT_FOUND, f"chunk {anchor!r} not found in {doc.doc_id!r}")
        at, radius = ids.index(anchor), max(0, int(args.get("radius", 1)))
        return _read(doc, chunks[max(0, at - radius) : at + radius + 1])

    def _read_doc_section(self, args: dict[str, Any]) -> ToolResult:
        doc = _find(str(args.get("doc_id", "")))
        if doc is None:
            return _error(NOT_FOUND, f"document {args.get('doc_id')!r} not found")
        section = next((s for s in doc.sections if s.section_id == args.get("section_id")), None)
        if section is None:
            return _error(NOT_FOUND, f"section {args.get('section_id')!r} not found")
        return _read(doc, section.chunks)

    def _load_documents_full(self, args: dict[str, Any]) -> ToolResult:
        ids = [str(d) for d in args.get("document_ids") or args.get("doc_ids") or ()]
        docs = [d for d in SAMPLE_DOCUMENTS if d.doc_id in ids]
        if not docs:
            return _error(NOT_FOUND, "none of the documents was found")
        passages = tuple(
            Passage(d.doc_id, d.title, d.text, d.chunks[0].page, d.chunks[-1].page) for d in docs
        )
        size = sum(len(p.text) for p in passages)
        return ToolResult(
            f"read {size} characters of {', '.join(d.doc_id for d in docs)}", passages
        )

    def _search_general_kb(self, args: dict[str, Any]) -> ToolResult:
        query = str(args.get("query", ""))
        ranked = sorted(KNOWLEDGE_BASE, key=lambda d: (-overlap_score(query, d.text), d.doc_id))[
            : max(1, int(args.get("top_k", 5)))
        ]
        passages = tuple(
            Passage(d.doc_id, d.title, d.text, d.chunks[0].page, d.chunks[-1].page) for d in ranked
        )
        size = sum(len(p.text) for p in passages)
        return ToolResult(f"read {size} characters of the knowledge base", passages)

    def _fetch_cbr_data(self, args: dict[str, Any]) -> ToolResult:
        kind = str(args.get("mode") or "currency")
        if kind == "key_rate":
            facts: tuple[str, ...] = (f"Key rate on {MOCK_DATE}: 16.00% (demo data, mock mode)",)
        else:
            code = str(args.get("code") or "USD").upper()
            rate = DEMO_RATES.get(code)
            if rate is None:
                return _error(NOT_FOUND, f"no demo rate for {code!r}")
            facts = (f"{code}/RUB on {MOCK_DATE}: {rate:.4f} (demo data, mock mode)",)
        return ToolResult(f"ok: {kind}, demo Bank of Russia data", facts=facts)

    def _fetch_finance_news(self, args: dict[str, Any]) -> ToolResult:
        query = str(args.get("query", ""))[:80]
        facts = tuple(
            f"{title} ({MOCK_DATE}, https://example.org/mock-news/{i})"
            for i, title in enumerate((f"Demo headline about {query}", "Demo market summary"), 1)
        )
        return ToolResult(f"ok: {len(facts)} demo news items", facts=facts)


DEMO_RATES = {"USD": 90.0, "EUR": 98.5, "CNY": 12.4, "GBP": 114.2}

_TEXT = {
    "ru": {
        "conclusion": "**Вывод:**",
        "details": "**Подробности:**",
        "sources": "**Источники:**",
        "pages": "с.",
        "not_found": "В документах не нашлось ответа на этот вопрос.",
        "chat": "Здравствуйте! Я могу помочь с вашими документами, базой знаний, курсами валют "
        "и финансовыми новостями.",
        "marker": "_Демо-режим (mock): ответ собран из встроенного примера документов, без "
        "модели и без сервисов._",
    },
    "en": {
        "conclusion": "**Conclusion:**",
        "details": "**Details:**",
        "sources": "**Sources:**",
        "pages": "pp.",
        "not_found": "The documents do not answer this question.",
        "chat": "Hello! I can help with your documents, the knowledge base, exchange rates and "
        "finance news.",
        "marker": "_Mock mode: composed from a built-in sample corpus, without a model or "
        "services._",
    },
}


def compose_answer(
    question: str, passages: list[Passage], facts: list[str], language: str, system: str
) -> str:
    """An extractive answer: the sentences sharing the most words with the question, quoted
    with their document and pages; demo data as it is; else the clarification questions of
    the system prompt, a short chat answer, or "not found"."""
    t = _TEXT.get(language, _TEXT["ru"])
    if not passages and not facts:
        asks = listed_clarifications(system)
        if asks:
            body = "\n".join(f"- {q}" for q in asks)
        elif "small talk" in system or "general question" in system:
            body = t["chat"]
        else:
            body = t["not_found"]
        return f"{body}\n\n{t['marker']}"
    quotes: list[tuple[float, int, str, Passage]] = []
    for i, p in enumerate(passages):
        for s in sentences(p.text):
            quotes.append((overlap_score(question, s), -i, s, p))
    quotes.sort(key=lambda q: (-q[0], -q[1]))
    # The sentences sharing a word with the question; the first one read when none does.
    best = [q for q in quotes if q[0] > BASE_SCORE][:MAX_QUOTES] or quotes[:1]
    lines = [f"{t['conclusion']} {best[0][2] if best else facts[0]}", "", t["details"]]
    lines += [f"- «{s}» — {p.title}, {t['pages']} {_pages(p)}" for _, _, s, p in best]
    lines += [f"- {f}" for f in facts]
    cited = dict.fromkeys(f"{p.title} ({p.doc_id})" for _, _, _, p in best)
    if cited:
        lines += ["", f"{t['sources']} {'; '.join(cited)}"]
    return "\n".join([*lines, "", t["marker"]])


def _pages(p: Passage) -> str:
    return str(p.page_start) if p.page_start == p.page_end else f"{p.page_start}–{p.page_end}"


class MockGenerator:
    """Generator standing in for the LLM service and its tools (see the module's doc)."""

    def __init__(
        self, tools: MockTools | None = None, *, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self._tools = tools or MockTools()
        self._clock = clock

    async def generate(self, request: LlmRequest) -> LlmOutcome:
        started = self._clock()
        if request.response_schema is not None:
            # Routing: no model to ask, as with the LLM service's extractive responder; the
            # Responder's rules decide.
            return LlmOutcome("", (), 0, self._ms(started), extractive=True)
        records: list[ToolCallRecord] = []
        passages: list[Passage] = []
        facts: list[str] = []

        def run(name: str, args: dict[str, Any]) -> ToolResult:
            result = self._tools.call(name, args)
            records.append(ToolCallRecord(name, args, result.summary))
            passages.extend(result.passages)
            facts.extend(result.facts)
            return result

        for planned in request.planned_calls[: max(1, request.max_tool_steps)]:
            run(planned.tool_name, dict(planned.arguments))
        radius = request.radius_schedule[0] if request.radius_schedule else 0
        for section in request.context:
            if passages or len(records) >= request.max_tool_steps:
                break
            if section.anchor_chunk_id and READ_CHUNK_WINDOW in request.allowed_tools:
                run(READ_CHUNK_WINDOW, {"doc_id": section.doc_id,
                                          "anchor_chunk_id": section.anchor_chunk_id,
                                          "radius": radius})  # fmt: skip
            elif READ_DOC_SECTION in request.allowed_tools:
                run(READ_DOC_SECTION,
                    {"doc_id": section.doc_id, "section_id": section.section_id})  # fmt: skip
        language = request.answer_language or "ru"
        answer = compose_answer(
            last_question(request.messages), passages, facts, language, request.system_prompt
        )
        return LlmOutcome(answer, tuple(records), len(records), self._ms(started), extractive=True)

    def _ms(self, started: float) -> int:
        return round((self._clock() - started) * 1000)


__all__ = [
    "KNOWLEDGE_BASE",
    "SAMPLE_DOCUMENTS",
    "MockGenerator",
    "MockRetriever",
    "MockTools",
    "compose_answer",
]
