"""The tools through the real mesh: search tools, and the cross-tenant matrix over every tool
that names a document, via JSON through Envoy, via gRPC and via MCP (the real process)."""

from __future__ import annotations

import json
from typing import Any

import grpc
import httpx
import httpx2
import pytest
from google.protobuf import json_format
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from visior.common.v1 import common_pb2
from visior.toolsproxy.v1 import toolsproxy_pb2, toolsproxy_pb2_grpc

from services.common.untrusted import unwrap_untrusted
from services.devtools.mesh import Mesh
from tests.e2e.conftest import (
    MCP_PORT,
    MCP_TOKEN,
    OTHER_TENANT,
    REPO_ROOT,
    SECRET_DOC,
    TENANT,
    ingest,
)

pytestmark = pytest.mark.e2e

KB_TENANT = "__knowledge_base__"
SECRET_WORDS = ("Zephyr", "QZ7391", "launch code")
# Every tool that takes a document of the caller's tenant, with arguments naming the other
# tenant's document (SECRET_DOC belongs to OTHER_TENANT; TENANT asks).
CROSS_TENANT = [
    ("read_chunk_window", {"doc_id": SECRET_DOC, "anchor_chunk_id": f"{SECRET_DOC}:c00000"}),
    ("read_doc_section", {"doc_id": SECRET_DOC, "section_id": f"{SECRET_DOC}:s001-secret-plan"}),
    ("read_doc_pages", {"doc_id": SECRET_DOC, "page_start": 1, "page_end": 1}),
    ("read_doc_metadata", {"doc_id": SECRET_DOC}),
    ("doc_local_search", {"doc_id": SECRET_DOC, "query": "launch code"}),
    ("load_documents_full", {"document_ids": [SECRET_DOC]}),
    ("search_user_documents", {"query": "launch code Zephyr", "document_ids": [SECRET_DOC]}),
    ("search_user_documents", {"query": "launch code of project Zephyr"}),
    ("search_general_kb", {"query": "launch code of project Zephyr"}),
]
USER = {"user_id": "u1", "tenant_id": TENANT}


def _no_secret(payload: Any) -> None:
    text = json.dumps(payload, ensure_ascii=False)
    for word in SECRET_WORDS:
        assert word not in text, f"{word!r} leaked: {text[:500]}"


def _refused_or_clean(tool: str, args: dict[str, Any], error_code: str | None, out: Any) -> None:
    """A tool that names the other tenant's document (a read, or a load of it) is refused as
    NOT_FOUND or ACCESS_DENIED; a search answers, without the document among its hits. No
    answer carries the document's words (its metadata has none of them: the refusal is the
    check there)."""
    if "doc_id" in args or tool == "load_documents_full":
        assert error_code in ("NOT_FOUND", "ACCESS_DENIED"), out
    else:
        assert error_code is None, out
        assert SECRET_DOC not in json.dumps(out), out
    _no_secret(out)


def execute_json(mesh: Mesh, tool: str, args: dict[str, Any], user=USER) -> dict[str, Any]:
    r = httpx.post(
        f"{mesh.json_url('toolsproxy')}/internal/mcp/execute",
        json={"tool_name": tool, "arguments": args, "user": user},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def knowledge_base(mesh: Mesh) -> None:
    csv = REPO_ROOT / "samples" / "knowledge_base" / "train_data.csv"
    ingest(mesh, KB_TENANT, csv.name, csv.read_bytes())


def test_search_user_documents_finds_pages_in_the_callers_tenant(mesh: Mesh) -> None:
    out = execute_json(mesh, "search_user_documents", {"query": "Как настроить LDAP?"})
    assert out["status"] == "ok", out
    hits = out["result"]["hits"]
    assert hits and hits[0]["doc_id"] == "orion-x-admin-guide" and hits[0]["page_start"] >= 1
    assert "LDAP" in unwrap_untrusted(hits[0]["text"])
    assert all(h["doc_id"] != SECRET_DOC for h in hits)


def test_search_general_kb_reads_the_shared_knowledge_base(mesh: Mesh, knowledge_base) -> None:
    out = execute_json(mesh, "search_general_kb", {"query": "ставка НДС", "topic": "tax"})
    assert out["status"] == "ok", out
    hits = out["result"]["hits"]
    assert hits and all(h["doc_id"].startswith("kb-") for h in hits)
    # The same question over the caller's own documents never returns KB articles.
    own = execute_json(mesh, "search_user_documents", {"query": "ставка НДС"})
    assert not any(h["doc_id"].startswith("kb-") for h in own["result"]["hits"])


@pytest.mark.parametrize(("tool", "args"), CROSS_TENANT)
def test_cross_tenant_via_json(mesh: Mesh, knowledge_base, tool: str, args: dict) -> None:
    out = execute_json(mesh, tool, args)
    _refused_or_clean(tool, args, out["error"]["code"] if out["status"] == "error" else None, out)
    # The owner does get it, so the refusal above is about the tenant, not the arguments.
    if (
        tool not in ("search_general_kb",)
        and "document_ids" not in args
        and tool != ("search_user_documents")
    ):
        mine = execute_json(mesh, tool, args, user={"user_id": "o", "tenant_id": OTHER_TENANT})
        assert mine["status"] == "ok", mine


@pytest.mark.parametrize(("tool", "args"), CROSS_TENANT)
async def test_cross_tenant_via_grpc(mesh: Mesh, knowledge_base, tool: str, args: dict) -> None:
    request = toolsproxy_pb2.ExecuteRequest(
        tool_name=tool, user=common_pb2.UserContext(user_id="u1", tenant_id=TENANT)
    )
    request.arguments.update(args)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{mesh.ports.grpc['toolsproxy']}") as channel:
        response = await toolsproxy_pb2_grpc.ToolsProxyServiceStub(channel).Execute(request)
    out = json_format.MessageToDict(response, preserving_proto_field_name=True)
    _refused_or_clean(tool, args, response.error.code if response.status == "error" else None, out)


async def _mcp_call(tenant: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    headers = {
        "Authorization": f"Bearer {MCP_TOKEN}",
        "X-Visior-Tenant-Id": tenant,
        "X-Visior-User-Id": "mcp-user",
    }
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        streamable_http_client(f"http://127.0.0.1:{MCP_PORT}/mcp", http_client=http) as (r, w),
        ClientSession(r, w) as session,
    ):
        await session.initialize()
        result = await session.call_tool(tool, args)
        return {"is_error": result.is_error, "content": result.structured_content}


@pytest.mark.parametrize(("tool", "args"), CROSS_TENANT)
async def test_cross_tenant_via_mcp(mesh: Mesh, knowledge_base, tool: str, args: dict) -> None:
    out = await _mcp_call(TENANT, tool, args)
    _refused_or_clean(tool, args, out["content"]["error"]["code"] if out["is_error"] else None, out)


async def test_mcp_serves_the_owner(mesh: Mesh) -> None:
    out = await _mcp_call(OTHER_TENANT, "read_doc_metadata", {"doc_id": SECRET_DOC})
    assert not out["is_error"] and out["content"]["result"]["doc_id"] == SECRET_DOC


def test_mcp_without_gateway_identity_is_refused(mesh: Mesh) -> None:
    r = httpx.post(
        f"http://127.0.0.1:{MCP_PORT}/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={"Accept": "application/json, text/event-stream"},
        timeout=10,
    )
    assert r.status_code == 401
