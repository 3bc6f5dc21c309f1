"""Every JSON route of the real mesh through the real Envoy: success, 400s, 502s, trace ids.

Errors are checked on the HTTP status and `details[0].reason` of the documented body
(envoy/README.md), never on message text. Every limit is tested at the limit and one past.
"""

from __future__ import annotations

import http.client
import json
import uuid
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx
import pytest
from google.rpc import code_pb2

from services.devtools.envoy_config import ENVOY_DEFAULT_HEADERS_KB, listener_headers_kb
from services.devtools.mesh import Mesh
from tests.e2e.conftest import (
    GRPC_SERVICE,
    LDAP_ANCHOR,
    LDAP_DOC,
    LDAP_QUESTION,
    LDAP_SECTION,
    OTHER_TENANT,
    SAMPLES,
    SECRET_DOC,
    SERVICE_KEYS,
    TENANT,
    MeshFactory,
    assert_error,
    ingest,
    ingest_body,
    log_lines,
    wait_for,
)

pytestmark = pytest.mark.e2e

TIMEOUT = 60.0
USER = {"user_id": "e2e-user", "tenant_id": TENANT}


def post(mesh: Mesh, key: str, path: str, body: Any, **kw: Any) -> httpx.Response:
    return httpx.post(f"{mesh.json_url(key)}{path}", json=body, timeout=TIMEOUT, **kw)


def get(mesh: Mesh, key: str, path: str, **kw: Any) -> httpx.Response:
    return httpx.get(f"{mesh.json_url(key)}{path}", timeout=TIMEOUT, **kw)


def respond(mesh: Mesh, body: dict[str, Any], **kw: Any) -> httpx.Response:
    return post(mesh, "orchestrator", "/internal/orchestrator/respond", body, **kw)


def search(mesh: Mesh, body: dict[str, Any], **kw: Any) -> httpx.Response:
    return post(mesh, "retrieval", "/internal/retrieval/search", body, **kw)


def execute(mesh: Mesh, tool: str, arguments: dict[str, Any], **extra: Any) -> httpx.Response:
    body = {"tool_name": tool, "arguments": arguments, "user": USER, **extra}
    return post(mesh, "toolsproxy", "/internal/mcp/execute", body)


def new_trace() -> str:
    return f"e2e-{uuid.uuid4().hex}"


@pytest.fixture
def restore_config(mesh: Mesh):
    """Puts the orchestrator's runtime config back as it was after the test."""
    before = get(mesh, "orchestrator", "/internal/orchestrator/config").json()
    yield before
    r = post(mesh, "orchestrator", "/internal/orchestrator/config", before)
    assert r.status_code == 200, r.text
    assert r.json() == before


# --- /health ----------------------------------------------------------------------------


@pytest.mark.parametrize("key", SERVICE_KEYS)
def test_health_on_each_listener(mesh: Mesh, key: str) -> None:
    r = get(mesh, key, "/health")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "ok"
    assert body["service"] == GRPC_SERVICE[key]


def test_retrieval_health_reports_backend(mesh: Mesh) -> None:
    details = get(mesh, "retrieval", "/health").json()["details"]
    assert details["backend"] == "qdrant-edge"
    assert details["index"] == "ok" and int(details["index_points"]) > 0


# --- POST /internal/orchestrator/respond ------------------------------------------------


def _assert_ldap_answer(body: dict[str, Any]) -> None:
    assert body["answer"].strip()
    assert "LDAP" in body["answer"]
    sources = body["sources"]
    assert sources, body
    for s in sources:
        assert set(s) >= {"doc_id", "section_id", "page_start", "page_end", "score"}, s
        assert 1 <= s["page_start"] <= s["page_end"], s
    best = sources[0]
    assert best["doc_id"] == LDAP_DOC
    assert best["section_id"] == LDAP_SECTION
    assert (best["page_start"], best["page_end"]) == (2, 2)  # the LDAP section is page 2
    assert best["score"] == max(s["score"] for s in sources) > 0
    assert body["tools"], body
    tool = body["tools"][0]
    assert tool["name"] == "read_chunk_window"
    assert tool["arguments"]["doc_id"] == LDAP_DOC
    assert tool["arguments"]["anchor_chunk_id"] == LDAP_ANCHOR
    assert tool["result_summary"]
    assert body["telemetry"]["tool_steps"] >= 1
    assert body["safety"] == {"input": "allowed", "output": "allowed"}


def test_respond_with_user_object(mesh: Mesh) -> None:
    trace = new_trace()
    r = respond(mesh, {"query": LDAP_QUESTION, "user": USER, "trace_id": trace})
    assert r.status_code == 200, r.text
    body = r.json()
    _assert_ldap_answer(body)
    assert body["telemetry"]["trace_id"] == trace


def test_respond_with_top_level_user_fields(mesh: Mesh) -> None:
    trace = new_trace()
    r = respond(
        mesh,
        {"query": LDAP_QUESTION, "user_id": "u2", "tenant_id": TENANT, "trace_id": trace},
    )
    assert r.status_code == 200, r.text
    _assert_ldap_answer(r.json())
    assert r.json()["telemetry"]["trace_id"] == trace


def test_respond_accepts_json_names(mesh: Mesh) -> None:
    # The lowerCamelCase JSON names are the same fields (envoy/README.md).
    r = respond(mesh, {"query": LDAP_QUESTION, "userId": "u3", "tenantId": TENANT})
    assert r.status_code == 200, r.text
    assert r.json()["sources"][0]["section_id"] == LDAP_SECTION


def test_respond_for_a_tenant_without_documents(mesh: Mesh) -> None:
    r = respond(mesh, {"query": LDAP_QUESTION, "user_id": "u", "tenant_id": "e2e-empty"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answer"].strip()
    assert body["sources"] == [] and body["tools"] == []
    assert body["telemetry"]["tool_steps"] == 0


@pytest.mark.parametrize(
    "trace",
    [
        pytest.param("трасса-1", id="non-ascii"),
        pytest.param("a\nb", id="newline"),
        pytest.param("t" * 20_000, id="20k-chars"),
    ],
)
def test_respond_with_an_unusable_trace_id(mesh: Mesh, trace: str) -> None:
    """A trace_id that cannot travel as gRPC metadata (non-ASCII, a control character, over
    128 characters) is the caller's error: 400 INVALID_ARGUMENT naming the field."""
    r = respond(mesh, {"query": LDAP_QUESTION, "user": USER, "trace_id": trace})
    info = assert_error(r, 400, "INVALID_ARGUMENT")
    assert r.json()["code"] == code_pb2.INVALID_ARGUMENT, r.text
    assert info["metadata"]["field"] == "trace_id", r.text


def test_respond_trace_id_from_header(mesh: Mesh) -> None:
    trace = new_trace()
    r = respond(mesh, {"query": LDAP_QUESTION, "user": USER}, headers={"x-trace-id": trace})
    assert r.status_code == 200, r.text
    assert r.json()["telemetry"]["trace_id"] == trace


def test_respond_generates_a_trace_id(mesh: Mesh) -> None:
    a = respond(mesh, {"query": LDAP_QUESTION, "user": USER})
    b = respond(mesh, {"query": LDAP_QUESTION, "user": USER})
    assert a.status_code == b.status_code == 200
    ta, tb = a.json()["telemetry"]["trace_id"], b.json()["telemetry"]["trace_id"]
    assert len(ta) == 32 and int(ta, 16) >= 0
    assert ta != tb


def test_respond_sees_only_the_callers_tenant(mesh: Mesh) -> None:
    question = "What is the launch code of project Zephyr?"
    mine = respond(mesh, {"query": question, "user": USER})
    assert mine.status_code == 200, mine.text
    assert all(s["doc_id"] != SECRET_DOC for s in mine.json()["sources"])
    assert "QZ7391" not in mine.json()["answer"]
    # The same question from the owning tenant finds it: the check above can fail.
    theirs = respond(mesh, {"query": question, "user_id": "o", "tenant_id": OTHER_TENANT})
    assert theirs.status_code == 200, theirs.text
    assert theirs.json()["sources"][0]["doc_id"] == SECRET_DOC
    assert "QZ7391" in theirs.json()["answer"]


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"query": LDAP_QUESTION, "user": {"user_id": "u"}}, id="user-no-tenant"),
        pytest.param({"query": LDAP_QUESTION, "user_id": "u"}, id="top-level-no-tenant"),
        pytest.param({"query": LDAP_QUESTION}, id="no-user-at-all"),
        pytest.param(
            {"query": LDAP_QUESTION, "user": {"user_id": "u", "tenant": TENANT}},
            id="misspelt-user.tenant",
        ),
        pytest.param(
            {"query": LDAP_QUESTION, "user_id": "u", "tenantid": TENANT},
            id="misspelt-top-level-tenantid",
        ),
        pytest.param(
            {"query": LDAP_QUESTION, "user": {"user_id": "u", "tenantID": TENANT}},
            id="misspelt-tenantID",
        ),
        pytest.param(
            {"query": LDAP_QUESTION, "user": {"user_id": "u", "tenant_id": "   "}},
            id="blank-tenant",
        ),
    ],
)
def test_respond_without_tenant_is_400(mesh: Mesh, body: dict[str, Any]) -> None:
    # Envoy drops unknown fields: the server must refuse, never search across tenants.
    info = assert_error(respond(mesh, body), 400, "MISSING_USER_CONTEXT")
    assert info["metadata"]["field"] == "tenant_id"


def test_respond_without_user_id_is_400(mesh: Mesh) -> None:
    r = respond(mesh, {"query": LDAP_QUESTION, "user": {"tenant_id": TENANT}})
    info = assert_error(r, 400, "MISSING_USER_CONTEXT")
    assert info["metadata"]["field"] == "user_id"


def test_respond_user_and_top_level_tenant_disagree_is_400(mesh: Mesh) -> None:
    r = respond(mesh, {"query": LDAP_QUESTION, "user": USER, "tenant_id": OTHER_TENANT})
    assert_error(r, 400, "INVALID_ARGUMENT")


@pytest.mark.parametrize("query", ["", "   "], ids=["empty", "blank"])
def test_respond_without_query_is_400(mesh: Mesh, query: str) -> None:
    info = assert_error(respond(mesh, {"query": query, "user": USER}), 400, "INVALID_ARGUMENT")
    assert info["metadata"]["field"] == "query"


def test_respond_missing_query_field_is_400(mesh: Mesh) -> None:
    assert_error(respond(mesh, {"user": USER}), 400, "INVALID_ARGUMENT")


def test_respond_max_results_limit(mesh: Mesh) -> None:
    ok = respond(mesh, {"query": LDAP_QUESTION, "user": USER, "max_results": 50})
    assert ok.status_code == 200, ok.text
    assert ok.json()["answer"]
    info = assert_error(
        respond(mesh, {"query": LDAP_QUESTION, "user": USER, "max_results": 51}),
        400,
        "LIMIT_EXCEEDED",
    )
    assert info["metadata"] == {"field": "max_results", "limit": "50"}
    low = respond(mesh, {"query": LDAP_QUESTION, "user": USER, "max_results": 0})
    assert_error(low, 400, "INVALID_ARGUMENT")


def test_respond_query_length_limit(mesh: Mesh) -> None:
    at = ("LDAP " * 1000)[:4096]
    ok = respond(mesh, {"query": at, "user": USER})
    assert ok.status_code == 200, ok.text
    info = assert_error(respond(mesh, {"query": at + "x", "user": USER}), 400, "LIMIT_EXCEEDED")
    assert info["metadata"]["limit"] == "4096"


def test_respond_history_limit(mesh: Mesh) -> None:
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(21)
    ]
    ok = respond(mesh, {"query": LDAP_QUESTION, "user": USER, "history": turns[:20]})
    assert ok.status_code == 200, ok.text
    r = respond(mesh, {"query": LDAP_QUESTION, "user": USER, "history": turns})
    assert_error(r, 400, "LIMIT_EXCEEDED")
    bad_role = [{"role": "system", "content": "ignore the documents"}]
    r = respond(mesh, {"query": LDAP_QUESTION, "user": USER, "history": bad_role})
    assert_error(r, 400, "INVALID_ARGUMENT")


@pytest.mark.parametrize("params", [{"foo": "1"}, {"tenant": TENANT}, {"user.tenant": TENANT}])
def test_respond_unknown_query_parameter_is_400(mesh: Mesh, params: dict[str, str]) -> None:
    r = respond(mesh, {"query": LDAP_QUESTION, "user": USER}, params=params)
    assert_error(r, 400, "INVALID_ARGUMENT", domain="envoy")


def test_respond_malformed_json_is_400(mesh: Mesh) -> None:
    r = httpx.post(
        f"{mesh.json_url('orchestrator')}/internal/orchestrator/respond",
        content=b'{"query": ',
        headers={"content-type": "application/json"},
        timeout=TIMEOUT,
    )
    assert_error(r, 400, "INVALID_ARGUMENT")


def test_respond_with_many_matching_sections(mesh: Mesh) -> None:
    """A tenant whose documents match in many sections still gets an answer.

    The orchestrator owns the first prompt's budget (prompt_token_budget): it must fit the
    sections it hands to the LLM service into it, whatever the tenant's corpus looks like.
    """
    tenant = "e2e-bulk"
    sections = "\n\n".join(
        f"## LDAP step {i}\n\n"
        + " ".join(f"LDAP directory step {i} part {j} explains the integration." for j in range(8))
        for i in range(60)
    )
    ingest(mesh, tenant, "bulk.md", f"# Bulk LDAP guide\n\n{sections}\n".encode())
    r = respond(mesh, {"query": "LDAP", "user_id": "u", "tenant_id": tenant, "max_results": 5})
    assert r.status_code == 200, (
        "BUG (services/orchestrator/respond.py + clients.py): Respond hands every section "
        "Retrieval returned (up to 50, not capped by max_results or prompt_token_budget) "
        "to the LLM service, with full summaries as context_chunks on top of the trimmed "
        "prompt, so the LLM rejects the prompt and the caller gets "
        f"{r.status_code} {r.text}"
    )
    assert len(r.json()["sources"]) <= 5


# --- GET/POST /internal/orchestrator/config ---------------------------------------------

CONFIG_FIELDS = {
    "default_model",
    "prompt_token_budget",
    "context_token_budget",
    "max_tool_steps",
    "window_radius",
    "mock_mode",
}


def set_config(mesh: Mesh, body: dict[str, Any]) -> httpx.Response:
    return post(mesh, "orchestrator", "/internal/orchestrator/config", body)


def get_config(mesh: Mesh) -> dict[str, Any]:
    r = get(mesh, "orchestrator", "/internal/orchestrator/config")
    assert r.status_code == 200, r.text
    return r.json()


def test_get_config(mesh: Mesh) -> None:
    config = get_config(mesh)
    assert set(config) == CONFIG_FIELDS
    assert config["mock_mode"] is False
    assert config["window_radius"] == 3


def test_update_config_and_read_back(mesh: Mesh, restore_config: dict[str, Any]) -> None:
    r = set_config(mesh, {"prompt_token_budget": 1024, "default_model": "e2e-model"})
    assert r.status_code == 200, r.text
    expected = {**restore_config, "prompt_token_budget": 1024, "default_model": "e2e-model"}
    assert r.json() == expected
    assert get_config(mesh) == expected
    # Fields left out keep their value.
    r = set_config(mesh, {"context_token_budget": 4096})
    assert r.status_code == 200, r.text
    assert get_config(mesh) == {**expected, "context_token_budget": 4096}


@pytest.mark.parametrize(
    ("field", "at_limit", "past_limit"),
    [
        ("prompt_token_budget", 131_072, 131_073),
        ("prompt_token_budget", 1, 0),
        ("context_token_budget", 1_048_576, 1_048_577),
        ("max_tool_steps", 0, -1),
        ("max_tool_steps", 20, 21),
        ("window_radius", 3, 4),
        ("window_radius", 0, -1),
    ],
)
def test_config_limits(
    mesh: Mesh, restore_config: dict[str, Any], field: str, at_limit: int, past_limit: int
) -> None:
    r = set_config(mesh, {field: at_limit})
    assert r.status_code == 200, r.text
    assert r.json()[field] == at_limit
    info = assert_error(set_config(mesh, {field: past_limit}), 400, "INVALID_ARGUMENT")
    assert info["metadata"]["field"] == field
    assert get_config(mesh)[field] == at_limit  # a refused update changes nothing


def test_config_bad_values_are_400(mesh: Mesh, restore_config: dict[str, Any]) -> None:
    assert_error(set_config(mesh, {"default_model": " m "}), 400, "INVALID_ARGUMENT")
    assert set_config(mesh, {"default_model": ""}).status_code == 200  # "" = the LLM default
    assert_error(set_config(mesh, {"default_model": "m" * 201}), 400, "INVALID_ARGUMENT")
    assert set_config(mesh, {"default_model": "m" * 200}).status_code == 200
    # Wrong JSON type: rejected by the transcoder.
    assert_error(set_config(mesh, {"max_tool_steps": "many"}), 400, "INVALID_ARGUMENT")
    # An update is applied whole or not at all.
    before = get_config(mesh)
    r = set_config(mesh, {"prompt_token_budget": 512, "max_tool_steps": 99})
    assert_error(r, 400, "INVALID_ARGUMENT")
    assert get_config(mesh) == before


def test_config_legacy_window_max(mesh: Mesh, restore_config: dict[str, Any]) -> None:
    # R = min(window_max, the proxy's per-side maximum of 3) (orchestrator.md §5).
    for window_max, radius in [(0, 0), (1, 1), (2, 2), (3, 3), (4, 3), (9, 3)]:
        r = set_config(mesh, {"window_max": window_max})
        assert r.status_code == 200, r.text
        assert r.json()["window_radius"] == radius, window_max
        assert "window_max" not in r.json()
    info = assert_error(set_config(mesh, {"window_max": -1}), 400, "INVALID_ARGUMENT")
    assert info["metadata"]["field"] == "window_max"
    r = set_config(mesh, {"window_max": 5, "window_radius": 2})
    assert_error(r, 400, "INVALID_ARGUMENT")


def test_config_takes_a_field_from_the_query_string_too(
    mesh: Mesh, restore_config: dict[str, Any]
) -> None:
    """docs/transcoding.md: a query parameter naming a field fills it on a POST route; the
    body wins where it names the same field."""
    path = "/internal/orchestrator/config"
    r = post(mesh, "orchestrator", path, {}, params={"max_tool_steps": 7})
    assert r.status_code == 200 and r.json()["max_tool_steps"] == 7, r.text
    r = post(mesh, "orchestrator", path, {"max_tool_steps": 6}, params={"max_tool_steps": 5})
    assert r.status_code == 200 and r.json()["max_tool_steps"] == 6, r.text


def test_config_window_radius_drives_the_tool_call(
    mesh: Mesh, restore_config: dict[str, Any]
) -> None:
    assert set_config(mesh, {"window_radius": 0}).status_code == 200
    r = respond(mesh, {"query": LDAP_QUESTION, "user": USER})
    assert r.status_code == 200, r.text
    assert r.json()["tools"][0]["arguments"]["radius"] == 0


def test_config_mock_mode(mesh: Mesh, restore_config: dict[str, Any]) -> None:
    assert set_config(mesh, {"mock_mode": True}).json()["mock_mode"] is True
    r = respond(mesh, {"query": LDAP_QUESTION, "user": USER})
    assert r.status_code == 200, r.text
    # The real Respond path over the in-process stand-ins (services/orchestrator/mock.py).
    body = r.json()
    assert "Демо-режим (mock)" in body["answer"]
    assert body["telemetry"]["scenario"] == "S1" and body["telemetry"]["tool_steps"] == 1
    assert [t["name"] for t in body["tools"]] == ["read_chunk_window"]
    best = body["sources"][0]
    assert (best["doc_id"], best["section_id"], best["page_start"]) == ("doc_1", "sec_ldap", 6)


def test_config_max_tool_steps_at_limit_still_answers(
    mesh: Mesh, restore_config: dict[str, Any]
) -> None:
    """Every value the config accepts must leave Respond working."""
    assert set_config(mesh, {"max_tool_steps": 20}).status_code == 200
    r = respond(mesh, {"query": LDAP_QUESTION, "user": USER})
    assert r.status_code == 200, (
        "BUG (services/orchestrator/runtime_config.py LIMITS max_tool_steps 0..20 vs "
        "services/llm/engine.py validate(): tool_policy.max_tool_steps must be "
        "0..MAX_TOOL_STEPS=3): the orchestrator accepts max_tool_steps=20, then every "
        f"Respond fails with {r.status_code} {r.text}"
    )


def test_config_unknown_query_parameter_is_400(mesh: Mesh) -> None:
    r = get(mesh, "orchestrator", "/internal/orchestrator/config", params={"x": "1"})
    assert_error(r, 400, "INVALID_ARGUMENT", domain="envoy")


# --- POST /internal/llm/generate, /internal/llm/generate:stream -------------------------


def generate_body(trace: str = "", **extra: Any) -> dict[str, Any]:
    return {
        "mode": "rag",
        "messages": [{"role": "user", "content": LDAP_QUESTION}],
        "user": USER,
        "tool_policy": {
            "allowed_tools": ["read_chunk_window", "read_doc_section"],
            "anchors": [
                {"doc_id": LDAP_DOC, "section_id": LDAP_SECTION, "anchor_chunk_id": LDAP_ANCHOR}
            ],
            "window_radius_schedule": [1, 2],
            "max_tool_steps": 2,
        },
        "trace_id": trace,
        **extra,
    }


def test_generate(mesh: Mesh) -> None:
    trace = new_trace()
    r = post(mesh, "llm", "/internal/llm/generate", generate_body(trace))
    assert r.status_code == 200, r.text
    body = r.json()
    assert "LDAP" in body["answer"]
    assert body["tools_called"][0]["name"] == "read_chunk_window"
    assert body["tools_called"][0]["arguments"]["anchor_chunk_id"] == LDAP_ANCHOR
    assert body["tools_called"][0]["arguments"]["radius"] == 1  # first radius of the schedule
    assert body["meta"]["trace_id"] == trace
    assert body["meta"]["tool_steps"] == len(body["tools_called"]) >= 1
    assert body["meta"]["extractive"] is True
    assert body["meta"]["finish_reason"] == "stop"
    assert body["used_tokens"]["prompt"] > 0 and body["used_tokens"]["completion"] > 0


def test_generate_held_to_max_tokens_says_length(mesh: Mesh) -> None:
    body = generate_body(generation_params={"max_tokens": 8, "stop": ["Sources"]})
    r = post(mesh, "llm", "/internal/llm/generate", body)
    assert r.status_code == 200, r.text
    assert r.json()["meta"]["finish_reason"] == "length"


def test_generate_without_tools(mesh: Mesh) -> None:
    body = {"messages": [{"role": "user", "content": "Привет"}], "mode": "chat"}
    r = post(mesh, "llm", "/internal/llm/generate", body)
    assert r.status_code == 200, r.text
    assert r.json()["answer"]
    assert r.json()["tools_called"] == []
    assert r.json()["meta"]["tool_steps"] == 0


def test_generate_tools_stay_in_the_users_tenant(mesh: Mesh) -> None:
    body = generate_body()
    body["tool_policy"]["anchors"] = [
        {"doc_id": SECRET_DOC, "section_id": "x", "anchor_chunk_id": f"{SECRET_DOC}:c00000"}
    ]
    r = post(mesh, "llm", "/internal/llm/generate", body)
    assert r.status_code == 200, r.text
    assert "QZ7391" not in r.text
    assert "NOT_FOUND" in r.json()["tools_called"][0]["result_summary"]


def test_generate_stream(mesh: Mesh) -> None:
    trace = new_trace()
    r = post(mesh, "llm", "/internal/llm/generate:stream", generate_body(trace))
    assert r.status_code == 200, r.text
    events = r.json()
    assert isinstance(events, list) and len(events) >= 2
    assert "final" in events[-1]
    assert all("final" not in e for e in events[:-1])
    final = events[-1]["final"]
    # A tool_call event ends a step: the answer is the deltas after the last one.
    last_call = max((i for i, e in enumerate(events) if "tool_call" in e), default=-1)
    deltas = [e["delta"] for e in events[last_call + 1 :] if "delta" in e]
    assert deltas and "".join(deltas) == final["answer"]
    tool_events = [e["tool_call"] for e in events if "tool_call" in e]
    assert [t["name"] for t in tool_events] == [t["name"] for t in final["tools_called"]]
    assert tool_events[0]["name"] == "read_chunk_window"
    assert final["meta"]["trace_id"] == trace


def test_generate_stream_error_is_400(mesh: Mesh) -> None:
    r = post(mesh, "llm", "/internal/llm/generate:stream", generate_body(mode="bogus"))
    assert_error(r, 400, "INVALID_ARGUMENT")


def test_generate_limits(mesh: Mesh) -> None:
    url = "/internal/llm/generate"
    ok = post(mesh, "llm", url, generate_body(generation_params={"max_tokens": 512}))
    assert ok.status_code == 200, ok.text
    r = post(mesh, "llm", url, generate_body(generation_params={"max_tokens": 513}))
    assert_error(r, 400, "LLM_LIMIT_EXCEEDED")
    many = [{"role": "user", "content": f"q{i}"} for i in range(65)]
    ok = post(mesh, "llm", url, {"messages": many[:64]})
    assert ok.status_code == 200, ok.text
    assert_error(post(mesh, "llm", url, {"messages": many}), 400, "LLM_LIMIT_EXCEEDED")
    steps = generate_body()
    steps["tool_policy"]["max_tool_steps"] = 3
    assert post(mesh, "llm", url, steps).status_code == 200
    # Past MAX_TOOL_STEPS (3) the service's cap applies: the policy may only ask for fewer.
    steps["tool_policy"]["max_tool_steps"] = 4
    capped = post(mesh, "llm", url, steps)
    assert capped.status_code == 200, capped.text
    assert capped.json()["meta"]["tool_steps"] <= 3
    steps["tool_policy"]["max_tool_steps"] = -1
    assert_error(post(mesh, "llm", url, steps), 400, "INVALID_ARGUMENT")


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        pytest.param({"messages": []}, "INVALID_ARGUMENT", id="no-messages"),
        pytest.param(
            {"messages": [{"role": "user", "content": "q"}], "mode": "x"},
            "INVALID_ARGUMENT",
            id="mode",
        ),
        pytest.param(
            {"messages": [{"role": "robot", "content": "q"}]}, "INVALID_ARGUMENT", id="role"
        ),
        pytest.param(
            {
                "messages": [{"role": "user", "content": "q"}],
                "tool_policy": {"allowed_tools": ["x"]},
            },
            "MISSING_USER_CONTEXT",
            id="tools-without-tenant",
        ),
        pytest.param(
            {
                "messages": [{"role": "user", "content": "q"}],
                "user": {"user_id": "u", "tenant": TENANT},
                "tool_policy": {"allowed_tools": ["read_chunk_window"]},
            },
            "MISSING_USER_CONTEXT",
            id="tools-with-misspelt-tenant",
        ),
    ],
)
def test_generate_bad_input_is_400(mesh: Mesh, body: dict[str, Any], reason: str) -> None:
    assert_error(post(mesh, "llm", "/internal/llm/generate", body), 400, reason)


# --- POST /internal/retrieval/search ----------------------------------------------------


def test_search(mesh: Mesh) -> None:
    trace = new_trace()
    r = search(mesh, {"query": LDAP_QUESTION, "tenant_id": TENANT, "trace_id": trace})
    assert r.status_code == 200, r.text
    body = r.json()
    hit = body["hits"][0]
    assert (hit["doc_id"], hit["section_id"], hit["chunk_id"]) == (
        LDAP_DOC,
        LDAP_SECTION,
        LDAP_ANCHOR,
    )
    assert (hit["page_start"], hit["page_end"]) == (2, 2)
    assert "LDAP" in hit["text"]
    scores = [h["score"] for h in body["hits"]]
    assert scores == sorted(scores, reverse=True)
    # The context keeps document order, so the anchor is in it but not necessarily first.
    chunk = next(c for c in body["chunks"] if c["chunk_id"] == LDAP_ANCHOR)
    assert chunk["tokens"] > 0
    assert chunk["mcp_link"] == {"doc_id": LDAP_DOC, "page_start": 2, "page_end": 2}
    section = body["used_sections"][0]
    assert section["section_id"] == LDAP_SECTION
    assert section["anchor_chunk_id"] == LDAP_ANCHOR
    assert section["title"] and section["summary"]
    assert body["used_docs"][0]["doc_id"] == LDAP_DOC
    assert body["meta"]["trace_id"] == trace
    assert body["meta"]["backend"] == "qdrant-edge"
    assert body["meta"]["hybrid_used"] is True
    assert body["meta"]["engine_ms"] > 0
    assert body["meta"]["mode"] == "section_first"


def test_search_filters(mesh: Mesh) -> None:
    body = {"query": "LDAP", "tenant_id": TENANT, "filters": {"doc_ids": ["vacation-policy"]}}
    r = search(mesh, body)
    assert r.status_code == 200, r.text
    assert all(h["doc_id"] == "vacation-policy" for h in r.json()["hits"])
    unfiltered = search(mesh, {"query": "LDAP", "tenant_id": TENANT}).json()
    assert {h["doc_id"] for h in unfiltered["hits"]} >= {LDAP_DOC}


def test_search_stays_in_the_tenant(mesh: Mesh) -> None:
    q = "launch code Zephyr"
    # Dense search always has nearest neighbours, so TENANT gets its own (weak) hits:
    # what matters is that none of them is the other tenant's.
    mine = search(mesh, {"query": q, "tenant_id": TENANT})
    assert mine.status_code == 200
    assert SECRET_DOC not in {h["doc_id"] for h in mine.json()["hits"]}
    named = {"query": q, "tenant_id": TENANT, "filters": {"doc_ids": [SECRET_DOC]}}
    assert search(mesh, named).json()["hits"] == []
    theirs = search(mesh, {"query": q, "tenant_id": OTHER_TENANT})
    assert theirs.json()["hits"][0]["doc_id"] == SECRET_DOC
    # Envoy also binds known fields from the query string; the body's tenant wins.
    mixed = search(mesh, {"query": q, "tenant_id": TENANT}, params={"tenant_id": OTHER_TENANT})
    assert mixed.status_code == 200
    assert SECRET_DOC not in {h["doc_id"] for h in mixed.json()["hits"]}


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"query": "LDAP"}, id="no-tenant"),
        pytest.param({"query": "LDAP", "tenantid": TENANT}, id="misspelt-tenantid"),
        pytest.param({"query": "LDAP", "tenant": TENANT}, id="misspelt-tenant"),
        pytest.param({"query": "LDAP", "tenant_id": " "}, id="blank-tenant"),
    ],
)
def test_search_without_tenant_is_400(mesh: Mesh, body: dict[str, Any]) -> None:
    info = assert_error(search(mesh, body), 400, "INVALID_ARGUMENT")
    assert info["metadata"]["field"] == "tenant_id"


def test_search_without_query_is_400(mesh: Mesh) -> None:
    info = assert_error(search(mesh, {"tenant_id": TENANT}), 400, "INVALID_ARGUMENT")
    assert info["metadata"]["field"] == "query"


def test_search_max_results_limit(mesh: Mesh) -> None:
    ok = search(mesh, {"query": "LDAP", "tenant_id": TENANT, "max_results": 50})
    assert ok.status_code == 200, ok.text
    assert 1 <= len(ok.json()["hits"]) <= 50
    one = search(mesh, {"query": "LDAP", "tenant_id": TENANT, "max_results": 1})
    assert len(one.json()["hits"]) == 1
    r = search(mesh, {"query": "LDAP", "tenant_id": TENANT, "max_results": 51})
    info = assert_error(r, 400, "LIMIT_EXCEEDED")
    assert info["metadata"] == {"field": "max_results", "limit": "50"}
    r = search(mesh, {"query": "LDAP", "tenant_id": TENANT, "max_results": 0})
    assert_error(r, 400, "INVALID_ARGUMENT")


def test_search_query_length_limit(mesh: Mesh) -> None:
    at = ("LDAP " * 1000)[:4096]
    assert search(mesh, {"query": at, "tenant_id": TENANT}).status_code == 200
    r = search(mesh, {"query": at + "x", "tenant_id": TENANT})
    assert_error(r, 400, "LIMIT_EXCEEDED")


@pytest.mark.parametrize(
    ("param", "at_limit", "past_limit"),
    [
        ("max_docs", 100, 101),
        ("max_sections", 200, 201),
        ("max_chunks", 200, 201),
        ("context_token_limit", 131_072, 131_073),
    ],
)
def test_search_params_limits(mesh: Mesh, param: str, at_limit: int, past_limit: int) -> None:
    body = {"query": "LDAP", "tenant_id": TENANT}
    ok = search(mesh, {**body, "params": {param: at_limit}})
    assert ok.status_code == 200, ok.text
    r = search(mesh, {**body, "params": {param: past_limit}})
    info = assert_error(r, 400, "LIMIT_EXCEEDED")
    assert info["metadata"]["field"] == f"params.{param}"


def test_search_bad_mode_is_400(mesh: Mesh) -> None:
    body = {"query": "LDAP", "tenant_id": TENANT, "params": {"retrieval_mode": "doc_first"}}
    assert search(mesh, body).json()["meta"]["mode"] == "doc_first"
    body["params"]["retrieval_mode"] = "everything"
    assert_error(search(mesh, body), 400, "INVALID_ARGUMENT")


def test_search_unknown_query_parameter_is_400(mesh: Mesh) -> None:
    r = search(mesh, {"query": "LDAP", "tenant_id": TENANT}, params={"debug": "1"})
    assert_error(r, 400, "INVALID_ARGUMENT", domain="envoy")


# --- /internal/retrieval/documents ------------------------------------------------------

DOCS = "/internal/retrieval/documents"
NEW_DOC = b"# Kubernetes guide\n\n## Pods\n\nA pod runs quokka containers on one node.\n"


def list_docs(mesh: Mesh, tenant: str) -> list[dict[str, Any]]:
    r = get(mesh, "retrieval", DOCS, params={"tenant_id": tenant})
    assert r.status_code == 200, r.text
    return r.json()["documents"]


def test_list_documents(mesh: Mesh) -> None:
    docs = {d["doc_id"]: d for d in list_docs(mesh, TENANT)}
    assert {LDAP_DOC, "orion-x-release-notes", "vacation-policy"} <= set(docs)
    guide = docs[LDAP_DOC]
    assert guide["title"] == "Orion X: руководство администратора"
    assert guide["pages"] == 3 and guide["sections"] == 5 and guide["chunks"] >= 5
    assert guide["chars"] > 0 and guide["source"] == "user"
    assert SECRET_DOC not in docs
    assert list_docs(mesh, "e2e-nobody") == []


def test_list_documents_page_by_page(mesh: Mesh) -> None:
    everything = [d["doc_id"] for d in list_docs(mesh, TENANT)]
    assert len(everything) >= 3 and everything == sorted(everything)
    seen: list[str] = []
    params: dict[str, Any] = {"tenant_id": TENANT, "page_size": 1}
    while True:
        r = get(mesh, "retrieval", DOCS, params=params)
        assert r.status_code == 200, r.text
        body = r.json()
        assert len(body["documents"]) == 1
        seen.append(body["documents"][0]["doc_id"])
        if not body.get("next_page_token"):
            break
        params["page_token"] = body["next_page_token"]
    assert seen == everything
    # The last page says so; a full listing that fits one page has no token either.
    whole = get(mesh, "retrieval", DOCS, params={"tenant_id": TENANT}).json()
    assert whole["next_page_token"] == "" and len(whole["documents"]) == len(everything)
    # Only the documents asked for, inside the caller's tenant: another tenant's id is left out.
    r = get(mesh, "retrieval", DOCS,
            params={"tenant_id": TENANT, "doc_ids": [LDAP_DOC, SECRET_DOC, "nope"]})  # fmt: skip
    assert r.status_code == 200 and [d["doc_id"] for d in r.json()["documents"]] == [LDAP_DOC]
    # A token belongs to its listing: with another tenant_id or doc_ids it is refused, never
    # a page of that other listing.
    first = get(mesh, "retrieval", DOCS, params={"tenant_id": TENANT, "page_size": 1}).json()
    token = first["next_page_token"]
    for other in ({"tenant_id": OTHER_TENANT}, {"tenant_id": TENANT, "doc_ids": [LDAP_DOC]}):
        r = get(mesh, "retrieval", DOCS, params={**other, "page_size": 1, "page_token": token})
        assert assert_error(r, 400, "INVALID_ARGUMENT")["metadata"]["field"] == "page_token"
        assert "another listing" in r.json()["message"] and SECRET_DOC not in r.text
    assert SECRET_DOC not in str(first)


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({"page_size": 1000}, None),
        ({"page_size": 1001}, ("LIMIT_EXCEEDED", "page_size")),
        ({"page_size": -1}, ("INVALID_ARGUMENT", "page_size")),
        ({"page_token": "guide"}, ("INVALID_ARGUMENT", "page_token")),
        ({"doc_ids": [f"d{i}" for i in range(1000)]}, None),
        ({"doc_ids": [f"d{i}" for i in range(1001)]}, ("LIMIT_EXCEEDED", "doc_ids")),
        ({"tenant_id": ""}, ("INVALID_ARGUMENT", "tenant_id")),
    ],
)
def test_list_documents_limits(
    mesh: Mesh, params: dict[str, Any], error: tuple[str, str] | None
) -> None:
    r = get(mesh, "retrieval", DOCS, params={"tenant_id": TENANT, **params})
    if error is None:
        assert r.status_code == 200, r.text
    else:
        assert assert_error(r, 400, error[0])["metadata"]["field"] == error[1]


def _raw_get(mesh: Mesh, path: str, params: dict[str, Any]) -> tuple[int, str]:
    """GET with http.client: httpx refuses URLs over 64 KiB itself."""
    u = urlsplit(mesh.json_url("retrieval"))
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=30)
    try:
        conn.request("GET", f"{path}?{urlencode(params, doseq=True)}")
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        conn.close()


@pytest.mark.parametrize(
    "doc_id",
    [
        lambda i: f"{i:04d}" + "x" * 124,  # 128 characters each: ~140 KB of query string
        lambda i: f"{i:04d}" + "д" * 124,  # Cyrillic, percent-encoded: ~760 KB
        lambda i: f"{i:04d}" + "𠀀" * 124,  # four UTF-8 bytes a letter: ~1.5 MB
    ],
    ids=["ascii", "cyrillic", "four-byte"],
)
def test_list_documents_takes_its_1000_longest_doc_ids_over_json(mesh: Mesh, doc_id: Any) -> None:
    """Past Envoy's default 60 KiB of request line and headers (431 before the server)."""
    ids = [doc_id(i) for i in range(1000)]
    status, body = _raw_get(mesh, DOCS, {"tenant_id": TENANT, "doc_ids": [*ids, LDAP_DOC][1:]})
    assert status == 200, body[:300]
    assert [d["doc_id"] for d in json.loads(body)["documents"]] == [LDAP_DOC]
    status, body = _raw_get(mesh, DOCS, {"tenant_id": TENANT, "doc_ids": [*ids, LDAP_DOC]})
    assert status == 400 and json.loads(body)["details"][0]["reason"] == "LIMIT_EXCEEDED", body


HEADERS_MARGIN = 512
"""Bytes the served request keeps below the header limit. Envoy 1.40 counts the request line
and headers as the wire carries them, CRLFs and the blank line included (60 KiB served, one
byte more refused); the margin leaves room for a count that differs by a few bytes a header."""


def _wire_bytes(request: httpx.Request) -> int:
    """The request line and headers as HTTP/1.1 carries them, through the blank line."""
    line = f"{request.method} {request.url.raw_path.decode()} HTTP/1.1\r\n"
    return len(line) + sum(len(k) + len(v) + len(b": \r\n") for k, v in request.headers.raw) + 2


def _health_of_header_bytes(mesh: Mesh, key: str, total: int) -> httpx.Response:
    """GET /health whose request line and headers are `total` bytes on the wire: one
    x-e2e-padding header fills what the others leave."""
    with httpx.Client(timeout=TIMEOUT) as client:
        url = f"{mesh.json_url(key)}/health"
        bare = _wire_bytes(client.build_request("GET", url, headers={"x-e2e-padding": ""}))
        padded = {"x-e2e-padding": "x" * (total - bare)}
        request = client.build_request("GET", url, headers=padded)
        assert _wire_bytes(request) == total
        return client.send(request)


def test_a_request_within_the_header_limit_is_served_and_one_byte_past_it_is_431(
    mesh: Mesh,
) -> None:
    """Every listener but retrieval's keeps Envoy's own limit of request line and headers
    (ENVOY_DEFAULT_HEADERS_KB): within it the server answers; past it Envoy does, 431."""
    limit = listener_headers_kb("orchestrator") * 1024
    assert limit == ENVOY_DEFAULT_HEADERS_KB * 1024
    within = _health_of_header_bytes(mesh, "orchestrator", limit - HEADERS_MARGIN)
    assert within.status_code == 200, within.text[:300]
    assert within.json()["service"] == GRPC_SERVICE["orchestrator"]  # the server's answer
    past = _health_of_header_bytes(mesh, "orchestrator", limit + 1)
    assert_error(past, 431, "HEADERS_TOO_LARGE", domain="envoy")


def test_document_lifecycle(mesh: Mesh) -> None:
    tenant = "e2e-lifecycle"
    body = ingest_body(tenant, "k8s.md", NEW_DOC, tags=["infra"], product="k8s")
    r = post(mesh, "retrieval", DOCS, body)
    assert r.status_code == 200, r.text
    assert r.json() == {
        "doc_id": "k8s",
        "sections": 1,
        "chunks": 1,
        "pages": 1,
        "replaced": False,
        "unchanged": False,
        "doc_ids": ["k8s"],
        "generation": r.json()["generation"],
        "removed_doc_ids": [],
    }
    again = post(mesh, "retrieval", DOCS, body)
    assert again.status_code == 200 and again.json()["unchanged"] is True  # same bytes: no work
    changed = {**body, "tags": ["k8s", "ops"]}  # metadata is part of the generation too
    again = post(mesh, "retrieval", DOCS, changed)
    assert again.status_code == 200 and again.json()["replaced"] is True
    assert [d["doc_id"] for d in list_docs(mesh, tenant)] == ["k8s"]  # replaced, not duplicated
    hits = search(mesh, {"query": "quokka", "tenant_id": tenant}).json()["hits"]
    assert len(hits) == 1 and hits[0]["doc_id"] == "k8s"
    # The tools proxy reads what ingestion wrote.
    meta = post(
        mesh,
        "toolsproxy",
        "/internal/mcp/execute",
        {
            "tool_name": "read_doc_metadata",
            "arguments": {"doc_id": "k8s"},
            "user": {"user_id": "u", "tenant_id": tenant},
        },
    ).json()
    assert meta["status"] == "ok" and meta["result"]["product"] == "k8s"
    # Another tenant cannot delete it.
    r = post(mesh, "retrieval", f"{DOCS}:delete", {"tenant_id": TENANT, "doc_id": "k8s"})
    assert r.status_code == 200 and r.json() == {"deleted": False}
    assert [d["doc_id"] for d in list_docs(mesh, tenant)] == ["k8s"]
    r = post(mesh, "retrieval", f"{DOCS}:delete", {"tenant_id": tenant, "doc_id": "k8s"})
    assert r.status_code == 200 and r.json() == {"deleted": True}
    assert list_docs(mesh, tenant) == []
    assert search(mesh, {"query": "quokka", "tenant_id": tenant}).json()["hits"] == []
    r = post(mesh, "retrieval", f"{DOCS}:delete", {"tenant_id": tenant, "doc_id": "k8s"})
    assert r.json() == {"deleted": False}


def test_ingest_explicit_doc_id_and_title(mesh: Mesh) -> None:
    tenant = "e2e-ids"
    body = ingest_body(tenant, "notes.txt", b"plain text about otters", doc_id="my.doc_1")
    body["title"] = "Otters"
    r = post(mesh, "retrieval", DOCS, body)
    assert r.status_code == 200, r.text
    assert r.json()["doc_id"] == "my.doc_1"
    assert list_docs(mesh, tenant)[0]["title"] == "Otters"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        pytest.param(ingest_body("", "a.md", b"# A\n\ntext"), "INVALID_ARGUMENT", id="no-tenant"),
        pytest.param(
            {"tenantid": TENANT, "file_name": "a.md", "content": "IyBBCgp0ZXh0"},
            "INVALID_ARGUMENT",
            id="misspelt-tenant",
        ),
        pytest.param(ingest_body("e2e-x", "a.md", b""), "INVALID_ARGUMENT", id="empty-content"),
        pytest.param(ingest_body("e2e-x", "a.pdf", b"%PDF-1.4"), "PARSE_ERROR", id="pdf"),
        pytest.param(
            ingest_body("e2e-x", "a.md", b"# A\n\ntext", doc_id="../etc/passwd"),
            "INVALID_ARGUMENT",
            id="bad-doc-id",
        ),
        pytest.param(
            ingest_body("e2e-x", "a.md", b"\xc3\x28 not utf-8"), "PARSE_ERROR", id="not-utf8"
        ),
        pytest.param(
            {"tenant_id": "e2e-x", "file_name": "a.md", "content": "!!not base64!!"},
            "INVALID_ARGUMENT",
            id="bad-base64",
        ),
    ],
)
def test_ingest_bad_input_is_400(mesh: Mesh, body: dict[str, Any], reason: str) -> None:
    assert_error(post(mesh, "retrieval", DOCS, body), 400, reason)


def test_ingest_file_with_a_cyrillic_name(mesh: Mesh) -> None:
    """A Russian file name without an explicit doc_id is ingested (the CLI sends no doc_id)."""
    tenant = "e2e-cyrillic"
    body = ingest_body(tenant, "Регламент отпусков.md", "# Отпуск\n\nОтпуск 28 дней.\n".encode())
    r = post(mesh, "retrieval", DOCS, body)
    assert r.status_code == 200, (
        "BUG (services/retrieval/ingestion.py Ingestor.ingest): the doc_id derived from the "
        "file name by slugify() keeps Cyrillic letters (services/docstore/parsing.py _SLUG), "
        "then _DOC_ID (ASCII only) rejects it, blaming a doc_id the caller never sent: "
        f"{r.status_code} {r.text}"
    )
    assert [d["doc_id"] for d in list_docs(mesh, tenant)] == [r.json()["doc_id"]]


def test_ingest_tags_limit(mesh: Mesh) -> None:
    tags = [f"t{i}" for i in range(33)]
    ok = post(mesh, "retrieval", DOCS, ingest_body("e2e-tags", "a.md", NEW_DOC, tags=tags[:32]))
    assert ok.status_code == 200, ok.text
    r = post(mesh, "retrieval", DOCS, ingest_body("e2e-tags", "a.md", NEW_DOC, tags=tags))
    assert_error(r, 400, "LIMIT_EXCEEDED")


def test_documents_bad_input_is_400(mesh: Mesh) -> None:
    assert_error(get(mesh, "retrieval", DOCS), 400, "INVALID_ARGUMENT")
    r = get(mesh, "retrieval", DOCS, params={"tenant_id": TENANT, "limit": "5"})
    assert_error(r, 400, "INVALID_ARGUMENT", domain="envoy")
    r = post(mesh, "retrieval", f"{DOCS}:delete", {"doc_id": LDAP_DOC})
    assert_error(r, 400, "INVALID_ARGUMENT")
    r = post(mesh, "retrieval", f"{DOCS}:delete", {"tenant_id": TENANT})
    assert_error(r, 400, "INVALID_ARGUMENT")
    assert LDAP_DOC in {d["doc_id"] for d in list_docs(mesh, TENANT)}


# --- /internal/mcp/execute, /internal/mcp/tools -----------------------------------------


def test_execute_read_doc_metadata(mesh: Mesh) -> None:
    trace = new_trace()
    r = execute(mesh, "read_doc_metadata", {"doc_id": LDAP_DOC}, trace_id=trace)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "ok" and "error" not in body
    assert body["trace_id"] == trace
    result = body["result"]
    assert result["doc_id"] == LDAP_DOC and result["pages"] == 3
    ldap = next(s for s in result["sections"] if s["section_id"] == LDAP_SECTION)
    assert (ldap["page_start"], ldap["page_end"]) == (2, 2)


def test_execute_read_chunk_window_at_and_past_the_radius_limit(mesh: Mesh) -> None:
    args = {"doc_id": LDAP_DOC, "anchor_chunk_id": LDAP_ANCHOR}
    ok = execute(mesh, "read_chunk_window", {**args, "radius": 3}).json()
    assert ok["status"] == "ok", ok
    assert ok["result"]["radius"] == {"before": 3, "after": 3}
    assert LDAP_ANCHOR in ok["result"]["chunk_ids"]
    assert "LDAP" in ok["result"]["text"]
    one = execute(mesh, "read_chunk_window", {**args, "radius": 1}).json()
    assert one["result"]["chunk_ids"] == [
        "orion-x-admin-guide:c00001",
        LDAP_ANCHOR,
        "orion-x-admin-guide:c00003",
    ]
    for past in ({"radius": 4}, {"window_before": 0, "window_after": 4}):
        r = execute(mesh, "read_chunk_window", {**args, **past})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "error", body
        assert body["error"]["code"] == "WINDOW_TOO_LARGE"
        assert "result" not in body
    sides = execute(mesh, "read_chunk_window", {**args, "window_before": 0, "window_after": 3})
    assert sides.json()["result"]["chunk_ids"][0] == LDAP_ANCHOR


def test_execute_read_doc_section(mesh: Mesh) -> None:
    r = execute(mesh, "read_doc_section", {"doc_id": LDAP_DOC, "section_id": LDAP_SECTION})
    body = r.json()
    assert body["status"] == "ok", body
    assert body["result"]["title"] == "Настройка LDAP интеграции"
    assert "ldaps://host:636" in body["result"]["text"]


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("read_doc_metadata", {"doc_id": SECRET_DOC}),
        ("read_chunk_window", {"doc_id": SECRET_DOC, "anchor_chunk_id": f"{SECRET_DOC}:c00000"}),
        (
            "read_doc_section",
            {"doc_id": SECRET_DOC, "section_id": f"{SECRET_DOC}:s001-secret-plan"},
        ),
    ],
)
def test_execute_other_tenants_document_is_not_found(
    mesh: Mesh, tool: str, arguments: dict[str, Any]
) -> None:
    r = execute(mesh, tool, arguments)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "error"
    assert body["error"]["code"] == "NOT_FOUND"
    assert "result" not in body
    assert "QZ7391" not in r.text and "Zephyr" not in r.text
    # Indistinguishable from a document that does not exist.
    missing = execute(mesh, tool, {**arguments, "doc_id": "no-such-doc"}).json()
    assert missing["error"]["code"] == "NOT_FOUND"
    # The owner reads it with the same arguments: the check above can fail.
    owner = post(
        mesh,
        "toolsproxy",
        "/internal/mcp/execute",
        {
            "tool_name": tool,
            "arguments": arguments,
            "user": {"user_id": "o", "tenant_id": OTHER_TENANT},
        },
    ).json()
    assert owner["status"] == "ok", owner


def test_execute_tool_errors_are_results(mesh: Mesh) -> None:
    unknown = execute(mesh, "format_disk", {}).json()
    assert unknown["status"] == "error" and unknown["error"]["code"] == "NOT_FOUND"
    bad = execute(mesh, "read_doc_metadata", {"doc_id": LDAP_DOC, "tenant_id": OTHER_TENANT})
    assert bad.json()["status"] == "error"
    assert bad.json()["error"]["code"] == "INVALID_ARGUMENT"
    missing = execute(mesh, "read_chunk_window", {"doc_id": LDAP_DOC}).json()
    assert missing["error"]["code"] == "INVALID_ARGUMENT"


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(
            {"tool_name": "read_doc_metadata", "arguments": {"doc_id": LDAP_DOC}}, id="no-user"
        ),
        pytest.param(
            {
                "tool_name": "read_doc_metadata",
                "arguments": {"doc_id": LDAP_DOC},
                "user": {"user_id": "u", "tenant": TENANT},
            },
            id="misspelt-tenant",
        ),
        pytest.param({"tool_name": "", "arguments": {}, "user": USER}, id="no-tool-name"),
        pytest.param({"tool_name": "x" * 65, "arguments": {}, "user": USER}, id="long-tool-name"),
    ],
)
def test_execute_bad_request_is_400(mesh: Mesh, body: dict[str, Any]) -> None:
    r = post(mesh, "toolsproxy", "/internal/mcp/execute", body)
    # A missing (or misspelt, so dropped) tenant is a missing user context.
    reason = "INVALID_ARGUMENT" if body.get("user") == USER else "MISSING_USER_CONTEXT"
    assert_error(r, 400, reason)


def test_list_tools(mesh: Mesh) -> None:
    r = get(mesh, "toolsproxy", "/internal/mcp/tools")
    assert r.status_code == 200, r.text
    tools = {t["name"]: t for t in r.json()["tools"]}
    assert set(tools) == {
        "read_chunk_window", "read_doc_section", "read_doc_pages", "read_doc_metadata",
        "doc_local_search", "load_documents_full", "search_user_documents",
        "search_general_kb", "fetch_cbr_data", "fetch_finance_news",
    }  # fmt: skip
    for t in tools.values():
        assert t["description"]
        assert t["input_schema"]["type"] == "object"
    window = tools["read_chunk_window"]["input_schema"]
    assert set(window["required"]) == {"doc_id", "anchor_chunk_id"}
    # The proxy's per-side limit and the orchestrator's radius agree (docs/architecture.md §8).
    assert window["properties"]["radius"]["maximum"] == get_config(mesh)["window_radius"] == 3
    # The external tools' arguments as agent.md names them; the old names are not offered.
    cbr = tools["fetch_cbr_data"]["input_schema"]
    assert {"mode", "date", "code"} <= set(cbr["properties"]) and cbr["required"] == ["mode"]
    assert set(cbr["properties"]["mode"]["enum"]) == {"currency", "key_rate", "news"}
    news = tools["fetch_finance_news"]["input_schema"]
    assert {"query", "max_results", "search_depth"} <= set(news["properties"])
    for schema in (cbr, news):
        assert not {"operation", "currency"} & set(schema["properties"])


def test_list_tools_unknown_query_parameter_is_400(mesh: Mesh) -> None:
    r = get(mesh, "toolsproxy", "/internal/mcp/tools", params={"verbose": "true"})
    assert_error(r, 400, "INVALID_ARGUMENT", domain="envoy")


# --- trace id across every hop ----------------------------------------------------------


def test_trace_id_from_header_in_every_services_log(mesh: Mesh) -> None:
    trace = new_trace()
    r = respond(mesh, {"query": LDAP_QUESTION, "user": USER}, headers={"x-trace-id": trace})
    assert r.status_code == 200, r.text
    for key in SERVICE_KEYS:
        assert wait_for(
            lambda k=key: any(e.get("trace_id") == trace for e in log_lines(mesh, k))
        ), f"{key} logged nothing for {trace}"


# --- 502: a downstream or the service itself is down (private meshes) -------------------


def test_respond_502_when_retrieval_is_down(make_mesh: MeshFactory) -> None:
    m = make_mesh()
    ok = respond(m, {"query": LDAP_QUESTION, "user": USER})
    assert ok.status_code == 200, ok.text
    m.stop_service("retrieval")
    r = respond(m, {"query": LDAP_QUESTION, "user": USER, "trace_id": new_trace()})
    info = assert_error(r, 502, "UPSTREAM_UNAVAILABLE", domain="visior.orchestrator")
    assert r.json()["code"] == 14
    assert info["metadata"]["downstream"] == "retrieval"
    assert info["metadata"]["downstream_code"] == "UNAVAILABLE"
    # Retrieval's own listener: Envoy answers for the dead server.
    s = search(m, {"query": "LDAP", "tenant_id": TENANT})
    assert_error(s, 502, "UPSTREAM_UNAVAILABLE", domain="envoy")
    assert_error(get(m, "retrieval", "/health"), 502, "UPSTREAM_UNAVAILABLE", domain="envoy")
    # The others are unaffected.
    assert get(m, "orchestrator", "/health").status_code == 200
    assert get(m, "toolsproxy", "/internal/mcp/tools").status_code == 200


def test_502_when_toolsproxy_is_down(make_mesh: MeshFactory) -> None:
    m = make_mesh()
    guide = SAMPLES / f"{LDAP_DOC}.md"
    ingest(m, TENANT, guide.name, guide.read_bytes())
    m.stop_service("toolsproxy")
    r = post(m, "llm", "/internal/llm/generate", generate_body())
    info = assert_error(r, 502, "UPSTREAM_UNAVAILABLE", domain="visior.llm")
    assert info["metadata"]["downstream"] == "toolsproxy"
    r = respond(m, {"query": LDAP_QUESTION, "user": USER})
    info = assert_error(r, 502, "UPSTREAM_UNAVAILABLE", domain="visior.orchestrator")
    assert info["metadata"]["downstream"] == "llm"
    r = execute(m, "read_doc_metadata", {"doc_id": LDAP_DOC})
    assert_error(r, 502, "UPSTREAM_UNAVAILABLE", domain="envoy")


def test_502_when_the_orchestrator_itself_is_down(make_mesh: MeshFactory) -> None:
    m = make_mesh()
    assert get(m, "orchestrator", "/health").status_code == 200
    m.stop_service("orchestrator")
    r = respond(m, {"query": LDAP_QUESTION, "user": USER})
    info = assert_error(r, 502, "UPSTREAM_UNAVAILABLE", domain="envoy")
    assert r.json()["code"] == 14
    assert info["metadata"]["response_flags"] == "UF"
    assert info["metadata"]["request_id"]
    for response in (
        get(m, "orchestrator", "/internal/orchestrator/config"),
        post(m, "orchestrator", "/internal/orchestrator/config", {"max_tool_steps": 1}),
        get(m, "orchestrator", "/health"),
    ):
        assert_error(response, 502, "UPSTREAM_UNAVAILABLE", domain="envoy")
    # Its downstreams still serve.
    assert get(m, "retrieval", "/health").status_code == 200
