"""The SQLite document store: full text by document, section and chunk position, per tenant.

Every read takes the tenant; a document of another tenant is simply not found. A document
is written in one transaction, so a crash mid-document leaves the previous version (or
nothing) visible, never half of it. The queries and writes are the shared SQL core's
(services/docstore/sql_store.py); this is the dialect: one file in WAL mode, a write
connection and a pool of read connections (a read snapshot holds one of them).
"""

from __future__ import annotations

import json
import queue
import sqlite3
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from services.docstore.errors import StoreUnavailableError
from services.docstore.model import Chunk, StoredPoint
from services.docstore.sql_store import (
    CHUNK_COLUMNS,
    POINT_COLUMNS,
    KeyRead,
    Row,
    SqlDocumentStore,
    T,
    from_signed64,
    to_signed64,
)
from services.docstore.store import DEFAULT_TIMEOUT_S

_SCHEMA = """
CREATE TABLE IF NOT EXISTS documents (
  tenant_id TEXT NOT NULL, doc_id TEXT NOT NULL, title TEXT NOT NULL, source TEXT NOT NULL,
  product TEXT NOT NULL, version TEXT NOT NULL, tags TEXT NOT NULL, pages INTEGER NOT NULL,
  chars INTEGER NOT NULL, generation TEXT NOT NULL DEFAULT '',
  metadata TEXT NOT NULL DEFAULT '{}', tokens INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (tenant_id, doc_id));
CREATE TABLE IF NOT EXISTS sections (
  tenant_id TEXT NOT NULL, doc_id TEXT NOT NULL, section_id TEXT NOT NULL, ord INTEGER NOT NULL,
  title TEXT NOT NULL, summary TEXT NOT NULL, page_start INTEGER NOT NULL,
  page_end INTEGER NOT NULL, first_chunk_ord INTEGER NOT NULL, last_chunk_ord INTEGER NOT NULL,
  PRIMARY KEY (tenant_id, doc_id, section_id));
CREATE TABLE IF NOT EXISTS chunks (
  tenant_id TEXT NOT NULL, doc_id TEXT NOT NULL, ord INTEGER NOT NULL, chunk_id TEXT NOT NULL,
  section_id TEXT NOT NULL, text TEXT NOT NULL, tokens INTEGER NOT NULL,
  page_start INTEGER NOT NULL, page_end INTEGER NOT NULL,
  PRIMARY KEY (tenant_id, doc_id, ord));
CREATE UNIQUE INDEX IF NOT EXISTS chunks_by_id ON chunks (tenant_id, doc_id, chunk_id);
CREATE TABLE IF NOT EXISTS pages (
  tenant_id TEXT NOT NULL, doc_id TEXT NOT NULL, page INTEGER NOT NULL, text TEXT NOT NULL,
  PRIMARY KEY (tenant_id, doc_id, page));
CREATE TABLE IF NOT EXISTS points (
  tenant_id TEXT NOT NULL, point_id INTEGER NOT NULL, doc_id TEXT NOT NULL,
  section_id TEXT NOT NULL, chunk_id TEXT NOT NULL, kind TEXT NOT NULL, ord INTEGER NOT NULL,
  page_start INTEGER NOT NULL, page_end INTEGER NOT NULL, tokens INTEGER NOT NULL,
  generation TEXT NOT NULL, PRIMARY KEY (tenant_id, point_id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS points_by_doc ON points (tenant_id, doc_id);
CREATE TABLE IF NOT EXISTS replacements (
  tenant_id TEXT NOT NULL PRIMARY KEY, replaced INTEGER NOT NULL) WITHOUT ROWID;
"""
# Columns added after the first schema: (name, definition) for ALTER TABLE on older files.
_ADDED_DOCUMENT_COLUMNS = (
    ("generation", "TEXT NOT NULL DEFAULT ''"),
    ("metadata", "TEXT NOT NULL DEFAULT '{}'"),
    ("tokens", "INTEGER NOT NULL DEFAULT 0"),
)


def require_json_functions(conn: sqlite3.Connection) -> None:
    """Refuse an SQLite library without its JSON functions (built in since 3.38; search reads
    its rows packed as JSON, `SqliteDocumentStore._query_packed`)."""
    try:
        conn.execute("SELECT json_group_array(json_array(1))").fetchall()
    except sqlite3.OperationalError as exc:
        raise StoreUnavailableError(
            f"document store: SQLite {sqlite3.sqlite_version} has no JSON functions ({exc}); "
            "it needs SQLite 3.38 or later, or an older one built with JSON1"
        ) from exc


READERS = 4
"""Read connections of one store at most (searches read concurrently from worker threads)."""


class SqliteDocumentStore(SqlDocumentStore):
    """Document store on one SQLite file (WAL), safe to share between threads of one process."""

    kind = "sqlite"

    def __init__(
        self, path: str | Path, *, read_only: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        """Open (and unless `read_only`, create or migrate) the store at `path`.

        `timeout_s` is every connection's busy_timeout: a write that finds another writer
        holding the file's lock waits that long, then raises StoreUnavailableError.
        """
        super().__init__()
        self.path = str(path)
        self._read_only = read_only
        self._timeout_s = timeout_s
        if not read_only and self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._conn = self._connect()
        require_json_functions(self._conn)  # one library for every connection: checked once
        # Writes get their own connection and lock: a write waiting out busy_timeout for
        # another writer's lock must not stall the reads, which WAL lets go on meanwhile.
        # (":memory:" is one database per connection, so it keeps the one.)
        shared = read_only or self.path == ":memory:"
        self._write_conn = self._conn if shared else self._connect()
        self._write_lock = self._lock if shared else threading.Lock()
        # Reads take a connection of their own from a pool (WAL readers do not block each
        # other): with one, concurrent searches queued behind the thread holding it, which
        # itself waited for the GIL between the rows it stepped through.
        self._readers: queue.LifoQueue[sqlite3.Connection] = queue.LifoQueue()
        self._readers.put(self._conn)
        self._all_readers = [self._conn]
        # Reads in flight, so close() can wait for them instead of closing a connection under
        # one (sqlite3.ProgrammingError, an INTERNAL at the edge during a graceful stop).
        self._reads = threading.Condition(threading.Lock())
        self._in_use = 0
        self._closed = False

    def _connect(self, *, reader: bool = False) -> sqlite3.Connection:
        # `timeout` (seconds) is SQLite's busy_timeout, set as the connection opens.
        conn = sqlite3.connect(
            self.path, timeout=self._timeout_s, check_same_thread=False, isolation_level=None
        )
        conn.execute("PRAGMA cache_size = -65536")
        conn.execute("PRAGMA mmap_size = 268435456")
        if not self._read_only and not reader:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.executescript(_SCHEMA)
            self._migrate(conn)
        return conn

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        """Add the columns a store file written by an older version lacks (one transaction)."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            have = {row[1] for row in conn.execute("PRAGMA table_info(documents)")}
            for name, definition in _ADDED_DOCUMENT_COLUMNS:
                if name not in have:
                    conn.execute(f"ALTER TABLE documents ADD COLUMN {name} {definition}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        conn = self._write_conn
        with self._write_lock:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:  # locked past busy_timeout, disk error
                raise StoreUnavailableError(f"document store: {exc}") from exc
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.OperationalError):
                    raise StoreUnavailableError(f"document store: {exc}") from exc
                raise

    def _reader(self) -> sqlite3.Connection:
        """A pooled read connection, counted in use until _release (refused once closed)."""
        with self._reads:
            if self._closed:
                raise StoreUnavailableError("document store: closed")
            self._in_use += 1
        try:
            return self._pooled()
        except BaseException:
            self._done_reading()
            raise

    def _release(self, conn: sqlite3.Connection) -> None:
        self._readers.put(conn)
        self._done_reading()

    def _done_reading(self) -> None:
        with self._reads:
            self._in_use -= 1
            self._reads.notify_all()

    def _pooled(self) -> sqlite3.Connection:
        try:
            return self._readers.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            if len(self._all_readers) < READERS:
                try:
                    conn = self._connect(reader=True)
                except sqlite3.Error as exc:
                    raise StoreUnavailableError(f"document store: {exc}") from exc
                self._all_readers.append(conn)
                return conn
        return self._readers.get()

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """A connection to read on for the block: a pooled one, or the store's one connection
        under its lock (read-only, ":memory:")."""
        if self._write_lock is self._lock:
            with self._lock:
                yield self._conn
            return
        conn = self._reader()
        try:
            yield conn
        finally:
            self._release(conn)

    def _read(self, sql: str, args: Sequence[object]) -> list[Row]:
        with self._reading() as conn:
            return self._run_query(conn, sql, args)

    @contextmanager
    def _read_transaction(self) -> Iterator[sqlite3.Connection]:
        """A read connection in a deferred transaction: its first read takes the snapshot,
        which WAL keeps for it until COMMIT while writers commit beside it."""
        with self._reading() as conn:
            self._statement(conn, "BEGIN")
            try:
                yield conn
            finally:
                self._statement(conn, "COMMIT")  # ends a read: nothing to write, no lock to wait

    def _read_in(self, snapshot: sqlite3.Connection, sql: str, args: Sequence[object]) -> list[Row]:
        return self._run_query(snapshot, sql, args)

    @staticmethod
    def _statement(conn: sqlite3.Connection, sql: str) -> None:
        try:
            conn.execute(sql)
        except (sqlite3.OperationalError, sqlite3.ProgrammingError) as exc:  # closed, disk error
            raise StoreUnavailableError(f"document store: {exc}") from exc

    @staticmethod
    def _run_query(conn: sqlite3.Connection, sql: str, args: Sequence[object]) -> list[Row]:
        try:
            return conn.execute(sql, args).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):  # a reader that started before the writer
                return []
            raise StoreUnavailableError(f"document store: {exc}") from exc
        except sqlite3.ProgrammingError as exc:  # the store was closed (one-connection modes)
            raise StoreUnavailableError(f"document store: {exc}") from exc

    def _query_packed(
        self, columns: str, alias: str, source: str, args: tuple[object, ...]
    ) -> list[list[Any]]:
        """`SELECT columns FROM source`'s rows, read as one JSON array in one row.

        For the read every search makes of its candidates (~130 rows of integers and ids).
        The sqlite3 module lets go of the GIL around every step, one per row, and under load
        each step then waits its turn behind the other search threads to take it back: a
        read of 130 rows packed in one took a third to a quarter of the time with three busy
        Python threads beside it (in-process), and the server's searches/s at 32 in flight
        rose by ~25 % (bench/retrieval_search.py). Alone, both ways cost the same. Integers and text come
        back as they were stored (JSON keeps 64-bit integers and any text exactly).
        """
        cols = ", ".join(f"{alias}.{name}" for name in columns.split(", "))
        rows = self._query(f"SELECT json_group_array(json_array({cols})) FROM {source}", args)
        return json.loads(rows[0][0]) if rows else []  # type: ignore[no-any-return]

    def _write(self, tenant_id: str, doc_id: str, work: Callable[[Any], T]) -> T:
        with self._tx() as conn:
            return work(conn)

    def points_by_ids(self, tenant_id: str, point_ids: Collection[int]) -> dict[int, StoredPoint]:
        """The tenant's stored points among `point_ids`, by id; ids of points the store does
        not hold (another tenant's, an uncommitted or replaced generation's) are absent.

        One primary-key lookup per id, joined against the ids as a VALUES table, 500 a query;
        the rows come back packed in one (`_query_packed`).
        """
        wanted = [to_signed64(i) for i in dict.fromkeys(point_ids)]
        out: dict[int, StoredPoint] = {}
        for i in range(0, len(wanted), 500):
            part = wanted[i : i + 500]
            rows = self._query_packed(
                POINT_COLUMNS,
                "p",
                f"(VALUES {','.join(['(?)'] * len(part))}) AS k "
                "CROSS JOIN points p ON p.tenant_id=? AND p.point_id=k.column1",
                (*part, tenant_id),
            )
            for r in rows:
                pid = from_signed64(r[0])
                out[pid] = StoredPoint(pid, *r[1:])
        return out

    def _chunks_by_keys(self, tenant_id: str, keys: Sequence[KeyRead]) -> dict[KeyRead, Chunk]:
        """Chunks by (doc_id, chunk_id, generation or None) in one query per 500 keys.

        A join against the keys as a VALUES table, so each key is one lookup in the
        (tenant_id, doc_id, chunk_id) index and one in the documents' primary key for the
        generation (a row-value IN or an OR list scanned the tenant's chunks instead: 2-8 ms
        for 40 keys at 10k chunks, against 0.3 ms). Row by row, not packed (`_query_packed`):
        for ~45 texts of a search, escaping and parsing them as JSON cost 0.1-0.2 ms more
        alone and won nothing under load.
        """
        out: dict[KeyRead, Chunk] = {}
        for i in range(0, len(keys), 500):
            part = keys[i : i + 500]
            rows = self._query(
                f"SELECT k.column3, {', '.join('c.' + n for n in CHUNK_COLUMNS.split(', '))} "
                f"FROM (VALUES {','.join(['(?,?,?)'] * len(part))}) AS k CROSS JOIN chunks c "
                "ON c.tenant_id=? AND c.doc_id=k.column1 AND c.chunk_id=k.column2 "
                "CROSS JOIN documents d ON d.tenant_id=c.tenant_id AND d.doc_id=c.doc_id "
                "WHERE k.column3 IS NULL OR d.generation=k.column3",
                (*[v for key in part for v in key], tenant_id),
            )
            for r in rows:
                out[(r[1], r[2], r[0])] = Chunk(*r[1:])
        return out

    def close(self, wait_s: float = 30.0) -> None:
        """Close the connections, once the reads in flight have ended (up to `wait_s`); later
        reads raise StoreUnavailableError."""
        with self._reads:
            self._closed = True
            self._reads.wait_for(lambda: self._in_use == 0, timeout=wait_s)
        with self._write_lock:
            if self._write_conn is not self._conn:
                self._write_conn.close()
        with self._lock:
            for conn in self._all_readers:
                conn.close()
