"""Small helpers for the HTTP clients of external services (model runtime, Tavily, ...)."""

from __future__ import annotations

import math


def retry_after_seconds(value: str | None) -> float | None:
    """Retry-After as seconds (delta-seconds form); None when absent or an HTTP date, so the
    caller falls back to its own backoff."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None
