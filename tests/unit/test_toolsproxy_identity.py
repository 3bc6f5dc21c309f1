"""ToolsProxy runs a tool for a tenant and a user: both ids are required (docs/architecture.md §16)."""

from __future__ import annotations

import pytest
from visior.common.v1 import common_pb2
from visior.toolsproxy.v1 import toolsproxy_pb2

from services.common import errors
from services.toolsproxy.servicer import ToolsProxyServicer, caller_from


class NoExecutor:
    """Fails the test if a request without identity reaches the tools."""

    async def execute(self, *args, **kwargs):
        raise AssertionError("the request reached the tools")


@pytest.mark.parametrize(
    ("tenant_id", "user_id", "field"),
    [("", "u", "user.tenant_id"), ("t", "", "user.user_id"), ("t", " \t", "user.user_id")],
)
async def test_a_missing_id_is_refused_before_any_tool_runs(tenant_id, user_id, field):
    servicer = ToolsProxyServicer(NoExecutor())  # type: ignore[arg-type]
    request = toolsproxy_pb2.ExecuteRequest(
        tool_name="read_doc_metadata",
        user=common_pb2.UserContext(tenant_id=tenant_id, user_id=user_id),
    )
    with pytest.raises(errors.InvalidArgumentError) as info:
        await servicer.Execute(request, None)  # type: ignore[arg-type]
    assert info.value.reason == "MISSING_USER_CONTEXT"
    assert info.value.metadata["field"] == field


def test_both_ids_make_the_caller():
    caller = caller_from(common_pb2.UserContext(tenant_id="t", user_id="u"), "tr")
    assert (caller.tenant_id, caller.user_id, caller.trace_id) == ("t", "u", "tr")
