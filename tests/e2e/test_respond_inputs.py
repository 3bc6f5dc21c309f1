"""Respond's input handling on the real mesh, over JSON through Envoy and over gRPC: the
safety header sent twice, a blocked input, section_ids beside doc_ids, user.roles beside
top-level ids, channel and locale limits."""

from __future__ import annotations

from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import json_format
from visior.orchestrator.v1 import orchestrator_pb2, orchestrator_pb2_grpc

from services.devtools.mesh import Mesh
from tests.e2e.conftest import LDAP_DOC, LDAP_QUESTION, LDAP_SECTION, TENANT, assert_error

pytestmark = pytest.mark.e2e

HEADER = "x-visior-safety-input"
USER = {"user_id": "inputs-e2e", "tenant_id": TENANT}


def _post(mesh: Mesh, body: dict[str, Any], headers: Any = ()) -> httpx.Response:
    return httpx.post(
        f"{mesh.json_url('orchestrator')}/internal/orchestrator/respond",
        json=body, headers=list(headers), timeout=120,
    )  # fmt: skip


def _assert_blocked(body: dict[str, Any]) -> None:
    assert body["safety"] == {"input": "blocked", "output": "allowed"}
    assert body["sources"] == [] and body["tools"] == []
    t = body["telemetry"]
    assert (t["scenario"], t["intent"], t["decided_by"]) == ("", "blocked", "safety")
    assert (t["retrieval_latency_ms"], t["model_calls"]) == (0, 0)
    assert "llm_latency_ms" not in t  # not called: the optional field is unset


@pytest.mark.parametrize("values", [("allowed", "blocked"), ("blocked", "allowed")])
def test_json_safety_header_twice_takes_the_most_severe(mesh: Mesh, values) -> None:
    r = _post(mesh, {"query": LDAP_QUESTION, "user": USER}, [(HEADER, v) for v in values])
    assert r.status_code == 200, r.text
    _assert_blocked(r.json())
    assert "безопасност" in r.json()["answer"]  # a Russian question: a Russian refusal


def test_json_flagged_and_allowed_is_flagged_and_answered(mesh: Mesh) -> None:
    r = _post(mesh, {"query": LDAP_QUESTION, "user": USER},
              [(HEADER, "allowed"), (HEADER, "flagged")])  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["safety"]["input"] == "flagged" and body["telemetry"]["scenario"] == "S1"


def test_json_an_unknown_value_beside_a_known_one_is_400(mesh: Mesh) -> None:
    r = _post(mesh, {"query": LDAP_QUESTION, "user": USER}, [(HEADER, "allowed"), (HEADER, "x")])
    assert assert_error(r, 400, "INVALID_ARGUMENT")["metadata"]["field"] == HEADER


async def test_grpc_safety_header_twice_takes_the_most_severe(mesh: Mesh) -> None:
    request = orchestrator_pb2.RespondRequest(query="How do I set up LDAP?", **USER)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{mesh.ports.grpc['orchestrator']}") as ch:
        response = await orchestrator_pb2_grpc.OrchestratorServiceStub(ch).Respond(
            request, metadata=((HEADER, "allowed"), (HEADER, "blocked"))
        )
    body = json_format.MessageToDict(
        response, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _assert_blocked(body)
    assert "safety" in body["answer"]  # an English question: an English refusal


def test_json_a_section_of_another_document_is_400_naming_section_ids(mesh: Mesh) -> None:
    stray = "orion-x-release-notes:s000-intro"
    r = _post(mesh, {"query": LDAP_QUESTION, "user": USER, "doc_ids": [LDAP_DOC],
                     "section_ids": [LDAP_SECTION, stray]})  # fmt: skip
    info = assert_error(r, 400, "INVALID_ARGUMENT")
    assert info["metadata"]["field"] == "section_ids"
    assert stray in r.json()["message"]


def test_json_a_section_of_the_selected_document_is_searched_not_read_whole(mesh: Mesh) -> None:
    r = _post(mesh, {"query": LDAP_QUESTION, "user": USER, "doc_ids": [LDAP_DOC],
                     "section_ids": [LDAP_SECTION]})  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["telemetry"]["scenario"] == "S4"
    assert {s["section_id"] for s in body["sources"]} == {LDAP_SECTION}


def test_json_roles_beside_top_level_ids_are_checked(mesh: Mesh) -> None:
    body = {"query": "LDAP", "user": {"roles": [f"r{i}" for i in range(33)]}, **USER}
    info = assert_error(_post(mesh, body), 400, "LIMIT_EXCEEDED")
    assert info["metadata"]["field"] == "user.roles"
    body["user"] = {"roles": ["ad\u0000min"]}
    assert assert_error(_post(mesh, body), 400, "INVALID_ARGUMENT")["metadata"]["field"] == (
        "user.roles"
    )


@pytest.mark.parametrize(("name", "limit"), [("channel", 64), ("locale", 35)])
def test_json_channel_and_locale_past_their_limit_are_400(mesh: Mesh, name, limit) -> None:
    body = {"query": LDAP_QUESTION, "user": USER, name: "a" * (limit + 1)}
    info = assert_error(_post(mesh, body), 400, "LIMIT_EXCEEDED")
    assert info["metadata"] == {"field": name, "limit": str(limit)}
    body[name] = "ru\u0000"
    assert assert_error(_post(mesh, body), 400, "INVALID_ARGUMENT")["metadata"]["field"] == name
