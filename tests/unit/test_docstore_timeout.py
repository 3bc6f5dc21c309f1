"""<prefix>DOCSTORE_TIMEOUT_S governs the SQLite store too: it is every connection's
busy_timeout, so a write behind another writer's lock gives up after that long."""

import sqlite3
import time
from pathlib import Path

import pytest

from services.common.settings import Env
from services.docstore.config import docstore_settings
from services.docstore.errors import StoreUnavailableError
from services.docstore.factory import open_document_store
from services.docstore.parsing import parse_document
from services.docstore.sqlite_store import SqliteDocumentStore
from services.docstore.store import DEFAULT_TIMEOUT_S


def _doc(doc_id: str = "guide"):
    return parse_document(
        tenant_id="t1", doc_id=doc_id, content=b"# Guide\n\nText.\n", fmt="markdown"
    )


def _busy_timeouts_ms(store: SqliteDocumentStore) -> set[int]:
    """busy_timeout of the store's write connection and of a read connection."""
    reader = store._reader()
    try:
        conns = [store._write_conn, reader]
        return {conn.execute("PRAGMA busy_timeout").fetchone()[0] for conn in conns}
    finally:
        store._release(reader)


@pytest.mark.parametrize("prefix", ["RETR_", "MCP_PROXY_"])
def test_sqlite_write_gives_up_after_the_docstore_timeout(tmp_path: Path, prefix: str) -> None:
    path = tmp_path / "s.sqlite"
    env = Env({"METADATA_DB_URL": f"sqlite:///{path}", prefix + "DOCSTORE_TIMEOUT_S": "0.5"})
    store = docstore_settings(env, prefix).open()
    doc = _doc()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the file's write lock
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError, match="locked"):
            store.put(doc)
        waited = time.monotonic() - started
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert 0.4 <= waited < 1.5, waited
    store.put(doc)  # the lock is gone: the same write succeeds
    assert store.document_generation("t1", "guide") == doc.generation
    store.close()


def test_open_document_store_passes_the_timeout_to_sqlite(tmp_path: Path) -> None:
    store = open_document_store(tmp_path / "s.sqlite", timeout_s=0.75)
    assert _busy_timeouts_ms(store) == {750}
    store.close()


def test_sqlite_default_timeout_is_five_seconds(tmp_path: Path) -> None:
    assert DEFAULT_TIMEOUT_S == 5.0
    direct = SqliteDocumentStore(tmp_path / "a.sqlite")
    configured = docstore_settings(Env({"VISIOR_DATA_DIR": str(tmp_path / "d")}), "RETR_").open()
    assert _busy_timeouts_ms(direct) == _busy_timeouts_ms(configured) == {5000}
    direct.close()
    configured.close()
