"""Captures log lines as the services write them: each record formatted by JsonFormatter when
it is logged (in the context that logged it, as the stderr handler does), parsed back."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from services.common.logging import JsonFormatter


class JsonLines(logging.Handler):
    def __init__(self, service: str) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(JsonFormatter(service))
        self.raw: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.raw.append(self.format(record))

    @property
    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.raw]

    def events(self, msg: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line["msg"] == msg]


@contextmanager
def json_lines(service: str = "test", level: int = logging.INFO) -> Iterator[JsonLines]:
    """Every record of every logger at `level` and above, as the JSON line it becomes."""
    handler = JsonLines(service)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(level)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
