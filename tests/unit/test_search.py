import pytest

from services.common import errors
from services.docstore.parsing import parse_document
from services.retrieval.keyword_index import KeywordIndex
from services.retrieval.search import (
    MAX_QUERY_CHARS,
    Filters,
    SearchDefaults,
    SearchEngine,
    SearchQuery,
)

LDAP = "# Guide\n\n## LDAP\n\nTo set up LDAP integration open Settings, Auth, LDAP.\n\n## Backup\n\nBackups run daily."
OTHER = "# Notes\n\n## LDAP sync\n\nLDAP sync of large groups was fixed."


@pytest.fixture
def engine():
    index = KeywordIndex()
    index.add(
        parse_document(tenant_id="a", doc_id="guide", text=LDAP, fmt="markdown", tags=("admin",))
    )
    index.add(
        parse_document(tenant_id="a", doc_id="notes", text=OTHER, fmt="markdown", product="x")
    )
    index.add(parse_document(tenant_id="b", doc_id="secret", text=LDAP, fmt="markdown"))
    return SearchEngine(index, SearchDefaults())


def q(**kw):
    return SearchQuery(**{"query": "LDAP integration", "tenant_id": "a", **kw})


def test_best_section_first_with_pages_and_anchor(engine):
    r = engine.search(q())
    assert r.hits[0].doc_id == "guide"
    assert r.hits[0].score == 1.0
    assert r.sections[0].title == "LDAP"
    assert r.sections[0].anchor_chunk_id == r.hits[0].chunk_id
    assert {h.doc_id for h in r.hits} <= {"guide", "notes"}


def test_never_returns_another_tenants_documents(engine):
    assert all(h.doc_id != "secret" for h in engine.search(q()).hits)
    assert [h.doc_id for h in engine.search(q(tenant_id="b")).hits] == ["secret"]
    # doc_ids naming another tenant's document find nothing
    assert engine.search(q(filters=Filters(doc_ids=("secret",)))).hits == []
    assert engine.search(q(tenant_id="nobody")).hits == []


def test_filters(engine):
    assert {h.doc_id for h in engine.search(q(filters=Filters(tags=("admin",)))).hits} == {"guide"}
    assert {h.doc_id for h in engine.search(q(filters=Filters(product="x"))).hits} == {"notes"}
    assert engine.search(q(filters=Filters(version="9"))).hits == []


@pytest.mark.parametrize(("value", "ok"), [(1, True), (50, True), (51, False), (0, False)])
def test_max_results_at_and_past_the_limit(engine, value, ok):
    if ok:
        assert len(engine.search(q(max_results=value)).hits) <= value
    else:
        with pytest.raises(errors.InvalidArgumentError) as info:
            engine.search(q(max_results=value))
        assert info.value.metadata["field"] == "max_results"


def test_max_results_limit_is_reported_as_limit_exceeded(engine):
    with pytest.raises(errors.LimitExceededError) as info:
        engine.search(q(max_results=51))
    assert info.value.reason == "LIMIT_EXCEEDED"
    assert info.value.metadata["limit"] == "50"


def test_query_length_at_and_past_the_limit(engine):
    engine.search(q(query="a" * MAX_QUERY_CHARS))
    with pytest.raises(errors.LimitExceededError):
        engine.search(q(query="a" * (MAX_QUERY_CHARS + 1)))


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"tenant_id": " "}, "tenant_id"),
        ({"query": ""}, "query"),
        ({"mode": "fastest"}, "params.retrieval_mode"),
        ({"max_chunks": 201}, "params.max_chunks"),
        ({"max_docs": 0}, "params.max_docs"),
        ({"context_token_limit": 0}, "params.context_token_limit"),
        ({"filters": Filters(doc_ids=tuple(str(i) for i in range(101)))}, "filters.doc_ids"),
    ],
)
def test_bad_requests_name_the_field(engine, kw, field):
    with pytest.raises(errors.InvalidArgumentError) as info:
        engine.search(q(**kw))
    assert info.value.metadata["field"] == field


def test_context_respects_the_token_limit(engine):
    r = engine.search(q(context_token_limit=5))
    assert sum(c.tokens for c in r.chunks) <= 5


def test_reindexing_a_document_replaces_it():
    index = KeywordIndex()
    index.add(parse_document(tenant_id="a", doc_id="d", text="# T\n\nalpha", fmt="markdown"))
    index.add(parse_document(tenant_id="a", doc_id="d", text="# T\n\nbeta", fmt="markdown"))
    engine = SearchEngine(index, SearchDefaults())
    assert engine.search(q(query="alpha")).hits == []
    assert len(engine.search(q(query="beta")).hits) == 1
    index.remove("a", "d")
    assert index.chunk_count() == 0


def test_ingestion_ids_from_file_names(tmp_path):
    from services.docstore.sqlite_store import SqliteDocumentStore
    from services.retrieval.ingestion import IngestInput, Ingestor

    ingestor = Ingestor(SqliteDocumentStore(tmp_path / "s.sqlite"), KeywordIndex(), 1 << 20)
    body = b"# T\n\ntext"
    out = ingestor.ingest(IngestInput("t", body, file_name="docs/Регламент отпусков.md"))
    assert out.doc_id == "регламент-отпусков"
    for bad_name in ("", "!!!.md"):
        with pytest.raises(errors.InvalidArgumentError) as info:
            ingestor.ingest(IngestInput("t", body, file_name=bad_name))
        assert info.value.metadata["field"] == "file_name"
    with pytest.raises(errors.InvalidArgumentError) as info:
        ingestor.ingest(IngestInput("t", body, doc_id="../etc/passwd"))
    assert info.value.metadata["field"] == "doc_id"
    with pytest.raises(errors.InvalidArgumentError):
        ingestor.ingest(IngestInput("t", b"\xff\xfe", file_name="a.md"))
    with pytest.raises(errors.LimitExceededError):
        Ingestor(SqliteDocumentStore(tmp_path / "s2.sqlite"), KeywordIndex(), 8).ingest(
            IngestInput("t", b"123456789", file_name="a.md")
        )
