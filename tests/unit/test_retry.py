"""services.common.retry: attempts, backoff, cap, deadline, a failure's own delay; each run by
the async runner and by the blocking one (the same rule)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from services.common.retry import (
    AttemptFailed,
    RetryPolicy,
    run_with_retry,
    run_with_retry_sync,
    whole_seconds,
)


class Flaky(AttemptFailed):
    """A failure with a label, so a test can tell attempts apart."""

    def __init__(self, label: str, *, retry: bool = True, delay: float | None = None) -> None:
        super().__init__(label, retry=retry, delay=delay)


class Fatal(Exception):
    """A failure the rule does not judge."""


class Steps:
    """Attempts that raise the queued failures, then answer; time moves only by sleeping.

    `blocking` (set for every test by the `runner` fixture) runs them through
    run_with_retry_sync with a blocking attempt and sleep instead of run_with_retry."""

    blocking = False

    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.now = 100.0
        self.calls = 0
        self.pauses: list[float] = []
        self.retries: list[tuple[str, int, float]] = []

    def clock(self) -> float:
        return self.now

    def pause(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        self.pause(seconds)

    def answer(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "answer"

    async def attempt(self) -> str:
        return self.answer()

    def on_retry(self, failed: Flaky, attempt: int, delay: float) -> None:
        self.retries.append((str(failed), attempt, delay))

    async def run(
        self,
        policy: RetryPolicy,
        *,
        clock: Callable[[], float] | None = None,
        started: float | None = None,
    ) -> tuple[str, int]:
        clock = clock or self.clock
        if self.blocking:
            return run_with_retry_sync(
                self.answer,
                policy,
                retry_on=Flaky,
                on_retry=self.on_retry,
                sleep=self.pause,
                clock=clock,
                started=started,
            )
        return await run_with_retry(
            self.attempt, policy, retry_on=Flaky, on_retry=self.on_retry, sleep=self.sleep,
            clock=clock, started=started,
        )  # fmt: skip


@pytest.fixture(autouse=True, params=["async", "blocking"])
def runner(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Steps, "blocking", request.param == "blocking")


# -- the policy's delays ------------------------------------------------------------------


def test_a_fixed_pause_by_default() -> None:
    policy = RetryPolicy(attempts=4, first_delay_s=0.2)
    assert [policy.delay(n) for n in (1, 2, 3)] == [0.2, 0.2, 0.2]


def test_delays_grow_by_the_factor_up_to_the_cap() -> None:
    policy = RetryPolicy(attempts=6, first_delay_s=0.5, factor=2.0, max_delay_s=3.0)
    assert [policy.delay(n) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


@pytest.mark.parametrize("attempts", [0, -1])
def test_fewer_than_one_attempt_is_refused(attempts: int) -> None:
    with pytest.raises(ValueError, match="attempts must be at least 1"):
        RetryPolicy(attempts=attempts, first_delay_s=0.1)


@pytest.mark.parametrize("deadline_s", [0.0, -1.0, math.nan])
def test_a_deadline_that_is_not_positive_is_refused(deadline_s: float) -> None:
    with pytest.raises(ValueError, match="deadline_s must be positive"):
        RetryPolicy(attempts=2, first_delay_s=0.1, deadline_s=deadline_s)


# -- running attempts ---------------------------------------------------------------------


async def test_the_first_answer_takes_one_attempt_and_no_pause() -> None:
    steps = Steps()
    assert await steps.run(RetryPolicy(attempts=3, first_delay_s=1.0)) == ("answer", 1)
    assert steps.pauses == [] and steps.retries == []


async def test_retries_pause_with_backoff_and_report_the_attempts() -> None:
    steps = Steps(Flaky("a"), Flaky("b"), Flaky("c"))
    policy = RetryPolicy(attempts=4, first_delay_s=1.0, factor=2.0, max_delay_s=3.0)
    assert await steps.run(policy) == ("answer", 4)
    assert steps.pauses == [1.0, 2.0, 3.0]
    assert steps.retries == [("a", 1, 1.0), ("b", 2, 2.0), ("c", 3, 3.0)]


async def test_success_on_the_last_allowed_attempt() -> None:
    steps = Steps(Flaky("a"), Flaky("b"))
    assert await steps.run(RetryPolicy(attempts=3, first_delay_s=0.1)) == ("answer", 3)


async def test_a_failure_one_past_the_limit_is_raised_with_the_attempts() -> None:
    steps = Steps(Flaky("a"), Flaky("b"), Flaky("c"))
    with pytest.raises(Flaky, match="c") as caught:
        await steps.run(RetryPolicy(attempts=3, first_delay_s=0.1))
    assert caught.value.attempts == 3 and steps.calls == 3
    assert len(steps.pauses) == 2  # no pause after the last attempt
    assert [r[1] for r in steps.retries] == [1, 2]


async def test_a_failure_that_may_not_be_retried_ends_the_run() -> None:
    steps = Steps(Flaky("a"), Flaky("refused", retry=False))
    with pytest.raises(Flaky, match="refused") as caught:
        await steps.run(RetryPolicy(attempts=5, first_delay_s=0.1))
    assert caught.value.attempts == 2 and steps.pauses == [0.1]


async def test_other_exceptions_pass_through_unjudged() -> None:
    steps = Steps(Flaky("a"), Fatal("broken"))
    with pytest.raises(Fatal, match="broken"):
        await steps.run(RetryPolicy(attempts=5, first_delay_s=0.1))
    assert steps.calls == 2


async def test_the_failures_own_delay_wins_and_is_not_capped() -> None:
    steps = Steps(Flaky("rate limited", delay=7.0), Flaky("a"))
    policy = RetryPolicy(attempts=3, first_delay_s=0.5, factor=2.0, max_delay_s=1.0)
    assert await steps.run(policy) == ("answer", 3)
    assert steps.pauses == [7.0, 1.0]


async def test_a_failure_asking_for_the_longest_allowed_pause_is_retried() -> None:
    steps = Steps(Flaky("rate limited", delay=5.0))
    policy = RetryPolicy(attempts=3, first_delay_s=0.5, max_retry_after_s=5.0)
    assert await steps.run(policy) == ("answer", 2)
    assert steps.pauses == [5.0] and steps.retries == [("rate limited", 1, 5.0)]


async def test_a_failure_asking_for_a_longer_pause_ends_the_run_at_once() -> None:
    steps = Steps(Flaky("a"), Flaky("rate limited", delay=5.01))
    policy = RetryPolicy(attempts=5, first_delay_s=0.5, max_retry_after_s=5.0)
    with pytest.raises(Flaky, match="rate limited") as caught:
        await steps.run(policy)
    assert caught.value.attempts == 2 and steps.pauses == [0.5]


async def test_the_policys_own_pause_is_not_held_to_the_retry_after_cap() -> None:
    steps = Steps(Flaky("a"))
    policy = RetryPolicy(attempts=2, first_delay_s=3.0, max_retry_after_s=1.0)
    assert await steps.run(policy) == ("answer", 2)
    assert steps.pauses == [3.0]


@pytest.mark.parametrize("field", ["first_delay_s", "max_retry_after_s"])
def test_a_negative_pause_is_refused(field: str) -> None:
    values = {"attempts": 2, "first_delay_s": 0.1, field: -0.1}
    with pytest.raises(ValueError, match="must not be negative"):
        RetryPolicy(**values)  # type: ignore[arg-type]


async def test_a_zero_pause_still_sleeps() -> None:
    steps = Steps(Flaky("a", delay=0.0))
    assert await steps.run(RetryPolicy(attempts=2, first_delay_s=1.0)) == ("answer", 2)
    assert steps.pauses == [0.0]


# -- the deadline -------------------------------------------------------------------------


async def test_no_retry_whose_pause_reaches_the_deadline() -> None:
    # 1 s, then 2 s fit in 5 s; the next 4 s pause would end at 7 s: the run stops.
    steps = Steps(*(Flaky(str(n)) for n in range(5)))
    policy = RetryPolicy(attempts=5, first_delay_s=1.0, factor=2.0, max_delay_s=10, deadline_s=5.0)
    with pytest.raises(Flaky, match="2") as caught:
        await steps.run(policy)
    assert steps.pauses == [1.0, 2.0] and caught.value.attempts == 3


async def test_a_pause_ending_exactly_at_the_deadline_is_not_taken() -> None:
    steps = Steps(Flaky("a", delay=2.0))
    with pytest.raises(Flaky) as caught:
        await steps.run(RetryPolicy(attempts=3, first_delay_s=0.1, deadline_s=2.0))
    assert caught.value.attempts == 1 and steps.pauses == []


async def test_a_pause_ending_just_before_the_deadline_is_taken() -> None:
    steps = Steps(Flaky("a", delay=1.5))
    result = await steps.run(RetryPolicy(attempts=3, first_delay_s=0.1, deadline_s=2.0))
    assert result == ("answer", 2) and steps.pauses == [1.5]


async def test_the_deadline_counts_from_the_given_start() -> None:
    steps = Steps(Flaky("a"))
    policy = RetryPolicy(attempts=2, first_delay_s=1.0, deadline_s=3.0)
    with pytest.raises(Flaky):
        # 2.5 s already spent: a 1 s pause reaches 3.5 s
        await steps.run(policy, started=steps.now - 2.5)
    assert steps.pauses == []


async def test_without_a_deadline_the_clock_is_never_read() -> None:
    steps = Steps(Flaky("a"), Flaky("b"))

    def no_clock() -> float:
        raise AssertionError("the clock was read")

    result = await steps.run(RetryPolicy(attempts=3, first_delay_s=0.1), clock=no_clock)
    assert result == ("answer", 3)


@pytest.mark.parametrize(
    ("seconds", "whole"), [(0.0, 1), (0.01, 1), (1.0, 1), (1.2, 2), (2.5, 3), (3.5, 4), (60.0, 60)]
)
def test_whole_seconds_round_up_and_are_never_0(seconds: float, whole: int) -> None:
    assert whole_seconds(seconds) == whole
