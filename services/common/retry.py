"""The retry rule of outbound calls: how many attempts, how long to pause, when to stop.

`RetryPolicy` holds the numbers; `run_with_retry` runs attempts of any awaitable factory
under them. An attempt that fails in a way the rule judges raises an `AttemptFailed`
(subclassed by each client): its `retry` says whether another attempt may fix it and its
`delay` is a pause the failure itself asks for (a Retry-After), which wins over the policy's
backoff. Any other exception ends the run at once, unjudged.

After a failed attempt the run stops, re-raising that failure with `attempts` set, when the
failure may not be retried, when it was the last attempt, or when the pause would reach the
policy's deadline (elapsed + pause >= deadline_s); otherwise it calls `on_retry` (the
caller's log line) and sleeps the pause. The clock and sleep are injected so tests step time.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
F = TypeVar("F", bound="AttemptFailed")

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class RetryPolicy:
    """Attempts in all, the pause before each retry, and an optional time budget."""

    attempts: int
    """Attempts in all, the first included (1 = no retry)."""
    first_delay_s: float
    """Pause before the first retry."""
    factor: float = 1.0
    """Each further pause is this many times the one before (1 = a fixed pause)."""
    max_delay_s: float = math.inf
    """Largest pause the policy itself chooses (a failure's own delay is not capped)."""
    deadline_s: float | None = None
    """Seconds from the run's start past which no retry starts; None: no limit."""

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be at least 1, got {self.attempts}")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ValueError(f"RetryPolicy.deadline_s must be positive, got {self.deadline_s}")

    def delay(self, attempt: int) -> float:
        """The policy's pause after failed attempt number `attempt` (1-based)."""
        return min(self.max_delay_s, self.first_delay_s * self.factor ** (attempt - 1))


class AttemptFailed(Exception):
    """One attempt failed: whether another may fix it, and a pause it asks for (or None)."""

    def __init__(self, message: str, *, retry: bool, delay: float | None = None) -> None:
        super().__init__(message)
        self.retry = retry
        self.delay = delay
        self.attempts = 0
        """Set on the failure that ends a run: the attempts the run made."""


async def run_with_retry(
    attempt: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    retry_on: type[F],
    on_retry: Callable[[F, int, float], None] | None = None,
    clock: Clock = time.monotonic,
    sleep: Sleep = asyncio.sleep,
    started: float | None = None,
) -> tuple[T, int]:
    """The first successful result of `attempt()` and the attempts it took.

    Only failures of type `retry_on` are judged; the one that ends the run is re-raised
    with `attempts` set. `on_retry(failure, attempt_number, pause_s)` runs before each
    pause. The deadline counts from `started` (a `clock` reading; read at the start when
    None and the policy has a deadline); without a deadline the clock is never read.
    """
    if started is None and policy.deadline_s is not None:
        started = clock()
    number = 0
    while True:
        number += 1
        try:
            return await attempt(), number
        except retry_on as failed:
            pause = failed.delay if failed.delay is not None else policy.delay(number)
            late = _past_deadline(policy, started, clock, pause)  # one clock read per failure
            if not failed.retry or number >= policy.attempts or late:
                failed.attempts = number
                raise
            if on_retry is not None:
                on_retry(failed, number, pause)
            await sleep(pause)


def _past_deadline(policy: RetryPolicy, started: float | None, clock: Clock, pause: float) -> bool:
    if policy.deadline_s is None or started is None:
        return False
    return clock() - started + pause >= policy.deadline_s
