"""Respond through the mesh with a real model runtime protocol: a local OpenAI-compatible
server (tests/fakes/openai_chat.py) plays the model; everything else is the real mesh."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from google.protobuf import json_format
from visior.llm.v1 import llm_pb2, llm_pb2_grpc

from services.devtools.mesh import Mesh, Ports
from tests.e2e.conftest import REPO_ROOT, assert_error, ingest
from tests.fakes.openai_chat import ChatRequest, FakeChatServer, Reply, text, tool_call

pytestmark = pytest.mark.e2e

GUIDE = REPO_ROOT / "samples" / "docs" / "orion-x-admin-guide.md"


K8S_ANSWER = "Для Kubernetes используйте Helm-чарт orion-x-ldap."
"""What the model says of Kubernetes, which the guide never mentions."""


def _answer(messages: list[dict]) -> Reply:
    asked = " ".join(str(m.get("content") or "") for m in messages if m.get("role") == "user")
    if "Kubernetes" in asked:
        return text(K8S_ANSWER)
    return text("LDAP настраивается в разделе «Настройки» → «Аутентификация» → «LDAP» [стр. 2].")


def model(request: ChatRequest) -> Reply:
    """Call read_chunk_window on the first listed anchor, then answer from what came back
    (with no tools offered: answer at once)."""
    messages = request.messages
    if not request.json.get("tools"):
        return _answer(messages)
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
    return _answer(messages)


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


def test_a_model_answer_naming_what_nothing_read_mentions_is_withheld(
    mesh_with_model: Mesh,
) -> None:
    r = httpx.post(
        f"{mesh_with_model.json_url('orchestrator')}/internal/orchestrator/respond",
        json={"query": "Как настроить LDAP в Kubernetes?",
              "user": {"user_id": "u", "tenant_id": "acme"}},
        timeout=60,
    )  # fmt: skip
    assert r.status_code == 200, r.text
    answer = r.json()["answer"]
    assert answer.startswith("В документах нет ответа на этот вопрос: «kubernetes»"), answer
    assert "Helm" not in answer and "> " in answer  # the closest passages read, quoted


def test_a_withheld_answer_over_the_json_and_grpc_streams(mesh_with_model: Mesh) -> None:
    chunk = {"doc_id": "orion-x-admin-guide", "section_id": "s004", "page_start": 2,
             "page_end": 2, "text": "LDAP настраивается в разделе «Настройки»."}  # fmt: skip
    body = {"mode": "rag", "messages": [{"role": "user", "content": "LDAP в Kubernetes?"}],
            "context_chunks": [chunk], "user": {"user_id": "u", "tenant_id": "acme"}}  # fmt: skip
    r = httpx.post(
        f"{mesh_with_model.json_url('llm')}/internal/llm/generate", json=body, timeout=60
    )
    assert r.status_code == 200, r.text
    assert r.json()["meta"]["withheld_for"] == ["kubernetes"]
    request = json_format.ParseDict(body, llm_pb2.GenerateRequest())
    address = f"127.0.0.1:{mesh_with_model.ports.grpc['llm']}"
    with grpc.insecure_channel(address) as channel:
        stream = llm_pb2_grpc.LlmServiceStub(channel).GenerateStream(
            llm_pb2.GenerateStreamRequest(request=request), timeout=60
        )
        events = list(stream)
    final = events[-1].final
    deltas = "".join(e.delta for e in events[:-1])
    assert list(final.meta.withheld_for) == ["kubernetes"]
    assert deltas == final.answer and "Helm" not in deltas


def test_a_stream_that_fails_after_it_began_ends_with_the_error_over_json_and_grpc(
    mesh_with_model: Mesh, runtime
) -> None:
    """Over JSON the array has begun with HTTP 200 when the runtime drops the stream: its
    last element is the error (code, message, ErrorInfo); a gRPC caller gets the same error
    as the last event and as the call's status."""
    long = "LDAP настраивается в разделе «Настройки» → «Аутентификация». " * 8
    body = {"messages": [{"role": "user", "content": "LDAP?"}],
            "user": {"user_id": "u", "tenant_id": "acme"}}  # fmt: skip
    runtime.script(Reply(content=long, chunk_chars=6))
    runtime.cut_stream(after_chunks=4)
    r = httpx.post(
        f"{mesh_with_model.json_url('llm')}/internal/llm/generate:stream", json=body, timeout=60
    )
    assert r.status_code == 200, r.text
    events = r.json()
    assert all("delta" in e for e in events[:-1]) and len(events) > 1
    error = events[-1]["error"]
    assert error["code"] == grpc.StatusCode.UNAVAILABLE.value[0]
    assert error["details"][0]["reason"] == "LLM_RUNTIME_ERROR"
    assert not any("final" in e for e in events)

    runtime.script(Reply(content=long, chunk_chars=6))
    runtime.cut_stream(after_chunks=4)
    request = json_format.ParseDict(body, llm_pb2.GenerateRequest())
    received = []
    address = f"127.0.0.1:{mesh_with_model.ports.grpc['llm']}"
    with grpc.insecure_channel(address) as channel:
        stream = llm_pb2_grpc.LlmServiceStub(channel).GenerateStream(
            llm_pb2.GenerateStreamRequest(request=request), timeout=60
        )
        with pytest.raises(grpc.RpcError) as info:
            for event in stream:
                received.append(event)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert received[0].WhichOneof("event") == "delta"
    assert received[-1].WhichOneof("event") == "error"
    assert received[-1].error.message == info.value.details()


def test_a_stream_that_fails_before_it_began_is_an_http_error(mesh_with_model: Mesh, runtime):
    runtime.fail(503, times=2)  # the first try and its one retry: no event was sent
    body = {"messages": [{"role": "user", "content": "LDAP?"}],
            "user": {"user_id": "u", "tenant_id": "acme"}}  # fmt: skip
    r = httpx.post(
        f"{mesh_with_model.json_url('llm')}/internal/llm/generate:stream", json=body, timeout=60
    )
    assert_error(r, 502, "LLM_RUNTIME_ERROR")
