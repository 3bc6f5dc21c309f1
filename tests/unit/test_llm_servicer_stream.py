"""GenerateStream's tool_call event of a refused call goes on the wire (services/llm/servicer.py):
whatever the model wrote as the tool's name, the event is a valid proto message."""

from __future__ import annotations

import asyncio

import grpc
from visior.llm.v1 import llm_pb2, llm_pb2_grpc

from services.llm.servicer import _QueueSink
from services.llm.toolcalls import UNKNOWN_TOOL, refused_record
from services.model_runtime.chat import ToolCall


async def test_a_refused_calls_event_serialises_whatever_its_name():
    queue: asyncio.Queue[llm_pb2.GenerateStreamResponse | None] = asyncio.Queue()
    name = "read\ud800_doc" * 20  # an unpaired surrogate a model's JSON escaped
    record = refused_record(ToolCall("c1", name, '{"doc_id": "d"}'), UNKNOWN_TOOL, "no such tool")
    await _QueueSink(queue).tool_call(record)
    event = queue.get_nowait()
    assert event is not None
    wire = llm_pb2.GenerateStreamResponse.FromString(event.SerializeToString())
    assert wire.tool_call.name.startswith("read\ufffd_doc")
    assert wire.tool_call.result_summary == "tool_error UNKNOWN_TOOL: no such tool"
    assert dict(wire.tool_call.arguments) == {"doc_id": "d"}


async def test_a_final_event_that_cannot_be_made_ends_the_stream_with_an_error_event(
    monkeypatch,
):
    """Whatever fails once deltas went out, the caller's array ends with an error element
    (never a well-formed array with neither final nor error)."""
    from tests.unit.test_llm_stream_drain import REQUEST, SlowModel, events_until_end, serve

    def broken(out):  # the final event's own making fails (a value out of the proto's range)
        raise ValueError("Value out of range")

    monkeypatch.setattr("services.llm.servicer.generate_response", broken)
    running = await serve(SlowModel(words=3))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            call = llm_pb2_grpc.LlmServiceStub(channel).GenerateStream(REQUEST)
            events, failed = await events_until_end(call)
    finally:
        await running.stop(1.0)
    assert [e.WhichOneof("event") for e in events] == ["delta"] * 3 + ["error"]
    assert events[-1].error.code == grpc.StatusCode.INTERNAL.value[0]
    assert failed is not None and failed.code() == grpc.StatusCode.INTERNAL
