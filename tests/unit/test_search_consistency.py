"""A search whose document is deleted or re-ingested while it runs: every hit it answers is
one stored generation's chunk (its section, pages and text together), and a candidate whose
text is gone leaves its place to the next one, never an error."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator

import pytest

from services.docstore.errors import StoreUnavailableError
from services.docstore.factory import open_document_store
from services.docstore.parsing import parse_document
from services.docstore.store import DocumentStore
from services.retrieval.embeddings import EmbeddingSettings
from services.retrieval.engine import EngineSettings
from services.retrieval.factories import build_embedder
from services.retrieval.ingestion import IngestInput
from services.retrieval.search import MODES
from tests.unit.test_docstore import points_of
from tests.unit.test_search import NOTES, Reverse, Stack, engine_over, make_stack, q

V1 = """# Orion X guide

## LDAP integration

To set up LDAP integration open Settings, then Auth, then LDAP, and enter the server address.
"""
V2 = """# Orion X guide

## Licensing

License keys are entered under Settings, then License; a key is bound to one cluster.

## LDAP integration

To set up LDAP integration open Settings, then Auth, then LDAP, and enter the server address.
"""


@pytest.fixture(scope="module")
def embedder():
    return build_embedder(EmbeddingSettings(profile="fast"))


class WriteBefore:
    """The document store, with `write` run once right before the first read named `before`
    ("points_by_ids": between the index's answer and the store's read of the candidates;
    "chunks_by_ids": between that read and the read of their texts). Counts the reads."""

    def __init__(self, store: DocumentStore, write: Callable[[], None], before: str) -> None:
        self.store = store
        self._write: Callable[[], None] | None = write
        self._before = before
        self.fired = False
        self.reads: list[str] = []

    def _read(self, name: str) -> None:
        self.reads.append(name)
        if name == self._before and self._write is not None:
            write, self._write = self._write, None
            write()
            self.fired = True

    def points_by_ids(self, tenant_id, ids):
        self._read("points_by_ids")
        return self.store.points_by_ids(tenant_id, ids)

    def chunks_by_ids(self, tenant_id, keys):
        self._read("chunks_by_ids")
        return self.store.chunks_by_ids(tenant_id, keys)

    def replacements(self, tenant_id):
        self.reads.append("replacements")
        return self.store.replacements(tenant_id)


def on_loop(coro_fn: Callable[[], object]) -> Callable[[], None]:
    """`coro_fn()` run on the test's event loop from the search's worker thread, awaited."""
    loop = asyncio.get_running_loop()
    return lambda: asyncio.run_coroutine_threadsafe(coro_fn(), loop).result(60)  # type: ignore[arg-type]


def runbook(seed: int, paragraphs: int) -> bytes:
    rnd = random.Random(seed)
    words = "backup restore server ldap network storage account password license error".split()
    text = "\n\n".join(
        " ".join(rnd.choice(words) for _ in range(80)) + "." for _ in range(paragraphs)
    )
    return text.encode()


def assert_of_the_stored_generation(s: Stack, hits) -> None:
    for h in hits:
        stored = s.store.chunk_by_id("a", h.doc_id, h.chunk_id)
        assert stored is not None, h.chunk_id
        assert (h.section_id, h.page_start, h.page_end) == (
            stored.section_id, stored.page_start, stored.page_end,
        ), h.chunk_id  # fmt: skip
        assert h.text == stored.text, h.chunk_id


@pytest.mark.parametrize("mode", MODES)
async def test_a_document_deleted_between_the_candidates_and_their_texts_leaves_the_rest(
    tmp_path, embedder, mode
):
    s = make_stack(tmp_path, embedder)
    await s.ingestor.ingest(IngestInput("a", runbook(1, 120), file_name="old-runbook.txt"))
    await s.ingestor.ingest(IngestInput("a", runbook(2, 120), file_name="runbook.txt"))
    ask = q(query="backup restore server", mode=mode)
    before = await s.engine.search(ask)
    assert "old-runbook" in {h.doc_id for h in before.hits}
    racing = WriteBefore(
        s.store, on_loop(lambda: s.ingestor.delete("a", "old-runbook")), "chunks_by_ids"
    )
    engine = engine_over(s, racing, settings=EngineSettings(cross_language=False))
    try:
        r = await engine.search(ask)
    finally:
        s.index.close()
    assert racing.fired and s.store.document_generation("a", "old-runbook") is None
    assert {h.doc_id for h in r.hits + r.chunks} == {"runbook"}
    # A delete replaces nothing: the answer without it is the right one, not searched again.
    assert racing.reads.count("replacements") == 2
    assert all(h.text for h in r.hits + r.chunks)
    if mode == "chunk_priority":
        # It looks twice as deep as it keeps: the head is filled again from below.
        assert len(r.hits) == len(before.hits)


@pytest.mark.parametrize("write_before", ["points_by_ids", "chunks_by_ids"])
@pytest.mark.parametrize("rerank", [False, True])
async def test_a_reingest_while_a_search_runs_answers_the_new_generation_whole(
    tmp_path, embedder, rerank, write_before
):
    # V2 moves chunk 0 into a new first section: the same chunk id, another text and section.
    s = make_stack(tmp_path, embedder, reranker=Reverse() if rerank else None)
    await s.ingestor.ingest(IngestInput("a", V1.encode(), file_name="guide.md"))
    await s.ingestor.ingest(IngestInput("a", NOTES.encode(), file_name="notes.md"))
    ask = q(query="LDAP integration setup", enable_rerank=rerank)
    before = await s.engine.search(ask)
    assert ("guide", "guide:c00000") in {(h.doc_id, h.chunk_id) for h in before.hits}
    racing = WriteBefore(
        s.store,
        on_loop(lambda: s.ingestor.ingest(IngestInput("a", V2.encode(), file_name="guide.md"))),
        write_before,
    )
    engine = engine_over(
        s, racing, settings=EngineSettings(cross_language=False), reranker=s.engine._reranker
    )
    try:
        r = await engine.search(ask)
    finally:
        s.index.close()
    assert racing.fired, racing.reads
    assert s.store.chunk_by_id("a", "guide", "guide:c00000").text.startswith("License keys")
    # The replaced generation's candidates are gone from the store and the new one's were
    # not ranked: searched once more, the guide answers in its new generation, whole.
    assert "guide" in {h.doc_id for h in r.hits} and "guide" in {x.doc_id for x in r.sections}
    assert_of_the_stored_generation(s, r.hits)
    assert racing.reads.count("replacements") == 3  # before, after the stale answer, before again


# --- the document store: texts by generation -------------------------------------------------

GUIDE = "# Guide\n\n## LDAP\n\nSet up LDAP. Use ldaps.\n\n## Backup\n\nDaily at 02:00.\n"


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path) -> Iterator[DocumentStore]:
    where = (
        str(tmp_path / "s.sqlite")
        if request.param == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    opened = open_document_store(where)
    yield opened
    opened.close()


def guide(text: str):
    return parse_document(tenant_id="t1", doc_id="guide", content=text.encode(), fmt="markdown")


def test_chunks_read_by_generation_are_of_that_generation_only(store):
    first = guide(GUIDE)
    store.put(first, points_of(first))
    keys = [("guide", c.chunk_id) for c in first.chunks]
    g1 = [(d, c, first.generation) for d, c in keys]
    assert store.chunks_by_ids("t1", g1) == dict(zip(g1, first.chunks, strict=True))
    second = guide(GUIDE.replace("Daily", "Nightly") + "\n## Restore\n\nAsk an operator.\n")
    assert second.generation != first.generation
    assert store.put(second, points_of(second))
    # The first generation's keys find nothing; the second's, its chunks; a key naming no
    # generation, whichever is stored. Each chunk comes back under the key it was asked by.
    assert store.chunks_by_ids("t1", g1) == {}
    g2 = [("guide", c.chunk_id, second.generation) for c in second.chunks]
    assert store.chunks_by_ids("t1", g2) == dict(zip(g2, second.chunks, strict=True))
    asked = [keys[0], g1[0], g2[0], g2[0], ("guide", "guide:c99999", second.generation)]
    assert store.chunks_by_ids("t1", asked) == {keys[0]: second.chunks[0], g2[0]: second.chunks[0]}
    assert store.chunks_by_ids("t2", g2) == {}  # another tenant: nothing
    assert store.chunks_by_ids("t1", []) == {}
    store.delete("t1", "guide")
    assert store.chunks_by_ids("t1", g2 + keys) == {}


def test_more_than_one_batch_of_keys_by_generation(store):
    text = "# Guide\n\n" + "".join(f"## Part {i}\n\nText of part {i}.\n\n" for i in range(600))
    d = guide(text)
    store.put(d, points_of(d))
    keys = [("guide", c.chunk_id, d.generation) for c in d.chunks]
    assert len(keys) > 500
    assert store.chunks_by_ids("t1", keys) == dict(zip(keys, d.chunks, strict=True))


def test_replacements_count_a_tenants_replaced_documents_only(store):
    first = guide(GUIDE)
    assert store.replacements("t1") == 0  # none yet, and no row for the tenant
    store.put(first, points_of(first))
    assert store.replacements("t1") == 0  # a new document replaces nothing
    second = guide(GUIDE.replace("Daily", "Nightly"))
    assert store.replace(second, points_of(second)) == first.generation
    assert store.replacements("t1") == 1
    store.put(first, points_of(first))
    assert store.replacements("t1") == 2  # back to the first text: replaced again
    other = parse_document(tenant_id="t2", doc_id="guide", content=GUIDE.encode(), fmt="markdown")
    store.put(other, points_of(other))
    store.put(other, points_of(other))
    assert (store.replacements("t1"), store.replacements("t2")) == (2, 1)
    store.delete("t1", "guide")
    assert store.replacements("t1") == 2  # a delete: its candidates are rightly gone


# --- an outage answered empty (RETR_EMPTY_ON_BACKEND_ERROR) is never searched again ---------


class StoreFails:
    """The document store, failing every text read; `replaced` replaces counted after the
    first read of the count (a re-ingest committing while the search runs). Counts the reads
    of the count."""

    def __init__(self, store: DocumentStore, *, replaced: int = 0, down_after: bool = False):
        self.store, self.replaced, self.down_after = store, replaced, down_after
        self.counts = 0
        self.down = False

    def points_by_ids(self, tenant_id, ids):
        return self.store.points_by_ids(tenant_id, ids)

    def chunks_by_ids(self, tenant_id, keys):
        self.down = self.down_after
        raise StoreUnavailableError("document store: disk I/O error")

    def replacements(self, tenant_id):
        if self.down:
            raise StoreUnavailableError("document store: disk I/O error")
        self.counts += 1
        return self.store.replacements(tenant_id) + (self.replaced if self.counts > 1 else 0)


@pytest.mark.parametrize(("replaced", "down_after"), [(0, True), (1, False)])
async def test_an_outage_answered_empty_is_answered_once(tmp_path, embedder, replaced, down_after):
    # A search that dropped a candidate (a point the index holds and the store no longer
    # lists) meets a store outage: the answer is the empty one, the store is not read again
    # for the count (it is what is down), and the search is not run again (nothing stale).
    s = make_stack(tmp_path, embedder)
    await s.ingestor.ingest(IngestInput("a", V1.encode(), file_name="guide.md"))
    await s.ingestor.ingest(IngestInput("a", NOTES.encode(), file_name="notes.md"))
    s.store.delete("a", "notes")  # its points stay in the index: dropped by the search
    store = StoreFails(s.store, replaced=replaced, down_after=down_after)
    settings = EngineSettings(cross_language=False, empty_on_backend_error=True)
    engine = engine_over(s, store, settings=settings)
    try:
        r = await engine.search(q(query="LDAP synchronisation integration", mode="chunk_priority"))
    finally:
        s.index.close()
    assert (r.hits, r.chunks) == ([], [])
    assert store.counts == 1  # read as the index was asked, never after the outage
