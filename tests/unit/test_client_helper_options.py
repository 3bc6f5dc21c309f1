"""The typed client's helpers (respond, search, execute_tool, health) take a call's own
`deadline` and `metadata` as the stubs do (docs/client.md), and pass them on."""

from __future__ import annotations

from typing import Any

import pytest
from grpclib.metadata import Deadline
from visior_sdk.visior.common.v1 import UserContext
from visior_sdk.visior.toolsproxy.v1 import ExecuteResponse

from services.client import VisiorClient


class Recording:
    """A stub of every service: each call's options, recorded."""

    def __init__(self) -> None:
        self.options: list[dict[str, Any]] = []

    async def _record(self, request: Any, **options: Any) -> Any:
        self.options.append(options)
        return request

    respond = search = _record

    async def execute(self, request: Any, **options: Any) -> ExecuteResponse:
        self.options.append(options)
        return ExecuteResponse(status="ok")

    async def get_health(self, request: Any, **options: Any) -> Any:
        self.options.append(options)
        return type("Health", (), {"status": "ok", "service": "s", "details": {}})()


@pytest.mark.parametrize("helper", ["respond", "search", "execute_tool", "health"])
async def test_each_helper_passes_a_calls_deadline_and_metadata_on(helper: str) -> None:
    visior = VisiorClient({"orchestrator": 1, "retrieval": 1, "toolsproxy": 1})
    stub = Recording()
    visior._stubs = {"orchestrator": stub, "retrieval": stub, "toolsproxy": stub}
    deadline = Deadline.from_timeout(5.0)
    options = {"timeout": 2.0, "deadline": deadline, "metadata": {"x-team": "ops"}}
    if helper == "respond":
        await visior.respond("q", "t1", "u1", **options)
    elif helper == "search":
        await visior.search("q", "t1", **options)
    elif helper == "execute_tool":
        await visior.execute_tool("read_doc_metadata", {}, UserContext(), **options)
    else:
        await visior.health("retrieval", **options)
    assert stub.options == [options]
