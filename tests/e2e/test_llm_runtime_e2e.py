"""Respond through the mesh with a real model runtime protocol: a local OpenAI-compatible
server (tests/fakes/openai_chat.py) plays the model; everything else is the real mesh."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.devtools.mesh import Mesh, Ports
from tests.e2e.conftest import REPO_ROOT, assert_error, ingest
from tests.fakes.openai_chat import ChatRequest, FakeChatServer, Reply, text, tool_call

pytestmark = pytest.mark.e2e

GUIDE = REPO_ROOT / "samples" / "docs" / "orion-x-admin-guide.md"


def model(request: ChatRequest) -> Reply:
    """Call read_chunk_window on the first listed anchor, then answer from what came back."""
    messages = request.messages
    if str(messages[0].get("content", "")).startswith("You route"):
        # The orchestrator's routing question: answer with the decision JSON.
        return text('{"scenario": "S1", "intent": "documents", "clarifications": [], '
                    '"currency": "", "date": "", "news_query": ""}')  # fmt: skip
    tool_results = [m for m in messages if m.get("role") == "tool"]
    if not tool_results:
        prompt = "\n".join(str(m.get("content") or "") for m in messages)
        chunk = re.search(r"orion-x-admin-guide:c\d{5}", prompt)
        assert chunk, prompt[:2000]
        return tool_call(
            "read_chunk_window",
            {"doc_id": "orion-x-admin-guide", "anchor_chunk_id": chunk.group(0), "radius": 1},
        )
    read = tool_results[-1]["content"]
    assert "LDAP" in read, read[:500]
    return text("LDAP настраивается в разделе «Настройки» → «Аутентификация» → «LDAP» [стр. 2].")


@pytest.fixture(scope="module")
def runtime() -> Iterator[FakeChatServer]:
    with FakeChatServer(api_key="sk-e2e") as server:
        server.respond_with(model)
        yield server


@pytest.fixture(scope="module")
def mesh_with_model(tmp_path_factory: pytest.TempPathFactory, runtime) -> Iterator[Mesh]:
    root: Path = tmp_path_factory.mktemp("model")
    env = {
        "LLM_RUNTIME_URL": runtime.url,
        "LLM_RUNTIME_API_KEY": "sk-e2e",
        "DEFAULT_MODEL_NAME": "fake-model",
    }
    m = Mesh(Ports.free(), root / "data", root / "run", env=env)
    m.start()
    try:
        ingest(m, "acme", GUIDE.name, GUIDE.read_bytes())
        yield m
    finally:
        m.stop()


def test_respond_runs_the_model_tool_loop(mesh_with_model: Mesh, runtime) -> None:
    r = httpx.post(
        f"{mesh_with_model.json_url('orchestrator')}/internal/orchestrator/respond",
        json={"query": "Как настроить LDAP?", "user": {"user_id": "u", "tenant_id": "acme"}},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answer"].startswith("LDAP настраивается")
    assert [t["name"] for t in body["tools"]] == ["read_chunk_window"]
    assert body["sources"][0]["doc_id"] == "orion-x-admin-guide"
    # The runtime saw the real wire format: native tools, the key, the model name.
    first = runtime.chat_requests[-2].json
    assert first["model"] == "fake-model"
    assert {t["function"]["name"] for t in first["tools"]} >= {"read_chunk_window"}
    assert runtime.chat_requests[-1].headers["authorization"] == "Bearer sk-e2e"
    tool_msg = next(m for m in runtime.chat_requests[-1].messages if m["role"] == "tool")
    assert "<<<DOCUMENT" in tool_msg["content"]  # document text arrives delimited as data
    assert json.dumps(body).count("sk-e2e") == 0


def test_runtime_failure_is_502_llm_runtime_error(mesh_with_model: Mesh, runtime) -> None:
    runtime.fail(503, times=2)  # the first try and its one retry
    r = httpx.post(
        f"{mesh_with_model.json_url('llm')}/internal/llm/generate",
        json={"messages": [{"role": "user", "content": "LDAP?"}],
              "user": {"user_id": "u", "tenant_id": "acme"}},
        timeout=60,
    )  # fmt: skip
    assert_error(r, 502, "LLM_RUNTIME_ERROR")
