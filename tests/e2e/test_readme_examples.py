"""The calls the README and the docs show, run as written against the real mesh.

A mesh is started as `make run` starts it (samples/docs in tenant demo, the sample knowledge
base, the demo bank). Every command of the README's "Calling it" section and of
docs/operations.md's "More calls" runs through bash with the venv's bin on PATH (as after
`source .venv/bin/activate`), and so does its MCP example (the mesh serves MCP with the
token the page names); the typed-client examples (the README's, docs/client.md's) run
as Python scripts. Only the ports change: the default ports the pages name (gRPC
50051-50054, JSON 8081-8084) become this mesh's free ones. curl runs with
`--fail-with-body`, so an HTTP error fails the script; grpcurl fails on its own.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.cli.main import ingest_samples
from services.common.topology import SERVICES, Ports, free_ports
from services.devtools.envoy import REPO_ROOT
from services.devtools.mesh import Mesh
from services.toolsproxy.mcp_server import DEFAULT_MCP_PORT

pytestmark = pytest.mark.e2e

README = REPO_ROOT / "README.md"
OPERATIONS = REPO_ROOT / "docs" / "operations.md"
CLIENT = REPO_ROOT / "docs" / "client.md"
KB_CSV = REPO_ROOT / "samples" / "knowledge_base" / "train_data.csv"
VENV_BIN = Path(sys.executable).parent
DEFAULT = Ports()
FAIL_FAST = """set -euo pipefail
curl() { command curl --fail-with-body --show-error "$@"; echo; }
"""
"""Every command must succeed; curl's output gets a newline so each answer is one line."""


def section(page: Path, title: str) -> str:
    """The page's section under the `## title` heading, up to the next `## `."""
    text = page.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.DOTALL)


MCP_PORT = free_ports(1)[0]
MCP_ENV = {
    "MCP_PROXY_MCP_ENABLED": "true",
    "MCP_PROXY_MCP_TOKEN": "secret",
    "MCP_PROXY_MCP_PORT": str(MCP_PORT),
}
"""MCP on, with the token docs/operations.md's example sends."""


def on_ports(text: str, ports: Ports) -> str:
    """The pages' default ports replaced by `ports`' (service by service) and MCP_PORT."""
    text = re.sub(rf"\b{DEFAULT_MCP_PORT}\b", str(MCP_PORT), text)
    for s in SERVICES:
        for default, port in (
            (DEFAULT.grpc[s.key], ports.grpc[s.key]),
            (DEFAULT.http[s.key], ports.http[s.key]),
        ):
            text = re.sub(rf"\b{default}\b", str(port), text)
    return text


CALLING = section(README, "Calling it")
MORE_CALLS = section(OPERATIONS, "More calls")
RUNNING = section(OPERATIONS, "Running it")
CLIENT_PAGE = CLIENT.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def run_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    root = tmp_path_factory.mktemp("readme")
    mesh = Mesh(Ports.free(), root / "data", root / "run", env=MCP_ENV, bank_standin=True)
    mesh.start()
    try:
        assert ingest_samples(mesh.json_url("retrieval"), 600) == 0
        yield mesh
    finally:
        mesh.stop()


def run(script: str, *args: str, mesh: Mesh) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(
        [*args, on_ports(script, mesh.ports)],
        capture_output=True, text=True, timeout=600, env=env, cwd=REPO_ROOT,
    )  # fmt: skip


def test_the_section_has_the_calls_it_should() -> None:
    bash, python = blocks(CALLING, "bash"), blocks(CALLING, "python")
    assert len(bash) == 2 and len(python) == 1
    assert bash[0].count("curl ") >= 10 and bash[1].count("grpcurl ") >= 4
    more = blocks(MORE_CALLS, "bash")
    assert len(more) == 1 and more[0].count("curl ") >= 6 and more[0].count("grpcurl ") >= 5
    assert len(blocks(CLIENT_PAGE, "python")) == 1
    assert sum("localhost:8090/mcp" in b for b in blocks(RUNNING, "bash")) == 1


def test_the_default_ports_are_the_ones_the_readme_names() -> None:
    readme = README.read_text(encoding="utf-8")
    for s in SERVICES:
        assert f"127.0.0.1:{DEFAULT.grpc[s.key]}" in readme
        assert f"http://127.0.0.1:{DEFAULT.http[s.key]}" in readme


def test_every_curl_call_succeeds_as_written(run_mesh: Mesh) -> None:
    out = run(FAIL_FAST + blocks(CALLING, "bash")[0], "bash", "-c", mesh=run_mesh)
    assert out.returncode == 0, out.stdout + out.stderr
    answers = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    respond = [a for a in answers if "answer" in a and "sources" in a]
    assert len(respond) == 3
    ldap, s3, rate = respond
    assert "orion-x-admin-guide" in {s["doc_id"] for s in ldap["sources"]}, ldap
    assert {s["doc_id"] for s in s3["sources"]} == {"orion-x-operations-manual"}, s3
    assert "USD" in rate["answer"] or "доллар" in rate["answer"].lower(), rate
    searches = [a for a in answers if "hits" in a]
    assert len(searches) == 2 and all(a["hits"] for a in searches), searches
    # The knowledge base's doc ids are its rows' ids with the kb- prefix (docstore/kb_csv.py).
    kb = {f"kb-{row['id']}" for row in csv.DictReader(KB_CSV.open(encoding="utf-8"))}
    assert {h["doc_id"] for h in searches[1]["hits"]} <= kb, searches[1]
    assert "kb-vat-rate-2025" in {h["doc_id"] for h in searches[1]["hits"]}, searches[1]
    health = [a for a in answers if a.get("status") == "ok" and "service" in a]
    assert len(health) == len(SERVICES), answers


def test_every_grpcurl_call_succeeds_as_written(run_mesh: Mesh) -> None:
    out = run(FAIL_FAST + blocks(CALLING, "bash")[1], "bash", "-c", mesh=run_mesh)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "message SearchRequest" in out.stdout
    assert '"hits"' in out.stdout and '"answer"' in out.stdout
    assert '"status": "SERVING"' in out.stdout


def test_the_typed_client_example_runs_as_written(run_mesh: Mesh) -> None:
    out = run(blocks(CALLING, "python")[0], sys.executable, "-c", mesh=run_mesh)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "orion-x-admin-guide" in out.stdout, out.stdout


def test_the_more_calls_of_the_operations_page_succeed_as_written(run_mesh: Mesh) -> None:
    out = run(FAIL_FAST + blocks(MORE_CALLS, "bash")[0], "bash", "-c", mesh=run_mesh)
    assert out.returncode == 0, out.stdout + out.stderr
    assert '"default_model"' in out.stdout and '"tools"' in out.stdout
    assert "visior.retrieval.v1.RetrievalService" in out.stdout
    assert '"nextPageToken"' in out.stdout or '"next_page_token"' in out.stdout


def test_the_client_page_example_runs_as_written(run_mesh: Mesh) -> None:
    out = run(blocks(CLIENT_PAGE, "python")[0], sys.executable, "-c", mesh=run_mesh)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "vacation-policy" in out.stdout, out.stdout
    assert "INVALID_ARGUMENT LIMIT_EXCEEDED {'field': 'max_results', 'limit': '50'}" in out.stdout


def test_the_mcp_example_of_the_operations_page_succeeds_as_written(run_mesh: Mesh) -> None:
    (example,) = [b for b in blocks(RUNNING, "bash") if "/mcp" in b]
    out = run(FAIL_FAST + example, "bash", "-c", mesh=run_mesh)
    assert out.returncode == 0, out.stdout + out.stderr
    listed = json.loads(out.stdout)
    assert "read_chunk_window" in {t["name"] for t in listed["result"]["tools"]}, listed
