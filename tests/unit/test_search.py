"""The retrieval engine over a real Qdrant Edge shard and the real (fast-profile) embedder."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from services.common import errors, search_contract
from services.common.breaker import CLOSED, OPEN, BreakerPolicy, CircuitBreaker
from services.common.search_contract import KB_TENANT, MAX_QUERY_CHARS, Filters
from services.common.tokenizer import default_tokenizer
from services.docstore.parsing import parse_document
from services.docstore.sqlite_store import SqliteDocumentStore
from services.retrieval import ingestion
from services.retrieval.embeddings import CachedQueryEmbedder, EmbeddingSettings
from services.retrieval.engine import BackendUnavailableError, EngineSettings, RetrievalEngine
from services.retrieval.factories import build_embedder, build_reranker
from services.retrieval.index.base import KINDS, IndexFilter, IndexUnavailableError
from services.retrieval.index.edge import EdgeIndex
from services.retrieval.index.server import QdrantServerIndex
from services.retrieval.ingestion import (
    IngestInput,
    Ingestor,
    document_points,
    point_id,
    stored_points,
)
from services.retrieval.journal import IngestJournal
from services.retrieval.query import load_synonyms
from services.retrieval.rerank import RerankResult, RerankSettings
from services.retrieval.search import MODES, SearchDefaults, SearchQuery
from services.retrieval.sections import SectionCatalog
from tests.fakes.rerank_server import FakeRerankServer

GUIDE = """# Orion X guide

## LDAP integration

To set up LDAP integration open Settings, then Auth, then LDAP, and enter the server address.
The bind account needs read access to the user directory.

## Backup

Backups run daily at 02:00 and are kept for thirty days.
"""
NOTES = """# Release notes

## LDAP sync

LDAP synchronisation of large groups was fixed in version 2.1.
"""
VACATION = """# Регламент отпусков

## Заявление на отпуск

Заявление на ежегодный отпуск подаётся за две недели через портал.

## Перенос отпуска

Перенос отпуска согласуется с руководителем.
"""
KB_CSV = (
    "id,title,content,topic,jurisdiction,updated_at,tags\n"
    "ndfl,Что такое НДФЛ,НДФЛ — налог на доходы физических лиц; ставка 13 процентов.,"
    "tax,RU,2026-01-10,tax\n"
)


@pytest.fixture(scope="module")
def embedder():
    return build_embedder(EmbeddingSettings(profile="fast"))


@dataclass
class Stack:
    store: SqliteDocumentStore
    index: EdgeIndex
    ingestor: Ingestor
    engine: RetrievalEngine
    journal: IngestJournal
    sections: SectionCatalog
    path: Path


def make_stack(
    tmp: Path,
    embedder,
    index=None,
    *,
    settings: EngineSettings | None = None,
    reranker=None,
    **ingestor_options,
) -> Stack:
    store = SqliteDocumentStore(tmp / "docstore.sqlite")
    index = index or EdgeIndex(str(tmp / "index"), embedder.dim)
    sections = SectionCatalog(store)
    journal = IngestJournal(tmp / "journal.jsonl")
    ingestor = Ingestor(
        store=store, index=index, embedder=embedder, sections=sections,
        journal=journal, max_document_bytes=1 << 20, **ingestor_options,
    )  # fmt: skip
    engine = RetrievalEngine(
        index=index, embedder=embedder, sections=sections, chunks=store,
        tokenizer=default_tokenizer(), defaults=SearchDefaults(),
        settings=settings or EngineSettings(),
        breaker=CircuitBreaker("vector store", BreakerPolicy(3, 60)),
        reranker=reranker, synonyms=load_synonyms(None),
    )  # fmt: skip
    return Stack(store, index, ingestor, engine, journal, sections, tmp)


async def fill(stack: Stack) -> None:
    ing = stack.ingestor
    await ing.ingest(IngestInput("a", GUIDE.encode(), file_name="guide.md", tags=("admin",)))
    await ing.ingest(IngestInput("a", NOTES.encode(), file_name="notes.md", product="x"))
    await ing.ingest(IngestInput("a", VACATION.encode(), file_name="vacation.md"))
    await ing.ingest(IngestInput("b", GUIDE.encode(), file_name="secret.md"))
    await ing.ingest(IngestInput(KB_TENANT, KB_CSV.encode(), file_name="train_data.csv"))


@pytest.fixture(scope="module")
def shared(tmp_path_factory, embedder):
    stack = make_stack(tmp_path_factory.mktemp("engine"), embedder)
    asyncio.run(fill(stack))
    yield stack
    stack.index.close()


def q(**kw) -> SearchQuery:
    return SearchQuery(**{"query": "LDAP integration setup", "tenant_id": "a", **kw})


async def test_best_section_first_with_pages_anchor_and_timings(shared):
    r = await shared.engine.search(q())
    assert r.hits[0].doc_id == "guide"
    assert r.sections[0].title.endswith("LDAP integration")
    assert r.sections[0].anchor_chunk_id == r.hits[0].chunk_id
    assert r.hits[0].page_start >= 1 and r.hits[0].score == 1.0
    assert r.hybrid_used and r.backend == "qdrant-edge" and r.mode == "section_first"
    assert r.engine_ms > 0 and r.language == "en"
    assert {h.doc_id for h in r.hits} <= {"guide", "notes", "vacation"}


@pytest.mark.parametrize("mode", ["section_first", "doc_first", "chunk_priority", "hybrid_only"])
async def test_every_mode_finds_the_answer(shared, mode):
    r = await shared.engine.search(q(mode=mode))
    assert r.mode == mode
    assert r.hits[0].doc_id == "guide"


@pytest.mark.parametrize("ranking", ["dense", "sparse", "hybrid"])
@pytest.mark.parametrize("fusion", ["weighted", "rrf"])
async def test_every_ranking_and_fusion_scores_in_unit_range(shared, ranking, fusion):
    r = await shared.engine.search(q(ranking=ranking, fusion=fusion))
    assert r.hits and r.hits[0].doc_id == "guide"
    assert all(0.0 <= h.score <= 1.0 for h in r.hits)
    assert r.hybrid_used == (ranking == "hybrid")


async def test_russian_morphology_and_cross_language(shared):
    r = await shared.engine.search(q(query="как перенести отпуск", ranking="sparse"))
    assert r.hits[0].doc_id == "vacation"
    r = await shared.engine.search(q(query="как настроить LDAP"))
    assert r.hits[0].doc_id == "guide" and r.language == "ru"


async def test_another_tenant_never_sees_the_first_tenants_chunks(shared):
    mine = await shared.engine.search(q(tenant_id="b"))
    assert {h.doc_id for h in mine.hits} == {"secret"}
    a = await shared.engine.search(q())
    a_sections = tuple(s.section_id for s in a.sections)
    a_chunks = {h.chunk_id for h in a.hits}
    for f in (
        Filters(doc_ids=("guide", "notes")),
        Filters(section_ids=a_sections),
        Filters(tags=("admin",)),
        Filters(product="x"),
    ):
        r = await shared.engine.search(q(tenant_id="b", filters=f))
        assert not ({h.chunk_id for h in r.hits} & a_chunks)
        assert all(h.doc_id == "secret" for h in r.hits)
    assert (await shared.engine.search(q(tenant_id="nobody"))).hits == []


async def test_knowledge_base_only_through_source_filter(shared):
    r = await shared.engine.search(q(query="ставка НДФЛ", filters=Filters(source="knowledge_base")))
    assert r.hits and all(h.doc_id.startswith("kb-") for h in r.hits)
    own = await shared.engine.search(q(query="ставка НДФЛ"))
    assert not any(h.doc_id.startswith("kb-") for h in own.hits)
    with pytest.raises(errors.InvalidArgumentError) as info:
        await shared.engine.search(q(tenant_id=KB_TENANT))
    assert info.value.metadata["field"] == "tenant_id"
    # the words every service refuses the reserved tenant with (search_contract)
    assert "is reserved for the knowledge base; search it with filters.source" in str(info.value)


async def test_filters(shared):
    r = await shared.engine.search(q(filters=Filters(tags=("admin",))))
    assert {h.doc_id for h in r.hits} == {"guide"}
    r = await shared.engine.search(q(filters=Filters(product="x")))
    assert {h.doc_id for h in r.hits} == {"notes"}
    assert (await shared.engine.search(q(filters=Filters(version="9")))).hits == []
    sid = (await shared.engine.search(q())).sections[0].section_id
    r = await shared.engine.search(q(filters=Filters(section_ids=(sid,))))
    assert {h.section_id for h in r.hits} == {sid}


@pytest.mark.parametrize(("value", "ok"), [(1, True), (50, True), (51, False), (0, False)])
async def test_max_results_at_and_past_the_limit(shared, value, ok):
    if ok:
        assert len((await shared.engine.search(q(max_results=value))).hits) <= value
    else:
        with pytest.raises(errors.InvalidArgumentError) as info:
            await shared.engine.search(q(max_results=value))
        assert info.value.metadata["field"] == "max_results"


async def test_query_length_at_and_past_the_limit(shared):
    await shared.engine.search(q(query="a" * MAX_QUERY_CHARS))
    with pytest.raises(errors.LimitExceededError):
        await shared.engine.search(q(query="a" * (MAX_QUERY_CHARS + 1)))


async def test_a_query_normalised_past_the_limit_is_refused(shared):
    # NFKC writes U+FDFA as 18 characters: 227 of them are 4,086, 228 are 4,104.
    fits = "\ufdfa" * (MAX_QUERY_CHARS // 18)
    await shared.engine.search(q(query=fits))
    for query in (fits + "\ufdfa", "\ufdfa" * MAX_QUERY_CHARS):
        with pytest.raises(errors.LimitExceededError) as info:
            await shared.engine.search(q(query=query))
        assert info.value.metadata == {"field": "query", "limit": str(MAX_QUERY_CHARS)}


def test_a_query_past_the_limit_is_refused_before_it_is_normalised(monkeypatch):
    def never(*_args, **_kw):
        raise AssertionError("normalised")

    monkeypatch.setattr(search_contract, "normalise_query", never)
    for query in ("a" * (MAX_QUERY_CHARS + 1), "\ufdfa" * 1_000_000, " " * 10_000):
        with pytest.raises(errors.LimitExceededError):
            search_contract.check_query(query)


@pytest.mark.parametrize(
    "filters",
    [
        Filters(doc_ids=("d" * 128,), tags=("t" * 128,)),
        Filters(product="p" * 256, version="v" * 256),
    ],
)
async def test_filter_values_at_their_stored_limits_are_searched(shared, filters):
    assert (await shared.engine.search(q(filters=filters))).hits == []


async def test_planning_runs_off_the_event_loop(tmp_path, embedder):
    s = make_stack(tmp_path, embedder)
    await fill(s)
    planned: list[threading.Thread] = []
    plan = s.engine._plan

    def recorded(query):
        planned.append(threading.current_thread())
        return plan(query)

    s.engine._plan = recorded  # type: ignore[method-assign]
    try:
        assert (await s.engine.search(q())).hits
        s.engine._expander = Echo()  # the model writes variants between planning and search
        assert (await s.engine.search(q(expand_query=True))).query_variants_source == "llm"
        with pytest.raises(errors.LimitExceededError):  # a refusal is raised from the thread
            await s.engine.search(q(query="\ufdfa" * MAX_QUERY_CHARS))
    finally:
        s.index.close()
    assert len(planned) == 3 and threading.main_thread() not in planned


class Echo:
    """A query expander answering one variant of its own."""

    async def expand(self, text, language, limit, *, scope=""):
        return [text, f"{text} configuration"]


@pytest.mark.parametrize(("dense", "sparse"), [(0.35, 0.15), (2.1, 0.9), (1.0, 1.0), (0.2, 1.0)])
async def test_fusion_weights_score_in_unit_range_whatever_their_sum(
    tmp_path, embedder, dense, sparse
):
    # LDAP is an abbreviation: its own BM25 list joins the weighted fusion too.
    s = make_stack(tmp_path, embedder)
    await fill(s)
    settings = EngineSettings(dense_weight=dense, sparse_weight=sparse)
    try:
        default = await s.engine.search(q())  # 0.7 and 0.3
        got = await engine_over(s, s.store, settings=settings).search(q())
        cut = await engine_over(s, s.store, settings=settings).search(q(min_score=0.6))
    finally:
        s.index.close()
    assert got.hits and all(0.0 <= h.score <= 1.0 for h in got.hits)
    if sparse * 0.7 == pytest.approx(dense * 0.3):  # the default's ratio: the same scores
        assert [h.chunk_id for h in got.hits] == [h.chunk_id for h in default.hits]
        assert [h.score for h in got.hits] == pytest.approx([h.score for h in default.hits])
    assert [h.chunk_id for h in cut.hits] == [h.chunk_id for h in got.hits if h.score >= 0.6]


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"tenant_id": " "}, "tenant_id"),
        ({"query": ""}, "query"),
        ({"query": "\u200b\u0000"}, "query"),
        ({"mode": "fastest"}, "params.retrieval_mode"),
        ({"ranking": "magic"}, "params.ranking"),
        ({"fusion": "avg"}, "params.fusion"),
        ({"max_chunks": 201}, "params.max_chunks"),
        ({"max_docs": 0}, "params.max_docs"),
        ({"max_sections": 201}, "params.max_sections"),
        ({"context_token_limit": 0}, "params.context_token_limit"),
        ({"topk_per_doc": 51}, "params.topk_per_doc"),
        ({"min_score": 1.5}, "params.min_score"),
        ({"filters": Filters(source="web")}, "filters.source"),
        ({"filters": Filters(doc_ids=tuple(str(i) for i in range(101)))}, "filters.doc_ids"),
        ({"filters": Filters(doc_ids=("guide", "d" * 129))}, "filters.doc_ids"),
        ({"filters": Filters(tags=("admin", "t" * 129))}, "filters.tags"),
        ({"filters": Filters(product="p" * 257)}, "filters.product"),
        ({"filters": Filters(version="v" * 257)}, "filters.version"),
    ],
)
async def test_bad_requests_name_the_field(shared, kw, field):
    with pytest.raises(errors.InvalidArgumentError) as info:
        await shared.engine.search(q(**kw))
    assert info.value.metadata["field"] == field


async def test_topk_per_doc_and_min_score(shared):
    r = await shared.engine.search(q(topk_per_doc=1, max_results=10))
    docs = [h.doc_id for h in r.hits]
    assert len(docs) == len(set(docs))
    r = await shared.engine.search(q(topk_per_doc=50))  # at the limit
    r = await shared.engine.search(q(min_score=0.9))
    assert r.hits and all(h.score >= 0.9 for h in r.hits)
    r = await shared.engine.search(q(min_score=1.0))
    assert all(h.score == 1.0 for h in r.hits)


async def test_context_respects_the_token_limit_at_and_past_it(shared):
    full = await shared.engine.search(q(context_token_limit=4096))
    total = sum(c.tokens for c in full.chunks)
    assert total > 0
    exact = await shared.engine.search(q(context_token_limit=total))
    assert sum(c.tokens for c in exact.chunks) <= total
    small = await shared.engine.search(q(context_token_limit=total - 1))
    assert sum(c.tokens for c in small.chunks) <= total - 1
    trimmed = await shared.engine.search(q(context_token_limit=20, hard_trim=True))
    assert 0 < sum(c.tokens for c in trimmed.chunks) <= 20


async def test_reingest_is_idempotent_and_replacement_hides_the_old_text(tmp_path, embedder):
    s = make_stack(tmp_path, embedder)
    first = await s.ingestor.ingest(IngestInput("a", b"# T\n\nalpha omega", file_name="d.md"))
    again = await s.ingestor.ingest(IngestInput("a", b"# T\n\nalpha omega", file_name="d.md"))
    assert again.unchanged and again.generation == first.generation
    count = s.index.count("a")
    new = await s.ingestor.ingest(IngestInput("a", b"# T\n\nbeta gamma", file_name="d.md"))
    assert new.replaced and new.generation != first.generation
    assert s.index.count("a") == count  # old generation deleted, nothing duplicated
    assert (await s.engine.search(q(query="alpha omega", ranking="sparse"))).hits == []
    assert len((await s.engine.search(q(query="beta gamma", ranking="sparse"))).hits) == 1
    assert await s.ingestor.delete("a", "d")
    assert s.index.count("a") == 0 and s.store.document_generation("a", "d") is None
    assert (await s.engine.search(q(query="beta gamma"))).hits == []
    assert not await s.ingestor.delete("a", "d")
    s.index.close()


async def test_ingest_and_list_read_the_store_off_the_event_loop(tmp_path, embedder):
    """The store may answer over the network (PostgreSQL): the ingest's generation checks and
    the listing's reads run in worker threads, never on the event loop."""
    s = make_stack(tmp_path, embedder)
    loop_thread = threading.get_ident()
    seen: list[tuple[str, int]] = []
    for name in ("document_generation", "list_summaries"):
        real = getattr(s.store, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            seen.append((_name, threading.get_ident()))
            return _real(*args, **kwargs)

        setattr(s.store, name, spy)
    await s.ingestor.ingest(IngestInput("a", b"# T\n\nalpha omega", file_name="d.md"))
    listed, next_token = await s.ingestor.list("a")
    assert [d.doc_id for d in listed] == ["d"] and listed[0].chunks >= 1 and next_token == ""
    assert {name for name, _ in seen} == {"document_generation", "list_summaries"}
    assert all(thread != loop_thread for _, thread in seen)
    s.index.close()


async def test_a_listed_documents_counts_are_of_the_generation_listed_with_it(tmp_path, embedder):
    """A re-ingest that commits while a page is being read (here: right after the store's
    first read of it) never pairs the generation and title read with the new text's counts."""
    s = make_stack(tmp_path, embedder)
    await s.ingestor.ingest(IngestInput("a", b"# Old\n\nalpha omega", file_name="d.md"))
    longer = "# New\n\n" + "\n\n".join(f"## Part {i}\n\n" + "word " * 300 for i in range(6))
    newer = parse_document(tenant_id="a", doc_id="d", content=longer.encode(), fmt="markdown")
    old_listed, _ = await s.ingestor.list("a")
    real_query, replaced = s.store._query, []

    def query_then_reingest(*args, **kwargs):
        rows = real_query(*args, **kwargs)
        if not replaced:
            replaced.append(s.store.replace(newer))
        return rows

    s.store._query = query_then_reingest
    listed, _ = await s.ingestor.list("a")
    assert replaced == [old_listed[0].generation] and listed == old_listed
    s.store._query = real_query
    now, _ = await s.ingestor.list("a")
    assert (now[0].title, now[0].generation, now[0].chunks) == (
        "New", newer.generation, len(newer.chunks),
    )  # fmt: skip
    assert now[0].chunks > old_listed[0].chunks and now[0].chars > old_listed[0].chars
    s.index.close()


async def test_a_crash_mid_document_leaves_nothing_visible_and_a_rerun_completes(
    tmp_path, embedder
):
    s = make_stack(tmp_path, embedder)
    await s.ingestor.ingest(IngestInput("a", b"# T\n\nold text here", file_name="d.md"))
    old_count = s.index.count("a")

    def crash(doc, points=()):
        raise RuntimeError("power cut between the index write and the store commit")

    s.store.replace = crash  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        await s.ingestor.ingest(IngestInput("a", b"# T\n\nnew words zebra", file_name="d.md"))
    assert s.index.count("a") > old_count  # the new points were written ...
    r = await s.engine.search(q(query="zebra", ranking="sparse"))
    assert r.hits == []  # ... but none is visible
    assert (await s.engine.search(q(query="old text", ranking="sparse"))).hits
    s.index.close()
    # The process restarts: recovery deletes the orphans, a rerun completes the document.
    s2 = make_stack(tmp_path, embedder)
    assert s2.ingestor.recover() == 1
    assert s2.index.count("a") == old_count
    await s2.ingestor.ingest(IngestInput("a", b"# T\n\nnew words zebra", file_name="d.md"))
    assert (await s2.engine.search(q(query="zebra", ranking="sparse"))).hits
    assert s2.index.count("a") == old_count - 0  # same shape, new generation: no duplicates
    assert s2.journal.pending() == []
    s2.index.close()


async def test_ingest_validation(tmp_path, embedder):
    s = make_stack(tmp_path, embedder)
    out = await s.ingestor.ingest(
        IngestInput("t", b"# T\n\ntext", file_name="docs/Регламент отпусков.md")
    )
    assert out.doc_id == "регламент-отпусков"
    for bad_name in ("", "!!!.md"):
        with pytest.raises(errors.InvalidArgumentError) as info:
            await s.ingestor.ingest(IngestInput("t", b"# T\n\ntext", file_name=bad_name))
        assert info.value.metadata["field"] == "file_name"
    with pytest.raises(errors.InvalidArgumentError) as info:
        await s.ingestor.ingest(IngestInput("t", b"# T\n\ntext", doc_id="../etc/passwd"))
    assert info.value.metadata["field"] == "doc_id"
    with pytest.raises(errors.InvalidArgumentError):
        await s.ingestor.ingest(IngestInput("t", b"\xff\xfe\xfd", file_name="a.md"))
    with pytest.raises(errors.InvalidArgumentError):
        await s.ingestor.ingest(IngestInput("t", b"%PDF-1.4 broken", file_name="a.pdf"))
    with pytest.raises(errors.InvalidArgumentError) as info:
        await s.ingestor.ingest(IngestInput("t", KB_CSV.encode(), file_name="kb.csv"))
    assert info.value.metadata["field"] == "tenant_id"  # the KB is written only to its tenant
    with pytest.raises(errors.LimitExceededError):
        await s.ingestor.ingest(IngestInput("t", b"x" * ((1 << 20) + 1), file_name="a.md"))
    s.index.close()


async def test_rerank_reorders_and_a_failing_reranker_falls_back(tmp_path, embedder):
    with FakeRerankServer() as server:
        reranker = build_reranker(RerankSettings(url=server.url, api_style="tei", timeout_s=1.0))
        s = make_stack(tmp_path, embedder, reranker=reranker)
        await fill(s)
        r = await s.engine.search(q(enable_rerank=True, mode="chunk_priority"))
        assert r.rerank_used and r.hits[0].doc_id == "guide"
        assert server.requests, "the reranker was called"
        plain = await s.engine.search(q(enable_rerank=False))
        assert not plain.rerank_used
        server.fail_next(10, 503)
        down = await s.engine.search(q(enable_rerank=True))
        assert not down.rerank_used and down.hits[0].doc_id == "guide"
        s.index.close()


async def test_backend_down_is_backend_unavailable_and_opens_the_breaker(tmp_path, embedder):
    index = QdrantServerIndex.from_url("http://127.0.0.1:9", "c", embedder.dim, timeout=0.2)
    s = make_stack(tmp_path, embedder, index=index)
    with pytest.raises(BackendUnavailableError) as info:
        await s.engine.search(q())
    assert info.value.reason == "backend_unavailable"
    with pytest.raises(BackendUnavailableError) as info:  # breaker open: fails fast
        await s.engine.search(q())
    assert "circuit open" in info.value.message
    fallback = make_stack(
        tmp_path / "f", embedder, index=index, settings=EngineSettings(empty_on_backend_error=True)
    )
    assert (await fallback.engine.search(q())).hits == []


async def test_the_qdrant_client_backend_serves_the_same_search(tmp_path, embedder):
    from qdrant_client import QdrantClient

    index = QdrantServerIndex(QdrantClient(":memory:"), "chunks", embedder.dim)
    s = make_stack(tmp_path, embedder, index=index)
    await fill(s)
    r = await s.engine.search(q())
    assert r.backend == "qdrant" and r.hits[0].doc_id == "guide"
    r = await s.engine.search(q(tenant_id="b", filters=Filters(doc_ids=("guide",))))
    assert r.hits == []


class RecordingChunks:
    """The document store's chunks_by_ids and points_by_ids, recorded; `drop` hides chunk
    texts by (doc_id, chunk_id) (deleted meanwhile), `drop_points` point ids (deleted after
    they were ranked)."""

    def __init__(
        self, store: SqliteDocumentStore, drop: frozenset = frozenset(), drop_points=frozenset()
    ) -> None:
        self.store, self.drop, self.drop_points = store, drop, drop_points
        self.calls: list[tuple[str, list[tuple[str, str]]]] = []
        self.point_calls: list[tuple[str, set[int]]] = []

    def points_by_ids(self, tenant_id, ids):
        self.point_calls.append((tenant_id, set(ids)))
        found = self.store.points_by_ids(tenant_id, ids)
        return {k: v for k, v in found.items() if k not in self.drop_points}

    def chunks_by_ids(self, tenant_id, keys):
        self.calls.append((tenant_id, list(keys)))
        found = self.store.chunks_by_ids(tenant_id, keys)
        return {k: v for k, v in found.items() if k[:2] not in self.drop}

    def replacements(self, tenant_id):
        return self.store.replacements(tenant_id)


def engine_over(
    stack: Stack, chunks, *, settings: EngineSettings | None = None, reranker=None
) -> RetrievalEngine:
    e = stack.engine
    return RetrievalEngine(
        index=stack.index, embedder=e._embedder, sections=stack.sections, chunks=chunks, tokenizer=default_tokenizer(),
        defaults=SearchDefaults(), settings=settings or EngineSettings(),
        breaker=CircuitBreaker("vector store", BreakerPolicy(3, 60)),
        reranker=reranker,
    )  # fmt: skip


class Reverse:
    """A reranker preferring the candidates the hybrid ranking put last, with low scores (far
    under the hybrid ones); `top_n` > 0 keeps only its best `top_n`. Records what it got."""

    def __init__(self, top_n: int = 0) -> None:
        self.top_n = top_n
        self.calls: list[list[str]] = []

    async def rerank(self, query: str, texts: list[str]) -> list[RerankResult]:
        self.calls.append(list(texts))
        found = [RerankResult(i, 0.01 * (i + 1)) for i in reversed(range(len(texts)))]
        return found[: self.top_n] if self.top_n else found


async def test_texts_are_read_once_for_the_final_hits_under_the_request_tenant(shared):
    rec = RecordingChunks(shared.store)
    # The candidates' language read (RETR_CROSS_LANGUAGE) is counted in test_cross_language.py.
    engine = engine_over(shared, rec, settings=EngineSettings(cross_language=False))
    r = await engine.search(q(max_results=2, max_chunks=3))
    assert len(rec.calls) == 1
    tenant, keys = rec.calls[0]
    assert tenant == "a" and 0 < len(keys) <= 3
    assert r.hits and len(r.hits) <= 2
    for h in r.hits:
        assert h.text == shared.store.chunk_by_id("a", h.doc_id, h.chunk_id).text
    assert {t for t, _ in rec.point_calls} == {"a"}
    kb = await engine.search(q(query="НДФЛ ставка", filters=Filters(source="knowledge_base")))
    assert kb.hits and rec.calls[-1][0] == KB_TENANT and rec.point_calls[-1][0] == KB_TENANT


async def test_a_hit_whose_text_is_gone_from_the_store_is_dropped(shared):
    first = (await shared.engine.search(q())).hits
    gone = (first[0].doc_id, first[0].chunk_id)
    r = await engine_over(shared, RecordingChunks(shared.store, frozenset({gone}))).search(q())
    assert r.hits and gone not in {(h.doc_id, h.chunk_id) for h in r.hits}
    assert all(h.text for h in r.hits + r.chunks)


async def test_a_ranked_point_the_store_no_longer_lists_is_skipped_and_the_next_read(shared):
    # chunk_priority keeps max(max_chunks, max_results) = 2, ranks 2 x 2 x candidate_factor
    # deep and reads every candidate ranked: the caps apply as the answer fills from them.
    ask = q(mode="chunk_priority", max_results=2, max_chunks=2)
    first = await shared.engine.search(ask)
    assert len(first.hits) == 2
    gen = shared.store.document_generation("a", first.hits[0].doc_id)
    top = point_id("a", first.hits[0].doc_id, "chunk", first.hits[0].chunk_id, gen)
    assert shared.store.points_by_ids("a", [top])[top].chunk_id == first.hits[0].chunk_id
    # The top point is ranked but gone from the store's list (deleted since it was ranked).
    rec = RecordingChunks(shared.store, drop_points=frozenset({top}))
    # Without the candidates' language read (RETR_CROSS_LANGUAGE), which lists points too.
    r = await engine_over(shared, rec, settings=EngineSettings(cross_language=False)).search(ask)
    assert top in rec.point_calls[0][1]
    assert len(r.hits) == 2 and r.hits[0].chunk_id == first.hits[1].chunk_id
    assert first.hits[0].chunk_id not in {h.chunk_id for h in r.hits}
    # One read of every ranked id, the missing one among them: the next one read with it.
    assert len(rec.point_calls) == 1 and len(rec.point_calls[0][1]) > 2
    assert all(t == "a" for t, _ in rec.point_calls)
    # doc_first's documents are read by their head (max_docs), the next id when one is gone.
    one_doc = q(mode="doc_first", max_docs=1)
    top_doc = (await shared.engine.search(one_doc)).docs[0].doc_id
    gen = shared.store.document_generation("a", top_doc)
    rec = RecordingChunks(
        shared.store, drop_points=frozenset({point_id("a", top_doc, "doc", "doc", gen)})
    )
    r = await engine_over(shared, rec, settings=EngineSettings(cross_language=False)).search(
        one_doc
    )
    assert [len(ids) for _, ids in rec.point_calls[:2]] == [1, 1]
    assert r.docs and r.docs[0].doc_id != top_doc


@pytest.mark.parametrize(("top_n", "candidates"), [(2, 40), (0, 2)])
async def test_candidates_the_reranker_did_not_score_follow_those_it_did(shared, top_n, candidates):
    # Unscored: past the reranker's top_n, or past rerank_candidates. Their hybrid scores are on
    # another scale than the reranker's: they keep their order, after its picks.
    rr = Reverse(top_n)
    engine = engine_over(shared, shared.store, reranker=rr,
                         settings=EngineSettings(rerank_candidates=candidates))  # fmt: skip
    plain = await engine.search(q(mode="chunk_priority"))
    r = await engine.search(q(mode="chunk_priority", enable_rerank=True))
    assert r.rerank_used and len(rr.calls[0]) >= 2
    picks = list(reversed(rr.calls[0]))[:2]
    assert [h.text for h in r.hits[:2]] == picks
    rest = [h.text for h in plain.hits if h.text not in picks]
    assert [h.text for h in r.hits[2:]] == rest[: len(r.hits) - 2] and len(r.hits) > 2
    assert all(h.score < r.hits[1].score for h in r.hits[2:])


async def test_a_head_candidate_whose_text_is_gone_leaves_the_rest_reranked(shared):
    first = (await shared.engine.search(q(mode="chunk_priority"))).hits
    gone = (first[0].doc_id, first[0].chunk_id)
    rr = Reverse()
    engine = engine_over(shared, RecordingChunks(shared.store, frozenset({gone})), reranker=rr,
                         settings=EngineSettings(rerank_candidates=2))  # fmt: skip
    r = await engine.search(q(mode="chunk_priority", enable_rerank=True))
    # The head's survivor alone is reranked, not the tail item that moved up (no text read).
    assert r.rerank_used and len(rr.calls) == 1 and len(rr.calls[0]) == 1
    assert r.hits[0].text == rr.calls[0][0]
    assert gone not in {(h.doc_id, h.chunk_id) for h in r.hits}


async def test_the_store_lists_exactly_the_points_ingestion_wrote(tmp_path, embedder):
    s = make_stack(tmp_path, embedder)
    out = await s.ingestor.ingest(IngestInput("a", GUIDE.encode(), file_name="guide.md"))
    doc = s.store.get_document("a", out.doc_id)
    want = stored_points(document_points(doc, None))
    assert {p.kind for p in want} == {"chunk", "section", "doc"}
    assert len(want) == s.index.count("a")
    assert s.store.points_by_ids("a", [p.point_id for p in want]) == {p.point_id: p for p in want}
    # Every id a search can rank is one of them.
    ranked = s.index.search_dense_ids(
        embedder.embed_queries(["LDAP"])[0], IndexFilter("a", kinds=KINDS), 100
    )
    assert {k for k, _ in ranked} == {p.point_id for p in want}
    s.index.close()


async def test_a_store_without_point_lists_and_token_counts_is_completed_and_searchable_again(
    tmp_path, embedder, monkeypatch, caplog
):
    s = make_stack(tmp_path, embedder)
    await fill(s)
    conn = sqlite3.connect(s.store.path)
    before = conn.execute("SELECT * FROM points ORDER BY tenant_id, point_id").fetchall()
    tokens = conn.execute("SELECT doc_id, tokens FROM documents ORDER BY doc_id").fetchall()
    assert all(n > 0 for _, n in tokens)
    conn.execute("DELETE FROM points")  # a store written before the list existed
    conn.execute("UPDATE documents SET tokens=0")  # ... and before the token count
    conn.commit()
    assert (await s.engine.search(q())).hits == []  # nothing listed: nothing shown
    monkeypatch.setattr(ingestion, "_PROGRESS_LOG_S", 0.0)  # a progress line per document
    with caplog.at_level(logging.INFO, logger="visior.retrieval.ingestion"):
        assert (
            s.ingestor.complete_stored_documents() == 5
        )  # guide, notes, vacation, b's, the KB row
    progress = [r for r in caplog.records if r.getMessage().startswith("completing")]
    assert [(r.documents, r.of) for r in progress] == [(n, 5) for n in range(1, 5)]
    assert conn.execute("SELECT * FROM points ORDER BY tenant_id, point_id").fetchall() == before
    assert conn.execute("SELECT doc_id, tokens FROM documents ORDER BY doc_id").fetchall() == tokens
    assert s.ingestor.complete_stored_documents() == 0
    assert (await s.engine.search(q())).hits[0].doc_id == "guide"
    conn.close()
    s.index.close()


def test_store_chunks_by_ids_is_tenant_scoped(shared):
    doc = shared.store.get_document("a", "guide")
    keys = [("guide", c.chunk_id) for c in doc.chunks]
    found = shared.store.chunks_by_ids("a", keys + keys[:1] + [("guide", "nope")])
    assert set(found) == set(keys)
    assert all(found[k].text == c.text for k, c in zip(keys, doc.chunks, strict=True))
    # Tenant b holds the same text under another doc_id; a's keys find nothing there.
    assert shared.store.chunks_by_ids("b", keys) == {}
    assert shared.store.chunks_by_ids("a", []) == {}
    many = keys * 300 + [("guide", f"x{i}") for i in range(600)]  # > one 500-key batch
    assert set(shared.store.chunks_by_ids("a", many)) == set(keys)


async def test_the_knowledge_base_is_chunked_with_the_configured_sizes(tmp_path, embedder):
    from services.docstore.parsing import ChunkingConfig

    s = make_stack(tmp_path, embedder)
    small = Ingestor(
        store=s.store, index=s.index, embedder=embedder, sections=s.sections, journal=s.journal, max_document_bytes=1 << 20,
        chunking=ChunkingConfig(chunk_tokens=32, overlap_tokens=0),
    )  # fmt: skip
    body = " ".join(f"Предложение номер {i} о налоге на добавленную стоимость." for i in range(30))
    csv = f"id,title,content,topic,jurisdiction,updated_at\nvat,НДС,{body},tax,RU,2026-01-10\n"
    out = await small.ingest(IngestInput(KB_TENANT, csv.encode(), file_name="kb.csv"))
    doc = s.store.get_document(KB_TENANT, out.doc_ids[0])
    assert doc is not None and len(doc.chunks) > 1
    assert all(c.tokens <= 32 for c in doc.chunks)
    s.index.close()


class FlakyIndex:
    """A real index that fails every call while `down` (IndexUnavailableError), or with
    `fault` while one is set, counting calls."""

    def __init__(self, inner) -> None:
        self.inner, self.down, self.calls = inner, False, 0
        self.fault: Exception | None = None
        self.backend, self.dim = inner.backend, inner.dim

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self.calls += 1
            if self.down:
                raise IndexUnavailableError("vector store down (test)")
            if self.fault is not None:
                raise self.fault
            return attr(*args, **kwargs)

        return call


async def flaky_engine(
    tmp_path,
    embedder,
    policy: BreakerPolicy,
    now: list[float],
    retries: int = EngineSettings.retries,
) -> tuple[RetrievalEngine, FlakyIndex, CircuitBreaker]:
    """An engine over a filled FlakyIndex, its breaker on the clock `now[0]`."""
    base = make_stack(tmp_path, embedder)
    await fill(base)
    flaky = FlakyIndex(base.index)
    breaker = CircuitBreaker("vector store", policy, clock=lambda: now[0])
    engine = RetrievalEngine(
        index=flaky, embedder=embedder, sections=base.sections,
        chunks=base.store, tokenizer=default_tokenizer(), defaults=SearchDefaults(),
        settings=EngineSettings(retries=retries), breaker=breaker,
    )  # fmt: skip
    return engine, flaky, breaker


async def test_the_vector_store_breaker_opens_at_5_failures_and_closes_after_recovery(
    tmp_path, embedder
):
    now = [0.0]
    engine, flaky, _ = await flaky_engine(tmp_path, embedder, BreakerPolicy(5, 10), now)
    assert (await engine.search(q())).hits
    flaky.down, flaky.calls = True, 0
    for _ in range(3):
        with pytest.raises(BackendUnavailableError):
            await engine.search(q())
    # Each search tries 1 + 2 retries; the fifth failure opens the circuit, after which
    # nothing reaches the store.
    assert flaky.calls == 5
    with pytest.raises(BackendUnavailableError) as info:
        await engine.search(q())
    assert "circuit open" in info.value.message and flaky.calls == 5
    # Back up, but the circuit stays open until the reset time has passed...
    flaky.down = False
    with pytest.raises(BackendUnavailableError):
        await engine.search(q())
    assert flaky.calls == 5
    # ...then one trial goes through, succeeds and closes it.
    now[0] += 10.5
    assert (await engine.search(q())).hits
    assert (await engine.search(q())).hits and flaky.calls > 5


async def test_a_half_open_trial_that_fails_unexpectedly_does_not_stick_the_breaker(
    tmp_path, embedder
):
    """The trial call after the reset raises something no one classified (here what a
    backend raises for an answer it cannot use): that counts as a failure, and the next
    trial after the reset goes through again instead of the circuit staying open for good."""
    now = [0.0]
    engine, flaky, breaker = await flaky_engine(
        tmp_path, embedder, BreakerPolicy(1, 10), now, retries=0
    )
    flaky.down = True
    with pytest.raises(BackendUnavailableError):
        await engine.search(q())
    assert breaker.state == OPEN
    flaky.down, flaky.fault = False, RuntimeError("unexpected answer (test)")
    now[0] += 10.5
    with pytest.raises(RuntimeError, match="unexpected answer"):
        await engine.search(q())
    assert breaker.state == OPEN  # the failed trial opened it again, for another 10 s
    flaky.fault = None
    now[0] += 10.5
    assert (await engine.search(q())).hits
    assert breaker.state == CLOSED


async def test_ingesting_counts_calls_in_progress_and_returns_to_zero(tmp_path, embedder):
    s = make_stack(tmp_path, embedder)
    seen: list[int] = []
    real_parse = s.ingestor._parse

    def parse(*args):  # type: ignore[no-untyped-def]
        seen.append(s.ingestor.ingesting)
        return real_parse(*args)

    s.ingestor._parse = parse  # type: ignore[method-assign]
    await s.ingestor.ingest(IngestInput("a", VACATION.encode(), file_name="vacation.md"))
    with pytest.raises(errors.InvalidArgumentError):
        await s.ingestor.ingest(IngestInput("a", b"", file_name="empty.md"))
    assert seen[0] == 1 and s.ingestor.ingesting == 0  # also after the refused one
    s.index.close()


# -- from a review of the search path ---------------------------------------------------------


@pytest.mark.parametrize("doc", ["notes", "vacation"])
async def test_doc_first_honours_section_ids_outside_the_top_documents(shared, doc):
    sid = (await shared.engine.search(q(filters=Filters(doc_ids=(doc,))))).sections[0].section_id
    for mode in MODES:
        r = await shared.engine.search(
            q(mode=mode, max_docs=1, filters=Filters(section_ids=(sid,)))
        )
        assert r.hits and {h.section_id for h in r.hits} == {sid}, mode


async def test_a_gone_text_past_the_rerank_head_is_dropped_not_an_error(shared):
    # The rerank path's texts also hold candidates _select drops (topk_per_doc): a gone
    # text was missed when counted instead of looked up, and the search failed (KeyError).
    plain = (await shared.engine.search(q(mode="chunk_priority"))).hits
    head_docs = {h.doc_id for h in plain[:3]}
    victim = next(h for h in plain[3:] if h.doc_id not in head_docs)
    gone = (victim.doc_id, victim.chunk_id)
    engine = engine_over(
        shared,
        RecordingChunks(shared.store, frozenset({gone})),
        reranker=Reverse(),
        settings=EngineSettings(rerank_candidates=3),
    )
    r = await engine.search(q(mode="chunk_priority", enable_rerank=True, topk_per_doc=1))
    assert r.hits and gone not in {(h.doc_id, h.chunk_id) for h in r.hits}


@pytest.mark.parametrize("mode", MODES)
async def test_used_docs_and_sections_cover_every_returned_chunk(shared, mode):
    for caps in ({"max_docs": 1, "max_sections": 1}, {"max_docs": 2}, {"max_sections": 2}):
        r = await shared.engine.search(q(mode=mode, **caps))
        returned = r.hits + r.chunks
        assert returned
        assert {h.doc_id for h in returned} <= {d.doc_id for d in r.docs}
        assert {(h.doc_id, h.section_id) for h in returned} <= {
            (s.doc_id, s.section_id) for s in r.sections
        }
        assert len(r.docs) <= caps.get("max_docs", 20)
        assert len(r.sections) <= caps.get("max_sections", 50)


@pytest.mark.parametrize(("hint", "language"), [("auto", "en"), ("en-US", "en"), ("RU", "ru")])
async def test_the_language_hint_is_read_as_its_primary_subtag(shared, hint, language):
    assert (await shared.engine.search(q(language=hint))).language == language


async def test_the_query_cache_is_kept_apart_per_calling_tenant(shared, embedder):
    assert isinstance(embedder, CachedQueryEmbedder)
    text = "quokka migration timetable for tenant caches"
    before = (embedder.hits, embedder.misses)
    await shared.engine.search(q(query=text, tenant_id="a"))
    await shared.engine.search(q(query=text, tenant_id="a"))  # the same tenant: a hit
    assert (embedder.hits - before[0], embedder.misses - before[1]) == (1, 1)
    await shared.engine.search(q(query=text, tenant_id="b"))  # another tenant: its own miss
    kb = q(query=text, tenant_id="b")
    await shared.engine.search(replace(kb, filters=replace(kb.filters, source="knowledge_base")))
    # b's knowledge-base search is b's too (a hit), never a's or the KB tenant's.
    assert (embedder.hits - before[0], embedder.misses - before[1]) == (2, 2)


OPERATIONS = """# Operations handbook

## Backups

Backups run daily at 02:00 on every server. Backups are kept for thirty days on every server.
Backups are verified weekly on every server. Backup reports go to the operators every day.
Backup restores are tested monthly on every server. The tape library is labelled with barcodes.
"""
HANDBOOK = """# Operator Handbook

## Sayings

An old proverb says that practice makes perfect.
"""
RUNBOOK = """# Plant Runbook

## Proverbs

A proverb a day: the runbook quotes a proverb on every page, proverb after proverb.
"""


async def test_doc_first_sparse_finds_a_word_written_only_in_a_sections_body(tmp_path, embedder):
    s = make_stack(tmp_path, embedder)
    try:
        await s.ingestor.ingest(IngestInput("a", OPERATIONS.encode(), file_name="ops.md"))
        doc = s.store.get_document("a", "ops")
        assert doc is not None and "barcodes" not in doc.sections[-1].summary  # the premise
        r = await s.engine.search(q(query="barcodes", mode="doc_first", ranking="sparse"))
    finally:
        s.index.close()
    assert r.hits and "barcodes" in r.hits[0].text


async def test_doc_first_ranks_documents_on_the_title_a_query_names(tmp_path, embedder):
    # The title's words leave the keyword query of sections and chunks (query.TitleIndex),
    # not the documents': they name the one to read.
    s = make_stack(tmp_path, embedder)
    query = "Which proverb does the operator handbook quote?"
    try:
        for name, text in (("handbook.md", HANDBOOK), ("runbook.md", RUNBOOK)):
            await s.ingestor.ingest(IngestInput("a", text.encode(), file_name=name))
        one = await s.engine.search(q(query=query, mode="doc_first", ranking="sparse", max_docs=1))
    finally:
        s.index.close()
    assert {h.doc_id for h in one.hits} == {"handbook"}
    assert "proverb" in one.hits[0].text
