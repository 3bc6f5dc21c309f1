"""GenerateStream's tool_call event of a refused call goes on the wire (services/llm/servicer.py):
whatever the model wrote as the tool's name, the event is a valid proto message."""

from __future__ import annotations

import asyncio

from visior.llm.v1 import llm_pb2

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
