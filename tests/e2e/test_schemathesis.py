"""schemathesis against the real Envoy: every JSON route of openapi/visior.openapi.yaml.

Each operation gets MAX_EXAMPLES generated cases, drawn from valid (positive) and invalid
(negative) data, plus schemathesis's coverage cases (values at and past every limit the
description states, unexpected methods). Each case goes to the sidecar of the service that
owns the route (`x-visior-listeners`; /health to all four). Checks: no 5xx (on a healthy
mesh even the documented 502 means a bug), the response matches the described schema,
its status code and content type are described. Afterwards (the teardown of `fuzzed_mesh`)
every operation fuzzed made calls, every server is alive, the shared mesh's documents are
intact and the orchestrator's runtime config is as before.

Cases that found bugs are kept below as regression tests.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import httpx
import hypothesis
import pytest
import schemathesis
import yaml
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from services.common.topology import SERVICES
from services.devtools.envoy import REPO_ROOT
from services.devtools.mesh import Mesh
from tests.e2e.conftest import LDAP_DOC, LDAP_QUESTION, SAMPLES, TENANT, assert_error

pytestmark = pytest.mark.e2e

OPENAPI = REPO_ROOT / "openapi" / "visior.openapi.yaml"
MAX_EXAMPLES = 1000
"""Generated cases per operation (positive and negative together), the issue's minimum."""
CHECKS = [
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
    content_type_conformance,
]
TIMEOUT_S = 60.0
HYPOTHESIS_MAX_LENGTH = 8192
"""Hypothesis cannot build strings longer than this (its buffer size)."""
TOOL_NAMES = (
    "doc_local_search",
    "fetch_cbr_data",
    "fetch_finance_news",
    "load_documents_full",
    "read_chunk_window",
    "read_doc_metadata",
    "read_doc_pages",
    "read_doc_section",
    "search_general_kb",
    "search_user_documents",
)
"""The proxy's tools (checked against GET /internal/mcp/tools below)."""
CONFIG_PATH = "/internal/orchestrator/config"


def fuzz_schema() -> dict[str, Any]:
    """The committed description, adjusted for generation (not for what it promises).

    - String limits past HYPOTHESIS_MAX_LENGTH are dropped: Hypothesis cannot build the
      negative case (ChatMessage.content's 32,768 characters is tested at and past the
      limit in tests/unit/test_properties_validators.py).
    - Request messages are closed (additionalProperties: false): Envoy drops unknown
      fields, so random extra ones only cost generation time in positive cases; negative
      cases then add unknown fields on purpose.
    - Execute's tool_name is a real tool half the time, so random arguments reach the tools.
    """
    doc = yaml.safe_load(OPENAPI.read_text())

    def strip(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("maxLength", 0) > HYPOTHESIS_MAX_LENGTH:
                del node["maxLength"]
            for value in node.values():
                strip(value)
        elif isinstance(node, list):
            for value in node:
                strip(value)

    schemas = doc["components"]["schemas"]
    strip(schemas)
    for component in schemas.values():
        if "propertyNames" in component:  # a request message
            component["additionalProperties"] = False
    props = schemas["visior.toolsproxy.v1.ExecuteRequest"]["properties"]
    props["tool_name"] = {"anyOf": [{"enum": list(TOOL_NAMES)}, props["tool_name"]]}
    return doc


schema = schemathesis.openapi.from_dict(fuzz_schema())
schema.config.generation.update(
    modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE],
    max_examples=MAX_EXAMPLES,
)

STATS: dict[str, dict[str, Any]] = {}
"""Per operation: calls, seconds, status codes by generation mode (printed with -s)."""
FUZZED: set[str] = set()
"""The operations test_api was set up for under the current `fuzzed_mesh`."""


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    # One client: creating one per request (httpx.post) costs ~25 ms of SSL set-up.
    with httpx.Client(timeout=TIMEOUT_S) as c:
        yield c


@pytest.fixture(scope="module")
def config_before(mesh: Mesh, client: httpx.Client) -> dict[str, Any]:
    r = client.get(f"{mesh.json_url('orchestrator')}{CONFIG_PATH}")
    assert r.status_code == 200, r.text
    return dict(r.json())


@pytest.fixture(scope="module")
def fuzzed_mesh(mesh: Mesh, config_before: dict[str, Any], client: httpx.Client) -> Iterator[Mesh]:
    """The mesh test_api fuzzes. At teardown, once this process has run its share of test_api
    (all of it, or what -k, --lf or an xdist worker gave it): every operation fuzzed made
    calls, then the mesh survived them. Checked here, not in a test of its own, so it runs
    after the fuzzing whatever the order or selection, and never without fuzzing."""
    STATS.clear()
    FUZZED.clear()
    yield mesh
    for label, st in STATS.items():
        print(f"{label}: {st['calls']} calls in {st['seconds']:.1f} s, {st['codes']}")
    idle = sorted(label for label in FUZZED if STATS.get(label, {}).get("calls", 0) == 0)
    assert FUZZED and not idle, f"operations set up for fuzzing that made no call: {idle}"
    assert_the_mesh_survived(mesh, config_before, client)


@pytest.fixture
def operation_mesh(request: pytest.FixtureRequest, fuzzed_mesh: Mesh) -> Mesh:
    """`fuzzed_mesh`, with this item's operation noted as fuzzed before any case runs."""
    FUZZED.add(request.node.operation_label)
    return fuzzed_mesh


def assert_the_mesh_survived(
    mesh: Mesh, config_before: dict[str, Any], client: httpx.Client
) -> None:
    """Servers alive and healthy, the shared documents and the orchestrator's config intact."""
    assert mesh.alive() == {**{s.key: True for s in SERVICES}, "envoy": True}
    for s in SERVICES:
        r = client.get(f"{mesh.json_url(s.key)}/health")
        assert r.status_code == 200 and r.json()["status"] == "ok", (s.key, r.text)
    r = client.get(f"{mesh.json_url('orchestrator')}{CONFIG_PATH}")
    assert r.status_code == 200 and r.json() == config_before, r.text
    r = client.get(
        f"{mesh.json_url('retrieval')}/internal/retrieval/documents", params={"tenant_id": TENANT}
    )
    assert r.status_code == 200, r.text
    assert len(r.json()["documents"]) == len(list(SAMPLES.glob("*.md"))), r.text
    r = client.post(
        f"{mesh.json_url('retrieval')}/internal/retrieval/search",
        json={"query": LDAP_QUESTION, "tenant_id": TENANT},
    )
    assert r.status_code == 200 and r.json()["hits"][0]["doc_id"] == LDAP_DOC, r.text


def _record(case: schemathesis.Case, status: int, started: float) -> None:
    st = STATS.setdefault(case.operation.label, {"calls": 0, "codes": {}, "first": started})
    st["calls"] += 1
    st["seconds"] = time.perf_counter() - st["first"]
    mode = case.meta.generation.mode.value if case.meta else "explicit"
    key = f"{mode}:{status}"
    st["codes"][key] = st["codes"].get(key, 0) + 1


@schema.parametrize()
@hypothesis.settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=list(hypothesis.HealthCheck),
    database=None,
)
def test_api(
    case: schemathesis.Case,
    operation_mesh: Mesh,
    config_before: dict[str, Any],
    client: httpx.Client,
) -> None:
    for key in case.operation.definition.raw["x-visior-listeners"]:
        started = time.perf_counter()
        response = case.call(base_url=operation_mesh.json_url(key), timeout=TIMEOUT_S)
        _record(case, response.status_code, started)
        try:
            case.validate_response(response, checks=CHECKS)
        finally:
            if case.operation.method.upper() == "POST" and case.operation.path == CONFIG_PATH:
                # The mesh is shared: a fuzzed config (prompt budget 1, mock mode, ...)
                # would turn every later Respond into a 400 and leak into other tests.
                url = f"{operation_mesh.json_url('orchestrator')}{CONFIG_PATH}"
                r = client.post(url, json=config_before)
                assert r.status_code == 200, r.text


def test_the_fuzzed_tool_names_are_the_proxys(mesh: Mesh) -> None:
    r = httpx.get(f"{mesh.json_url('toolsproxy')}/internal/mcp/tools", timeout=TIMEOUT_S)
    assert tuple(sorted(t["name"] for t in r.json()["tools"])) == TOOL_NAMES


# --- regressions ------------------------------------------------------------------------------

USER = {"user_id": "u1", "tenant_id": TENANT}
DOC = base64.b64encode(b"# Notes\n\nHello.").decode()
TRACED_BODIES = [
    ("orchestrator", "/internal/orchestrator/respond", {"query": "LDAP?", "user": USER}),
    ("retrieval", "/internal/retrieval/search", {"query": "LDAP", "tenant_id": TENANT}),
    (
        "toolsproxy",
        "/internal/mcp/execute",
        {"tool_name": "search_user_documents", "arguments": {"query": "LDAP"}, "user": USER},
    ),
    (
        "llm",
        "/internal/llm/generate",
        {
            "messages": [{"role": "user", "content": "LDAP?"}],
            "user": USER,
            "tool_policy": {"allowed_tools": ["search_user_documents"]},
        },
    ),
    (
        "retrieval",
        "/internal/retrieval/documents",
        {"tenant_id": "fuzz-regression", "doc_id": "notes", "content": DOC},
    ),
]


@pytest.mark.parametrize(("key", "path", "body"), TRACED_BODIES, ids=[b[1] for b in TRACED_BODIES])
def test_a_trace_id_with_a_trailing_newline_is_refused(
    mesh: Mesh, key: str, path: str, body: dict[str, Any]
) -> None:
    # Was a 500 on Respond and Execute: `^…$` with re.match let "abc\n" through as valid,
    # and gRPC then refused it as outgoing metadata to the next hop.
    url = f"{mesh.json_url(key)}{path}"
    r = httpx.post(url, json={**body, "trace_id": "abc\n"}, timeout=TIMEOUT_S)
    info = assert_error(r, 400, "INVALID_ARGUMENT")
    assert info["metadata"]["field"] == "trace_id"
    r = httpx.post(url, json={**body, "trace_id": "abc"}, timeout=TIMEOUT_S)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("field", ["tenant_id", "doc_id"])
def test_ingestion_refuses_ids_with_a_trailing_newline(mesh: Mesh, field: str) -> None:
    # Was accepted: a document stored as "notes\n" or under the tenant "fuzz-regression\n".
    body = {"tenant_id": "fuzz-regression", "doc_id": "notes", "content": DOC}
    url = f"{mesh.json_url('retrieval')}/internal/retrieval/documents"
    r = httpx.post(url, json={**body, field: body[field] + "\n"}, timeout=TIMEOUT_S)
    info = assert_error(r, 400, "INVALID_ARGUMENT")
    assert info["metadata"]["field"] == field
