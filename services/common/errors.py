"""The error model: one ServiceError class per gRPC status, each carrying the spec's code as reason.

On the wire an error is a `google.rpc.Status` with exactly one `google.rpc.ErrorInfo`
whose `reason` is the spec's code string (`LLM_RUNTIME_ERROR`, `backend_unavailable`,
`INVALID_ARGUMENT`, ...). Domain code raises these; one interceptor turns them into
`abort` with the status in `grpc-status-details-bin`. Nothing here imports grpc.
"""

from __future__ import annotations

from collections.abc import Mapping

# gRPC status codes by number (google.rpc.Code), so domain code needs no grpc import.
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
INTERNAL = 13
UNAVAILABLE = 14


class ServiceError(Exception):
    """An error a caller can see: gRPC code + ErrorInfo reason + metadata."""

    code: int = INTERNAL
    default_reason: str = "INTERNAL"

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason
        self.metadata: dict[str, str] = dict(metadata or {})

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reason}: {self.message})"


class InvalidArgumentError(ServiceError):
    """Bad input from the caller (HTTP 400)."""

    code = INVALID_ARGUMENT
    default_reason = "INVALID_ARGUMENT"


class LimitExceededError(InvalidArgumentError):
    """The request asks for more than a limit allows (HTTP 400, as the specs say)."""

    code = INVALID_ARGUMENT
    default_reason = "LIMIT_EXCEEDED"


class NotFoundError(ServiceError):
    """The named thing does not exist for this tenant (HTTP 404)."""

    code = NOT_FOUND
    default_reason = "NOT_FOUND"


class PermissionDeniedError(ServiceError):
    """The caller may not touch this (HTTP 403)."""

    code = PERMISSION_DENIED
    default_reason = "ACCESS_DENIED"


class ResourceExhaustedError(ServiceError):
    """A rate limit or size limit of the server was hit (HTTP 429)."""

    code = RESOURCE_EXHAUSTED
    default_reason = "RATE_LIMIT_EXCEEDED"


class UnavailableError(ServiceError):
    """A dependency is down or failed (HTTP 502 through Envoy). Safe to retry."""

    code = UNAVAILABLE
    default_reason = "UPSTREAM_UNAVAILABLE"


class DeadlineExceededError(ServiceError):
    """The caller's deadline ran out (HTTP 504)."""

    code = DEADLINE_EXCEEDED
    default_reason = "DEADLINE_EXCEEDED"


class InternalError(ServiceError):
    """A bug. The message never carries internals; the log has the traceback."""

    code = INTERNAL
    default_reason = "INTERNAL"
