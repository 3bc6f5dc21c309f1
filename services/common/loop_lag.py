"""This process's own stalls, seen by a heartbeat on its event loop: a timeout that fell while
the process itself stood still says nothing about the service it was waiting for.

A paused process (CPU starvation on a small host, a long garbage collection, a VM pause,
SIGSTOP) runs none of its timers and reads none of its sockets; when it resumes, every
deadline that passed meanwhile fires at once, and asyncio runs a due timer before the task
whose answer is already waiting in the socket gets to read it. Without this module such a
call would end as the dependency's timeout and count towards opening its breaker, which then
refuses every call for its reset time although the dependency never failed.

Two remedies, one home:

* `StallWatch` ticks every BEAT_S on the loop (one timer callback, no task) and adds up how
  late its beats come; `CircuitBreaker` (services/common/breaker.py) reads that sum when it
  lets a call in and again when the call ends with a TIMEOUT verdict: STALL_S or more of
  stall in between and the timeout is no verdict on the dependency. One process-wide watch,
  `PROCESS_STALLS`, which the first call through any breaker starts on its loop.
* `stall_tolerant_timeout` is `asyncio.timeout` whose deadline, reached LATE_S or more late
  (the loop was stalled across it), first waits GRACE_S more for what already arrived.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from types import TracebackType

BEAT_S = 0.25
"""The heartbeat's period: four timer callbacks a second, each a clock reading and a sum."""
LATE_S = 0.25
"""A beat or a deadline the loop reaches this late or later was passed while the process stood
still; less is the ordinary lateness of a busy loop and is not counted."""
STALL_S = 1.0
"""A call that spent this long or longer with the process stalled gets no verdict from its
timeout (`CircuitBreaker.settle`): the dependency's answer may have been waiting unread."""
GRACE_S = 0.5
"""How much longer a deadline reached late waits (once) for an answer that already arrived:
ample for the loop to read the sockets that became ready while it stood still."""


class StallWatch:
    """How long this process's event loop has stood still, by the lateness of a heartbeat.

    `stalled_total()` is a reading (seconds of stall since the watch began) to take when a call
    starts; `stalled_since(reading)` is the stall since then, the beat that is overdue right
    now included (the loop has resumed but not yet run it). Thread-safe; `clock` (monotonic
    seconds) is injected, and tests call `tick` by hand instead of running the heartbeat.
    """

    def __init__(
        self, *, clock: Callable[[], float] = time.monotonic, beat_s: float = BEAT_S
    ) -> None:
        self._clock = clock
        self._beat_s = beat_s
        self._lock = threading.Lock()
        self._last: float | None = None
        """The latest beat's time; None before the first."""
        self._total = 0.0
        """The stall counted so far: each beat's lateness of LATE_S or more."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None

    def tick(self) -> None:
        """One beat: one that comes LATE_S or more after it was due adds its lateness."""
        now = self._clock()
        with self._lock:
            self._total += self._overdue(now)
            self._last = now

    def _overdue(self, now: float) -> float:
        """How late the next beat is at `now`, if that counts as a stall (else 0)."""
        if self._last is None:
            return 0.0
        late = now - self._last - self._beat_s
        return late if late >= LATE_S else 0.0

    def stalled_total(self) -> float:
        """Seconds of stall so far, the beat overdue now included: a reading for
        `stalled_since`."""
        now = self._clock()
        with self._lock:
            return self._total + (self._overdue(now) if self._beating() else 0.0)

    def stalled_since(self, reading: float) -> float:
        """Seconds of stall since `stalled_total` returned `reading`."""
        return max(0.0, self.stalled_total() - reading)

    def _beating(self) -> bool:
        """Whether the heartbeat runs on a live loop: only then is a beat overdue (a watch
        whose loop has stopped or that ticks by hand has no beat to wait for)."""
        loop = self._loop
        return self._handle is not None and loop is not None and loop.is_running()

    def watch(self) -> None:
        """Keep the heartbeat beating on the running event loop: started on the first call,
        moved to a new loop once the old one has stopped (tests run one per test); nothing
        outside a loop (a worker thread)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._beating():
            return  # on this loop, or on another still running: one watch, one loop
        self.stop()
        with self._lock:
            self._last = None  # the time between two loops was no stall
        self._loop = loop
        self._beat()

    def _beat(self) -> None:
        self.tick()
        if self._loop is not None:
            self._handle = self._loop.call_later(self._beat_s, self._beat)

    def stop(self) -> None:
        """Stop the heartbeat (the sum so far stays)."""
        if self._handle is not None:
            self._handle.cancel()
        self._handle = None
        self._loop = None


PROCESS_STALLS = StallWatch()
"""The process's watch: one event loop per process, so one heartbeat, which every breaker
reads (a breaker takes another only in tests)."""


def stall_tolerant_timeout(
    delay: float, *, late_s: float = LATE_S, grace_s: float = GRACE_S
) -> StallTolerantTimeout:
    """`async with stall_tolerant_timeout(delay):` is `asyncio.timeout(delay)`, except that a
    deadline the loop reaches `late_s` or more late (it stood still across it) waits `grace_s`
    more, once, before it fires: an answer that arrived meanwhile is read, not discarded.
    Raises TimeoutError as asyncio.timeout does."""
    return StallTolerantTimeout(delay, late_s=late_s, grace_s=grace_s)


class StallTolerantTimeout:
    """`stall_tolerant_timeout`'s context manager: `asyncio.timeout(None)`, which its own
    timer at the deadline fires (`reschedule`), or, reached late, reschedules once."""

    __slots__ = ("_grace_s", "_graced", "_handle", "_late_s", "_loop", "_timeout", "_when")

    def __init__(self, delay: float, *, late_s: float = LATE_S, grace_s: float = GRACE_S) -> None:
        self._loop = asyncio.get_running_loop()
        self._when = self._loop.time() + delay
        self._late_s = late_s
        self._grace_s = grace_s
        self._graced = False
        self._timeout = asyncio.timeout(None)
        self._handle: asyncio.TimerHandle | None = None

    async def __aenter__(self) -> StallTolerantTimeout:
        await self._timeout.__aenter__()
        self._handle = self._loop.call_at(self._when, self._due)
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        failure: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
        await self._timeout.__aexit__(kind, failure, tb)

    def _due(self) -> None:
        """The deadline's timer: late, it grants the grace once; else the timeout fires."""
        now = self._loop.time()
        if not self._graced and now - self._when >= self._late_s:
            self._graced = True
            self._handle = self._loop.call_at(now + self._grace_s, self._due)
            return
        self._handle = None
        self._timeout.reschedule(now)  # due now: cancels the block, which raises TimeoutError
