"""Structured JSON logs, one object per line, every line carrying the request's trace_id."""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback
from typing import Any

from services.common.context import current_trace_id
from services.common.tracing import traceparent_var

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object: ts, level, service, logger, msg, trace_id,
    span_id (tracing on, in an RPC), extras."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service
        self._second = -1
        self._stamp = ""

    def format(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second:  # strftime once per second, not once per line
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        entry: dict[str, Any] = {
            "ts": f"{self._stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": self._service,
            "logger": record.name,
            "msg": record.getMessage(),
            "trace_id": getattr(record, "trace_id", None) or current_trace_id() or None,
        }
        # With tracing on, inside an RPC: the id of its SERVER span ("00-<trace>-<span>-<flags>").
        traceparent = traceparent_var.get()
        if traceparent:
            entry["span_id"] = traceparent[36:52]
        for key, value in record.__dict__.items():
            if key not in _RESERVED and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exc"] = "".join(traceback.format_exception(*record.exc_info))
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(service: str, level: str = "INFO") -> None:
    """Send every log record to stderr as JSON."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
