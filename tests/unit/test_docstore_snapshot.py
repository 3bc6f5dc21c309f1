"""Reads of one document see one version of it, on both stores (SQLite and a real PostgreSQL,
tests/pg_server.py): `get_document` and every document tool read in one snapshot
(`DocumentStore.snapshot`), so a re-ingest committed between two of their queries is not half
seen. The write is made deterministic: the reader's `_query` commits the other version right
after its n-th read."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from services.docstore.model import Document
from services.docstore.parsing import ChunkingConfig, parse_document
from services.docstore.store import DocumentStore
from services.toolsproxy.tools import Caller, DocumentTools, ToolFailure, ToolLimits
from tests.pg_server import Opener

CALLER = Caller("t1", "u1")
TOOL_LIMITS = ToolLimits(max_window_radius=2, max_text_bytes=1 << 20, max_full_text_bytes=1 << 20)


def version(tag: str, paragraphs: int) -> Document:
    """Document "m" with the same section ids and titles in every version; the title, the
    texts, and each section's chunks and pages differ by version (a page a paragraph)."""
    parts = [f"# Manual {tag}\n"]
    for k in range(4):
        parts.append(f"\n## Section {k}\n\n")
        parts.extend(
            f"common words of part {k} paragraph {p} version{tag} " * 6 + f"TAG{tag}S{k}P{p}\n\f"
            for p in range(paragraphs)
        )
    return parse_document(
        tenant_id="t1", doc_id="m", content="".join(parts).encode(), fmt="markdown",
        config=ChunkingConfig(chunk_tokens=48, overlap_tokens=0),
    )  # fmt: skip


OLD, NEW = version("A", 1), version("B", 3)


def test_the_versions_differ_where_a_mix_would_show():
    assert [s.section_id for s in OLD.sections] == [s.section_id for s in NEW.sections]
    assert [s.title for s in OLD.sections] == [s.title for s in NEW.sections]
    for old, new in zip(OLD.sections[1:], NEW.sections[1:], strict=True):
        assert (old.first_chunk_ord, old.page_start) != (new.first_chunk_ord, new.page_start)
    assert OLD.title != NEW.title and len(OLD.chunks) < len(NEW.chunks)


@pytest.fixture(params=["read-only store", "the writer's own store"])
def stores(request, open_store: Opener) -> tuple[DocumentStore, DocumentStore]:
    """(writer, reader) holding OLD: the reader is ToolsProxy's read-only store, or the
    writing store itself (Retrieval's, which reads a document back to keep its summaries)."""
    writer = open_store()
    writer.put(OLD)
    reader = open_store(read_only=True) if request.param == "read-only store" else writer
    return writer, reader


def commit_after(reader: DocumentStore, writer: DocumentStore, reads: int, doc: Document) -> None:
    """Make `writer` commit `doc` right after `reader`'s `reads`-th read from now on."""
    real = reader._query
    seen = [0]

    def query(*args: Any, **kwargs: Any) -> Any:
        rows = real(*args, **kwargs)
        seen[0] += 1
        if seen[0] == reads:
            writer.put(doc)
        return rows

    reader._query = query  # type: ignore[method-assign]


@pytest.mark.parametrize("reads", [1, 2, 3])
def test_get_document_is_one_version_when_a_write_commits_between_its_reads(stores, reads):
    writer, reader = stores
    commit_after(reader, writer, reads, NEW)
    assert reader.get_document("t1", "m") == OLD
    assert writer.document_generation("t1", "m") == NEW.generation  # it did commit meanwhile
    assert reader.get_document("t1", "m") == NEW


def test_get_document_without_chunks_is_one_version(stores):
    writer, reader = stores
    commit_after(reader, writer, 1, NEW)
    without = reader.get_document("t1", "m", with_chunks=False)
    assert without is not None and without.sections == OLD.sections
    assert writer.document_generation("t1", "m") == NEW.generation


TOOL_CALLS = {
    "read_doc_section": {"doc_id": "m", "section_id": OLD.sections[1].section_id},
    "read_doc_pages": {"doc_id": "m", "page_start": 2, "page_end": 3},
    "read_chunk_window": {"doc_id": "m", "anchor_chunk_id": OLD.chunks[1].chunk_id},
    "read_doc_metadata": {"doc_id": "m"},
    "doc_local_search": {"doc_id": "m", "query": "common words part 1", "max_results": 5},
    "load_documents_full": {"document_ids": ["m"]},
}
READS = {"read_doc_metadata": 2, "read_chunk_window": 4}
"""Queries a call makes, when not three (document, sections, then its chunks or pages)."""
WRITE_POINTS = [(name, n) for name in TOOL_CALLS for n in range(1, READS.get(name, 3))]
"""(tool, the read after which the other version commits): after each but the call's last."""


def run(store: DocumentStore, name: str, args: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = DocumentTools(store, TOOL_LIMITS).tools[name].run(CALLER, dict(args))
    return result


@pytest.mark.parametrize(("name", "reads"), WRITE_POINTS)
def test_a_tool_answers_from_one_version_when_a_write_commits_between_its_reads(
    stores, name, reads
):
    writer, reader = stores
    args = TOOL_CALLS[name]
    before = run(reader, name, args)  # the answer from OLD alone
    commit_after(reader, writer, reads, NEW)
    assert run(reader, name, args) == before
    assert writer.document_generation("t1", "m") == NEW.generation
    assert run(reader, name, args) != before  # NEW answers otherwise: a mix would show


def test_a_snapshot_ended_by_an_error_leaves_no_transaction_behind(stores):
    writer, reader = stores
    for _ in range(3):  # whichever pooled connection each one took
        with pytest.raises(RuntimeError), reader.snapshot():
            assert reader.document_generation("t1", "m") == OLD.generation
            raise RuntimeError("the caller failed")
    writer.put(NEW)
    for _ in range(3):
        assert reader.document_generation("t1", "m") == NEW.generation
        assert reader.get_document("t1", "m") == NEW


def test_a_nested_snapshot_is_the_outer_one(stores):
    writer, reader = stores
    with reader.snapshot():
        assert reader.document_generation("t1", "m") == OLD.generation
        writer.put(NEW)
        with reader.snapshot():
            assert reader.get_document("t1", "m") == OLD
        assert reader.get_document("t1", "m") == OLD  # the inner one's end ended nothing
    assert reader.get_document("t1", "m") == NEW


def test_reads_of_other_threads_are_not_in_a_snapshot(open_store):
    # A pooled store (Retrieval's): the read-only SQLite store has one connection, which a
    # snapshot holds; another thread's read waits for it.
    store = open_store()
    store.put(OLD)
    seen: list[str | None] = []
    with store.snapshot():
        assert store.document_generation("t1", "m") == OLD.generation
        store.put(NEW)
        other = threading.Thread(target=lambda: seen.append(store.document_generation("t1", "m")))
        other.start()
        other.join(30)
        assert store.document_generation("t1", "m") == OLD.generation
    assert seen == [NEW.generation]


def test_a_snapshot_before_the_schema_reads_nothing_and_does_not_fail(open_store):
    # ToolsProxy may start before Retrieval made the schema; on PostgreSQL the first read's
    # error would abort the snapshot's transaction under the reads after it.
    reader = open_store(read_only=True)
    with reader.snapshot():
        assert reader.get_document("t1", "m") is None
        assert reader.get_document("t1", "other") is None
        assert reader.list_documents("t1") == []
    with pytest.raises(ToolFailure) as info:
        run(reader, "load_documents_full", {"document_ids": ["m", "other"]})
    assert info.value.code == "NOT_FOUND"
    writer = open_store()
    writer.put(OLD)
    assert reader.get_document("t1", "m") == OLD
