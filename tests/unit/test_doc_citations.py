"""Code and docs cite docs/architecture.md by section; every cited section exists, and no
file cites the design notes outside the repository (../shared)."""

import re
from pathlib import Path

from services.devtools.envoy import REPO_ROOT as ROOT
from tests.doc_pages import doc_pages

ARCHITECTURE = ROOT / "docs" / "architecture.md"
CITATION = re.compile(r"architecture\.md\s+§(\d+)")
OUTSIDE = re.compile(r"\b(?:DESIGN\.md|STYLE\.md)|\.\./shared/(?!specs)")
"""The design notes beside the repository; the specs (../shared/specs) may be named."""


def _files() -> list[Path]:
    code = [p for d in ("services", "tests", "bench", "tools") for p in (ROOT / d).rglob("*.py")]
    return [p for p in code + doc_pages() if p.resolve() != Path(__file__).resolve()]


def _sections() -> set[int]:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    return {int(n) for n in re.findall(r"^## (\d+)\. ", text, flags=re.MULTILINE)}


def test_every_cited_section_of_the_architecture_page_exists() -> None:
    sections = _sections()
    assert len(sections) >= 18
    cited = {
        (p.relative_to(ROOT).as_posix(), int(n))
        for p in _files()
        for n in CITATION.findall(p.read_text(encoding="utf-8"))
    }
    assert len(cited) > 40
    assert sorted((path, n) for path, n in cited if n not in sections) == []


def test_nothing_cites_the_design_notes_outside_the_repository() -> None:
    found = sorted(
        (p.relative_to(ROOT).as_posix(), m.group(0))
        for p in _files()
        for m in OUTSIDE.finditer(p.read_text(encoding="utf-8"))
    )
    assert found == []
