"""OrchestratorService servicer: proto <-> domain."""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

import grpc
from visior.common.v1 import common_pb2
from visior.orchestrator.v1 import orchestrator_pb2 as pb
from visior.orchestrator.v1 import orchestrator_pb2_grpc

from services.common import errors
from services.common.search_contract import Filters
from services.common.structs import optional
from services.common.topology import SERVICE_BY_KEY
from services.orchestrator.model import RespondInput, RespondOutput, Turn, User
from services.orchestrator.respond import Responder, filter_ids, resolve_user
from services.orchestrator.runtime_config import ConfigHolder, ConfigUpdate, RuntimeConfig

SERVICE_NAME = SERVICE_BY_KEY["orchestrator"].grpc_services[0]
"""The gRPC service GetHealth names (services/common/topology.py)."""

SAFETY_HEADER = "x-visior-safety-input"
SAFETY_VERDICTS = ("allowed", "flagged", "blocked")
"""The gateway's verdicts, least severe first."""


def safety_verdict(metadata: Any) -> str:
    """The gateway's input-safety verdict (header x-visior-safety-input, orchestrator.md §6):
    the most severe of every value sent (each header, and each comma-separated value of one,
    as HTTP joins repeated fields), so a client that sends its own "allowed" before the
    gateway's verdict cannot override it; "allowed" when absent. An unknown value is the
    caller's error."""
    verdict = 0
    for key, value in metadata or ():
        if key != SAFETY_HEADER:
            continue
        text = value.decode() if isinstance(value, bytes) else str(value)
        for said in text.split(","):
            said = said.strip().lower()
            if said not in SAFETY_VERDICTS:
                raise errors.InvalidArgumentError(
                    f"{SAFETY_HEADER} must be one of {', '.join(SAFETY_VERDICTS)}",
                    metadata={"field": SAFETY_HEADER},
                )
            verdict = max(verdict, SAFETY_VERDICTS.index(said))
    return SAFETY_VERDICTS[verdict]


def respond_input(req: pb.RespondRequest) -> RespondInput:
    user = (
        User(req.user.tenant_id, req.user.user_id, tuple(req.user.roles))
        if req.HasField("user")
        else None
    )
    f = req.filters
    return RespondInput(
        query=req.query,
        user=resolve_user(user, req.user_id, req.tenant_id),
        channel=req.channel,
        locale=req.locale,
        trace_id=req.trace_id,
        filters=Filters(
            product=f.product,
            version=f.version,
            tags=tuple(f.tags),
            doc_ids=filter_ids("doc_ids", f.doc_ids, req.doc_ids),
            section_ids=filter_ids("section_ids", f.section_ids, req.section_ids),
            source=f.source,
        ),
        max_results=optional(req, "max_results"),
        history=tuple(Turn(t.role, t.content) for t in req.history),
        selected_doc_ids=tuple(dict.fromkeys(req.doc_ids)),
    )


def respond_response(out: RespondOutput) -> pb.RespondResponse:
    tools = []
    for t in out.tools:
        call = common_pb2.ToolCall(name=t.name, result_summary=t.result_summary)
        call.arguments.update(t.arguments)
        tools.append(call)
    telemetry = pb.Telemetry(
        trace_id=out.trace_id,
        retrieval_latency_ms=out.retrieval_latency_ms,
        tool_steps=out.tool_steps,
        scenario=out.scenario,
        intent=out.intent,
        decided_by=out.decided_by,
        llm_runtime_ms=out.model_usage.runtime_ms,
        model_calls=out.model_usage.calls,
        prompt_tokens=out.model_usage.prompt_tokens,
        prompt_tokens_cached=out.model_usage.prompt_cached,
        final_prompt_tokens=out.model_usage.final_prompt,
        withheld_for=out.withheld_for,
    )
    if out.llm_latency_ms is not None:
        telemetry.llm_latency_ms = out.llm_latency_ms
    return pb.RespondResponse(
        answer=out.answer,
        sources=[
            pb.Source(
                doc_id=s.doc_id,
                section_id=s.section_id,
                page_start=s.page_start,
                page_end=s.page_end,
                score=s.score,
            )
            for s in out.sources
        ],
        tools=tools,
        safety=pb.Safety(input=out.safety_input, output=out.safety_output),
        telemetry=telemetry,
    )


def config_fields(c: RuntimeConfig) -> dict[str, Any]:
    """The config as Get/UpdateConfigResponse's fields (they are RuntimeConfig's, name for
    name)."""
    return asdict(c)


def config_update(req: pb.UpdateConfigRequest) -> ConfigUpdate:
    return ConfigUpdate(
        **{name: optional(req, name) for name in ConfigUpdate.__dataclass_fields__}  # type: ignore[arg-type]
    )


class OrchestratorServicer(orchestrator_pb2_grpc.OrchestratorServiceServicer):
    def __init__(self, responder: Responder, config: ConfigHolder) -> None:
        self._responder = responder
        self._config = config

    async def Respond(
        self, request: pb.RespondRequest, context: grpc.aio.ServicerContext
    ) -> pb.RespondResponse:
        verdict = safety_verdict(context.invocation_metadata())
        inp = replace(respond_input(request), safety_input=verdict)
        return respond_response(await self._responder.respond(inp))

    async def GetConfig(
        self, request: pb.GetConfigRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetConfigResponse:
        return pb.GetConfigResponse(**config_fields(self._config.current))

    async def UpdateConfig(
        self, request: pb.UpdateConfigRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpdateConfigResponse:
        return pb.UpdateConfigResponse(**config_fields(self._config.update(config_update(request))))

    async def GetHealth(
        self, request: pb.GetHealthRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetHealthResponse:
        return pb.GetHealthResponse(
            status="ok",
            service=SERVICE_NAME,
            details={"mock_mode": str(self._config.current.mock_mode).lower()},
        )
