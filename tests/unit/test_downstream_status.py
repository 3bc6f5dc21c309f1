"""A downstream's RESOURCE_EXHAUSTED reaches the caller as one (429, slow down) only when the
downstream said so with an ErrorInfo; grpc's own, without one (a reply past this service's
receive limit), is a downstream failure: UNAVAILABLE, which a caller slowing down cannot cure.
A downstream's DEADLINE_EXCEEDED is the caller's own when its deadline is at hand."""

from __future__ import annotations

import time

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from services.common import errors
from services.common.channels import open_channel
from services.common.context import CALLER_MARGIN_S, DEADLINE_AT_HAND_S, deadline_var
from services.common.settings import DEFAULT_MAX_MESSAGE_BYTES, DownstreamSettings
from services.common.status import call_downstream, from_rpc_error

RECEIVE_LIMIT = 64 * 1024


def _rpc_error(code: grpc.StatusCode, details: str, info: error_details_pb2.ErrorInfo | None):
    trailing: tuple[tuple[str, bytes], ...] = ()
    if info is not None:
        packed = any_pb2.Any()
        packed.Pack(info)
        status = status_pb2.Status(code=code.value[0], message=details, details=[packed])
        trailing = (("grpc-status-details-bin", status.SerializeToString()),)
    return grpc.aio.AioRpcError(
        code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing), details=details
    )


def test_a_resource_exhausted_without_error_info_is_a_downstream_failure() -> None:
    err = from_rpc_error(
        _rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "Received message larger than max", None),
        "retrieval",
    )
    assert isinstance(err, errors.UnavailableError)
    assert err.code == errors.UNAVAILABLE and err.reason == "UPSTREAM_UNAVAILABLE"
    assert err.metadata == {"downstream": "retrieval", "downstream_code": "RESOURCE_EXHAUSTED"}
    assert "larger than max" not in err.message  # grpc's text stays in the log


@pytest.mark.parametrize("reason", ["RATE_LIMIT_EXCEEDED", "SERVER_BUSY"])
def test_a_resource_exhausted_the_downstream_explained_stays_one(reason: str) -> None:
    info = error_details_pb2.ErrorInfo(reason=reason, domain="visior.toolsproxy")
    err = from_rpc_error(_rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "slow down", info), "t")
    assert isinstance(err, errors.ResourceExhaustedError)
    assert err.code == errors.RESOURCE_EXHAUSTED and err.reason == reason


async def _reply_of(size: int, own_limit: int) -> bytes:
    """A reply of `size` bytes through a channel opened with the service's `own_limit`."""

    async def big(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return b"x" * size

    server = grpc.aio.server(options=[("grpc.max_send_message_length", -1)])
    handler = grpc.unary_unary_rpc_method_handler(big)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("toy.Big", {"Get": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = open_channel(DownstreamSettings(f"127.0.0.1:{port}", 10.0, 1), own_limit)
    try:
        reply: bytes = await call_downstream(channel.unary_unary("/toy.Big/Get"), b"", "toolsproxy")
        return reply
    finally:
        await channel.close()
        await server.stop(0)


@pytest.mark.parametrize("size", [RECEIVE_LIMIT * 3, DEFAULT_MAX_MESSAGE_BYTES])
async def test_a_service_holding_its_own_requests_small_still_takes_replies_up_to_the_default(
    size: int,
) -> None:
    """LLM_SERVICE_MAX_MESSAGE_BYTES at 64 KiB bounds Generate requests, not the ToolsProxy
    replies the service reads (a whole-document read is up to 200,000 bytes of text)."""
    assert len(await _reply_of(size, RECEIVE_LIMIT)) == size


async def test_a_reply_past_the_receive_limit_is_unavailable_naming_the_downstream() -> None:
    with pytest.raises(errors.ServiceError) as caught:
        await _reply_of(DEFAULT_MAX_MESSAGE_BYTES + 1, RECEIVE_LIMIT)
    assert caught.value.code == errors.UNAVAILABLE
    assert caught.value.metadata["downstream"] == "toolsproxy"
    assert caught.value.metadata["downstream_code"] == "RESOURCE_EXHAUSTED"


def _with_time_left(left: float | None, make):
    token = deadline_var.set(None if left is None else time.monotonic() + left)
    try:
        return make()
    finally:
        deadline_var.reset(token)


@pytest.mark.parametrize("info", [None, error_details_pb2.ErrorInfo(reason="DEADLINE_EXCEEDED")])
def test_a_downstream_deadline_at_the_callers_own_is_the_callers_deadline(info) -> None:
    # The call had the caller's time less the hop's margin (call_timeout): whether this
    # service's timer ended it (no ErrorInfo) or the downstream said so first, the caller's
    # deadline is what ran out, and the caller hears DEADLINE_EXCEEDED, never "unavailable".
    rpc = _rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "the caller's deadline passed", info)
    # The call's margin and the downstream's own (it answered first), or less.
    for left in (DEADLINE_AT_HAND_S, 2 * CALLER_MARGIN_S, CALLER_MARGIN_S, 0.01, -1.0):
        err = _with_time_left(left, lambda: from_rpc_error(rpc, "llm"))
        assert isinstance(err, errors.DeadlineExceededError), left
        assert err.code == errors.DEADLINE_EXCEEDED and err.reason == "DEADLINE_EXCEEDED"
        assert err.metadata == {"downstream": "llm", "downstream_code": "DEADLINE_EXCEEDED"}


@pytest.mark.parametrize("left", [None, DEADLINE_AT_HAND_S + 0.1, 60.0])
def test_a_downstream_out_of_its_own_time_is_a_downstream_failure(left) -> None:
    # The time this service gives the downstream (ORCH_LLM_TIMEOUT_SECONDS) ran out while
    # the caller still has time: the downstream failed (502). Its reason spoke of its own
    # caller's deadline, this service's, so the caller gets the downstream failure's.
    info = error_details_pb2.ErrorInfo(reason="DEADLINE_EXCEEDED")
    rpc = _rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "the caller's deadline passed", info)
    err = _with_time_left(left, lambda: from_rpc_error(rpc, "llm"))
    assert isinstance(err, errors.UnavailableError)
    assert err.code == errors.UNAVAILABLE and err.reason == "UPSTREAM_UNAVAILABLE"
    assert err.metadata == {"downstream": "llm", "downstream_code": "DEADLINE_EXCEEDED"}
    assert err.message.startswith("llm did not finish in the time this service gives it")
