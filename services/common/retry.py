"""The retry rule of outbound calls: how many attempts, how long to pause, when to stop.

`RetryPolicy` holds the numbers; `run_with_retry` runs attempts of any awaitable factory
under them, `run_with_retry_sync` of a blocking one. An attempt that fails in a way the rule
judges raises an `AttemptFailed` (subclassed by each client): its `retry` says whether
another attempt may fix it and its `delay` is a pause the failure itself asks for (a
Retry-After), which wins over the policy's backoff. Any other exception ends the run at
once, unjudged.

After a failed attempt the run stops, re-raising that failure with `attempts` set, when the
failure may not be retried, when it asks for a pause over the policy's `max_retry_after_s`,
when it was the last attempt, or when the pause would reach the policy's deadline
(elapsed + pause >= deadline_s); otherwise it calls `on_retry` (the
caller's log line) and sleeps the pause. The clock and sleep are injected so tests step time.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar


def whole_seconds(seconds: float) -> int:
    """`seconds` for whoever counts whole seconds (a caller told to wait; libpq's
    connect_timeout and keepalives, qdrant-client's and uvicorn's timeouts): rounded up, at
    least 1, so never shorter than meant and never 0, which those libraries read as "no
    limit" ("try again in 0 s" invites a retry that is refused again)."""
    return max(1, math.ceil(seconds))


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
    max_retry_after_s: float = math.inf
    """A failure asking for a longer pause (its Retry-After) ends the run at once."""

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be at least 1, got {self.attempts}")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ValueError(f"RetryPolicy.deadline_s must be positive, got {self.deadline_s}")
        if self.first_delay_s < 0 or self.max_retry_after_s < 0:
            raise ValueError("RetryPolicy's pauses must not be negative")

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
    run = _Run(policy, clock, started, on_retry)
    while True:
        try:
            return await attempt(), run.number
        except retry_on as failed:
            await sleep(run.pause_after(failed))


def run_with_retry_sync(
    attempt: Callable[[], T],
    policy: RetryPolicy,
    *,
    retry_on: type[F],
    on_retry: Callable[[F, int, float], None] | None = None,
    clock: Clock = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    started: float | None = None,
) -> tuple[T, int]:
    """`run_with_retry` for a blocking `attempt()` (a thread's HTTP call), pausing with a
    blocking `sleep`: the same rule, the same arguments."""
    run = _Run(policy, clock, started, on_retry)
    while True:
        try:
            return attempt(), run.number
        except retry_on as failed:
            sleep(run.pause_after(failed))


class _Run(Generic[F]):
    """One run's count of attempts and its start, and the rule's judgment of a failure."""

    def __init__(
        self,
        policy: RetryPolicy,
        clock: Clock,
        started: float | None,
        on_retry: Callable[[F, int, float], None] | None,
    ) -> None:
        if started is None and policy.deadline_s is not None:
            started = clock()
        self.policy, self.clock, self.started, self.on_retry = policy, clock, started, on_retry
        self.number = 1
        """The attempt under way (1-based)."""

    def pause_after(self, failed: F) -> float:
        """The pause before the next attempt, after `on_retry`; re-raises `failed`, with
        `attempts` set, when the rule ends the run."""
        policy, number = self.policy, self.number
        asked = failed.delay
        pause = asked if asked is not None else policy.delay(number)
        too_long = asked is not None and asked > policy.max_retry_after_s
        if not failed.retry or too_long or number >= policy.attempts or self._late(pause):
            failed.attempts = number
            raise failed
        if self.on_retry is not None:
            self.on_retry(failed, number, pause)
        self.number += 1
        return pause

    def _late(self, pause: float) -> bool:
        """The pause would reach the deadline (one clock read per failure)."""
        if self.policy.deadline_s is None or self.started is None:
            return False
        return self.clock() - self.started + pause >= self.policy.deadline_s
