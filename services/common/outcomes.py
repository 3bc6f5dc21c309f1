"""A request's outcome, the `outcome` label of a service's request metrics (docs/operations.md
§Metrics): `ok`, or the error's reason, as the caller hears it.

One rule for every service's request counter: the LLM service's `llm_requests_total{outcome}`
(and its `generate` log line) and Retrieval's `retrieval_requests_total{outcome}`.
"""

from __future__ import annotations

import asyncio

from services.common import errors
from services.common.context import remaining_seconds

OK = "ok"
CANCELLED = "CANCELLED"
INTERNAL = "INTERNAL"
DEADLINE_EXCEEDED = errors.DeadlineExceededError.default_reason
DEADLINE_SLACK_S = 0.01
"""A request that ends this close to its caller's deadline, or later, was ended by it: grpc's
timer and the service's own, set to the same instant, fire in either order."""


def deadline_passed() -> bool:
    """Whether the current request's caller's deadline has passed (DEADLINE_SLACK_S)."""
    left = remaining_seconds()
    return left is not None and left <= DEADLINE_SLACK_S


def outcome_of(failure: BaseException | None) -> str:
    """A request's outcome from what it raised (None: nothing). `ok`; DEADLINE_EXCEEDED for
    any failure once the caller's deadline has passed (what the caller was told, whichever
    timer ended the request); a ServiceError's reason; CANCELLED when the caller went away;
    INTERNAL for any other exception (the status the server answers it with)."""
    if failure is None:
        return OK
    if deadline_passed():
        return DEADLINE_EXCEEDED
    if isinstance(failure, errors.ServiceError):
        return failure.reason
    if isinstance(failure, asyncio.CancelledError):
        return CANCELLED
    return INTERNAL
