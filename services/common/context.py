"""Per-request context carried across awaits: trace id and the absolute deadline."""

from __future__ import annotations

import contextvars
import random
import re
import time

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


def new_trace_id() -> str:
    """A fresh trace id (32 hex chars, the W3C trace-id size).

    Not a secret, so the Mersenne Twister does: uuid4 costs a getrandom() syscall per call.
    """
    return f"{_random.getrandbits(128):032x}"


def current_trace_id() -> str:
    return trace_id_var.get()


def remaining_seconds() -> float | None:
    """Seconds left before the current request's deadline; None when it has none."""
    deadline = deadline_var.get()
    if deadline is None:
        return None
    return deadline - time.monotonic()


def call_timeout(configured: float) -> float:
    """The timeout for an outgoing call: the configured one, clamped to the caller's remaining time.

    grpc's time_remaining() is huge when the caller set no deadline (grpc#26236); the
    interceptor stores None then, so the configured timeout applies.
    """
    left = remaining_seconds()
    if left is None:
        return configured
    return max(0.0, min(configured, left))
