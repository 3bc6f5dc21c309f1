"""The orchestrator's LLM client against a real grpc.aio server: what goes out, what comes back."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from google.protobuf import json_format
from visior.llm.v1 import llm_pb2, llm_pb2_grpc

from services.orchestrator.clients import GrpcGenerator
from services.orchestrator.model import LlmRequest, ModelUsage, SectionCandidate, User

SCHEMA = {"type": "object", "properties": {"intent": {"enum": ["documents"]}}}


class _Llm(llm_pb2_grpc.LlmServiceServicer):
    def __init__(self) -> None:
        self.requests: list[llm_pb2.GenerateRequest] = []
        self.time_remaining: list[float | None] = []

    async def Generate(self, request, context):  # type: ignore[no-untyped-def]
        self.requests.append(request)
        self.time_remaining.append(context.time_remaining())
        return llm_pb2.GenerateResponse(
            answer="ok",
            used_tokens=llm_pb2.UsedTokens(
                prompt=2600, completion=80, prompt_cached=1150, final_prompt=1450
            ),
            meta=llm_pb2.GenerateMeta(model_name="m", runtime_ms=4000, model_calls=2),
        )


@pytest.fixture
async def llm() -> AsyncIterator[tuple[_Llm, GrpcGenerator]]:
    servicer = _Llm()
    server = grpc.aio.server()
    llm_pb2_grpc.add_LlmServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield servicer, GrpcGenerator(channel, 60.0)
    finally:
        await channel.close()
        await server.stop(None)


def _request(**kw) -> LlmRequest:  # type: ignore[no-untyped-def]
    base = {
        "system_prompt": "s",
        "messages": (),
        "context": (),
        "user": User("t", "u"),
        "allowed_tools": (),
        "radius_schedule": (0,),
        "max_tool_steps": 0,
        "context_token_budget": 1000,
        "model": "",
        "trace_id": "tr",
    }
    return LlmRequest(**{**base, **kw})


async def test_a_routing_request_carries_its_schema_and_cap(llm) -> None:
    servicer, client = llm
    outcome = await client.generate(_request(mode="chat", response_schema=SCHEMA, max_tokens=200))
    (sent,) = servicer.requests
    params = sent.generation_params
    assert json_format.MessageToDict(params.response_schema) == SCHEMA
    assert params.max_tokens == 200 and not sent.tool_policy.require_tool_call
    assert outcome.usage == ModelUsage(
        runtime_ms=4000, calls=2, prompt_tokens=2600, prompt_cached=1150, final_prompt=1450
    )


async def test_an_answer_request_asks_for_the_first_read_and_no_schema(llm) -> None:
    servicer, client = llm
    section = SectionCandidate(
        doc_id="d", section_id="d:s1", title="t", summary="s", page_start=1, page_end=2,
        score=0.9, anchor_chunk_id="d:c1",
    )  # fmt: skip
    await client.generate(
        _request(context=(section,), allowed_tools=("read_chunk_window",), max_tool_steps=3,
                 require_tool_call=True, answer_language="ru")
    )  # fmt: skip
    (sent,) = servicer.requests
    assert sent.tool_policy.require_tool_call and sent.answer_language == "ru"
    assert not sent.generation_params.HasField("response_schema")
    assert not sent.generation_params.HasField("max_tokens")


@pytest.mark.parametrize(("own", "expected"), [(None, 60.0), (30.0, 30.0), (90.0, 60.0)])
async def test_a_requests_own_timeout_only_shortens_the_configured_one(llm, own, expected) -> None:
    # The routing call's share of the caller's time never lengthens ORCH_LLM_TIMEOUT_SECONDS.
    servicer, client = llm
    await client.generate(_request(timeout_s=own))
    (left,) = servicer.time_remaining
    assert left is not None and expected - 2.0 < left < expected + 1.0  # grpc rounds up
