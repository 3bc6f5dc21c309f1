"""A straggler, a call let through before the breaker last opened or closed, has no say on
the breaker: its cancellation does not free the half-open trial (a second trial would run
beside the first), its late answer does not close a breaker that opened after it started,
and its late failure neither reopens the breaker nor ends the running trial."""

from __future__ import annotations

import asyncio

import pytest

from services.common.breaker import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    BreakerPolicy,
    CircuitBreaker,
    CircuitOpenError,
    Ticket,
)
from tests.fakes.clock import ManualClock

RESET_S = 10.0


class Down(Exception):
    """The dependency is out."""


def opened(clock: ManualClock, failures: int = 2) -> tuple[CircuitBreaker, Ticket]:
    """A breaker opened by `failures` failed calls, and the ticket of a straggler let through
    while it was still closed."""
    b = CircuitBreaker("dep", BreakerPolicy(failures, RESET_S), clock=clock)
    straggler = b.before_call()
    for _ in range(failures):
        b.record_failure(b.before_call())
    assert b.state == OPEN
    return b, straggler


def trial_running(b: CircuitBreaker, clock: ManualClock) -> Ticket:
    """Past the reset: the half-open trial's ticket, the trial still running."""
    clock.now += RESET_S
    trial = b.before_call()
    assert_trial_runs(b)
    return trial


def assert_trial_runs(b: CircuitBreaker) -> None:
    assert b.state == HALF_OPEN
    with pytest.raises(CircuitOpenError):
        b.before_call()  # one trial at a time


def test_a_cancelled_straggler_does_not_free_the_running_trial() -> None:
    clock = ManualClock(100.0)
    b, straggler = opened(clock)
    trial = trial_running(b, clock)
    b.settle(asyncio.CancelledError(), straggler)
    assert_trial_runs(b)
    b.release(trial)  # the trial's own cancellation frees it
    b.before_call()


@pytest.mark.parametrize("verdict", ["answered", "failed"])
def test_a_stragglers_verdict_leaves_an_open_breaker_as_it_is(verdict: str) -> None:
    clock = ManualClock(100.0)
    b, straggler = opened(clock)
    clock.now += RESET_S / 2
    b.settle(None if verdict == "answered" else Down(), straggler)
    assert b.state == OPEN  # not closed by the answer
    clock.now += RESET_S / 2
    assert b.state == HALF_OPEN  # nor kept open longer by the failure


@pytest.mark.parametrize("verdict", ["answered", "failed"])
def test_a_stragglers_verdict_neither_ends_nor_decides_the_trial(verdict: str) -> None:
    clock = ManualClock(100.0)
    b, straggler = opened(clock)
    trial = trial_running(b, clock)
    b.settle(None if verdict == "answered" else Down(), straggler)
    assert_trial_runs(b)
    b.record_success(trial)  # the trial's own answer closes it
    assert b.state == CLOSED


def test_a_straggler_from_before_the_trial_closed_the_breaker_is_not_counted() -> None:
    clock = ManualClock(100.0)
    b, straggler = opened(clock, failures=1)
    b.record_success(trial_running(b, clock))
    b.record_failure(straggler)  # it started when the dependency was out
    assert b.state == CLOSED
    b.record_failure(b.before_call())  # a call let in since counts
    assert b.state == OPEN


def test_the_trials_verdict_after_a_straggler_is_still_its_own() -> None:
    clock = ManualClock(100.0)
    b, straggler = opened(clock)
    trial = trial_running(b, clock)
    b.record_success(straggler)
    b.record_failure(trial)  # the trial failed: open again for a full reset
    assert b.state == OPEN
    clock.now += RESET_S - 0.001
    assert b.state == OPEN
    clock.now += 0.001
    assert b.state == HALF_OPEN


def test_a_ticket_of_a_call_let_in_while_closed_counts_until_the_breaker_changes() -> None:
    b = CircuitBreaker("dep", BreakerPolicy(2, RESET_S), clock=ManualClock(100.0))
    first, second = b.before_call(), b.before_call()
    b.record_failure(first)
    assert b.state == CLOSED  # one short of the threshold
    b.record_failure(second)
    assert b.state == OPEN  # both counted: neither was a straggler when it failed


async def test_a_cancelled_call_through_trial_does_not_free_another_callers_trial() -> None:
    """The breaker as its clients use it: each call in `with breaker.trial():`, in a task."""
    clock = ManualClock(100.0)
    b = CircuitBreaker("dep", BreakerPolicy(2, RESET_S), clock=clock)
    answer = asyncio.Event()

    async def call() -> None:
        with b.trial():
            await answer.wait()

    straggler = asyncio.ensure_future(call())
    await asyncio.sleep(0)  # let in while closed, and waiting
    for _ in range(2):
        with pytest.raises(Down), b.trial():
            raise Down
    clock.now += RESET_S
    trial = asyncio.ensure_future(call())
    await asyncio.sleep(0)  # the half-open trial, waiting
    straggler.cancel()
    with pytest.raises(asyncio.CancelledError):
        await straggler
    assert_trial_runs(b)
    answer.set()
    await trial
    assert b.state == CLOSED
