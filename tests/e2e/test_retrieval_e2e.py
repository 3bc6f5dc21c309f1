"""Retrieval through Envoy: a real PDF with page-accurate hits, and the vector store down."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import pytest

from services.common.topology import free_ports
from services.devtools.mesh import Mesh, Ports
from tests.e2e.conftest import REPO_ROOT, assert_error
from tests.e2e.settings_hook import settings_overrides

pytestmark = pytest.mark.e2e

MANUAL = REPO_ROOT / "samples" / "docs" / "orion-x-operations-manual.pdf"


def _post(mesh: Mesh, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{mesh.json_url('retrieval')}{path}", json=body, timeout=120)


def test_a_pdf_is_found_down_to_the_page_and_section(mesh: Mesh) -> None:
    tenant = "e2e-pdf"
    r = _post(mesh, "/internal/retrieval/documents", {
        "tenant_id": tenant, "file_name": MANUAL.name,
        "content": base64.b64encode(MANUAL.read_bytes()).decode(),
    })  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["pages"] == 4 and r.json()["sections"] > 4
    # "4.1. Выдача и отзыв прав" is on page 3 of the PDF; "6.1. Обновление кластера" on page 4.
    for query, page, heading in (
        ("кто согласует выдачу административных прав и когда их отзывают", 3, "Выдача и отзыв"),
        ("как обновлять кластер поузлово", 4, "Обновление кластера"),
    ):
        body = _post(mesh, "/internal/retrieval/search", {"query": query, "tenant_id": tenant})
        assert body.status_code == 200, body.text
        top = body.json()["hits"][0]
        assert top["page_start"] <= page <= top["page_end"], (query, top)
        section = body.json()["used_sections"][0]
        assert heading in section["title"], section


@pytest.fixture(scope="module")
def mesh_without_vector_store(tmp_path_factory: pytest.TempPathFactory):
    root: Path = tmp_path_factory.mktemp("novs")
    env = {
        "RETR_INDEX_BACKEND": "qdrant",
        "QDRANT_URL": f"http://127.0.0.1:{free_ports(1)[0]}",
        "RETR_INDEX_TIMEOUT_S": "0.3",
        **settings_overrides(index={"breaker": {"failures": 3}}),
    }
    m = Mesh(Ports.free(), root / "data", root / "run", env=env)
    m.start()
    yield m
    m.stop()


def test_vector_store_down_is_502_backend_unavailable(mesh_without_vector_store: Mesh) -> None:
    m = mesh_without_vector_store
    for _ in range(4):  # past the breaker's threshold: still the same documented answer
        r = _post(m, "/internal/retrieval/search", {"query": "LDAP", "tenant_id": "t"})
        info = assert_error(r, 502, "backend_unavailable")
        assert info["metadata"]["backend"] == "qdrant"
    health = httpx.get(f"{m.json_url('retrieval')}/health", timeout=10).json()
    assert health["details"]["index"] == "down"
    # Ingestion refuses cleanly too, with the same code.
    r = _post(m, "/internal/retrieval/documents", {
        "tenant_id": "t", "file_name": "a.md", "content": base64.b64encode(b"# A\n\nb").decode()
    })  # fmt: skip
    assert_error(r, 502, "backend_unavailable")
