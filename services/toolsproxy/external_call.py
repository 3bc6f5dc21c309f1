"""agent.md §9's ``external_call`` event: one line per call to an outside API (the Bank of
Russia, Tavily), a cache hit included; INFO when it answered, WARNING otherwise."""

from __future__ import annotations

import time
from typing import Any

import structlog

from services.common.breaker import CircuitBreaker


def log_external_call(
    events: structlog.stdlib.BoundLogger,
    upstream: str,
    operation: str,
    status: str,
    started: float,
    breaker: CircuitBreaker,
    *,
    cache_hit: bool = False,
    **fields: Any,
) -> None:
    """`status` "ok" or why it failed; `started` the call's `time.perf_counter()`; `fields`
    what the client adds (never a key or the user's text)."""
    emit = events.info if status == "ok" else events.warning
    emit(
        "external_call",
        upstream=upstream,
        operation=operation,
        status=status,
        latency_ms=round((time.perf_counter() - started) * 1000, 1),
        cache_hit=cache_hit,
        breaker=breaker.state,
        **fields,
    )
