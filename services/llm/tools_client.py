"""The ToolsProxy client: ToolRunner over gRPC, downstream errors turned into ServiceErrors."""

from __future__ import annotations

import math
from typing import Any

import grpc
from google.protobuf import struct_pb2
from visior.common.v1 import common_pb2
from visior.toolsproxy.v1 import toolsproxy_pb2, toolsproxy_pb2_grpc

from services.common.status import from_rpc_error
from services.common.structs import struct_to_dict
from services.llm.chat import ToolSpec
from services.llm.model import ToolResult, User


def _value(v: struct_pb2.Value) -> Any:
    kind = v.WhichOneof("kind")
    if kind == "string_value":
        return v.string_value
    if kind == "number_value":
        n = v.number_value
        if math.isinf(n) or math.isnan(n):  # as json_format refuses them
            raise ValueError(f"Fail to serialize {n} for Value.number_value")
        return int(n) if n.is_integer() and abs(n) < 2**53 else n
    if kind == "struct_value":
        return _struct(v.struct_value)
    if kind == "list_value":
        return [_value(x) for x in v.list_value.values]
    if kind == "bool_value":
        return v.bool_value
    return None  # null_value, or no kind set


def _struct(s: struct_pb2.Struct) -> dict[str, Any]:
    return {k: _value(v) for k, v in s.fields.items()}


def result_to_dict(result: struct_pb2.Value) -> Any:
    """A tool result (a protobuf Value) as its JSON value: what
    services.common.structs.struct_to_dict gives (whole-number doubles as ints), without
    json_format's generic walk."""
    return _value(result)


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
            return ToolResult("ok", result=result_to_dict(response.result))
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
