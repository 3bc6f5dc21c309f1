"""Where the document store lives: one rule for every service that opens it."""

from __future__ import annotations

from dataclasses import dataclass, field

from psycopg import conninfo

from services.common.settings import (
    Env,
    Fields,
    SettingsError,
    check_file_path,
    integer,
    number,
    text,
)
from services.common.shared_config import DATA_DIR, data_dir
from services.docstore.factory import open_document_store
from services.docstore.store import (
    DEFAULT_POOL_SIZE,
    DEFAULT_TIMEOUT_S,
    POSTGRES_SCHEMES,
    SQLITE_SCHEME,
    DocumentStore,
    is_postgres_url,
    mask_url,
    scrub,
    sqlite_path,
)

MAX_POOL_SIZE = 100
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 0.5, 60.0


@dataclass(frozen=True)
class DocstoreSettings:
    """The document store to open (services/docstore/factory.open_document_store)."""

    kind: str
    """"sqlite" or "postgresql"."""
    target: str = field(repr=False)
    """The SQLite path, or the PostgreSQL URL (may hold a password: never logged)."""
    pool_size: int = DEFAULT_POOL_SIZE
    """PostgreSQL connections this process keeps open (<prefix>DOCSTORE_POOL_SIZE)."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """Longest wait before a call fails with StoreUnavailableError (<prefix>DOCSTORE_TIMEOUT_S).
    SQLite: a write's wait for another writer's lock (busy_timeout). PostgreSQL: the wait to
    connect, for a pooled connection, or for a lock another session holds."""

    @property
    def display(self) -> str:
        """`target` with any password masked."""
        return mask_url(self.target)

    def __repr__(self) -> str:
        return (
            f"DocstoreSettings(kind={self.kind!r}, target={self.display!r}, "
            f"pool_size={self.pool_size}, timeout_s={self.timeout_s})"
        )

    def open(self, *, read_only: bool = False) -> DocumentStore:
        """The store these settings name, opened."""
        return open_document_store(
            self.target, read_only=read_only, pool_size=self.pool_size, timeout_s=self.timeout_s
        )


DOCSTORE_URL = text(
    "METADATA_DB_URL", "", default_doc="sqlite under VISIOR_DATA_DIR (docstore.sqlite)",
    doc="The document store (retrieval.md §8.1's metadata DB): sqlite:///PATH, or "
    "postgresql://USER:PASSWORD@HOST:PORT/DATABASE (postgres:// too). Retrieval writes it, "
    "ToolsProxy reads it: give both the same URL. The password is never logged.",
)  # fmt: skip


def check_store_path(env: Env, store: DocstoreSettings) -> None:
    """SettingsError naming the setting (METADATA_DB_URL, else VISIOR_DATA_DIR) when the
    SQLite store's file cannot be made or opened at start: it is a directory, or under a
    regular file (`settings.check_file_path`)."""
    if store.kind == "sqlite" and store.target != ":memory:":
        where = DOCSTORE_URL.found(env) or ("VISIOR_DATA_DIR", DATA_DIR.read(env))
        check_file_path(store.target, *where)


def docstore_settings(env: Env, prefix: str) -> DocstoreSettings:
    """METADATA_DB_URL (sqlite:///PATH, postgresql://…, postgres://…), else
    VISIOR_DATA_DIR/docstore.sqlite; <prefix>DOCSTORE_POOL_SIZE (PostgreSQL only) and
    <prefix>DOCSTORE_TIMEOUT_S (both stores)."""
    pool = Fields(
        DocstoreSettings,
        pool_size=integer(prefix + "DOCSTORE_POOL_SIZE", minimum=1, maximum=MAX_POOL_SIZE),
        timeout_s=number(
            prefix + "DOCSTORE_TIMEOUT_S", minimum=MIN_TIMEOUT_S, maximum=MAX_TIMEOUT_S
        ),
    ).values(env)
    pool_size, timeout_s = pool["pool_size"], pool["timeout_s"]
    found = DOCSTORE_URL.found(env)
    if found is None:
        path = str(data_dir(env) / "docstore.sqlite")
        return DocstoreSettings("sqlite", path, pool_size, timeout_s)
    name, url = found
    if url.startswith(SQLITE_SCHEME):
        return DocstoreSettings("sqlite", sqlite_path(url), pool_size, timeout_s)
    if is_postgres_url(url):
        try:
            conninfo.conninfo_to_dict(url)
        except (
            Exception
        ) as exc:  # libpq's parser: the message quotes the bad part, maybe the password
            raise SettingsError(
                f"{name}={mask_url(url)!r} is not a valid PostgreSQL URL: {scrub(str(exc), url)}"
            ) from None
        return DocstoreSettings("postgresql", url, pool_size, timeout_s)
    raise SettingsError(
        f"{name}={mask_url(url)!r}: the document store takes {SQLITE_SCHEME}PATH or "
        f"{' / '.join(POSTGRES_SCHEMES)}USER:PASSWORD@HOST:PORT/DATABASE"
    )
