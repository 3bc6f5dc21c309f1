"""The LLM service started before ToolsProxy: a request needing a proxy tool is a 502 while
the proxy is down (UNAVAILABLE, not the caller's INVALID_ARGUMENT), and is served as soon
as the proxy is up, without restarting the LLM service (issue 20 §4.4)."""

from __future__ import annotations

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from visior.common.v1 import common_pb2
from visior.llm.v1 import llm_pb2, llm_pb2_grpc

from services.common.settings import Env
from services.common.status import error_info
from services.common.topology import free_ports
from services.llm import app as llm_app
from services.llm.config import LlmSettings
from services.toolsproxy import app as tools_app
from services.toolsproxy.config import ToolsProxySettings


def planned_request() -> llm_pb2.GenerateRequest:
    """An S3-like request: the caller plans load_documents_full (not a built-in read tool)."""
    req = llm_pb2.GenerateRequest(
        messages=[common_pb2.ChatMessage(role="user", content="What does the guide say?")],
        user=common_pb2.UserContext(tenant_id="t1", user_id="u1"),
        tool_policy=llm_pb2.ToolPolicy(allowed_tools=["load_documents_full"], max_tool_steps=2),
        trace_id="tr-catalogue",
    )
    call = req.tool_policy.planned_calls.add(tool_name="load_documents_full")
    call.arguments.update({"doc_ids": ["guide"]})
    return req


async def requests_counted(port: int | None, outcome: str) -> float:
    """llm_requests_total{outcome} as the service's /metrics prints it."""
    assert port is not None
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "llm_requests_total" and s.labels.get("outcome") == outcome:
                return s.value
    return 0.0


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    return {
        "VISIOR_DATA_DIR": str(tmp_path),
        "LLM_SERVICE_PORT": "0",
        "MCP_PROXY_URL": f"127.0.0.1:{free_ports(1)[0]}",
        "MCP_PROXY_RETRIEVAL_URL": f"127.0.0.1:{free_ports(1)[0]}",  # not needed by these tools
        "LLM_SERVICE_METRICS_PORT": str(free_ports(1)[0]),
    }


async def test_a_planned_call_before_the_proxy_is_up_is_a_502_then_served(env):
    llm, close_llm = await llm_app.start(LlmSettings.from_env(Env(env)))
    tools = close_tools = None
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{llm.port}") as channel:
            stub = llm_pb2_grpc.LlmServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Generate(planned_request(), timeout=30)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            detail = error_info(info.value)
            assert detail is not None and detail.reason == "UPSTREAM_UNAVAILABLE"
            assert await requests_counted(llm.metrics_port, "UPSTREAM_UNAVAILABLE") == 1

            port = env["MCP_PROXY_URL"].rsplit(":", 1)[1]
            tools, close_tools = await tools_app.start(
                ToolsProxySettings.from_env(Env({**env, "MCP_PROXY_PORT": port}))
            )
            out = await stub.Generate(planned_request(), timeout=30)
            assert [t.name for t in out.tools_called] == ["load_documents_full"]
            # The proxy ran it: the document is not there, and it says so.
            assert "NOT_FOUND" in out.tools_called[0].result_summary
            assert await requests_counted(llm.metrics_port, "ok") == 1
    finally:
        if tools is not None and close_tools is not None:
            await tools.stop(0)
            await close_tools()
        await llm.stop(0)
        await close_llm()
