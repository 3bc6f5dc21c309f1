"""The real Envoy in front of small in-test gRPC servers: routing, JSON shape, errors, limits."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status
from visior.common.v1 import common_pb2
from visior.llm.v1 import llm_pb2, llm_pb2_grpc
from visior.orchestrator.v1 import orchestrator_pb2, orchestrator_pb2_grpc
from visior.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc
from visior.toolsproxy.v1 import toolsproxy_pb2, toolsproxy_pb2_grpc

from services.common.topology import SERVICE_BY_KEY, SERVICES, Ports
from services.devtools.envoy import REPO_ROOT, EnvoyProcess, validate
from services.devtools.envoy_config import DEFAULT_MAX_REQUEST_BYTES, GRPC_TIMEOUT_MARGIN_S, render

pytestmark = pytest.mark.e2e

DESCRIPTOR = REPO_ROOT / "envoy" / "visior.pb"
SLOW_ROUTE = "/internal/mcp/tools"
"""Given a short timeout in this module's config, served by a handler that outlasts it."""
SLOW_ROUTE_TIMEOUT_S = 0.5


# --- fake servers ---------------------------------------------------------------------


def _error_status(code: int, message: str, reason: str) -> grpc.Status:
    detail = any_pb2.Any()
    detail.Pack(
        error_details_pb2.ErrorInfo(reason=reason, domain="test.visior", metadata={"k": "v"})
    )
    return rpc_status.to_status(status_pb2.Status(code=code, message=message, details=[detail]))


def _health(response_cls: Any, service: str) -> Any:
    # GET /health is the health details themselves (docs/architecture.md §13); works whether the
    # response holds them in a `health` field or carries them at top level.
    fields = response_cls.DESCRIPTOR.fields_by_name
    if "health" in fields:
        return response_cls(health=common_pb2.HealthDetails(status="ok", service=service))
    return response_cls(status="ok", service=service)


@dataclass
class Seen:
    """What the fake servers saw, for assertions on what Envoy forwarded."""

    metadata: list[dict[str, str]] = field(default_factory=list)
    requests: list[Any] = field(default_factory=list)
    time_remaining: list[float | None] = field(default_factory=list)

    def record(self, request: Any, context: grpc.aio.ServicerContext) -> None:
        self.requests.append(request)
        self.metadata.append({k: str(v) for k, v in context.invocation_metadata() or ()})
        self.time_remaining.append(context.time_remaining())


class ToolsProxy(toolsproxy_pb2_grpc.ToolsProxyServiceServicer):
    def __init__(self, seen: Seen) -> None:
        self.seen = seen

    async def Execute(self, request, context):
        self.seen.record(request, context)
        if request.tool_name == "invalid":
            s = _error_status(code_pb2.INVALID_ARGUMENT, "radius too large", "WINDOW_TOO_LARGE")
            await context.abort(s.code, s.details, s.trailing_metadata)
        if request.tool_name == "unavailable":
            s = _error_status(code_pb2.UNAVAILABLE, "store down", "backend_unavailable")
            await context.abort(s.code, s.details, s.trailing_metadata)
        return toolsproxy_pb2.ExecuteResponse(status="ok", trace_id=request.trace_id)

    async def ListTools(self, request, context):
        self.seen.record(request, context)
        await asyncio.sleep(10 * SLOW_ROUTE_TIMEOUT_S)  # cancelled when Envoy gives up
        return toolsproxy_pb2.ListToolsResponse()

    async def GetHealth(self, request, context):
        return _health(toolsproxy_pb2.GetHealthResponse, "visior.toolsproxy.v1.ToolsProxyService")


class Orchestrator(orchestrator_pb2_grpc.OrchestratorServiceServicer):
    async def GetHealth(self, request, context):
        return _health(
            orchestrator_pb2.GetHealthResponse, "visior.orchestrator.v1.OrchestratorService"
        )


class Llm(llm_pb2_grpc.LlmServiceServicer):
    async def GenerateStream(self, request, context):
        for _ in range(3):
            yield llm_pb2.GenerateStreamResponse()

    async def GetHealth(self, request, context):
        return _health(llm_pb2.GetHealthResponse, "visior.llm.v1.LlmService")


class Retrieval(retrieval_pb2_grpc.RetrievalServiceServicer):
    async def GetHealth(self, request, context):
        return _health(retrieval_pb2.GetHealthResponse, "visior.retrieval.v1.RetrievalService")


class Ingestion(retrieval_pb2_grpc.IngestionServiceServicer):
    def __init__(self, seen: Seen) -> None:
        self.seen = seen

    async def IngestDocument(self, request, context):
        self.seen.record(request, context)
        return retrieval_pb2.IngestDocumentResponse(doc_id=request.doc_id)


# --- fixtures -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ports() -> Ports:
    return Ports.free()


@pytest.fixture(scope="module")
def envoy(ports: Ports, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnvoyProcess]:
    assert DESCRIPTOR.is_file(), "run tools/gen.sh first"
    config = render(ports, str(DESCRIPTOR), timeouts={SLOW_ROUTE: SLOW_ROUTE_TIMEOUT_S})
    proc = EnvoyProcess(concurrency=1)
    proc.start(config, tmp_path_factory.mktemp("envoy"))
    try:
        proc.wait_ready(timeout=15)
        yield proc
    finally:
        proc.stop()


@dataclass
class Mesh:
    ports: Ports
    seen: Seen
    servers: dict[str, grpc.aio.Server]

    def url(self, key: str) -> str:
        return f"http://127.0.0.1:{self.ports.http[key]}"


@pytest.fixture
async def mesh(envoy: EnvoyProcess, ports: Ports) -> AsyncIterator[Mesh]:
    seen = Seen()
    adders = {
        "orchestrator": [
            lambda s: orchestrator_pb2_grpc.add_OrchestratorServiceServicer_to_server(
                Orchestrator(), s
            )
        ],
        "llm": [lambda s: llm_pb2_grpc.add_LlmServiceServicer_to_server(Llm(), s)],
        "retrieval": [
            lambda s: retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(Retrieval(), s),
            lambda s: retrieval_pb2_grpc.add_IngestionServiceServicer_to_server(Ingestion(seen), s),
        ],
        "toolsproxy": [
            lambda s: toolsproxy_pb2_grpc.add_ToolsProxyServiceServicer_to_server(
                ToolsProxy(seen), s
            )
        ],
    }
    servers: dict[str, grpc.aio.Server] = {}
    for spec in SERVICES:
        # Ingestion bodies are up to ~44 MiB of JSON; gRPC's default receive limit is 4 MiB.
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
        for add in adders[spec.key]:
            add(server)
        assert server.add_insecure_port(f"127.0.0.1:{ports.grpc[spec.key]}") != 0
        await server.start()
        servers[spec.key] = server
    try:
        yield Mesh(ports, seen, servers)
    finally:
        await asyncio.gather(*(s.stop(None) for s in servers.values()))


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as client:
        yield client


def assert_status_body(resp: httpx.Response, http_status: int, code: int, reason: str) -> dict:
    """The response is HTTP `http_status` with a google.rpc.Status JSON and one ErrorInfo."""
    assert resp.status_code == http_status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert body["code"] == code, body
    assert isinstance(body["message"], str)
    [detail] = body["details"]
    assert detail["@type"] == "type.googleapis.com/google.rpc.ErrorInfo"
    assert detail["reason"] == reason, body
    return detail


EXECUTE = "/internal/mcp/execute"
USER = {"user_id": "u1", "tenant_id": "t1"}


# --- config ---------------------------------------------------------------------------


def test_committed_config_is_current_and_valid() -> None:
    committed = (REPO_ROOT / "envoy" / "envoy.yaml").read_text()
    assert committed == render(Ports(), "envoy/visior.pb"), "run tools/gen.sh"
    result = validate(REPO_ROOT / "envoy" / "envoy.yaml", cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr + result.stdout


def test_rendered_config_with_access_log_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "envoy.yaml"
    path.write_text(render(Ports.free(), str(DESCRIPTOR), access_log=True, fault_injection=False))
    result = validate(path)
    assert result.returncode == 0, result.stderr + result.stdout


# --- success --------------------------------------------------------------------------


async def test_execute_round_trip_json(mesh: Mesh, http: httpx.AsyncClient) -> None:
    resp = await http.post(
        mesh.url("toolsproxy") + EXECUTE,
        json={"tool_name": "echo", "user": USER},
        headers={"x-trace-id": "trace-1", "x-request-id": "req-1"},
    )
    assert resp.status_code == 200, resp.text
    # snake_case names, and zero-valued primitives printed rather than left out.
    assert resp.json() == {"status": "ok", "trace_id": ""}
    [request] = mesh.seen.requests
    assert (request.tool_name, request.user.tenant_id) == ("echo", "t1")
    [metadata] = mesh.seen.metadata
    assert metadata["x-trace-id"] == "trace-1"
    assert metadata["x-request-id"] == "req-1"
    assert resp.headers["x-request-id"] == "req-1"
    # Envoy hands its route timeout (30 s) on as the gRPC deadline.
    [remaining] = mesh.seen.time_remaining
    # The route's 30 s plus the margin that lets Envoy's own timer fire first.
    assert remaining is not None and 0 < remaining <= 30 + GRPC_TIMEOUT_MARGIN_S


async def test_request_id_is_generated_when_absent(mesh: Mesh, http: httpx.AsyncClient) -> None:
    resp = await http.post(mesh.url("toolsproxy") + EXECUTE, json={"tool_name": "echo"})
    assert resp.status_code == 200, resp.text
    generated = mesh.seen.metadata[0]["x-request-id"]
    assert len(generated) == 36 and generated == resp.headers["x-request-id"]


async def test_unknown_json_fields_are_dropped_not_rejected(
    mesh: Mesh, http: httpx.AsyncClient
) -> None:
    # Pins a transcoder limitation (no option rejects unknown body fields): a misspelt
    # field reaches the server as unset, so servers must validate required fields.
    resp = await http.post(
        mesh.url("toolsproxy") + EXECUTE,
        json={"tool_name": "echo", "user": {"tenant": "t1"}, "bogus": 1},
    )
    assert resp.status_code == 200, resp.text
    [request] = mesh.seen.requests
    assert request.user.tenant_id == ""


@pytest.mark.parametrize("key", [s.key for s in SERVICES])
async def test_health_goes_to_the_listeners_own_service(
    mesh: Mesh, http: httpx.AsyncClient, key: str
) -> None:
    resp = await http.get(mesh.url(key) + "/health")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    details = body.get("health", body)
    assert details["status"] == "ok"
    assert details["service"] == SERVICE_BY_KEY[key].grpc_services[0]


async def test_ingestion_route_takes_bodies_above_the_default_limit(
    mesh: Mesh, http: httpx.AsyncClient
) -> None:
    content = b"x" * (2 * DEFAULT_MAX_REQUEST_BYTES)
    resp = await http.post(
        mesh.url("retrieval") + "/internal/retrieval/documents",
        json={"tenant_id": "t1", "doc_id": "d1", "content": base64.b64encode(content).decode()},
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["doc_id"] == "d1"
    assert mesh.seen.requests[0].content == content


async def test_streaming_route_returns_a_json_array(mesh: Mesh, http: httpx.AsyncClient) -> None:
    resp = await http.post(mesh.url("llm") + "/internal/llm/generate:stream", json={})
    assert resp.status_code == 200, resp.text
    assert isinstance(resp.json(), list) and len(resp.json()) == 3


# --- errors from the server -----------------------------------------------------------


async def test_invalid_argument_is_400_with_error_info(mesh: Mesh, http: httpx.AsyncClient) -> None:
    resp = await http.post(mesh.url("toolsproxy") + EXECUTE, json={"tool_name": "invalid"})
    detail = assert_status_body(resp, 400, code_pb2.INVALID_ARGUMENT, "WINDOW_TOO_LARGE")
    assert detail["domain"] == "test.visior" and detail["metadata"] == {"k": "v"}
    assert resp.json()["message"] == "radius too large"


async def test_unavailable_is_502_and_keeps_the_body(mesh: Mesh, http: httpx.AsyncClient) -> None:
    resp = await http.post(mesh.url("toolsproxy") + EXECUTE, json={"tool_name": "unavailable"})
    detail = assert_status_body(resp, 502, code_pb2.UNAVAILABLE, "backend_unavailable")
    assert detail["domain"] == "test.visior"


# --- Envoy's own replies --------------------------------------------------------------


async def test_upstream_down_is_502_upstream_unavailable(
    mesh: Mesh, http: httpx.AsyncClient
) -> None:
    await mesh.servers["toolsproxy"].stop(None)
    resp = await http.post(mesh.url("toolsproxy") + EXECUTE, json={"tool_name": "echo"})
    detail = assert_status_body(resp, 502, code_pb2.UNAVAILABLE, "UPSTREAM_UNAVAILABLE")
    assert detail["domain"] == "envoy"
    assert detail["metadata"]["request_id"] == resp.headers["x-request-id"]


async def test_malformed_json_is_400(mesh: Mesh, http: httpx.AsyncClient) -> None:
    resp = await http.post(
        mesh.url("toolsproxy") + EXECUTE,
        content=b'{"tool_name": ',
        headers={"content-type": "application/json"},
    )
    assert_status_body(resp, 400, code_pb2.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    assert mesh.seen.requests == []


async def test_unknown_query_parameter_is_400(mesh: Mesh, http: httpx.AsyncClient) -> None:
    resp = await http.get(mesh.url("retrieval") + "/health", params={"verbose": "1"})
    assert_status_body(resp, 400, code_pb2.INVALID_ARGUMENT, "INVALID_ARGUMENT")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/nope"),
        ("POST", "/internal/mcp/nope"),
        ("GET", EXECUTE),  # right path, wrong method
        ("POST", "/internal/retrieval/search"),  # another service's route
    ],
)
async def test_unknown_path_is_404(
    mesh: Mesh, http: httpx.AsyncClient, method: str, path: str
) -> None:
    resp = await http.request(method, mesh.url("toolsproxy") + path, json={})
    assert_status_body(resp, 404, code_pb2.NOT_FOUND, "NOT_FOUND")
    assert mesh.seen.requests == []


async def test_body_over_the_limit_is_413(mesh: Mesh, http: httpx.AsyncClient) -> None:
    resp = await http.post(
        mesh.url("toolsproxy") + EXECUTE,
        json={"tool_name": "x" * DEFAULT_MAX_REQUEST_BYTES, "user": USER},
    )
    assert_status_body(resp, 413, code_pb2.INVALID_ARGUMENT, "PAYLOAD_TOO_LARGE")
    assert mesh.seen.requests == []


async def test_route_timeout_is_504_json(mesh: Mesh, http: httpx.AsyncClient) -> None:
    resp = await http.get(mesh.url("toolsproxy") + SLOW_ROUTE)
    detail = assert_status_body(resp, 504, code_pb2.DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED")
    assert detail["metadata"]["response_flags"] == "UT"
    assert len(mesh.seen.requests) == 1
