"""The error model: one ServiceError class per gRPC status, each carrying the spec's code as reason.

On the wire an error is a `google.rpc.Status` with exactly one `google.rpc.ErrorInfo`
whose `reason` is the spec's code string (`LLM_RUNTIME_ERROR`, `backend_unavailable`,
`INVALID_ARGUMENT`, ...). Domain code raises these; one interceptor turns them into
`abort` with the status in `grpc-status-details-bin`. Nothing here imports grpc.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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

    def __init_subclass__(
        cls, *, code: int | None = None, reason: str | None = None, **kwargs: Any
    ) -> None:
        """`class X(ServiceError, code=..., reason=...)`: the status X carries and its reason
        when the raiser names none; a subclass that names neither keeps its parent's."""
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code = code
        if reason is not None:
            cls.default_reason = reason

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reason}: {self.message})"


class InvalidArgumentError(ServiceError, code=INVALID_ARGUMENT, reason="INVALID_ARGUMENT"):
    """Bad input from the caller (HTTP 400)."""


def invalid(field_name: str, message: str) -> InvalidArgumentError:
    """INVALID_ARGUMENT naming the request field at fault (metadata ``field``)."""
    return InvalidArgumentError(message, metadata={"field": field_name})


class LimitExceededError(InvalidArgumentError, reason="LIMIT_EXCEEDED"):
    """The request asks for more than a limit allows (HTTP 400, as the specs say)."""


def limit_metadata(limit: int | float, field: str = "", name: str = "") -> dict[str, str]:
    """What every error about a limit says of it: ``limit``, the number; ``field``, the request
    field at fault where there is one; ``limit_name``, the service's name for a limit of its
    own (``max_tool_steps``, ``max_prompt_tokens``, ...) where the limit is not a field's."""
    metadata = {"field": field} if field else {}
    metadata["limit"] = f"{limit:g}" if isinstance(limit, float) else str(limit)
    if name:
        metadata["limit_name"] = name
    return metadata


def too_many(field: str, count: int, limit: int) -> LimitExceededError:
    """LIMIT_EXCEEDED for a repeated `field` holding `count` values, past `limit`."""
    return over_limit(f"{field} has {count} values; the limit is {limit}", limit, field=field)


def value_too_long(field: str, length: int, limit: int) -> LimitExceededError:
    """LIMIT_EXCEEDED for a value of `field` (one of a repeated field's, or the field's own)
    `length` characters long, past `limit`."""
    return over_limit(
        f"{field} has a value of {length} characters; the limit is {limit}", limit, field=field
    )


def over_limit(
    message: str,
    limit: int | float,
    *,
    field: str = "",
    name: str = "",
    reason: str | None = None,
    **extra: str,
) -> LimitExceededError:
    """LIMIT_EXCEEDED (or `reason`, e.g. LLM_LIMIT_EXCEEDED) with :func:`limit_metadata` and
    any `extra` metadata."""
    return LimitExceededError(
        message, reason=reason, metadata={**limit_metadata(limit, field, name), **extra}
    )


class NotFoundError(ServiceError, code=NOT_FOUND, reason="NOT_FOUND"):
    """The named thing does not exist for this tenant (HTTP 404)."""


class PermissionDeniedError(ServiceError, code=PERMISSION_DENIED, reason="ACCESS_DENIED"):
    """The caller may not touch this (HTTP 403)."""


class ResourceExhaustedError(ServiceError, code=RESOURCE_EXHAUSTED, reason="RATE_LIMIT_EXCEEDED"):
    """A rate limit or size limit of the server was hit (HTTP 429)."""


SERVER_BUSY = "SERVER_BUSY"
"""The reason of a ResourceExhaustedError a server at its concurrency cap answers
(services.common.interceptors): retry later."""
BUSY_LIMIT_NAME = "max_concurrent_rpcs"
"""The `limit_name` of that refusal: the cap it met (ServerSettings.max_concurrent_rpcs)."""
DRAINING = "DRAINING"
"""The reason of the UnavailableError of a server that has begun to stop: its own GetHealth
(services.common.interceptors) and a call still running as the grace runs out
(services.common.draining). Ask another replica, or again."""


class UnavailableError(ServiceError, code=UNAVAILABLE, reason="UPSTREAM_UNAVAILABLE"):
    """A dependency is down or failed (HTTP 502 through Envoy). The handler has already
    retried it; the status goes out marked not to be repeated (services.common.interceptors),
    and the mesh's channels do not repeat it."""


class BackendUnavailableError(UnavailableError, reason="backend_unavailable"):
    """A store Retrieval serves from (the vector index, the document store, the embedder)
    cannot answer now (retrieval.md §7.2's backend_unavailable; HTTP 502 through Envoy)."""


class DeadlineExceededError(ServiceError, code=DEADLINE_EXCEEDED, reason="DEADLINE_EXCEEDED"):
    """The caller's deadline ran out (HTTP 504)."""


class InternalError(ServiceError, code=INTERNAL, reason="INTERNAL"):
    """A bug. The message never carries internals; the log has the traceback."""


def as_service_error(exc: BaseException, trace_id: str) -> ServiceError:
    """`exc` as the caller sees it: a ServiceError as it is, anything else (a bug, logged with
    its traceback where it is caught) as a generic INTERNAL naming the call's `trace_id`,
    under which the server logged it."""
    if isinstance(exc, ServiceError):
        return exc
    return InternalError(f"internal error; the server log has it under trace_id {trace_id}")
