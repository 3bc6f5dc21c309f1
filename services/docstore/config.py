"""Where the document store lives: one rule for every service that opens it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from psycopg import conninfo

from services.common.settings import Env, SettingsError
from services.docstore.store import (
    DEFAULT_POOL_SIZE,
    DEFAULT_TIMEOUT_S,
    POSTGRES_SCHEMES,
    SQLITE_SCHEME,
    DocumentStore,
    is_postgres_url,
    mask_url,
    open_document_store,
    scrub,
    sqlite_path,
)

MAX_POOL_SIZE = 100
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 0.5, 60.0


@dataclass(frozen=True)
class DocstoreSettings:
    """The document store to open (services/docstore/store.open_document_store)."""

    kind: str
    """"sqlite" or "postgresql"."""
    target: str = field(repr=False)
    """The SQLite path, or the PostgreSQL URL (may hold a password: never logged)."""
    pool_size: int = DEFAULT_POOL_SIZE
    """PostgreSQL connections kept open (<prefix>DOCSTORE_POOL_SIZE / DOCSTORE_POOL_SIZE)."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """PostgreSQL: longest wait to connect or for a pooled connection before a call fails
    with StoreUnavailableError (<prefix>DOCSTORE_TIMEOUT_S / DOCSTORE_TIMEOUT_S)."""

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


def docstore_settings(env: Env, prefix: str) -> DocstoreSettings:
    """<prefix>DOCSTORE_URL / METADATA_DB_URL (sqlite:///PATH, postgresql://…, postgres://…),
    else VISIOR_DATA_DIR/docstore.sqlite; <prefix>DOCSTORE_POOL_SIZE / DOCSTORE_POOL_SIZE and
    <prefix>DOCSTORE_TIMEOUT_S / DOCSTORE_TIMEOUT_S (PostgreSQL only)."""
    pool_size = env.integer(
        [prefix + "DOCSTORE_POOL_SIZE", "DOCSTORE_POOL_SIZE"],
        DEFAULT_POOL_SIZE,
        minimum=1,
        maximum=MAX_POOL_SIZE,
    )
    timeout_names = [prefix + "DOCSTORE_TIMEOUT_S", "DOCSTORE_TIMEOUT_S"]
    timeout_s = env.number(timeout_names, DEFAULT_TIMEOUT_S, minimum=MIN_TIMEOUT_S)
    if timeout_s > MAX_TIMEOUT_S:
        name = (env.raw(timeout_names) or ("DOCSTORE_TIMEOUT_S", ""))[0]
        raise SettingsError(f"{name}={timeout_s} is above the maximum {MAX_TIMEOUT_S}")
    found = env.raw([prefix + "DOCSTORE_URL", "METADATA_DB_URL"])
    if found is None:
        path = str(Path(env.text("VISIOR_DATA_DIR", "data")) / "docstore.sqlite")
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
