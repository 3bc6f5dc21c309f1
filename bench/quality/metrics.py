"""Graded retrieval metrics (nDCG@k, Recall@k, hit@k, MRR) judged per document, section or page."""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Level = Literal["doc", "section", "page"]
LEVELS: tuple[Level, ...] = ("doc", "section", "page")
Unit = tuple[str, str | int | None]
"""What is judged at a level: (doc_id, None), (doc_id, normalised heading) or (doc_id, page)."""

_SLUG = re.compile(r"[^0-9a-zа-яё]+")
_NUMBERING = re.compile(r"^(?:глава\s+|chapter\s+)?\d+(?:\.\d+)*\.?\s+")
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class Judgment:
    """One graded judgment: this file (and section heading and/or page) answers the query."""

    file: str
    """Corpus file name, e.g. "hosts.5.ru.md"."""
    section: str | None
    """Heading text exactly as it appears in the file (PDF: the outline title), or None."""
    page: int | None
    """1-based physical page, or None when the judgment is not about a page."""
    grade: int
    """2 answers the query, 1 answers it partially."""


@dataclass(frozen=True)
class RetrievedHit:
    """One search hit as the harness sees it, best first."""

    doc_id: str
    section_title: str | None
    """The hit's section heading, when known."""
    page_start: int = 0
    page_end: int = 0


def doc_id_for(file_name: str) -> str:
    """The doc_id the harness ingests a corpus file under: a slug of the name without extension."""
    stem = file_name.rsplit("/", 1)[-1]
    if "." in stem:
        stem = stem.rsplit(".", 1)[0]
    return _SLUG.sub("-", stem.lower()).strip("-")


def normalise_heading(text: str) -> str:
    """Compare headings loosely: case, spacing, quotes, a leading number like "6.2.1." ignored."""
    text = unicodedata.normalize("NFKC", text).casefold().replace("ё", "е")
    text = _SPACES.sub(" ", text).strip()
    text = _NUMBERING.sub("", text)
    return text.strip(" .:;-–—")


PATH_SEPARATORS = (" › ", " > ")
"""How a server may join a heading path into one title ("Parent › Child")."""


def own_heading(title: str) -> str:
    """The section's own heading from a title that may be a heading path ("A › B" -> "B").

    The gold set judges a section by its own heading as the file shows it; a server that
    titles sections with the whole path (services/docstore/parsing.py joins it with " › ")
    would otherwise never match a nested section.
    """
    for sep in PATH_SEPARATORS:
        if sep in title:
            title = title.rsplit(sep, 1)[-1]
    return title


def judged_units(judgments: Iterable[Judgment], level: Level) -> dict[Unit, int]:
    """The units judged at `level` and their grade (the highest grade when judged twice)."""
    units: dict[Unit, int] = {}
    for j in judgments:
        doc = doc_id_for(j.file)
        unit: Unit
        if level == "doc":
            unit = (doc, None)
        elif level == "section":
            if not j.section:
                continue
            unit = (doc, normalise_heading(j.section))
        else:
            if j.page is None:
                continue
            unit = (doc, j.page)
        if j.grade > 0:
            units[unit] = max(units.get(unit, 0), j.grade)
    return units


def ranked_units(
    hits: Sequence[RetrievedHit], level: Level, judged: Mapping[Unit, int]
) -> list[Unit]:
    """Turn hits into a ranked list of distinct units; a later hit on a unit already seen is dropped.

    At page level a hit covers pages page_start..page_end: it counts as the best judged page in
    that range not credited yet, else as its first page (a hit cannot earn two pages).
    """
    out: list[Unit] = []
    seen: set[Unit] = set()
    for hit in hits:
        unit: Unit
        if level == "doc":
            unit = (hit.doc_id, None)
        elif level == "section":
            title = normalise_heading(own_heading(hit.section_title)) if hit.section_title else None
            unit = (hit.doc_id, title)
        else:
            start = hit.page_start or 0
            end = max(hit.page_end or start, start)
            candidates = [
                (judged[(hit.doc_id, p)], -p)
                for p in range(start, end + 1)
                if (hit.doc_id, p) in judged and (hit.doc_id, p) not in seen
            ]
            if candidates:
                unit = (hit.doc_id, -max(candidates)[1])
            else:
                unit = (hit.doc_id, start or None)
        if unit[1] is None and level != "doc":
            # Unknown section/page: a distinct, never-relevant entry that still takes a rank.
            out.append(unit)
            continue
        if unit in seen:
            continue
        seen.add(unit)
        out.append(unit)
    return out


def dcg(gains: Sequence[float], k: int) -> float:
    """Discounted cumulative gain of the first k gains: sum gain_i / log2(i + 1), i from 1."""
    return sum(g / math.log2(i + 2) for i, g in enumerate(gains[:k]))


def ndcg_at_k(ranked: Sequence[Unit], judged: Mapping[Unit, int], k: int) -> float:
    """nDCG@k with the grade as the gain (linear gains, as trec_eval's ndcg_cut)."""
    ideal = dcg(sorted(judged.values(), reverse=True), k)
    if ideal == 0:
        return 0.0
    return dcg([judged.get(u, 0) for u in ranked], k) / ideal


def recall_at_k(ranked: Sequence[Unit], judged: Mapping[Unit, int], k: int) -> float:
    """Share of the relevant units (grade >= 1) found in the first k."""
    relevant = {u for u, g in judged.items() if g > 0}
    if not relevant:
        return 0.0
    return len(relevant.intersection(ranked[:k])) / len(relevant)


def hit_at_k(ranked: Sequence[Unit], judged: Mapping[Unit, int], k: int) -> float:
    """1.0 when a relevant unit is in the first k, else 0.0."""
    return 1.0 if any(judged.get(u, 0) > 0 for u in ranked[:k]) else 0.0


def reciprocal_rank(ranked: Sequence[Unit], judged: Mapping[Unit, int]) -> float:
    """1 / rank of the first relevant unit, 0.0 when none is retrieved."""
    for i, unit in enumerate(ranked, start=1):
        if judged.get(unit, 0) > 0:
            return 1.0 / i
    return 0.0


@dataclass(frozen=True)
class QueryScore:
    """One query's scores at one level."""

    ndcg10: float
    recall5: float
    recall10: float
    hit1: float
    hit5: float
    mrr: float


def score_query(
    hits: Sequence[RetrievedHit], judgments: Iterable[Judgment], level: Level
) -> QueryScore | None:
    """Score one query at `level`; None when the query has no judgment at that level."""
    judged = judged_units(judgments, level)
    if not judged:
        return None
    ranked = ranked_units(hits, level, judged)
    return QueryScore(
        ndcg10=ndcg_at_k(ranked, judged, 10),
        recall5=recall_at_k(ranked, judged, 5),
        recall10=recall_at_k(ranked, judged, 10),
        hit1=hit_at_k(ranked, judged, 1),
        hit5=hit_at_k(ranked, judged, 5),
        mrr=reciprocal_rank(ranked, judged),
    )


def mean_scores(scores: Sequence[QueryScore]) -> dict[str, float]:
    """Average each metric over the scored queries (empty dict when there are none)."""
    if not scores:
        return {}
    names = ("ndcg10", "recall5", "recall10", "hit1", "hit5", "mrr")
    return {n: sum(getattr(s, n) for s in scores) / len(scores) for n in names}
