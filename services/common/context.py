"""Per-request context carried across awaits: trace id and the absolute deadline."""

from __future__ import annotations

import contextvars
import random
import re
import time

from services.common import errors

_random = random.Random()  # seeded from os.urandom once

trace_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("trace_id", default="")
deadline_var: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "deadline", default=None
)

TRACE_METADATA_KEY = "x-trace-id"


_TRACE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def valid_trace_id(value: str) -> bool:
    """True for a trace id safe to put in metadata and logs."""
    # fullmatch: `$` alone also matches before a trailing newline, which gRPC metadata refuses.
    return bool(_TRACE_ID.fullmatch(value))


def check_trace_id(value: str) -> None:
    """Refuse a trace id a caller sent that `valid_trace_id` does not take ("" is none sent):
    the caller's error, INVALID_ARGUMENT on field `trace_id`."""
    if value and not valid_trace_id(value):
        raise errors.InvalidArgumentError(
            "trace_id must be 1-128 characters of letters, digits, '.', '_', ':' or '-'",
            metadata={"field": "trace_id"},
        )


def new_trace_id() -> str:
    """A fresh trace id (32 hex chars, the W3C trace-id size).

    Not a secret, so the Mersenne Twister does: uuid4 costs a getrandom() syscall per call.
    """
    return f"{_random.getrandbits(128):032x}"


def current_trace_id() -> str:
    return trace_id_var.get()


def detached_context() -> contextvars.Context:
    """A copy of the current context without its request's deadline, for work that goes on
    past the request (a locked write its caller left, a health probe other calls share): a
    deadline that then passes must not cut it short (call_timeout would give it nothing)."""
    context = contextvars.copy_context()
    context.run(deadline_var.set, None)
    return context


def remaining_seconds() -> float | None:
    """Seconds left before the current request's deadline; None when it has none."""
    deadline = deadline_var.get()
    if deadline is None:
        return None
    return deadline - time.monotonic()


CALLER_MARGIN_S = 0.25
"""How long before the caller's deadline a call made for it is given up."""
HOP_MARGIN_SHARE = 0.1
"""A call to a mesh neighbour ends this share of the caller's time left before the caller's
deadline, CALLER_MARGIN_S at most (`call_timeout`)."""


def call_timeout(configured: float) -> float:
    """The timeout for an outgoing call to a mesh neighbour: the configured one, cut to end
    before the caller's deadline by a margin (HOP_MARGIN_SHARE of the time left, at most
    CALLER_MARGIN_S). The inner call's deadline then fires first, and this service answers
    its caller with what it makes of that (a tool error, an error naming the neighbour)
    before the caller gives up: with both deadlines at one instant (the LLM's 5 s for a tool
    call, ToolsProxy's 5 s for its search) the caller saw only its own DEADLINE_EXCEEDED.

    grpc's time_remaining() is huge when the caller set no deadline (grpc#26236); the
    interceptor stores None then, so the configured timeout applies.
    """
    left = remaining_seconds()
    if left is None:
        return configured
    return max(0.0, min(configured, before_caller(left)))


def before_caller(left: float) -> float:
    """Of `left` seconds to the caller's deadline, the time work for it may take so that its
    answer still reaches the caller: `left` less HOP_MARGIN_SHARE of it, CALLER_MARGIN_S at
    most (`call_timeout`; the LLM's tool loop)."""
    return left - min(CALLER_MARGIN_S, max(0.0, left) * HOP_MARGIN_SHARE)


DEADLINE_AT_HAND_S = 3 * CALLER_MARGIN_S
"""How near the caller's deadline a call that ran out of time ran out of the caller's: the
call's margin (`call_timeout`), the neighbour's own (it answers before the call's deadline),
and time for its answer to come back."""


def caller_out_of_time() -> bool:
    """Whether the current request's deadline is at most DEADLINE_AT_HAND_S away (or passed):
    a call made for it that ran out of time ran out of the caller's, not of its own
    configured timeout."""
    left = remaining_seconds()
    return left is not None and left <= DEADLINE_AT_HAND_S


MIN_VERDICT_S = 1.0
"""A timeout cut shorter than this by the caller's deadline says nothing about the service."""


def upstream_timeout(configured: float) -> tuple[float, bool]:
    """(timeout, says_nothing) for one call to an outside service (the bank, Tavily) made
    for the current request.

    The timeout is the configured one, cut to end CALLER_MARGIN_S before the caller's
    deadline: the call's own timeout then fires first and is reported (and counted by the
    service's breaker) before the caller gives up, which would be a cancellation, no verdict;
    with the services' timeouts (9-10 s) at or above the caller's deadline (the LLM's 10 s
    for such a tool call, or less), a service that hung would never open its breaker.
    `says_nothing` is True when the caller's deadline cut the timeout below MIN_VERDICT_S:
    a timeout then must not count against the service (a caller with tiny deadlines could
    otherwise open the breaker for everyone).
    """
    left = remaining_seconds()
    if left is None or left - CALLER_MARGIN_S >= configured:
        return configured, False
    cut = max(0.001, left - CALLER_MARGIN_S)
    return cut, cut < MIN_VERDICT_S
