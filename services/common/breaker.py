"""A circuit breaker: after N consecutive failures stop calling a dependency for a while.

A call let through the breaker ends with one verdict on the dependency (`settle`): it
answered (a refusal of the request included), it is out (unreachable, timed out, failing),
or the call says nothing about it (the caller's deadline or cancellation ended it). An
exception states its verdict in a `breaker_verdict` attribute; a cancellation has none to
give; any other exception is an outage, so that a failure nobody classified never leaves a
half-open trial hanging.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from services.common.retry import whole_seconds

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"

ANSWERED = "answered"
"""The dependency answered, if only to refuse the request: it is up."""
OUTAGE = "outage"
"""The dependency failed: counts towards opening the breaker."""
NO_VERDICT = "no_verdict"
"""The call ended without a word on the dependency: the count stays, a trial is freed."""


def verdict_of(failure: BaseException | None) -> str:
    """The verdict on the dependency of a call that ended with `failure` (None: it returned)."""
    if failure is None:
        return ANSWERED
    verdict = getattr(failure, "breaker_verdict", None)
    if verdict is not None:
        return str(verdict)
    if isinstance(failure, asyncio.CancelledError):
        return NO_VERDICT
    return OUTAGE


class CircuitOpenError(Exception):
    """The breaker is open: the dependency failed recently and is not being called."""

    def __init__(self, name: str, retry_in: float) -> None:
        self.name = name
        self.retry_in = retry_in
        super().__init__(
            f"{name} is unavailable (circuit open, next try in {self.retry_after_s} s)"
        )

    @property
    def retry_after_s(self) -> int:
        """The whole seconds a caller is told to wait: `retry_in` rounded up, at least 1 (while
        a half-open trial runs `retry_in` is 0, and "try again in 0 s" invites a retry that
        is refused again)."""
        return whole_seconds(self.retry_in)


@dataclass(frozen=True)
class BreakerPolicy:
    """When a circuit breaker opens and how long it stays open; each client's settings hold one."""

    failures: int = 5
    """Consecutive failed calls that open the breaker (at least 1)."""
    reset_s: float = 10.0
    """How long the open breaker refuses calls before one trial call."""

    def __post_init__(self) -> None:
        if self.failures < 1:
            raise ValueError(f"BreakerPolicy.failures must be at least 1, got {self.failures}")
        if self.reset_s < 0:
            raise ValueError(f"BreakerPolicy.reset_s must not be negative, got {self.reset_s}")


class CircuitBreaker:
    """Closed -> open after `policy.failures` consecutive failures; after `policy.reset_s`
    one trial call goes through (half-open): success closes it, failure opens it again.

    Thread-safe (the retrieval engine calls it from worker threads). The clock is injected so
    tests step time instead of sleeping.
    """

    def __init__(
        self,
        name: str,
        policy: BreakerPolicy = BreakerPolicy(),
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._threshold = policy.failures
        self._reset_after = policy.reset_s
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = 0
        self._opened_at: float | None = None
        self._trial_running = False

    @property
    def state(self) -> str:
        with self._lock:
            return self._state()

    def _state(self) -> str:
        if self._opened_at is None:
            return CLOSED
        if self._clock() - self._opened_at >= self._reset_after:
            return HALF_OPEN
        return OPEN

    def before_call(self) -> None:
        """Raise CircuitOpenError unless a call may go through now."""
        with self._lock:
            state = self._state()
            if state == CLOSED:
                return
            if state == HALF_OPEN and not self._trial_running:
                self._trial_running = True
                return
            assert self._opened_at is not None
            retry_in = max(0.0, self._opened_at + self._reset_after - self._clock())
            raise CircuitOpenError(self.name, retry_in)

    def record_success(self) -> None:
        with self._lock:
            self._failures = 0
            self._opened_at = None
            self._trial_running = False

    def release(self) -> None:
        """A call ended without a verdict on the dependency (its caller cancelled it): the
        failure count stays, but a half-open trial is freed for the next call."""
        with self._lock:
            self._trial_running = False

    def record_failure(self) -> None:
        with self._lock:
            self._trial_running = False
            self._failures += 1
            if self._opened_at is not None or self._failures >= self._threshold:
                self._opened_at = self._clock()

    def settle(self, failure: BaseException | None) -> None:
        """End a call `before_call` let through, by the verdict its ending gives (`verdict_of`)."""
        verdict = verdict_of(failure)
        if verdict == ANSWERED:
            self.record_success()
        elif verdict == NO_VERDICT:
            self.release()
        else:
            self.record_failure()

    def trial(self) -> _Trial:
        """`with breaker.trial(): ...`: one call through the breaker. Entering raises
        CircuitOpenError when no call may go now; leaving settles the call by how the block
        ended. Works around awaits and in worker threads alike."""
        return _Trial(self)


class _Trial:
    __slots__ = ("_breaker",)

    def __init__(self, breaker: CircuitBreaker) -> None:
        self._breaker = breaker

    def __enter__(self) -> None:
        self._breaker.before_call()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        failure: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._breaker.settle(failure)
