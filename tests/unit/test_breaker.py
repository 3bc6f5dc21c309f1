"""The circuit breaker's states, driven by an injected clock."""

import pytest

from services.common.breaker import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    BreakerPolicy,
    CircuitBreaker,
    CircuitOpenError,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_opens_at_the_threshold_not_before():
    clock = Clock()
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
    b = CircuitBreaker("x", BreakerPolicy(2), clock=Clock())
    b.record_failure()
    b.record_success()
    b.record_failure()
    assert b.state == CLOSED


def test_half_open_lets_one_trial_through_then_closes_or_reopens():
    clock = Clock()
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
        b = CircuitBreaker("x", BreakerPolicy(failures, reset_s), clock=Clock())
        assert b.state == CLOSED
    else:
        with pytest.raises(ValueError, match="BreakerPolicy"):
            BreakerPolicy(failures, reset_s)
