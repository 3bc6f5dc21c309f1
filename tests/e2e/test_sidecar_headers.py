"""What a JSON caller's headers do to the real servers behind the real Envoy, and the access
log of Envoy's deploy config (access_log=True) in front of them.

The header filter (services/devtools/envoy_config.py, the Lua filter) strips what the
servers' gRPC library would choke on: grpc-* headers, binary (*-bin) metadata and names gRPC
refuses. Reaching a real server, each failed the whole call (a bare INTERNAL, an unsupported
encoding, a deadline already past). tests/integration/test_envoy_sidecar.py checks the same
filter from inside in-test servers (what metadata and deadline they are handed).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.common.topology import Ports
from services.devtools.envoy import REPO_ROOT, EnvoyProcess
from services.devtools.envoy_config import render
from services.devtools.mesh import Mesh
from tests.e2e.conftest import LDAP_DOC, LDAP_QUESTION, TENANT, assert_error, wait_for

pytestmark = pytest.mark.e2e

TIMEOUT_S = 60.0
USER = {"user_id": "e2e-headers", "tenant_id": TENANT}
EXECUTE = "/internal/mcp/execute"
STREAM = "/internal/llm/generate:stream"
TOOLS = "/internal/mcp/tools"
EXECUTE_BODY = {"tool_name": "read_doc_metadata", "arguments": {"doc_id": LDAP_DOC}, "user": USER}
STREAM_BODY = {"mode": "chat", "messages": [{"role": "user", "content": LDAP_QUESTION}]}


def call(url: str, path: str, trace: str, headers: list[tuple[str, str]]) -> httpx.Response:
    """POST Execute (read_doc_metadata) or the LLM stream with `headers` and x-trace-id."""
    body = EXECUTE_BODY if path == EXECUTE else STREAM_BODY
    return httpx.post(
        url + path, json=body, headers=[*headers, ("x-trace-id", trace)], timeout=TIMEOUT_S
    )


def assert_served(r: httpx.Response, path: str, trace: str) -> None:
    """The server answered the call, under the trace id the caller's header gave it: the
    headers around a stripped one still reach the server."""
    assert r.status_code == 200, r.text
    if path == EXECUTE:
        body = r.json()
        assert body["status"] == "ok" and body["result"]["doc_id"] == LDAP_DOC, body
        assert body["trace_id"] == trace, body
    else:
        events = r.json()
        assert "final" in events[-1], events
        assert events[-1]["final"]["meta"]["trace_id"] == trace, events[-1]


def new_trace() -> str:
    return f"e2e-hdr-{uuid.uuid4().hex}"


# --- caller headers -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "path", "header"),
    [
        # Binary metadata must be base64: grpc refused the whole call with a bare INTERNAL.
        ("toolsproxy", EXECUTE, ("x-caller-bin", "!!!")),
        ("toolsproxy", EXECUTE, ("grpc-encoding", "bogus")),
        ("toolsproxy", EXECUTE, ("grpc-timeout", "bogus")),
        ("llm", STREAM, ("grpc-encoding", "bogus")),
        ("llm", STREAM, ("grpc-timeout", "bogus")),
        # Legal in an HTTP header name, not in a gRPC metadata key: grpc refused the whole
        # call with a bare INTERNAL ("Illegal header key").
        ("toolsproxy", EXECUTE, ("X-Foo+Bar", "1")),
        ("toolsproxy", EXECUTE, ("x-a|b", "1")),
        ("toolsproxy", EXECUTE, ("x~y", "1")),
    ],
    ids=[
        "bin",
        "grpc-encoding",
        "grpc-timeout",
        "grpc-encoding-stream",
        "grpc-timeout-stream",
        "plus",
        "pipe",
        "tilde",
    ],
)
def test_callers_grpc_and_binary_headers_stop_at_envoy(
    mesh: Mesh, key: str, path: str, header: tuple[str, str]
) -> None:
    trace = new_trace()
    r = call(mesh.json_url(key), path, trace, [header])
    assert_served(r, path, trace)


@pytest.mark.parametrize(
    ("key", "path"), [("toolsproxy", EXECUTE), ("llm", STREAM)], ids=["unary", "stream"]
)
def test_a_callers_grpc_timeout_never_becomes_the_servers_deadline(
    mesh: Mesh, key: str, path: str
) -> None:
    """A caller's grpc-timeout of one nanosecond, had it reached the server as the deadline,
    would have ended the call (DEADLINE_EXCEEDED) before it started. The unary route's own
    grpc-timeout replaces it; the stream route (no overall budget) has the filter alone.
    What deadline the server is handed is checked from inside in
    tests/integration/test_envoy_sidecar.py (the route's, a real server shows nothing of it)."""
    trace = new_trace()
    r = call(mesh.json_url(key), path, trace, [("grpc-timeout", "1n")])
    assert_served(r, path, trace)


# --- access log -----------------------------------------------------------------------


SLOW_ROUTE_TIMEOUT_S = 0.5
"""The budget of TOOLS in the logged Envoy's config; a request delayed past it is a 504."""


@dataclass
class LoggedEnvoy:
    envoy: EnvoyProcess
    ports: Ports

    def url(self, key: str) -> str:
        return f"http://127.0.0.1:{self.ports.http[key]}"


@pytest.fixture(scope="module")
def logged_envoy(mesh: Mesh, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoggedEnvoy]:
    """A second Envoy in front of the shared mesh's servers, on the config the deploy/
    sidecars get (access_log=True; the shared mesh's own Envoy logs nothing), plus the
    header-driven fault filter for one delay past a route's budget (TOOLS is given
    SLOW_ROUTE_TIMEOUT_S)."""
    ports = replace(Ports.free(), grpc=dict(mesh.ports.grpc))
    config = render(
        ports,
        str(REPO_ROOT / "envoy" / "visior.pb"),
        access_log=True,
        fault_injection=True,
        timeouts={TOOLS: SLOW_ROUTE_TIMEOUT_S},
    )
    # The access log (stdout_path) is written out every 50 ms instead of every 10 s.
    envoy = EnvoyProcess(concurrency=1, extra_args=["--file-flush-interval-msec", "50"])
    envoy.start(config, tmp_path_factory.mktemp("logged-envoy"))
    try:
        envoy.wait_ready()
        yield LoggedEnvoy(envoy, ports)
    finally:
        envoy.stop()


def _logged(path: Path, request_ids: set[str]) -> dict[str, dict[str, Any]]:
    """The access-log entries of `request_ids`, once Envoy has written them all out."""
    entries: dict[str, dict[str, Any]] = {}

    def all_written() -> bool:
        text = path.read_text()
        lines = text[: text.rfind("\n") + 1].splitlines()  # whole lines only
        entries.update((e["request_id"], e) for e in map(json.loads, lines))
        return request_ids <= entries.keys()

    assert wait_for(all_written, timeout=30), f"not logged: {request_ids - entries.keys()}"
    return {r: entries[r] for r in request_ids}


DELAYED = {"x-envoy-fault-delay-request": str(round(4 * SLOW_ROUTE_TIMEOUT_S * 1000))}
LOGGED_CALLS: list[tuple[str, str, str, dict[str, Any] | None, dict[str, str], int, str]] = [
    # (method, service, path, body, headers, status, ErrorInfo.reason)
    ("GET", "toolsproxy", "/health", None, {}, 200, ""),
    ("POST", "toolsproxy", EXECUTE, {**EXECUTE_BODY, "tool_name": ""}, {}, 400, "INVALID_ARGUMENT"),
    ("GET", "toolsproxy", TOOLS, None, DELAYED, 504, "DEADLINE_EXCEEDED"),
    ("GET", "retrieval", "/health?verbose=1", None, {}, 400, "INVALID_ARGUMENT"),  # transcoder
    ("POST", "toolsproxy", "/internal/mcp/nope", {}, {}, 404, "NOT_FOUND"),
]


def test_access_log_has_the_callers_method_and_path(logged_envoy: LoggedEnvoy) -> None:
    """The caller's own verb and route, not the transcoded POST /pkg.Service/Method; no
    grpc_status, which Envoy derived from the HTTP status (a server's INVALID_ARGUMENT was
    logged as 13, a timeout's 504 as 14)."""
    ids = {}
    with httpx.Client(timeout=TIMEOUT_S) as http:
        for method, key, path, body, headers, status, reason in LOGGED_CALLS:
            request_id = f"log-{uuid.uuid4()}"
            r = http.request(
                method,
                logged_envoy.url(key) + path,
                json=body,
                headers={**headers, "x-request-id": request_id},
            )
            if reason:
                assert_error(r, status, reason)
            else:
                assert r.status_code == status, r.text
            ids[request_id] = (method, key, path, status)
    assert logged_envoy.envoy.stdout_path is not None
    entries = _logged(logged_envoy.envoy.stdout_path, set(ids))
    for request_id, (method, key, path, status) in ids.items():
        entry = entries[request_id]
        assert (entry["method"], entry["path"], entry["status"]) == (method, path, status), entry
        assert entry["service"] == key, entry
        assert "grpc_status" not in entry, entry
