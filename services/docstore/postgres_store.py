"""The PostgreSQL document store: the SQLite store's contract (services/docstore/store.py) on a
server, for deployments where retrieval.md's metadata DB is wanted (DESIGN §2.2).

Same tables and keys as the SQLite store, tenant_id first in every key and in every WHERE;
integers are BIGINT (point ids are u64, kept signed as in SQLite); ids are `COLLATE "C"`, so
listings sort by code point as SQLite's do. A document and its points are written in one
transaction, serialised per document by an advisory lock.

PostgreSQL text cannot hold NUL (U+0000), which SQLite stores and documents may contain.
Every string is written escaped and read back unescaped, so it round-trips exactly:
ESC (U+001B) is written as ESC "1" and NUL as ESC "0" (`_enc` / `_dec`). Only strings with
an ESC or a NUL change; `psql` shows those two characters in that form.

Connections come from a `psycopg_pool.ConnectionPool` (autocommit; a write opens its own
transaction). A lost connection (a server restart) is noticed on use: the pool drops its
broken connections and the call is tried once more; a server that stays down raises
`StoreUnavailableError`, as a locked SQLite file does.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool

from services.docstore.errors import StoreUnavailableError
from services.docstore.model import Chunk, Document, Page, Section, StoredPoint
from services.docstore.store import (
    CHUNK_COLUMNS,
    DEFAULT_POOL_SIZE,
    DEFAULT_TIMEOUT_S,
    DOC_COLUMNS,
    POINT_COLUMNS,
    check_points_of,
    from_signed64,
    mask_url,
    scrub,
    to_signed64,
)

T = TypeVar("T")
Row = tuple[Any, ...]

_ID = 'TEXT COLLATE "C" NOT NULL'
_MIGRATIONS: tuple[tuple[int, str], ...] = (
    (
        1,
        f"""
CREATE TABLE IF NOT EXISTS documents (
  tenant_id {_ID}, doc_id {_ID}, title TEXT NOT NULL, source TEXT NOT NULL,
  product TEXT NOT NULL, version TEXT NOT NULL, tags TEXT NOT NULL, pages BIGINT NOT NULL,
  chars BIGINT NOT NULL, generation TEXT NOT NULL DEFAULT '',
  metadata TEXT NOT NULL DEFAULT '{{}}', PRIMARY KEY (tenant_id, doc_id));
CREATE TABLE IF NOT EXISTS sections (
  tenant_id {_ID}, doc_id {_ID}, section_id {_ID}, ord BIGINT NOT NULL,
  title TEXT NOT NULL, summary TEXT NOT NULL, page_start BIGINT NOT NULL,
  page_end BIGINT NOT NULL, first_chunk_ord BIGINT NOT NULL, last_chunk_ord BIGINT NOT NULL,
  PRIMARY KEY (tenant_id, doc_id, section_id));
CREATE TABLE IF NOT EXISTS chunks (
  tenant_id {_ID}, doc_id {_ID}, ord BIGINT NOT NULL, chunk_id {_ID},
  section_id {_ID}, text TEXT NOT NULL, tokens BIGINT NOT NULL,
  page_start BIGINT NOT NULL, page_end BIGINT NOT NULL,
  PRIMARY KEY (tenant_id, doc_id, ord));
CREATE UNIQUE INDEX IF NOT EXISTS chunks_by_id ON chunks (tenant_id, doc_id, chunk_id);
CREATE TABLE IF NOT EXISTS pages (
  tenant_id {_ID}, doc_id {_ID}, page BIGINT NOT NULL, text TEXT NOT NULL,
  PRIMARY KEY (tenant_id, doc_id, page));
CREATE TABLE IF NOT EXISTS points (
  tenant_id {_ID}, point_id BIGINT NOT NULL, doc_id {_ID},
  section_id {_ID}, chunk_id {_ID}, kind TEXT NOT NULL, ord BIGINT NOT NULL,
  page_start BIGINT NOT NULL, page_end BIGINT NOT NULL, tokens BIGINT NOT NULL,
  generation TEXT NOT NULL, PRIMARY KEY (tenant_id, point_id));
CREATE INDEX IF NOT EXISTS points_by_doc ON points (tenant_id, doc_id);
""",
    ),
)
SCHEMA_VERSION = _MIGRATIONS[-1][0]
_SCHEMA_LOCK = 0x76697369_6F720001  # advisory lock key of schema migrations ("visior" 1)

_ESC = "\x1b"


def _enc(text: str) -> str:
    """`text` as PostgreSQL can store it: ESC -> ESC "1", NUL -> ESC "0" (see module doc)."""
    if "\x00" in text or _ESC in text:
        return text.replace(_ESC, _ESC + "1").replace("\x00", _ESC + "0")
    return text


def _dec(text: str) -> str:
    """The inverse of `_enc`."""
    if _ESC in text:
        return text.replace(_ESC + "0", "\x00").replace(_ESC + "1", _ESC)
    return text


def tcp_settings(url: str, timeout_s: float) -> dict[str, Any]:
    """libpq TCP settings that bound a call on a dead peer, unless the URL sets its own.

    Without them a call on a connection whose server froze or whose network dropped every
    packet waits for the kernel's defaults (keepalive after two hours; unacknowledged data
    retried for ~15 minutes). Keepalive probes start after `timeout_s` idle and end the
    connection three unanswered probes later; `tcp_user_timeout` ends it when data it sent
    stays unacknowledged for `timeout_s` (minimum 1 s). The pool then reconnects.
    """
    seconds = max(1, round(timeout_s))
    wanted = {
        "keepalives": 1,
        "keepalives_idle": seconds,
        "keepalives_interval": max(1, round(seconds / 3)),
        "keepalives_count": 3,
        "tcp_user_timeout": seconds * 1000,
    }
    given = psycopg.conninfo.conninfo_to_dict(url)
    return {k: v for k, v in wanted.items() if k not in given}


def _lock_key(tenant_id: str, doc_id: str) -> int:
    """A signed 64-bit advisory lock key for one document."""
    digest = hashlib.blake2b(f"{tenant_id}\x00{doc_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class PostgresDocumentStore:
    """Document store on a PostgreSQL database through a connection pool; thread-safe."""

    kind = "postgresql"

    def __init__(
        self,
        url: str,
        *,
        read_only: bool = False,
        pool_size: int = DEFAULT_POOL_SIZE,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """Connect, create or migrate the schema (unless `read_only`), open the pool.

        `timeout_s` bounds a connection attempt, the wait for a pooled connection and a
        statement's wait for a lock another session holds (lock_timeout); past it a call
        raises StoreUnavailableError (as SQLite's busy timeout does). A pool slot whose
        connection broke gives up retrying after timeout_s, and the next call's demand opens
        a fresh one: after an outage of any length the first call once the server is back
        finds it.
        """
        self._url = url
        self.location = mask_url(url)
        """Where the store is, password masked (logs, errors)."""
        self._read_only = read_only
        self._timeout = timeout_s
        connect_timeout = max(1, round(timeout_s))
        try:
            tcp = tcp_settings(url, timeout_s)
            with psycopg.connect(
                url, autocommit=True, connect_timeout=connect_timeout, **tcp
            ) as conn:
                if not read_only:
                    self._migrate(conn)
        except psycopg.OperationalError as exc:
            raise self._unavailable(exc) from None
        self._pool: ConnectionPool[psycopg.Connection[Row]] = ConnectionPool(
            url,
            kwargs={"autocommit": True, "connect_timeout": connect_timeout, **tcp},
            min_size=pool_size,
            max_size=pool_size,
            configure=self._configure,
            name="docstore",
            timeout=timeout_s,
            # psycopg_pool's default (300 s) lets a broken slot back off up to 128 s between
            # tries while the full pool starts no fresh attempt: the store stayed down ~23 s
            # after a 40 s outage had ended. Short, the slot gives up and demand regrows the
            # pool: the retries follow the calls (a refused connect costs a few ms).
            reconnect_timeout=timeout_s,
            open=False,
        )
        try:
            self._pool.open(wait=True, timeout=timeout_s)
        except psycopg.OperationalError as exc:
            self._pool.close()
            raise self._unavailable(exc) from None

    def __repr__(self) -> str:
        return f"PostgresDocumentStore({self.location!r}, read_only={self._read_only})"

    def _configure(self, conn: psycopg.Connection[Row]) -> None:
        # A lock held elsewhere (a stuck writer, an operator's open transaction, the per-document
        # advisory lock) fails the statement past timeout_s instead of waiting for ever.
        conn.execute(
            "SELECT set_config('lock_timeout', %s, false)", (f"{round(self._timeout * 1000)}ms",)
        )
        if self._read_only:
            conn.execute("SET default_transaction_read_only = on")

    @staticmethod
    def _migrate(conn: psycopg.Connection[Row]) -> None:
        """Apply the migrations the database lacks, one process at a time (advisory lock):
        two services opening a fresh database at once must not race their CREATEs."""
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS docstore_schema_version (version INTEGER PRIMARY KEY,"
                " applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            )
            row = conn.execute("SELECT max(version) FROM docstore_schema_version").fetchone()
            have = int(row[0]) if row and row[0] is not None else 0
            for version, sql in _MIGRATIONS:
                if version > have:
                    conn.execute(sql)  # type: ignore[arg-type]  # constant DDL
                    conn.execute(
                        "INSERT INTO docstore_schema_version (version) VALUES (%s)", (version,)
                    )

    def _unavailable(self, exc: BaseException) -> StoreUnavailableError:
        message = scrub(" ".join(str(exc).split()) or type(exc).__name__, self._url)
        password = psycopg.conninfo.conninfo_to_dict(self._url).get("password")
        if password:  # as libpq decoded it
            message = message.replace(str(password), "***")
        return StoreUnavailableError(f"document store (PostgreSQL {self.location}): {message}")

    def _run(self, work: Callable[[psycopg.Connection[Row]], T], *, write: bool = False) -> T:
        """`work` on a pooled connection (in a transaction when `write`); a connection found
        broken (the server restarted since it was opened) is replaced and `work` run once
        more. Connection failures raise StoreUnavailableError."""
        for attempt in (0, 1):
            broken = False
            try:
                with self._pool.connection() as conn:
                    try:
                        if write:
                            with conn.transaction():
                                return work(conn)
                        return work(conn)
                    except psycopg.OperationalError:
                        broken = conn.broken or conn.closed
                        raise
            except psycopg.OperationalError as exc:
                if attempt == 0 and broken:
                    self._pool.check()  # drop the other stale connections too
                    continue
                raise self._unavailable(exc) from None
        raise AssertionError("unreachable")

    def _query(self, sql: str, args: Sequence[object] = ()) -> list[Row]:
        def work(conn: psycopg.Connection[Row]) -> list[Row]:
            try:
                return conn.execute(sql, args).fetchall()  # type: ignore[arg-type]
            except pg_errors.UndefinedTable:  # read-only, before any writer made the schema
                return []

        return self._run(work)

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
        t, d = _enc(doc.tenant_id), _enc(doc.doc_id)

        def work(conn: psycopg.Connection[Row]) -> str | None:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(t, d),))
            replaced = self._delete(conn, t, d)
            self._insert_points(conn, doc.tenant_id, doc.doc_id, doc.generation, points)
            conn.execute(
                "INSERT INTO documents (tenant_id, doc_id, title, source, product, version, tags,"
                " pages, chars, generation, metadata) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                (
                    t, d, _enc(doc.title), _enc(doc.source), _enc(doc.product),
                    _enc(doc.version), json.dumps(list(doc.tags)), doc.pages, doc.chars,
                    _enc(doc.generation),
                    json.dumps(dict(doc.metadata), ensure_ascii=False, sort_keys=True),
                ),
            )  # fmt: skip
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO sections (tenant_id, doc_id, section_id, ord, title, summary,"
                    " page_start, page_end, first_chunk_ord, last_chunk_ord)"
                    " VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                    [
                        (
                            t, d, _enc(s.section_id), s.ord, _enc(s.title), _enc(s.summary),
                            s.page_start, s.page_end, s.first_chunk_ord, s.last_chunk_ord,
                        )
                        for s in doc.sections
                    ],
                )  # fmt: skip
                cur.executemany(
                    "INSERT INTO chunks (tenant_id, doc_id, ord, chunk_id, section_id, text,"
                    " tokens, page_start, page_end) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                    [
                        (
                            t, d, c.ord, _enc(c.chunk_id), _enc(c.section_id), _enc(c.text),
                            c.tokens, c.page_start, c.page_end,
                        )
                        for c in doc.chunks
                    ],
                )  # fmt: skip
                cur.executemany(
                    "INSERT INTO pages (tenant_id, doc_id, page, text) VALUES (%s,%s,%s,%s)",
                    [
                        (t, d, number, _enc(text))
                        for number, text in enumerate(doc.page_texts, start=1)
                    ],
                )
            return replaced

        return self._run(work, write=True)

    def delete(self, tenant_id: str, doc_id: str) -> bool:
        """Delete a document with its sections, chunks and pages; True when it existed."""
        t, d = _enc(tenant_id), _enc(doc_id)

        def work(conn: psycopg.Connection[Row]) -> bool:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(t, d),))
            return self._delete(conn, t, d) is not None

        return self._run(work, write=True)

    @staticmethod
    def _delete(conn: psycopg.Connection[Row], t: str, d: str) -> str | None:
        """Delete one document (tenant and doc id already `_enc`oded); the generation it had,
        None when there was none."""
        gone = conn.execute(
            "DELETE FROM documents WHERE tenant_id=%s AND doc_id=%s RETURNING generation", (t, d)
        ).fetchall()
        for table in ("sections", "chunks", "pages", "points"):
            conn.execute(f"DELETE FROM {table} WHERE tenant_id=%s AND doc_id=%s", (t, d))  # type: ignore[arg-type]
        return _dec(gone[0][0]) if gone else None

    @staticmethod
    def _insert_points(
        conn: psycopg.Connection[Row],
        tenant_id: str,
        doc_id: str,
        generation: str,
        points: Sequence[StoredPoint],
    ) -> None:
        check_points_of(doc_id, generation, points)
        t = _enc(tenant_id)
        rows = [
            (t, to_signed64(p.point_id), _enc(p.doc_id), _enc(p.section_id), _enc(p.chunk_id),
             _enc(p.kind), p.ord, p.page_start, p.page_end, p.tokens, _enc(p.generation))
            for p in points
        ]  # fmt: skip
        if rows:
            with conn.cursor() as cur:
                cur.executemany(
                    f"INSERT INTO points (tenant_id, {POINT_COLUMNS})"
                    " VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                    rows,
                )

    def put_points(
        self, tenant_id: str, doc_id: str, generation: str, points: Sequence[StoredPoint]
    ) -> bool:
        """Replace the stored points of a document whose stored generation is `generation`
        (a store written before the points table: the retrieval service backfills it at
        start); False, writing nothing, when the store holds another generation or none."""
        t, d = _enc(tenant_id), _enc(doc_id)

        def work(conn: psycopg.Connection[Row]) -> bool:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(t, d),))
            row = conn.execute(
                "SELECT generation FROM documents WHERE tenant_id=%s AND doc_id=%s", (t, d)
            ).fetchone()
            if row is None or _dec(row[0]) != generation:
                return False
            conn.execute("DELETE FROM points WHERE tenant_id=%s AND doc_id=%s", (t, d))
            self._insert_points(conn, tenant_id, doc_id, generation, points)
            return True

        return self._run(work, write=True)

    def documents_without_points(self) -> list[tuple[str, str, str]]:
        """(tenant_id, doc_id, generation) of every document with no stored points."""
        rows = self._query(
            "SELECT d.tenant_id, d.doc_id, d.generation FROM documents d WHERE NOT EXISTS "
            "(SELECT 1 FROM points p WHERE p.tenant_id=d.tenant_id AND p.doc_id=d.doc_id)"
        )
        # Ordered here, by the decoded ids: the escaped form sorts NUL after U+0001..U+001A.
        return sorted((_dec(r[0]), _dec(r[1]), _dec(r[2])) for r in rows)

    def points_by_ids(self, tenant_id: str, point_ids: Collection[int]) -> dict[int, StoredPoint]:
        """The tenant's stored points among `point_ids`, by id; ids of points the store does
        not hold (another tenant's, an uncommitted or replaced generation's) are absent.

        One query, one round trip, however many ids: `point_id = ANY(array)` is one
        primary-key lookup per id.
        """
        wanted = [to_signed64(i) for i in dict.fromkeys(point_ids)]
        if not wanted:
            return {}
        rows = self._query(
            f"SELECT {POINT_COLUMNS} FROM points WHERE tenant_id=%s AND point_id = ANY(%s)",
            (_enc(tenant_id), wanted),
        )
        out: dict[int, StoredPoint] = {}
        for r in rows:
            pid = from_signed64(r[0])
            out[pid] = StoredPoint(
                pid, _dec(r[1]), _dec(r[2]), _dec(r[3]), _dec(r[4]), r[5], r[6], r[7], r[8],
                _dec(r[9]),
            )  # fmt: skip
        return out

    def list_documents(
        self,
        tenant_id: str,
        *,
        after: str = "",
        limit: int | None = None,
        doc_ids: Collection[str] | None = None,
    ) -> list[Document]:
        """The tenant's documents without sections, chunks and page texts, by doc_id: only
        those after `after` when it is given, only `doc_ids` when they are given, at most
        `limit`.

        Ordered and paged in SQL, by the stored id in the "C" collation (code point order):
        the same order as SQLite's for every id but those holding NUL or ESC, which sort by
        their escaped form here (the API's ids hold neither: ingestion allows letters,
        digits, '.', '_' and '-').
        """
        sql = f"SELECT {DOC_COLUMNS} FROM documents WHERE tenant_id=%s"
        args: list[object] = [_enc(tenant_id)]
        if after:
            sql += ' AND doc_id COLLATE "C" > %s'
            args.append(_enc(after))
        if doc_ids is not None:
            wanted = sorted({_enc(d) for d in doc_ids})
            if not wanted:
                return []
            sql += " AND doc_id = ANY(%s)"
            args.append(wanted)
        sql += ' ORDER BY doc_id COLLATE "C"'
        if limit is not None:
            sql += " LIMIT %s"
            args.append(max(0, limit))
        return [_document(tenant_id, r) for r in self._query(sql, args)]

    def document_generation(self, tenant_id: str, doc_id: str) -> str | None:
        """The generation of the stored document, or None when the tenant has no such document."""
        rows = self._query(
            "SELECT generation FROM documents WHERE tenant_id=%s AND doc_id=%s",
            (_enc(tenant_id), _enc(doc_id)),
        )
        return _dec(rows[0][0]) if rows else None

    def generations(self, tenant_id: str) -> dict[str, str]:
        """doc_id -> generation for every document of the tenant."""
        rows = self._query(
            "SELECT doc_id, generation FROM documents WHERE tenant_id=%s", (_enc(tenant_id),)
        )
        return {_dec(r[0]): _dec(r[1]) for r in rows}

    def tenants(self) -> list[str]:
        """Every tenant that has at least one document."""
        return sorted(_dec(r[0]) for r in self._query("SELECT DISTINCT tenant_id FROM documents"))

    def pages_text(self, tenant_id: str, doc_id: str, first: int, last: int) -> list[Page]:
        """Pages first..last (1-based, inclusive) of a document that exist, in order."""
        rows = self._query(
            "SELECT page, text FROM pages WHERE tenant_id=%s AND doc_id=%s"
            " AND page BETWEEN %s AND %s ORDER BY page",
            (_enc(tenant_id), _enc(doc_id), first, last),
        )
        return [Page(int(r[0]), _dec(r[1])) for r in rows]

    def counts(self, tenant_id: str, doc_id: str) -> tuple[int, int, int]:
        """(sections, chunks, chars) of one document."""
        key = {"t": _enc(tenant_id), "d": _enc(doc_id)}
        rows = self._query(
            "SELECT (SELECT count(*) FROM sections WHERE tenant_id=%(t)s AND doc_id=%(d)s),"
            " (SELECT count(*) FROM chunks WHERE tenant_id=%(t)s AND doc_id=%(d)s),"
            " (SELECT chars FROM documents WHERE tenant_id=%(t)s AND doc_id=%(d)s)",
            key,  # type: ignore[arg-type]
        )
        if not rows:  # read-only, no schema yet
            return 0, 0, 0
        s, c, chars = rows[0]
        return int(s), int(c), int(chars or 0)

    def counts_many(
        self, tenant_id: str, doc_ids: Collection[str]
    ) -> dict[str, tuple[int, int, int]]:
        """`counts` of each of the tenant's documents among `doc_ids`, in one query (one round
        trip); ids the tenant does not hold are absent."""
        wanted = sorted({_enc(d) for d in doc_ids})
        if not wanted:
            return {}
        rows = self._query(
            "SELECT d.doc_id,"
            " (SELECT count(*) FROM sections s WHERE s.tenant_id=d.tenant_id AND s.doc_id=d.doc_id),"
            " (SELECT count(*) FROM chunks c WHERE c.tenant_id=d.tenant_id AND c.doc_id=d.doc_id),"
            " d.chars FROM documents d WHERE d.tenant_id=%s AND d.doc_id = ANY(%s)",
            (_enc(tenant_id), wanted),
        )
        return {_dec(r[0]): (int(r[1]), int(r[2]), int(r[3] or 0)) for r in rows}

    def get_document(
        self, tenant_id: str, doc_id: str, *, with_chunks: bool = True
    ) -> Document | None:
        """One document with its sections (and chunks and page texts unless `with_chunks=False`)."""
        t, d = _enc(tenant_id), _enc(doc_id)
        rows = self._query(
            f"SELECT {DOC_COLUMNS} FROM documents WHERE tenant_id=%s AND doc_id=%s", (t, d)
        )
        if not rows:
            return None
        sections = tuple(
            Section(_dec(s[0]), s[1], _dec(s[2]), _dec(s[3]), s[4], s[5], s[6], s[7])
            for s in self._query(
                "SELECT section_id, ord, title, summary, page_start, page_end, first_chunk_ord, "
                "last_chunk_ord FROM sections WHERE tenant_id=%s AND doc_id=%s ORDER BY ord",
                (t, d),
            )
        )
        if not with_chunks:
            return replace(_document(tenant_id, rows[0]), sections=sections)
        chunks = self.chunk_range(tenant_id, doc_id, 0, 1 << 30)
        pages = self.pages_text(tenant_id, doc_id, 1, 1 << 30)
        return replace(
            _document(tenant_id, rows[0]),
            sections=sections,
            chunks=tuple(chunks),
            page_texts=tuple(p.text for p in pages),
        )

    def chunk_by_id(self, tenant_id: str, doc_id: str, chunk_id: str) -> Chunk | None:
        """One chunk by id, or None."""
        rows = self._query(
            f"SELECT {CHUNK_COLUMNS} FROM chunks WHERE tenant_id=%s AND doc_id=%s AND chunk_id=%s",
            (_enc(tenant_id), _enc(doc_id), _enc(chunk_id)),
        )
        return _chunk(rows[0]) if rows else None

    def chunks_by_ids(
        self, tenant_id: str, keys: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], Chunk]:
        """Chunks by (doc_id, chunk_id) in one query; missing keys are absent.

        The keys go in as two arrays joined with `unnest`: one lookup per key in the
        (tenant_id, doc_id, chunk_id) index, one round trip.
        """
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        cols = ", ".join("c." + n for n in CHUNK_COLUMNS.split(", "))
        rows = self._query(
            f"SELECT {cols} FROM unnest(%s::text[], %s::text[]) AS k(doc_id, chunk_id)"
            " JOIN chunks c ON c.tenant_id=%s AND c.doc_id=k.doc_id AND c.chunk_id=k.chunk_id",
            ([_enc(k[0]) for k in wanted], [_enc(k[1]) for k in wanted], _enc(tenant_id)),
        )
        out: dict[tuple[str, str], Chunk] = {}
        for r in rows:
            chunk = _chunk(r)
            out[(chunk.doc_id, chunk.chunk_id)] = chunk
        return out

    def chunk_range(self, tenant_id: str, doc_id: str, first: int, last: int) -> list[Chunk]:
        """Chunks with first <= ord <= last, in order."""
        rows = self._query(
            f"SELECT {CHUNK_COLUMNS} FROM chunks "
            "WHERE tenant_id=%s AND doc_id=%s AND ord BETWEEN %s AND %s ORDER BY ord",
            (_enc(tenant_id), _enc(doc_id), first, last),
        )
        return [_chunk(r) for r in rows]

    def all_chunks(self) -> Iterator[tuple[str, str, str, Chunk]]:
        """(tenant_id, doc_id, title, chunk) for every chunk, to rebuild an index at start-up."""
        rows = self._query(
            "SELECT c.tenant_id, c.doc_id, d.title, c.doc_id, c.chunk_id, c.section_id, c.ord, "
            "c.text, c.tokens, c.page_start, c.page_end FROM chunks c JOIN documents d "
            "ON d.tenant_id=c.tenant_id AND d.doc_id=c.doc_id"
        )
        # Ordered here, by the decoded ids (see documents_without_points).
        out = [(_dec(r[0]), _dec(r[1]), _dec(r[2]), _chunk(r[3:])) for r in rows]
        out.sort(key=lambda row: (row[0], row[1], row[3].ord))
        yield from out

    def close(self) -> None:
        """Close the pool and its connections."""
        self._pool.close()


def _chunk(r: Row) -> Chunk:
    """A Chunk from a row of CHUNK_COLUMNS."""
    return Chunk(_dec(r[0]), _dec(r[1]), _dec(r[2]), r[3], _dec(r[4]), r[5], r[6], r[7])


def _document(tenant_id: str, r: Row) -> Document:
    """A Document (no sections, chunks or pages) from a row of DOC_COLUMNS."""
    return Document(
        tenant_id=tenant_id,
        doc_id=_dec(r[0]),
        title=_dec(r[1]),
        source=_dec(r[2]),
        product=_dec(r[3]),
        version=_dec(r[4]),
        tags=tuple(json.loads(r[5])),
        pages=r[6],
        generation=_dec(r[7]),
        metadata=json.loads(r[8]),
    )
