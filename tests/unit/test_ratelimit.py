"""Sliding-window rate limits by calls and tokens per tenant_id:doc_id (fake clock)."""

import pytest

from services.toolsproxy.ratelimit import (
    IN_FLIGHT_WAIT_S,
    RateLimiter,
    RateLimitExceeded,
    RateLimits,
)
from tests.fakes.clock import ManualClock


def limiter(clock, **limits):
    return RateLimiter(RateLimits(**limits), clock=clock)


def test_calls_at_the_limit_pass_and_one_past_is_refused_until_the_window_moves():
    clock = ManualClock()
    rl = limiter(clock, calls_per_minute=3)
    for _ in range(3):
        rl.acquire("t", ["d"])
    with pytest.raises(RateLimitExceeded) as exc:
        rl.acquire("t", ["d"])
    assert (exc.value.what, exc.value.limit, exc.value.retry_after_s) == ("calls", 3, 60)
    assert "retry after 60 s" in str(exc.value) and "'d'" in str(exc.value)
    clock.now += 59.5
    with pytest.raises(RateLimitExceeded) as exc:
        rl.acquire("t", ["d"])
    assert exc.value.retry_after_s == 1  # 0.5 s rounded up, never 0
    clock.now += 0.5  # exactly one window after the first calls: they have left it
    for _ in range(3):
        rl.acquire("t", ["d"])


def test_the_window_slides_one_call_at_a_time():
    clock = ManualClock()
    rl = limiter(clock, calls_per_minute=3)
    for _ in range(3):
        rl.acquire("t", ["d"])
        clock.now += 10
    with pytest.raises(RateLimitExceeded) as exc:
        rl.acquire("t", ["d"])  # t=30: the oldest call (t=0) leaves at t=60
    assert exc.value.retry_after_s == 30
    clock.now += 30
    rl.acquire("t", ["d"])
    with pytest.raises(RateLimitExceeded) as exc:
        rl.acquire("t", ["d"])  # the t=10 call leaves at t=70
    assert exc.value.retry_after_s == 10


@pytest.mark.parametrize(("limit", "third_ok"), [(21, True), (20, False)])
def test_tokens_at_and_past_the_limit(limit, third_ok):
    clock = ManualClock()
    rl = limiter(clock, tokens_per_minute=limit)
    rl.acquire("t", ["d"]).charge(10)
    clock.now += 5
    rl.acquire("t", ["d"]).charge(10)
    if third_ok:  # 20 tokens used, below 21
        rl.acquire("t", ["d"])
        return
    with pytest.raises(RateLimitExceeded) as exc:  # 20 used: at the limit, nothing more
        rl.acquire("t", ["d"])
    assert (exc.value.what, exc.value.retry_after_s) == ("tokens", 55)  # the first call must go
    clock.now += 55
    rl.acquire("t", ["d"])


@pytest.mark.parametrize(("limit", "third_ok"), [(21, True), (20, False)])
def test_tenant_tokens_at_and_past_the_limit(limit, third_ok):
    clock = ManualClock()  # the per-document token limit does not bind the tenant key
    rl = limiter(clock, tokens_per_minute=1, tenant_tokens_per_minute=limit)
    rl.acquire("t").charge(10)
    clock.now += 5
    rl.acquire("t").charge(10)
    if third_ok:  # 20 tokens used, below 21
        rl.acquire("t")
        return
    with pytest.raises(RateLimitExceeded) as exc:  # 20 used: at the limit, nothing more
        rl.acquire("t")
    assert (exc.value.key, exc.value.what, exc.value.limit) == (("t", None), "tokens", 20)
    assert exc.value.retry_after_s == 55  # the first call must go
    assert "for this tenant" in str(exc.value) and "retry after 55 s" in str(exc.value)
    clock.now += 55
    rl.acquire("t")


def test_one_big_result_is_served_then_the_key_waits():
    clock = ManualClock()
    rl = limiter(clock, tokens_per_minute=100)
    rl.acquire("t", ["d"]).charge(500)
    with pytest.raises(RateLimitExceeded):
        rl.acquire("t", ["d"])
    clock.now += 60
    rl.acquire("t", ["d"])


def test_keys_are_per_tenant_and_document():
    clock = ManualClock()
    rl = limiter(clock, calls_per_minute=1, tenant_calls_per_minute=1)
    rl.acquire("a", ["d"])
    rl.acquire("a", ["e"])  # another document of the same tenant
    rl.acquire("b", ["d"])  # the same doc_id in another tenant
    rl.acquire("a")  # the tenant key (tools that name no document)
    rl.acquire("a:b", ["c"])
    rl.acquire("a", ["b:c"])  # no collision through ':' in ids
    with pytest.raises(RateLimitExceeded) as exc:
        rl.acquire("a")
    assert "tenant" in str(exc.value) and exc.value.key == ("a", None)


def test_tenant_limits_apply_to_calls_naming_no_document():
    clock = ManualClock()
    rl = limiter(clock, calls_per_minute=1, tenant_calls_per_minute=2, tenant_tokens_per_minute=5)
    rl.acquire("t").charge(1)
    rl.acquire("t").charge(1)
    with pytest.raises(RateLimitExceeded) as exc:
        rl.acquire("t")
    assert (exc.value.what, exc.value.limit) == ("calls", 2)
    clock.now += 60
    rl.acquire("t").charge(5)
    with pytest.raises(RateLimitExceeded) as exc:
        rl.acquire("t")
    assert (exc.value.what, exc.value.limit) == ("tokens", 5)


def test_a_refused_call_counts_nowhere():
    clock = ManualClock()
    rl = limiter(clock, calls_per_minute=1)
    rl.acquire("t", ["full"])
    for _ in range(3):
        with pytest.raises(RateLimitExceeded):
            rl.acquire("t", ["free", "full"])
    rl.acquire("t", ["free"])  # the refused calls did not count against "free"
    with pytest.raises(RateLimitExceeded):
        rl.acquire("t", ["free"])


def test_the_longest_wait_is_reported():
    clock = ManualClock()
    rl = limiter(clock, calls_per_minute=1)
    rl.acquire("t", ["a"])
    clock.now += 40
    rl.acquire("t", ["b"])
    with pytest.raises(RateLimitExceeded) as exc:
        rl.acquire("t", ["a", "b"])
    assert exc.value.retry_after_s == 60 and exc.value.key == ("t", "b")


def test_tokens_go_to_the_document_they_came_from():
    clock = ManualClock()
    rl = limiter(clock, tokens_per_minute=10)
    r = rl.acquire("t", ["a", "b"])
    r.charge(10, "a")
    r.charge(0, "b")
    assert set(r.keys) == {("t", "a"), ("t", "b")}
    rl.acquire("t", ["b"])
    with pytest.raises(RateLimitExceeded):
        rl.acquire("t", ["a"])
    rl.acquire("t", ["b"]).charge(4, "unknown")  # text of no named document: every key pays
    rl.acquire("t", ["b"]).charge(6)
    with pytest.raises(RateLimitExceeded):
        rl.acquire("t", ["b"])


def test_zero_switches_a_limit_off():
    clock = ManualClock()
    rl = limiter(clock, calls_per_minute=0, tokens_per_minute=0)
    for _ in range(200):
        rl.acquire("t", ["d"]).charge(10_000)


def test_a_charge_after_the_entry_left_the_window_is_not_counted():
    clock = ManualClock()
    rl = limiter(clock, tokens_per_minute=10)
    late = rl.acquire("t", ["d"])
    clock.now += 61
    rl.acquire("t", ["d"])  # prunes the first entry
    late.charge(100)  # a very slow call reporting after its window
    rl.acquire("t", ["d"])


def test_idle_keys_are_forgotten():
    clock = ManualClock()
    rl = limiter(clock, calls_per_minute=0)
    for i in range(100):
        rl.acquire("t", [f"d{i}"])
    assert rl.tracked_keys() == 100
    clock.now += 61
    for _ in range(1024):
        rl.acquire("t", ["live"])
    assert rl.tracked_keys() == 1


# --- calls in flight: each holds its reservation until it is charged or released ------------


@pytest.mark.parametrize(("limit", "third_ok"), [(101, True), (100, False), (99, False)])
def test_calls_in_flight_count_at_their_reservation(limit, third_ok):
    clock = ManualClock()
    rl = limiter(clock, tokens_per_minute=limit)
    rl.acquire("t", ["d"], reserve=50)
    rl.acquire("t", ["d"], reserve=50)  # 50 in flight, below the limit
    if third_ok:  # 100 in flight, below 101
        rl.acquire("t", ["d"], reserve=50)
        return
    with pytest.raises(RateLimitExceeded) as exc:  # 100 in flight: at the limit or past it
        rl.acquire("t", ["d"], reserve=50)
    # Only the calls in flight fill the key: they end soon, so a short retry-after.
    assert (exc.value.what, exc.value.retry_after_s) == ("tokens", IN_FLIGHT_WAIT_S)
    rl.acquire("t", ["other"], reserve=50)  # another key


def test_a_reservation_never_exceeds_the_limit_it_is_checked_against():
    clock = ManualClock()
    rl = limiter(clock, tokens_per_minute=100, tenant_tokens_per_minute=300)
    whole = rl.acquire("t", ["d", "e"], reserve=1_000)  # admitted alone, however big
    assert whole.reserved == {("t", "d"): 100, ("t", "e"): 100}
    assert rl.acquire("t", reserve=1_000).reserved == {("t", None): 300}
    assert rl.acquire("t", ["f"], reserve=99).reserved == {("t", "f"): 99}
    whole.charge(30, "d")
    assert whole.reserved == {("t", "d"): 70, ("t", "e"): 100}
    whole.release()
    assert whole.reserved == {("t", "d"): 0, ("t", "e"): 0}
    off = limiter(clock, tokens_per_minute=0)  # no token limit: nothing to hold
    assert off.acquire("t", ["d"], reserve=1_000).reserved == {("t", "d"): 0}


@pytest.mark.parametrize(("charged", "admitted"), [(99, True), (100, False), (101, False)])
def test_a_call_that_reserves_nothing_is_refused_for_charged_tokens_only(charged, admitted):
    clock = ManualClock()
    rl = limiter(clock, tokens_per_minute=100)
    served = rl.acquire("t", ["d"])
    rl.acquire("t", ["d"], reserve=100)  # in flight, holding the whole limit
    served.charge(charged)
    if admitted:
        with pytest.raises(RateLimitExceeded) as exc:  # a call that may add text waits
            rl.acquire("t", ["d"], reserve=1)
        assert exc.value.retry_after_s == IN_FLIGHT_WAIT_S
        rl.acquire("t", ["d"])  # one that adds none: 99 charged, below the limit
        return
    with pytest.raises(RateLimitExceeded) as exc:  # at the limit or past it by charged tokens
        rl.acquire("t", ["d"])
    assert (exc.value.what, exc.value.retry_after_s) == ("tokens", 60)


def test_a_key_over_its_limit_by_charged_tokens_waits_for_them_to_leave_the_window():
    clock = ManualClock()
    rl = limiter(clock, tokens_per_minute=100)
    rl.acquire("t", ["d"]).charge(99)  # charged, 1 below the limit
    clock.now += 10
    running = rl.acquire("t", ["d"], reserve=50)  # admitted: 99 < 100; 149 with its reservation
    with pytest.raises(RateLimitExceeded) as exc:  # the charged 99 alone stays under: in flight
        rl.acquire("t", ["d"], reserve=50)
    assert exc.value.retry_after_s == IN_FLIGHT_WAIT_S
    running.charge(1)  # now at the limit by charged tokens alone
    running.release()
    with pytest.raises(RateLimitExceeded) as exc:
        rl.acquire("t", ["d"], reserve=50)
    assert exc.value.retry_after_s == 50  # the first call leaves the window then


def test_the_real_count_replaces_the_reservation():
    clock = ManualClock()
    rl = limiter(clock, tokens_per_minute=61)
    first = rl.acquire("t", ["d"], reserve=50)
    rl.acquire("t", ["d"], reserve=50)
    with pytest.raises(RateLimitExceeded):
        rl.acquire("t", ["d"], reserve=50)  # 100 in flight
    first.charge(5)
    with pytest.raises(RateLimitExceeded):
        rl.acquire("t", ["d"], reserve=50)  # 5 charged + 45 + 50 still possible
    first.release()
    rl.acquire("t", ["d"], reserve=50)  # 5 + 50 < 61
    with pytest.raises(RateLimitExceeded):
        rl.acquire("t", ["d"], reserve=50)  # 5 + 50 + 50


def test_a_released_call_that_charged_nothing_frees_its_reservation():
    clock = ManualClock()
    rl = limiter(clock, tokens_per_minute=100)
    failed = rl.acquire("t", ["d"], reserve=100)
    with pytest.raises(RateLimitExceeded):
        rl.acquire("t", ["d"], reserve=100)
    failed.release()
    failed.release()  # idempotent
    rl.acquire("t", ["d"], reserve=100)


@pytest.mark.parametrize("reserve", [0, 1_000])
def test_one_call_at_a_time_is_limited_as_without_reservations(reserve):
    clock = ManualClock()
    rl = limiter(clock, tokens_per_minute=20)
    for _ in range(2):
        r = rl.acquire("t", ["d"], reserve=reserve)  # admitted below the limit, reserving or not
        r.charge(10)
        r.release()
        clock.now += 5
    with pytest.raises(RateLimitExceeded) as exc:
        rl.acquire("t", ["d"], reserve=reserve)
    assert (exc.value.what, exc.value.retry_after_s) == ("tokens", 50)
    clock.now += 50
    big = rl.acquire("t", ["d"], reserve=reserve)
    big.charge(500)  # the call that crosses the limit is served in full
    big.release()
    with pytest.raises(RateLimitExceeded):
        rl.acquire("t", ["d"], reserve=reserve)


def test_a_call_in_flight_past_its_window_is_not_counted_twice():
    clock = ManualClock()
    rl = limiter(clock, tokens_per_minute=100)
    late = rl.acquire("t", ["d"], reserve=50)
    clock.now += 61
    rl.acquire("t", ["d"]).charge(100)  # prunes the late call's entry, reservation and all
    late.release()  # must not take its reservation off the window a second time
    with pytest.raises(RateLimitExceeded):
        rl.acquire("t", ["d"])
