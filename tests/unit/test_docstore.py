import sqlite3

import pytest

from services.docstore.parsing import (
    ChunkingConfig,
    UnsupportedFormatError,
    guess_format,
    parse_document,
)
from services.docstore.sqlite_store import SqliteDocumentStore

MD = "# Guide\n\nIntro text here.\n\n## LDAP\n\nSet up LDAP. Use ldaps.\n\f\nMore on page two.\n\n## Backup\n\nDaily at 02:00.\n"


def doc(tenant="t1", doc_id="guide", text=MD, **kw):
    return parse_document(tenant_id=tenant, doc_id=doc_id, text=text, fmt="markdown", **kw)


def test_markdown_sections_pages_and_ids():
    d = doc()
    assert d.title == "Guide"
    assert [s.title for s in d.sections] == ["Guide", "LDAP", "Backup"]
    ldap = d.sections[1]
    assert (ldap.page_start, ldap.page_end) == (1, 2)
    assert d.pages == 2
    assert [c.chunk_id for c in d.chunks] == [f"guide:c{i:05d}" for i in range(len(d.chunks))]
    assert all(c.section_id.startswith("guide:s") for c in d.chunks)


def test_ids_are_deterministic():
    assert doc() == doc()


def test_long_paragraphs_are_split_at_the_chunk_size():
    text = "# T\n\n" + " ".join(f"w{i}" for i in range(25))
    d = doc(text=text, config=ChunkingConfig(chunk_words=10))
    assert [len(c.text.split()) for c in d.chunks] == [10, 10, 5]
    assert [c.ord for c in d.chunks] == [0, 1, 2]


def test_unsupported_format_is_refused():
    with pytest.raises(UnsupportedFormatError):
        parse_document(tenant_id="t", doc_id="d", text="x", fmt="pdf")
    assert guess_format("a.PDF", "") == "pdf"
    assert guess_format("a.md", "") == "markdown"
    assert guess_format("", "text/plain") == "text"
    assert guess_format("a.bin", "") == "unknown"


def test_store_round_trip_replace_and_tenant_isolation(tmp_path):
    store = SqliteDocumentStore(tmp_path / "s.sqlite")
    assert store.put(doc()) is False
    assert store.put(doc()) is True  # same id replaces, never duplicates
    assert [d.doc_id for d in store.list_documents("t1")] == ["guide"]
    got = store.get_document("t1", "guide")
    assert got is not None and got.chunks == doc().chunks
    # Another tenant sees nothing of it, by any read.
    assert store.get_document("t2", "guide") is None
    assert store.list_documents("t2") == []
    assert store.chunk_by_id("t2", "guide", "guide:c00000") is None
    assert store.chunk_range("t2", "guide", 0, 100) == []
    assert store.delete("t2", "guide") is False
    assert store.delete("t1", "guide") is True
    assert store.get_document("t1", "guide") is None


def test_a_failed_write_leaves_the_previous_version(tmp_path, monkeypatch):
    store = SqliteDocumentStore(tmp_path / "s.sqlite")
    store.put(doc())
    broken = doc(text="# New\n\nnew text")
    # A chunk id that collides inside the document makes the insert fail mid-way.
    dup = broken.chunks[0]
    broken = type(broken)(**{**broken.__dict__, "chunks": (dup, dup)})
    with pytest.raises(sqlite3.IntegrityError):
        store.put(broken)
    kept = store.get_document("t1", "guide")
    assert kept is not None and kept.title == "Guide" and kept.chunks == doc().chunks
