"""The process's own stalls (services/common/loop_lag.py) and what they do to a breaker's
verdict: a timeout during which this process stood still says nothing about the dependency,
and a deadline the loop reaches late first lets an answer that already arrived be read.

The watch ticks by hand on a ManualClock; the deadline tests stall the loop for real
(`time.sleep` in a coroutine) so that a due timer and the deadline are due together when the
loop resumes, as after SIGSTOP.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from services.common.breaker import (
    CLOSED,
    OPEN,
    TIMEOUT,
    BreakerPolicy,
    CircuitBreaker,
    verdict_of,
)
from services.common.loop_lag import BEAT_S, STALL_S, StallWatch, stall_tolerant_timeout
from tests.fakes.clock import ManualClock


def watch_at(clock: ManualClock) -> StallWatch:
    """A watch whose first beat is at the clock's now."""
    watch = StallWatch(clock=clock)
    watch.tick()
    return watch


def stand_still(clock: ManualClock, watch: StallWatch, seconds: float) -> None:
    """The process stands still for `seconds`, then the heartbeat beats (late)."""
    clock.now += seconds
    watch.tick()


class TimedOut(Exception):
    breaker_verdict = TIMEOUT


# -- the watch ------------------------------------------------------------------------------


def test_a_late_beat_counts_its_lateness() -> None:
    clock = ManualClock()
    watch = watch_at(clock)
    reading = watch.stalled_total()
    stand_still(clock, watch, BEAT_S + 5.0)
    assert watch.stalled_since(reading) == pytest.approx(5.0)


def test_the_ordinary_lateness_of_a_busy_loop_is_no_stall() -> None:
    clock = ManualClock()
    watch = watch_at(clock)
    reading = watch.stalled_total()
    for _ in range(100):
        stand_still(clock, watch, BEAT_S + 0.2)
    assert watch.stalled_since(reading) == 0.0


async def test_a_beat_overdue_now_counts_before_the_loop_runs_it() -> None:
    clock = ManualClock()
    watch = StallWatch(clock=clock)
    watch.watch()  # the heartbeat on this loop: its first beat now
    try:
        reading = watch.stalled_total()
        clock.now += BEAT_S + 3.0  # the loop has not run the beat due since
        assert watch.stalled_since(reading) == pytest.approx(3.0)
    finally:
        watch.stop()


def test_a_watch_without_a_running_heartbeat_infers_nothing() -> None:
    clock = ManualClock()
    watch = watch_at(clock)  # ticked by hand: no beat is due
    reading = watch.stalled_total()
    clock.now += 60.0
    assert watch.stalled_since(reading) == 0.0


# -- the breaker's verdict on a timeout -------------------------------------------------------


def test_an_unclassified_timeout_error_is_a_timeout() -> None:
    assert verdict_of(TimeoutError()) == TIMEOUT


@pytest.mark.parametrize("failure", [TimedOut(), TimeoutError()])
def test_a_timeout_while_the_process_stood_still_is_no_verdict(failure: Exception) -> None:
    clock = ManualClock()
    watch = watch_at(clock)
    breaker = CircuitBreaker("dep", BreakerPolicy(1, 30.0), clock=clock, stalls=watch)
    ticket = breaker.before_call()
    stand_still(clock, watch, BEAT_S + STALL_S)
    breaker.settle(failure, ticket)
    assert breaker.state == CLOSED


@pytest.mark.parametrize("failure", [TimedOut(), TimeoutError()])
def test_a_timeout_without_a_stall_counts(failure: Exception) -> None:
    clock = ManualClock()
    watch = watch_at(clock)
    breaker = CircuitBreaker("dep", BreakerPolicy(1, 30.0), clock=clock, stalls=watch)
    ticket = breaker.before_call()
    stand_still(clock, watch, BEAT_S + STALL_S - 0.1)  # a stall, shorter than STALL_S
    breaker.settle(failure, ticket)
    assert breaker.state == OPEN


def test_a_stall_before_the_call_was_let_in_excuses_nothing() -> None:
    clock = ManualClock()
    watch = watch_at(clock)
    breaker = CircuitBreaker("dep", BreakerPolicy(1, 30.0), clock=clock, stalls=watch)
    stand_still(clock, watch, BEAT_S + 10.0)
    ticket = breaker.before_call()
    breaker.settle(TimedOut(), ticket)
    assert breaker.state == OPEN


def test_a_stall_excuses_only_a_timeout() -> None:
    clock = ManualClock()
    watch = watch_at(clock)
    breaker = CircuitBreaker("dep", BreakerPolicy(1, 30.0), clock=clock, stalls=watch)
    ticket = breaker.before_call()
    stand_still(clock, watch, BEAT_S + 10.0)
    breaker.settle(ConnectionRefusedError(), ticket)
    assert breaker.state == OPEN


def test_a_half_open_trial_that_timed_out_in_a_stall_is_freed() -> None:
    clock = ManualClock()
    watch = watch_at(clock)
    breaker = CircuitBreaker("dep", BreakerPolicy(1, 30.0), clock=clock, stalls=watch)
    breaker.settle(ConnectionRefusedError(), breaker.before_call())
    clock.now += 30.0
    watch.tick()
    trial = breaker.before_call()
    stand_still(clock, watch, BEAT_S + 5.0)
    breaker.settle(TimedOut(), trial)
    assert breaker.before_call() is not trial  # half-open again: the next call is the trial


# -- the deadline reached late ----------------------------------------------------------------


async def answered_during_a_stall(deadline: str) -> str:
    """An answer due 10 ms into a 50 ms deadline, the loop standing still 400 ms across both:
    when it resumes both are due, the answer first."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[str] = loop.create_future()
    loop.call_later(0.01, answer.set_result, "answer")
    cm = stall_tolerant_timeout(0.05) if deadline == "stall_tolerant" else asyncio.timeout(0.05)
    async with cm:
        time.sleep(0.4)  # noqa: ASYNC251 - the process standing still
        return await answer


async def test_an_answer_that_arrived_while_the_loop_stood_still_is_used() -> None:
    assert await answered_during_a_stall("stall_tolerant") == "answer"


async def test_asyncio_timeout_discards_it() -> None:
    """Why: asyncio.timeout fires before the task that has its answer runs."""
    with pytest.raises(TimeoutError):
        await answered_during_a_stall("asyncio")


async def test_a_deadline_reached_late_still_fires_after_the_grace() -> None:
    with pytest.raises(TimeoutError):
        async with stall_tolerant_timeout(0.05, grace_s=0.05):
            time.sleep(0.4)  # noqa: ASYNC251 - the process standing still
            await asyncio.Event().wait()


async def test_a_deadline_reached_on_time_gets_no_grace() -> None:
    async with asyncio.timeout(30) as outer:
        with pytest.raises(TimeoutError):
            async with stall_tolerant_timeout(0.05, grace_s=60):
                await asyncio.Event().wait()
    assert not outer.expired()


async def test_a_block_that_ends_in_time_leaves_no_timer() -> None:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _, context: errors.append(context))
    try:
        async with stall_tolerant_timeout(0.05):
            pass
        await asyncio.sleep(0.1)  # past the deadline: a timer left would fail in the loop
    finally:
        loop.set_exception_handler(None)
    assert errors == []
