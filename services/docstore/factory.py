"""Opening the configured document store: the one module that knows both implementations."""

from __future__ import annotations

from pathlib import Path

from services.docstore.postgres_store import PostgresDocumentStore
from services.docstore.sqlite_store import SqliteDocumentStore
from services.docstore.store import (
    DEFAULT_POOL_SIZE,
    DEFAULT_TIMEOUT_S,
    DocumentStore,
    is_postgres_url,
    sqlite_path,
)


def open_document_store(
    url_or_path: str | Path,
    *,
    read_only: bool = False,
    pool_size: int = DEFAULT_POOL_SIZE,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> DocumentStore:
    """The store at `url_or_path`: PostgreSQL for a postgresql:// (postgres://) URL, else
    SQLite (a path, or sqlite:///PATH; sqlite:/// alone is an in-memory database).
    `timeout_s` bounds either store's wait for a lock; `pool_size` is PostgreSQL's."""
    if is_postgres_url(url_or_path):
        return PostgresDocumentStore(
            str(url_or_path), read_only=read_only, pool_size=pool_size, timeout_s=timeout_s
        )
    return SqliteDocumentStore(
        sqlite_path(str(url_or_path)), read_only=read_only, timeout_s=timeout_s
    )
