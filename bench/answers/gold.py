"""The answer gold set (gold.jsonl): loading, and the check of every gold page against its document."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.answers.documents import DOCS, page_texts
from bench.answers.scoring import fact_present

HERE = Path(__file__).resolve().parent
GOLD = HERE / "gold.jsonl"

LANGS = ("ru", "en")
SPLITS = ("dev", "heldout")
SCENARIOS = ("S1", "S3", "S4")
KINDS = ("fact", "definition", "unanswerable")
S3_MAX_CHARS = 50_000
"""S3 selects documents under this many characters (read in full); S4 the larger ones."""


@dataclass(frozen=True)
class Question:
    id: str
    lang: str
    scenario: str
    kind: str
    split: str
    question: str
    doc: str | None
    page: int | None
    facts: tuple[tuple[str, ...], ...]
    also: tuple[tuple[str, int], ...] = ()
    select: tuple[str, ...] = field(default=())
    passage: str = ""
    """The language of the passage that answers, when it is not the question's (an
    untranslated English paragraph of a Russian page, or the other way round)."""

    @property
    def cross_language(self) -> bool:
        return bool(self.passage) and self.passage != self.lang

    @property
    def answerable(self) -> bool:
        return self.kind != "unanswerable"

    def locations(self) -> list[tuple[str, int]]:
        """The gold page first, then the alternatives (file name, 1-based page)."""
        if self.doc is None or self.page is None:
            return []
        return [(self.doc, self.page), *self.also]


class GoldError(ValueError):
    """The gold set is malformed or does not match its documents."""


def parse(record: Mapping[str, object]) -> Question:
    r = dict(record)
    try:
        facts = tuple(tuple(str(a) for a in f) for f in r.get("facts") or [])  # type: ignore[attr-defined]
        also = tuple((str(a["doc"]), int(a["page"])) for a in r.get("also") or [])  # type: ignore[index,attr-defined]
        return Question(
            id=str(r["id"]),
            lang=str(r["lang"]),
            scenario=str(r["scenario"]),
            kind=str(r["kind"]),
            split=str(r["split"]),
            question=str(r["question"]),
            doc=None if r.get("doc") is None else str(r["doc"]),
            page=None if r.get("page") is None else int(r["page"]),  # type: ignore[call-overload]
            facts=facts,
            also=also,
            select=tuple(str(s) for s in r.get("select") or []),  # type: ignore[attr-defined]
            passage=str(r.get("passage") or ""),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise GoldError(f"{r.get('id', '?')}: {exc!r}") from None


def load(path: Path = GOLD) -> list[Question]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [parse(json.loads(line)) for line in lines if line.strip()]


def validate(questions: Sequence[Question], pages: Mapping[str, Sequence[str]]) -> list[str]:
    """Every problem found: schema, selections, and each key fact on its gold page(s).

    `pages` maps a document's file name to its page texts. An empty list means the gold set
    holds for these documents.
    """
    problems: list[str] = []
    seen: set[str] = set()
    sizes = {name: sum(len(p) for p in texts) for name, texts in pages.items()}
    for q in questions:
        where = q.id
        if q.id in seen:
            problems.append(f"{where}: duplicate id")
        seen.add(q.id)
        for attr, allowed in (
            ("lang", LANGS),
            ("split", SPLITS),
            ("scenario", SCENARIOS),
            ("kind", KINDS),
        ):
            if getattr(q, attr) not in allowed:
                problems.append(f"{where}: {attr} {getattr(q, attr)!r} not in {allowed}")
        if q.passage and (q.passage not in LANGS or not q.answerable):
            problems.append(
                f"{where}: passage {q.passage!r} needs an answerable question, ru or en"
            )
        if not q.question.strip():
            problems.append(f"{where}: empty question")
        for name in q.select:
            if name not in pages:
                problems.append(f"{where}: selects unknown document {name!r}")
            elif q.scenario == "S3" and sizes[name] >= S3_MAX_CHARS:
                problems.append(f"{where}: S3 selects {name} of {sizes[name]} characters")
            elif q.scenario == "S4" and sizes[name] < S3_MAX_CHARS:
                problems.append(f"{where}: S4 selects {name} of {sizes[name]} characters")
        if q.scenario in ("S3", "S4") and not q.select:
            problems.append(f"{where}: {q.scenario} without selected documents")
        if q.scenario == "S1" and q.select:
            problems.append(f"{where}: S1 selects documents")
        if not q.answerable:
            if q.doc is not None or q.page is not None or q.facts or q.also:
                problems.append(f"{where}: an unanswerable question has a gold page or facts")
            continue
        if not q.facts or len(q.facts) > 3 or any(not f for f in q.facts):
            problems.append(f"{where}: needs 1-3 key facts, each with an alternative")
        if q.select and q.doc not in q.select:
            problems.append(f"{where}: the gold document {q.doc} is not selected")
        for doc, page in q.locations():
            texts = pages.get(doc)
            if texts is None:
                problems.append(f"{where}: unknown document {doc!r}")
                continue
            if not 1 <= page <= len(texts):
                problems.append(f"{where}: {doc} has no page {page} (1..{len(texts)})")
                continue
            for fact in q.facts:
                if not fact_present(fact, texts[page - 1]):
                    problems.append(f"{where}: {doc} page {page} lacks the fact {list(fact)}")
    return problems


def document_pages(paths: Mapping[str, Path]) -> dict[str, list[str]]:
    return {d.name: page_texts(paths[d.name]) for d in DOCS}
