"""ToolsProxyService servicer: proto <-> domain."""

from __future__ import annotations

import grpc
from google.protobuf import json_format, struct_pb2
from visior.common.v1 import common_pb2
from visior.toolsproxy.v1 import toolsproxy_pb2, toolsproxy_pb2_grpc

from services.common import errors
from services.common.health import Probe, SharedProbe
from services.common.structs import request_struct
from services.common.tool_contract import check_tool_user
from services.common.topology import SERVICE_BY_KEY
from services.toolsproxy.tools import Caller, ToolExecutor

SERVICE_NAME = SERVICE_BY_KEY["toolsproxy"].grpc_services[0]
"""The gRPC service GetHealth names (services/common/topology.py)."""

MAX_TOOL_NAME = 64


def caller_from(user: common_pb2.UserContext, trace_id: str) -> Caller:
    """The caller from the request's user context; a missing tenant or user is the caller's
    error."""
    check_tool_user(user.tenant_id, user.user_id, tuple(user.roles))
    return Caller(tenant_id=user.tenant_id, user_id=user.user_id, trace_id=trace_id)


def _serving() -> dict[str, str]:
    return {"status": "ok"}


class ToolsProxyServicer(toolsproxy_pb2_grpc.ToolsProxyServiceServicer):
    def __init__(self, executor: ToolExecutor, probe: Probe = _serving) -> None:
        self._executor = executor
        # The probe pings the document store (services/toolsproxy/app.py), off the event loop
        # and shared by the health calls meanwhile (services/common/health.py).
        self._health = SharedProbe(probe, hung="the document store hangs")

    async def Execute(
        self, request: toolsproxy_pb2.ExecuteRequest, context: grpc.aio.ServicerContext
    ) -> toolsproxy_pb2.ExecuteResponse:
        if not request.tool_name.strip() or len(request.tool_name) > MAX_TOOL_NAME:
            raise errors.InvalidArgumentError(
                f"tool_name is required (at most {MAX_TOOL_NAME} characters)",
                metadata={"field": "tool_name"},
            )
        caller = caller_from(request.user, request.trace_id)
        args = {}
        if request.HasField("arguments"):
            args = request_struct(request.arguments, "arguments")
        outcome = await self._executor.execute(request.tool_name, args, caller)
        response = toolsproxy_pb2.ExecuteResponse(status=outcome.status, trace_id=request.trace_id)
        if outcome.result is not None:
            json_format.ParseDict(outcome.result, response.result)
        else:
            response.error.code = outcome.error_code
            response.error.message = outcome.error_message
        return response

    async def ListTools(
        self, request: toolsproxy_pb2.ListToolsRequest, context: grpc.aio.ServicerContext
    ) -> toolsproxy_pb2.ListToolsResponse:
        specs = []
        for tool in self._executor.catalogue():
            schema = struct_pb2.Struct()
            schema.update(tool.schema)
            specs.append(
                toolsproxy_pb2.ToolSpec(
                    name=tool.name, description=tool.description, input_schema=schema
                )
            )
        return toolsproxy_pb2.ListToolsResponse(tools=specs)

    async def GetHealth(
        self, request: toolsproxy_pb2.GetHealthRequest, context: grpc.aio.ServicerContext
    ) -> toolsproxy_pb2.GetHealthResponse:
        details = await self._health.details()
        return toolsproxy_pb2.GetHealthResponse(
            status=details.pop("status", "ok"),
            service=SERVICE_NAME,
            details={**details, "tools": str(len(self._executor.catalogue()))},
        )
