"""Errors of parsing documents: unsupported formats, unreadable input, bad knowledge-base rows."""

from __future__ import annotations

from dataclasses import dataclass


class ParseError(ValueError):
    """The input cannot be parsed (undecodable text, a broken PDF, a malformed CSV)."""


class UnsupportedFormatError(ParseError):
    """The file's format has no parser."""


@dataclass(frozen=True)
class RowProblem:
    """What is wrong with one knowledge-base CSV record; `line` is where it starts (header = 1)."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


class KnowledgeBaseError(ParseError):
    """A knowledge-base CSV with missing columns or bad rows; every problem is listed."""

    def __init__(
        self,
        message: str,
        *,
        missing_columns: tuple[str, ...] = (),
        problems: tuple[RowProblem, ...] = (),
    ) -> None:
        super().__init__(message)
        self.missing_columns = missing_columns
        self.problems = problems


class StoreUnavailableError(RuntimeError):
    """The document store cannot be written now: another writer holds its lock past the busy
    timeout, or the disk refuses the write. Worth retrying later; not the caller's fault."""
