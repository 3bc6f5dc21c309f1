"""Answers on the sample manual through Envoy JSON: definitional questions read the user's
documents, and S3 sources name the pages the answer drew on (issue 20, §4 items 2 and 3)."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest

from services.devtools.mesh import Mesh
from tests.e2e.conftest import REPO_ROOT

pytestmark = pytest.mark.e2e

TENANT = "orchestrator-answers-e2e"
MANUAL = REPO_ROOT / "samples" / "docs" / "orion-x-operations-manual.pdf"
DOC = "orion-x-operations-manual"
USER = {"user_id": "u1", "tenant_id": TENANT}


@pytest.fixture(scope="module")
def manual(mesh: Mesh) -> None:
    r = httpx.post(
        f"{mesh.json_url('retrieval')}/internal/retrieval/documents",
        json={"tenant_id": TENANT, "file_name": MANUAL.name,
              "content": base64.b64encode(MANUAL.read_bytes()).decode()},
        timeout=120,
    )  # fmt: skip
    assert r.status_code == 200, r.text


def respond(mesh: Mesh, query: str, **extra: Any) -> dict[str, Any]:
    r = httpx.post(
        f"{mesh.json_url('orchestrator')}/internal/orchestrator/respond",
        json={"query": query, "user": USER, **extra},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize(
    ("query", "page"),
    [
        ("Что такое окно обслуживания?", 1),  # «1.1. Термины» defines it on page 1
        ("Что означает критичный инцидент?", 1),
    ],
)
def test_a_definitional_question_is_answered_from_the_users_document(
    mesh: Mesh, manual, query: str, page: int
) -> None:
    body = respond(mesh, query)
    assert (body["telemetry"]["scenario"], body["telemetry"]["intent"]) == ("S1", "documents")
    top = body["sources"][0]
    assert (top["doc_id"], top["page_start"]) == (DOC, page), body["sources"]


def test_s3_sources_name_the_page_the_answer_came_from(mesh: Mesh, manual) -> None:
    # "по субботам с 01:00 до 05:00" stands on page 4 of the 4-page manual.
    body = respond(mesh, "Когда проводятся плановые работы?", doc_ids=[DOC])
    assert body["telemetry"]["scenario"] == "S3"
    assert "суббот" in body["answer"].lower()
    top = body["sources"][0]
    assert top["doc_id"] == DOC
    assert top["page_start"] <= 4 <= top["page_end"], body["sources"]
    assert (top["page_start"], top["page_end"]) != (1, 1)
