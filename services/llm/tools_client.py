"""The ToolsProxy client: ToolRunner over gRPC (downstream errors turned into ServiceErrors) and
the tool catalogue the loop offers, kept current."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol

import grpc
from google.protobuf import struct_pb2
from visior.common.v1 import common_pb2
from visior.toolsproxy.v1 import toolsproxy_pb2, toolsproxy_pb2_grpc

from services.common import errors
from services.common.status import from_rpc_error
from services.common.structs import json_number, struct_to_dict
from services.llm.model import ToolRequest, ToolResult
from services.model_runtime.chat import ToolSpec

log = logging.getLogger("visior.llm")


def _value(v: struct_pb2.Value) -> Any:
    kind = v.WhichOneof("kind")
    if kind == "string_value":
        return v.string_value
    if kind == "number_value":
        n = v.number_value
        if math.isinf(n) or math.isnan(n):  # as json_format refuses them
            raise ValueError(f"Fail to serialize {n} for Value.number_value")
        return json_number(n)
    if kind == "struct_value":
        return _struct(v.struct_value)
    if kind == "list_value":
        return [_value(x) for x in v.list_value.values]
    if kind == "bool_value":
        return v.bool_value
    return None  # null_value, or no kind set


def _struct(s: struct_pb2.Struct) -> dict[str, Any]:
    # Sorted: a Struct's map comes out in an order that changes from process to process, and
    # the result is rendered into the model's prompt, which must be the same every time.
    fields = s.fields
    return {k: _value(fields[k]) for k in sorted(fields)}


def result_to_dict(result: struct_pb2.Value) -> Any:
    """A tool result (a protobuf Value) as its JSON value: what
    services.common.structs.struct_to_dict gives (whole-number doubles as ints), without
    json_format's generic walk."""
    return _value(result)


class GrpcToolRunner:
    """Executes tools through ToolsProxyService.Execute."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = toolsproxy_pb2_grpc.ToolsProxyServiceStub(channel)

    async def execute(self, request: ToolRequest, *, timeout_s: float | None = None) -> ToolResult:
        """One tool call; `timeout_s` is its deadline (None: the channel's default), cut
        to the caller's own remaining time by the channel."""
        user = request.user
        message = toolsproxy_pb2.ExecuteRequest(
            tool_name=request.name,
            user=common_pb2.UserContext(
                tenant_id=user.tenant_id, user_id=user.user_id, roles=list(user.roles)
            ),
            trace_id=request.trace_id,
        )
        message.arguments.update(request.arguments)
        try:
            response = await self._stub.Execute(message, timeout=timeout_s)
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


class CatalogueSource(Protocol):
    """Where the catalogue comes from (GrpcToolRunner.list_tools)."""

    async def list_tools(self) -> list[ToolSpec]: ...


class ToolCatalogue:
    """The tools the loop may offer, as ToolsProxy lists them (schemas with their limits).

    Until ToolsProxy first answers, the loop has the built-in read-tool schemas only. A
    request that needs a tool the catalogue lacks (allowed, or planned by the caller) asks
    ToolsProxy again first, so a proxy that came up after this service, or restarted with
    more tools, is seen at once; once the proxy has answered, at most every `refresh_s` (a
    tool it does not offer stays unoffered until then). Requests waiting meanwhile share
    that one answer. If ToolsProxy has never answered and still cannot be reached, such a
    request fails as a missing dependency: UnavailableError (UPSTREAM_UNAVAILABLE, HTTP
    502), never the caller's INVALID_ARGUMENT.
    """

    def __init__(
        self,
        source: CatalogueSource,
        on_load: Callable[[Sequence[ToolSpec]], None],
        initial: Sequence[ToolSpec],
        *,
        refresh_s: float = 60.0,
        retry_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._source = source
        self._on_load = on_load
        self._names = frozenset(t.name for t in initial)
        self.refresh_s = refresh_s
        self.retry_s = retry_s
        self._clock = clock
        self._lock = asyncio.Lock()
        self._loaded_at: float | None = None
        self._failure: errors.ServiceError | None = None
        self._attempts = 0

    @property
    def loaded(self) -> bool:
        """Whether ToolsProxy has answered at least once."""
        return self._loaded_at is not None

    @property
    def names(self) -> frozenset[str]:
        return self._names

    def _fresh(self) -> bool:
        return self._loaded_at is not None and self._clock() - self._loaded_at < self.refresh_s

    async def load(self) -> None:
        """Ask ToolsProxy for its catalogue and hand it to the loop; raises its ServiceError."""
        async with self._lock:
            await self._load()

    async def _load(self) -> None:
        try:
            specs = await self._source.list_tools()
        except errors.ServiceError as exc:
            self._failure = exc
            raise
        finally:
            self._attempts += 1
        names = frozenset(t.name for t in specs)
        if names != self._names or not self.loaded:
            log.info("tool catalogue loaded", extra={"tools": sorted(names)})
        self._on_load(specs)
        self._names = names
        self._loaded_at, self._failure = self._clock(), None

    async def require(self, names: Collection[str]) -> None:
        """Make sure the catalogue is current for a request that needs `names`."""
        if not set(names) - self._names or self._fresh():
            return
        seen = self._attempts
        async with self._lock:
            if self._attempts == seen:  # no answer came while this request waited: ask
                with contextlib.suppress(errors.ServiceError):
                    await self._load()
        missing = set(names) - self._names
        if not missing or self.loaded:
            return  # a tool the proxy does not offer is not offered (a planned one: 400)
        cause = self._failure.message if self._failure is not None else "no answer"
        raise errors.UnavailableError(
            f"toolsproxy: the tool catalogue is not available ({cause}); "
            f"needed: {', '.join(sorted(missing))}",
            metadata={"downstream": "toolsproxy", "tools": ",".join(sorted(missing))},
        )

    async def keep_loaded(self) -> None:
        """Load at start (every `retry_s` until ToolsProxy answers), then every `refresh_s`."""
        while True:
            try:
                await self.load()
            except errors.ServiceError as exc:
                log.info("tool catalogue not available yet", extra={"error": exc.message})
                await asyncio.sleep(self.retry_s)
                continue
            await asyncio.sleep(self.refresh_s)
