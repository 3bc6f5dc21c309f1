import dataclasses
import sqlite3

import pytest

from services.docstore.model import Page
from services.docstore.parsing import parse_document
from services.docstore.sqlite_store import SqliteDocumentStore

MD = (
    "# Guide\n\nIntro text here.\n\n## LDAP\n\nSet up LDAP. Use ldaps.\n\f\n"
    "More on page two.\n\n## Backup\n\nDaily at 02:00.\n"
)


def doc(tenant="t1", doc_id="guide", text=MD, **kw):
    return parse_document(
        tenant_id=tenant, doc_id=doc_id, content=text.encode(), fmt="markdown", **kw
    )


def test_store_round_trip_replace_and_tenant_isolation(tmp_path):
    store = SqliteDocumentStore(tmp_path / "s.sqlite")
    assert store.put(doc()) is False
    assert store.put(doc()) is True  # same id replaces, never duplicates
    assert [d.doc_id for d in store.list_documents("t1")] == ["guide"]
    got = store.get_document("t1", "guide")
    assert got == doc()  # every field, new ones included, survives the round trip
    # Another tenant sees nothing of it, by any read.
    assert store.get_document("t2", "guide") is None
    assert store.list_documents("t2") == []
    assert store.chunk_by_id("t2", "guide", "guide:c00000") is None
    assert store.chunk_range("t2", "guide", 0, 100) == []
    assert store.pages_text("t2", "guide", 1, 2) == []
    assert store.document_generation("t2", "guide") is None
    assert store.generations("t2") == {}
    assert store.delete("t2", "guide") is False
    assert store.delete("t1", "guide") is True
    assert store.get_document("t1", "guide") is None
    assert store.pages_text("t1", "guide", 1, 2) == []


def test_generation_metadata_and_pages_are_persisted(tmp_path):
    path = tmp_path / "s.sqlite"
    d = doc(metadata={"file_name": "guide.md", "topic": "ldap"}, tags=("admin",))
    SqliteDocumentStore(path).put(d)
    store = SqliteDocumentStore(path)  # a fresh connection reads what the first wrote
    assert store.document_generation("t1", "guide") == d.generation != ""
    assert store.generations("t1") == {"guide": d.generation}
    listed = store.list_documents("t1")[0]
    assert (listed.generation, dict(listed.metadata), listed.tags) == (
        d.generation,
        {"format": "markdown", "file_name": "guide.md", "topic": "ldap"},
        ("admin",),
    )
    assert store.pages_text("t1", "guide", 1, 5) == [
        Page(1, "# Guide\n\nIntro text here.\n\n## LDAP\n\nSet up LDAP. Use ldaps.\n"),
        Page(2, "\nMore on page two.\n\n## Backup\n\nDaily at 02:00.\n"),
    ]
    assert [p.number for p in store.pages_text("t1", "guide", 2, 2)] == [2]
    chunk = store.chunk_by_id("t1", "guide", d.chunks[0].chunk_id)
    assert chunk == d.chunks[0] and chunk.doc_id == "guide"
    meta_only = store.get_document("t1", "guide", with_chunks=False)
    assert meta_only is not None and meta_only.sections == d.sections and not meta_only.chunks
    assert [t for t, _, _, _ in store.all_chunks()] == ["t1"] * len(d.chunks)


@pytest.mark.parametrize("broken_part", ["chunks", "page_texts"])
def test_a_failed_write_leaves_the_previous_version(tmp_path, broken_part):
    store = SqliteDocumentStore(tmp_path / "s.sqlite")
    old = doc()
    store.put(old)
    new = doc(text="# New\n\nnew text")
    if broken_part == "chunks":
        # A chunk id that collides inside the document makes the insert fail mid-way.
        bad = dataclasses.replace(new, chunks=(new.chunks[0], new.chunks[0]))
        error: type[Exception] = sqlite3.IntegrityError
    else:
        # The pages go in last: the document row, sections and chunks are already written.
        bad = dataclasses.replace(new, page_texts=("ok", object()))  # type: ignore[arg-type]
        error = sqlite3.ProgrammingError
    with pytest.raises(error):
        store.put(bad)
    assert store.get_document("t1", "guide") == old
    assert store.document_generation("t1", "guide") == old.generation


def test_an_old_store_file_is_migrated(tmp_path):
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE documents (tenant_id TEXT NOT NULL, doc_id TEXT NOT NULL,"
        " title TEXT NOT NULL, source TEXT NOT NULL, product TEXT NOT NULL,"
        " version TEXT NOT NULL, tags TEXT NOT NULL, pages INTEGER NOT NULL,"
        " chars INTEGER NOT NULL, PRIMARY KEY (tenant_id, doc_id));"
        "INSERT INTO documents VALUES ('t1','old','Old','user','','','[]',1,10);"
    )
    conn.commit()
    conn.close()
    store = SqliteDocumentStore(path)
    assert store.generations("t1") == {"old": ""}
    assert store.list_documents("t1")[0].metadata == {}
    store.put(doc())
    assert store.document_generation("t1", "guide") == doc().generation
