"""The MCP endpoint, driven by the official MCP client over streamable HTTP on a real server.

Identity comes from the gateway's headers; tool errors are MCP tool results (isError); nothing
of another tenant's documents leaves the proxy.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolResult
from mcp_types.version import LATEST_HANDSHAKE_VERSION, MODERN_PROTOCOL_VERSIONS

from services.common.settings import Env, SettingsError
from services.docstore.parsing import parse_document
from services.docstore.sqlite_store import SqliteDocumentStore
from services.toolsproxy.config import mcp_settings
from services.toolsproxy.mcp_server import McpEndpoint, McpSettings
from services.toolsproxy.tools import Caller, DocumentTools, Tool, ToolExecutor, ToolLimits

TOKEN = "gateway-secret-0123"
SECRET = "ALPHASECRET"
ALPHA = (
    f"# Alpha handbook\n\n## Intro\n\nThe {SECRET} rollout plan is confidential.\n\n"
    f"## Budget\n\nThe {SECRET} budget is forty million.\n\n"
    f"## Risks\n\nThe {SECRET} risks are listed here.\n"
)
BETA = "# Beta notes\n\n## Only\n\nBeta has its own ordinary notes.\n"

MODES = {
    "stateless-json": {"stateless": True, "json_response": True},
    "stateful-sse": {"stateless": False, "json_response": False},
}


def headers(tenant: str | None = "tenant-a", user: str | None = "u-1", token: str | None = TOKEN):
    out: dict[str, str] = {}
    if token is not None:
        out["Authorization"] = f"Bearer {token}"
    if tenant is not None:
        out["X-Visior-Tenant-Id"] = tenant
    if user is not None:
        out["X-Visior-User-Id"] = user
    return out


@pytest.fixture
def store(tmp_path):
    store = SqliteDocumentStore(tmp_path / "docs.sqlite")
    store.put(
        parse_document(tenant_id="tenant-a", doc_id="doc-a", content=ALPHA.encode(), fmt="markdown")
    )
    store.put(
        parse_document(tenant_id="tenant-b", doc_id="doc-b", content=BETA.encode(), fmt="markdown")
    )
    yield store
    store.close()


@pytest.fixture
def executor(store):
    return ToolExecutor(DocumentTools(store, ToolLimits(max_window_radius=2)).tools)


@pytest.fixture
def ids(store):
    """Section and chunk ids of tenant A's document, read straight from the store."""
    doc = store.get_document("tenant-a", "doc-a", with_chunks=True)
    return {
        "doc_id": "doc-a",
        "section_id": doc.sections[-1].section_id,
        "anchor_chunk_id": doc.chunks[len(doc.chunks) // 2].chunk_id,
    }


@asynccontextmanager
async def serving(executor: ToolExecutor, **overrides: Any) -> AsyncIterator[McpEndpoint]:
    settings = replace(McpSettings(port=0, token=TOKEN), **overrides)
    endpoint = McpEndpoint(executor, settings)
    await endpoint.start()
    try:
        yield endpoint
    finally:
        await endpoint.stop()


@pytest.fixture(params=list(MODES))
async def endpoint(request, executor):
    async with serving(executor, **MODES[request.param]) as endpoint:
        yield endpoint


@pytest.fixture
async def stateless(executor):
    async with serving(executor) as endpoint:
        yield endpoint


@asynccontextmanager
async def mcp_session(url: str, hdrs: dict[str, str]) -> AsyncIterator[ClientSession]:
    """The official client: streamable HTTP transport, ClientSession, initialize handshake."""
    async with (
        httpx2.AsyncClient(headers=hdrs, timeout=10) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def body(result: CallToolResult) -> dict[str, Any]:
    """The structured content, after checking the text content carries the same JSON."""
    assert len(result.content) == 1 and result.content[0].type == "text"
    assert json.loads(result.content[0].text) == result.structured_content
    return result.structured_content


def as_text(result: CallToolResult) -> str:
    return json.dumps(result.model_dump(mode="json"))


def mcp_errors(exc: BaseException) -> list[MCPError]:
    """MCPErrors inside an exception (groups included): the transport raises from a task group."""
    if isinstance(exc, MCPError):
        return [exc]
    if isinstance(exc, BaseExceptionGroup):
        return [e for sub in exc.exceptions for e in mcp_errors(sub)]
    return []


def args_for(schema: dict[str, Any], ids: dict[str, str]) -> dict[str, Any]:
    """Arguments for any catalogue tool: known ids by name, else a value of the declared type."""
    properties = schema.get("properties", {})
    # Document references are always filled, optional or not, so every tool aims at the doc.
    targets = [n for n in properties if n in ("doc_id", "document_ids", "doc_ids")]
    out: dict[str, Any] = {}
    for name in dict.fromkeys([*schema.get("required", []), *targets]):
        prop = properties[name]
        kind = prop.get("type")
        if name in ids:
            out[name] = ids[name]
        elif name in ("document_ids", "doc_ids"):
            out[name] = [ids["doc_id"]]
        elif "enum" in prop:
            out[name] = prop["enum"][0]
        elif kind in ("integer", "number"):
            out[name] = max(prop.get("minimum", 1), 1)
        elif kind == "boolean":
            out[name] = False
        elif kind == "array":
            out[name] = []
        elif kind == "object":
            out[name] = {}
        else:
            out[name] = SECRET.lower()
    return out


def without_trace(envelope: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in envelope.items() if k != "trace_id"}


# --- the protocol ------------------------------------------------------------------------


async def test_initialize_and_list_tools_match_the_catalogue(endpoint, executor):
    async with mcp_session(endpoint.url, headers()) as session:
        assert session.protocol_version == LATEST_HANDSHAKE_VERSION
        assert session.server_info is not None and session.server_info.name == "visior-toolsproxy"
        listed = (await session.list_tools()).tools
    catalogue = executor.catalogue()
    assert [t.name for t in listed] == [t.name for t in catalogue]
    assert {"read_doc_metadata", "read_doc_section", "read_chunk_window"} <= {
        t.name for t in listed
    }
    for mcp_tool, tool in zip(listed, catalogue, strict=True):
        assert mcp_tool.input_schema == tool.schema
        assert mcp_tool.description == tool.description


async def test_document_tools_over_mcp(endpoint, ids):
    async with mcp_session(endpoint.url, headers()) as session:
        meta = await session.call_tool("read_doc_metadata", {"doc_id": "doc-a"})
        section = await session.call_tool(
            "read_doc_section", {"doc_id": "doc-a", "section_id": ids["section_id"]}
        )
        window = await session.call_tool(
            "read_chunk_window",
            {"doc_id": "doc-a", "anchor_chunk_id": ids["anchor_chunk_id"], "radius": 1},
        )
        too_wide = await session.call_tool(
            "read_chunk_window",
            {"doc_id": "doc-a", "anchor_chunk_id": ids["anchor_chunk_id"], "radius": 3},
        )

    assert not meta.is_error
    m = body(meta)
    assert m["status"] == "ok" and m["trace_id"]
    assert m["result"]["title"] == "Alpha handbook"
    assert [s["title"] for s in m["result"]["sections"]][-3:] == ["Intro", "Budget", "Risks"]

    s = body(section)["result"]
    assert s["section_id"] == ids["section_id"] and "risks are listed" in s["text"]

    w = body(window)["result"]
    assert w["anchor_chunk_id"] == ids["anchor_chunk_id"]
    assert ids["anchor_chunk_id"] in w["chunk_ids"] and 1 <= len(w["chunk_ids"]) <= 3

    # A tool failing is a tool result the model can react to, not a protocol error.
    assert too_wide.is_error
    assert body(too_wide)["error"]["code"] == "WINDOW_TOO_LARGE"


async def test_every_catalogue_tool_answers_as_the_executor_does(stateless, executor, ids):
    """Whatever tools the catalogue holds, MCP returns exactly what the executor returns."""
    caller = Caller("tenant-a", "u-1")
    async with mcp_session(stateless.url, headers()) as session:
        for tool in executor.catalogue():
            arguments = args_for(tool.schema, ids)
            result = await session.call_tool(tool.name, arguments)
            direct = await executor.execute(tool.name, arguments, caller)
            got = body(result)
            assert result.is_error == (direct.status != "ok"), tool.name
            if direct.status == "ok":
                assert without_trace(got) == {"status": "ok", "result": direct.result}, tool.name
            else:
                assert got["error"] == {
                    "code": direct.error_code,
                    "message": direct.error_message,
                }, tool.name


async def test_the_modern_protocol_era_gets_the_same_answers(stateless, ids):
    """Client's default mode discovers the 2026 per-request protocol; identity still holds."""
    async with (
        httpx2.AsyncClient(headers=headers(tenant="tenant-b"), timeout=10) as http,
        Client(streamable_http_client(stateless.url, http_client=http)) as client,
    ):
        assert client.protocol_version in MODERN_PROTOCOL_VERSIONS
        assert {t.name for t in (await client.list_tools()).tools} >= {"read_doc_metadata"}
        own = await client.call_tool("read_doc_metadata", {"doc_id": "doc-b"})
        other = await client.call_tool("read_doc_metadata", {"doc_id": "doc-a"})
    assert body(own)["result"]["title"] == "Beta notes"
    assert other.is_error and body(other)["error"]["code"] in {"NOT_FOUND", "ACCESS_DENIED"}
    assert SECRET not in as_text(other)


async def test_an_unknown_tool_is_a_protocol_error(stateless):
    async with mcp_session(stateless.url, headers()) as session:
        with pytest.raises(MCPError) as caught:
            await session.call_tool("no_such_tool", {})
    assert caught.value.code == INVALID_PARAMS


# --- tenants -------------------------------------------------------------------------------


async def test_a_cross_tenant_call_is_refused_and_leaks_nothing(endpoint, ids):
    async with mcp_session(endpoint.url, headers(tenant="tenant-b", user="u-9")) as session:
        results = [
            await session.call_tool("read_doc_metadata", {"doc_id": "doc-a"}),
            await session.call_tool(
                "read_doc_section", {"doc_id": "doc-a", "section_id": ids["section_id"]}
            ),
            await session.call_tool(
                "read_chunk_window",
                {"doc_id": "doc-a", "anchor_chunk_id": ids["anchor_chunk_id"], "radius": 1},
            ),
        ]
        # The same session reads its own tenant's document: the refusals are about the tenant.
        own = await session.call_tool("read_doc_metadata", {"doc_id": "doc-b"})
    for result in results:
        assert result.is_error
        assert body(result)["error"]["code"] in {"NOT_FOUND", "ACCESS_DENIED"}
        assert SECRET not in as_text(result) and "Alpha handbook" not in as_text(result)
    assert not own.is_error and body(own)["result"]["title"] == "Beta notes"


async def test_every_document_tool_refuses_another_tenants_doc(stateless, executor, ids):
    async with mcp_session(stateless.url, headers(tenant="tenant-b")) as session:
        aimed = 0
        for tool in executor.catalogue():
            props = tool.schema.get("properties", {})
            if not {"doc_id", "document_ids", "doc_ids"} & set(props):
                continue
            aimed += 1
            result = await session.call_tool(tool.name, args_for(tool.schema, ids))
            text = as_text(result)
            assert SECRET not in text and "Alpha handbook" not in text, tool.name
            if tool.schema.get("required", []) and "doc_id" in tool.schema["required"]:
                assert result.is_error, tool.name
                assert body(result)["error"]["code"] in {"NOT_FOUND", "ACCESS_DENIED"}, tool.name
    assert aimed >= 3


async def test_a_tool_argument_naming_a_tenant_is_rejected(stateless, executor):
    for tool in executor.catalogue():
        assert not {"tenant_id", "user_id", "tenant", "user"} & set(tool.schema["properties"])
    async with mcp_session(stateless.url, headers(tenant="tenant-b")) as session:
        other = await session.call_tool(
            "read_doc_metadata", {"doc_id": "doc-a", "tenant_id": "tenant-a"}
        )
        own = await session.call_tool(
            "read_doc_metadata", {"doc_id": "doc-b", "tenant_id": "tenant-b"}
        )
        user = await session.call_tool("read_doc_metadata", {"doc_id": "doc-b", "user": "root"})
    for result in (other, own, user):
        assert result.is_error and body(result)["error"]["code"] == "INVALID_ARGUMENT"
        assert SECRET not in as_text(result)


# --- identity from the connection -------------------------------------------------------


def rpc(method: str, params: dict[str, Any], rid: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}


async def raw_post(url: str, hdrs: dict[str, str], message: dict[str, Any]) -> httpx2.Response:
    async with httpx2.AsyncClient(timeout=10) as http:
        return await http.post(
            url,
            json=message,
            headers={
                "Accept": "application/json, text/event-stream",
                "MCP-Protocol-Version": LATEST_HANDSHAKE_VERSION,
                **hdrs,
            },
        )


CALL = rpc("tools/call", {"name": "read_doc_metadata", "arguments": {"doc_id": "doc-a"}})


@pytest.mark.parametrize(
    "hdrs",
    [
        pytest.param(headers(tenant=None, user=None), id="no-identity"),
        pytest.param(headers(tenant=None), id="no-tenant"),
        pytest.param(headers(user=None), id="no-user"),
        pytest.param(headers(tenant="t" * 129), id="long-tenant"),
        pytest.param(headers(tenant="tenant a"), id="malformed-tenant"),
        pytest.param(headers(tenant="__knowledge_base__"), id="reserved-tenant"),
        pytest.param(headers(token=None), id="no-token"),
        pytest.param(headers(token="gateway-secret-0124"), id="wrong-token"),
        pytest.param({**headers(), "Authorization": TOKEN}, id="token-not-bearer"),
    ],
)
async def test_a_request_without_identity_or_token_is_refused_before_mcp(stateless, hdrs):
    refused = await raw_post(stateless.url, hdrs, CALL)
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"].startswith("Bearer")
    assert SECRET not in refused.text and "Alpha" not in refused.text
    # The same request with the gateway's headers is served: the refusal is about identity.
    served = await raw_post(stateless.url, headers(), CALL)
    assert served.status_code == 200
    assert served.json()["result"]["structuredContent"]["result"]["title"] == "Alpha handbook"


@pytest.mark.parametrize(
    ("hdrs", "why"),
    [
        pytest.param(headers(token="gateway-secret-0124"), "wrong", id="wrong-token"),
        pytest.param(headers(token=None), "missing", id="no-token"),
    ],
)
async def test_a_refused_token_is_logged_without_its_value(stateless, hdrs, why, caplog):
    """A misconfigured gateway shows in the log (a warning naming the client and the path),
    not as a silence an operator would read as no traffic; neither token is in it."""
    with caplog.at_level(logging.WARNING, logger="visior.toolsproxy.mcp"):
        refused = await raw_post(stateless.url, hdrs, CALL)
    assert refused.status_code == 401
    [record] = [r for r in caplog.records if r.name == "visior.toolsproxy.mcp"]
    assert record.levelno == logging.WARNING
    assert "gateway token" in record.getMessage()
    assert record.path == "/mcp" and record.gateway_token == why
    assert record.client.startswith("127.0.0.1:") and int(record.client.rsplit(":", 1)[1]) > 0
    logged = json.dumps({k: str(v) for k, v in vars(record).items()}) + record.getMessage()
    assert TOKEN not in logged and "gateway-secret-0124" not in logged


async def utf8_post(url: str, tenant: bytes, user: bytes) -> httpx2.Response:
    """CALL with identity headers sent as raw bytes (a gateway's UTF-8 values)."""
    async with httpx2.AsyncClient(timeout=10) as http:
        return await http.post(
            url,
            json=CALL,
            headers=[
                (b"Accept", b"application/json, text/event-stream"),
                (b"Authorization", f"Bearer {TOKEN}".encode()),
                (b"X-Visior-Tenant-Id", tenant),
                (b"X-Visior-User-Id", user),
            ],
        )


async def test_identity_of_any_script_is_taken_as_the_grpc_api_takes_it(stateless, store):
    """A tenant id the gRPC API takes (letters of any script) is one the MCP endpoint takes:
    the gateway sends it as UTF-8; so is a user id."""
    content = ALPHA.encode()
    store.put(parse_document(tenant_id="тенант-1", doc_id="doc-a", content=content, fmt="markdown"))
    for tenant, user in (("тенант-1", "u-1"), ("tenant-a", "пользователь.7"), ("tenant-a", "用户")):
        served = await utf8_post(stateless.url, tenant.encode(), user.encode())
        assert served.status_code == 200, (tenant, user, served.text)
        assert served.json()["result"]["structuredContent"]["result"]["title"] == "Alpha handbook"


@pytest.mark.parametrize(
    ("tenant", "user"),
    [
        pytest.param("тенант 1".encode(), b"u-1", id="space-in-tenant"),
        pytest.param("тенант«1»".encode(), b"u-1", id="tenant-punctuation"),
        pytest.param(b"tenant-a", "польз ователь".encode(), id="space-in-user"),
        pytest.param(b"tenant-a", "u\x85x".encode(), id="control-in-user"),
        pytest.param(b"\xff\xfe", b"u-1", id="tenant-not-utf8"),
        pytest.param(b"tenant-a", "я".encode() * 129, id="user-past-128"),
    ],
)
async def test_a_malformed_identity_of_any_script_is_refused(stateless, tenant, user):
    assert (await utf8_post(stateless.url, tenant, user)).status_code == 401
    at_limit = await utf8_post(stateless.url, b"tenant-a", "я".encode() * 128)
    assert at_limit.status_code == 200


async def test_a_repeated_tenant_header_is_refused(stateless):
    """A gateway that appends instead of replacing leaves the client's value in: ambiguous."""
    async with httpx2.AsyncClient(timeout=10) as http:
        response = await http.post(
            stateless.url,
            json=CALL,
            headers=[
                ("Accept", "application/json, text/event-stream"),
                ("Authorization", f"Bearer {TOKEN}"),
                ("X-Visior-Tenant-Id", "tenant-a"),
                ("X-Visior-Tenant-Id", "tenant-b"),
                ("X-Visior-User-Id", "u-1"),
            ],
        )
    assert response.status_code == 401


@pytest.mark.parametrize(
    "hdrs",
    [
        pytest.param(headers(tenant=None, user=None), id="no-identity"),
        pytest.param(headers(token="wrong"), id="wrong-token"),
    ],
)
async def test_the_official_client_cannot_connect_without_identity(stateless, hdrs):
    with pytest.raises(BaseException) as caught:
        async with mcp_session(stateless.url, hdrs):
            pass
    assert [e.code for e in mcp_errors(caught.value)] == [-32001]


async def test_a_stateful_session_is_bound_to_its_caller(executor):
    """Another tenant presenting a session id it learnt is answered as if the session did not exist."""
    async with serving(executor, stateless=False, json_response=True) as endpoint:
        init = rpc(
            "initialize",
            {
                "protocolVersion": LATEST_HANDSHAKE_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        )
        opened = await raw_post(endpoint.url, headers(), init)
        assert opened.status_code == 200
        session = {"Mcp-Session-Id": opened.headers["mcp-session-id"]}
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert (await raw_post(endpoint.url, {**headers(), **session}, note)).status_code == 202

        hijack = await raw_post(endpoint.url, {**headers(tenant="tenant-b"), **session}, CALL)
        other_user = await raw_post(endpoint.url, {**headers(user="u-2"), **session}, CALL)
        owner = await raw_post(endpoint.url, {**headers(), **session}, CALL)

    assert hijack.status_code == 404 and SECRET not in hijack.text
    assert other_user.status_code == 404
    assert owner.status_code == 200
    assert owner.json()["result"]["structuredContent"]["status"] == "ok"


async def test_a_foreign_host_header_is_refused_on_loopback(stateless):
    """DNS rebinding: a page served as evil.example cannot reach a loopback endpoint."""
    refused = await raw_post(stateless.url, {**headers(), "Host": "evil.example:8090"}, CALL)
    assert refused.status_code in (403, 421)
    assert SECRET not in refused.text


@pytest.mark.parametrize(
    ("host", "origin", "status"),
    [
        ("gw.example.com:443", None, 200),
        ("gw.example.com", None, 200),  # "host:*" is any port, the default one too
        ("gw.example.com", "https://gw.example.com", 200),
        ("proxy:8090", None, 200),
        ("proxy", None, 421),  # a fixed port is that port
        ("evil.example", None, 421),
    ],
)
async def test_allowed_hosts_any_port_takes_the_default_port(executor, host, origin, status):
    env = {"MCP_PROXY_MCP_ALLOWED_HOSTS": "gw.example.com:*, proxy:8090"}
    hosts = mcp_settings(Env(env)).allowed_hosts
    hdrs = {**headers(), "Host": host, **({"Origin": origin} if origin else {})}
    async with serving(executor, allowed_hosts=hosts) as endpoint:
        answer = await raw_post(endpoint.url, hdrs, CALL)
    assert answer.status_code == status, answer.text


@pytest.mark.parametrize("value", ["gw.example.com:* localhost:*", "gw.example.com :*"])
def test_allowed_hosts_written_with_spaces_are_refused(value):
    # Space-separated, the list would be one host that never matches: every request a 421.
    with pytest.raises(SettingsError, match="separated by commas"):
        mcp_settings(Env({"MCP_PROXY_MCP_ALLOWED_HOSTS": value}))


# --- stateless: POST only ------------------------------------------------------------------


STREAM_ACCEPT = {"Accept": "text/event-stream"}


async def bounded(method: str, url: str, hdrs: dict[str, str]) -> httpx2.Response:
    """One whole request within 5 s: a stream held open fails the test instead of blocking it
    (the SSE keep-alive pings would reset httpx's read timeout)."""
    async with asyncio.timeout(5), httpx2.AsyncClient(timeout=5) as http:
        return await http.request(method, url, headers=hdrs)


@pytest.mark.parametrize("version", [None, LATEST_HANDSHAKE_VERSION], ids=["no-version", "2025"])
async def test_a_get_is_405_allow_post_at_once_and_post_still_serves(stateless, version):
    """No session, so no server-to-client stream: GET is 405 `Allow: POST`, not an SSE stream
    that nothing ever writes to and that never ends."""
    pinned = {"MCP-Protocol-Version": version} if version else {}
    got = await bounded("GET", stateless.url, {**headers(), **STREAM_ACCEPT, **pinned})
    assert got.status_code == 405, got.headers
    assert got.headers["allow"] == "POST"
    assert got.headers["content-type"] == "application/json"
    assert got.json()["error"]["code"] == -32600
    served = await raw_post(stateless.url, headers(), CALL)
    assert served.status_code == 200
    assert served.json()["result"]["structuredContent"]["result"]["title"] == "Alpha handbook"


async def test_many_gets_hold_nothing(stateless):
    answers = await asyncio.gather(
        *(bounded("GET", stateless.url, {**headers(), **STREAM_ACCEPT}) for _ in range(20))
    )
    assert {a.status_code for a in answers} == {405}


@pytest.mark.parametrize(
    ("hdrs", "status"),
    [
        pytest.param(headers(token=None), 401, id="no-token"),
        pytest.param({**headers(), "Host": "evil.example:8090"}, 421, id="foreign-host"),
        pytest.param({**headers(), "Origin": "http://evil.example"}, 403, id="foreign-origin"),
    ],
)
async def test_a_get_meets_the_identity_and_host_checks_first(stateless, hdrs, status):
    assert (await bounded("GET", stateless.url, {**hdrs, **STREAM_ACCEPT})).status_code == status


async def test_other_methods_are_405_and_delete_has_no_session_to_end(stateless):
    for method in ("PUT", "PATCH", "DELETE", "OPTIONS"):
        other = await bounded(method, stateless.url, headers())
        assert (other.status_code, other.headers["allow"]) == (405, "POST"), method
        assert other.json()["error"]["message"] == "Method Not Allowed: use POST"


async def test_the_official_client_lists_and_calls_over_post_alone(stateless):
    """The SDK client needs no GET stream here; a GET it sent would be answered 405 (the spec
    lets a server offer none, and the client then goes on without one)."""
    sent: list[tuple[str, int]] = []

    async def record(response: httpx2.Response) -> None:
        sent.append((response.request.method, response.status_code))

    async with (
        asyncio.timeout(20),
        httpx2.AsyncClient(
            headers=headers(), timeout=10, event_hooks={"response": [record]}
        ) as http,
        streamable_http_client(stateless.url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        listed = {t.name for t in (await session.list_tools()).tools}
        meta = await session.call_tool("read_doc_metadata", {"doc_id": "doc-a"})
    assert "read_doc_metadata" in listed
    assert body(meta)["result"]["title"] == "Alpha handbook"
    assert {method for method, _ in sent} <= {"POST", "GET"}
    assert all(status == 405 for method, status in sent if method == "GET")


# --- the body limit ------------------------------------------------------------------------


BODY_LIMIT = McpSettings().max_body_bytes


def call_of_size(size: int) -> bytes:
    """CALL as compact JSON of exactly `size` bytes, padded with an ASCII `_meta` field."""

    def encode(padding: str) -> bytes:
        params = {**CALL["params"], "_meta": {"padding": padding}}
        return json.dumps({**CALL, "params": params}, separators=(",", ":")).encode()

    return encode("x" * (size - len(encode(""))))


async def body_post(url: str, content: bytes, *, chunked: bool) -> httpx2.Response:
    """POST `content` with its Content-Length, or chunked (no length declared)."""

    async def pieces() -> AsyncIterator[bytes]:
        for start in range(0, len(content), 64 * 1024):
            yield content[start : start + 64 * 1024]

    async with httpx2.AsyncClient(timeout=10) as http:
        return await http.post(
            url,
            content=pieces() if chunked else content,
            headers={
                "Accept": "application/json, text/event-stream",
                "Content-Type": "application/json",
                "MCP-Protocol-Version": LATEST_HANDSHAKE_VERSION,
                **headers(),
            },
        )


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_body_at_the_limit_is_served_and_one_byte_more_is_413(stateless, chunked):
    """max_body_bytes (1 MiB): the SDK refuses a larger declared Content-Length before reading,
    and a chunked body once the bytes read pass the limit; either way before parsing."""
    assert BODY_LIMIT == 1024 * 1024
    at_limit = call_of_size(BODY_LIMIT)
    past_limit = call_of_size(BODY_LIMIT + 1)
    assert (len(at_limit), len(past_limit)) == (BODY_LIMIT, BODY_LIMIT + 1)

    served = await body_post(stateless.url, at_limit, chunked=chunked)
    assert served.status_code == 200, served.text[:300]
    assert served.json()["result"]["structuredContent"]["result"]["title"] == "Alpha handbook"

    refused = await body_post(stateless.url, past_limit, chunked=chunked)
    assert refused.status_code == 413
    assert refused.text == "Request body too large"  # the SDK's own answer, not JSON-RPC
    not_json = await body_post(stateless.url, b"{" * (BODY_LIMIT + 1), chunked=chunked)
    assert not_json.status_code == 413  # never parsed: a parse error would be 400


# --- settings and lifecycle -----------------------------------------------------------------


def test_settings_from_env():
    default = mcp_settings(Env({}))
    assert (default.enabled, default.port, default.path) == (False, 8090, "/mcp")
    assert (default.tenant_header, default.user_header) == (
        "X-Visior-Tenant-Id",
        "X-Visior-User-Id",
    )
    assert default.token == "" and default.stateless

    custom = mcp_settings(
        Env(
            {
                "MCP_PROXY_MCP_ENABLED": "true",
                "MCP_PROXY_MCP_PORT": "9100",
                "MCP_PROXY_MCP_TOKEN": "s3cret-token",
                "MCP_PROXY_MCP_ALLOWED_HOSTS": "mcp.internal:*, proxy:8090",
            }
        )
    )
    assert custom.enabled and custom.port == 9100
    assert custom.allowed_hosts == ("mcp.internal:*", "proxy:8090")
    assert "s3cret-token" not in repr(custom)


@pytest.mark.parametrize(
    "env", [{"MCP_PROXY_MCP_PORT": "70000"}, {"MCP_PROXY_MCP_ENABLED": "maybe"}]
)
def test_bad_settings_are_refused(env):
    with pytest.raises(SettingsError):
        mcp_settings(Env(env))


@pytest.mark.parametrize(
    "fields",
    [
        {"tenant_header": "Authorization"},
        {"tenant_header": "X Bad"},
        {"user_header": "x-visior-tenant-id"},
        {"path": "mcp"},
    ],
)
def test_bad_header_names_and_path_are_refused(fields):
    with pytest.raises(SettingsError):
        McpSettings(**fields)


async def test_configured_header_names_are_the_ones_read(executor):
    async with serving(executor, tenant_header="X-Org", user_header="X-Sub") as endpoint:
        standard = await raw_post(endpoint.url, headers(), CALL)
        custom = await raw_post(
            endpoint.url,
            {"Authorization": f"Bearer {TOKEN}", "X-Org": "tenant-a", "X-Sub": "u-1"},
            CALL,
        )
    assert standard.status_code == 401
    assert custom.status_code == 200
    assert custom.json()["result"]["structuredContent"]["status"] == "ok"


async def test_no_token_configured_means_identity_headers_suffice(executor):
    async with serving(executor, token="") as endpoint:
        served = await raw_post(endpoint.url, headers(token=None), CALL)
        anonymous = await raw_post(endpoint.url, headers(tenant=None, token=None), CALL)
    assert served.status_code == 200
    assert anonymous.status_code == 401


async def test_stop_releases_the_port(executor):
    endpoint = McpEndpoint(executor, McpSettings(port=0, token=TOKEN))
    port = await endpoint.start()
    assert endpoint.url == f"http://127.0.0.1:{port}/mcp"
    await endpoint.stop()
    with pytest.raises(httpx2.ConnectError):
        await raw_post(endpoint.url, headers(), CALL)
    again = McpEndpoint(executor, McpSettings(port=port, token=TOKEN))
    assert await again.start() == port
    await again.stop()


# --- stopping: an open call finishes within the service's grace -----------------------------


class HeldTool:
    """A tool whose call waits until the test releases it."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def run(self, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        self.entered.set()
        await self.release.wait()
        return {"text": "held and released"}

    async def open_call(self) -> tuple[McpEndpoint, asyncio.Task[httpx2.Response]]:
        """An endpoint serving the tool alone, and a call of it that has entered the tool."""
        schema = {"type": "object", "properties": {}, "additionalProperties": False}
        tool = Tool("held", "Waits for the test.", schema, self.run)
        endpoint = McpEndpoint(ToolExecutor({"held": tool}), McpSettings(port=0, token=TOKEN))
        await endpoint.start()
        message = rpc("tools/call", {"name": "held", "arguments": {}})
        call = asyncio.create_task(raw_post(endpoint.url, headers(), message))
        await self.entered.wait()
        return endpoint, call


async def test_an_open_call_finishes_within_the_grace_the_service_gives():
    held = HeldTool()
    endpoint, call = await held.open_call()
    stopping = asyncio.create_task(endpoint.stop(grace=5))
    await asyncio.sleep(1.5)  # past the 1 s an endpoint stopped without a grace allows
    held.release.set()
    await stopping
    answer = await call
    assert answer.status_code == 200
    assert "held and released" in json.dumps(answer.json())


async def test_past_the_grace_an_open_call_is_cut():
    endpoint, call = await HeldTool().open_call()
    await endpoint.stop(grace=1)  # never released: cut after a second
    with pytest.raises(httpx2.HTTPError):
        (await call).raise_for_status()


async def test_a_taken_mcp_port_is_a_listen_error_and_lets_go_of_the_grpc_port(tmp_path):
    """One clear line and exit 1 (the runner's ListenError), not a traceback; the gRPC server
    already started is stopped, so a restart can have its port."""
    import socket

    from services.common.server import ListenError
    from services.common.topology import free_ports
    from services.toolsproxy import app as tools_app
    from services.toolsproxy.config import ToolsProxySettings

    # The gRPC port stays unbound until the server binds it: free_ports keeps it from other
    # workers (and outside the ephemeral range, where `taken`'s port 0 comes from).
    [grpc_port] = free_ports(1)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        mcp_port = taken.getsockname()[1]
        env = {"MCP_PROXY_PORT": str(grpc_port), "MCP_PROXY_MCP_ENABLED": "true",
               "MCP_PROXY_MCP_PORT": str(mcp_port), "VISIOR_DATA_DIR": str(tmp_path)}  # fmt: skip
        with pytest.raises(ListenError, match=rf"MCP on 127\.0\.0\.1:{mcp_port}"):
            await tools_app.start(ToolsProxySettings.from_env(Env(env)))
    with socket.create_server(("127.0.0.1", grpc_port)):  # free again
        pass
