"""The main job end to end on the embedded stack: a real multi-page PDF, questions whose
answers sit on known pages, every agent scenario routed, through Envoy JSON and gRPC."""

from __future__ import annotations

import base64
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import json_format
from visior.common.v1 import common_pb2
from visior.orchestrator.v1 import orchestrator_pb2, orchestrator_pb2_grpc

from services.devtools.mesh import Mesh
from tests.e2e.conftest import REPO_ROOT

pytestmark = pytest.mark.e2e

TENANT = "agent-e2e"
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


def respond_json(mesh: Mesh, query: str, **extra: Any) -> dict[str, Any]:
    r = httpx.post(
        f"{mesh.json_url('orchestrator')}/internal/orchestrator/respond",
        json={"query": query, "user": USER, **extra},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()


async def respond_grpc(mesh: Mesh, query: str) -> dict[str, Any]:
    request = orchestrator_pb2.RespondRequest(query=query, user=common_pb2.UserContext(**USER))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{mesh.ports.grpc['orchestrator']}") as ch:
        response = await orchestrator_pb2_grpc.OrchestratorServiceStub(ch).Respond(request)
    return json_format.MessageToDict(response, preserving_proto_field_name=True)


def test_json_answer_cites_the_page_the_answer_is_on(mesh: Mesh, manual) -> None:
    # "4.1. Выдача и отзыв прав" is on page 3 of the PDF.
    body = respond_json(mesh, "Кто согласует выдачу административных прав сотруднику?")
    assert body["telemetry"]["scenario"] == "S1"
    top = body["sources"][0]
    assert (top["doc_id"], top["page_start"]) == (DOC, 3), body["sources"]
    assert "стр. 3" in body["answer"]  # it quotes what it read on that page
    assert [t["name"] for t in body["tools"]][:1] in (["read_chunk_window"], ["read_doc_section"])


async def test_grpc_answer_cites_the_page_the_answer_is_on(mesh: Mesh, manual) -> None:
    # "6.1. Обновление кластера" is on page 4.
    body = await respond_grpc(
        mesh, "Как выполняется обновление кластера: в каком порядке обновляют узлы?"
    )
    top = body["sources"][0]
    assert (top["doc_id"], top["page_start"]) == (DOC, 4), body["sources"]
    assert "поузлово" in body["answer"].lower() or "узел" in body["answer"].lower()


def test_selected_small_document_is_read_in_full(mesh: Mesh, manual) -> None:
    body = respond_json(mesh, "Когда проводятся плановые работы?", doc_ids=[DOC])
    assert body["telemetry"]["scenario"] == "S3"
    assert [t["name"] for t in body["tools"]] == ["load_documents_full"]
    assert "суббот" in body["answer"].lower()  # "по субботам с 01:00 до 05:00"


def test_currency_rate_from_the_bank_stand_in_is_labelled(mesh: Mesh) -> None:
    body = respond_json(mesh, "Какой курс доллара сегодня?")
    t = body["telemetry"]
    assert (t["scenario"], t["intent"]) == ("S2", "currency_rates")
    assert [x["name"] for x in body["tools"]] == ["fetch_cbr_data"]
    assert "USD" in body["answer"] and "₽" in body["answer"]
    assert "демо" in body["answer"].lower() or "demo" in body["answer"].lower()


def test_key_rate_and_unclear_requests(mesh: Mesh) -> None:
    body = respond_json(mesh, "Какая сейчас ключевая ставка?")
    assert body["telemetry"]["intent"] == "key_rate"
    assert "%" in body["answer"]
    body = respond_json(mesh, "помоги")
    assert body["telemetry"]["scenario"] == "S5"
    asked = [line for line in body["answer"].splitlines() if line.startswith("- ")]
    assert len(asked) == 3 and all(q.endswith("?") for q in asked)
    assert body["tools"] == []


def test_english_question_gets_an_english_answer(mesh: Mesh, manual) -> None:
    body = respond_json(mesh, "In what order are cluster nodes updated during maintenance?")
    assert body["sources"][0]["page_start"] == 4, body["sources"]
    assert body["answer"].startswith("**In short:**")  # English question, English frame


def test_the_gateways_input_verdict_is_passed_through(mesh: Mesh) -> None:
    url = f"{mesh.json_url('orchestrator')}/internal/orchestrator/respond"
    body = {"query": "Привет!", "user": USER}
    r = httpx.post(url, json=body, headers={"x-visior-safety-input": "flagged"}, timeout=60)
    assert r.status_code == 200 and r.json()["safety"] == {"input": "flagged", "output": "allowed"}
    r = httpx.post(url, json=body, timeout=60)
    assert r.json()["safety"]["input"] == "allowed"
    r = httpx.post(url, json=body, headers={"x-visior-safety-input": "maybe"}, timeout=60)
    assert r.status_code == 400 and "x-visior-safety-input" in r.text


# -- definitions from the user's document; S3 pages (issue 20, §4 items 2 and 3) ------------


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
    body = respond_json(mesh, query)
    assert (body["telemetry"]["scenario"], body["telemetry"]["intent"]) == ("S1", "documents")
    top = body["sources"][0]
    assert (top["doc_id"], top["page_start"]) == (DOC, page), body["sources"]


def test_s3_sources_name_the_page_the_answer_came_from(mesh: Mesh, manual) -> None:
    # "по субботам с 01:00 до 05:00" stands on page 4 of the 4-page manual.
    body = respond_json(mesh, "Когда проводятся плановые работы?", doc_ids=[DOC])
    assert body["telemetry"]["scenario"] == "S3"
    assert "суббот" in body["answer"].lower()
    top = body["sources"][0]
    assert top["doc_id"] == DOC
    assert top["page_start"] <= 4 <= top["page_end"], body["sources"]
    assert (top["page_start"], top["page_end"]) != (1, 1)
