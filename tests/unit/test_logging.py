"""The JSON log line (services/common/logging.py): stdlib records and structlog events in one
shape, trace and span ids bound through structlog.contextvars."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.common.context import current_trace_id
from services.common.logging import (
    JsonFormatter,
    bind_span_id,
    configure_logging,
    get_logger,
    trace_id_bound,
    unbind_span_id,
)
from tests.unit.json_logs import json_lines

ENVELOPE = ["ts", "level", "service", "logger", "msg", "trace_id"]
TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def root() -> Iterator[logging.Logger]:
    """The root logger, handlers and level restored afterwards."""
    logger = logging.getLogger()
    handlers, level = logger.handlers[:], logger.level
    yield logger
    logger.handlers[:] = handlers
    logger.setLevel(level)


def test_stdlib_records_and_structlog_events_share_one_envelope():
    with json_lines("toy") as logs:
        logging.getLogger("visior.toy").info("rpc", extra={"method": "m", "code": "OK"})
        get_logger("visior.toy").info("external_call", upstream="cbr", status="ok")
    stdlib, native = logs.lines
    assert list(stdlib) == [*ENVELOPE, "method", "code"]
    assert list(native) == [*ENVELOPE, "upstream", "status"]
    for line in (stdlib, native):
        assert TS.match(line["ts"]) and line["level"] == "info"
        assert (line["service"], line["logger"], line["trace_id"]) == ("toy", "visior.toy", None)
    assert (stdlib["msg"], native["msg"]) == ("rpc", "external_call")


def test_stdlib_arguments_are_formatted_into_msg():
    with json_lines() as logs:
        logging.getLogger("x").warning("rpc failed: %s", "boom", extra={"reason": "r"})
    [line] = logs.lines
    assert (line["level"], line["msg"], line["reason"]) == ("warning", "rpc failed: boom", "r")


def test_trace_and_span_ids_are_bound_for_their_context_only():
    with json_lines() as logs:
        get_logger("x").info("outside")
        with trace_id_bound("tr-1"):
            assert current_trace_id() == "tr-1"  # outgoing calls read the same id
            tokens = bind_span_id("00f067aa0ba902b7")
            logging.getLogger("x").info("inside")
            get_logger("x").info("inside too")
            unbind_span_id(tokens)
            get_logger("x").info("span over")
        get_logger("x").info("after")
    got = [(line["msg"], line["trace_id"], line.get("span_id")) for line in logs.lines]
    assert got == [
        ("outside", None, None),
        ("inside", "tr-1", "00f067aa0ba902b7"),
        ("inside too", "tr-1", "00f067aa0ba902b7"),
        ("span over", "tr-1", None),
        ("after", None, None),
    ]
    assert current_trace_id() == ""
    assert list(logs.lines[1])[:7] == [*ENVELOPE, "span_id"]


def test_a_trace_id_passed_with_the_event_wins_over_the_bound_one_unless_empty():
    with json_lines() as logs, trace_id_bound("bound"):
        logging.getLogger("x").info("a", extra={"trace_id": "explicit"})
        get_logger("x").info("b", trace_id="explicit")
        logging.getLogger("x").info("c", extra={"trace_id": ""})
        get_logger("x").info("d", trace_id="")
    assert [line["trace_id"] for line in logs.lines] == ["explicit", "explicit", "bound", "bound"]


def test_a_field_named_like_the_envelope_never_replaces_it():
    with json_lines("toolsproxy") as logs:
        get_logger("x").info("e", service="cbr", level="fake", ts="never", logger="no")
        logging.getLogger("x").info("f", extra={"service": "cbr"})
    native, stdlib = logs.lines
    assert (native["msg"], stdlib["msg"]) == ("e", "f")
    for line in (native, stdlib):
        assert line["service"] == "toolsproxy" and line["logger"] == "x"
        assert line["level"] == "info" and TS.match(line["ts"])


def test_exceptions_are_one_line_with_the_traceback_in_exc():
    with json_lines() as logs:
        try:
            raise ValueError("bad thing")
        except ValueError:
            logging.getLogger("x").exception("stdlib")
            get_logger("x").exception("structlog")
    assert len(logs.raw) == 2 and all("\n" not in raw for raw in logs.raw)
    for line in logs.lines:
        assert line["level"] == "error"
        assert "Traceback" in line["exc"] and "ValueError: bad thing" in line["exc"]
        assert list(line)[-1] == "exc" and "exc_info" not in line


def test_values_json_cannot_hold_are_strings_and_text_stays_unescaped():
    with json_lines() as logs:
        get_logger("x").info("e", path=Path("/a/b"), words="отпуск")
    assert '"words": "отпуск"' in logs.raw[0]
    assert logs.lines[0]["path"] == "/a/b"


def test_formatting_leaves_the_record_to_the_other_handlers(caplog):
    caplog.set_level(logging.INFO)
    with json_lines() as logs:
        logging.getLogger("x").info("hello %s", "you", extra={"k": 1})
        get_logger("x").info("event", k=2)
    stdlib, native = caplog.records[-2:]
    assert stdlib.getMessage() == "hello you" and stdlib.args == ("you",)
    assert native.msg == {"event": "event", "k": 2}
    # formatted again (as a second handler would) to the same line
    formatter = JsonFormatter("test")
    assert json.loads(formatter.format(stdlib))["msg"] == "hello you"
    assert json.loads(formatter.format(native))["k"] == 2
    assert [line["msg"] for line in logs.lines] == ["hello you", "event"]


def test_configure_logging_writes_json_to_stderr_at_its_level(root, capsys):
    configure_logging("svc", "WARNING")
    get_logger("visior.x").info("dropped")
    logging.getLogger("visior.x").info("dropped too")
    get_logger("visior.x").warning("kept", n=1)
    logging.getLogger("visior.x").error("kept too")
    lines = [json.loads(raw) for raw in capsys.readouterr().err.splitlines()]
    assert [(line["msg"], line["service"], line["level"]) for line in lines] == [
        ("kept", "svc", "warning"),
        ("kept too", "svc", "error"),
    ]
    assert lines[0]["n"] == 1


def test_structlog_leaves_the_stdlib_logger_class_alone():
    # structlog's LoggerFactory would install a slower findCaller subclass for every logger
    assert logging.getLoggerClass() is logging.Logger
    assert type(logging.getLogger("visior.test.new")) is logging.Logger
