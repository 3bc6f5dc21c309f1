"""The project's documentation pages, for the tests that check what the docs say."""

from pathlib import Path

from services.devtools.envoy import REPO_ROOT


def doc_pages() -> list[Path]:
    """README.md, docs/*.md and every page under bench/, in a stable order."""
    return [
        REPO_ROOT / "README.md",
        *sorted((REPO_ROOT / "docs").glob("*.md")),
        *sorted((REPO_ROOT / "bench").rglob("*.md")),
    ]
