"""The real mesh for end-to-end tests: four server processes and the real Envoy binary.

`mesh` is one mesh for the whole session, with samples/docs ingested into tenant "demo"
through the JSON route, plus one private document of another tenant for the
cross-tenant checks. Tests that stop a server use `make_mesh` for their own.
When a test using a mesh fails, the tails of its service and Envoy logs are attached
to the report.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.common.topology import SERVICES, Ports, free_ports
from services.devtools.envoy import REPO_ROOT
from services.devtools.mesh import Mesh

SAMPLES = REPO_ROOT / "samples" / "docs"
TENANT = "demo"
OTHER_TENANT = "other-tenant"
SECRET_DOC = "secret-plan"
# The code has letters no hex id has: a trace_id (32 hex digits) can never contain it, so the
# leak checks cannot fire on one by chance (one did, with the code "7391").
SECRET_TEXT = "# Secret plan\n\nThe launch code of project Zephyr is QZ7391.\n"
LDAP_QUESTION = "Как настроить LDAP интеграцию?"
LDAP_DOC = "orion-x-admin-guide"
LDAP_SECTION = "orion-x-admin-guide:s004-настройка-ldap-интеграции"
LDAP_ANCHOR = "orion-x-admin-guide:c00002"
SERVICE_KEYS = tuple(s.key for s in SERVICES)
NO_DRAIN = {s.env_prefix + "DRAIN_SECONDS": "0" for s in SERVICES}
"""Every service stops without a drain period (meshes that exist to have servers stopped)."""
GRPC_SERVICE = {
    "orchestrator": "visior.orchestrator.v1.OrchestratorService",
    "llm": "visior.llm.v1.LlmService",
    "retrieval": "visior.retrieval.v1.RetrievalService",
    "toolsproxy": "visior.toolsproxy.v1.ToolsProxyService",
}


def ingest_body(tenant: str, file_name: str, content: bytes, **extra: Any) -> dict[str, Any]:
    """The JSON body of POST /internal/retrieval/documents (bytes are base64 in JSON)."""
    return {
        "tenant_id": tenant,
        "file_name": file_name,
        "content": base64.b64encode(content).decode(),
        **extra,
    }


def ingest(mesh: Mesh, tenant: str, file_name: str, content: bytes, **extra: Any) -> dict:
    r = httpx.post(
        f"{mesh.json_url('retrieval')}/internal/retrieval/documents",
        json=ingest_body(tenant, file_name, content, **extra),
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return r.json()


def assert_error(
    response: httpx.Response, status: int, reason: str, *, domain: str | None = None
) -> dict[str, Any]:
    """Assert the documented error body: HTTP status, google.rpc.Status, one ErrorInfo."""
    assert response.status_code == status, f"{response.status_code}: {response.text}"
    body = response.json()
    assert isinstance(body.get("code"), int) and body["code"] != 0, body
    assert isinstance(body.get("message"), str), body
    assert len(body["details"]) == 1, body
    info = body["details"][0]
    assert info["@type"] == "type.googleapis.com/google.rpc.ErrorInfo", body
    assert info["reason"] == reason, body
    if domain is not None:
        assert info["domain"] == domain, body
    return info


def log_lines(mesh: Mesh, key: str) -> list[dict[str, Any]]:
    """The JSON lines of one service's log (non-JSON lines skipped)."""
    path = mesh.log_path(key)
    out = []
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Poll `predicate` until it holds or `timeout` passes; returns its last value."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return predicate()
        time.sleep(0.05)
    return True


def _log_report(mesh: Mesh) -> str:
    parts = []
    for key in SERVICE_KEYS:
        parts.append(f"--- {key} ({mesh.log_path(key)}) ---\n{mesh.log_tail(key, 25)}")
    parts.append(f"--- envoy ---\n{mesh.envoy.log_tail(25)}")
    return "\n".join(parts)


def _start(root: Path, env: dict[str, str] | None = None, *, bank: bool = False) -> Mesh:
    mesh = Mesh(Ports.free(), root / "data", root / "run", env=env, bank_standin=bank)
    mesh.start()
    return mesh


MCP_PORT = free_ports(1)[0]
"""The shared mesh's tools proxy also serves MCP here (MCP_PROXY_MCP_*)."""
MCP_TOKEN = "e2e-gateway-token"


@pytest.fixture(scope="session")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    """The shared mesh: samples/docs in tenant demo, one secret document in another tenant."""
    mcp = {
        "MCP_PROXY_MCP_ENABLED": "true",
        "MCP_PROXY_MCP_PORT": str(MCP_PORT),
        "MCP_PROXY_MCP_TOKEN": MCP_TOKEN,
    }
    m = _start(tmp_path_factory.mktemp("mesh"), mcp, bank=True)
    try:
        docs = sorted(SAMPLES.glob("*.md"))
        assert docs, f"no sample documents in {SAMPLES}"
        for path in docs:
            ingest(m, TENANT, path.name, path.read_bytes())
        ingest(m, OTHER_TENANT, "secret.md", SECRET_TEXT.encode(), doc_id=SECRET_DOC)
    except BaseException:
        print(_log_report(m))
        m.stop()
        raise
    yield m
    m.stop()


class MeshFactory:
    """Starts private meshes (for tests that stop servers); `stop_all()` stops them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.meshes: list[Mesh] = []

    def __call__(self, env: dict[str, str] | None = None, *, bank: bool = False) -> Mesh:
        # These meshes exist to have servers stopped: no drain period before they stop.
        m = _start(
            self.root / f"mesh{len(self.meshes)}",
            {**NO_DRAIN, **(env or {})},
            bank=bank,
        )
        self.meshes.append(m)
        return m

    def stop_all(self) -> None:
        for m in self.meshes:
            m.stop()


@pytest.fixture
def make_mesh(tmp_path: Path) -> Iterator[MeshFactory]:
    """A factory of private meshes, all stopped at teardown."""
    factory = MeshFactory(tmp_path)
    yield factory
    factory.stop_all()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """On failure, attach the log tails of every mesh the test used."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    meshes: list[Mesh] = []
    for value in getattr(item, "funcargs", {}).values():
        if isinstance(value, Mesh):
            meshes.append(value)
        elif isinstance(value, MeshFactory):
            meshes.extend(value.meshes)
    for m in meshes:
        report.sections.append((f"mesh logs ({m.workdir})", _log_report(m)))
