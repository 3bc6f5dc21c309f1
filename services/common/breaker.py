"""A circuit breaker: after N consecutive failures stop calling a dependency for a while.

A call let through the breaker ends with one verdict on the dependency (`settle`): it
answered (a refusal of the request included), it is out (unreachable, timed out, failing),
or the call says nothing about it (the caller's deadline or cancellation ended it). An
exception states its verdict in a `breaker_verdict` attribute; a cancellation has none to
give; any other exception is an outage, so that a failure nobody classified never leaves a
half-open trial hanging.

A timeout (the verdict TIMEOUT, or a TimeoutError nobody classified) is an outage, unless this
process itself stood still for STALL_S or more while the call ran (services/common/loop_lag.py:
CPU starvation, a long GC, a VM pause): the answer may have been waiting unread, so it is no
verdict.

A verdict counts only while it still speaks for the breaker's state: `before_call` hands each
call a Ticket, and the verdict of a call admitted before the breaker last opened or closed
(a straggler) changes nothing. Only the half-open trial's own verdict closes the breaker,
opens it again or frees the trial.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from services.common.loop_lag import PROCESS_STALLS, STALL_S, StallWatch
from services.common.retry import whole_seconds

log = logging.getLogger(__name__)

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"

ANSWERED = "answered"
"""The dependency answered, if only to refuse the request: it is up."""
OUTAGE = "outage"
"""The dependency failed: counts towards opening the breaker."""
NO_VERDICT = "no_verdict"
"""The call ended without a word on the dependency: the count stays, a trial is freed."""
TIMEOUT = "timeout"
"""The dependency did not answer in time: an OUTAGE, or NO_VERDICT when this process itself
stood still for STALL_S or more during the call (`CircuitBreaker.settle`)."""


def verdict_of(failure: BaseException | None) -> str:
    """The verdict on the dependency of a call that ended with `failure` (None: it returned)."""
    if failure is None:
        return ANSWERED
    verdict = getattr(failure, "breaker_verdict", None)
    if verdict is not None:
        return str(verdict)
    if isinstance(failure, asyncio.CancelledError):
        return NO_VERDICT
    if isinstance(failure, TimeoutError):
        return TIMEOUT
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


class Ticket:
    """One call `before_call` let through, handed back with its verdict: it tells the trial
    from a straggler admitted before the breaker last opened or closed, whose verdict no
    longer speaks for the breaker's state."""

    __slots__ = ("generation", "stalled")

    def __init__(self, generation: int, stalled: float = 0.0) -> None:
        self.generation = generation
        """The breaker's state changes (openings and closings) before the call was let in."""
        self.stalled = stalled
        """The process's stall so far when the call was let in (`StallWatch.stalled_total`)."""


class CircuitBreaker:
    """Closed -> open after `policy.failures` consecutive failures; after `policy.reset_s`
    one trial call goes through (half-open): success closes it, failure opens it again.

    The verdict methods (`settle`, `record_success`, `record_failure`, `release`) take the
    Ticket `before_call` returned; a call whose breaker has opened or closed since it was let
    in is a straggler and its verdict is ignored. Without a ticket a verdict is taken as the
    running trial's (or, closed, the latest call's): right only for a caller that never has
    two calls in flight.

    Thread-safe (the retrieval engine calls it from worker threads). The clock and the watch
    of the process's stalls (`stalls`, loop_lag.PROCESS_STALLS unless a test injects one) are
    injected so tests step time instead of sleeping.
    """

    def __init__(
        self,
        name: str,
        policy: BreakerPolicy = BreakerPolicy(),
        *,
        clock: Callable[[], float] = time.monotonic,
        stalls: StallWatch = PROCESS_STALLS,
    ) -> None:
        self.name = name
        self._stalls = stalls
        self._threshold = policy.failures
        self._reset_after = policy.reset_s
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = 0
        self._opened_at: float | None = None
        self._generation = 0
        """Openings and closings so far: a Ticket of an earlier one is a straggler's."""
        self._trial: Ticket | None = None
        """The running half-open trial's ticket; None when no trial runs."""

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

    def before_call(self) -> Ticket:
        """The Ticket of a call that may go through now; CircuitOpenError when none may. The
        first call in an event loop starts the loop's heartbeat (`StallWatch.watch`)."""
        self._stalls.watch()
        stalled = self._stalls.stalled_total()
        with self._lock:
            state = self._state()
            if state == CLOSED:
                return Ticket(self._generation, stalled)
            if state == HALF_OPEN and self._trial is None:
                self._trial = Ticket(self._generation, stalled)
                return self._trial
            assert self._opened_at is not None
            retry_in = max(0.0, self._opened_at + self._reset_after - self._clock())
            raise CircuitOpenError(self.name, retry_in)

    def record_success(self, ticket: Ticket | None = None) -> None:
        """The call answered: the failure count restarts, and the trial's answer closes the
        breaker. A straggler's answer changes nothing."""
        with self._lock:
            if not self._speaks(ticket):
                return
            self._failures = 0
            if self._opened_at is not None:
                self._change(opened_at=None)

    def release(self, ticket: Ticket | None = None) -> None:
        """A call ended without a verdict on the dependency (its caller cancelled it): the
        failure count stays, but a half-open trial is freed for the next call."""
        with self._lock:
            if ticket is None or ticket is self._trial:
                self._trial = None

    def record_failure(self, ticket: Ticket | None = None) -> None:
        """The call found the dependency out: one more failure, and the breaker opens at the
        threshold, or again when it was the trial. A straggler's failure changes nothing."""
        with self._lock:
            if not self._speaks(ticket):
                return
            self._failures += 1
            if self._opened_at is not None or self._failures >= self._threshold:
                self._change(opened_at=self._clock())

    def _speaks(self, ticket: Ticket | None) -> bool:
        """The verdict of the call holding `ticket` speaks for the breaker's state: it is the
        running trial's, or a call's let in while closed since the last change; a verdict
        without a ticket is taken as one that does."""
        if ticket is None or ticket is self._trial:
            return True
        return self._opened_at is None and ticket.generation == self._generation

    def _change(self, *, opened_at: float | None) -> None:
        """Open (at `opened_at`) or close the breaker: the running trial ends, and the calls
        let in before become stragglers."""
        self._opened_at = opened_at
        self._trial = None
        self._generation += 1

    def settle(self, failure: BaseException | None, ticket: Ticket | None = None) -> None:
        """End the call `before_call` let through with `ticket`, by the verdict its ending
        gives (`verdict_of`); a TIMEOUT is judged by `_timeout_verdict`."""
        verdict = verdict_of(failure)
        if verdict == TIMEOUT:
            verdict = self._timeout_verdict(ticket)
        if verdict == ANSWERED:
            self.record_success(ticket)
        elif verdict == NO_VERDICT:
            self.release(ticket)
        else:
            self.record_failure(ticket)

    def _timeout_verdict(self, ticket: Ticket | None) -> str:
        """A timeout is an OUTAGE, unless the process stood still for STALL_S or more since
        the call holding `ticket` was let in: then NO_VERDICT (without a ticket the call's
        start is unknown, and the timeout counts)."""
        if ticket is None:
            return OUTAGE
        stalled = self._stalls.stalled_since(ticket.stalled)
        if stalled < STALL_S:
            return OUTAGE
        log.warning(
            "a call timed out while this process stood still: no verdict on the dependency",
            extra={"breaker": self.name, "stalled_s": round(stalled, 3)},
        )
        return NO_VERDICT

    def trial(self) -> _Trial:
        """`with breaker.trial(): ...`: one call through the breaker. Entering raises
        CircuitOpenError when no call may go now; leaving settles the call by how the block
        ended. Works around awaits and in worker threads alike."""
        return _Trial(self)


class _Trial:
    """`CircuitBreaker.trial`'s context manager: it keeps its call's Ticket, so that the
    call's ending is settled as that call's and a straggler's changes nothing."""

    __slots__ = ("_breaker", "_ticket")

    def __init__(self, breaker: CircuitBreaker) -> None:
        self._breaker = breaker
        self._ticket: Ticket | None = None

    def __enter__(self) -> None:
        self._ticket = self._breaker.before_call()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        failure: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._breaker.settle(failure, self._ticket)
