"""Errors of parsing documents: unsupported formats, unreadable input, bad knowledge-base rows."""

from __future__ import annotations

from dataclasses import dataclass

from services.common import errors


class ParseError(ValueError):
    """The input cannot be parsed (undecodable text, a broken PDF, a malformed CSV)."""


class UnsupportedFormatError(ParseError):
    """The file's format has no parser."""


class DocumentLimitError(ParseError):
    """The document runs past one of the parser's bounds: `limit` (bytes, pages, seconds…),
    named `limit_name` as the caller sees it (the ErrorInfo's limit_name, LIMIT_EXCEEDED)."""

    limit_name = "max_document_size"

    def __init__(self, message: str, *, limit: float) -> None:
        super().__init__(message)
        self.limit = limit


class PageLimitError(DocumentLimitError):
    """The document has more pages than one may hold (`limit`, `pdf.MAX_PAGES`): a PDF's pages,
    or a text or Markdown file's (each form feed starts a page). One name for every format:
    the bound is the same, and so is what the caller does about it (split the document)."""

    limit_name = "max_pages"


class SectionLimitError(DocumentLimitError):
    """The document has more headings (each starts a section) than one may hold (`limit`,
    `parsing.MAX_SECTIONS`); parsing stopped at the first heading past it."""

    limit_name = "max_sections"


class ChunkLimitError(DocumentLimitError):
    """The document cuts into more chunks than one may hold (`limit`, `parsing.MAX_CHUNKS`);
    chunking stopped at the first chunk past it."""

    limit_name = "max_chunks"


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


class StoreUnavailableError(errors.BackendUnavailableError, RuntimeError):
    """The document store cannot be read or written now: another writer holds the SQLite lock
    past the busy timeout, the disk refuses the write, the PostgreSQL server cannot be reached.
    Worth retrying later; not the caller's fault. Uncaught, it is UNAVAILABLE with reason
    backend_unavailable (502 through Envoy), as the vector store being down is."""

    def __init__(self, message: str) -> None:
        super().__init__(message, metadata={"backend": "docstore"})
