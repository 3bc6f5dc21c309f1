"""gRPC adapters for the orchestrator's ports: Retrieval and the LLM service."""

from __future__ import annotations

import time

import grpc
from visior.common.v1 import common_pb2
from visior.llm.v1 import llm_pb2, llm_pb2_grpc
from visior.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc

from services.common import errors
from services.common.generate_contract import MAX_MODEL_CHARS
from services.common.status import call_downstream, error_info, from_rpc_error
from services.common.structs import struct_to_dict
from services.model_runtime.chat import LLM_RUNTIME_ERROR
from services.orchestrator.model import (
    LlmOutcome,
    LlmRequest,
    ModelUsage,
    RetrievalOutcome,
    RetrievalRequest,
    SectionCandidate,
    ToolCallRecord,
    User,
)


class GrpcRetriever:
    """Retriever over RetrievalService.Search; `min_score` (ORCH_SCORE_THRESHOLD) goes with
    every search as params.min_score, None leaves Retrieval's default."""

    def __init__(self, channel: grpc.aio.Channel, *, min_score: float | None = None) -> None:
        self._min_score = min_score
        self._stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        self._ingestion = retrieval_pb2_grpc.IngestionServiceStub(channel)

    async def document_sizes(
        self, user: User, doc_ids: tuple[str, ...]
    ) -> dict[str, tuple[int, int, str]]:
        if not doc_ids:
            return {}
        # Only the documents asked about (a Respond's filters, at most MAX_FILTER_VALUES,
        # below ListDocuments' page limit). Retrieval may cut a page of large documents
        # short (its response byte budget): the token continues it. Each page holds at
        # least one document, so at most len(doc_ids) pages.
        request = retrieval_pb2.ListDocumentsRequest(
            tenant_id=user.tenant_id, doc_ids=doc_ids, page_size=max(1, len(doc_ids))
        )
        wanted = set(doc_ids)
        sizes: dict[str, tuple[int, int, str]] = {}
        for _ in doc_ids:
            response = await call_downstream(self._ingestion.ListDocuments, request, "retrieval")
            sizes.update(
                (d.doc_id, (d.chars, d.tokens, d.title))
                for d in response.documents
                if d.doc_id in wanted
            )
            if not response.next_page_token:
                break
            request.page_token = response.next_page_token
        return sizes

    async def search(self, req: RetrievalRequest) -> RetrievalOutcome:
        request = retrieval_pb2.SearchRequest(
            query=req.query,
            tenant_id=req.user.tenant_id,
            max_results=req.max_results,
            # Filters has SearchFilters' fields, name for name; vars() copies nothing.
            filters=retrieval_pb2.SearchFilters(**vars(req.filters)),
            trace_id=req.trace_id,
        )
        if req.expand_query:
            request.params.expand_query = True
        if self._min_score is not None:
            request.params.min_score = self._min_score
        started = time.perf_counter()
        response = await call_downstream(self._stub.Search, request, "retrieval")
        # The hits' text never reaches a prompt (orchestrator.md §3.2: only section summaries
        # go on); it is kept to see whether the sections speak of a definition's term.
        return RetrievalOutcome(
            sections=tuple(
                SectionCandidate(
                    s.doc_id,
                    s.section_id,
                    s.title,
                    s.summary,
                    s.score,
                    s.page_start,
                    s.page_end,
                    s.anchor_chunk_id,
                )
                for s in response.used_sections
            ),
            latency_ms=round((time.perf_counter() - started) * 1000),
            passages=tuple((h.section_id, h.text) for h in response.hits),
        )


def _generate_error(exc: grpc.aio.AioRpcError, model: str) -> errors.ServiceError:
    """A failed Generate as `from_rpc_error` types it, but for the model: the Orchestrator
    sends its own default_model, so a model the LLM service or its runtime refuses is this
    deployment's misconfiguration, a 502 naming it, not a bad request of ours (500)."""
    info = error_info(exc)
    if (
        exc.code() == grpc.StatusCode.INVALID_ARGUMENT
        and info
        and info.metadata.get("field") == "model"
    ):
        return errors.UnavailableError(
            f"llm: {exc.details()} (the Orchestrator's default_model, ORCH_DEFAULT_MODEL)",
            reason=LLM_RUNTIME_ERROR,
            metadata={"downstream": "llm", "model": model[:MAX_MODEL_CHARS]},
        )
    return from_rpc_error(exc, "llm")


class GrpcGenerator:
    """Generator over LlmService.Generate."""

    def __init__(self, channel: grpc.aio.Channel, timeout_s: float) -> None:
        """`timeout_s`: one call's deadline (ORCH_LLM_TIMEOUT_SECONDS), which a request's own
        `timeout_s` may only shorten."""
        self._stub = llm_pb2_grpc.LlmServiceStub(channel)
        self._timeout_s = timeout_s

    async def generate(self, req: LlmRequest) -> LlmOutcome:
        request = llm_pb2.GenerateRequest(
            mode=req.mode,
            system_prompt=req.system_prompt,
            messages=[common_pb2.ChatMessage(role=m.role, content=m.content) for m in req.messages],
            trace_id=req.trace_id,
            user=common_pb2.UserContext(
                tenant_id=req.user.tenant_id, user_id=req.user.user_id, roles=req.user.roles
            ),
            tool_policy=llm_pb2.ToolPolicy(
                allowed_tools=req.allowed_tools,
                anchors=[
                    llm_pb2.AnchorChunk(
                        doc_id=s.doc_id, section_id=s.section_id, anchor_chunk_id=s.anchor_chunk_id
                    )
                    for s in req.context
                ],
                window_radius_schedule=req.radius_schedule,
                max_tool_steps=req.max_tool_steps,
                context_token_budget=req.context_token_budget,
                require_tool_call=req.require_tool_call,
            ),
            model=req.model,
            answer_language=req.answer_language,
        )  # fmt: skip
        if req.max_tokens is not None:
            request.generation_params.max_tokens = req.max_tokens
        if req.response_schema is not None:
            request.generation_params.response_schema.update(req.response_schema)
        for planned in req.planned_calls:
            call = request.tool_policy.planned_calls.add(tool_name=planned.tool_name)
            call.arguments.update(planned.arguments)
        started = time.perf_counter()
        try:
            # Either timeout is clamped to the caller's deadline, as every call's is
            # (services/common/interceptors.py).
            timeout = (
                self._timeout_s if req.timeout_s is None else min(req.timeout_s, self._timeout_s)
            )
            response = await self._stub.Generate(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise _generate_error(exc, req.model) from None
        return LlmOutcome(
            answer=response.answer,
            tools=tuple(
                ToolCallRecord(t.name, struct_to_dict(t.arguments), t.result_summary)
                for t in response.tools_called
            ),
            tool_steps=response.meta.tool_steps,
            latency_ms=round((time.perf_counter() - started) * 1000),
            extractive=response.meta.extractive,
            usage=ModelUsage(
                runtime_ms=response.meta.runtime_ms,
                calls=response.meta.model_calls,
                prompt_tokens=response.used_tokens.prompt,
                prompt_cached=response.used_tokens.prompt_cached,
                final_prompt=response.used_tokens.final_prompt,
            ),
            withheld_for=tuple(response.meta.withheld_for),
        )
