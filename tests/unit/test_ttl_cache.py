"""TtlCache: the upstream tools' cache, at its TTL and its size limit and one past each."""

from __future__ import annotations

from services.toolsproxy.ttl_cache import TtlCache
from tests.fakes.clock import ManualClock


def test_a_value_is_fresh_until_the_ttl_and_gone_at_it() -> None:
    clock = ManualClock(100.0)
    cache: TtlCache[str, int] = TtlCache(10.0, 4, clock)
    cache.put("a", 1)
    clock.now = 109.5
    assert cache.get("a") == 1
    clock.now = 110.0
    assert cache.get("a") is None
    clock.now = 100.0  # a stale entry was dropped, not kept for an earlier clock
    assert cache.get("a") is None


def test_at_most_max_entries_the_oldest_stored_going_first() -> None:
    clock = ManualClock(100.0)
    cache: TtlCache[str, int] = TtlCache(10.0, 2, clock)
    cache.put("a", 1)
    cache.put("b", 2)
    assert (cache.get("a"), cache.get("b")) == (1, 2)  # at the limit: both kept
    cache.put("c", 3)  # one past it: "a" goes
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (None, 2, 3)
    cache.put("b", 20)  # storing again makes it the newest
    cache.put("d", 4)
    assert (cache.get("b"), cache.get("c"), cache.get("d")) == (20, None, 4)


def test_a_zero_ttl_keeps_nothing() -> None:
    cache: TtlCache[str, int] = TtlCache(0.0, 2, ManualClock(100.0))
    cache.put("a", 1)
    assert cache.get("a") is None
