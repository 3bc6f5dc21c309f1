"""bench/answers scoring: page among sources, key facts, "not in the documents", language."""

from __future__ import annotations

import httpx
import pytest

from bench.answers.documents import paginate
from bench.answers.gold import Question, validate
from bench.answers.run import ask, summarize
from bench.answers.scoring import (
    cyrillic_ratio,
    detect_language,
    fact_present,
    facts_found,
    page_in_sources,
    says_not_in_documents,
)
from bench.tool_limits import NO_TOOL_RATE_LIMITS
from services.common.settings import Env
from services.toolsproxy.config import RATE_LIMITS
from services.toolsproxy.ratelimit import RateLimits


def _src(doc: str, start: int, end: int) -> dict[str, object]:
    return {"doc_id": doc, "section_id": f"{doc}:s1", "page_start": start, "page_end": end}


# --- page among sources


def test_page_inside_a_source_range_counts() -> None:
    assert page_in_sources([_src("guide", 44, 45)], [("guide", 45)])
    assert page_in_sources([_src("guide", 44, 45)], [("guide", 44)])


def test_page_outside_the_range_does_not_count() -> None:
    assert not page_in_sources([_src("guide", 44, 45)], [("guide", 46)])
    assert not page_in_sources([_src("guide", 44, 45)], [("guide", 43)])


def test_the_right_page_of_another_document_does_not_count() -> None:
    assert not page_in_sources([_src("other", 40, 50)], [("guide", 45)])


def test_an_alternative_location_counts() -> None:
    sources = [_src("guide-ru", 48, 48)]
    assert page_in_sources(sources, [("guide-en", 44), ("guide-ru", 48)])


def test_a_missing_or_inverted_page_end_is_the_start_page() -> None:
    assert page_in_sources([{"doc_id": "d", "page_start": 3}], [("d", 3)])
    assert not page_in_sources([{"doc_id": "d", "page_start": 3}], [("d", 4)])
    assert page_in_sources([_src("d", 5, 0)], [("d", 5)])


def test_no_sources_no_hit() -> None:
    assert not page_in_sources([], [("d", 1)])
    assert not page_in_sources([_src("d", 1, 9)], [])


# --- key facts


def test_fact_matching_ignores_case_markup_and_typography() -> None:
    assert fact_present(["dpkg-buildpackage -us -uc"], "Run `DPKG-BUILDPACKAGE -us -uc` now")
    assert fact_present(["dpkg-buildpackage -us -uc"], "**dpkg\u2010buildpackage**  -us\n-uc")
    assert fact_present(["3.0 (quilt)"], "формат «3.0 (quilt)»")
    assert fact_present(["подавл"], "ошибки подавляются") is False  # a word start is not a word
    assert fact_present(["подавляются"], "Ошибки ПОДАВЛЯЮТСЯ.")


def test_a_trailing_star_makes_a_prefix() -> None:
    assert fact_present(["подавля*"], "ошибки подавляются")
    assert not fact_present(["подавля*"], "неподавляемые ошибки")
    assert not fact_present(["*"], "anything")


def test_fact_alternatives_any_one_is_enough() -> None:
    assert fact_present(["exclamation", "восклицательн*"], "заменяются восклицательными знаками")
    assert not fact_present(["exclamation", "восклицательными"], "заменяются на знаки")


def test_a_number_must_stand_alone() -> None:
    assert fact_present(["128"], "at most 128 bytes")
    assert not fact_present(["128"], "1280 bytes")
    assert not fact_present(["30"], "in 2030")
    assert not fact_present(["10"], "level 100")


def test_a_word_must_not_be_part_of_a_longer_word() -> None:
    assert not fact_present(["quilt"], "use dquilt")
    assert fact_present(["quilt"], "use quilt.")


def test_an_option_fact_may_follow_a_letter_boundary() -> None:
    assert fact_present(["-B"], "dpkg-buildpackage -B builds arch-dependent packages")
    assert fact_present(["--addmissing"], "dh_make --addmissing")


def test_facts_found_counts_each_fact_once() -> None:
    facts = [["DEBEMAIL"], ["DEBFULLNAME"]]
    assert facts_found(facts, "set DEBEMAIL and DEBFULLNAME") == 2
    assert facts_found(facts, "set DEBEMAIL, DEBEMAIL") == 1
    assert facts_found(facts, "") == 0


def test_an_empty_alternative_matches_nothing() -> None:
    assert not fact_present(["", "  "], "anything")


# --- "not in the documents"


@pytest.mark.parametrize(
    "answer",
    [
        "В доступных документах не нашлось ответа на этот вопрос.",
        "В документах ничего не нашлось по этому запросу.",
        "В предоставленных документах нет информации о репликации PostgreSQL.",
        "К сожалению, документы не содержат сведений об этом.",
        "Ответа на этот вопрос в документах нет.",
        "Мне не удалось найти это в документах.",
        "The available documents do not answer this question.",
        "Nothing was found in the documents for this request.",
        "This is not mentioned in the provided documents.",
        "I could not find information about Kubernetes in the documents.",
        "The passages found do not answer this directly; here are the closest.",
    ],
)
def test_not_in_documents_is_recognised(answer: str) -> None:
    assert says_not_in_documents(answer)


@pytest.mark.parametrize(
    "answer",
    [
        "Выполните dpkg-buildpackage -us -uc в каталоге исходников.",
        "Файл дампа не создаётся, если каталог недоступен для записи.",  # a negation, no refusal
        "Программный интерфейс fanotify не сообщает о доступе через mmap(2).",
        "Run dpkg-buildpackage -us -uc in the source directory.",
        "The fanotify API does not report file accesses made through mmap(2).",
        "No further modification events for this file are of interest until it is closed.",
        "",
    ],
)
def test_an_answer_is_not_taken_for_not_in_documents(answer: str) -> None:
    assert not says_not_in_documents(answer)


# --- language


def test_russian_answer_with_commands_and_english_quote_is_russian() -> None:
    answer = (
        "Соберите пакет командой `dpkg-buildpackage -us -uc`. В документе сказано: "
        "\u201cThis will do everything to make full binary and source packages\u201d."
    )
    assert detect_language(answer) == "ru"


def test_english_answer_with_a_russian_title_is_english() -> None:
    answer = (
        "From \u201cfanotify(7) — отслеживание событий\u201d (p. 8): if access is denied, the "
        "requesting application call will receive an EPERM error."
    )
    assert detect_language(answer) == "en"


def test_code_and_urls_do_not_count() -> None:
    assert (
        cyrillic_ratio("Да: ```\nsome long english code block here\n``` https://x.org/abc") == 1.0
    )
    assert detect_language("`only code`") == ""
    assert detect_language("") == ""


def test_cyrillic_ratio_bounds() -> None:
    assert cyrillic_ratio("абв") == 1.0
    assert cyrillic_ratio("abc") == 0.0
    assert cyrillic_ratio("аб cd") == 0.5


# --- gold validation and pages


def _q(**kw: object) -> Question:
    base: dict[str, object] = dict(
        id="q1",
        lang="en",
        scenario="S1",
        kind="fact",
        split="dev",
        question="How?",
        doc="d.pdf",
        page=2,
        facts=(("dupload",),),
    )
    base.update(kw)
    return Question(**base)  # type: ignore[arg-type]


def test_validate_accepts_a_fact_on_its_page() -> None:
    assert validate([_q()], {"d.pdf": ["intro", "use dupload here"]}) == []


def test_validate_rejects_a_fact_missing_from_its_page() -> None:
    problems = validate([_q()], {"d.pdf": ["use dupload here", "other"]})
    assert any("lacks the fact" in p for p in problems)


def test_validate_rejects_a_page_past_the_end_and_unknown_docs() -> None:
    assert any("no page 3" in p for p in validate([_q(page=3)], {"d.pdf": ["a", "b"]}))
    assert any("unknown document" in p for p in validate([_q(doc="x.pdf")], {"d.pdf": ["a"]}))


def test_validate_checks_the_s3_size_rule() -> None:
    big = {"d.pdf": ["dupload " * 7000, "dupload"]}
    q = _q(scenario="S3", select=("d.pdf",), page=2)
    assert any("S3 selects" in p for p in validate([q], big))
    small = {"d.pdf": ["a", "dupload"]}
    assert validate([q], small) == []
    assert any("S4 selects" in p for p in validate([_q(scenario="S4", select=("d.pdf",))], small))


def test_validate_rejects_unanswerable_with_a_gold_page_and_duplicate_ids() -> None:
    pages = {"d.pdf": ["a", "dupload"]}
    problems = validate([_q(kind="unanswerable"), _q()], pages)
    assert any("unanswerable question has a gold page" in p for p in problems)
    assert any("duplicate id" in p for p in problems)


def test_paginate_cuts_at_paragraph_ends() -> None:
    text = "\n\n".join(f"para {i} " + "x" * 40 for i in range(10)) + "\n"
    pages = paginate(text, page_chars=100).split("\f")
    assert len(pages) == 4
    assert all(p.endswith("\n") for p in pages)
    assert "".join(pages).replace("\n", "") == text.replace("\n", "")


def test_validate_checks_the_passage_language() -> None:
    pages = {"d.pdf": ["a", "dupload"]}
    assert validate([_q(passage="ru")], pages) == []
    assert _q(passage="ru").cross_language and not _q(passage="en").cross_language
    assert any("passage" in p for p in validate([_q(passage="de")], pages))
    unanswerable = _q(kind="unanswerable", doc=None, page=None, facts=(), passage="ru")
    assert any("passage" in p for p in validate([unanswerable], pages))


# --- a failed tool call inside a 200 answer


def _respond_with(tools: list[dict[str, object]]) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200,
            json={
                "answer": "Не удалось получить данные (load_documents_full): rate limit …",
                "sources": [_src("d", 1, 3)],
                "tools": tools,
            },
        )

    return httpx.Client(transport=httpx.MockTransport(handler))


def test_a_failed_tool_call_is_counted_apart_from_errors() -> None:
    failed = {"name": "load_documents_full",
              "result_summary": "tool_error RATE_LIMIT_EXCEEDED: rate limit of 100000 tokens"}  # fmt: skip
    with _respond_with([failed]) as client:
        out = ask(client, "http://mesh", _q(), {"d.pdf": "d"}, timeout=5)
    assert out.error == "" and out.page_hit is True  # a 200 with the page among the sources
    assert out.tool_errors == [
        "load_documents_full: tool_error RATE_LIMIT_EXCEEDED: rate limit of 100000 tokens"
    ]
    s = summarize([out])
    assert s["errors"] == 0
    assert s["with_tool_error"] == 1 and s["tool_error_ids"] == ["q1"]


def test_a_tool_call_that_read_is_not_a_tool_error() -> None:
    read = {"name": "read_chunk_window", "result_summary": "read 812 characters of d (pp. 2–2)"}
    with _respond_with([read]) as client:
        out = ask(client, "http://mesh", _q(), {"d.pdf": "d"}, timeout=5)
    assert out.tools == ["read_chunk_window"] and out.tool_errors == []
    assert summarize([out])["with_tool_error"] == 0


def test_the_harness_mesh_runs_without_tool_rate_limits() -> None:
    # The harness asks about one document many times a minute; a limit would fail answers.
    assert set(NO_TOOL_RATE_LIMITS.values()) == {"0"}
    assert set(NO_TOOL_RATE_LIMITS) == {
        f"MCP_PROXY_RATE_LIMIT_{k}" for k in
        ("CALLS_PER_MIN", "TOKENS_PER_MIN", "TENANT_CALLS_PER_MIN", "TENANT_TOKENS_PER_MIN")
    }  # fmt: skip
    limits = RATE_LIMITS.read(Env(NO_TOOL_RATE_LIMITS))
    assert limits == RateLimits(0, 0, 0, 0)
