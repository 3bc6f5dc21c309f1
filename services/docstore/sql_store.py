"""The document store's SQL and interface, once for both databases (`DocumentStore` in
services/docstore/store.py names this class).

`SqlDocumentStore` holds every query and write; a subclass supplies the dialect and the
connections: how a read runs alone (`_read`) and in a read snapshot (`_read_transaction`,
`_read_in`), how a write transaction is taken (`_write`, `_execute`, `_executemany`), its
placeholders (`_sql`), a membership test (`_member`), the id collation for ordering
(`ID_ORDER`), how strings are stored (`_enc` / `_dec`, identity unless the database cannot
hold every string), and the two batched lookups a search makes (`points_by_ids`, and
`_chunks_by_keys` under `chunks_by_ids`), whose fastest form differs per database.

Every read goes through `_query`, which runs it in the calling thread's `snapshot` when
there is one: several reads that make one answer (`get_document`, a document tool's reads)
see one committed state, never part of two versions of a document a re-ingest replaced
between them.

SQL here is written with `?` placeholders; `_sql` turns them into the dialect's.
"""

from __future__ import annotations

import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from typing import Any, TypeVar

from services.docstore.model import (
    MAX_POINT_ID,
    TO_THE_END,
    Chunk,
    Document,
    DocumentSummary,
    Page,
    Section,
    StoredPoint,
)

T = TypeVar("T")
Row = Sequence[Any]
ChunkKey = TypeVar("ChunkKey", tuple[str, str], tuple[str, str, str])
"""A chunk asked for by (doc_id, chunk_id), or by (doc_id, chunk_id, generation): then only
while the store holds that generation of its document."""
KeyRead = tuple[str, str, str | None]
"""(doc_id, chunk_id, generation or None for any) as a dialect's `_chunks_by_keys` reads it."""

DOC_COLUMNS = "doc_id, title, source, product, version, tags, pages, generation, metadata, tokens"
"""The columns a Document's own fields are read from, in this order."""
SUMMARY_COLUMNS = (
    f"{DOC_COLUMNS},"
    " (SELECT count(*) FROM sections s"
    "  WHERE s.tenant_id=documents.tenant_id AND s.doc_id=documents.doc_id),"
    " (SELECT count(*) FROM chunks c"
    "  WHERE c.tenant_id=documents.tenant_id AND c.doc_id=documents.doc_id),"
    " chars"
)
"""DOC_COLUMNS, then the document's section count, chunk count and size in characters."""
CHUNK_COLUMNS = "doc_id, chunk_id, section_id, ord, text, tokens, page_start, page_end"
"""The columns a Chunk is read from, in its fields' order."""
SECTION_COLUMNS = (
    "section_id, ord, title, summary, page_start, page_end, first_chunk_ord, last_chunk_ord"
)
"""The columns a Section is read from, in its fields' order."""
POINT_COLUMNS = (
    "point_id, doc_id, section_id, chunk_id, kind, ord, page_start, page_end, tokens, generation"
)
"""The columns of a StoredPoint, in its fields' order."""

_U64 = MAX_POINT_ID + 1
_I64_MAX = (1 << 63) - 1


def to_signed64(point_id: int) -> int:
    """A u64 point id as a signed 64-bit integer (two's complement), as both stores keep it."""
    if not 0 <= point_id < _U64:
        raise ValueError(f"point_id {point_id!r} is not an integer in [0, 2^64)")
    return point_id - _U64 if point_id > _I64_MAX else point_id


def from_signed64(stored: int) -> int:
    """The u64 point id a stored signed 64-bit integer stands for (`to_signed64`'s inverse)."""
    return stored % _U64


def check_points_of(doc_id: str, generation: str, points: Sequence[StoredPoint]) -> None:
    """Refuse (ValueError) points of another document or generation than the one written."""
    for p in points:
        if p.doc_id != doc_id or p.generation != generation:
            raise ValueError(
                f"point {p.point_id} is of {p.doc_id!r}/{p.generation!r}, "
                f"not of the document written ({doc_id!r}/{generation!r})"
            )


def _same(text: str) -> str:
    return text


def _generation(key: tuple[str, ...]) -> str | None:
    """The generation a ChunkKey names, None when it names none."""
    return key[2] if len(key) > 2 else None


class SqlDocumentStore(ABC):
    """The queries and writes of a document store; a subclass is one database's dialect."""

    kind: str
    """ "sqlite" or "postgresql" (health details)."""
    ID_ORDER = ""
    """What follows an id column in ORDER BY and comparisons for code point order."""
    _enc: Callable[[str], str] = staticmethod(_same)
    """A string as stored."""
    _dec: Callable[[str], str] = staticmethod(_same)
    """A stored string as it was written (`_enc`'s inverse)."""

    def __init__(self) -> None:
        self._pinned = threading.local()
        """`.snapshot`: what `_read_transaction` gave this thread's `snapshot`, None outside one."""

    # --- the dialect ----------------------------------------------------------------------------

    @abstractmethod
    def _read(self, sql: str, args: Sequence[object]) -> list[Row]:
        """The rows of one read (`?` placeholders) in a transaction of its own, on a connection
        taken for it; [] before the schema exists."""

    @abstractmethod
    def _read_transaction(self) -> AbstractContextManager[Any]:
        """A connection held for the block in one read-only transaction whose reads all see
        the store as its first read did (`snapshot`); what it gives goes to `_read_in`."""

    @abstractmethod
    def _read_in(self, snapshot: Any, sql: str, args: Sequence[object]) -> list[Row]:
        """`_read` inside `snapshot` (what `_read_transaction` gave)."""

    @abstractmethod
    def _write(self, tenant_id: str, doc_id: str, work: Callable[[Any], T]) -> T:
        """`work(connection)` in one write transaction, serialised with every other write of
        the document (tenant and doc id as stored)."""

    def _sql(self, sql: str) -> str:
        """`sql` with the dialect's placeholders."""
        return sql

    def _execute(self, conn: Any, sql: str, args: Sequence[object] = ()) -> Any:
        """One statement inside `_write`; the cursor."""
        return conn.execute(self._sql(sql), args)

    def _executemany(self, conn: Any, sql: str, rows: Sequence[Sequence[object]]) -> None:
        """One statement per row inside `_write`."""
        if rows:
            conn.executemany(self._sql(sql), rows)

    def _member(self, column: str, values: Sequence[object]) -> tuple[str, list[object]]:
        """`column` among `values` (not empty): the condition and its arguments."""
        return f"{column} IN ({','.join(['?'] * len(values))})", list(values)

    @abstractmethod
    def points_by_ids(self, tenant_id: str, point_ids: Collection[int]) -> dict[int, StoredPoint]:
        """The tenant's stored points among `point_ids`, by id; ids of points the store does
        not hold (another tenant's, an uncommitted or replaced generation's) are absent."""

    def chunks_by_ids(self, tenant_id: str, keys: Sequence[ChunkKey]) -> dict[ChunkKey, Chunk]:
        """The tenant's chunks by key (ChunkKey), each under the key it was asked by; missing
        keys are absent, and so is a key naming another generation than the one stored.

        A search reads its candidates' texts by their generation: between its read of the
        candidates and of their texts a re-ingest may commit, whose chunks have the same ids
        and other texts, sections and pages. The generation is compared in the one query that
        reads the text, against the document row committed with it.
        """
        asked = {(k[0], k[1], _generation(k)): k for k in keys}
        found = self._chunks_by_keys(tenant_id, list(asked)) if asked else {}
        return {asked[key]: chunk for key, chunk in found.items()}

    @abstractmethod
    def _chunks_by_keys(self, tenant_id: str, keys: Sequence[KeyRead]) -> dict[KeyRead, Chunk]:
        """`chunks_by_ids` with every key in KeyRead's form (distinct, at least one)."""

    @abstractmethod
    def close(self) -> None:
        """Close the connections."""

    # --- reads in one snapshot -------------------------------------------------------------------

    def _query(self, sql: str, args: Sequence[object] = ()) -> list[Row]:
        """The rows of one read (`?` placeholders); [] before the schema exists. In this
        thread's `snapshot` when it has one, else alone."""
        pinned = getattr(self._pinned, "snapshot", None)
        return self._read(sql, args) if pinned is None else self._read_in(pinned, sql, args)

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Every read this thread makes of the store inside the block sees one committed
        state: the one its first read saw. A write committed meanwhile (a re-ingest, a
        delete) is not seen at all, so reads that make one answer (`get_document`, a
        document tool's document, then its chunks or pages) are of one version whole.

        One connection in one read-only transaction for the block (SQLite: BEGIN … COMMIT,
        which WAL lets writers commit beside; PostgreSQL: REPEATABLE READ, READ ONLY). It is
        held until the block ends, so keep the block to the reads, in the worker thread that
        makes them, never across an await, and write nothing in it (a store of one connection,
        a read-only or in-memory SQLite, holds that one: other threads' reads wait for the
        block). Reads of other threads are not in it; a block inside one is the outer one.
        """
        if getattr(self._pinned, "snapshot", None) is not None:
            yield
            return
        with self._read_transaction() as pinned:
            self._pinned.snapshot = pinned
            try:
                yield
            finally:
                self._pinned.snapshot = None

    # --- rows ---------------------------------------------------------------------------------

    def _chunk(self, r: Row) -> Chunk:
        """A Chunk from a row of CHUNK_COLUMNS."""
        d = self._dec
        return Chunk(d(r[0]), d(r[1]), d(r[2]), r[3], d(r[4]), r[5], r[6], r[7])

    def _point(self, r: Row) -> StoredPoint:
        """A StoredPoint from a row of POINT_COLUMNS."""
        d = self._dec
        return StoredPoint(from_signed64(r[0]), d(r[1]), d(r[2]), d(r[3]), d(r[4]),
                           r[5], r[6], r[7], r[8], d(r[9]))  # fmt: skip

    def _document(self, tenant_id: str, r: Row) -> Document:
        """A Document (no sections, chunks or pages) from a row of DOC_COLUMNS."""
        d = self._dec
        return Document(
            tenant_id=tenant_id,
            doc_id=d(r[0]),
            title=d(r[1]),
            source=d(r[2]),
            product=d(r[3]),
            version=d(r[4]),
            tags=tuple(json.loads(r[5])),
            pages=r[6],
            generation=d(r[7]),
            metadata=json.loads(r[8]),
            tokens=int(r[9] or 0),
        )

    # --- writes -------------------------------------------------------------------------------

    def ping(self) -> None:
        """Raise if the store cannot be read."""
        self._query("SELECT 1")

    def put(self, doc: Document, points: Sequence[StoredPoint] = ()) -> bool:
        """Write (or replace) a document atomically, with its index `points` (the ones search
        may show: StoredPoint); True when an older version was replaced."""
        return self.replace(doc, points) is not None

    def replace(self, doc: Document, points: Sequence[StoredPoint] = ()) -> str | None:
        """`put`, answering the generation it replaced (None when there was none), read in
        the same transaction: another writer may have committed since the caller looked."""
        e = self._enc
        t, d = e(doc.tenant_id), e(doc.doc_id)

        def work(conn: Any) -> str | None:
            replaced = self._delete(conn, t, d)
            self._insert_points(conn, t, doc.doc_id, doc.generation, points)
            self._execute(
                conn,
                "INSERT INTO documents (tenant_id, doc_id, title, source, product, version, tags,"
                " pages, chars, generation, metadata, tokens) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    t, d, e(doc.title), e(doc.source), e(doc.product), e(doc.version),
                    json.dumps(list(doc.tags)), doc.pages, doc.chars, e(doc.generation),
                    json.dumps(dict(doc.metadata), ensure_ascii=False, sort_keys=True),
                    doc.tokens,
                ),
            )  # fmt: skip
            self._executemany(
                conn,
                f"INSERT INTO sections (tenant_id, doc_id, {SECTION_COLUMNS})"
                " VALUES (?,?,?,?,?,?,?,?,?,?)",
                [
                    (
                        t, d, e(s.section_id), s.ord, e(s.title), e(s.summary),
                        s.page_start, s.page_end, s.first_chunk_ord, s.last_chunk_ord,
                    )
                    for s in doc.sections
                ],
            )  # fmt: skip
            self._executemany(
                conn,
                "INSERT INTO chunks (tenant_id, doc_id, ord, chunk_id, section_id, text, tokens,"
                " page_start, page_end) VALUES (?,?,?,?,?,?,?,?,?)",
                [
                    (
                        t, d, c.ord, e(c.chunk_id), e(c.section_id), e(c.text),
                        c.tokens, c.page_start, c.page_end,
                    )
                    for c in doc.chunks
                ],
            )  # fmt: skip
            self._executemany(
                conn,
                "INSERT INTO pages (tenant_id, doc_id, page, text) VALUES (?,?,?,?)",
                [(t, d, number, e(text)) for number, text in enumerate(doc.page_texts, start=1)],
            )
            if replaced is not None:
                # Last: a concurrent replace in the tenant waits on this row only to commit.
                self._execute(
                    conn,
                    "INSERT INTO replacements (tenant_id, replaced) VALUES (?, 1) ON CONFLICT"
                    " (tenant_id) DO UPDATE SET replaced = replacements.replaced + 1",
                    (t,),
                )
            return replaced

        return self._write(t, d, work)

    def delete(self, tenant_id: str, doc_id: str) -> bool:
        """Delete a document with its sections, chunks and pages; True when it existed."""
        t, d = self._enc(tenant_id), self._enc(doc_id)
        return self._write(t, d, lambda conn: self._delete(conn, t, d) is not None)

    def _delete(self, conn: Any, t: str, d: str) -> str | None:
        """Delete one document (tenant and doc id as stored); the generation it had, None when
        there was none."""
        gone = self._execute(
            conn,
            "DELETE FROM documents WHERE tenant_id=? AND doc_id=? RETURNING generation",
            (t, d),
        ).fetchall()
        for table in ("sections", "chunks", "pages", "points"):
            self._execute(conn, f"DELETE FROM {table} WHERE tenant_id=? AND doc_id=?", (t, d))
        return self._dec(gone[0][0]) if gone else None

    def _insert_points(
        self, conn: Any, t: str, doc_id: str, generation: str, points: Sequence[StoredPoint]
    ) -> None:
        check_points_of(doc_id, generation, points)
        e = self._enc
        self._executemany(
            conn,
            f"INSERT INTO points (tenant_id, {POINT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            [
                (t, to_signed64(p.point_id), e(p.doc_id), e(p.section_id), e(p.chunk_id),
                 e(p.kind), p.ord, p.page_start, p.page_end, p.tokens, e(p.generation))
                for p in points
            ],
        )  # fmt: skip

    def complete_document(
        self,
        tenant_id: str,
        doc_id: str,
        generation: str,
        points: Callable[[], Sequence[StoredPoint]],
        tokens: int,
    ) -> bool:
        """Write what a store of an older version left out of a document whose stored
        generation is `generation`: its point list (`points()`, called only when it has none)
        and its token count (the retrieval service completes them at start); False, writing
        nothing, when the store holds another generation or none."""
        t, d = self._enc(tenant_id), self._enc(doc_id)

        def work(conn: Any) -> bool:
            row = self._execute(
                conn, "SELECT generation FROM documents WHERE tenant_id=? AND doc_id=?", (t, d)
            ).fetchone()
            if row is None or self._dec(row[0]) != generation:
                return False
            listed = self._execute(
                conn, "SELECT 1 FROM points WHERE tenant_id=? AND doc_id=? LIMIT 1", (t, d)
            ).fetchone()
            if listed is None:  # a list, once written, is the ingest's own: kept
                self._insert_points(conn, t, doc_id, generation, points())
            self._execute(
                conn, "UPDATE documents SET tokens=? WHERE tenant_id=? AND doc_id=?", (tokens, t, d)
            )
            return True

        return self._write(t, d, work)

    # --- reads --------------------------------------------------------------------------------

    def incomplete_documents(self) -> list[tuple[str, str, str]]:
        """(tenant_id, doc_id, generation) of every document a store of an older version left
        without its point list or its token count (`complete_document`)."""
        rows = self._query(
            "SELECT d.tenant_id, d.doc_id, d.generation FROM documents d"
            " WHERE (d.tokens=0 AND d.chars>0) OR NOT EXISTS"
            " (SELECT 1 FROM points p WHERE p.tenant_id=d.tenant_id AND p.doc_id=d.doc_id)"
        )
        # Ordered here, by the ids as written: a stored (escaped) form may sort otherwise.
        d = self._dec
        return sorted((d(r[0]), d(r[1]), d(r[2])) for r in rows)

    def list_documents(self, tenant_id: str, *, limit: int | None = None) -> list[Document]:
        """The tenant's documents without sections, chunks and page texts, in `list_summaries`
        order, at most `limit`."""
        rows = self._listing(DOC_COLUMNS, tenant_id, "", limit, None)
        return [self._document(tenant_id, r) for r in rows]

    def list_summaries(
        self,
        tenant_id: str,
        *,
        after: str = "",
        limit: int | None = None,
        doc_ids: Collection[str] | None = None,
    ) -> list[DocumentSummary]:
        """The tenant's documents by doc_id (code point order of the stored ids): only those
        after `after` when it is given, only `doc_ids` when they are given, at most `limit`.
        Each comes with its section and chunk counts and its size in characters, read in the
        same query as its own fields, so all of them are of the one generation stored."""
        rows = self._listing(SUMMARY_COLUMNS, tenant_id, after, limit, doc_ids)
        out = []
        for r in rows:
            doc = self._document(tenant_id, r)
            out.append(
                DocumentSummary(
                    doc.doc_id, doc.title, doc.pages, int(r[10]), int(r[11]), int(r[12] or 0),
                    doc.source, doc.generation, doc.metadata, doc.tokens,
                )
            )  # fmt: skip
        return out

    def _listing(
        self,
        columns: str,
        tenant_id: str,
        after: str,
        limit: int | None,
        doc_ids: Collection[str] | None,
    ) -> list[Row]:
        """`columns` of the documents `list_summaries` describes, in its order."""
        sql = f"SELECT {columns} FROM documents WHERE tenant_id=?"
        args: list[object] = [self._enc(tenant_id)]
        if after:
            sql += f" AND doc_id{self.ID_ORDER} > ?"
            args.append(self._enc(after))
        if doc_ids is not None:
            wanted = sorted({self._enc(d) for d in doc_ids})
            if not wanted:
                return []
            condition, values = self._member("doc_id", wanted)
            sql += " AND " + condition
            args.extend(values)
        sql += f" ORDER BY doc_id{self.ID_ORDER}"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(max(0, limit))
        return self._query(sql, args)

    def document_generation(self, tenant_id: str, doc_id: str) -> str | None:
        """The generation of the stored document, or None when the tenant has no such document."""
        rows = self._query(
            "SELECT generation FROM documents WHERE tenant_id=? AND doc_id=?",
            (self._enc(tenant_id), self._enc(doc_id)),
        )
        return self._dec(rows[0][0]) if rows else None

    def replacements(self, tenant_id: str) -> int:
        """How many times a document of the tenant has been replaced (`replace` of one the
        store held). A search reads it before its index query and again when it dropped
        candidates the store no longer lists: a change means a re-ingest committed in between,
        and its document may be missing from the answer (services/retrieval/engine.py)."""
        rows = self._query(
            "SELECT replaced FROM replacements WHERE tenant_id=?", (self._enc(tenant_id),)
        )
        return int(rows[0][0]) if rows else 0

    def generations(self, tenant_id: str) -> dict[str, str]:
        """doc_id -> generation for every document of the tenant."""
        rows = self._query(
            "SELECT doc_id, generation FROM documents WHERE tenant_id=?", (self._enc(tenant_id),)
        )
        return {self._dec(r[0]): self._dec(r[1]) for r in rows}

    def tenants(self) -> list[str]:
        """Every tenant that has at least one document."""
        return sorted(
            self._dec(r[0]) for r in self._query("SELECT DISTINCT tenant_id FROM documents")
        )

    def pages_text(self, tenant_id: str, doc_id: str, first: int, last: int) -> list[Page]:
        """Pages first..last (1-based, inclusive) of a document that exist, in order."""
        rows = self._query(
            "SELECT page, text FROM pages WHERE tenant_id=? AND doc_id=? AND page BETWEEN ? AND ?"
            " ORDER BY page",
            (self._enc(tenant_id), self._enc(doc_id), first, last),
        )
        return [Page(int(r[0]), self._dec(r[1])) for r in rows]

    def get_document(
        self, tenant_id: str, doc_id: str, *, with_chunks: bool = True
    ) -> Document | None:
        """One document with its sections (and chunks and page texts unless `with_chunks=False`),
        all of one version: read in one `snapshot`."""
        t, d, dec = self._enc(tenant_id), self._enc(doc_id), self._dec
        with self.snapshot():
            rows = self._query(
                f"SELECT {DOC_COLUMNS} FROM documents WHERE tenant_id=? AND doc_id=?", (t, d)
            )
            if not rows:
                return None
            sections = tuple(
                Section(dec(s[0]), s[1], dec(s[2]), dec(s[3]), s[4], s[5], s[6], s[7])
                for s in self._query(
                    f"SELECT {SECTION_COLUMNS} FROM sections WHERE tenant_id=? AND doc_id=?"
                    " ORDER BY ord",
                    (t, d),
                )
            )
            doc = replace(self._document(tenant_id, rows[0]), sections=sections)
            if not with_chunks:
                return doc
            chunks = self.chunk_range(tenant_id, doc_id, 0, TO_THE_END)
            pages = self.pages_text(tenant_id, doc_id, 1, TO_THE_END)
        return replace(doc, chunks=tuple(chunks), page_texts=tuple(p.text for p in pages))

    def chunk_by_id(self, tenant_id: str, doc_id: str, chunk_id: str) -> Chunk | None:
        """One chunk by id, or None."""
        rows = self._query(
            f"SELECT {CHUNK_COLUMNS} FROM chunks WHERE tenant_id=? AND doc_id=? AND chunk_id=?",
            (self._enc(tenant_id), self._enc(doc_id), self._enc(chunk_id)),
        )
        return self._chunk(rows[0]) if rows else None

    def chunk_range(self, tenant_id: str, doc_id: str, first: int, last: int) -> list[Chunk]:
        """Chunks with first <= ord <= last, in order."""
        rows = self._query(
            f"SELECT {CHUNK_COLUMNS} FROM chunks "
            "WHERE tenant_id=? AND doc_id=? AND ord BETWEEN ? AND ? ORDER BY ord",
            (self._enc(tenant_id), self._enc(doc_id), first, last),
        )
        return [self._chunk(r) for r in rows]

    def all_chunks(self) -> Iterator[tuple[str, str, str, Chunk]]:
        """(tenant_id, doc_id, title, chunk) for every chunk, to rebuild an index at start-up."""
        rows = self._query(
            "SELECT c.tenant_id, c.doc_id, d.title, c.doc_id, c.chunk_id, c.section_id, c.ord, "
            "c.text, c.tokens, c.page_start, c.page_end FROM chunks c JOIN documents d "
            "ON d.tenant_id=c.tenant_id AND d.doc_id=c.doc_id"
        )
        # Ordered here, by the ids as written (see incomplete_documents).
        dec = self._dec
        out = [(dec(r[0]), dec(r[1]), dec(r[2]), self._chunk(r[3:])) for r in rows]
        out.sort(key=lambda row: (row[0], row[1], row[3].ord))
        yield from out
