"""A monotonic clock that tests step by hand: the `clock` many components take."""

from __future__ import annotations


class ManualClock:
    """Seconds the test sets or steps (`clock.now += 5`); calling it reads them."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
