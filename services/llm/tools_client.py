"""The ToolsProxy client: ToolRunner over gRPC, downstream errors turned into ServiceErrors."""

from __future__ import annotations

from typing import Any

import grpc
from visior.common.v1 import common_pb2
from visior.toolsproxy.v1 import toolsproxy_pb2, toolsproxy_pb2_grpc

from services.common.status import from_rpc_error
from services.common.structs import struct_to_dict
from services.llm.chat import ToolSpec
from services.llm.model import ToolResult, User


class GrpcToolRunner:
    """Executes tools through ToolsProxyService.Execute."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = toolsproxy_pb2_grpc.ToolsProxyServiceStub(channel)

    async def execute(
        self, name: str, arguments: dict[str, Any], user: User, trace_id: str
    ) -> ToolResult:
        request = toolsproxy_pb2.ExecuteRequest(
            tool_name=name,
            user=common_pb2.UserContext(
                tenant_id=user.tenant_id, user_id=user.user_id, roles=list(user.roles)
            ),
            trace_id=trace_id,
        )
        request.arguments.update(arguments)
        try:
            response = await self._stub.Execute(request)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc, "toolsproxy") from None
        if response.status == "ok":
            return ToolResult("ok", result=struct_to_dict(response.result))
        return ToolResult(
            "error", error_code=response.error.code, error_message=response.error.message
        )

    async def list_tools(self) -> list[ToolSpec]:
        """The proxy's catalogue: names, descriptions and JSON schemas (limits included)."""
        try:
            response = await self._stub.ListTools(toolsproxy_pb2.ListToolsRequest())
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc, "toolsproxy") from None
        return [
            ToolSpec(t.name, t.description, struct_to_dict(t.input_schema)) for t in response.tools
        ]
