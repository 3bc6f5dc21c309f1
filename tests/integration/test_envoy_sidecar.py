"""The real Envoy, on the config render() gives it, in front of small in-test gRPC servers:
routing, JSON shape, errors, limits, the headers and deadline a server is handed, the access
log, and the deploy/ sidecars' healthcheck, drain and heap limit.

The servers are fakes that record what Envoy forwarded (metadata, time_remaining()), which
only an in-test server can see. tests/e2e/test_sidecar_headers.py checks what the callers
see of the same header filter and access log with the real servers."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status
from visior.common.v1 import common_pb2
from visior.llm.v1 import llm_pb2, llm_pb2_grpc
from visior.orchestrator.v1 import orchestrator_pb2, orchestrator_pb2_grpc
from visior.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc
from visior.toolsproxy.v1 import toolsproxy_pb2, toolsproxy_pb2_grpc

from services.common.topology import SERVICE_BY_KEY, SERVICES, Ports, free_ports
from services.devtools.envoy import REPO_ROOT, EnvoyProcess, envoy_binary, validate
from services.devtools.envoy_config import DEFAULT_MAX_REQUEST_BYTES, GRPC_TIMEOUT_MARGIN_S, render

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
    def __init__(self, seen: Seen) -> None:
        self.seen = seen

    async def GenerateStream(self, request, context):
        self.seen.record(request, context)
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
    config = render(
        ports, str(DESCRIPTOR), timeouts={SLOW_ROUTE: SLOW_ROUTE_TIMEOUT_S}, access_log=True
    )
    # The access log (envoy.stdout_path) is written out every 50 ms instead of every 10 s.
    proc = EnvoyProcess(concurrency=1, extra_args=["--file-flush-interval-msec", "50"])
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
        "llm": [lambda s: llm_pb2_grpc.add_LlmServiceServicer_to_server(Llm(seen), s)],
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


@pytest.mark.parametrize("key", [s.key for s in SERVICES])
async def test_head_health_answers_the_status_without_a_body(
    mesh: Mesh, http: httpx.AsyncClient, key: str
) -> None:
    """A balancer's HEAD check gets GET's status line and no body (it was a 404)."""
    resp = await http.head(mesh.url(key) + "/health")
    assert resp.status_code == 200, resp.headers
    assert resp.headers["content-type"].startswith("application/json")
    assert resp.content == b""


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


# --- caller headers -------------------------------------------------------------------


STREAM = "/internal/llm/generate:stream"


@pytest.mark.parametrize(
    ("key", "path", "body", "header"),
    [
        # Binary metadata must be base64: grpc refused the whole call with a bare INTERNAL.
        ("toolsproxy", EXECUTE, {"tool_name": "echo"}, ("x-caller-bin", "!!!")),
        ("toolsproxy", EXECUTE, {"tool_name": "echo"}, ("grpc-encoding", "bogus")),
        # The route's own grpc-timeout replaces a caller's; the stream route has none.
        ("toolsproxy", EXECUTE, {"tool_name": "echo"}, ("grpc-timeout", "bogus")),
        ("llm", STREAM, {}, ("grpc-timeout", "bogus")),
        # Legal in an HTTP header name, not in a gRPC metadata key: grpc refused the whole
        # call with a bare INTERNAL ("Illegal header key").
        ("toolsproxy", EXECUTE, {"tool_name": "echo"}, ("X-Foo+Bar", "1")),
        ("toolsproxy", EXECUTE, {"tool_name": "echo"}, ("x-a|b", "1")),
        ("toolsproxy", EXECUTE, {"tool_name": "echo"}, ("x~y", "1")),
    ],
    ids=["bin", "grpc-encoding", "grpc-timeout", "grpc-timeout-stream", "plus", "pipe", "tilde"],
)
async def test_callers_grpc_and_binary_headers_stop_at_envoy(
    mesh: Mesh, http: httpx.AsyncClient, key: str, path: str, body: dict, header: tuple[str, str]
) -> None:
    resp = await http.post(
        mesh.url(key) + path,
        json=body,
        headers=[header, ("x-trace-id", "t1"), ("x-custom-ok", "yes")],
    )
    assert resp.status_code == 200, resp.text
    [metadata] = mesh.seen.metadata
    assert header[0].lower() not in metadata
    # other headers still pass
    assert metadata["x-trace-id"] == "t1"
    assert metadata["x-custom-ok"] == "yes"


async def test_the_route_deadline_survives_the_header_filter(
    mesh: Mesh, http: httpx.AsyncClient
) -> None:
    """grpc-timeout is stripped from callers, not from Envoy's own route budget."""
    resp = await http.post(
        mesh.url("toolsproxy") + EXECUTE,
        json={"tool_name": "echo"},
        headers={"grpc-timeout": "1S"},
    )
    assert resp.status_code == 200, resp.text
    [remaining] = mesh.seen.time_remaining
    assert remaining is not None and 1 < remaining <= 30 + GRPC_TIMEOUT_MARGIN_S


# --- access log -----------------------------------------------------------------------


async def _logged(envoy: EnvoyProcess, request_ids: set[str]) -> dict[str, dict[str, Any]]:
    """The access-log entries of `request_ids`, once Envoy has written them all out."""
    assert envoy.stdout_path is not None
    loop = asyncio.get_running_loop()
    give_up = loop.time() + 30
    while True:
        text = envoy.stdout_path.read_text()
        lines = text[: text.rfind("\n") + 1].splitlines()  # whole lines only
        entries = {e["request_id"]: e for e in map(json.loads, lines)}
        if request_ids <= entries.keys():
            return {r: entries[r] for r in request_ids}
        assert loop.time() < give_up, f"not in the access log: {request_ids - entries.keys()}"
        await asyncio.sleep(0.05)


async def test_access_log_has_the_callers_method_and_path(
    mesh: Mesh, envoy: EnvoyProcess, http: httpx.AsyncClient
) -> None:
    """The caller's own verb and route, not the transcoded POST /pkg.Service/Method; no
    grpc_status, which Envoy derived from the HTTP status (a server's INVALID_ARGUMENT was
    logged as 13, a timeout's 504 as 14)."""
    calls = [
        ("GET", "toolsproxy", "/health", None, 200),
        ("POST", "toolsproxy", EXECUTE, {"tool_name": "invalid"}, 400),
        ("GET", "toolsproxy", SLOW_ROUTE, None, 504),
        ("GET", "retrieval", "/health?verbose=1", None, 400),  # refused by the transcoder
        ("POST", "toolsproxy", "/internal/mcp/nope", {}, 404),
    ]
    ids = {}
    for method, key, path, body, status in calls:
        request_id = f"log-{uuid.uuid4()}"
        resp = await http.request(
            method, mesh.url(key) + path, json=body, headers={"x-request-id": request_id}
        )
        assert resp.status_code == status, resp.text
        ids[request_id] = (method, key, path, status)
    entries = await _logged(envoy, set(ids))
    for request_id, (method, key, path, status) in ids.items():
        entry = entries[request_id]
        assert (entry["method"], entry["path"], entry["status"]) == (method, path, status)
        assert entry["service"] == key
        assert "grpc_status" not in entry


# --- the deploy/ sidecars: healthcheck, drain, memory ------------------------------------


DRAIN_SCRIPT = REPO_ROOT / "deploy" / "envoy" / "drain.sh"
DRAIN_FLAGS = ["--drain-time-s", "1", "--drain-strategy", "immediate"]


def test_compose_healthcheck_passes_against_envoy(envoy: EnvoyProcess) -> None:
    """The sidecars' compose healthcheck, run against a real Envoy's admin: HTTP/1.0 got 426
    Upgrade Required, so every sidecar stayed unhealthy."""
    compose = yaml.safe_load((REPO_ROOT / "deploy" / "docker-compose.yml").read_text())
    tests = {
        tuple(svc["healthcheck"]["test"])
        for name, svc in compose["services"].items()
        if name.endswith("-envoy")
    }
    [(cmd, shell, flag, script)] = tests
    assert (cmd, shell, flag) == ("CMD", "bash", "-c")
    admin = f"/dev/tcp/127.0.0.1/{Ports().envoy_admin}"
    assert admin in script

    def run(port: int) -> int:
        here = script.replace(admin, f"/dev/tcp/127.0.0.1/{port}")
        return subprocess.run(["bash", "-c", here], timeout=10, check=False).returncode

    assert envoy.admin_port is not None
    assert run(envoy.admin_port) == 0
    assert run(free_ports(1)[0]) != 0  # nothing listening there


class Held:
    """Calls that wait, in the server, until the test releases them: requests in flight."""

    def __init__(self) -> None:
        self.arrived = asyncio.Event()
        self.release = asyncio.Event()

    async def hold(self) -> None:
        self.arrived.set()
        await self.release.wait()


@pytest.fixture
async def held(ports_free: Ports) -> AsyncIterator[Held]:
    """ToolsProxy's Execute and Retrieval's IngestDocument held until released, behind
    `ports_free` (Envoy not started: each test runs its own)."""
    held = Held()

    class HeldToolsProxy(toolsproxy_pb2_grpc.ToolsProxyServiceServicer):
        async def Execute(self, request, context):
            await held.hold()
            return toolsproxy_pb2.ExecuteResponse(status="ok")

    class HeldIngestion(retrieval_pb2_grpc.IngestionServiceServicer):
        async def IngestDocument(self, request, context):
            await held.hold()
            return retrieval_pb2.IngestDocumentResponse(doc_id=request.doc_id)

    tools = grpc.aio.server()
    toolsproxy_pb2_grpc.add_ToolsProxyServiceServicer_to_server(HeldToolsProxy(), tools)
    retrieval = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
    retrieval_pb2_grpc.add_IngestionServiceServicer_to_server(HeldIngestion(), retrieval)
    retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(Retrieval(), retrieval)
    for key, server in (("toolsproxy", tools), ("retrieval", retrieval)):
        assert server.add_insecure_port(f"127.0.0.1:{ports_free.grpc[key]}") != 0
        await server.start()
    try:
        yield held
    finally:
        held.release.set()
        await asyncio.gather(tools.stop(None), retrieval.stop(None))


@pytest.fixture
def ports_free() -> Ports:
    return Ports.free()


def _json_url(ports: Ports, key: str) -> str:
    return f"http://127.0.0.1:{ports.http[key]}"


async def _stderr_until(proc: asyncio.subprocess.Process, text: str) -> None:
    """Read `proc`'s stderr until a line with `text` (a state the script reports)."""
    assert proc.stderr is not None
    while True:
        line = await asyncio.wait_for(proc.stderr.readline(), 30)
        assert line, f"{text!r} never came; exit {await proc.wait()}"
        if text in line.decode():
            return


async def test_prestop_drain_waits_for_the_call_in_flight(
    held: Held, ports_free: Ports, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    """The k8s preStop (drain.sh SETTLE MAX): Envoy drains, and the hook returns (letting the
    kubelet send SIGTERM) only once the JSON call in flight has its answer."""
    with EnvoyProcess(concurrency=1, extra_args=DRAIN_FLAGS) as envoy:
        envoy.start(render(ports_free, str(DESCRIPTOR)), tmp_path)
        await asyncio.to_thread(envoy.wait_ready)
        url = _json_url(ports_free, "toolsproxy") + EXECUTE
        call = asyncio.create_task(http.post(url, json={"tool_name": "held"}))
        await asyncio.wait_for(held.arrived.wait(), 30)
        drain = await asyncio.create_subprocess_exec(
            "bash", str(DRAIN_SCRIPT), "0", "60",
            env={**os.environ, "ENVOY_ADMIN_PORT": str(ports_free.envoy_admin)},
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            await _stderr_until(drain, "1 in flight")
            assert drain.returncode is None  # still waiting: the call is held
            held.release.set()
            resp = await call
            assert resp.status_code == 200, resp.text
            assert resp.headers["connection"] == "close"  # drained: reconnect elsewhere
            assert await asyncio.wait_for(drain.wait(), 30) == 0
        finally:
            if drain.returncode is None:
                drain.kill()


async def test_compose_sidecar_drains_at_sigterm(
    held: Held, ports_free: Ports, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    """The compose sidecar (drain.sh --run ... -- envoy ...): SIGTERM drains Envoy, waits for
    the call in flight, then stops it; Envoy alone drops the call at SIGTERM."""
    config = tmp_path / "envoy.yaml"
    config.write_text(render(ports_free, str(DESCRIPTOR)))
    sidecar = await asyncio.create_subprocess_exec(
        "bash", str(DRAIN_SCRIPT), "--run", "0", "60", "--",
        envoy_binary(), "-c", str(config), "--concurrency", "1", "--log-level", "warn",
        "--disable-hot-restart", *DRAIN_FLAGS,
        cwd=REPO_ROOT,
        env={**os.environ, "ENVOY_ADMIN_PORT": str(ports_free.envoy_admin)},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # its own process group: Envoy goes with it on failure
    )  # fmt: skip
    try:
        await asyncio.to_thread(_wait_admin_ready, ports_free.envoy_admin)
        url = _json_url(ports_free, "toolsproxy") + EXECUTE
        call = asyncio.create_task(http.post(url, json={"tool_name": "held"}))
        await asyncio.wait_for(held.arrived.wait(), 30)
        sidecar.send_signal(signal.SIGTERM)
        await _stderr_until(sidecar, "1 in flight")
        held.release.set()
        resp = await call
        assert resp.status_code == 200, resp.text
        assert sidecar.stderr is not None
        await sidecar.stderr.read()
        assert await asyncio.wait_for(sidecar.wait(), 30) == 0
    finally:
        if sidecar.returncode is None:
            os.killpg(sidecar.pid, signal.SIGKILL)
            await sidecar.wait()


def _wait_admin_ready(port: int) -> None:
    give_up = time.monotonic() + 15
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < give_up, "Envoy not ready"
        time.sleep(0.05)


async def test_sidecar_refuses_new_requests_past_its_heap_limit(
    held: Held, ports_free: Ports, tmp_path: Path
) -> None:
    """render(max_heap_bytes=...) (the deploy sidecars'): with one large ingestion in flight
    past the heap limit, Envoy answers new requests 503 "envoy overloaded" (502
    UPSTREAM_UNAVAILABLE to the caller, who retries) instead of growing until the container is
    OOM-killed; the call in flight still completes."""
    with EnvoyProcess(concurrency=1) as envoy:
        envoy.start(render(ports_free, str(DESCRIPTOR), max_heap_bytes=64 << 20), tmp_path)
        await asyncio.to_thread(envoy.wait_ready)
        url = _json_url(ports_free, "retrieval")
        async with httpx.AsyncClient(timeout=60) as http:
            document = base64.b64encode(b"x" * (30 << 20)).decode()
            body = {"tenant_id": "t1", "doc_id": "d1", "content": document}
            call = asyncio.create_task(http.post(url + "/internal/retrieval/documents", json=body))
            await asyncio.wait_for(held.arrived.wait(), 30)
            for _ in range(300):  # until the overload manager's next reading (every 0.25 s)
                resp = await http.get(url + "/health")
                if resp.status_code != 200:
                    break
                await asyncio.sleep(0.05)
            detail = assert_status_body(resp, 502, code_pb2.UNAVAILABLE, "UPSTREAM_UNAVAILABLE")
            assert detail["metadata"]["response_code_details"] == "overload"
            held.release.set()
            assert (await call).status_code == 200
