"""The mesh on the PostgreSQL document store: the real retrieval server and ToolsProxy with
METADATA_DB_URL=postgresql://… (a real server, tests/pg_server.py), through Envoy."""

from __future__ import annotations

import httpx
import psycopg
import pytest

from services.common.untrusted import unwrap_untrusted
from tests.e2e.conftest import (
    LDAP_ANCHOR,
    LDAP_DOC,
    LDAP_QUESTION,
    LDAP_SECTION,
    SAMPLES,
    SERVICE_KEYS,
    TENANT,
    MeshFactory,
    ingest,
)
from tests.pg_server import PgCluster

pytestmark = pytest.mark.e2e

PASSWORD = "e2e-pg-secret-do-not-log"


def test_ingest_search_and_tools_on_the_postgresql_store(
    make_mesh: MeshFactory, pg_server: PgCluster
) -> None:
    name = pg_server.create_database()
    url = pg_server.url(name, password=PASSWORD)  # trust auth: accepted, must never show
    try:
        m = make_mesh(
            {
                "METADATA_DB_URL": url,
                "RETR_DOCSTORE_POOL_SIZE": "3",
                "MCP_PROXY_DOCSTORE_POOL_SIZE": "3",
            }
        )
        guide = SAMPLES / f"{LDAP_DOC}.md"
        out = ingest(m, TENANT, guide.name, guide.read_bytes())
        assert out["doc_id"] == LDAP_DOC and out["chunks"] > 0, out

        r = httpx.post(
            f"{m.json_url('retrieval')}/internal/retrieval/search",
            json={"query": LDAP_QUESTION, "tenant_id": TENANT},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        hits = r.json()["hits"]
        assert hits and hits[0]["doc_id"] == LDAP_DOC, hits
        assert any(s["section_id"] == LDAP_SECTION for s in r.json()["used_sections"])

        for tool, args in (
            ("read_doc_section", {"doc_id": LDAP_DOC, "section_id": LDAP_SECTION}),
            ("read_chunk_window", {"doc_id": LDAP_DOC, "anchor_chunk_id": LDAP_ANCHOR}),
        ):
            t = httpx.post(
                f"{m.json_url('toolsproxy')}/internal/mcp/execute",
                json={
                    "tool_name": tool,
                    "arguments": args,
                    "user": {"user_id": "u1", "tenant_id": TENANT},
                },
                timeout=30,
            )
            assert t.status_code == 200, t.text
            body = t.json()
            assert body["status"] == "ok", body
            texts = [unwrap_untrusted(v) for v in _texts(body["result"])]
            assert any("LDAP" in text for text in texts), body

        # The document lives in PostgreSQL, not in an SQLite file next to the index.
        with psycopg.connect(pg_server.url(name)) as conn:
            rows = conn.execute("SELECT tenant_id, doc_id FROM documents").fetchall()
            assert rows == [(TENANT, LDAP_DOC)]
            assert conn.execute("SELECT count(*) FROM points").fetchall()[0][0] > 0
        assert m.data_dir.is_dir() and not list(m.data_dir.rglob("docstore.sqlite"))

        health = httpx.get(f"{m.json_url('retrieval')}/health", timeout=10)
        assert health.status_code == 200, health.text
        assert health.json()["details"]["docstore"] == "postgresql", health.json()
        assert PASSWORD not in health.text
        for key in SERVICE_KEYS:
            log = m.log_path(key)
            assert PASSWORD not in (log.read_text(errors="replace") if log.exists() else "")
    finally:
        pg_server.drop_database(name)


def _texts(value: object) -> list[str]:
    """Every `text` / `content` string anywhere in a tool result."""
    if isinstance(value, dict):
        found = [v for k, v in value.items() if k in ("text", "content") and isinstance(v, str)]
        return found + [t for v in value.values() for t in _texts(v)]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v)]
    return []
