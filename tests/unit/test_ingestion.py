"""Ingestion edge cases from a review: empty input, crash and cancel safety, lost indexes,
races with searches and with other ingests (real SQLite store, Edge shard, fast embedder)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace

import pytest
from qdrant_client import QdrantClient

from services.common import errors
from services.common.search_contract import KB_TENANT
from services.docstore import kb_csv as kb_csv_module
from services.docstore.chunking import ChunkingConfig
from services.docstore.errors import StoreUnavailableError
from services.docstore.kb_csv import read_knowledge_base_csv
from services.docstore.model import Document
from services.docstore.parsing import parse_document
from services.docstore.sqlite_store import SqliteDocumentStore
from services.docstore.summaries import mix_generation
from services.retrieval import ingestion
from services.retrieval.embeddings import PASSAGE_BATCH_DEFAULTS, EmbeddingSettings
from services.retrieval.factories import build_embedder
from services.retrieval.index.base import IndexUnavailableError
from services.retrieval.index.server import QdrantServerIndex
from services.retrieval.ingestion import (
    EMBED_SLICE,
    IngestInput,
    Ingestor,
    chunk_texts,
    document_points,
)
from services.retrieval.journal import IngestJournal
from services.retrieval.search import SearchQuery
from services.retrieval.sections import SectionCatalog
from tests.unit.test_search import FlakyIndex, make_stack

V1 = b"# Guide\n\n## Backup\n\nBackups run daily at two and are kept for thirty days.\n"
V2 = b"# Guide\n\n## Backup\n\nBackups run hourly and are kept for ninety days.\n"
V3 = b"# Guide\n\n## Backup\n\nSnapshots replace backups; they are kept for ninety weeks.\n"


@pytest.fixture(scope="module")
def embedder():
    return build_embedder(EmbeddingSettings(profile="fast"))


def guide(content: bytes) -> IngestInput:
    return IngestInput("a", content, file_name="guide.md")


def sparse(query: str) -> SearchQuery:
    return SearchQuery(query=query, tenant_id="a", ranking="sparse")


async def test_a_knowledge_base_csv_without_rows_is_invalid_content(tmp_path, embedder):
    s = make_stack(tmp_path, embedder)
    header = b"id,title,content,topic,jurisdiction,updated_at\n"
    with pytest.raises(errors.InvalidArgumentError) as info:
        await s.ingestor.ingest(IngestInput(KB_TENANT, header, file_name="train_data.csv"))
    assert info.value.metadata["field"] == "content"
    assert s.ingestor.ingesting == 0
    s.index.close()


@pytest.mark.parametrize("tenant", ["acme corp", "acme/corp", "t" * 129, " "])
async def test_delete_and_list_refuse_a_tenant_id_no_document_could_be_stored_under(
    tmp_path, embedder, tenant
):
    s = make_stack(tmp_path, embedder)
    for call in (lambda: s.ingestor.delete(tenant, "d"), lambda: s.ingestor.list(tenant)):
        with pytest.raises(errors.InvalidArgumentError) as info:
            await call()
        assert info.value.metadata["field"] == "tenant_id"
    assert await s.ingestor.list("t" * 128) == ([], "")  # at the limit: a tenant, empty
    assert await s.ingestor.delete("t" * 128, "d") is False
    s.index.close()


KB_HEADER = "id,title,content,topic,jurisdiction,updated_at\n"


def kb_csv(*ids: str) -> bytes:
    rows = "".join(f"{i},Article {i},The {i} article is about tax rule {i}.,tax,RU,2026-01-10\n"
                   for i in ids)  # fmt: skip
    return (KB_HEADER + rows).encode()


def kb_ids(s) -> list[str]:
    return [d.doc_id for d in s.store.list_documents(KB_TENANT)]


async def test_articles_written_before_pruning_are_never_taken_for_train_data_csvs(
    tmp_path, embedder
):
    # Before pruning existed every article of every CSV was written with file_name
    # "train_data.csv" and no kb_file: re-ingesting train_data.csv must not delete faq.csv's.
    s = make_stack(tmp_path, embedder)
    for content in (kb_csv("t1", "t2"), kb_csv("f1", "f2")):
        for doc in read_knowledge_base_csv(content, tenant_id=KB_TENANT).strict():
            legacy = {k: v for k, v in doc.metadata.items() if k != "kb_file"}
            # (its generation then differed too: the metadata is part of it)
            old = mix_generation(doc.generation, "before-kb_file")
            await s.ingestor._ingest_one(replace(doc, metadata=legacy, generation=old))
    assert kb_ids(s) == ["kb-f1", "kb-f2", "kb-t1", "kb-t2"]
    out = await s.ingestor.ingest(IngestInput(KB_TENANT, kb_csv("t1"), file_name="train_data.csv"))
    assert out.removed_doc_ids == ()  # the legacy kb-t2 stays too: nothing says whose it is
    assert kb_ids(s) == ["kb-f1", "kb-f2", "kb-t1", "kb-t2"]
    # Rewritten with the mark, train_data.csv's articles are pruned from then on.
    await s.ingestor.ingest(IngestInput(KB_TENANT, kb_csv("t1", "t2"), file_name="train_data.csv"))
    out = await s.ingestor.ingest(IngestInput(KB_TENANT, kb_csv("t1"), file_name="train_data.csv"))
    assert out.removed_doc_ids == ("kb-t2",) and kb_ids(s) == ["kb-f1", "kb-f2", "kb-t1"]
    s.index.close()


def kb_search(s, text: str):
    query = SearchQuery(query=text, tenant_id="a", ranking="sparse")
    return s.engine.search(replace(query, filters=replace(query.filters, source="knowledge_base")))


async def test_a_knowledge_base_csv_ingested_again_removes_the_articles_it_dropped(
    tmp_path, embedder
):
    s = make_stack(tmp_path, embedder)
    first = await s.ingestor.ingest(IngestInput(KB_TENANT, kb_csv("a1", "a2", "a3"),
                                                file_name="kb/train_data.csv"))  # fmt: skip
    assert first.removed_doc_ids == () and kb_ids(s) == ["kb-a1", "kb-a2", "kb-a3"]
    other = await s.ingestor.ingest(IngestInput(KB_TENANT, kb_csv("b1"), file_name="extra.csv"))
    assert other.removed_doc_ids == ()  # another file's articles are not this one's to drop
    a2_generation = s.store.document_generation(KB_TENANT, "kb-a2")
    again = await s.ingestor.ingest(IngestInput(KB_TENANT, kb_csv("a1", "a3"),
                                                file_name="train_data.csv"))  # fmt: skip
    assert again.removed_doc_ids == ("kb-a2",) and not again.unchanged
    assert kb_ids(s) == ["kb-a1", "kb-a3", "kb-b1"]
    assert s.index.count_document(KB_TENANT, "kb-a2", a2_generation) == 0  # out of the index
    assert all(h.doc_id != "kb-a2" for h in (await kb_search(s, "article a2 tax rule")).hits)
    # The same file once more: nothing to do, nothing removed.
    same = await s.ingestor.ingest(IngestInput(KB_TENANT, kb_csv("a1", "a3"),
                                               file_name="train_data.csv"))  # fmt: skip
    assert same.unchanged and same.removed_doc_ids == ()
    # An article that moved to another file belongs to that file now.
    moved = await s.ingestor.ingest(IngestInput(KB_TENANT, kb_csv("a3"), file_name="extra.csv"))
    assert moved.removed_doc_ids == ("kb-b1",) and kb_ids(s) == ["kb-a1", "kb-a3"]
    last = await s.ingestor.ingest(IngestInput(KB_TENANT, kb_csv("a1"), file_name="train_data.csv"))
    assert last.removed_doc_ids == () and kb_ids(s) == ["kb-a1", "kb-a3"]
    s.index.close()


async def test_articles_are_removed_only_after_every_new_one_is_written(tmp_path, embedder):
    s = make_stack(tmp_path, embedder)
    await s.ingestor.ingest(IngestInput(KB_TENANT, kb_csv("a1", "a2"), file_name="t.csv"))
    real_put = s.store.replace

    def failing_put(doc, points=()):
        if doc.doc_id == "kb-a4":
            raise StoreUnavailableError("disk gone")
        return real_put(doc, points)

    s.store.replace = failing_put  # type: ignore[method-assign]
    with pytest.raises(errors.UnavailableError):
        await s.ingestor.ingest(IngestInput(KB_TENANT, kb_csv("a3", "a4"), file_name="t.csv"))
    assert kb_ids(s) == ["kb-a1", "kb-a2", "kb-a3"]  # nothing of the old file lost
    s.store.replace = real_put  # type: ignore[method-assign]
    done = await s.ingestor.ingest(IngestInput(KB_TENANT, kb_csv("a3", "a4"), file_name="t.csv"))
    assert sorted(done.removed_doc_ids) == ["kb-a1", "kb-a2"]
    assert kb_ids(s) == ["kb-a3", "kb-a4"]
    s.index.close()


class GatedEmbedder:
    """The real embedder, whose passage calls wait for `go` once `hold` is set."""

    def __init__(self, inner) -> None:
        self.inner, self.name, self.dim = inner, inner.name, inner.dim
        self.hold, self.inside, self.go = False, threading.Event(), threading.Event()

    def embed_queries(self, texts):
        return self.inner.embed_queries(texts)

    def embed_passages(self, texts):
        if self.hold:
            self.inside.set()
            assert self.go.wait(30)
        return self.inner.embed_passages(texts)


async def test_a_commit_deletes_the_generation_it_replaced_not_the_one_it_first_read(
    tmp_path, embedder
):
    # Two processes on one store and one index (here: two Ingestors, each with its own lock
    # and journal). A reads the live generation (V1's), B commits V2 meanwhile, A commits V3:
    # V2's points must go, or they stay in the index, invisible, for good.
    s = make_stack(tmp_path, embedder)
    await s.ingestor.ingest(guide(V1))
    gated = GatedEmbedder(embedder)
    a = Ingestor(store=s.store, index=s.index, embedder=gated, sections=s.sections,
                 journal=IngestJournal(tmp_path / "a.jsonl"), max_document_bytes=1 << 20)  # fmt: skip
    gated.hold = True
    task = asyncio.create_task(a.ingest(guide(V3)))
    assert await asyncio.to_thread(gated.inside.wait, 30)  # A read V1 as live and is embedding
    v2 = await s.ingestor.ingest(guide(V2))  # B: commits V2, deletes V1's points
    gated.go.set()
    v3 = await task
    assert v3.replaced and s.store.document_generation("a", "guide") == v3.generation
    assert s.index.count_document("a", "guide", v2.generation) == 0
    assert s.index.count_document("a", "guide", v3.generation) > 0
    # Had A stopped between its commit and that delete, its journal names V2 for recovery.
    replaced = {e.replaces for e in IngestJournal(tmp_path / "a.jsonl")._read()[0]}
    assert v2.generation in replaced
    s.index.close()


def replayed_commits(s) -> None:
    """The store's replace applied twice, as PostgresDocumentStore._run runs a write again
    when the connection breaks after the server applied its COMMIT (the acknowledgement lost):
    the second run reports the generation the first wrote as the one replaced."""
    real = s.store.replace

    def replace_twice(doc, points=()):
        real(doc, points)
        return real(doc, points)

    s.store.replace = replace_twice  # type: ignore[method-assign]


async def test_a_replayed_commit_still_deletes_the_generation_it_replaced(tmp_path, embedder):
    s = make_stack(tmp_path, embedder)
    v1 = await s.ingestor.ingest(guide(V1))
    replayed_commits(s)
    v2 = await s.ingestor.ingest(guide(V2))
    assert v2.replaced and s.store.document_generation("a", "guide") == v2.generation
    assert s.index.count_document("a", "guide", v1.generation) == 0
    assert s.index.document_generations("a") == {"guide": {v2.generation}}
    assert s.journal.pending() == []
    # A document new at the replayed commit replaced nothing, and lost nothing of its own.
    new = await s.ingestor.ingest(IngestInput("a", V3, file_name="new.md"))
    assert not new.replaced
    assert s.index.count_document("a", "new", new.generation) > 0
    s.index.close()


async def test_a_replayed_commit_with_the_index_down_leaves_the_cleanup_to_recovery(
    tmp_path, embedder
):
    s = make_stack(tmp_path, embedder)
    v1 = await s.ingestor.ingest(guide(V1))
    replayed_commits(s)
    real_delete = s.index.delete_document

    def down(*args, **kwargs):
        raise IndexUnavailableError("gone")

    s.index.delete_document = down  # type: ignore[method-assign]
    v2 = await s.ingestor.ingest(guide(V2))
    s.index.delete_document = real_delete  # type: ignore[method-assign]
    assert s.index.count_document("a", "guide", v1.generation) > 0
    assert s.ingestor.recover() == 1
    assert s.index.document_generations("a") == {"guide": {v2.generation}}
    s.index.close()


# -- the journal -----------------------------------------------------------------------------


def test_an_entry_begun_after_a_torn_last_line_is_kept(tmp_path):
    path = tmp_path / "journal.jsonl"
    j = IngestJournal(path)
    j.finish(j.begin("a", "d1", "g1"))
    with open(path, "a", encoding="utf-8") as f:  # a crash in the middle of an append
        f.write('{"seq": 2, "tenant_id": "a", "doc')
    j = IngestJournal(path)  # restart, no recovery (the index was down)
    entry = j.begin("a", "d2", "g2")
    assert j.pending() == [entry]
    assert IngestJournal(path).pending() == [entry]


async def test_recovery_compacts_the_journal_even_when_the_index_is_down(tmp_path, embedder):
    s = make_stack(tmp_path, embedder)
    for n in range(3):
        s.journal.finish(s.journal.begin("a", f"done{n}", "g"))
    open_entry = s.journal.begin("a", "d", "g", "g0")
    flaky = FlakyIndex(s.index)
    flaky.down = True
    restarted = make_stack(tmp_path, embedder, index=flaky)
    with pytest.raises(IndexUnavailableError):
        restarted.ingestor.recover()
    # Finished entries are gone; the one recovery could not handle is still to do.
    assert len((tmp_path / "journal.jsonl").read_text().splitlines()) == 1
    assert restarted.journal.pending() == [open_entry]
    s.index.close()


# -- a cancelled caller ----------------------------------------------------------------------


async def test_a_cancelled_ingest_holds_the_lock_until_its_write_is_done(tmp_path, embedder):
    """grpc.aio cancels the handler on a client's deadline; the worker thread writing the
    store cannot be stopped. The next ingest of the same document must wait for it, or its
    cleanup and that late commit leave a stored generation without index points."""
    s = make_stack(tmp_path, embedder)
    await s.ingestor.ingest(guide(V1))
    real_put = s.store.replace
    in_put, release = threading.Event(), threading.Event()

    def slow_put(doc, points=()):
        if any("hourly" in c.text for c in doc.chunks):
            in_put.set()
            release.wait(10)  # a slow commit (a big document, a busy PostgreSQL)
        return real_put(doc, points)

    s.store.replace = slow_put  # type: ignore[method-assign]
    v2 = asyncio.create_task(s.ingestor.ingest(guide(V2)))
    await asyncio.to_thread(in_put.wait, 10)
    v2.cancel()
    with pytest.raises(asyncio.CancelledError):
        await v2
    assert s.ingestor._lock.locked()  # the write goes on under the lock
    v3 = asyncio.create_task(s.ingestor.ingest(guide(V3)))
    done, _ = await asyncio.wait([v3], timeout=1.0)
    assert not done  # waits for the cancelled ingest's write
    release.set()
    out = await v3
    gen = s.store.document_generation("a", "guide")
    assert gen == out.generation
    assert s.index.document_generations("a") == {"guide": {gen}}
    assert (await s.engine.search(sparse("snapshots ninety weeks"))).hits
    assert s.journal.pending() == []
    s.index.close()


async def test_a_cancelled_delete_finishes_before_the_next_call(tmp_path, embedder):
    s = make_stack(tmp_path, embedder)
    await s.ingestor.ingest(guide(V1))
    real_delete = s.store.delete
    in_delete, release = threading.Event(), threading.Event()

    def slow_delete(tenant_id, doc_id):
        in_delete.set()
        release.wait(10)
        return real_delete(tenant_id, doc_id)

    s.store.delete = slow_delete  # type: ignore[method-assign]
    gone = asyncio.create_task(s.ingestor.delete("a", "guide"))
    await asyncio.to_thread(in_delete.wait, 10)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert s.ingestor._lock.locked()
    again = asyncio.create_task(s.ingestor.ingest(guide(V2)))
    done, _ = await asyncio.wait([again], timeout=1.0)
    assert not done
    release.set()
    out = await again
    # The delete finished first (its index cleanup too); the new version is whole.
    assert s.store.document_generation("a", "guide") == out.generation and not out.unchanged
    assert s.index.document_generations("a") == {"guide": {out.generation}}
    assert s.journal.pending() == []
    s.index.close()


# -- a lost index ----------------------------------------------------------------------------


async def test_reingest_after_the_index_lost_a_document_writes_its_points_again(tmp_path, embedder):
    s = make_stack(tmp_path, embedder)
    first = await s.ingestor.ingest(guide(V1))
    assert (await s.ingestor.ingest(guide(V1))).unchanged
    s.index.delete_document("a", "guide")  # the index deleted or rebuilt, the store kept
    assert (await s.engine.search(sparse("backups thirty days"))).hits == []
    again = await s.ingestor.ingest(guide(V1))
    assert not again.unchanged and again.generation == first.generation
    doc = s.store.get_document("a", "guide")
    assert s.index.count("a") == len(document_points(doc, None))
    assert (await s.engine.search(sparse("backups thirty days"))).hits
    assert (await s.ingestor.ingest(guide(V1))).unchanged
    s.index.close()


# -- races with searches and other ingests ---------------------------------------------------


async def test_a_search_reading_during_a_reingest_does_not_cache_the_old_sections(
    tmp_path, embedder
):
    s = make_stack(tmp_path, embedder)
    await s.ingestor.ingest(guide(V1))
    real = s.store.get_document
    reading, go_on = threading.Event(), threading.Event()

    def slow_get(tenant_id, doc_id, *, with_chunks=True):
        doc = real(tenant_id, doc_id, with_chunks=with_chunks)
        if not with_chunks and not go_on.is_set():
            reading.set()
            go_on.wait(10)  # the old version read, not yet cached
        return doc

    s.store.get_document = slow_get  # type: ignore[method-assign]
    search = asyncio.create_task(s.engine.search(SearchQuery(query="backups", tenant_id="a")))
    await asyncio.to_thread(reading.wait, 10)
    await s.ingestor.ingest(guide(V3))  # commits, then forgets the cached sections
    go_on.set()
    await search
    s.store.get_document = real  # type: ignore[method-assign]
    _, sections = s.sections.document("a", "guide") or ("", {})
    assert all("thirty days" not in x.summary for x in sections.values())
    assert any("ninety weeks" in x.summary for x in sections.values())
    s.index.close()


class ModelSummaries:
    """A summarizer that marks every summary it writes."""

    name = "fake-llm"
    concurrency = 2

    def generation(self, doc: Document) -> str:
        return mix_generation(doc.generation, self.name)

    async def summarize_sections(self, doc: Document, max_chars: int) -> Document:
        sections = tuple(replace(x, summary=f"MODEL: {x.title}") for x in doc.sections)
        return replace(doc, sections=sections)


async def test_an_ingest_whose_summaries_were_skipped_summarises_if_the_store_moved_on(
    tmp_path, embedder
):
    """Y skips the model because the store holds its summarized generation; X then commits
    another version before Y takes the lock. Y must not store the parser's summaries under
    the model's generation (the next ingest of that file would answer unchanged)."""
    s = make_stack(tmp_path, embedder)
    s.ingestor._summarizer = ModelSummaries()
    first = await s.ingestor.ingest(guide(V1))
    real_upsert, real_gen = s.index.upsert, s.store.document_generation
    x_writing, gate, y_checked = threading.Event(), threading.Event(), threading.Event()

    def slow_upsert(points):
        x_writing.set()
        gate.wait(10)
        return real_upsert(points)

    def generation(tenant_id, doc_id):
        found = real_gen(tenant_id, doc_id)
        if x_writing.is_set():  # X writes under the lock: this is Y's check before it
            y_checked.set()
        return found

    s.index.upsert = slow_upsert  # type: ignore[method-assign]
    s.store.document_generation = generation  # type: ignore[method-assign]
    x = asyncio.create_task(s.ingestor.ingest(guide(V2)))
    await asyncio.to_thread(x_writing.wait, 10)
    y = asyncio.create_task(s.ingestor.ingest(guide(V1)))
    await asyncio.to_thread(y_checked.wait, 10)
    gate.set()
    await x
    await y
    s.index.upsert, s.store.document_generation = real_upsert, real_gen  # type: ignore[method-assign]
    doc = s.store.get_document("a", "guide")
    assert doc is not None and doc.generation == first.generation
    assert all(x.summary.startswith("MODEL") for x in doc.sections)
    s.index.close()


async def test_reingest_after_a_lost_index_keeps_the_model_summaries(tmp_path, embedder):
    s = make_stack(tmp_path, embedder)
    s.ingestor._summarizer = ModelSummaries()
    first = await s.ingestor.ingest(guide(V1))
    s.index.delete_document("a", "guide")
    again = await s.ingestor.ingest(guide(V1))
    assert not again.unchanged and again.generation == first.generation
    doc = s.store.get_document("a", "guide")
    assert doc is not None and all(x.summary.startswith("MODEL") for x in doc.sections)
    s.index.close()


# -- several processes on one Qdrant server --------------------------------------------------


def replica(tmp_path, name: str, embedder, index) -> tuple[SqliteDocumentStore, Ingestor]:
    """Another process's ingestor: the shared store and index, a journal of its own."""
    store = SqliteDocumentStore(tmp_path / "docstore.sqlite")
    return store, Ingestor(
        store=store, index=index, embedder=embedder, sections=SectionCatalog(store),
        journal=IngestJournal(tmp_path / f"journal-{name}.jsonl"), max_document_bytes=1 << 20,
    )  # fmt: skip


async def test_replicas_reingesting_one_document_keep_each_others_points(tmp_path, embedder):
    """X commits after Y wrote its points, Y commits after X's cleanup: X's cleanup must not
    delete Y's points (it deleted every generation but its own)."""
    index = QdrantServerIndex(QdrantClient(":memory:"), "chunks", embedder.dim)
    view = make_stack(tmp_path, embedder, index=index)
    await view.ingestor.ingest(guide(V1))
    store_x, x = replica(tmp_path, "x", embedder, index)
    store_y, y = replica(tmp_path, "y", embedder, index)
    y_wrote, x_done = threading.Event(), threading.Event()
    put_x, put_y, real_upsert = store_x.put, store_y.put, index.upsert

    def upsert(points):
        real_upsert(points)
        if any("Snapshots" in p.sparse_text for p in points):
            y_wrote.set()

    def late_put_x(doc, points=()):
        y_wrote.wait(10)
        return put_x(doc, points)

    def late_put_y(doc, points=()):
        x_done.wait(10)
        return put_y(doc, points)

    store_x.put, store_y.put, index.upsert = late_put_x, late_put_y, upsert  # type: ignore[method-assign]

    async def run_x() -> None:
        await x.ingest(guide(V2))
        x_done.set()

    await asyncio.gather(run_x(), y.ingest(guide(V3)))
    gen = view.store.document_generation("a", "guide")
    assert gen in index.document_generations("a")["guide"]
    assert (await view.engine.search(sparse("snapshots ninety weeks"))).hits
    # Recovery at X's restart deletes only what X's entries wrote or replaced.
    assert x.recover() == 0 and gen in index.document_generations("a")["guide"]


async def test_recovery_leaves_another_processs_uncommitted_points(tmp_path, embedder):
    s = make_stack(tmp_path, embedder)
    first = await s.ingestor.ingest(guide(V1))
    # This process crashed writing V2; another one has written V3's points, not committed.
    mine = s.journal.begin("a", "guide", "g-mine", first.generation)
    doc = s.store.get_document("a", "guide")
    assert doc is not None
    s.index.upsert(document_points(replace(doc, generation="g-mine"), None))
    s.index.upsert(document_points(replace(doc, generation="g-other"), None))
    assert s.ingestor.recover() == 1
    assert s.index.document_generations("a") == {"guide": {first.generation, "g-other"}}
    assert mine not in s.journal.pending()
    s.index.close()


def test_a_section_points_keyword_text_holds_each_overlapping_sentence_once():
    sentences = [f"Sentence number {i} tells about widget{i} and gadget{i}." for i in range(60)]
    doc = parse_document(
        tenant_id="a", doc_id="d", fmt="markdown",
        content="# Guide\n\n## Body\n\n" + " ".join(sentences),
        config=ChunkingConfig(chunk_tokens=64, overlap_tokens=16),
    )  # fmt: skip
    body = [c for c in doc.chunks if c.section_id == doc.sections[-1].section_id]
    assert len(body) > 3
    repeated = [s for s in sentences if sum(s in c.text for c in body) > 1]
    assert repeated, "the chunker repeated no sentence: the test has nothing to check"
    (section,) = [
        p for p in document_points(doc, None)
        if p.kind == "section" and p.section_id == doc.sections[-1].section_id
    ]  # fmt: skip
    for s in sentences:
        assert section.sparse_text.count(s) == 1, s


class CallRecorder:
    """The real embedder, recording how many passages each embed_passages call got."""

    def __init__(self, inner) -> None:
        self.inner, self.name, self.dim = inner, inner.name, inner.dim
        self.calls: list[int] = []

    def embed_queries(self, texts):
        return self.inner.embed_queries(texts)

    def embed_passages(self, texts):
        self.calls.append(len(texts))
        return self.inner.embed_passages(texts)


async def test_a_documents_passages_reach_the_embedder_in_slices_it_batches_itself(
    tmp_path, embedder
):
    """Slices of EMBED_SLICE, a multiple of every profile's batch, so no batch runs short
    but the last."""
    assert all(EMBED_SLICE % batch == 0 for batch in PASSAGE_BATCH_DEFAULTS.values())
    recorder = CallRecorder(embedder)
    s = make_stack(tmp_path, recorder)
    body = "\n\n".join(f"## Part {i}\n\nPart {i} of the guide covers topic {i}." for i in range(80))
    await s.ingestor.ingest(IngestInput("a", f"# Guide\n\n{body}\n".encode(), file_name="g.md"))
    passages = len(chunk_texts(s.store.get_document("a", "g", with_chunks=True)))
    full, rest = divmod(passages, EMBED_SLICE)
    assert recorder.calls == [EMBED_SLICE] * full + ([rest] if rest else []) and full >= 2
    s.index.close()


async def test_a_knowledge_base_csv_past_one_documents_chunks_is_limit_exceeded(
    tmp_path, embedder, monkeypatch
):
    monkeypatch.setattr(kb_csv_module, "MAX_CHUNKS", 2)
    s = make_stack(tmp_path, embedder)
    try:
        with pytest.raises(errors.LimitExceededError) as info:
            await s.ingestor.ingest(
                IngestInput(KB_TENANT, kb_csv("t1", "t2", "t3"), file_name="train_data.csv")
            )
        assert info.value.metadata["limit_name"] == "max_chunks"
        assert kb_ids(s) == []  # nothing of the file written
        out = await s.ingestor.ingest(
            IngestInput(KB_TENANT, kb_csv("t1", "t2"), file_name="train_data.csv")
        )
        assert out.chunks == 2 and sorted(kb_ids(s)) == ["kb-t1", "kb-t2"]
    finally:
        s.index.close()


async def test_a_knowledge_base_csvs_articles_let_a_delete_in_between_batches(
    tmp_path, embedder, monkeypatch
):
    monkeypatch.setattr(ingestion, "WRITE_BATCH", 1)
    s = make_stack(tmp_path, embedder)
    order: list[str] = []
    started, go = asyncio.Event(), asyncio.Event()
    write_one = s.ingestor._ingest_one

    async def noted(doc, *args):
        if not order:
            started.set()
            await go.wait()
        order.append(doc.doc_id)
        return await write_one(doc, *args)

    delete_one = s.ingestor._delete

    async def noted_delete(tenant_id, doc_id):
        order.append("delete")  # under the lock, as the article writes are
        return await delete_one(tenant_id, doc_id)

    monkeypatch.setattr(s.ingestor, "_ingest_one", noted)
    monkeypatch.setattr(s.ingestor, "_delete", noted_delete)
    try:
        csv_file = IngestInput(KB_TENANT, kb_csv("t1", "t2", "t3"), file_name="train_data.csv")
        writing = asyncio.create_task(s.ingestor.ingest(csv_file))
        await started.wait()
        deleting = asyncio.create_task(s.ingestor.delete("a", "gone"))
        await asyncio.sleep(0.05)  # the delete waits for the lock the first article holds
        go.set()
        assert await deleting is False
        out = await writing
    finally:
        s.index.close()
    assert order == ["kb-t1", "delete", "kb-t2", "kb-t3"]
    assert out.doc_ids == ("kb-t1", "kb-t2", "kb-t3")


@pytest.mark.parametrize(
    ("name", "value"),
    [("doc_id", "my-article"), ("title", "T"), ("product", "orion"), ("version", "2"),
     ("tags", ("a",)), ("metadata", {"k": "v"})],
)  # fmt: skip
async def test_a_knowledge_base_csv_refuses_one_documents_fields(tmp_path, embedder, name, value):
    """A CSV's rows name its articles' ids and fields: a request field of one document would
    be dropped unsaid, so it is refused naming the field, nothing written."""
    s = make_stack(tmp_path, embedder)
    item = IngestInput(KB_TENANT, kb_csv("z9"), file_name="train_data.csv")
    with pytest.raises(errors.InvalidArgumentError) as info:
        await s.ingestor.ingest(replace(item, **{name: value}))
    assert info.value.metadata["field"] == name and kb_ids(s) == []
    await s.ingestor.ingest(item)
    assert kb_ids(s) == ["kb-z9"]
    s.index.close()


async def test_a_write_under_the_lock_runs_without_its_requests_deadline(tmp_path, embedder):
    """The locked write goes on when its caller leaves: it must not inherit a deadline that
    then passes (the PostgreSQL store cuts its connection waits to the request's deadline)."""
    import time

    from services.common.context import deadline_var, remaining_seconds

    s = make_stack(tmp_path, embedder)
    seen: list[float | None] = []

    async def work() -> None:
        seen.append(remaining_seconds())

    deadline_var.set(time.monotonic() - 1.0)  # the request's deadline, already passed
    try:
        await s.ingestor._locked(work)
    finally:
        deadline_var.set(None)
    assert seen == [None]
    s.index.close()


async def test_a_blank_title_on_a_knowledge_base_csv_is_no_title(tmp_path, embedder):
    s = make_stack(tmp_path, embedder)
    await s.ingestor.ingest(IngestInput(KB_TENANT, kb_csv("z9"), file_name="t.csv", title="  "))
    assert kb_ids(s) == ["kb-z9"]
    s.index.close()
