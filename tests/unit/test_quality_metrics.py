"""Retrieval-quality metrics against hand-computed values, and the gold set against its corpus."""

from __future__ import annotations

import math

import pytest

from bench.quality.gold import CORPUS_DIR, load_queries, validate_gold
from bench.quality.metrics import (
    Judgment,
    RetrievedHit,
    doc_id_for,
    hit_at_k,
    judged_units,
    ndcg_at_k,
    normalise_heading,
    ranked_units,
    recall_at_k,
    reciprocal_rank,
    score_query,
)

JUDGED = {("a", None): 2, ("b", None): 1, ("c", None): 2}


def units(*docs: str) -> list[tuple[str, None]]:
    return [(d, None) for d in docs]


def test_ndcg_hand_computed() -> None:
    # Ranked a (2), x (0), b (1): DCG = 2/log2(2) + 0 + 1/log2(4) = 2 + 0.5 = 2.5.
    # Ideal 2, 2, 1: IDCG = 2 + 2/log2(3) + 1/2 = 2 + 1.261860 + 0.5 = 3.761860; 2.5 / 3.761860 = 0.664565.
    got = ndcg_at_k(units("a", "x", "b"), JUDGED, 10)
    assert got == pytest.approx(2.5 / (2.5 + 2 / math.log2(3)), abs=1e-9)
    assert got == pytest.approx(0.664565, abs=1e-6)


def test_ndcg_perfect_and_cutoff() -> None:
    assert ndcg_at_k(units("a", "c", "b"), JUDGED, 10) == pytest.approx(1.0)
    # k=1 keeps only the first: x (0) gives 0, c (2) gives the ideal 2.
    assert ndcg_at_k(units("x", "a"), JUDGED, 1) == 0.0
    assert ndcg_at_k(units("c", "x"), JUDGED, 1) == pytest.approx(1.0)


def test_recall_hit_mrr_hand_computed() -> None:
    ranked = units("x", "y", "b", "z", "q", "a")
    assert recall_at_k(ranked, JUDGED, 5) == pytest.approx(1 / 3)
    assert recall_at_k(ranked, JUDGED, 10) == pytest.approx(2 / 3)
    assert hit_at_k(ranked, JUDGED, 1) == 0.0
    assert hit_at_k(ranked, JUDGED, 3) == 1.0
    assert reciprocal_rank(ranked, JUDGED) == pytest.approx(1 / 3)
    assert reciprocal_rank(units("x"), JUDGED) == 0.0


def test_duplicate_hits_on_one_doc_count_once() -> None:
    hits = [RetrievedHit("a", "s1"), RetrievedHit("a", "s2"), RetrievedHit("b", "s3")]
    assert ranked_units(hits, "doc", JUDGED) == units("a", "b")


def test_section_level_matches_heading_text_loosely() -> None:
    judgments = [
        Judgment("debian-faq.ru.txt", "6.3. Что такое «sid»?", None, 2),
        Judgment("hosts.5.ru.md", "ОПИСАНИЕ", None, 1),
    ]
    judged = judged_units(judgments, "section")
    assert judged == {("debian-faq-ru", "что такое «sid»?"): 2, ("hosts-5-ru", "описание"): 1}
    hits = [
        RetrievedHit("hosts-5-ru", "ИМЯ"),
        RetrievedHit("debian-faq-ru", "Что  такое «sid»?"),
        RetrievedHit("hosts-5-ru", "Описание"),
    ]
    score = score_query(hits, judgments, "section")
    assert score is not None
    assert score.mrr == pytest.approx(0.5)
    assert score.recall5 == pytest.approx(1.0)
    # DCG = 0 + 2/log2(3) + 1/log2(4); IDCG = 2 + 1/log2(3).
    assert score.ndcg10 == pytest.approx((2 / math.log2(3) + 0.5) / (2 + 1 / math.log2(3)))


def test_unknown_section_takes_a_rank_but_never_counts() -> None:
    judgments = [Judgment("f.md", "Usage", None, 2)]
    hits = [RetrievedHit("f", None), RetrievedHit("f", None), RetrievedHit("f", "Usage")]
    score = score_query(hits, judgments, "section")
    assert score is not None and score.mrr == pytest.approx(1 / 3)


def test_page_level_credits_one_page_per_hit() -> None:
    judgments = [
        Judgment("guide.ru.pdf", "Файл watch", 45, 2),
        Judgment("guide.ru.pdf", "Файл watch", 46, 1),
    ]
    judged = judged_units(judgments, "page")
    # A hit spanning 44-46 earns the best judged page (45); the next one on 46 earns page 46.
    hits = [RetrievedHit("guide-ru", None, 44, 46), RetrievedHit("guide-ru", None, 46, 46)]
    assert ranked_units(hits, "page", judged) == [("guide-ru", 45), ("guide-ru", 46)]
    score = score_query(hits, judgments, "page")
    assert score is not None and score.ndcg10 == pytest.approx(1.0)
    # Two hits on page 45 only: the second adds nothing, recall is 1/2.
    again = [RetrievedHit("guide-ru", None, 45, 45), RetrievedHit("guide-ru", None, 45, 45)]
    score = score_query(again, judgments, "page")
    assert score is not None and score.recall10 == pytest.approx(0.5)


def test_query_without_judgments_at_a_level_is_not_scored() -> None:
    judgments = [Judgment("hosts.5.ru.md", "ОПИСАНИЕ", None, 2)]
    assert score_query([RetrievedHit("hosts-5-ru", "ОПИСАНИЕ")], judgments, "page") is None


def test_doc_ids_and_headings() -> None:
    assert doc_id_for("debian-faq.en.pdf") == "debian-faq-en"
    assert doc_id_for("nsswitch.conf.5.ru.md") == "nsswitch-conf-5-ru"
    assert normalise_heading("6.2.1. Какие кодовые имена уже использовались?") == (
        "какие кодовые имена уже использовались?"
    )
    assert normalise_heading("1.1 What is this FAQ?") == "what is this faq?"
    assert normalise_heading("Глава 3. Выбор") == "выбор"


def test_gold_set_is_consistent_with_the_corpus() -> None:
    dev = load_queries("dev")
    heldout = load_queries("heldout")
    assert len(dev) + len(heldout) >= 80
    assert not {q.qid for q in dev} & {q.qid for q in heldout}
    assert {q.lang for q in dev} == {"ru", "en"} == {q.lang for q in heldout}
    assert validate_gold(dev + heldout) == []


def test_validate_gold_reports_a_wrong_heading_and_page() -> None:
    bad = load_queries("dev")[:1]
    query = bad[0]
    broken = [
        Judgment(query.relevant[0].file, "No such heading anywhere", None, 2),
        Judgment("maint-guide.ru.pdf", "Файл watch", 999, 2),
        Judgment("missing.md", "X", None, 2),
    ]
    problems = validate_gold([query.__class__(query.qid, query.lang, query.query, broken)])
    assert len(problems) == 3
    assert (CORPUS_DIR / "SOURCES.md").exists()
