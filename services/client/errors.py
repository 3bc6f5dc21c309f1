"""Typed errors of the client: one class per gRPC status, each carrying the server's ErrorInfo.

The servers send a `google.rpc.Status` with exactly one `google.rpc.ErrorInfo` in the
`grpc-status-details-bin` trailer. grpclib decodes that trailer into `GRPCError.details`
with its `ProtoStatusDetailsCodec` (googleapis-common-protos), resolving each `Any` through
the protobuf symbol database: importing `error_details_pb2` here registers `ErrorInfo`, so
the details arrive as real `ErrorInfo` messages instead of grpclib's `Unknown(...)`.

These are deliberately not `services.common.errors.ServiceError`s: a service that calls
another must decide what a downstream failure means for its own caller (a downstream
INVALID_ARGUMENT is never passed on as its own: docs/architecture.md §12), so nothing here
maps itself onto a server error automatically.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.rpc import error_details_pb2  # registers google.rpc.ErrorInfo for grpclib
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

from services.common.errors import BUSY_LIMIT_NAME, SERVER_BUSY


class VisiorRpcError(Exception):
    """A failed call: the gRPC status, the server's message and its ErrorInfo (reason, domain)."""

    status: Status = Status.UNKNOWN
    """The gRPC status; fixed per subclass, set per instance on the base class."""

    def __init__(
        self,
        message: str,
        *,
        status: Status | None = None,
        error_info: error_details_pb2.ErrorInfo | None = None,
        details: Sequence[Any] = (),
        handler_may_have_run: bool = False,
        trace_id: str = "",
    ) -> None:
        super().__init__(message)
        self.trace_id = trace_id
        """The `x-trace-id` the call was sent with (VisiorClient sets it on every failure of a
        call): the id the server logged it under, e.g. for an INTERNAL's traceback."""
        self.handler_may_have_run = handler_may_have_run
        """True when the connection was lost after the request went out, with no status
        (grpclib's StreamTerminatedError): the server may have handled the call."""
        if status is not None:
            self.status = status
        self.message = message
        """The status message as the server wrote it (for people, not for branching)."""
        self.error_info = error_info
        """The server's ErrorInfo, or None when it sent none (e.g. a proxy or a local failure)."""
        self.details = list(details)
        """Every decoded status detail, ErrorInfo included."""

    @property
    def retryable(self) -> bool:
        """Whether repeating the call is safe because no handler ran: an UNAVAILABLE without
        ErrorInfo that is not a connection lost after the request was sent (grpclib's
        StreamTerminatedError: the handler may have run), or the server's own SERVER_BUSY
        refusal at its concurrency cap, which wants a backoff before the repeat.

        Every error a handler raises carries an ErrorInfo (services.common.status.to_status),
        so an UNAVAILABLE status without one came from the transport (no connection, the
        server shutting down, a proxy): the call never reached a handler. A handler's own
        UNAVAILABLE (e.g. LLM_RUNTIME_ERROR after the runtime timed out) means it ran and
        already retried its dependency; the server marks it not to be repeated
        (grpc-retry-pushback-ms -1, services.common.interceptors), which grpclib does not
        expose, so its ErrorInfo is the signal.
        """
        return self._transport_failure() or self._refused_busy()

    def _transport_failure(self) -> bool:
        """An UNAVAILABLE the transport produced before any handler ran."""
        return (
            self.status == Status.UNAVAILABLE
            and self.error_info is None
            and not self.handler_may_have_run
        )

    def _refused_busy(self) -> bool:
        """RESOURCE_EXHAUSTED SERVER_BUSY from the called server's interceptor (limit_name
        BUSY_LIMIT_NAME), refused before its handler ran. A SERVER_BUSY a service passes on
        from a neighbour (metadata `downstream`, services.common.status.from_rpc_error; the
        LLM service's tool loop) comes from a handler that ran: not this."""
        return (
            self.status == Status.RESOURCE_EXHAUSTED
            and self.reason == SERVER_BUSY
            and self.metadata.get("limit_name") == BUSY_LIMIT_NAME
            and "downstream" not in self.metadata
        )

    @property
    def code(self) -> int:
        """The numeric gRPC status code (3 for INVALID_ARGUMENT, ...)."""
        return int(self.status.value)

    @property
    def reason(self) -> str:
        """ErrorInfo.reason (e.g. LIMIT_EXCEEDED, ACCESS_DENIED); the status name when absent."""
        return self.error_info.reason if self.error_info else self.status.name

    @property
    def domain(self) -> str:
        """ErrorInfo.domain, the service that produced the error (e.g. visior.retrieval)."""
        return self.error_info.domain if self.error_info else ""

    @property
    def metadata(self) -> dict[str, str]:
        """ErrorInfo.metadata (e.g. downstream, limit), sorted by key: a protobuf map has no
        order on the wire, and the same error should print the same."""
        return dict(sorted(self.error_info.metadata.items())) if self.error_info else {}

    def __str__(self) -> str:
        return f"{self.status.name} {self.reason}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status.name}, {self.reason!r}, {self.message!r})"


class Cancelled(VisiorRpcError):
    """The call was cancelled."""

    status = Status.CANCELLED


class UnknownError(VisiorRpcError):
    """The server failed without saying why."""

    status = Status.UNKNOWN


class InvalidArgument(VisiorRpcError):
    """The request is malformed or over a limit (reason INVALID_ARGUMENT, LIMIT_EXCEEDED, ...)."""

    status = Status.INVALID_ARGUMENT


class DeadlineExceeded(VisiorRpcError):
    """The deadline ran out, on the client or on the server."""

    status = Status.DEADLINE_EXCEEDED


class NotFound(VisiorRpcError):
    """The named thing does not exist for this tenant."""

    status = Status.NOT_FOUND


class AlreadyExists(VisiorRpcError):
    """The thing to create exists already."""

    status = Status.ALREADY_EXISTS


class PermissionDenied(VisiorRpcError):
    """The caller may not do this (reason ACCESS_DENIED, ...)."""

    status = Status.PERMISSION_DENIED


class ResourceExhausted(VisiorRpcError):
    """A rate or size limit of the server was hit; `retryable` (after a backoff) when it is
    the server's own SERVER_BUSY refusal at its concurrency cap."""

    status = Status.RESOURCE_EXHAUSTED


class FailedPrecondition(VisiorRpcError):
    """The system is not in a state to do this."""

    status = Status.FAILED_PRECONDITION


class Aborted(VisiorRpcError):
    """The call was aborted, typically by a concurrency conflict."""

    status = Status.ABORTED


class OutOfRange(VisiorRpcError):
    """A value is past the valid range."""

    status = Status.OUT_OF_RANGE


class Unimplemented(VisiorRpcError):
    """The server does not implement this RPC."""

    status = Status.UNIMPLEMENTED


class Internal(VisiorRpcError):
    """A bug on the server; its log has the traceback for the trace id."""

    status = Status.INTERNAL


class Unavailable(VisiorRpcError):
    """The service or one of its dependencies is down; `retryable` when no handler ran."""

    status = Status.UNAVAILABLE


class DataLoss(VisiorRpcError):
    """Unrecoverable data loss or corruption."""

    status = Status.DATA_LOSS


class Unauthenticated(VisiorRpcError):
    """The caller has no valid credentials."""

    status = Status.UNAUTHENTICATED


_BY_STATUS: dict[Status, type[VisiorRpcError]] = {
    cls.status: cls
    for cls in (
        Cancelled,
        UnknownError,
        InvalidArgument,
        DeadlineExceeded,
        NotFound,
        AlreadyExists,
        PermissionDenied,
        ResourceExhausted,
        FailedPrecondition,
        Aborted,
        OutOfRange,
        Unimplemented,
        Internal,
        Unavailable,
        DataLoss,
        Unauthenticated,
    )
}


def error_class_for_status(status: Status) -> type[VisiorRpcError]:
    """The exception class for a gRPC status (VisiorRpcError itself for OK, which never fails)."""
    return _BY_STATUS.get(status, VisiorRpcError)


def from_grpc_error(err: GRPCError) -> VisiorRpcError:
    """The typed error for a grpclib GRPCError, with the ErrorInfo from its decoded details."""
    details = list(err.details or ())
    info = next((d for d in details if isinstance(d, error_details_pb2.ErrorInfo)), None)
    cls = error_class_for_status(err.status)
    return cls(err.message or err.status.name, status=err.status, error_info=info, details=details)


def from_exception(exc: BaseException) -> VisiorRpcError | None:
    """The typed error for what grpclib raises during a call, or None if it is not an RPC failure.

    grpclib reports a client-side deadline as `asyncio.TimeoutError` and a refused or
    dropped connection as `OSError` / `StreamTerminatedError`; callers should not have to
    know that, so they become DeadlineExceeded and Unavailable. A stream terminated after the
    request went out is not `retryable`: the handler may have run.
    """
    if isinstance(exc, GRPCError):
        return from_grpc_error(exc)
    if isinstance(exc, TimeoutError):  # asyncio.TimeoutError is TimeoutError since 3.11
        return DeadlineExceeded(str(exc) or "deadline exceeded")
    if isinstance(exc, StreamTerminatedError):
        return Unavailable(f"{type(exc).__name__}: {exc}", handler_may_have_run=True)
    if isinstance(exc, OSError):
        return Unavailable(f"{type(exc).__name__}: {exc}")
    return None
