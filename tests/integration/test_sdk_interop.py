"""The typed client (betterproto + grpclib) against our real grpcio servers: every RPC of every service."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import betterproto
import pytest
from betterproto.lib.google.protobuf import Struct
from google.protobuf import json_format, struct_pb2
from grpclib.exceptions import GRPCError
from visior_sdk.visior.common.v1 import ChatMessage, UserContext
from visior_sdk.visior.llm.v1 import (
    AnchorChunk,
    GenerateRequest,
    GenerateStreamRequest,
    ToolPolicy,
)
from visior_sdk.visior.llm.v1 import GetHealthRequest as LlmGetHealthRequest
from visior_sdk.visior.orchestrator.v1 import GetConfigRequest, UpdateConfigRequest
from visior_sdk.visior.orchestrator.v1 import GetHealthRequest as OrchGetHealthRequest
from visior_sdk.visior.retrieval.v1 import (
    DeleteDocumentRequest,
    IngestDocumentRequest,
    ListDocumentsRequest,
    SearchFilters,
    SearchRequest,
)
from visior_sdk.visior.retrieval.v1 import GetHealthRequest as RetrievalGetHealthRequest
from visior_sdk.visior.toolsproxy.v1 import ExecuteRequest, ListToolsRequest
from visior_sdk.visior.toolsproxy.v1 import GetHealthRequest as ToolsGetHealthRequest

from services.client import (
    DeadlineExceeded,
    InvalidArgument,
    Target,
    Unavailable,
    VisiorClient,
    VisiorRpcError,
    from_struct,
    from_value,
    targets_from_ports,
    to_struct,
    to_value,
)
from services.common.context import deadline_var, trace_id_var
from services.common.settings import Env
from services.common.structs import struct_to_dict
from services.common.topology import Ports, free_ports
from services.devtools.inprocess import InProcessMesh
from services.retrieval import app as retrieval_app
from services.retrieval.config import RetrievalSettings

SAMPLES = Path(__file__).resolve().parents[2] / "samples" / "docs"
TENANT = "demo"
TRACE = "sdk-interop-trace-0001"
USER = UserContext(user_id="u-1", tenant_id=TENANT, roles=["employee"])
LEAVE_QUESTION = "How many calendar days of paid annual leave does an employee get?"

NESTED: dict[str, Any] = {
    "none": None,
    "yes": True,
    "no": False,
    "zero": 0,
    "int": 42,
    "negative": -7,
    "float": 2.5,
    "big": 2**40,
    "empty_string": "",
    "text": "привет, world",
    "empty_list": [],
    "empty_dict": {},
    "list": [1, "two", None, False, [3.5, {"deep": [True, None]}]],
    "dict": {"a": {"b": {"c": [0, 1.25, "x"]}}, "flag": True},
}


# -- to_struct / from_struct (no server) --------------------------------------------------


def test_struct_round_trip_keeps_types() -> None:
    back = from_struct(Struct().parse(bytes(to_struct(NESTED))))
    assert back == NESTED
    # == alone would let True/1 and 1.0/1 pass: check the types the caller gets back.
    assert back["yes"] is True and back["no"] is False and back["none"] is None
    assert type(back["int"]) is int and type(back["float"]) is float
    assert type(back["list"][3]) is bool and back["list"][2] is None


def test_struct_bytes_are_what_protobuf_reads() -> None:
    # betterproto -> wire -> google.protobuf, and back; the grpcio side's helper must agree.
    parsed = struct_pb2.Struct.FromString(bytes(to_struct(NESTED)))
    assert struct_to_dict(parsed) == NESTED
    assert json_format.MessageToDict(parsed)["list"][4][1] == {"deep": [True, None]}
    grpcio_struct = struct_pb2.Struct()
    grpcio_struct.update(NESTED)
    from_grpcio = Struct().parse(grpcio_struct.SerializeToString())
    assert from_struct(from_grpcio) == NESTED


def test_value_edges() -> None:
    assert from_value(None) is None
    assert from_value(to_value(None)) is None
    assert from_value(to_value((1, "a"))) == [1, "a"]  # a tuple travels as a list
    assert from_value(to_value(0.1)) == 0.1
    assert math.isinf(from_value(to_value(float("inf"))))
    assert type(from_value(to_value(2.0**60))) is float  # past 2**53 a double is no exact int
    assert from_struct(None) == {}
    assert from_struct(Struct()) == {}


@pytest.mark.parametrize("bad", [{1: "x"}, {"a": object()}, {"a": {b"k": 1}}, {"a": {1, 2}}])
def test_to_struct_rejects_what_json_cannot_hold(bad: Any) -> None:
    with pytest.raises(TypeError):
        to_struct(bad)


def test_targets() -> None:
    ports = Ports()
    targets = targets_from_ports(ports, host="10.0.0.5")
    assert targets["retrieval"] == Target("10.0.0.5", ports.grpc["retrieval"])
    assert set(targets) == {"orchestrator", "llm", "retrieval", "toolsproxy"}
    assert Target.parse("svc:50053", "h") == Target("svc", 50053)
    assert Target.parse("[::1]:50053", "h") == Target("::1", 50053)
    assert Target.parse(7, "h") == Target("h", 7)
    with pytest.raises(ValueError):
        Target.parse("no-port", "h")
    client = VisiorClient(ports, host="10.0.0.5")
    assert client.targets["ingestion"] == client.targets["retrieval"]  # co-hosted by default
    with pytest.raises(ValueError):
        VisiorClient({"retreival": 1})  # a typo must not silently leave a service unreachable


# -- RetrievalService + IngestionService on the real retrieval server ----------------------


@pytest.fixture
async def retrieval_port(tmp_path: Path) -> AsyncIterator[int]:
    settings = RetrievalSettings.from_env(Env({"RETR_PORT": "0", "VISIOR_DATA_DIR": str(tmp_path)}))
    running, close = await retrieval_app.start(settings)
    try:
        yield running.port
    finally:
        await running.stop(0)
        await close()


@pytest.fixture
async def client(retrieval_port: int) -> AsyncIterator[VisiorClient]:
    async with VisiorClient({"retrieval": retrieval_port}, trace_id=TRACE, timeout=10) as c:
        yield c


async def ingest_samples(client: VisiorClient) -> dict[str, int]:
    """Ingest samples/docs/*.md for TENANT; returns chunks per doc_id."""
    chunks = {}
    for path in sorted(SAMPLES.glob("*.md")):
        out = await client.ingestion.ingest_document(
            IngestDocumentRequest(tenant_id=TENANT, file_name=path.name, content=path.read_bytes())
        )
        assert out.doc_id == path.stem
        assert out.sections > 0 and out.chunks > 0 and out.pages >= 1
        assert out.replaced is False
        chunks[out.doc_id] = out.chunks
    assert len(chunks) >= 3
    return chunks


async def test_ingest_list_delete(client: VisiorClient) -> None:
    chunks = await ingest_samples(client)

    again = await client.ingestion.ingest_document(
        IngestDocumentRequest(
            tenant_id=TENANT,
            file_name="vacation-policy.md",
            content=(SAMPLES / "vacation-policy.md").read_bytes(),
            title="Leave rules",
            tags=["hr"],
        )
    )
    assert again.doc_id == "vacation-policy" and again.replaced is True

    listed = await client.ingestion.list_documents(ListDocumentsRequest(tenant_id=TENANT))
    by_id = {d.doc_id: d for d in listed.documents}
    assert set(by_id) == set(chunks)
    assert {d: by_id[d].chunks for d in by_id} == chunks
    assert by_id["vacation-policy"].title == "Leave rules"
    assert all(d.chars > 0 and d.source for d in listed.documents)
    other = await client.ingestion.list_documents(ListDocumentsRequest(tenant_id="other"))
    assert other.documents == []

    gone = await client.ingestion.delete_document(
        DeleteDocumentRequest(tenant_id=TENANT, doc_id="vacation-policy")
    )
    assert gone.deleted is True
    twice = await client.ingestion.delete_document(
        DeleteDocumentRequest(tenant_id=TENANT, doc_id="vacation-policy")
    )
    assert twice.deleted is False
    listed = await client.ingestion.list_documents(ListDocumentsRequest(tenant_id=TENANT))
    assert "vacation-policy" not in {d.doc_id for d in listed.documents}
    found = await client.search(LEAVE_QUESTION, TENANT)
    assert "vacation-policy" not in {h.doc_id for h in found.hits}


async def test_search_and_health(client: VisiorClient) -> None:
    chunks = await ingest_samples(client)

    found = await client.search(LEAVE_QUESTION, TENANT, max_results=5)
    assert found.hits and found.hits[0].doc_id == "vacation-policy"
    assert "28 calendar days" in found.hits[0].text
    assert len(found.hits) <= 5
    assert [h.score for h in found.hits] == sorted((h.score for h in found.hits), reverse=True)
    assert found.chunks and all(c.mcp_link.doc_id == c.doc_id for c in found.chunks)
    assert found.used_sections and found.used_sections[0].anchor_chunk_id
    assert found.used_docs[0].doc_id == "vacation-policy"
    # No trace_id in the request: the server took it from the client's x-trace-id metadata.
    assert found.meta.trace_id == TRACE

    # The generated stub directly, with filters (a nested message) and per-call metadata.
    # The query matches both documents; the filter must keep only the admin guide.
    both = "annual leave LDAP"
    unfiltered = await client.search(both, TENANT)
    assert {"vacation-policy", "orion-x-admin-guide"} <= {h.doc_id for h in unfiltered.hits}
    only_guide = await client.retrieval.search(
        SearchRequest(
            query=both, tenant_id=TENANT, filters=SearchFilters(doc_ids=["orion-x-admin-guide"])
        ),
        metadata={"x-caller": "interop-test"},
    )
    assert only_guide.hits and {h.doc_id for h in only_guide.hits} == {"orion-x-admin-guide"}
    assert only_guide.meta.trace_id == TRACE  # per-call metadata did not drop the trace id
    own_trace = await client.retrieval.search(
        SearchRequest(query=both, tenant_id=TENANT), metadata={"x-trace-id": "per-call"}
    )
    assert own_trace.meta.trace_id == "per-call"

    elsewhere = await client.search(LEAVE_QUESTION, "other-tenant")
    assert elsewhere.hits == [] and elsewhere.chunks == []

    health = await client.retrieval.get_health(RetrievalGetHealthRequest())
    assert health.status == "ok"
    assert health.service == "visior.retrieval.v1.RetrievalService"
    assert health.details["docstore"] == "sqlite"
    assert health.details["reranker"] == "none"  # RERANK_MODEL_URL / _PATH unset
    # chunk points plus one per section and one per document
    assert int(health.details["index_points"]) > sum(chunks.values())
    assert health.details["index"] == "ok"
    short = await client.health("retrieval")
    assert short.ok and (short.service, short.details) == (health.service, health.details)


@pytest.mark.parametrize(
    ("kwargs", "reason", "field"),
    [
        (
            {"query": "leave", "tenant_id": TENANT, "max_results": 51},
            "LIMIT_EXCEEDED",
            "max_results",
        ),
        ({"query": "leave", "tenant_id": ""}, "INVALID_ARGUMENT", "tenant_id"),
    ],
)
async def test_error_carries_error_info(
    client: VisiorClient, kwargs: dict[str, Any], reason: str, field: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        await client.search(**kwargs)
    err = caught.value
    assert isinstance(err, VisiorRpcError)
    assert err.code == 3 and err.status.name == "INVALID_ARGUMENT"
    assert err.reason == reason
    assert err.domain == "visior.retrieval"
    assert err.metadata["field"] == field
    assert err.message  # for people; tests branch on the reason
    assert err.retryable is False
    assert isinstance(err.__cause__, GRPCError)


async def test_expired_deadline_is_deadline_exceeded(client: VisiorClient) -> None:
    # A deadline that has already passed fails before anything is sent, on every run.
    with pytest.raises(DeadlineExceeded) as caught:
        await client.search("leave", TENANT, timeout=0)
    assert caught.value.reason == "DEADLINE_EXCEEDED" and caught.value.error_info is None


async def test_inside_a_served_request_trace_and_deadline_carry_over(retrieval_port: int) -> None:
    # A client with no trace id of its own, used inside one of our handlers (the interceptor
    # sets these context variables), propagates the served request's trace id and deadline.
    async with VisiorClient({"retrieval": retrieval_port}) as c:
        fresh = await c.search("leave", TENANT)
        assert fresh.meta.trace_id  # none sent: the server made one up
        trace_token = trace_id_var.set("served-request-trace")
        try:
            found = await c.search("leave", TENANT)
            assert found.meta.trace_id == "served-request-trace"
            deadline_token = deadline_var.set(time.monotonic() - 1.0)  # the caller's has passed
            try:
                with pytest.raises(DeadlineExceeded):
                    await c.search("leave", TENANT)
            finally:
                deadline_var.reset(deadline_token)
        finally:
            trace_id_var.reset(trace_token)


async def test_nobody_listening_is_unavailable() -> None:
    (port,) = free_ports(1)
    async with VisiorClient({"retrieval": port}, timeout=5) as c:
        with pytest.raises(Unavailable) as caught:
            await c.health("retrieval")
    assert caught.value.retryable is True


async def test_client_without_a_target_says_so(client: VisiorClient) -> None:
    with pytest.raises(LookupError):
        client.llm  # noqa: B018
    with pytest.raises(ValueError):
        await client.health("ingestion")


# -- the whole mesh: ToolsProxy, LLM, Orchestrator -----------------------------------------


@pytest.fixture
async def mesh_client(tmp_path: Path) -> AsyncIterator[VisiorClient]:
    async with InProcessMesh(tmp_path) as mesh:
        targets = {
            key: mesh.port(key) for key in ("orchestrator", "llm", "retrieval", "toolsproxy")
        }
        async with VisiorClient(targets, trace_id=TRACE, timeout=30) as c:
            await ingest_samples(c)
            yield c


async def test_tools_proxy(mesh_client: VisiorClient) -> None:
    c = mesh_client
    catalogue = (await c.tools.list_tools(ListToolsRequest())).tools
    names = {t.name for t in catalogue}
    assert {"read_chunk_window", "read_doc_section", "read_doc_metadata"} <= names
    window_tool = next(t for t in catalogue if t.name == "read_chunk_window")
    schema = from_struct(window_tool.input_schema)
    assert schema["type"] == "object"
    assert set(schema["required"]) == {"doc_id", "anchor_chunk_id"}

    section = (await c.search(LEAVE_QUESTION, TENANT)).used_sections[0]
    args = {"doc_id": section.doc_id, "anchor_chunk_id": section.anchor_chunk_id, "radius": 1}
    raw = await c.tools.execute(
        ExecuteRequest(tool_name="read_chunk_window", arguments=to_struct(args), user=USER)
    )
    assert raw.status == "ok" and raw.trace_id == TRACE
    assert not betterproto.serialized_on_wire(raw.error)
    result = from_value(raw.result)
    assert result["doc_id"] == "vacation-policy"
    assert result["anchor_chunk_id"] == section.anchor_chunk_id
    assert result["radius"] == {"before": 1, "after": 1}
    assert type(result["page_start"]) is int and result["truncated"] is False
    assert "28 calendar days" in result["text"]

    same = await c.execute_tool("read_chunk_window", args, USER)
    assert same.ok and same.error is None and same.result == result

    too_wide = await c.execute_tool("read_chunk_window", {**args, "radius": 50}, USER)
    assert not too_wide.ok and too_wide.result is None
    assert too_wide.error is not None and too_wide.error.code == "WINDOW_TOO_LARGE"

    # Another tenant naming this tenant's document learns nothing.
    stranger = UserContext(user_id="x", tenant_id="other-tenant")
    denied = await c.execute_tool("read_doc_metadata", {"doc_id": "vacation-policy"}, stranger)
    assert denied.status == "error" and denied.error is not None
    assert denied.error.code in ("NOT_FOUND", "ACCESS_DENIED")

    health = await c.tools.get_health(ToolsGetHealthRequest())
    assert health.status == "ok" and health.service == "visior.toolsproxy.v1.ToolsProxyService"
    assert health.details["tools"] == str(len(catalogue))


def leave_generation(anchor: AnchorChunk) -> GenerateRequest:
    return GenerateRequest(
        mode="rag",
        messages=[ChatMessage(role="user", content=LEAVE_QUESTION)],
        user=USER,
        tool_policy=ToolPolicy(
            allowed_tools=["read_chunk_window"], anchors=[anchor], window_radius_schedule=[1]
        ),
    )


async def test_llm(mesh_client: VisiorClient) -> None:
    c = mesh_client
    section = (await c.search(LEAVE_QUESTION, TENANT)).used_sections[0]
    anchor = AnchorChunk(
        doc_id=section.doc_id,
        section_id=section.section_id,
        anchor_chunk_id=section.anchor_chunk_id,
    )

    out = await c.llm.generate(leave_generation(anchor))
    assert "28 calendar days" in out.answer
    assert [t.name for t in out.tools_called] == ["read_chunk_window"]
    assert from_struct(out.tools_called[0].arguments)["doc_id"] == "vacation-policy"
    assert out.meta.extractive is True and out.meta.tool_steps == 1
    assert out.meta.trace_id == TRACE
    assert out.used_tokens.prompt > 0 and out.used_tokens.completion > 0

    events = [
        e
        async for e in c.llm.generate_stream(
            GenerateStreamRequest(request=leave_generation(anchor))
        )
    ]
    kinds = [betterproto.which_one_of(e, "event")[0] for e in events]
    assert kinds[-1] == "final" and kinds.count("final") == 1
    assert "tool_call" in kinds and "delta" in kinds
    final = events[-1].final
    assert (
        "".join(e.delta for e, k in zip(events, kinds, strict=True) if k == "delta") == final.answer
    )
    streamed_calls = [
        e.tool_call.name for e, k in zip(events, kinds, strict=True) if k == "tool_call"
    ]
    assert streamed_calls == [t.name for t in final.tools_called] == ["read_chunk_window"]
    assert final.answer == out.answer

    # Stopping early: close the generator (aclosing) so the HTTP/2 stream ends right away.
    stream = c.llm.generate_stream(GenerateStreamRequest(request=leave_generation(anchor)))
    async with aclosing(stream):
        async for first in stream:
            assert betterproto.which_one_of(first, "event")[0] in ("tool_call", "delta")
            break
    assert (await c.health("llm")).ok  # and the channel carries on

    # A streamed RPC's error surfaces as the same typed error while iterating.
    with pytest.raises(InvalidArgument) as caught:
        async for _ in c.llm.generate_stream(
            GenerateStreamRequest(request=GenerateRequest(mode="rag"))
        ):
            pass
    assert caught.value.reason == "INVALID_ARGUMENT"
    assert caught.value.metadata["field"] == "messages"

    health = await c.llm.get_health(LlmGetHealthRequest())
    assert health.status == "ok" and health.service == "visior.llm.v1.LlmService"


async def test_orchestrator(mesh_client: VisiorClient) -> None:
    c = mesh_client
    answer = await c.respond(LEAVE_QUESTION, TENANT, "u-1", history=[("user", "Hi")])
    assert "28 calendar days" in answer.answer
    assert "vacation-policy" in {s.doc_id for s in answer.sources}
    assert all(s.page_start >= 1 for s in answer.sources)
    assert answer.tools and answer.tools[0].name in ("read_chunk_window", "read_doc_section")
    assert from_struct(answer.tools[0].arguments)["doc_id"] == "vacation-policy"
    assert answer.telemetry.trace_id == TRACE
    assert answer.safety.input and answer.safety.output

    with pytest.raises(InvalidArgument) as caught:
        await c.respond(LEAVE_QUESTION, TENANT, "u-1", max_results=51)
    assert caught.value.reason.endswith("LIMIT_EXCEEDED")

    before = await c.orchestrator.get_config(GetConfigRequest())
    assert before.default_model == "" and before.max_tool_steps >= 1  # "" = the LLM default

    # proto3 `optional`: fields left None are not sent, so they keep their values.
    updated = await c.orchestrator.update_config(
        UpdateConfigRequest(max_tool_steps=2, window_radius=1)
    )
    assert updated.max_tool_steps == 2 and updated.window_radius == 1
    assert updated.default_model == before.default_model
    assert updated.prompt_token_budget == before.prompt_token_budget
    after = await c.orchestrator.get_config(GetConfigRequest())
    assert after.to_dict() == updated.to_dict()

    # Zero is a value, not "unset": presence survives betterproto's optional fields.
    zero = await c.orchestrator.update_config(UpdateConfigRequest(max_tool_steps=0))
    assert zero.max_tool_steps == 0 and zero.window_radius == 1

    with pytest.raises(InvalidArgument) as caught:
        await c.orchestrator.update_config(UpdateConfigRequest(max_tool_steps=99))
    assert caught.value.reason == "INVALID_ARGUMENT"
    assert caught.value.metadata["field"] == "max_tool_steps"
    current = await c.orchestrator.get_config(GetConfigRequest())
    assert current.to_dict() == zero.to_dict()  # a rejected update changes nothing

    health = await c.orchestrator.get_health(OrchGetHealthRequest())
    assert health.status == "ok"
    assert health.service == "visior.orchestrator.v1.OrchestratorService"
    for key in ("orchestrator", "llm", "retrieval", "toolsproxy"):
        assert (await c.health(key)).ok
