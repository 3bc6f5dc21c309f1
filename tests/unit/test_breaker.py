"""The circuit breaker's states, driven by an injected clock."""

import asyncio

import pytest

from services.common.breaker import (
    ANSWERED,
    CLOSED,
    HALF_OPEN,
    NO_VERDICT,
    OPEN,
    OUTAGE,
    BreakerPolicy,
    CircuitBreaker,
    CircuitOpenError,
    verdict_of,
)
from tests.fakes.clock import ManualClock


def test_opens_at_the_threshold_not_before():
    clock = ManualClock(100.0)
    b = CircuitBreaker("vector store", BreakerPolicy(5, 10), clock=clock)
    for _ in range(4):
        b.before_call()
        b.record_failure()
    assert b.state == CLOSED  # 4 failures: one short of the threshold
    b.before_call()
    b.record_failure()
    assert b.state == OPEN  # the 5th opens it
    with pytest.raises(CircuitOpenError) as info:
        b.before_call()
    assert "vector store" in str(info.value)
    assert info.value.retry_in == pytest.approx(10)


def test_a_success_resets_the_count():
    b = CircuitBreaker("x", BreakerPolicy(2), clock=ManualClock(100.0))
    b.record_failure()
    b.record_success()
    b.record_failure()
    assert b.state == CLOSED


def test_half_open_lets_one_trial_through_then_closes_or_reopens():
    clock = ManualClock(100.0)
    b = CircuitBreaker("x", BreakerPolicy(1, 5), clock=clock)
    b.record_failure()
    assert b.state == OPEN
    clock.now += 5
    assert b.state == HALF_OPEN
    b.before_call()  # the trial
    with pytest.raises(CircuitOpenError):
        b.before_call()  # a second caller while the trial runs
    b.record_failure()
    assert b.state == OPEN  # trial failed: open again for another 5 s
    clock.now += 5
    b.before_call()
    b.record_success()
    assert b.state == CLOSED
    b.before_call()


@pytest.mark.parametrize(
    ("failures", "reset_s", "ok"),
    [(1, 0.0, True), (0, 10.0, False), (-1, 10.0, False), (1, -0.1, False)],
)
def test_a_breaker_policy_at_and_past_its_limits(failures: int, reset_s: float, ok: bool):
    if ok:
        b = CircuitBreaker("x", BreakerPolicy(failures, reset_s), clock=ManualClock(100.0))
        assert b.state == CLOSED
    else:
        with pytest.raises(ValueError, match="BreakerPolicy"):
            BreakerPolicy(failures, reset_s)


class Refused(Exception):
    breaker_verdict = ANSWERED


class DeadlineTooShort(Exception):
    breaker_verdict = NO_VERDICT


class Down(Exception):
    breaker_verdict = OUTAGE


@pytest.mark.parametrize(
    ("failure", "verdict"),
    [
        (None, ANSWERED),
        (Refused(), ANSWERED),
        (DeadlineTooShort(), NO_VERDICT),
        (Down(), OUTAGE),
        (asyncio.CancelledError(), NO_VERDICT),
        (ValueError("nobody classified this"), OUTAGE),
        (KeyboardInterrupt(), OUTAGE),
    ],
)
def test_the_verdict_of_each_ending(failure: BaseException | None, verdict: str):
    assert verdict_of(failure) == verdict


def half_open(clock: ManualClock) -> CircuitBreaker:
    """Two failures counted, open, and past its reset: the next call is the trial."""
    b = CircuitBreaker("x", BreakerPolicy(2, 5), clock=clock)
    b.record_failure()
    b.record_failure()
    clock.now += 5
    assert b.state == HALF_OPEN
    return b


def test_a_trial_that_returns_closes_the_breaker():
    b = half_open(ManualClock(100.0))
    with b.trial():
        pass
    assert b.state == CLOSED


@pytest.mark.parametrize(
    ("failure", "state_after"),
    [
        (Refused(), CLOSED),  # it answered: it is up
        (Down(), OPEN),
        (ValueError("a bug"), OPEN),  # never leaves the trial hanging
        (DeadlineTooShort(), HALF_OPEN),  # the trial is freed, the count kept
        (asyncio.CancelledError(), HALF_OPEN),
    ],
)
def test_a_trial_that_raises_settles_by_its_verdict_and_reraises(
    failure: BaseException, state_after: str
):
    b = half_open(ManualClock(100.0))
    with pytest.raises(type(failure)), b.trial():
        raise failure
    assert b.state == state_after
    if state_after == HALF_OPEN:  # freed: the next caller is the new trial
        with b.trial():
            pass
        assert b.state == CLOSED


def test_a_refused_trial_runs_nothing_and_settles_nothing():
    b = half_open(ManualClock(100.0))
    b.before_call()  # another caller's trial is running
    ran = []
    with pytest.raises(CircuitOpenError), b.trial():
        ran.append(True)
    assert not ran
    b.record_success()  # the running trial ends: only its verdict counted
    assert b.state == CLOSED


def test_a_no_verdict_ending_keeps_the_count():
    b = CircuitBreaker("x", BreakerPolicy(2, 5), clock=ManualClock(100.0))
    b.record_failure()
    with pytest.raises(DeadlineTooShort), b.trial():
        raise DeadlineTooShort
    b.record_failure()  # the second failure in a row: the no-verdict call did not reset it
    assert b.state == OPEN
