"""The PostgreSQL document store: the store's contract (services/docstore/store.py) on a
server, for deployments where retrieval.md's metadata DB is wanted (docs/architecture.md §4). The queries
and writes are the shared SQL core's (services/docstore/sql_store.py); this is the dialect.

Same tables and keys as the SQLite store, tenant_id first in every key and in every WHERE;
integers are BIGINT (point ids are u64, kept signed as in SQLite); ids are `COLLATE "C"`, so
listings sort by code point as SQLite's do. A document and its points are written in one
transaction, serialised per document by an advisory lock.

PostgreSQL text cannot hold NUL (U+0000), which SQLite stores and documents may contain.
Every string is written escaped and read back unescaped, so it round-trips exactly:
ESC (U+001B) is written as ESC "1" and NUL as ESC "0" (`_enc` / `_dec`). Only strings with
an ESC or a NUL change; `psql` shows those two characters in that form.

Connections come from a `psycopg_pool.ConnectionPool` (autocommit; a write opens its own
transaction, and so does a read snapshot: REPEATABLE READ, READ ONLY). A lost connection (a
server restart) is noticed on use: the pool drops its broken connections and the call is
tried once more; a server that stays down raises `StoreUnavailableError`, as a locked SQLite
file does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool

from services.common.context import call_timeout
from services.common.retry import whole_seconds
from services.docstore.errors import StoreUnavailableError
from services.docstore.model import Chunk, StoredPoint
from services.docstore.sql_store import (
    CHUNK_COLUMNS,
    POINT_COLUMNS,
    KeyRead,
    Row,
    SqlDocumentStore,
    T,
    to_signed64,
)
from services.docstore.store import DEFAULT_POOL_SIZE, DEFAULT_TIMEOUT_S, mask_url, scrub

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
    (2, "ALTER TABLE documents ADD COLUMN IF NOT EXISTS tokens BIGINT NOT NULL DEFAULT 0;"),
    (
        3,
        f"CREATE TABLE IF NOT EXISTS replacements (tenant_id {_ID} PRIMARY KEY,"
        " replaced BIGINT NOT NULL);",
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
    stays unacknowledged for `timeout_s`. libpq counts whole seconds: each is rounded up
    (`whole_seconds`). The pool then reconnects.
    """
    seconds = whole_seconds(timeout_s)
    wanted = {
        "keepalives": 1,
        "keepalives_idle": seconds,
        "keepalives_interval": whole_seconds(seconds / 3),
        "keepalives_count": 3,
        "tcp_user_timeout": seconds * 1000,
    }
    given = psycopg.conninfo.conninfo_to_dict(url)
    return {k: v for k, v in wanted.items() if k not in given}


_READ_SNAPSHOT = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
"""The first statement of a read snapshot's transaction (`_read_transaction`)."""


@dataclass
class _Snapshot:
    """A read snapshot: its connection, in its transaction."""

    conn: psycopg.Connection[Row]
    no_schema: bool = False
    """The schema did not exist when it was taken (a read-only store before any writer): every
    read answers nothing, as outside a snapshot."""


def _lock_key(tenant_id: str, doc_id: str) -> int:
    """A signed 64-bit advisory lock key for one document."""
    digest = hashlib.blake2b(f"{tenant_id}\x00{doc_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class PostgresDocumentStore(SqlDocumentStore):
    """Document store on a PostgreSQL database through a connection pool; thread-safe."""

    kind = "postgresql"
    ID_ORDER = ' COLLATE "C"'
    _enc = staticmethod(_enc)
    _dec = staticmethod(_dec)

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
        super().__init__()
        self._url = url
        self.location = mask_url(url)
        """Where the store is, password masked (logs, errors)."""
        self._read_only = read_only
        self._timeout = timeout_s
        connect_timeout = whole_seconds(timeout_s)
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
                with self._pool.connection(timeout=self._wait()) as conn:
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

    def _wait(self) -> float:
        """How long a call waits for a pooled connection: the store's timeout, cut to end
        before the deadline of the request it serves (services.common.context.call_timeout),
        so that a server that is down reaches the caller as this store's error
        (StoreUnavailableError, backend_unavailable), not as the caller's own deadline."""
        return max(0.001, call_timeout(self._timeout))

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s")

    def _read(self, sql: str, args: Sequence[object]) -> list[Row]:
        def work(conn: psycopg.Connection[Row]) -> list[Row]:
            try:
                return conn.execute(self._sql(sql), args).fetchall()  # type: ignore[arg-type]
            except pg_errors.UndefinedTable:  # read-only, before any writer made the schema
                return []

        return self._run(work)

    @contextmanager
    def _read_transaction(self) -> Iterator[_Snapshot]:
        """A pooled connection in a REPEATABLE READ, READ ONLY transaction: every read in it
        sees the database as its first read did. A connection found broken as the transaction
        begins is replaced and the transaction begun once more (as `_run` does); one lost
        later fails the read that finds it (StoreUnavailableError)."""
        for attempt in (0, 1):
            snapshot: _Snapshot | None = None
            broken = False
            try:
                with self._pool.connection(timeout=self._wait()) as conn:
                    try:
                        with conn.transaction():
                            conn.execute(_READ_SNAPSHOT)
                            snapshot = _Snapshot(conn)
                            yield snapshot
                        return
                    except psycopg.OperationalError:
                        broken = conn.broken or conn.closed
                        raise
            except psycopg.OperationalError as exc:
                if attempt == 0 and broken and snapshot is None:
                    self._pool.check()  # drop the other stale connections too
                    continue
                raise self._unavailable(exc) from None
        raise AssertionError("unreachable")

    def _read_in(self, snapshot: _Snapshot, sql: str, args: Sequence[object]) -> list[Row]:
        if snapshot.no_schema:
            return []
        try:
            return snapshot.conn.execute(self._sql(sql), args).fetchall()  # type: ignore[arg-type]
        except pg_errors.UndefinedTable:  # read-only, before any writer made the schema
            snapshot.no_schema = True  # nor later in the snapshot: its transaction is aborted
            return []
        except psycopg.OperationalError as exc:
            raise self._unavailable(exc) from None

    def _write(self, tenant_id: str, doc_id: str, work: Callable[[Any], T]) -> T:
        def locked(conn: psycopg.Connection[Row]) -> T:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(tenant_id, doc_id),))
            return work(conn)

        return self._run(locked, write=True)

    def _executemany(self, conn: Any, sql: str, rows: Sequence[Sequence[object]]) -> None:
        if rows:
            with conn.cursor() as cur:
                cur.executemany(self._sql(sql), rows)

    def _member(self, column: str, values: Sequence[object]) -> tuple[str, list[object]]:
        return f"{column} = ANY(?)", [list(values)]

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
            f"SELECT {POINT_COLUMNS} FROM points WHERE tenant_id=? AND point_id = ANY(?)",
            (_enc(tenant_id), wanted),
        )
        return {p.point_id: p for p in map(self._point, rows)}

    def _chunks_by_keys(self, tenant_id: str, keys: Sequence[KeyRead]) -> dict[KeyRead, Chunk]:
        """Chunks by (doc_id, chunk_id, generation or None) in one query.

        The keys go in as three arrays joined with `unnest`: one lookup per key in the
        (tenant_id, doc_id, chunk_id) index and one in the documents' primary key for the
        generation, one round trip.
        """
        cols = ", ".join("c." + n for n in CHUNK_COLUMNS.split(", "))
        rows = self._query(
            f"SELECT k.generation, {cols}"
            " FROM unnest(?::text[], ?::text[], ?::text[]) AS k(doc_id, chunk_id, generation)"
            " JOIN chunks c ON c.tenant_id=? AND c.doc_id=k.doc_id AND c.chunk_id=k.chunk_id"
            " JOIN documents d ON d.tenant_id=c.tenant_id AND d.doc_id=c.doc_id"
            " WHERE k.generation IS NULL OR d.generation=k.generation",
            (
                [_enc(k[0]) for k in keys],
                [_enc(k[1]) for k in keys],
                [None if k[2] is None else _enc(k[2]) for k in keys],
                _enc(tenant_id),
            ),
        )
        out: dict[KeyRead, Chunk] = {}
        for r in rows:
            chunk = self._chunk(r[1:])
            out[(chunk.doc_id, chunk.chunk_id, None if r[0] is None else _dec(r[0]))] = chunk
        return out

    def close(self) -> None:
        """Close the pool and its connections."""
        self._pool.close()
