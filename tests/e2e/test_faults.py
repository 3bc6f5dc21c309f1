"""Faults: each dependency down, then slow past its deadline, through the real mesh.

Every case is called the way a caller would: JSON through Envoy and gRPC straight to the
server. Each answers the documented status and error code within the caller's deadline
(the elapsed time is measured and bounded) and never hangs. The circuit breakers of the LLM
runtime, the bank and Tavily open after at most 5 failures and close after recovery (a
half-open trial call); the vector store's opens and probes. Envoy's fault filter (on only in
these meshes: `Mesh(fault_injection=True)`) drives the injected aborts and delays.

"Slow" for a whole service is SIGSTOP: its sockets accept and nothing answers, exactly what
a hung process looks like to its callers; SIGCONT brings it back.
"""

from __future__ import annotations

import base64
import os
import signal
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import json_format
from google.protobuf.message import Message
from visior.llm.v1 import llm_pb2, llm_pb2_grpc
from visior.orchestrator.v1 import orchestrator_pb2, orchestrator_pb2_grpc
from visior.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc
from visior.toolsproxy.v1 import toolsproxy_pb2, toolsproxy_pb2_grpc

from services.common.status import error_info
from services.common.topology import SERVICES, Ports
from services.devtools.envoy import REPO_ROOT
from services.devtools.mesh import Mesh
from tests.e2e.conftest import (
    LDAP_DOC,
    LDAP_QUESTION,
    NO_DRAIN,
    SAMPLES,
    assert_error,
    ingest,
    log_lines,
)
from tests.e2e.settings_hook import settings_overrides
from tests.fakes.cbr_server import FakeCbrServer
from tests.fakes.openai_chat import FakeChatServer
from tests.fakes.tavily_server import FakeTavilyServer

pytestmark = pytest.mark.e2e

TENANT = "faults"
USER = {"user_id": "u1", "tenant_id": TENANT}
DEADLINE_S = 1.5
"""The faulty mesh's deadline on each hop: orchestrator -> retrieval, llm -> toolsproxy,
toolsproxy -> retrieval, Envoy's search and execute routes, the LLM runtime."""
EXECUTE_ROUTE_S = 2 * DEADLINE_S
"""Envoy's execute route: longer than the proxy's own downstream deadlines, so a tool whose
dependency hangs answers its tool error before Envoy gives up on the proxy."""
ORCH_ATTEMPTS = 3
"""ORCH_RETRY_ATTEMPTS: the orchestrator's channel tries an UNAVAILABLE call this often."""
SLACK_S = 4.0
"""What a loaded 2-core machine may add to a deadline before we call it a hang."""
BREAKER_FAILURES = 5
"""The spec's "opens after at most 5 failures": every breaker in the faulty mesh uses it."""
BREAKER_RESET_S = 1.5
TAVILY_KEY = "tvly-faults"
SEARCH = "/internal/retrieval/search"
RESPOND = "/internal/orchestrator/respond"
GENERATE = "/internal/llm/generate"
EXECUTE = "/internal/mcp/execute"
INGEST = "/internal/retrieval/documents"

# JSON route -> (service, stub, method, request type): the same body goes both ways.
ROUTES: dict[str, tuple[str, Callable[[grpc.Channel], Any], str, type[Message]]] = {
    RESPOND: (
        "orchestrator",
        orchestrator_pb2_grpc.OrchestratorServiceStub,
        "Respond",
        orchestrator_pb2.RespondRequest,
    ),
    GENERATE: ("llm", llm_pb2_grpc.LlmServiceStub, "Generate", llm_pb2.GenerateRequest),
    SEARCH: (
        "retrieval",
        retrieval_pb2_grpc.RetrievalServiceStub,
        "Search",
        retrieval_pb2.SearchRequest,
    ),
    INGEST: (
        "retrieval",
        retrieval_pb2_grpc.IngestionServiceStub,
        "IngestDocument",
        retrieval_pb2.IngestDocumentRequest,
    ),
    EXECUTE: (
        "toolsproxy",
        toolsproxy_pb2_grpc.ToolsProxyServiceStub,
        "Execute",
        toolsproxy_pb2.ExecuteRequest,
    ),
}


# --- calling the mesh both ways ------------------------------------------------------------


@dataclass
class Json:
    response: httpx.Response
    seconds: float

    @property
    def body(self) -> dict[str, Any]:
        return self.response.json()


@dataclass
class Grpc:
    code: grpc.StatusCode
    seconds: float
    reason: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    message: str = ""
    response: dict[str, Any] | None = None


def call_json(
    mesh: Mesh, path: str, body: dict[str, Any], *, headers: dict[str, str] | None = None
) -> Json:
    key = ROUTES[path][0] if path in ROUTES else "orchestrator"
    started = time.monotonic()
    # The client's own timeout is far past every deadline under test: a hang shows as the
    # elapsed-time assertion failing, not as a client error hiding it.
    r = httpx.post(f"{mesh.json_url(key)}{path}", json=body, headers=headers, timeout=60)
    return Json(r, time.monotonic() - started)


def call_grpc(mesh: Mesh, path: str, body: dict[str, Any], *, timeout: float = 60.0) -> Grpc:
    key, stub_type, method, request_type = ROUTES[path]
    request = json_format.ParseDict(body, request_type())
    started = time.monotonic()
    with grpc.insecure_channel(f"127.0.0.1:{mesh.ports.grpc[key]}") as channel:
        try:
            response = getattr(stub_type(channel), method)(request, timeout=timeout)
        except grpc.RpcError as exc:
            seconds = time.monotonic() - started
            info = error_info(exc)
            return Grpc(
                exc.code(),  # type: ignore[attr-defined]
                seconds,
                info.reason if info else "",
                dict(info.metadata) if info else {},
                exc.details() or "",  # type: ignore[attr-defined]
            )
    return Grpc(
        grpc.StatusCode.OK,
        time.monotonic() - started,
        response=json_format.MessageToDict(response, preserving_proto_field_name=True),
    )


def assert_within(seconds: float, budget: float) -> None:
    """Answered within `budget` (a deadline) plus what a loaded machine adds: not a hang."""
    assert seconds <= budget + SLACK_S, f"took {seconds:.2f} s, budget {budget:g} s"


def assert_grpc_error(out: Grpc, code: grpc.StatusCode, reason: str) -> None:
    assert (out.code, out.reason) == (code, reason), out


def execute_body(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"tool_name": tool, "arguments": arguments, "user": USER}


def tool_error_both_ways(mesh: Mesh, tool: str, arguments: dict[str, Any]) -> list[float]:
    """Call a tool by JSON and gRPC; both must be the UPSTREAM_UNAVAILABLE tool error (tool
    failures are results, HTTP 200 / gRPC OK). Returns the elapsed seconds of each."""
    j = call_json(mesh, EXECUTE, execute_body(tool, arguments))
    assert j.response.status_code == 200, j.response.text
    assert j.body["status"] == "error", j.body
    assert j.body["error"]["code"] == "UPSTREAM_UNAVAILABLE", j.body
    g = call_grpc(mesh, EXECUTE, execute_body(tool, arguments))
    assert g.code == grpc.StatusCode.OK and g.response is not None, g
    assert g.response["status"] == "error", g.response
    assert g.response["error"]["code"] == "UPSTREAM_UNAVAILABLE", g.response
    return [j.seconds, g.seconds]


def tool_ok(mesh: Mesh, tool: str, arguments: dict[str, Any], *, grpc_call: bool = False) -> None:
    if grpc_call:
        g = call_grpc(mesh, EXECUTE, execute_body(tool, arguments))
        assert g.response is not None and g.response["status"] == "ok", g
        return
    j = call_json(mesh, EXECUTE, execute_body(tool, arguments))
    assert j.response.status_code == 200 and j.body["status"] == "ok", j.response.text


def wait_tool_ok(mesh: Mesh, tool: str, arguments: Callable[[], dict[str, Any]]) -> None:
    """Until the tool answers ok again: the breaker's reset passes, its trial call closes it."""
    deadline = time.monotonic() + BREAKER_RESET_S + SLACK_S
    while True:
        j = call_json(mesh, EXECUTE, execute_body(tool, arguments()))
        if j.response.status_code == 200 and j.body["status"] == "ok":
            return
        assert time.monotonic() < deadline, j.response.text
        time.sleep(0.2)


@dataclass
class Frozen:
    """A service process stopped with SIGSTOP: connections open, nothing answers."""

    mesh: Mesh
    key: str

    def __enter__(self) -> Frozen:
        os.kill(self.mesh.pids()[self.key], signal.SIGSTOP)
        return self

    def __exit__(self, *exc: object) -> None:
        os.kill(self.mesh.pids()[self.key], signal.SIGCONT)


def restart(mesh: Mesh, key: str) -> None:
    mesh.start_service(key)
    mesh.wait_healthy(key, timeout=60)


RECOVERY_S = 2.0
"""After a neighbour is back, callers reconnect within this (mesh channels back off at most
0.5 s between connection attempts, and retry a refused call)."""


def assert_recovers(mesh: Mesh, path: str = RESPOND, body: dict | None = None) -> None:
    """`path` answers 200 again within RECOVERY_S of the restarted service being healthy."""
    body = respond_body() if body is None else body
    start = time.monotonic()
    while (r := call_json(mesh, path, body)).response.status_code != 200:
        assert time.monotonic() - start < RECOVERY_S, r.response.text
        time.sleep(0.1)


# --- the faulty mesh -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def chat() -> Iterator[FakeChatServer]:
    with FakeChatServer() as server:  # echoes the last user message unless told otherwise
        yield server


@pytest.fixture(scope="module")
def bank() -> Iterator[FakeCbrServer]:
    with FakeCbrServer() as server:
        yield server


@pytest.fixture(scope="module")
def tavily() -> Iterator[FakeTavilyServer]:
    with FakeTavilyServer(api_key=TAVILY_KEY) as server:
        yield server


@pytest.fixture(scope="module")
def faulty(
    tmp_path_factory: pytest.TempPathFactory,
    chat: FakeChatServer,
    bank: FakeCbrServer,
    tavily: FakeTavilyServer,
) -> Iterator[Mesh]:
    """The mesh with short deadlines and breakers, fakes for every outside service, and
    Envoy's fault filter."""
    root: Path = tmp_path_factory.mktemp("faulty")
    deadline = str(DEADLINE_S)
    breaker = {"breaker": {"failures": BREAKER_FAILURES, "reset_s": BREAKER_RESET_S}}
    env = {
        **NO_DRAIN,
        "ORCH_MODEL_ROUTING": "false",  # the scenario by rules: the runtime sees Generate only
        "ORCH_RETRIEVAL_TIMEOUT_SECONDS": deadline,
        "ORCH_RETRY_ATTEMPTS": str(ORCH_ATTEMPTS),
        "LLM_SERVICE_MCP_TIMEOUT_SECONDS": deadline,
        "MCP_PROXY_RETRIEVAL_TIMEOUT_SECONDS": deadline,
        "LLM_RUNTIME_URL": chat.url,
        "DEFAULT_MODEL_NAME": "fake-model",
        "LLM_RUNTIME_TIMEOUT_S": deadline,
        "MCP_PROXY_CBR_URL": bank.url,
        "MCP_PROXY_TAVILY_URL": tavily.url,
        "MCP_PROXY_TAVILY_API_KEY": TAVILY_KEY,
        # Constants in the services (not environment settings), shortened in these processes.
        **settings_overrides(
            runtime={"retry": {"first_delay_s": 0.05}, **breaker},
            cbr={"timeout_s": 0.5, "retry": {"first_delay_s": 0.05}, "cache_ttl_s": 0.0, **breaker},
            tavily={
                "timeout_s": 0.5, "cache_ttl_s": 0.0, **breaker,
                "retry": {"deadline_s": DEADLINE_S, "attempts": 2, "first_delay_s": 0.05},
            },
        ),
    }  # fmt: skip
    m = Mesh(
        Ports.free(),
        root / "data",
        root / "run",
        env=env,
        envoy_timeouts={SEARCH: DEADLINE_S, EXECUTE: EXECUTE_ROUTE_S},
        fault_injection=True,
    )
    m.start()
    try:
        guide = SAMPLES / f"{LDAP_DOC}.md"
        ingest(m, TENANT, guide.name, guide.read_bytes())
        yield m
    finally:
        m.stop()


def respond_body() -> dict[str, Any]:
    return {"query": LDAP_QUESTION, "user": USER}


def search_body(query: str = "LDAP") -> dict[str, Any]:
    return {"query": query, "tenant_id": TENANT, "max_results": 3}


def generate_body(*, planned: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "LDAP?"}], "user": USER}
    if planned:  # the loop runs this call through ToolsProxy before it asks the model
        body["tool_policy"] = {
            "allowed_tools": ["read_doc_metadata"],
            "planned_calls": [
                {"tool_name": "read_doc_metadata", "arguments": {"doc_id": LDAP_DOC}}
            ],
        }
    return body


def ingest_body(name: str, text: str) -> dict[str, Any]:
    return {
        "tenant_id": TENANT,
        "file_name": name,
        "content": base64.b64encode(text.encode()).decode(),
    }


# --- Envoy's fault filter -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "injected", "status", "reason"),
    [
        (RESPOND, respond_body(), "503", 502, "UPSTREAM_UNAVAILABLE"),
        (SEARCH, search_body(), "504", 504, "DEADLINE_EXCEEDED"),
        (GENERATE, generate_body(), "429", 429, "RATE_LIMIT_EXCEEDED"),
        (EXECUTE, execute_body("read_doc_metadata", {"doc_id": LDAP_DOC}), "500", 500, "INTERNAL"),
    ],
)
def test_abort_header_gives_the_mapped_status_and_json_error_body(
    faulty: Mesh, path: str, body: dict[str, Any], injected: str, status: int, reason: str
) -> None:
    key = ROUTES[path][0]
    aborted, control = uuid.uuid4().hex, uuid.uuid4().hex
    r = call_json(
        faulty,
        path,
        body,
        headers={"x-envoy-fault-abort-request": injected, "x-trace-id": aborted},
    )
    info = assert_error(r.response, status, reason, domain="envoy")
    assert info["metadata"]["response_flags"] == "FI"
    assert info["metadata"]["response_code_details"] == "fault_filter_abort"
    # The server never saw it: a request sent after it is logged, the aborted one is not.
    assert (
        call_json(faulty, path, body, headers={"x-trace-id": control}).response.status_code == 200
    )
    seen = [e.get("trace_id") for e in log_lines(faulty, key)]
    assert control in seen and aborted not in seen


def test_grpc_abort_header_on_a_json_route_is_a_visible_400(faulty: Mesh) -> None:
    # Envoy would answer HTTP 200 with the gRPC status in headers a JSON client never reads.
    r = call_json(faulty, SEARCH, search_body(), headers={"x-envoy-fault-abort-grpc-request": "14"})
    info = assert_error(r.response, 400, "GRPC_FAULT_ABORT_UNSUPPORTED", domain="envoy")
    assert info["metadata"]["response_flags"] == "FI"


def test_delay_header_within_the_route_budget_only_delays(faulty: Mesh) -> None:
    r = call_json(faulty, SEARCH, search_body(), headers={"x-envoy-fault-delay-request": "400"})
    assert r.response.status_code == 200, r.response.text
    assert r.body["hits"]
    assert r.seconds >= 0.4


def test_delay_header_past_the_route_timeout_is_504(faulty: Mesh) -> None:
    r = call_json(faulty, SEARCH, search_body(), headers={"x-envoy-fault-delay-request": "20000"})
    info = assert_error(r.response, 504, "DEADLINE_EXCEEDED", domain="envoy")
    assert "DI" in info["metadata"]["response_flags"]  # delay injected, cut by the budget
    assert info["metadata"]["response_code_details"] == "max_duration_timeout"
    assert r.seconds >= DEADLINE_S * 0.9
    assert_within(r.seconds, DEADLINE_S)


# --- Retrieval ------------------------------------------------------------------------------


def test_retrieval_down(faulty: Mesh) -> None:
    faulty.stop_service("retrieval")
    try:
        # Respond needs Retrieval: 502, the orchestrator names the downstream.
        j = call_json(faulty, RESPOND, respond_body())
        info = assert_error(j.response, 502, "UPSTREAM_UNAVAILABLE", domain="visior.orchestrator")
        assert info["metadata"]["downstream"] == "retrieval"
        g = call_grpc(faulty, RESPOND, respond_body())
        assert_grpc_error(g, grpc.StatusCode.UNAVAILABLE, "UPSTREAM_UNAVAILABLE")
        # Retrieval's own routes: Envoy answers for the dead server; gRPC is refused.
        s = call_json(faulty, SEARCH, search_body())
        assert_error(s.response, 502, "UPSTREAM_UNAVAILABLE", domain="envoy")
        gs = call_grpc(faulty, SEARCH, search_body())
        assert gs.code == grpc.StatusCode.UNAVAILABLE, gs
        # The search tool reports it as its result.
        times = tool_error_both_ways(faulty, "search_user_documents", {"query": "LDAP"})
        for seconds in (j.seconds, g.seconds, s.seconds, gs.seconds, *times):
            assert_within(seconds, DEADLINE_S)
    finally:
        restart(faulty, "retrieval")
    assert_recovers(faulty)
    # ToolsProxy's own channel to Retrieval reconnects too. (Checked here, not left to the
    # next test: a channel that last saw the port refused reports that failure until a new
    # connection succeeds, so freezing Retrieval before it reconnected made the search tool
    # fail fast instead of waiting out its deadline.)
    start = time.monotonic()
    body = execute_body("search_user_documents", {"query": "LDAP"})
    while (j := call_json(faulty, EXECUTE, body)).body.get("status") != "ok":
        assert time.monotonic() - start < RECOVERY_S, j.response.text
        time.sleep(0.1)


def test_retrieval_slow_past_its_deadline(faulty: Mesh) -> None:
    with Frozen(faulty, "retrieval"):
        j = call_json(faulty, RESPOND, respond_body())
        info = assert_error(j.response, 502, "UPSTREAM_UNAVAILABLE", domain="visior.orchestrator")
        assert info["metadata"]["downstream"] == "retrieval"
        assert info["metadata"]["downstream_code"] == "DEADLINE_EXCEEDED"
        g = call_grpc(faulty, RESPOND, respond_body())
        assert_grpc_error(g, grpc.StatusCode.UNAVAILABLE, "UPSTREAM_UNAVAILABLE")
        assert g.metadata["downstream_code"] == "DEADLINE_EXCEEDED"
        # Straight to Retrieval: Envoy's route budget, or the gRPC caller's own deadline.
        s = call_json(faulty, SEARCH, search_body())
        assert_error(s.response, 504, "DEADLINE_EXCEEDED", domain="envoy")
        gs = call_grpc(faulty, SEARCH, search_body(), timeout=DEADLINE_S)
        assert gs.code == grpc.StatusCode.DEADLINE_EXCEEDED, gs
        times = tool_error_both_ways(faulty, "search_user_documents", {"query": "LDAP"})
        for seconds in (j.seconds, g.seconds, s.seconds, gs.seconds, *times):
            assert seconds >= DEADLINE_S * 0.9, (j.seconds, g.seconds, s.seconds, gs.seconds, times)
            assert_within(seconds, DEADLINE_S)  # ...and no longer
    # Thawed, it answers again.
    assert call_json(faulty, SEARCH, search_body()).response.status_code == 200


# --- ToolsProxy -----------------------------------------------------------------------------


def test_toolsproxy_down(faulty: Mesh) -> None:
    faulty.stop_service("toolsproxy")
    try:
        j = call_json(faulty, GENERATE, generate_body(planned=True))
        info = assert_error(j.response, 502, "UPSTREAM_UNAVAILABLE", domain="visior.llm")
        assert info["metadata"]["downstream"] == "toolsproxy"
        g = call_grpc(faulty, GENERATE, generate_body(planned=True))
        assert_grpc_error(g, grpc.StatusCode.UNAVAILABLE, "UPSTREAM_UNAVAILABLE")
        e = call_json(faulty, EXECUTE, execute_body("read_doc_metadata", {"doc_id": LDAP_DOC}))
        assert_error(e.response, 502, "UPSTREAM_UNAVAILABLE", domain="envoy")
        for seconds in (j.seconds, g.seconds, e.seconds):
            assert_within(seconds, DEADLINE_S)
    finally:
        restart(faulty, "toolsproxy")
    assert_recovers(faulty, GENERATE, generate_body(planned=True))


def test_toolsproxy_slow_past_its_deadline(faulty: Mesh) -> None:
    with Frozen(faulty, "toolsproxy"):
        j = call_json(faulty, GENERATE, generate_body(planned=True))
        info = assert_error(j.response, 502, "UPSTREAM_UNAVAILABLE", domain="visior.llm")
        assert info["metadata"]["downstream_code"] == "DEADLINE_EXCEEDED"
        g = call_grpc(faulty, GENERATE, generate_body(planned=True))
        assert_grpc_error(g, grpc.StatusCode.UNAVAILABLE, "UPSTREAM_UNAVAILABLE")
        for seconds in (j.seconds, g.seconds):
            assert seconds >= DEADLINE_S * 0.9
            assert_within(seconds, DEADLINE_S)
        e = call_json(faulty, EXECUTE, execute_body("read_doc_metadata", {"doc_id": LDAP_DOC}))
        assert_error(e.response, 504, "DEADLINE_EXCEEDED", domain="envoy")
        assert e.seconds >= EXECUTE_ROUTE_S * 0.9
        assert_within(e.seconds, EXECUTE_ROUTE_S)
    assert call_json(faulty, GENERATE, generate_body(planned=True)).response.status_code == 200


# --- the LLM runtime ------------------------------------------------------------------------


def runtime_fails_both_ways(mesh: Mesh, kind: str) -> list[float]:
    j = call_json(mesh, GENERATE, generate_body())
    info = assert_error(j.response, 502, "LLM_RUNTIME_ERROR", domain="visior.llm")
    assert info["metadata"]["kind"] == kind, info
    g = call_grpc(mesh, GENERATE, generate_body())
    assert_grpc_error(g, grpc.StatusCode.UNAVAILABLE, "LLM_RUNTIME_ERROR")
    assert g.metadata["kind"] == kind, g
    return [j.seconds, g.seconds]


def test_llm_runtime_down(faulty: Mesh, chat: FakeChatServer) -> None:
    assert call_json(faulty, GENERATE, generate_body()).response.status_code == 200
    chat.close_connection(times=4)  # each call: the first try and its one retry
    for seconds in runtime_fails_both_ways(faulty, "unreachable"):
        assert_within(seconds, DEADLINE_S)
    assert call_json(faulty, GENERATE, generate_body()).response.status_code == 200


def test_llm_runtime_slow_past_its_deadline(faulty: Mesh, chat: FakeChatServer) -> None:
    chat.hang(seconds=30, times=2)  # the LLM service does not retry a timeout
    for seconds in runtime_fails_both_ways(faulty, "timeout"):
        assert seconds >= DEADLINE_S * 0.9
        assert_within(seconds, DEADLINE_S)
    # Respond passes the model's failure on with its code. LLM_RUNTIME_ERROR travels as
    # UNAVAILABLE from a handler that ran, which the orchestrator's channel does not rerun
    # (negative retry pushback): a hung runtime costs Respond one runtime timeout.
    chat.hang(seconds=30, times=1)
    before = len(chat.chat_requests)
    r = call_json(faulty, RESPOND, respond_body())
    assert_error(r.response, 502, "LLM_RUNTIME_ERROR", domain="visior.orchestrator")
    assert r.seconds >= DEADLINE_S * 0.9
    assert_within(r.seconds, DEADLINE_S)
    assert len(chat.chat_requests) - before == 1  # the runtime was asked once


def wait_generate_ok(mesh: Mesh) -> None:
    """Until Generate answers again (an earlier test may have left the breaker open)."""
    deadline = time.monotonic() + BREAKER_RESET_S + SLACK_S
    while (r := call_json(mesh, GENERATE, generate_body())).response.status_code != 200:
        assert time.monotonic() < deadline, r.response.text
        time.sleep(0.2)


def test_llm_runtime_breaker_opens_and_closes(faulty: Mesh, chat: FakeChatServer) -> None:
    wait_generate_ok(faulty)
    chat.fail(503, times=2 * BREAKER_FAILURES)
    for i in range(BREAKER_FAILURES):  # each one reaches the runtime (kind: overloaded)
        if i % 2:
            j = call_json(faulty, GENERATE, generate_body())
            info = assert_error(j.response, 502, "LLM_RUNTIME_ERROR", domain="visior.llm")
            assert info["metadata"]["kind"] == "overloaded", info
        else:
            g = call_grpc(faulty, GENERATE, generate_body())
            assert_grpc_error(g, grpc.StatusCode.UNAVAILABLE, "LLM_RUNTIME_ERROR")
            assert g.metadata["kind"] == "overloaded", g
    seen = len(chat.chat_requests)
    # Open: refused at once, the runtime is not called.
    runtime_fails_both_ways(faulty, "circuit_open")
    assert len(chat.chat_requests) == seen
    # After the reset time one trial call goes through; the runtime is back: closed.
    time.sleep(BREAKER_RESET_S)
    assert call_json(faulty, GENERATE, generate_body()).response.status_code == 200
    assert call_grpc(faulty, GENERATE, generate_body()).code == grpc.StatusCode.OK
    assert len(chat.chat_requests) == seen + 2


# --- the document store ---------------------------------------------------------------------


def test_document_store_locked_by_another_writer(faulty: Mesh) -> None:
    """SQLite in WAL mode: readers never wait, a writer waits out busy_timeout (5 s) for the
    lock. Another writer holding it (a backup, a second process) is the store failure that
    really happens; ingestion then answers 502 backend_unavailable, never a hang."""
    busy_timeout_s = 5.0
    store = sqlite3.connect(faulty.data_dir / "docstore.sqlite", isolation_level=None)
    store.execute("BEGIN IMMEDIATE")
    try:
        with ThreadPoolExecutor(2) as pool:
            j = pool.submit(call_json, faulty, INGEST, ingest_body("locked.md", "# L\n\nlocked"))
            time.sleep(0.2)
            # A gRPC caller with a shorter deadline is let go at its deadline.
            g = pool.submit(
                call_grpc, faulty, INGEST, ingest_body("locked2.md", "# M\n\nx"), timeout=2.0
            )
            # Meanwhile reads go on: search and the document tools.
            s = call_json(faulty, SEARCH, search_body())
            assert s.response.status_code == 200 and s.body["hits"], s.response.text
            tool_ok(faulty, "read_doc_metadata", {"doc_id": LDAP_DOC})
            jr, gr = j.result(), g.result()
        info = assert_error(jr.response, 502, "backend_unavailable", domain="visior.retrieval")
        assert info["metadata"]["backend"] == "docstore"
        assert_within(jr.seconds, busy_timeout_s)
        assert gr.code == grpc.StatusCode.DEADLINE_EXCEEDED, gr
        assert_within(gr.seconds, 2.0)
    finally:
        store.execute("ROLLBACK")
        store.close()
    # The lock is gone: the same ingestion succeeds, nothing of the failed one is listed.
    ok = call_json(faulty, INGEST, ingest_body("locked.md", "# L\n\nlocked"))
    assert ok.response.status_code == 200, ok.response.text
    listed = httpx.get(
        f"{faulty.json_url('retrieval')}{INGEST}", params={"tenant_id": TENANT}, timeout=30
    ).json()
    assert sorted(d["doc_id"] for d in listed["documents"]) == sorted([LDAP_DOC, "locked"])


# --- the bank and Tavily (tools: failures are results) ----------------------------------------


def test_bank_down(faulty: Mesh, bank: FakeCbrServer) -> None:
    tool_ok(faulty, "fetch_cbr_data", {"mode": "key_rate"})
    bank.drop_next(4)  # each call: the first try and its one retry
    for seconds in tool_error_both_ways(faulty, "fetch_cbr_data", {"mode": "key_rate"}):
        assert_within(seconds, 1.0)
    bank.fail_next(4, status=503)
    for seconds in tool_error_both_ways(faulty, "fetch_cbr_data", {"mode": "key_rate"}):
        assert_within(seconds, 1.0)
    tool_ok(faulty, "fetch_cbr_data", {"mode": "key_rate"})


def test_bank_slow_past_its_deadline(faulty: Mesh, bank: FakeCbrServer) -> None:
    tool_ok(faulty, "fetch_cbr_data", {"mode": "key_rate"})
    bank.hang_next(2)  # a bank that hangs is not asked twice
    for seconds in tool_error_both_ways(faulty, "fetch_cbr_data", {"mode": "key_rate"}):
        assert seconds >= 0.5  # the bank's timeout, shortened
        assert_within(seconds, 0.5)
    tool_ok(faulty, "fetch_cbr_data", {"mode": "key_rate"})


def test_bank_breaker_opens_and_closes(faulty: Mesh, bank: FakeCbrServer) -> None:
    tool_ok(faulty, "fetch_cbr_data", {"mode": "key_rate"})
    bank.fail_next(2 * BREAKER_FAILURES)
    for i in range(BREAKER_FAILURES):
        j = call_json(faulty, EXECUTE, execute_body("fetch_cbr_data", {"mode": "key_rate"}))
        assert j.body["error"]["code"] == "UPSTREAM_UNAVAILABLE", (i, j.body)
    seen = len(bank.requests)
    tool_error_both_ways(faulty, "fetch_cbr_data", {"mode": "key_rate"})
    assert len(bank.requests) == seen  # open: the bank is not called
    wait_tool_ok(faulty, "fetch_cbr_data", lambda: {"mode": "key_rate"})
    tool_ok(faulty, "fetch_cbr_data", {"mode": "key_rate"}, grpc_call=True)
    assert len(bank.requests) == seen + 2  # the trial call, then closed


def news() -> dict[str, Any]:
    return {"query": f"ruble outlook {uuid.uuid4().hex[:8]}"}


def test_tavily_down(faulty: Mesh, tavily: FakeTavilyServer) -> None:
    tool_ok(faulty, "fetch_finance_news", news())
    tavily.drop_next(4)  # two attempts per call
    for seconds in tool_error_both_ways(faulty, "fetch_finance_news", news()):
        assert_within(seconds, DEADLINE_S)
    tool_ok(faulty, "fetch_finance_news", news())


def test_tavily_slow_past_its_deadline(faulty: Mesh, tavily: FakeTavilyServer) -> None:
    tool_ok(faulty, "fetch_finance_news", news())
    tavily.hang_next(2)  # a timeout is not retried
    for seconds in tool_error_both_ways(faulty, "fetch_finance_news", news()):
        assert seconds >= 0.5  # Tavily's timeout, shortened
        assert_within(seconds, 0.5)
    tool_ok(faulty, "fetch_finance_news", news())


def test_tavily_breaker_opens_and_closes(faulty: Mesh, tavily: FakeTavilyServer) -> None:
    tool_ok(faulty, "fetch_finance_news", news())
    tavily.fail_next(2 * BREAKER_FAILURES, status=503)
    for i in range(BREAKER_FAILURES):
        j = call_json(faulty, EXECUTE, execute_body("fetch_finance_news", news()))
        assert j.body["error"]["code"] == "UPSTREAM_UNAVAILABLE", (i, j.body)
    seen = len(tavily.requests)
    tool_error_both_ways(faulty, "fetch_finance_news", news())
    assert len(tavily.requests) == seen  # open: Tavily is not called
    wait_tool_ok(faulty, "fetch_finance_news", news)
    tool_ok(faulty, "fetch_finance_news", news(), grpc_call=True)
    assert len(tavily.requests) == seen + 2


# --- the vector store (Qdrant server backend) --------------------------------------------------


class SilentServer:
    """Accepts TCP connections and never answers: a hung Qdrant as its clients see it."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.1)
        self.port = int(self._sock.getsockname()[1])
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            self._held.append(conn)

    def __enter__(self) -> SilentServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for conn in self._held:
            conn.close()
        self._sock.close()


INDEX_TIMEOUT_S = 0.5
STORE_BREAKER_FAILURES = 3


@pytest.fixture(scope="module")
def hanging_store_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    """Retrieval on the Qdrant server backend, the server hung. (Down, i.e. refusing
    connections: tests/e2e/test_retrieval_e2e.py.) No fault injection."""
    root: Path = tmp_path_factory.mktemp("hung-store")
    with SilentServer() as qdrant:
        env = {
            **NO_DRAIN,
            "RETR_INDEX_BACKEND": "qdrant",
            "QDRANT_URL": f"http://127.0.0.1:{qdrant.port}",
            "RETR_INDEX_TIMEOUT_S": str(INDEX_TIMEOUT_S),
            **settings_overrides(
                engine={"retries": 0},
                index={"breaker": {"failures": STORE_BREAKER_FAILURES, "reset_s": BREAKER_RESET_S}},
            ),
        }
        m = Mesh(Ports.free(), root / "data", root / "run", env=env)
        m.start()
        try:
            yield m
        finally:
            m.stop()


def store_fails_both_ways(mesh: Mesh) -> tuple[list[float], list[str]]:
    body = {"query": "LDAP", "tenant_id": TENANT}
    j = call_json(mesh, SEARCH, body)
    info = assert_error(j.response, 502, "backend_unavailable", domain="visior.retrieval")
    assert info["metadata"]["backend"] == "qdrant"
    g = call_grpc(mesh, SEARCH, body)
    assert_grpc_error(g, grpc.StatusCode.UNAVAILABLE, "backend_unavailable")
    return [j.seconds, g.seconds], [j.body["message"], g.message]


def test_vector_store_slow_past_its_deadline_then_breaker_opens(
    hanging_store_mesh: Mesh,
) -> None:
    m = hanging_store_mesh
    messages: list[str] = []
    for _ in range((STORE_BREAKER_FAILURES + 1) // 2):
        times, texts = store_fails_both_ways(m)
        messages += texts
        for seconds in times:
            assert_within(seconds, INDEX_TIMEOUT_S)
    # Each of the first STORE_BREAKER_FAILURES calls waited for the store; then it is open.
    assert not any("circuit open" in t for t in messages[:STORE_BREAKER_FAILURES]), messages
    _, texts = store_fails_both_ways(m)
    assert all("circuit open" in t for t in texts), texts
    # After the reset one trial call goes to the store (still hung: open again at once).
    time.sleep(BREAKER_RESET_S)
    _, texts = store_fails_both_ways(m)
    assert "circuit open" not in texts[0] and "circuit open" in texts[1], texts
    # Ingestion refuses cleanly too (the index write fails before the store commits).
    r = call_json(m, INGEST, ingest_body("a.md", "# A\n\nb"))
    assert_error(r.response, 502, "backend_unavailable", domain="visior.retrieval")
    assert_within(r.seconds, INDEX_TIMEOUT_S)


def test_fault_headers_do_nothing_where_fault_injection_is_off(
    hanging_store_mesh: Mesh,
) -> None:
    # Any Mesh without fault_injection (the default; `visior run` too) renders no fault
    # filter, so a caller cannot abort or delay requests by header.
    r = httpx.get(
        f"{hanging_store_mesh.json_url('orchestrator')}/internal/orchestrator/config",
        headers={"x-envoy-fault-abort-request": "503", "x-envoy-fault-delay-request": "5000"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.elapsed.total_seconds() < 5
    committed = (REPO_ROOT / "envoy" / "envoy.yaml").read_text()
    deployed = [(REPO_ROOT / "deploy" / "envoy" / f"{s.key}.yaml").read_text() for s in SERVICES]
    for text in (committed, *deployed):
        assert "envoy.filters.http.fault" not in text
        assert "max_stream_duration" not in text
