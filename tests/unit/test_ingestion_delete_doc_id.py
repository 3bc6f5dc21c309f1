"""DeleteDocument holds its doc_id to IngestDocument's rule (services/retrieval/ingestion.py
`check_doc_id`): an id no document could be stored under is INVALID_ARGUMENT naming
`doc_id`, before anything reaches the journal. Journal entries, fsynced, are written in
worker threads, never on the event loop that searches share."""

from __future__ import annotations

import threading

import pytest

from services.common import errors
from services.common.document_limits import MAX_DOC_ID_CHARS
from services.retrieval.ingestion import IngestInput, Ingestor
from services.retrieval.journal import IngestJournal, JournalEntry
from tests.unit.test_ingestion import V1, V2, guide
from tests.unit.test_pdf_text_limit import embedder  # noqa: F401 (fixture)
from tests.unit.test_search import make_stack

AT_THE_LIMIT = ["d" * MAX_DOC_ID_CHARS, "д" * MAX_DOC_ID_CHARS, "0" + "._-" * 42 + "x"]
PAST_IT = [
    "d" * (MAX_DOC_ID_CHARS + 1),
    "д" * (MAX_DOC_ID_CHARS + 1),
    "d" * (16 << 20),
    "../../etc\n\x00",
    "notes\n",
    " notes",
    "_notes",
    "no spaces",
]


@pytest.mark.parametrize("doc_id", AT_THE_LIMIT)
async def test_a_doc_id_ingest_takes_is_deleted(tmp_path, embedder, doc_id):  # noqa: F811
    assert len(doc_id) <= MAX_DOC_ID_CHARS
    s = make_stack(tmp_path, embedder)
    await s.ingestor.ingest(IngestInput("a", V1, doc_id=doc_id, file_name="guide.md"))
    assert await s.ingestor.delete("a", doc_id) is True
    assert await s.ingestor.delete("a", doc_id) is False  # gone: a valid id, no document
    assert s.store.document_generation("a", doc_id) is None
    assert s.index.count("a") == 0 and s.journal.pending() == []
    s.index.close()


@pytest.mark.parametrize("doc_id", PAST_IT, ids=lambda d: f"{d[:12]!r}x{len(d)}")
async def test_a_doc_id_ingest_refuses_is_refused_by_delete_before_the_journal(
    tmp_path,
    embedder,  # noqa: F811
    doc_id,
):
    s = make_stack(tmp_path, embedder)
    with pytest.raises(errors.InvalidArgumentError) as ingest:
        await s.ingestor.ingest(IngestInput("a", V1, doc_id=doc_id, file_name="guide.md"))
    journal = tmp_path / "journal.jsonl"
    before = journal.stat().st_size if journal.exists() else 0
    with pytest.raises(errors.InvalidArgumentError) as delete:
        await s.ingestor.delete("a", doc_id)
    assert delete.value.metadata["field"] == ingest.value.metadata["field"] == "doc_id"
    assert delete.value.reason == ingest.value.reason
    assert (journal.stat().st_size if journal.exists() else 0) == before
    s.index.close()


class ThreadJournal(IngestJournal):
    """The journal, recording the thread of every entry and done marker it writes."""

    def __init__(self, path) -> None:
        super().__init__(path)
        self.threads: list[int] = []

    def begin(
        self, tenant_id: str, doc_id: str, generation: str, replaces: str | None = None
    ) -> JournalEntry:
        self.threads.append(threading.get_ident())
        return super().begin(tenant_id, doc_id, generation, replaces)

    def finish(self, entry: JournalEntry) -> None:
        self.threads.append(threading.get_ident())
        super().finish(entry)


async def test_journal_entries_are_written_off_the_event_loop(tmp_path, embedder):  # noqa: F811
    s = make_stack(tmp_path, embedder)
    journal = ThreadJournal(tmp_path / "threads.jsonl")
    ingestor = Ingestor(store=s.store, index=s.index, embedder=embedder, sections=s.sections,
                        journal=journal, max_document_bytes=1 << 20)  # fmt: skip
    await ingestor.ingest(guide(V1))
    await ingestor.ingest(guide(V2))  # replaces V1
    assert await ingestor.delete("a", "guide") is True
    # begin + finish for each of the three writes (no race: no extra entry)
    assert len(journal.threads) == 6
    assert threading.get_ident() not in journal.threads
    assert journal.pending() == []
    s.index.close()
