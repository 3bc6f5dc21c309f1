import dataclasses
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import uuid
from typing import Any

import numpy as np
import pytest
import qdrant_edge
from qdrant_client import QdrantClient

from services.common.topology import free_ports
from services.retrieval.index import (
    KINDS,
    Bm25Encoder,
    EdgeIndex,
    IndexFilter,
    IndexLockedError,
    IndexPoint,
    IndexUnavailableError,
    InvalidFilterError,
    QdrantServerIndex,
)
from services.retrieval.index.base import (
    LAYOUT_VERSION,
    SCOPE_FIELD,
    TENANT_FIELD,
    FieldMatch,
    IndexLayoutError,
    RankQuery,
    filter_conditions,
    point_payload,
)
from services.retrieval.index.edge import LAYOUT_FILE
from services.retrieval.index.server import LAYOUT_KEY
from services.retrieval.index.sparse import in_tenant_space, tenant_salt
from services.retrieval.ingestion import point_id
from tests.index_points import chunk_points

DIM = 8
ENCODER = Bm25Encoder()  # shared: its word cache is thread-safe and stateless otherwise


def vec(name: str) -> np.ndarray:
    """A fixed random unit vector per name, so a query with it finds exactly that point."""
    rng = np.random.default_rng(uuid.uuid5(uuid.NAMESPACE_URL, name).int % 2**32)
    v = rng.standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def pt(
    tenant: str,
    doc: str,
    chunk: str,
    text: str,
    *,
    section: str = "s1",
    kind: str = "chunk",
    product: str = "",
    version: str = "",
    tags: tuple[str, ...] = (),
    source: str = "user",
    generation: str = "g1",
    ord: int = 0,
) -> IndexPoint:
    pid = point_id(tenant, doc, kind, chunk, generation)
    return IndexPoint(
        point_id=pid,
        tenant_id=tenant,
        doc_id=doc,
        section_id=section,
        chunk_id=chunk,
        kind=kind,
        ord=ord,
        page_start=ord + 1,
        page_end=ord + 2,
        tokens=len(text.split()),
        source=source,
        product=product,
        version=version,
        tags=tags,
        generation=generation,
        dense=vec(f"{tenant}/{chunk}/{kind}"),
        sparse_text=text,
    )


CONTRACT: dict[str, Any] = {"product": "orion", "version": "1.0", "tags": ("legal",)}
MANUAL: dict[str, Any] = {"product": "visor", "version": "2.0", "tags": ("admin", "ldap")}

CORPUS = [
    pt("a", "contract", "c1", "Договор поставки оборудования заключается на один год", **CONTRACT),
    pt(
        "a",
        "contract",
        "c2",
        "Payment is due within thirty days of the invoice date",
        section="s2",
        ord=1,
        **CONTRACT,
    ),
    pt(
        "a",
        "contract",
        "c3",
        "Штрафы за просрочку оплаты начисляются ежедневно",
        section="s2",
        ord=2,
        **CONTRACT,
    ),
    pt("a", "contract", "sec-s1", "Договор поставки: предмет и срок", kind="section", **CONTRACT),
    pt(
        "a",
        "contract",
        "sec-s2",
        "Payment terms and penalties",
        kind="section",
        section="s2",
        **CONTRACT,
    ),
    pt(
        "a",
        "contract",
        "doc",
        "Supply contract with payment terms",
        kind="doc",
        section="",
        **CONTRACT,
    ),
    pt(
        "a",
        "manual",
        "m1",
        "LDAP integration setup: open Settings, then Auth",
        section="m-s1",
        **MANUAL,
    ),
    pt(
        "a",
        "kb",
        "k1",
        "Ключевая ставка Банка России и инфляция",
        section="k-s1",
        source="knowledge_base",
        product="finance",
    ),
    # Tenant b reuses a's doc_id "contract" on purpose: ids are only unique inside a tenant.
    pt(
        "b",
        "contract",
        "b1",
        "Договор аренды помещения и оплата аренды",
        section="b-s1",
        **CONTRACT,
    ),
    pt("b", "other", "b2", "LDAP integration for tenant b", section="b-s2", **MANUAL),
]
A_CHUNKS = {"c1", "c2", "c3", "m1", "k1"}


@pytest.fixture
def tmp_path(tmp_path):
    """Shards on tmpfs where there is one: opening a shard on a busy disk waits on fsyncs."""
    if not os.access("/dev/shm", os.W_OK):
        yield tmp_path
        return
    path = tempfile.mkdtemp(prefix="test-index-", dir="/dev/shm")
    yield pathlib.Path(path)
    shutil.rmtree(path, ignore_errors=True)


def make_edge(tmp_path) -> EdgeIndex:
    return EdgeIndex(str(tmp_path / "shard"), DIM, encoder=ENCODER)


def make_server(tmp_path) -> QdrantServerIndex:
    return QdrantServerIndex(QdrantClient(":memory:"), "chunks", DIM, encoder=ENCODER)


@pytest.fixture(params=["edge", "server"])
def index(request, tmp_path):
    """A fresh index per test, for tests that write."""
    idx = make_edge(tmp_path) if request.param == "edge" else make_server(tmp_path)
    idx.upsert(CORPUS)
    yield idx
    idx.close()


@pytest.fixture(scope="module", params=["edge", "server"])
def ro_index(request, tmp_path_factory):
    """One index per backend shared by the read-only tests (opening a shard costs fsyncs)."""
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="test-index-", dir=_fast_dir(tmp_path_factory)))
    idx = make_edge(tmp) if request.param == "edge" else make_server(tmp)
    idx.upsert(CORPUS)
    yield idx
    idx.close()
    shutil.rmtree(tmp, ignore_errors=True)


def _fast_dir(tmp_path_factory) -> str:
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else str(tmp_path_factory.getbasetemp())


def chunk_ids(hits) -> set[str]:
    return {h.chunk_id for h in hits}


# -- search ----------------------------------------------------------------------------------


def test_dense_finds_the_chunk_with_its_payload(ro_index):
    hits = ro_index.search_dense(vec("a/c2/chunk"), IndexFilter("a"), 3)
    top = hits[0]
    assert top.chunk_id == "c2"
    assert top.score == pytest.approx(1.0, abs=1e-4)
    assert hits[1].score < top.score
    want = {f.name: getattr(CORPUS[1], f.name) for f in dataclasses.fields(CORPUS[1])}
    got = dataclasses.asdict(top)
    for key in (
        "point_id",
        "tenant_id",
        "doc_id",
        "section_id",
        "kind",
        "ord",
        "page_start",
        "page_end",
        "tokens",
        "source",
        "product",
        "version",
        "tags",
        "generation",
    ):
        assert got[key] == want[key], key


def test_sparse_finds_the_chunk(ro_index):
    hits = ro_index.search_sparse("invoice payment", IndexFilter("a"), 5)
    assert hits[0].chunk_id == "c2"
    assert hits[0].score > 0


@pytest.mark.parametrize(
    ("query", "chunk"),
    [
        ("договоров", "c1"),
        ("Договоры поставок", "c1"),
        ("оплата штрафа", "c3"),
        ("ключевой ставки", "k1"),
        ("integrations", "m1"),
    ],
)
def test_sparse_understands_russian_and_english_morphology(ro_index, query, chunk):
    hits = ro_index.search_sparse(query, IndexFilter("a"), 5)
    assert hits, query
    assert hits[0].chunk_id == chunk


def test_sparse_query_without_terms_returns_nothing(ro_index):
    assert ro_index.search_sparse("и на the of", IndexFilter("a"), 5) == []
    assert ro_index.search_sparse("", IndexFilter("a"), 5) == []


def test_limit(ro_index):
    assert len(ro_index.search_dense(vec("x"), IndexFilter("a"), 2)) == 2
    assert ro_index.search_dense(vec("x"), IndexFilter("a"), 0) == []
    with pytest.raises(ValueError):
        ro_index.search_dense(vec("x"), IndexFilter("a"), -1)


def test_dense_query_of_wrong_dimension_is_refused(ro_index):
    with pytest.raises(ValueError):
        ro_index.search_dense(np.ones(DIM + 1, dtype=np.float32), IndexFilter("a"), 3)


# -- tenant isolation ------------------------------------------------------------------------


A_NAMED_FILTERS = [
    {},
    {"doc_ids": ("contract",)},
    {"doc_ids": ("contract", "manual", "kb")},
    {"section_ids": ("s1", "s2", "m-s1", "k-s1")},
    {"kinds": KINDS},
    {"tags": ("legal", "admin", "ldap")},
    {"product": "orion"},
    {"source": "knowledge_base"},
]


@pytest.mark.parametrize("extra", A_NAMED_FILTERS)
def test_tenant_b_never_sees_tenant_a(ro_index, extra):
    flt = IndexFilter("b", **extra)
    a_texts = [p.sparse_text for p in CORPUS if p.tenant_id == "a"]
    results = [ro_index.search_sparse(t, flt, 50) for t in a_texts]
    results += [ro_index.search_dense(p.dense, flt, 50) for p in CORPUS if p.tenant_id == "a"]
    seen = [h for hits in results for h in hits]
    assert all(h.tenant_id == "b" for h in seen)
    assert not chunk_ids(seen) & A_CHUNKS


def test_tenant_b_gets_its_own_document_with_the_same_doc_id(ro_index):
    hits = ro_index.search_dense(vec("a/c1/chunk"), IndexFilter("b", doc_ids=("contract",)), 50)
    assert [(h.tenant_id, h.chunk_id) for h in hits] == [("b", "b1")]


def test_an_unknown_tenant_sees_nothing(ro_index):
    assert ro_index.search_dense(vec("a/c1/chunk"), IndexFilter("c", kinds=KINDS), 50) == []
    assert ro_index.search_sparse("договор", IndexFilter("c", kinds=KINDS), 50) == []
    assert ro_index.count("c") == 0
    assert ro_index.document_generations("c") == {}


@pytest.mark.parametrize("tenant", ["", "   "])
def test_a_filter_without_tenant_raises(tenant):
    with pytest.raises(InvalidFilterError):
        IndexFilter(tenant)


def test_a_forged_filter_without_tenant_is_refused_by_the_backend(ro_index):
    flt = IndexFilter("a")
    object.__setattr__(flt, "tenant_id", "")
    with pytest.raises(InvalidFilterError):
        ro_index.search_dense(vec("a/c1/chunk"), flt, 5)
    with pytest.raises(InvalidFilterError):
        ro_index.search_sparse("договор", flt, 5)


def test_tenant_scoped_operations_refuse_an_empty_tenant(index):
    with pytest.raises(InvalidFilterError):
        index.delete_document("", "contract")
    with pytest.raises(InvalidFilterError):
        index.document_generations("")
    with pytest.raises(InvalidFilterError):
        index.count("")
    assert index.count() == len(CORPUS)


@pytest.mark.parametrize(
    "kw",
    [{"kinds": ()}, {"kinds": ("chunks",)}, {"doc_ids": "contract"}, {"tags": "legal"}],
)
def test_malformed_filters_raise(kw):
    with pytest.raises(InvalidFilterError):
        IndexFilter("a", **kw)


# -- filters ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({}, A_CHUNKS),
        ({"doc_ids": ("contract",)}, {"c1", "c2", "c3"}),
        ({"doc_ids": ("manual", "kb")}, {"m1", "k1"}),
        ({"section_ids": ("s2",)}, {"c2", "c3"}),
        ({"section_ids": ("s1", "m-s1")}, {"c1", "m1"}),
        ({"product": "visor"}, {"m1"}),
        ({"version": "1.0"}, {"c1", "c2", "c3"}),
        ({"tags": ("ldap", "nope")}, {"m1"}),
        ({"tags": ("legal", "admin")}, {"c1", "c2", "c3", "m1"}),
        ({"source": "knowledge_base"}, {"k1"}),
        ({"source": "user"}, {"c1", "c2", "c3", "m1"}),
        ({"doc_ids": ("contract",), "section_ids": ("s2",), "version": "1.0"}, {"c2", "c3"}),
        ({"product": "orion", "tags": ("admin",)}, set()),
        ({"kinds": ("section",)}, {"sec-s1", "sec-s2"}),
        ({"kinds": ("doc",)}, {"doc"}),
        ({"kinds": ("chunk", "doc"), "doc_ids": ("contract",)}, {"c1", "c2", "c3", "doc"}),
        ({"kinds": KINDS}, A_CHUNKS | {"sec-s1", "sec-s2", "doc"}),
    ],
)
def test_every_filter_field(ro_index, kw, expected):
    flt = IndexFilter("a", **kw)
    assert chunk_ids(ro_index.search_dense(vec("q"), flt, 50)) == expected
    # sparse obeys the same filter: a query that matches every point's language mix
    words = " ".join(p.sparse_text for p in CORPUS)
    assert chunk_ids(ro_index.search_sparse(words, flt, 50)) == expected


def test_kinds_default_to_chunks(ro_index):
    hits = ro_index.search_sparse("payment terms", IndexFilter("a"), 50)
    assert {h.kind for h in hits} == {"chunk"}
    hits = ro_index.search_sparse("payment terms", IndexFilter("a", kinds=("section",)), 50)
    assert [h.chunk_id for h in hits] == ["sec-s2"]


# -- writes ----------------------------------------------------------------------------------


def test_reupsert_of_the_same_ids_replaces(index):
    before = index.count()
    changed = dataclasses.replace(
        CORPUS[0], sparse_text="Новый текст про аренду склада", tokens=5, page_end=9
    )
    index.upsert([changed, *CORPUS[1:3]])
    assert index.count() == before
    assert index.count("a") == before - 2
    hits = index.search_sparse("склад", IndexFilter("a"), 5)
    assert [h.chunk_id for h in hits] == ["c1"]
    assert (hits[0].tokens, hits[0].page_end) == (5, 9)
    assert index.search_sparse("оборудование", IndexFilter("a"), 5) == []


def test_delete_document_removes_every_kind_of_that_tenant_only(index):
    index.delete_document("a", "contract")
    assert (
        index.search_dense(vec("q"), IndexFilter("a", kinds=KINDS, doc_ids=("contract",)), 50) == []
    )
    assert index.count("a") == 2
    assert chunk_ids(index.search_dense(vec("q"), IndexFilter("b", doc_ids=("contract",)), 50)) == {
        "b1"
    }
    assert index.document_generations("a") == {"manual": {"g1"}, "kb": {"g1"}}


def test_delete_document_except_generation_keeps_the_new_one(index):
    new = [pt("a", "contract", "n1", "Новая редакция договора", generation="g2", **CONTRACT)]
    index.upsert(new)
    assert index.document_generations("a")["contract"] == {"g1", "g2"}
    index.delete_document("a", "contract", except_generation="g2")
    assert index.document_generations("a") == {"contract": {"g2"}, "manual": {"g1"}, "kb": {"g1"}}
    hits = index.search_dense(vec("q"), IndexFilter("a", kinds=KINDS, doc_ids=("contract",)), 50)
    assert chunk_ids(hits) == {"n1"}
    assert index.document_generations("b") == {"contract": {"g1"}, "other": {"g1"}}


def test_count_document_counts_one_generation_of_one_tenants_document(index):
    a_contract = sum(p.tenant_id == "a" and p.doc_id == "contract" for p in CORPUS)
    assert a_contract > 0
    assert index.count_document("a", "contract", "g1") == a_contract
    index.upsert([pt("a", "contract", "n1", "Новая редакция", generation="g2", **CONTRACT)])
    assert index.count_document("a", "contract", "g2") == 1
    assert index.count_document("a", "contract", "g1") == a_contract
    # Tenant b has a document of the same id and generation: not counted for a.
    b_contract = sum(p.tenant_id == "b" and p.doc_id == "contract" for p in CORPUS)
    assert index.count_document("b", "contract", "g1") == b_contract != a_contract
    assert index.count_document("a", "contract", "g3") == 0
    with pytest.raises(InvalidFilterError):
        index.count_document("", "contract", "g1")


def test_document_generations_pages_through_many_points(tmp_path):
    idx = make_edge(tmp_path)
    try:
        pts = [pt("a", f"d{i % 7}", f"c{i}", "text", generation=f"g{i % 2}") for i in range(2500)]
        idx.upsert(pts)
        gens = idx.document_generations("a")
        assert len(gens) == 7
        assert all(g == {"g0", "g1"} for g in gens.values())
        assert idx.count("a") == 2500
    finally:
        idx.close()


def test_a_point_of_wrong_dimension_or_kind_is_refused(index):
    bad = dataclasses.replace(CORPUS[0], dense=np.ones(DIM - 1, dtype=np.float32))
    with pytest.raises(ValueError):
        index.upsert([bad])
    with pytest.raises(ValueError):
        index.upsert([dataclasses.replace(CORPUS[0], kind="page")])
    assert index.count() == len(CORPUS)


def test_a_point_without_dense_vector_is_found_by_bm25_only(index):
    p = dataclasses.replace(pt("a", "x", "x1", "Уникальное слово кракозябра"), dense=None)
    index.upsert([p])
    assert [h.chunk_id for h in index.search_sparse("кракозябры", IndexFilter("a"), 5)] == ["x1"]
    assert "x1" not in chunk_ids(index.search_dense(vec("q"), IndexFilter("a"), 50))


# -- health and lifecycle --------------------------------------------------------------------


def test_health_and_close(index):
    h = index.health()
    assert h["status"] == "ok"
    assert h["backend"] == index.backend
    index.close()
    index.close()  # idempotent
    assert index.health()["status"] == "down"
    with pytest.raises(IndexUnavailableError):
        index.search_dense(vec("q"), IndexFilter("a"), 3)
    with pytest.raises(IndexUnavailableError):
        index.upsert(CORPUS[:1])


def test_edge_second_open_of_the_same_path_fails_clearly(tmp_path):
    first = make_edge(tmp_path)
    try:
        with pytest.raises(IndexLockedError, match="already open"):
            make_edge(tmp_path)
    finally:
        first.close()
    again = make_edge(tmp_path)  # the lock is released by close
    again.close()


def test_edge_persists_across_close_and_reopen(tmp_path):
    idx = make_edge(tmp_path)
    idx.upsert(CORPUS)
    idx.close()
    idx = make_edge(tmp_path)
    try:
        assert idx.count() == len(CORPUS)
        assert idx.search_sparse("договоров", IndexFilter("a"), 1)[0].chunk_id == "c1"
        assert idx.search_dense(vec("a/c2/chunk"), IndexFilter("a"), 1)[0].chunk_id == "c2"
    finally:
        idx.close()


def test_edge_keeps_writes_of_a_process_that_died_without_closing(tmp_path):
    path = str(tmp_path / "shard")
    script = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {os.getcwd()!r})
        from tests.unit.test_index import CORPUS, DIM
        from services.retrieval.index import EdgeIndex
        idx = EdgeIndex({path!r}, DIM)
        idx.upsert(CORPUS)
        os._exit(0)  # no close, no flush: only the WAL has the points
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    idx = EdgeIndex(path, DIM, encoder=ENCODER)
    try:
        assert idx.count() == len(CORPUS)
        assert idx.search_sparse("invoice", IndexFilter("a"), 1)[0].chunk_id == "c2"
    finally:
        idx.close()


def test_edge_refuses_to_reopen_with_another_dimension(tmp_path):
    make_edge(tmp_path).close()
    with pytest.raises(IndexLayoutError, match=f"size {DIM * 2}, but got {DIM}.*re-ingest"):
        EdgeIndex(str(tmp_path / "shard"), DIM * 2, encoder=ENCODER)


def test_server_refuses_a_collection_of_another_dimension():
    client = QdrantClient(":memory:")
    QdrantServerIndex(client, "c", DIM).count()
    with pytest.raises(IndexLayoutError, match=f"size {DIM}, .* makes {DIM * 2}: .*re-ingest"):
        QdrantServerIndex(client, "c", DIM * 2).count()


@pytest.mark.parametrize("grpc", [True, False], ids=["grpc", "rest"])
def test_server_backend_down_raises_index_unavailable(grpc):
    port = free_ports(1)[0]
    client = QdrantClient(
        url=f"http://127.0.0.1:{port}",
        port=port,
        grpc_port=port,
        prefer_grpc=grpc,
        timeout=1,
        check_compatibility=False,
    )
    idx = QdrantServerIndex(client, "chunks", DIM)
    calls = [
        lambda: idx.search_dense(vec("q"), IndexFilter("a"), 3),
        lambda: idx.search_sparse("договор", IndexFilter("a"), 3),
        lambda: idx.upsert(CORPUS[:1]),
        lambda: idx.delete_document("a", "contract"),
        lambda: idx.document_generations("a"),
        lambda: idx.count("a"),
        idx.optimize,
    ]
    for call in calls:
        with pytest.raises(IndexUnavailableError):
            call()
    health = idx.health()
    assert health["status"] == "down"
    assert health["backend"] == "qdrant"
    idx.close()


def test_from_url_prefers_grpc_and_does_no_io():
    idx = QdrantServerIndex.from_url(
        f"http://127.0.0.1:{free_ports(1)[0]}", "chunks", DIM, timeout=1
    )
    assert idx.client.init_options["prefer_grpc"] is True
    assert idx.health()["status"] == "down"
    idx.close()


# -- both backends score alike ---------------------------------------------------------------


@pytest.mark.parametrize(
    "query", ["договор поставки", "payment invoice", "LDAP integration", "оплата аренды"]
)
def test_both_backends_rank_and_score_sparse_alike(tmp_path, query):
    edge, server = make_edge(tmp_path), make_server(tmp_path)
    try:
        for idx in (edge, server):
            idx.upsert(CORPUS)
        assert edge.search_sparse(query, IndexFilter("a"), 10)
        for tenant in ("a", "b"):
            e = edge.search_sparse(query, IndexFilter(tenant, kinds=KINDS), 10)
            s = server.search_sparse(query, IndexFilter(tenant, kinds=KINDS), 10)
            assert [h.point_id for h in e] == [h.point_id for h in s]
            assert {h.point_id: round(h.score, 4) for h in e} == pytest.approx(
                {h.point_id: round(h.score, 4) for h in s}, rel=1e-3
            )
    finally:
        edge.close()
        server.close()


def test_idf_is_per_tenant(tmp_path):
    """A term frequent in another tenant does not lower its weight in this one."""
    idx = make_edge(tmp_path)
    try:
        idx.upsert([pt("a", "d", "a1", "ldap guide"), pt("a", "d", "a2", "backup guide")])
        alone = idx.search_sparse("ldap", IndexFilter("a"), 1)[0].score
        idx.upsert([pt("b", "d", f"b{i}", "ldap ldap") for i in range(20)])
        assert idx.search_sparse("ldap", IndexFilter("a"), 1)[0].score == pytest.approx(alone)
    finally:
        idx.close()


def test_the_tenant_condition_is_first_and_covers_all_kinds_with_the_tenant_field():
    every = filter_conditions(IndexFilter("a", kinds=KINDS, doc_ids=("d",)))
    assert every[0] == FieldMatch(TENANT_FIELD, ("a",))
    assert every[1:] == (FieldMatch("doc_id", ("d",)),)
    some = filter_conditions(IndexFilter("a", kinds=("chunk", "section")))
    assert some == (FieldMatch(SCOPE_FIELD, ("a#chunk", "a#section")),)


def test_an_all_kinds_filter_matches_the_same_points_as_the_kinds_one_by_one(index):
    index.upsert(CORPUS)
    for tenant in {p.tenant_id for p in CORPUS}:
        every = index.count(tenant)
        assert every == sum(p.tenant_id == tenant for p in CORPUS) > 0
        assert index.document_generations(tenant) == {
            d: {"g1"} for d in {p.doc_id for p in CORPUS if p.tenant_id == tenant}
        }


def test_the_index_stores_no_text(index):
    """Texts live in the document store; the payload carries ids, pages and filter fields."""
    index.upsert(CORPUS[:1])
    assert "text" not in point_payload(CORPUS[0])
    [hit] = index.search_dense(CORPUS[0].dense, IndexFilter("a", doc_ids=(CORPUS[0].doc_id,)), 1)
    assert not hasattr(hit, "text")
    assert (hit.chunk_id, hit.tokens) == (CORPUS[0].chunk_id, CORPUS[0].tokens)


def test_tenant_term_space_is_a_per_tenant_bijection():
    v = ENCODER.embed_document("договор поставки contract payment terms договор")
    a, b = in_tenant_space(v, "a"), in_tenant_space(v, "b")
    assert list(a.indices) == sorted(a.indices) and len(set(a.indices)) == len(v.indices)
    assert sorted(a.values) == sorted(v.values)
    assert set(a.indices).isdisjoint(b.indices)  # two tenants, two term spaces
    back = in_tenant_space(a, "a")  # XOR: applying it twice is the identity
    assert (back.indices, back.values) == (v.indices, v.values)
    assert all(0 <= i < 2**32 for i in a.indices)
    assert tenant_salt("a") == tenant_salt("a") != tenant_salt("b")
    assert not in_tenant_space(ENCODER.embed_query("и the"), "a")


def test_sparse_vectors_are_stored_in_the_tenant_term_space(tmp_path):
    """A BM25 query in the shared space finds nothing; in the tenant's space it finds the
    tenant's points only, on both backends."""
    edge = make_edge(tmp_path)
    server = QdrantServerIndex(QdrantClient(":memory:"), "c", DIM, encoder=ENCODER)
    try:
        for idx in (edge, server):
            idx.upsert([pt("a", "d", "a1", "ldap guide"), pt("b", "d", "b1", "ldap guide")])
        raw = ENCODER.embed_query("ldap")
        assert edge._shard is not None
        shared = edge._shard.query(
            qdrant_edge.QueryRequest(
                limit=5, query=qdrant_edge.Query.Nearest(
                    qdrant_edge.SparseVector(list(raw.indices), list(raw.values)), using="bm25"
                ), with_payload=True, with_vector=False,
            )
        )  # fmt: skip
        assert shared == []
        for idx in (edge, server):
            for tenant in ("a", "b"):
                hits = idx.search_sparse("ldap", IndexFilter(tenant), 5)
                assert [h.chunk_id for h in hits] == [f"{tenant}1"]
    finally:
        edge.close()
        server.close()


# -- the BM25 encoder ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("language", "text"),
    [
        ("russian", "Договор поставки и договоры аренды: условия оплаты договоров и штрафы"),
        ("english", "The contracts define the payment terms of a contract and its penalties"),
    ],
)
def test_encoder_matches_edge_bm25_on_monolingual_text(language, text):
    model = qdrant_edge.Bm25(qdrant_edge.Bm25Config(language=language))
    edge_doc = model.embed_document(text)
    ours = ENCODER.embed_document(text)
    assert list(ours.indices) == sorted(edge_doc.indices)
    by_index = dict(zip(edge_doc.indices, edge_doc.values, strict=True))
    assert all(
        math.isclose(by_index[i], v, rel_tol=1e-6)
        for i, v in zip(ours.indices, ours.values, strict=True)
    )
    assert set(ENCODER.embed_query(text).indices) == set(model.embed_query(text).indices)


@pytest.mark.parametrize(
    "stored",
    [
        "con\ufb01guration",  # the ﬁ ligature of PDF text layers
        "con\u00adfiguration",  # a soft hyphen
        "ｃｏｎｆｉｇｕｒａｔｉｏｎ",  # full-width letters
        "con\u200dfiguration",  # a zero-width joiner
    ],
)
def test_stored_text_gives_the_terms_its_plain_spelling_gives(stored):
    # Queries are normalised (NFKC, format characters out) before they reach the encoder.
    assert ENCODER.embed_document(stored).indices == ENCODER.embed_query("configuration").indices


def test_encoder_stems_each_script_with_its_language():
    enc = ENCODER
    assert enc.embed_query("договоров").indices == enc.embed_query("договор").indices
    assert enc.embed_query("contracts").indices == enc.embed_query("contract").indices
    assert enc.embed_query("ёлки").indices == enc.embed_query("елка").indices
    assert enc.embed_query("и the").indices == ()  # stopwords of both languages
    doc = enc.embed_document("договор договор contract")
    weights = dict(zip(doc.indices, doc.values, strict=True))
    assert (
        weights[enc.embed_query("договор").indices[0]]
        > weights[enc.embed_query("contract").indices[0]]
    )


@pytest.mark.parametrize("bad", [-1, 2**64, str(CORPUS[0].point_id), True, np.uint64(5), 1.0, None])
def test_a_point_id_that_is_not_an_unsigned_64_bit_int_is_refused(index, bad):
    before = index.count()
    with pytest.raises(ValueError, match="not an integer"):
        index.upsert([dataclasses.replace(CORPUS[0], point_id=bad)])
    assert index.count() == before


@pytest.mark.parametrize("edge_id", [0, 2**64 - 1])
def test_point_ids_at_the_ends_of_the_range_round_trip(index, edge_id):
    index.upsert([dataclasses.replace(CORPUS[0], point_id=edge_id, doc_id="ends")])
    flt = IndexFilter("a", doc_ids=("ends",))
    [(found, _)] = index.search_dense_ids(CORPUS[0].dense, flt, 1)
    assert found == edge_id and type(found) is int
    assert index.search_dense(CORPUS[0].dense, flt, 1)[0].point_id == edge_id


def test_concurrent_searches_and_writes_from_threads(index):
    errors: list[BaseException] = []
    extra = [pt("a", "t", f"t{i}", f"поток номер {i}") for i in range(200)]

    def write() -> None:
        try:
            for i in range(0, len(extra), 20):
                index.upsert(extra[i : i + 20])
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    def read() -> None:
        try:
            for _ in range(30):
                assert (
                    index.search_dense(vec("a/c2/chunk"), IndexFilter("a"), 1)[0].chunk_id == "c2"
                )
                assert index.search_sparse("invoice", IndexFilter("a"), 1)[0].chunk_id == "c2"
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=f) for f in (write, read, read)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert index.count("a") == 8 + len(extra)


def test_server_index_reuses_an_existing_collection():
    client = QdrantClient(":memory:")
    QdrantServerIndex(client, "chunks", DIM, encoder=ENCODER).upsert(CORPUS)
    again = QdrantServerIndex(client, "chunks", DIM, encoder=ENCODER)
    assert again.count() == len(CORPUS)
    assert again.search_sparse("договоров", IndexFilter("a"), 1)[0].chunk_id == "c1"


# -- id-only rankings (the engine reads the fields from the document store) ---------------------------------------


def test_id_searches_rank_like_the_full_searches(ro_index):
    flt = IndexFilter("a", kinds=KINDS)
    full = ro_index.search_dense(vec("a/c2/chunk"), flt, 5)
    ids = ro_index.search_dense_ids(vec("a/c2/chunk"), flt, 5)
    assert [round(s, 5) for _, s in ids] == [round(h.score, 5) for h in full]
    assert [k for k, _ in ids] == [h.point_id for h in full]
    full = ro_index.search_sparse("payment invoice", flt, 5)
    ids = ro_index.search_sparse_ids("payment invoice", flt, 5)
    assert [round(s, 4) for _, s in ids] == [round(h.score, 4) for h in full]
    assert ro_index.search_sparse_ids("и на the of", flt, 5) == []
    assert ro_index.search_dense_ids(vec("x"), flt, 0) == []


def test_a_batch_ranks_each_query_as_its_own_call_would_in_order(ro_index):
    chunks_a, all_b = IndexFilter("a"), IndexFilter("b", kinds=KINDS)
    queries = [
        RankQuery(chunks_a, 5, vector=vec("a/c2/chunk")),
        RankQuery(chunks_a, 5, text="payment invoice"),
        RankQuery(chunks_a, 5, text="и на the of"),  # no searchable terms
        RankQuery(chunks_a, 0, vector=vec("x")),  # limit 0
        RankQuery(all_b, 3, vector=vec("a/c2/chunk")),
        RankQuery(all_b, 3, text="ldap integration"),
    ]
    got = ro_index.search_ids_batch(queries)
    want = [
        ro_index.search_dense_ids(vec("a/c2/chunk"), chunks_a, 5),
        ro_index.search_sparse_ids("payment invoice", chunks_a, 5),
        [],
        [],
        ro_index.search_dense_ids(vec("a/c2/chunk"), all_b, 3),
        ro_index.search_sparse_ids("ldap integration", all_b, 3),
    ]
    assert [[(k, round(s, 4)) for k, s in r] for r in got] == [
        [(k, round(s, 4)) for k, s in r] for r in want
    ]
    assert got[0] and got[1]
    # Tenant b's lists hold only tenant b's points, whatever else the batch asked.
    b_ids = {k for r in got[4:] for k, _ in r}
    b_points = {p.point_id for p in CORPUS if p.tenant_id == "b"}
    assert b_ids and b_ids <= b_points
    assert ro_index.search_ids_batch([]) == []


def test_a_batch_refuses_a_filter_without_tenant_and_a_negative_limit(ro_index):
    with pytest.raises(InvalidFilterError):
        ro_index.search_ids_batch([RankQuery(IndexFilter(""), 5, text="payment")])
    with pytest.raises(InvalidFilterError):
        ro_index.search_ids_batch([RankQuery(IndexFilter(" "), 0, vector=vec("x"))])
    with pytest.raises(ValueError):
        ro_index.search_ids_batch([RankQuery(IndexFilter("a"), -1, vector=vec("x"))])


# -- layout version guard -------------------------------------------------------------------


def _old_layout_point(idx: EdgeIndex) -> None:
    """A point as layout 1 wrote it: the payload has no tenant_kind."""
    p = CORPUS[0]
    payload = {k: v for k, v in point_payload(p).items() if k != SCOPE_FIELD}
    point = qdrant_edge.Point(p.point_id, {"dense": p.dense.tolist()}, payload)
    assert idx._shard is not None
    idx._shard.update(qdrant_edge.UpdateOperation.upsert_points([point]))


def test_edge_records_its_layout_and_refuses_another(tmp_path):
    make_edge(tmp_path).close()
    marker = tmp_path / "shard" / LAYOUT_FILE
    assert json.loads(marker.read_text()) == {"layout_version": LAYOUT_VERSION}
    marker.write_text(json.dumps({"layout_version": LAYOUT_VERSION - 1}))
    with pytest.raises(IndexLayoutError, match="re-ingest"):
        make_edge(tmp_path)
    marker.write_text("not json")
    with pytest.raises(IndexLayoutError, match="delete the index directory"):
        make_edge(tmp_path)
    marker.write_text(json.dumps({"layout_version": LAYOUT_VERSION}))
    make_edge(tmp_path).close()  # the refusals released the shard's lock


def test_edge_without_a_layout_file_is_adopted_when_empty_else_refused_by_its_points(tmp_path):
    make_edge(tmp_path).close()
    marker = tmp_path / "shard" / LAYOUT_FILE
    marker.unlink()  # an empty shard from before the file existed
    idx = make_edge(tmp_path)
    assert marker.exists()
    idx.upsert(CORPUS)
    idx.close()
    marker.unlink()  # points with SCOPE_FIELD and no record: layout 2's sparse vectors
    with pytest.raises(IndexLayoutError, match="layout 2"):
        make_edge(tmp_path)

    old = tmp_path / "old"
    idx = EdgeIndex(str(old / "shard"), DIM, encoder=ENCODER)
    _old_layout_point(idx)
    idx.close()
    (old / "shard" / LAYOUT_FILE).unlink()
    with pytest.raises(IndexLayoutError, match="layout 1"):
        EdgeIndex(str(old / "shard"), DIM, encoder=ENCODER)


def test_server_records_its_layout_and_refuses_another():
    client = QdrantClient(":memory:")
    QdrantServerIndex(client, "chunks", DIM, encoder=ENCODER).upsert(CORPUS)
    assert client.get_collection("chunks").config.metadata == {LAYOUT_KEY: LAYOUT_VERSION}
    client.update_collection("chunks", metadata={LAYOUT_KEY: LAYOUT_VERSION + 1})
    with pytest.raises(IndexLayoutError, match="re-ingest"):
        QdrantServerIndex(client, "chunks", DIM, encoder=ENCODER).count()


def test_server_collection_without_a_marker_is_adopted_when_empty_else_refused():
    client = QdrantClient(":memory:")
    assert QdrantServerIndex(client, "new", DIM, encoder=ENCODER).count() == 0
    client.update_collection("new", metadata={LAYOUT_KEY: None})  # as before the marker
    idx = QdrantServerIndex(client, "new", DIM, encoder=ENCODER)
    idx.upsert(CORPUS)
    assert client.get_collection("new").config.metadata[LAYOUT_KEY] == LAYOUT_VERSION
    client.update_collection("new", metadata={LAYOUT_KEY: None})
    with pytest.raises(IndexLayoutError, match="layout 2"):
        QdrantServerIndex(client, "new", DIM, encoder=ENCODER).count()

    from qdrant_client import models

    client.create_collection(
        "old", vectors_config={"dense": models.VectorParams(size=DIM, distance="Cosine")}
    )
    p = CORPUS[0]
    payload = {k: v for k, v in point_payload(p).items() if k != SCOPE_FIELD}
    client.upsert("old", [models.PointStruct(id=p.point_id, vector={"dense": p.dense.tolist()},
                                             payload=payload)])  # fmt: skip
    with pytest.raises(IndexLayoutError, match="layout 1"):
        QdrantServerIndex(client, "old", DIM, encoder=ENCODER).count()


def test_edge_write_count_counts_upserts_and_deletes_not_optimize(tmp_path):
    idx = make_edge(tmp_path)
    try:
        assert idx.write_count == 0
        idx.upsert(CORPUS)
        idx.delete_document("a", "contract")
        assert idx.write_count == 2
        idx.optimize()  # the background optimizer's own call must not look like a write
        assert idx.write_count == 2
        assert idx.search_sparse_ids("договор", IndexFilter("a"), 3) == []  # deleted
    finally:
        idx.close()


def _random_points(n: int, dim: int, seed: int) -> tuple[np.ndarray, list[IndexPoint]]:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors, chunk_points(vectors)


@pytest.mark.parametrize("quantization", ["int8", "none"])
def test_edge_quantization_is_built_by_optimize_and_scores_stay_exact(tmp_path, quantization):
    dim = 32
    vectors, points = _random_points(3000, dim, seed=5)
    idx = EdgeIndex(
        str(tmp_path / "shard"), dim, encoder=ENCODER, quantization=quantization,
        indexing_threshold_kb=1,  # index (and quantize) even this small shard
    )  # fmt: skip
    try:
        idx.upsert(points)
        idx.optimize()
        quantized = list(
            (tmp_path / "shard").glob("segments/*/vector_storage-dense/quantized.data")
        )
        assert bool(quantized) == (quantization == "int8")
        overlap = 0
        for i in range(0, 3000, 150):
            found = idx.search_dense_ids(vectors[i], IndexFilter("a", kinds=("chunk",)), 5)
            assert found[0][0] == i + 1 and found[0][1] == pytest.approx(1.0, abs=1e-5)
            for pid, score in found:  # rescored with the originals: the exact cosine
                assert score == pytest.approx(float(vectors[pid - 1] @ vectors[i]), abs=1e-5)
            exact = set(np.argsort(-(vectors @ vectors[i]))[:5] + 1)
            overlap += len(exact & {pid for pid, _ in found})
        assert overlap / (20 * 5) >= 0.9
    finally:
        idx.close()


def test_unknown_quantization_is_refused(tmp_path):
    with pytest.raises(ValueError, match="quantization"):
        EdgeIndex(str(tmp_path / "shard"), DIM, quantization="int4")
    with pytest.raises(ValueError, match="quantization"):
        QdrantServerIndex(QdrantClient(":memory:"), "chunks", DIM, quantization="pq")


@pytest.mark.parametrize("quantization", ["int8", "none"])
def test_server_collection_is_created_with_the_quantization(quantization):
    client = QdrantClient(":memory:")  # local mode accepts but does not keep quantization
    created: list[dict] = []
    real_create = client.create_collection

    def create(*args, **kwargs):  # type: ignore[no-untyped-def]
        created.append(kwargs)
        return real_create(*args, **kwargs)

    client.create_collection = create  # type: ignore[method-assign]
    idx = QdrantServerIndex(client, "chunks", DIM, encoder=ENCODER, quantization=quantization)
    try:
        idx.upsert(CORPUS)
        config = created[0]["quantization_config"]
        if quantization == "int8":
            assert config.scalar.type == "int8" and config.scalar.always_ram
        else:
            assert config is None
        assert idx._dense_params.quantization.rescore is (quantization == "int8" or None)
        assert idx._dense_params.quantization.ignore is (quantization == "none")
        assert idx.search_dense_ids(vec("c1"), IndexFilter("a"), 1)  # still answers
    finally:
        idx.close()
