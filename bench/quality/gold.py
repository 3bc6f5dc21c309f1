"""The gold set: corpus files, the dev and held-out query files, and a consistency check."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from bench.quality.metrics import Judgment

HERE = Path(__file__).resolve().parent
CORPUS_DIR = HERE / "corpus"
QUERIES_DIR = HERE / "queries"
SPLITS = ("dev", "heldout")
NOT_DOCUMENTS = {"SOURCES.md"}

_MD_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_NUMBERED_HEADING = re.compile(r"^\d+(?:\.\d+)*\.\s+\S")


@dataclass(frozen=True)
class GoldQuery:
    """One query of the gold set with its graded judgments."""

    qid: str
    lang: str
    query: str
    relevant: tuple[Judgment, ...]
    split: str = ""
    cross_lingual: bool = False
    """No judged document is in the query's language."""
    mixed_language: bool = False
    """The judged document is in the query's language but the passage that answers it is not
    (an untranslated English paragraph of a Russian man page)."""


def corpus_files() -> list[Path]:
    """The documents to ingest, by name (SOURCES.md and LICENSES/ are not documents)."""
    return sorted(p for p in CORPUS_DIR.iterdir() if p.is_file() and p.name not in NOT_DOCUMENTS)


def load_queries(split: str) -> list[GoldQuery]:
    """Read queries/<split>.jsonl ("dev" or "heldout")."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    out = []
    path = QUERIES_DIR / f"{split}.jsonl"
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            relevant = tuple(
                Judgment(r["file"], r.get("section"), r.get("page"), int(r["grade"]))
                for r in row["relevant"]
            )
            out.append(
                GoldQuery(
                    row["qid"],
                    row["lang"],
                    row["query"],
                    relevant,
                    split,
                    bool(row.get("cross_lingual", False)),
                    bool(row.get("mixed_language", False)),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}:{n}: bad query line: {exc}") from None
    return out


def file_headings(path: Path) -> set[str]:
    """Heading texts as the file shows them: Markdown '#' lines, numbered lines, PDF outline."""
    if path.suffix == ".pdf":
        import pypdfium2 as pdfium  # only the consistency check needs it

        doc = pdfium.PdfDocument(str(path))
        try:
            return {item.get_title() for item in doc.get_toc()}
        finally:
            doc.close()
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        return {m.group(2).strip() for ln in text.splitlines() if (m := _MD_HEADING.match(ln))}
    return {ln.strip() for ln in text.splitlines() if _NUMBERED_HEADING.match(ln)}


def pdf_pages(path: Path) -> int:
    """Number of pages of a PDF."""
    import pypdfium2 as pdfium

    doc = pdfium.PdfDocument(str(path))
    try:
        return len(doc)
    finally:
        doc.close()


def validate_gold(queries: list[GoldQuery]) -> list[str]:
    """Every judged file exists, every judged heading is in it, every page is inside it."""
    problems: list[str] = []
    headings: dict[str, set[str]] = {}
    pages: dict[str, int] = {}
    for q in queries:
        if not q.relevant:
            problems.append(f"{q.qid}: no judgments")
        if q.lang not in ("ru", "en"):
            problems.append(f"{q.qid}: lang {q.lang!r}")
        for j in q.relevant:
            path = CORPUS_DIR / j.file
            if not path.is_file() or j.file in NOT_DOCUMENTS:
                problems.append(f"{q.qid}: no corpus file {j.file!r}")
                continue
            if j.grade not in (1, 2):
                problems.append(f"{q.qid}: grade {j.grade} for {j.file}")
            if j.section is not None:
                if j.file not in headings:
                    headings[j.file] = file_headings(path)
                if j.section not in headings[j.file]:
                    problems.append(f"{q.qid}: {j.file} has no heading {j.section!r}")
            if j.page is not None:
                if path.suffix != ".pdf":
                    problems.append(f"{q.qid}: page {j.page} judged in non-PDF {j.file}")
                    continue
                if j.file not in pages:
                    pages[j.file] = pdf_pages(path)
                if not 1 <= j.page <= pages[j.file]:
                    problems.append(f"{q.qid}: {j.file} has no page {j.page}")
    return problems
