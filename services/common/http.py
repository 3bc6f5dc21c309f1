"""Small helpers for the HTTP clients of external services (model runtime, Tavily, ...)."""

from __future__ import annotations

import logging
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


def quiet_http_client_logs() -> None:
    """httpx logs every request at INFO ("HTTP Request: POST …"): one record per model call,
    on the event loop, saying less than the services' own lines (the LLM service's runtime
    call outcome and latency are in its DEBUG "llm runtime call" record and its INFO
    "generate" summary). Unless LOG_LEVEL is DEBUG, or someone set httpx's level, they
    are kept to warnings."""
    logger = logging.getLogger("httpx")
    if logger.level == logging.NOTSET and not logging.getLogger().isEnabledFor(logging.DEBUG):
        logger.setLevel(logging.WARNING)
