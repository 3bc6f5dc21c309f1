"""Per-tool deadlines of the LLM's tool calls: the setting and the deadline sent to ToolsProxy."""

from __future__ import annotations

from typing import Any

import pytest
from visior.toolsproxy.v1 import toolsproxy_pb2

from services.common.settings import Env, SettingsError
from services.common.tool_contract import EXTERNAL_TOOLS
from services.llm.config import LlmSettings
from services.llm.model import ToolRequest, User
from services.llm.tools_client import GrpcToolRunner


def test_external_tool_deadline_defaults_to_ten_seconds_and_documents_keep_five() -> None:
    s = LlmSettings.from_env(Env({}))
    assert s.loop.external_tool_timeout_s == 10.0
    assert s.tools_proxy.timeout_seconds == 5.0
    assert EXTERNAL_TOOLS == {"fetch_cbr_data", "fetch_finance_news"}


def test_external_tool_deadline_from_the_environment() -> None:
    env = Env({"LLM_SERVICE_EXTERNAL_TOOL_TIMEOUT_S": "8.5"})
    assert LlmSettings.from_env(env).loop.external_tool_timeout_s == 8.5


@pytest.mark.parametrize("raw", ["0", "-1", "ten"])
def test_a_bad_external_tool_deadline_is_refused(raw: str) -> None:
    with pytest.raises(SettingsError):
        LlmSettings.from_env(Env({"LLM_SERVICE_EXTERNAL_TOOL_TIMEOUT_S": raw}))


class _Stub:
    def __init__(self) -> None:
        self.timeouts: list[Any] = []

    async def Execute(  # the gRPC method's name; its deadline arrives as `timeout`
        self,
        request: toolsproxy_pb2.ExecuteRequest,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> toolsproxy_pb2.ExecuteResponse:
        self.timeouts.append(timeout)
        response = toolsproxy_pb2.ExecuteResponse(status="ok")
        response.result.string_value = "x"
        return response


@pytest.mark.parametrize("deadline", [9.75, None])
async def test_the_runner_sends_the_calls_deadline(deadline: float | None) -> None:
    runner = GrpcToolRunner.__new__(GrpcToolRunner)
    stub = _Stub()
    runner._stub = stub  # type: ignore[assignment]
    request = ToolRequest("fetch_finance_news", {"query": "q"}, User("t1", "u1"), "tr")
    result = await runner.execute(request, timeout_s=deadline)
    assert result.status == "ok"
    assert stub.timeouts == [deadline]  # None: the channel's default deadline applies
