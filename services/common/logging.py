"""Structured JSON logs through structlog, one object per line, every line carrying the
request's trace_id.

Two ways in, one JSON shape out:

- ``get_logger(name).info("external_call", upstream="cbr", ...)``: structlog's bound
  logger; the event name is the line's ``msg``, the keywords its fields.
- ``logging.getLogger(name).info("rpc", extra={...})``: the standard library; the message is
  ``msg``, the extras are fields.

Both end as stdlib records on the root handler `configure_logging` installs, whose
`JsonFormatter` (a structlog ProcessorFormatter) runs the same processors on either:
the request's ``trace_id`` and, inside a traced RPC, its ``span_id``, bound through
``structlog.contextvars`` (`bind_trace_id`, `trace_id_bound`, `bind_span_id`); structlog's
JSON renderer writes the line. Field order: ts, level, service, logger, msg, trace_id,
span_id (when bound), then the event's own fields (one named like an envelope key is
dropped); ``exc`` holds a traceback.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, cast

import structlog
from structlog.contextvars import bind_contextvars, merge_contextvars, reset_contextvars
from structlog.processors import JSONRenderer, format_exc_info
from structlog.typing import EventDict, WrappedLogger

from services.common.context import trace_id_var

# LogRecord attributes that are not a caller's extras ("message"/"asctime" appear once a
# formatter ran; "_logger"/"_name" are structlog's, on records it wrapped).
_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "_logger",
    "_name",
}


def _extras(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
    """A stdlib record's ``extra={...}`` as fields (structlog's ExtraAdder, less the
    attributes a formatter adds)."""
    for key, value in event["_record"].__dict__.items():
        if key not in _RESERVED:
            event[key] = value
    return event


def _drop_empty_trace_id(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
    if "trace_id" in event and not event["trace_id"]:
        del event["trace_id"]
    return event


class _Envelope:
    """ts, level, service, logger, msg, trace_id (null outside a request), span_id (when
    bound), then the event's fields, in that order (a field named like an envelope key is
    dropped); the stamp is strftime'd once a second."""

    def __init__(self, service: str) -> None:
        self._service = service
        self._second = -1
        self._stamp = ""

    def __call__(self, _: WrappedLogger, __: str, event: EventDict) -> EventDict:
        record: logging.LogRecord = event.pop("_record")
        second = int(record.created)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        out: dict[str, Any] = {
            "ts": f"{self._stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": self._service,
            "logger": record.name,
            "msg": event.pop("event", ""),
            "trace_id": event.pop("trace_id", None) or None,
        }
        span_id = event.pop("span_id", None)
        if span_id:
            out["span_id"] = span_id
        exc = event.pop("exception", None)
        for key, value in event.items():
            out.setdefault(key, value)  # a field never replaces the envelope's
        if exc:
            out["exc"] = exc
        return out


class JsonFormatter(structlog.stdlib.ProcessorFormatter):
    """Formats stdlib records and structlog events alike as one JSON object per line."""

    def __init__(self, service: str) -> None:
        super().__init__(
            foreign_pre_chain=[_extras],  # stdlib records only
            processors=[
                # After the extras: a trace_id passed explicitly wins over the bound one
                # (an empty one does not).
                _drop_empty_trace_id,
                merge_contextvars,
                format_exc_info,
                _Envelope(service),
                JSONRenderer(ensure_ascii=False, default=str),
            ],
        )

    def format(self, record: logging.LogRecord) -> str:
        """ProcessorFormatter.format's event dict through the same processors, less its
        copy of the record (a second LogRecord per line, a third of a line's cost): the
        record is only read here, so other handlers still see it unchanged."""
        msg = record.msg
        if isinstance(msg, dict) and hasattr(record, "_logger"):  # wrap_for_formatter's
            event: EventDict = dict(msg)  # a copy: another handler may read the record too
            method: str = record._name  # type: ignore[attr-defined]
            event["_record"] = record
        else:
            event = {"event": record.getMessage(), "_record": record}
            if record.exc_info:
                event["exc_info"] = record.exc_info
            if record.stack_info:
                event["stack_info"] = record.stack_info
            method = record.levelname.lower()
            for pre in self.foreign_pre_chain or ():
                event = cast(EventDict, pre(self.logger, method, event))
        rendered: Any = event
        for proc in self.processors:
            rendered = proc(self.logger, method, rendered)
        return str(rendered)


def _stdlib_logger(name: str | None = None, *_: Any) -> logging.Logger:
    return logging.getLogger(name)


def _configure_structlog() -> None:
    """structlog's events become stdlib records (levels, handlers, pytest's caplog), whose
    formatter (JsonFormatter) renders them."""
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,  # a disabled level costs no processing
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        # logging.getLogger itself: structlog's LoggerFactory would make every stdlib logger
        # a slower findCaller subclass (setLoggerClass), for caller fields no line carries.
        logger_factory=_stdlib_logger,
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


_configure_structlog()


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """A structlog logger over the stdlib logger `name`: ``log.info("event", key=value)``."""
    return structlog.stdlib.get_logger(name)  # type: ignore[no-any-return]


def bind_trace_id(trace_id: str) -> None:
    """Make `trace_id` the current request's: outgoing calls read it (trace_id_var), log
    lines carry it (bound through structlog.contextvars). For the rest of this context."""
    trace_id_var.set(trace_id)
    bind_contextvars(trace_id=trace_id)


def bind_request_id(request_id: str) -> None:
    """Log lines of the current request carry `request_id` (Envoy's x-request-id)."""
    bind_contextvars(request_id=request_id)


@contextmanager
def trace_id_bound(trace_id: str) -> Iterator[None]:
    """`bind_trace_id` for the block only."""
    token = trace_id_var.set(trace_id)
    tokens = bind_contextvars(trace_id=trace_id)
    try:
        yield
    finally:
        reset_contextvars(**tokens)
        trace_id_var.reset(token)


def bind_span_id(span_id: str) -> Mapping[str, contextvars.Token[Any]]:
    """Log lines carry `span_id` until `unbind_span_id` with the returned tokens."""
    return bind_contextvars(span_id=span_id)


def unbind_span_id(tokens: Mapping[str, contextvars.Token[Any]]) -> None:
    reset_contextvars(**tokens)


def configure_logging(service: str, level: str = "INFO") -> None:
    """Send every log record, stdlib's and structlog's, to stderr as JSON."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
