"""The `visior` CLI (`python -m services.cli`) against the shared mesh, as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from services.common.topology import free_ports
from services.devtools.envoy import REPO_ROOT
from services.devtools.mesh import Mesh
from services.retrieval.listing import MAX_PAGE_SIZE
from tests.e2e.conftest import LDAP_DOC, LDAP_QUESTION, LDAP_SECTION, SAMPLES, TENANT

pytestmark = pytest.mark.e2e


def visior(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        cwd=str(REPO_ROOT),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_ask(mesh: Mesh) -> None:
    done = visior("ask", LDAP_QUESTION, "--url", mesh.json_url("orchestrator"), "--tenant", TENANT)
    assert done.returncode == 0, done.stderr
    answer, _, rest = done.stdout.partition("\nSources:\n")
    assert "LDAP" in answer
    assert rest, done.stdout
    first_source = rest.splitlines()[0]
    assert f"{LDAP_DOC} / {LDAP_SECTION}, pages 2–2" in first_source
    assert "trace_id=" in done.stdout
    assert done.stderr == ""


def test_ask_json(mesh: Mesh) -> None:
    done = visior(
        "ask", LDAP_QUESTION, "--url", mesh.json_url("orchestrator"), "--tenant", TENANT, "--json"
    )
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert body["sources"][0]["section_id"] == LDAP_SECTION
    assert body["tools"][0]["name"] == "read_chunk_window"


def test_ask_other_tenant_sees_nothing_of_demo(mesh: Mesh) -> None:
    url = mesh.json_url("orchestrator")
    done = visior("ask", LDAP_QUESTION, "--url", url, "--tenant", "cli-empty-tenant")
    assert done.returncode == 0, done.stderr
    assert LDAP_DOC not in done.stdout


def test_ingest_and_list(mesh: Mesh, tmp_path: Path) -> None:
    tenant = "cli-ingest"
    doc = tmp_path / "wombats.md"
    doc.write_text("# Wombats\n\n## Diet\n\nWombats eat grasses and roots.\n", encoding="utf-8")
    url = mesh.json_url("retrieval")
    done = visior("ingest", str(doc), "--tenant", tenant, "--url", url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[1/1] wombats.md -> wombats: 1 sections, 1 chunks, 1 pages" in done.stdout
    assert "1 of 1 ingested into tenant 'cli-ingest'" in done.stdout
    again = visior("ingest", str(doc), "--tenant", tenant, "--url", url)
    assert again.returncode == 0 and "(unchanged)" in again.stdout  # same content: no work
    doc.write_text("# Wombats\n\n## Diet\n\nWombats eat grasses, roots and bark.\n", "utf-8")
    changed = visior("ingest", str(doc), "--tenant", tenant, "--url", url)
    assert changed.returncode == 0 and "(replaced)" in changed.stdout
    listed = visior("list", "--tenant", tenant, "--url", url)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == ["wombats\tWombats\t1 pages\t1 chunks"]


def test_ingest_folder_reports_each_file(mesh: Mesh) -> None:
    done = visior(
        "ingest", str(SAMPLES), "--tenant", "cli-samples", "--url", mesh.json_url("retrieval")
    )
    assert done.returncode == 0, done.stdout + done.stderr
    n = len([p for p in SAMPLES.iterdir() if p.is_file()])
    for i in range(1, n + 1):
        assert f"[{i}/{n}]" in done.stdout
    assert f"{n} of {n} ingested into tenant 'cli-samples'" in done.stdout


def test_ingest_failure_exits_1(mesh: Mesh, tmp_path: Path) -> None:
    bad = tmp_path / "scan.pdf"
    bad.write_bytes(b"%PDF-1.4 not really")
    done = visior("ingest", str(bad), "--tenant", "cli-bad", "--url", mesh.json_url("retrieval"))
    assert done.returncode == 1
    assert "[1/1] scan.pdf failed: HTTP 400 PARSE_ERROR" in done.stdout
    assert "0 of 1 ingested" in done.stdout


def test_list_demo(mesh: Mesh) -> None:
    done = visior("list", "--tenant", TENANT, "--url", mesh.json_url("retrieval"))
    assert done.returncode == 0, done.stderr
    ids = [line.split("\t")[0] for line in done.stdout.splitlines()]
    assert ids == sorted(ids) and LDAP_DOC in ids and len(ids) >= 3
    # A page at a time, every page followed: the same listing.
    paged = visior("list", "--tenant", TENANT, "--url", mesh.json_url("retrieval"),
                   "--page-size", "1")  # fmt: skip
    assert paged.returncode == 0, paged.stderr
    assert paged.stdout == done.stdout
    # One past the listing's limit is the CLI's usage error, before any request.
    bad = visior("list", "--tenant", TENANT, "--url", mesh.json_url("retrieval"),
                 "--page-size", str(MAX_PAGE_SIZE + 1))  # fmt: skip
    assert bad.returncode == 2 and f"from 1 to {MAX_PAGE_SIZE}" in bad.stderr


def test_ask_server_error_exits_1(mesh: Mesh) -> None:
    done = visior("ask", "", "--url", mesh.json_url("orchestrator"), "--tenant", TENANT)
    assert done.returncode == 1
    assert done.stderr.startswith("error: HTTP 400 INVALID_ARGUMENT")
    assert done.stdout == ""


def test_ask_dead_port_exits_1() -> None:
    (port,) = free_ports(1)
    done = visior("ask", "hello", "--url", f"http://127.0.0.1:{port}", "--timeout", "5")
    assert done.returncode == 1
    assert "error: cannot reach the orchestrator at" in done.stderr
    assert f"127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_list_dead_port_exits_1() -> None:
    (port,) = free_ports(1)
    done = visior("list", "--tenant", TENANT, "--url", f"http://127.0.0.1:{port}")
    assert done.returncode == 1
    assert "error: cannot reach retrieval at" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_knowledge_base_csv_ingested_again_drops_what_it_no_longer_holds(
    mesh: Mesh, tmp_path: Path
) -> None:
    url = mesh.json_url("retrieval")
    header = "id,title,content,topic,jurisdiction,updated_at\n"
    row = "{0},Capybara rule {0},Capybara rule {0} governs numbat filings.,misc,RU,2026-01-10\n"
    csv = tmp_path / "e2e-capybara.csv"
    csv.write_text(header + "".join(row.format(i) for i in ("cap1", "cap2")), encoding="utf-8")
    first = visior("ingest", str(csv), "--knowledge-base", "--url", url)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "-> 2 documents" in first.stdout and "removed" not in first.stdout
    csv.write_text(header + row.format("cap1"), encoding="utf-8")
    second = visior("ingest", str(csv), "--knowledge-base", "--url", url)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "1 articles no longer in it removed" in second.stdout
    hits = httpx.post(
        f"{url}/internal/retrieval/search",
        json={"query": "capybara rule numbat filings", "tenant_id": TENANT,
              "filters": {"source": "knowledge_base"}},
        timeout=30,
    ).json()["hits"]  # fmt: skip
    # Other tests may have put the sample knowledge base in the shared mesh: look at this CSV's.
    assert {h["doc_id"] for h in hits if h["doc_id"].startswith("kb-cap")} == {"kb-cap1"}
    csv.write_text(header, encoding="utf-8")  # a CSV with no rows is refused, not a wipe
    empty = visior("ingest", str(csv), "--knowledge-base", "--url", url)
    assert empty.returncode == 1 and "INVALID_ARGUMENT" in empty.stdout
