"""Conversion between ServiceError and google.rpc.Status with one ErrorInfo (grpc side)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from services.common import errors
from services.common.context import caller_out_of_time

log = logging.getLogger("visior.downstream")


def status_proto(err: errors.ServiceError, domain: str) -> status_pb2.Status:
    """The google.rpc.Status of a ServiceError: code, message and one ErrorInfo."""
    info = error_details_pb2.ErrorInfo(reason=err.reason, domain=domain, metadata=err.metadata)
    detail = any_pb2.Any()
    detail.Pack(info)
    return status_pb2.Status(code=err.code, message=err.message, details=[detail])


def to_status(err: errors.ServiceError, domain: str) -> grpc.Status:
    """The grpc.Status (code, message, details trailer) for a ServiceError."""
    return rpc_status.to_status(status_proto(err, domain))


def error_info(
    rpc_error: grpc.aio.AioRpcError | grpc.RpcError,
) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo of a failed call, if the server sent one."""
    try:
        status = rpc_status.from_call(rpc_error)  # type: ignore[arg-type]
    except ValueError:
        return None
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    return None


LIMIT_KEYS = ("limit", "limit_name")
"""What a downstream's limit error tells that its caller's caller is told too."""


def from_rpc_error(rpc_error: grpc.aio.AioRpcError, downstream: str) -> errors.ServiceError:
    """Turn a downstream failure into the error this service raises to its own caller.

    A downstream limit (reason ending in LIMIT_EXCEEDED) is the caller's request being
    too big: it stays a 400 with the downstream's reason and its `limit` and `limit_name`
    (not its `field`, which names the downstream's request, not the caller's). Access and
    not-found answers keep their meaning. A downstream INVALID_ARGUMENT for anything else
    means we sent a bad request: that is our bug (INTERNAL), never the caller's 400. A
    downstream RESOURCE_EXHAUSTED stays one (429, slow down) only when the downstream said so
    with an ErrorInfo (a rate limit, SERVER_BUSY); without one it is grpc's own message-size
    refusal (a reply past our receive limit, or our request past the downstream's), which a
    caller slowing down cannot cure: a downstream failure. A downstream DEADLINE_EXCEEDED
    when this request's own deadline is at hand (the call had the caller's time, less the
    hop's margin) is the caller's deadline: DEADLINE_EXCEEDED (504), as the caller would
    hear it a moment later; sooner, the call ran out of the time this service gives the
    downstream: a downstream failure.
    Everything else is a downstream failure: UNAVAILABLE (HTTP 502) with the downstream's
    reason.
    """
    code = rpc_error.code()
    info = error_info(rpc_error)
    reason = info.reason if info else ""
    meta = {"downstream": downstream, "downstream_code": code.name}
    if info is not None:
        # The downstream's own error: its message was written for callers.
        message = f"{downstream}: {rpc_error.details() or code.name}"
    else:
        # A transport-level failure: its text names internal addresses; log it, don't return it.
        log.warning(
            "downstream call failed",
            extra={"downstream": downstream, "code": code.name, "details": rpc_error.details()},
        )
        message = f"{downstream} failed: {code.name}"
    if code == grpc.StatusCode.INVALID_ARGUMENT and reason.endswith("LIMIT_EXCEEDED"):
        told = {k: info.metadata[k] for k in LIMIT_KEYS if info and k in info.metadata}
        return errors.LimitExceededError(message, reason=reason, metadata={**meta, **told})
    if code == grpc.StatusCode.NOT_FOUND:
        return errors.NotFoundError(message, reason=reason, metadata=meta)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return errors.PermissionDeniedError(message, reason=reason, metadata=meta)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and info is not None:
        return errors.ResourceExhaustedError(
            message, reason=reason or "RESOURCE_EXHAUSTED", metadata=meta
        )
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
        return errors.InternalError(
            f"{downstream} rejected our request", reason="DOWNSTREAM_REJECTED", metadata=meta
        )
    if code == grpc.StatusCode.CANCELLED:
        return errors.UnavailableError(message, reason="CANCELLED", metadata=meta)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        if caller_out_of_time():
            return errors.DeadlineExceededError(message, metadata=meta)
        # The time this service gives the downstream ran out, not the caller's. Whatever the
        # downstream said spoke of its caller's deadline: this service's, not the caller's.
        said = f": {rpc_error.details()}" if info is not None and rpc_error.details() else ""
        return errors.UnavailableError(
            f"{downstream} did not finish in the time this service gives it{said}", metadata=meta
        )
    return errors.UnavailableError(message, reason=reason, metadata=meta)


_R = TypeVar("_R")


async def call_downstream(
    rpc: Callable[..., Awaitable[_R]], request: Any, downstream: str, **kwargs: Any
) -> _R:
    """`rpc(request, **kwargs)` on a neighbour; its failure as `from_rpc_error` types it."""
    try:
        return await rpc(request, **kwargs)
    except grpc.aio.AioRpcError as exc:
        raise from_rpc_error(exc, downstream) from None
