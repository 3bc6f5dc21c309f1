"""LlmService servicer: proto <-> domain."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from visior.common.v1 import common_pb2
from visior.llm.v1 import llm_pb2, llm_pb2_grpc

from services.common import draining, errors
from services.common.context import check_trace_id, current_trace_id
from services.common.logging import bind_trace_id
from services.common.status import status_proto
from services.common.structs import optional, request_struct
from services.common.topology import SERVICE_BY_KEY
from services.llm.engine import LlmEngine
from services.llm.model import (
    Anchor,
    ContextChunk,
    GenerateInput,
    GenerateOutput,
    PlannedCall,
    ToolCallRecord,
    ToolPolicy,
    Turn,
    User,
)
from services.model_runtime.chat import GenerationParams

SERVICE_NAME = SERVICE_BY_KEY["llm"].grpc_services[0]
"""The gRPC service GetHealth names (services/common/topology.py)."""
ERROR_DOMAIN = "visior.llm"
"""The ErrorInfo domain of this service's errors."""


def generate_input(req: llm_pb2.GenerateRequest) -> GenerateInput:
    p, tp = req.generation_params, req.tool_policy
    return GenerateInput(
        messages=tuple(Turn(m.role, m.content) for m in req.messages),
        mode=req.mode or "rag",
        system_prompt=req.system_prompt,
        context_chunks=tuple(
            ContextChunk(
                c.doc_id, c.section_id, c.text, c.page_start, c.page_end, c.chunk_id, c.score
            )
            for c in req.context_chunks
        ),
        params=GenerationParams(
            max_tokens=optional(p, "max_tokens"),
            temperature=optional(p, "temperature"),
            top_p=optional(p, "top_p"),
            presence_penalty=optional(p, "presence_penalty"),
            frequency_penalty=optional(p, "frequency_penalty"),
            stop=tuple(p.stop),
            response_schema=request_struct(p.response_schema, "generation_params.response_schema")
            if p.HasField("response_schema")
            else None,
        ),
        user=User(req.user.tenant_id, req.user.user_id, tuple(req.user.roles))
        if req.HasField("user")
        else None,
        policy=ToolPolicy(
            allowed_tools=tuple(tp.allowed_tools),
            anchors=tuple(Anchor(a.doc_id, a.section_id, a.anchor_chunk_id) for a in tp.anchors),
            radius_schedule=tuple(tp.window_radius_schedule) or (1,),
            max_tool_steps=optional(tp, "max_tool_steps"),
            context_token_budget=optional(tp, "context_token_budget"),
            planned_calls=tuple(
                PlannedCall(
                    c.tool_name,
                    request_struct(c.arguments, f"tool_policy.planned_calls[{i}].arguments"),
                )
                for i, c in enumerate(tp.planned_calls)
            ),
            require_tool_call=tp.require_tool_call,
        ),
        model=req.model,
        trace_id=req.trace_id,
        answer_language=req.answer_language,
    )


def _tool_call(r: ToolCallRecord) -> common_pb2.ToolCall:
    call = common_pb2.ToolCall(name=r.name, result_summary=r.result_summary)
    call.arguments.update(r.arguments)
    return call


def generate_response(out: GenerateOutput) -> llm_pb2.GenerateResponse:
    return llm_pb2.GenerateResponse(
        answer=out.answer,
        used_tokens=llm_pb2.UsedTokens(
            prompt=out.prompt_tokens,
            completion=out.completion_tokens,
            prompt_cached=out.prompt_cached,
            final_prompt=out.final_prompt_tokens,
        ),
        tools_called=[_tool_call(r) for r in out.tools_called],
        meta=llm_pb2.GenerateMeta(
            model_name=out.model_name,
            latency_ms=out.latency_ms,
            tool_steps=len(out.tools_called),
            trace_id=out.trace_id,
            extractive=out.extractive,
            runtime_ms=out.runtime_ms,
            model_calls=out.model_calls,
            withheld_for=out.withheld_for,
            finish_reason=out.finish_reason,
        ),
    )


_Item = llm_pb2.GenerateStreamResponse | errors.UnavailableError | None
"""What a stream's queue holds: an event, the server's stop (UNAVAILABLE DRAINING,
services.common.draining), or None once the generation has ended."""


class _QueueSink:
    def __init__(self, queue: asyncio.Queue[_Item]) -> None:
        self._queue = queue

    async def delta(self, text: str) -> None:
        await self._queue.put(llm_pb2.GenerateStreamResponse(delta=text))

    async def tool_call(self, record: ToolCallRecord) -> None:
        await self._queue.put(llm_pb2.GenerateStreamResponse(tool_call=_tool_call(record)))


class LlmServicer(llm_pb2_grpc.LlmServiceServicer):
    def __init__(self, engine: LlmEngine, runtime: str) -> None:
        self._engine = engine
        self._runtime = runtime

    async def Generate(
        self, request: llm_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> llm_pb2.GenerateResponse:
        # Still running as the server's stop is about to cancel it, it ends with UNAVAILABLE
        # DRAINING as every service's calls do (services.common.draining).
        return generate_response(await self._engine.generate(generate_input(request)))

    async def GenerateStream(
        self, request: llm_pb2.GenerateStreamRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[llm_pb2.GenerateStreamResponse]:
        if not request.HasField("request"):
            raise errors.InvalidArgumentError("request is required", metadata={"field": "request"})
        inner = request.request
        # The interceptor checks and binds a request's own `trace_id`; this one is inside the
        # inner request, so it is checked and bound here, by the same rule: ToolsProxy would
        # refuse every tool call made under a bad one, and logs name the one the caller sent.
        check_trace_id(inner.trace_id)
        if inner.trace_id:
            bind_trace_id(inner.trace_id)
        else:
            inner.trace_id = current_trace_id()
        queue: asyncio.Queue[_Item] = asyncio.Queue()
        task = asyncio.ensure_future(
            self._engine.generate(generate_input(inner), _QueueSink(queue))
        )
        task.add_done_callback(lambda _t: queue.put_nowait(None))
        # Still running as the server's stop is about to cancel it, the stream ends here, not
        # where it waits: a JSON caller's array then ends with the DRAINING error, not as a
        # short finished answer.
        draining.when_ending(queue.put_nowait)
        began = False
        try:
            while (event := await queue.get()) is not None:
                if isinstance(event, errors.UnavailableError):
                    raise event
                began = True
                yield event
            out = task.result()  # re-raises the generation's error, after the events so far
            final = llm_pb2.GenerateStreamResponse(final=generate_response(out))
        except Exception as exc:
            if began:  # a JSON caller's array has begun (HTTP 200): the error is its last element
                err = errors.as_service_error(exc, current_trace_id())
                error = status_proto(err, ERROR_DOMAIN)
                yield llm_pb2.GenerateStreamResponse(error=error)
            raise
        finally:
            task.cancel()
        yield final

    async def GetHealth(
        self, request: llm_pb2.GetHealthRequest, context: grpc.aio.ServicerContext
    ) -> llm_pb2.GetHealthResponse:
        return llm_pb2.GetHealthResponse(
            status="ok", service=SERVICE_NAME, details={"runtime": self._runtime}
        )
