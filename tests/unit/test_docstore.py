"""The document store's contract, run against both stores: SQLite and a real PostgreSQL
(tests/pg_server.py). Tests about one store only say so in their name."""

import dataclasses
import sqlite3
import threading
import time

import psycopg
import pytest

from services.docstore.errors import StoreUnavailableError
from services.docstore.model import Page, StoredPoint
from services.docstore.parsing import parse_document
from services.docstore.postgres_store import PostgresDocumentStore
from services.docstore.sqlite_store import SqliteDocumentStore, require_json_functions
from services.docstore.store import DocumentStore
from tests.pg_server import Opener

MD = (
    "# Guide\n\nIntro text here.\n\n## LDAP\n\nSet up LDAP. Use ldaps.\n\f\n"
    "More on page two.\n\n## Backup\n\nDaily at 02:00.\n"
)


def doc(tenant="t1", doc_id="guide", text=MD, **kw):
    return parse_document(
        tenant_id=tenant, doc_id=doc_id, content=text.encode(), fmt="markdown", **kw
    )


@pytest.fixture
def store(open_store: Opener) -> DocumentStore:
    return open_store()


def is_pg(store: DocumentStore) -> bool:
    return isinstance(store, PostgresDocumentStore)


def test_store_round_trip_replace_and_tenant_isolation(store):
    assert store.kind == ("postgresql" if is_pg(store) else "sqlite")
    store.ping()
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
    assert store.list_summaries("t2") == []
    assert store.chunks_by_ids("t2", [("guide", "guide:c00000")]) == {}
    assert store.list_documents("t1")[0].doc_id == "guide"  # (still there for t1)
    assert store.tenants() == ["t1"]
    assert [t for t, _, _, _ in store.all_chunks()] == ["t1"] * len(doc().chunks)
    assert store.delete("t2", "guide") is False
    listed = store.list_summaries("t1")[0]
    assert (listed.sections, listed.chunks, listed.chars) == (
        len(doc().sections), len(doc().chunks), doc().chars,
    )  # fmt: skip
    assert store.delete("t1", "guide") is True
    assert store.get_document("t1", "guide") is None
    assert store.pages_text("t1", "guide", 1, 2) == []


def test_generation_metadata_and_pages_are_persisted(open_store):
    d = doc(metadata={"file_name": "guide.md", "topic": "ldap"}, tags=("admin",))
    writer = open_store()
    writer.put(d)
    writer.close()
    store = open_store()  # a fresh connection reads what the first wrote
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


class _Unstorable:
    """A page text the database cannot store, though the document's size can be read."""

    def strip(self) -> str:
        return ""


@pytest.mark.parametrize("broken_part", ["chunks", "page_texts"])
def test_a_failed_write_leaves_the_previous_version(store, broken_part):
    old = doc()
    store.put(old)
    new = doc(text="# New\n\nnew text")
    if broken_part == "chunks":
        # A chunk id that collides inside the document makes the insert fail mid-way.
        bad = dataclasses.replace(new, chunks=(new.chunks[0], new.chunks[0]))
        error: type[Exception] = (
            psycopg.errors.UniqueViolation if is_pg(store) else sqlite3.IntegrityError
        )
    else:
        # The pages go in last: the document row, sections and chunks are already written.
        bad = dataclasses.replace(new, page_texts=("ok", _Unstorable()))  # type: ignore[arg-type]
        error = TypeError if is_pg(store) else sqlite3.ProgrammingError
    store.put(old, points_of(old))
    with pytest.raises(error):
        store.put(bad, points_of(bad, ids=(1, 2, 3, 4)))
    assert store.get_document("t1", "guide") == old
    assert store.document_generation("t1", "guide") == old.generation
    assert set(store.points_by_ids("t1", [0, 1, 2, 3, 4, 2**63])) == {0, 2**63}


def test_a_failed_points_insert_leaves_nothing_of_a_new_document(store):
    d = doc(doc_id="fresh")
    listed = points_of(d, ids=(5, 6, 7, 8))
    listed[3] = listed[3]._replace(point_id=5)  # a duplicate key: the points insert fails
    error = psycopg.errors.UniqueViolation if is_pg(store) else sqlite3.IntegrityError
    with pytest.raises(error):
        store.put(d, listed)
    assert store.get_document("t1", "fresh") is None
    assert store.list_documents("t1") == [] and store.tenants() == []
    assert store.points_by_ids("t1", [5, 6, 7, 8]) == {}
    assert store.chunks_by_ids("t1", [("fresh", c.chunk_id) for c in d.chunks]) == {}
    store.put(d, points_of(d, ids=(5, 6, 7, 8)))  # the store is fine afterwards
    assert set(store.points_by_ids("t1", [5, 6, 7, 8])) == {5, 6, 7, 8}


def test_readers_see_one_whole_version_while_a_writer_replaces_it(open_store):
    """Readers in threads (their own store, as the ToolsProxy has) never see part of a
    version: every read sees the points and chunks of one committed version whole."""
    writer, reader = open_store(), open_store()
    versions = [doc(text=f"# Guide\n\nVersion {i} text.\n\n## Part\n\nMore {i}.") for i in range(2)]
    ids = [tuple(range(100 * i + 1, 100 * i + 5)) for i in range(2)]
    chunk_lists = [list(v.chunks) for v in versions]
    writer.put(versions[0], points_of(versions[0], ids=ids[0]))
    stop = threading.Event()
    problems: list[str] = []
    reads = [0]

    def read() -> None:
        while not stop.is_set():
            found = reader.points_by_ids("t1", [*ids[0], *ids[1]])
            if set(found) not in (set(ids[0]), set(ids[1])):
                problems.append(f"points of no one version: {sorted(found)}")
            if len({p.generation for p in found.values()}) != 1:
                problems.append("points of two generations")
            if reader.chunk_range("t1", "guide", 0, 100) not in chunk_lists:
                problems.append("chunks of no one version")
            if reader.document_generation("t1", "guide") not in {v.generation for v in versions}:
                problems.append("no document mid-replace")
            reads[0] += 1

    threads = [threading.Thread(target=read) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for n in range(1, 41):
            writer.put(versions[n % 2], points_of(versions[n % 2], ids=ids[n % 2]))
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert problems == []
    assert reads[0] > 0


def test_nul_and_escapes_round_trip_in_every_field(store):
    """PostgreSQL text cannot hold NUL: its store escapes it (postgres_store._enc); every
    string field, ids and tenant included, comes back as written on both stores."""
    odd = "a\x00b\x1b0c\x1b1\x1b"
    d = doc(tenant=f"t{odd}", doc_id=f"d{odd}", metadata={"k": odd}, tags=(odd,))
    d = dataclasses.replace(
        d,
        title=odd,
        product=odd,
        version=odd,
        source=odd,
        sections=tuple(dataclasses.replace(s, title=odd, summary=odd) for s in d.sections),
        chunks=tuple(dataclasses.replace(c, chunk_id=c.chunk_id + odd) for c in d.chunks),
        page_texts=tuple(p + odd for p in d.page_texts),
    )
    listed = points_of(d)
    store.put(d, listed)
    t = d.tenant_id
    assert store.get_document(t, d.doc_id) == d
    assert store.tenants() == [t]
    assert store.list_documents(t)[0].doc_id == d.doc_id
    assert store.generations(t) == {d.doc_id: d.generation}
    assert store.points_by_ids(t, [p.point_id for p in listed]) == {p.point_id: p for p in listed}
    keys = [(d.doc_id, c.chunk_id) for c in d.chunks]
    assert store.chunks_by_ids(t, keys) == dict(zip(keys, d.chunks, strict=True))
    assert store.chunk_by_id(t, d.doc_id, d.chunks[0].chunk_id) == d.chunks[0]
    assert {(tt, dd, title) for tt, dd, title, _ in store.all_chunks()} == {(t, d.doc_id, odd)}
    assert store.pages_text(t, d.doc_id, 1, 1)[0].text == d.page_texts[0]
    assert store.complete_document(t, d.doc_id, d.generation, lambda: listed, d.tokens) is True
    assert store.delete(t, d.doc_id) is True
    store.put(dataclasses.replace(d, doc_id="plain"))
    assert store.incomplete_documents() == [(t, "plain", d.generation)]
    # The escaped form is not confused with the characters it stands for.
    assert store.get_document(t.replace("\x00", "\x1b0"), "plain") is None


def test_a_read_only_store_reads_what_a_writer_wrote_even_before_the_schema(open_store):
    reader = open_store(read_only=True)  # nothing written yet: no tables
    assert reader.list_documents("t1") == [] and reader.get_document("t1", "guide") is None
    assert reader.points_by_ids("t1", [1]) == {} and reader.tenants() == []
    reader.ping()
    open_store().put(doc(), points_of(doc()))
    assert reader.get_document("t1", "guide") == doc()
    assert len(reader.points_by_ids("t1", [p.point_id for p in points_of(doc())])) == 4


def test_sqlite_an_old_store_file_is_migrated(tmp_path):
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
    assert store.list_documents("t1")[0].tokens == 0  # not counted: to be completed
    assert store.incomplete_documents() == [("t1", "old", "")]
    store.put(doc())
    assert store.document_generation("t1", "guide") == doc().generation


# -- the list of a document's index points (search reads its candidates from it) ------------


def points_of(d, ids=(0, 2**63 - 1, 2**63, 2**64 - 1)):
    """Stored points of document `d` with ids at the ends of the u64 range and the middle
    (SQLite stores signed 64-bit integers)."""
    kinds = ("chunk", "chunk", "section", "doc")
    return [
        StoredPoint(pid, d.doc_id, f"s{i}", f"c{i}" if kind == "chunk" else "", kind, i, i + 1,
                    i + 2, 10 * i, d.generation)
        for i, (pid, kind) in enumerate(zip(ids, kinds, strict=True))
    ]  # fmt: skip


def test_points_are_written_with_the_document_and_read_by_id_under_its_tenant(store):
    d = doc()
    listed = points_of(d)
    store.put(d, listed)
    ids = [p.point_id for p in listed]
    got = store.points_by_ids("t1", ids + ids[:1] + [12345])
    assert got == {p.point_id: p for p in listed}  # every field; u64 ends round-trip
    assert all(type(k) is int and 0 <= k < 2**64 for k in got)
    assert store.points_by_ids("t2", ids) == {}  # another tenant: nothing, by any id
    assert store.points_by_ids("t1", []) == {}
    assert store.incomplete_documents() == []
    # A new version replaces the list; a delete removes it.
    new = doc(text="# Guide\n\nNew text.")
    assert new.generation != d.generation
    store.put(new, points_of(new, ids=(7, 8, 9, 10)))
    assert set(store.points_by_ids("t1", [*ids, 7, 8, 9, 10])) == {7, 8, 9, 10}
    store.delete("t1", "guide")
    assert store.points_by_ids("t1", [7, 8, 9, 10]) == {}


def test_points_by_ids_reads_more_than_one_batch_of_500(store):
    d = doc()
    many = [
        StoredPoint(2**64 - 1 - i, d.doc_id, "s", f"c{i}", "chunk", i, 1, 1, 5, d.generation)
        for i in range(1201)
    ]
    store.put(d, many)
    wanted = [p.point_id for p in many] + list(range(1, 300))  # 1,500 ids, 299 unknown
    assert store.points_by_ids("t1", wanted) == {p.point_id: p for p in many}


@pytest.mark.parametrize("field", ["doc_id", "generation", "point_id"])
def test_a_point_that_does_not_belong_to_the_document_is_refused_and_nothing_written(store, field):
    old = doc()
    store.put(old, points_of(old))
    new = doc(text="# Guide\n\nNew text.")
    bad = {"doc_id": "other", "generation": "g-other", "point_id": 2**64}[field]
    listed = points_of(new, ids=(1, 2, 3, 4))
    listed[1] = listed[1]._replace(**{field: bad})
    with pytest.raises(ValueError):
        store.put(new, listed)
    assert store.get_document("t1", "guide") == old
    assert set(store.points_by_ids("t1", [p.point_id for p in points_of(old)])) == {
        p.point_id for p in points_of(old)
    }


def _not_listed_again() -> list[StoredPoint]:
    raise AssertionError("a document's point list was computed although the store holds one")


def test_complete_document_writes_a_stored_generation_only(store):
    d, other = doc(), doc(tenant="t2", doc_id="notes")
    store.put(d)  # as a store written before the points list existed
    store.put(dataclasses.replace(other, tokens=0), points_of(other))  # ... or the token count
    assert other.tokens > 0 and store.list_documents("t2")[0].tokens == 0
    assert store.incomplete_documents() == [
        ("t1", "guide", d.generation), ("t2", "notes", other.generation)
    ]  # fmt: skip
    complete = store.complete_document
    assert complete("t1", "guide", "another-generation", lambda: points_of(d), d.tokens) is False
    assert complete("t1", "missing", d.generation, lambda: points_of(d), d.tokens) is False
    assert store.points_by_ids("t1", [0]) == {}
    assert complete("t1", "guide", d.generation, lambda: points_of(d), d.tokens) is True
    assert (
        complete("t1", "guide", d.generation, lambda: points_of(d), d.tokens) is True
    )  # idempotent
    assert len(store.points_by_ids("t1", [p.point_id for p in points_of(d)])) == 4
    assert store.incomplete_documents() == [("t2", "notes", other.generation)]
    # a list already written is the ingest's own: not listed again, only the count is added
    assert complete("t2", "notes", other.generation, _not_listed_again, other.tokens) is True
    assert store.incomplete_documents() == []
    assert len(store.points_by_ids("t2", [p.point_id for p in points_of(other)])) == 4
    assert store.list_documents("t2")[0].tokens == other.tokens
    assert store.get_document("t2", "notes") == other


# -- any text and id comes back exactly: the candidates packed as JSON, the hit texts by row ------

AWKWARD_TEXTS = [
    "",
    "nul \x00 inside",
    'quotes " and \\ backslashes \\" and /slashes/',
    "controls \x01\x07\x08\t\n\r\x1f\x7f and \u2028\u2029 separators",
    "Кириллица, 中文, עברית, emoji 🧭🏳️‍🌈, combining é",
    "\ufeffbom and \uffff and \U0010ffff",
    '[1, 2] {"json": true} null',
    "escapes \x1b0 \x1b1 \x1b\x00 \x00\x1b \x1b\x1b0",  # the PostgreSQL store's own escape
]


@pytest.mark.parametrize("text", AWKWARD_TEXTS)
def test_chunks_by_ids_returns_any_text_and_id_exactly_as_stored(store, text):
    d = doc()
    odd = dataclasses.replace(d.chunks[0], chunk_id=f'guide:"{text}"', text=text)
    d = dataclasses.replace(d, chunks=(odd, *d.chunks[1:]))
    store.put(d)
    got = store.chunks_by_ids("t1", [("guide", odd.chunk_id), ("guide", d.chunks[1].chunk_id)])
    assert got[("guide", odd.chunk_id)] == odd
    assert got[("guide", odd.chunk_id)] == store.chunk_by_id("t1", "guide", odd.chunk_id)
    assert got[("guide", d.chunks[1].chunk_id)] == d.chunks[1]
    assert type(got[("guide", odd.chunk_id)].tokens) is int


@pytest.mark.parametrize("text", AWKWARD_TEXTS)
def test_points_by_ids_returns_any_id_text_exactly_as_stored(store, text):
    d = doc()
    odd = StoredPoint(2**64 - 2, d.doc_id, text, text, "chunk", -(2**63), 0, 2**31, 2**62,
                      d.generation)  # fmt: skip
    store.put(d, [odd])
    assert store.points_by_ids("t1", [odd.point_id]) == {odd.point_id: odd}


def test_sqlite_without_json_functions_is_refused_with_the_reason():
    class NoJson:
        def execute(self, sql, *args):
            raise sqlite3.OperationalError("no such function: json_array")

    with pytest.raises(StoreUnavailableError, match=r"no JSON functions .*3\.38"):
        require_json_functions(NoJson())  # type: ignore[arg-type]
    require_json_functions(sqlite3.connect(":memory:"))  # this one has them


def test_listings_are_in_code_point_order_whatever_the_ids_hold(store):
    # PostgreSQL keeps NUL escaped (ESC '0'); sorting the escaped form put "a\0" after "a\x1a".
    ids = ["ab", "a\x1b\x00", "a\x1a", "a\x00", "a\x1b", "a\x01"]
    for doc_id in ids:
        store.put(doc(doc_id=doc_id))
    tenants = ["t\x05", "t1", "t\x00", "t"]
    for tenant in tenants:
        store.put(doc(tenant=tenant, doc_id="x"))
    listed = [d.doc_id for d in store.list_documents("t1")]
    if is_pg(store):  # paged in SQL, by the stored (escaped) id; the API's ids hold neither
        assert sorted(listed) == sorted([*ids, "x"]) and len(set(listed)) == len(listed)
    else:
        assert listed == sorted([*ids, "x"])
    expected = sorted([("t1", d) for d in [*ids, "x"]] + [(t, "x") for t in tenants if t != "t1"])
    assert [(t, d) for t, d, _ in store.incomplete_documents()] == expected
    assert list(dict.fromkeys((t, d) for t, d, _, _ in store.all_chunks())) == expected
    ords = [c.ord for t, d, _, c in store.all_chunks() if (t, d) == ("t1", "ab")]
    assert ords == sorted(ords) and len(ords) > 1
    assert store.tenants() == sorted(tenants)


def test_listings_page_in_doc_id_order_inside_the_tenant(store):
    ids = ["b", "a", "c-2", "c-10", "Z", "é", "d.1"]
    for doc_id in ids:
        store.put(doc(doc_id=doc_id))
    store.put(doc(tenant="t2", doc_id="bb"))  # another tenant's, between two of t1's
    everything = [d.doc_id for d in store.list_documents("t1")]
    assert everything == sorted(ids)  # code point order: "Z" < "a", "c-10" < "c-2", "é" last
    assert [d.doc_id for d in store.list_summaries("t1")] == everything
    assert [d.doc_id for d in store.list_documents("t1", limit=3)] == everything[:3]
    pages, after = [], ""
    while True:
        page = [d.doc_id for d in store.list_summaries("t1", after=after, limit=2)]
        if not page:
            break
        assert len(page) <= 2
        pages.append(page)
        after = page[-1]
    assert [i for p in pages for i in p] == everything and len(pages) == 4
    assert [d.doc_id for d in store.list_summaries("t1", after="b", limit=0)] == []
    # Only the documents asked for, still inside the tenant and still paged.
    wanted = ["c-2", "a", "bb", "missing", "a"]
    assert [d.doc_id for d in store.list_summaries("t1", doc_ids=wanted)] == ["a", "c-2"]
    assert [d.doc_id for d in store.list_summaries("t1", doc_ids=wanted, after="a")] == ["c-2"]
    assert [d.doc_id for d in store.list_summaries("t1", doc_ids=wanted, limit=1)] == ["a"]
    assert store.list_summaries("t1", doc_ids=[]) == []
    assert [d.doc_id for d in store.list_summaries("t2", after="a")] == ["bb"]
    listed = store.list_summaries("t1", doc_ids=["a"])[0]
    assert listed == store.list_summaries("t1", after="Z")[0]  # the same fields either way


def test_replace_answers_the_generation_it_replaced(store):
    v1 = doc()
    v2 = doc(text=MD + "\n\nOne more line.\n")
    assert v1.generation != v2.generation
    assert store.replace(v1) is None  # nothing there before
    assert store.replace(v2) == v1.generation
    assert store.replace(v2) == v2.generation  # the same again: replaced itself
    assert store.document_generation("t1", "guide") == v2.generation
    assert store.replace(doc(tenant="t2")) is None  # another tenant's id is another document
    assert store.delete("t1", "guide") is True and store.replace(v1) is None


def test_summaries_list_what_the_documents_list_with_each_ones_counts(store):
    short = doc(doc_id="other", text="# Other\n\nShort.\n", metadata={"topic": "x"})
    for d in (doc(), short, doc(tenant="t2", doc_id="theirs")):
        store.put(d)
    summaries = store.list_summaries("t1")
    assert [s.doc_id for s in summaries] == [d.doc_id for d in store.list_documents("t1")]
    for s, d in zip(summaries, (doc(), short), strict=True):
        assert (s.title, s.pages, s.source, s.generation, dict(s.metadata), s.tokens) == (
            d.title, d.pages, d.source, d.generation, dict(d.metadata), d.tokens,
        )  # fmt: skip
        assert (s.sections, s.chunks, s.chars) == (len(d.sections), len(d.chunks), d.chars)
    assert summaries[0].chunks != summaries[1].chunks
    # The same selection as list_documents: ids, a start after one, a limit.
    wanted = ["other", "theirs", "missing", "other"]
    assert [s.doc_id for s in store.list_summaries("t1", doc_ids=wanted)] == ["other"]
    assert [s.doc_id for s in store.list_summaries("t1", after="guide")] == ["other"]
    assert [s.doc_id for s in store.list_summaries("t1", limit=1)] == ["guide"]
    assert store.list_summaries("t1", doc_ids=[]) == [] == store.list_summaries("t1", limit=0)
    assert [s.doc_id for s in store.list_summaries("t2")] == ["theirs"]


def test_sqlite_reads_do_not_queue_behind_one_connection(tmp_path):
    from services.docstore import sqlite_store

    store = SqliteDocumentStore(tmp_path / "s.sqlite")
    store.put(doc())
    held = [store._reader() for _ in range(sqlite_store.READERS - 1)]  # slow reads in flight
    assert len({id(c) for c in held}) == len(held)
    assert store.document_generation("t1", "guide") == doc().generation  # one more: served
    held.append(store._reader())  # every connection busy now: the next read waits for one
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (store.list_documents("t1"), done.set()))
    waiter.start()
    assert not done.wait(0.2)
    store._release(held.pop())
    assert done.wait(10)
    waiter.join()
    for conn in held:
        store._release(conn)
    assert len(store._all_readers) == sqlite_store.READERS  # bounded
    store.close()


_MANY_ROWS = (
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<2000000) SELECT x FROM c"
)


def test_sqlite_close_waits_for_a_read_in_flight_and_refuses_later_ones(tmp_path):
    # close() closed the pooled connections under a read stepping through its rows:
    # sqlite3.ProgrammingError, an INTERNAL at the gRPC edge during a graceful stop.
    store = SqliteDocumentStore(tmp_path / "s.sqlite")
    store.put(doc())
    outcome: list[object] = []

    def read() -> None:
        try:
            outcome.append(len(store._query(_MANY_ROWS, ())))
        except BaseException as exc:  # reported below
            outcome.append(exc)

    # The read takes an idle pooled connection (none is in use now): each tells once SQLite
    # is stepping through a statement on it.
    stepping = threading.Event()

    def progress() -> int:
        stepping.set()
        return 0  # go on

    for conn in store._all_readers:
        conn.set_progress_handler(progress, 1000)
    reader = threading.Thread(target=read)
    reader.start()
    assert stepping.wait(60), f"the read never started: {outcome}"
    store.close()
    reader.join(60)
    assert outcome == [2_000_000]
    with pytest.raises(StoreUnavailableError):
        store.list_documents("t1")


def test_sqlite_close_does_not_wait_for_ever(tmp_path):
    store = SqliteDocumentStore(tmp_path / "s.sqlite")
    held = store._reader()  # a read that never ends
    started = time.monotonic()
    store.close(wait_s=0.2)
    assert time.monotonic() - started < 5
    with pytest.raises(StoreUnavailableError):
        store._run_query(held, "SELECT 1", ())
