"""PDF text per page and the outline (bookmarks) with where each heading starts, via pypdfium2."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

import pypdfium2 as pdfium

from services.docstore.errors import DocumentLimitError, PageLimitError, ParseError

# PDFium is not thread-safe: one document at a time per process.
_PDFIUM_LOCK = threading.Lock()
_MAX_OUTLINE = 5000
_WS = re.compile(r"\s+")

MAX_TEXT_BYTES = 128 << 20
"""The most text one PDF may yield, in UTF-8 bytes over all its pages: 128 MiB.

The file's size does not bound its text: a Flate-compressed content stream expands up to
~1,000 times (a 30 KB file gave 7.8 M characters, and PDFium's text page holds ~90 bytes a
character while it is read). Real documents stay far below this bound. Over the 10,000
pages `read_pdf` accepts it is 13 KB of text a page on average, over 3 times the densest
page of the sample and benchmark PDFs (2-4 KB a page, English and Russian); and it is 4
times the default RETR_MAX_DOCUMENT_BYTES (32 MiB), where those PDFs hold 0.2-0.6 bytes of
text per byte of file. A constant, not a setting: the parser is not told the service's
limits, and the page count bounds real text whatever RETR_MAX_DOCUMENT_BYTES is."""

MAX_PAGES = 10_000
"""The most pages one document may have, in every format (a text or Markdown file's form
feeds each start a page): 137 times the longest sample or benchmark document (73 pages, the
Debian FAQ), and every page is a row of the document store. Past it `PageLimitError`
(`max_pages`) before any page is read."""


class PdfTextLimitError(DocumentLimitError):
    """The PDF's text runs past `limit` UTF-8 bytes (`MAX_TEXT_BYTES` unless given): reading
    stopped at the page that crossed it (as a file over RETR_MAX_DOCUMENT_BYTES is refused)."""

    limit_name = "max_pdf_text_bytes"


@dataclass(frozen=True)
class OutlineEntry:
    """One bookmark: its depth (0 = top), title, 1-based page and offset in that page's text."""

    level: int
    title: str
    page: int
    offset: int
    """Where the heading starts in `PdfText.pages[page - 1]` (0 when it could not be located)."""


@dataclass(frozen=True)
class PdfText:
    """The text of every page (lines separated by "\\n") and the outline in reading order."""

    pages: tuple[str, ...]
    outline: tuple[OutlineEntry, ...]
    title: str


def read_pdf(
    content: bytes, *, max_pages: int = MAX_PAGES, max_text_bytes: int = MAX_TEXT_BYTES
) -> PdfText:
    """Extract page texts and the outline; raise `ParseError` for anything PDFium cannot open,
    `PageLimitError` for a PDF of more than `max_pages` pages (before reading any), and
    `PdfTextLimitError` as soon as the pages read so far hold more than `max_text_bytes`
    of text (UTF-8): a page's text is counted before the next page is opened."""
    if not content.lstrip()[:5].startswith(b"%PDF"):
        raise ParseError("not a PDF file (no %PDF header)")
    with _PDFIUM_LOCK:
        try:
            pdf = pdfium.PdfDocument(content)
        except pdfium.PdfiumError as exc:
            raise ParseError(f"cannot open the PDF: {exc}") from None
        try:
            return _read(pdf, max_pages, max_text_bytes)
        except pdfium.PdfiumError as exc:
            raise ParseError(f"cannot read the PDF: {exc}") from None
        finally:
            pdf.close()


def _read(pdf: pdfium.PdfDocument, max_pages: int, max_text_bytes: int) -> PdfText:
    n = len(pdf)
    if n == 0:
        raise ParseError("the PDF has no pages")
    if n > max_pages:
        raise PageLimitError(
            f"the PDF has {n} pages; at most {max_pages} are accepted", limit=max_pages
        )
    marks: dict[int, list[tuple[int, str, float | None]]] = {}
    order: list[tuple[int, int, str]] = []  # (page_index, level, title) in outline order
    for i, mark in enumerate(pdf.get_toc(max_depth=8)):
        if i >= _MAX_OUTLINE:
            break
        dest = mark.get_dest()
        page_index = dest.get_index() if dest is not None else None
        title = _WS.sub(" ", _lenient(mark.get_title)).strip()
        if page_index is None or not 0 <= page_index < n or not title:
            continue
        top: float | None = None
        view_mode, view = dest.get_view()
        if view_mode == 1 and len(view) >= 2 and view[1]:  # XYZ: left, top, zoom
            top = float(view[1])
        marks.setdefault(page_index, []).append((len(order), title, top))
        order.append((page_index, mark.level, title))
    pages: list[str] = []
    offsets: dict[int, int] = {}
    text_bytes = 0
    for index in range(n):
        page = pdf[index]
        try:
            textpage = page.get_textpage()
            try:
                raw = textpage.get_text_range()
                text = _normalise(raw)
                text_bytes += len(text.encode())
                if text_bytes > max_text_bytes:
                    raise PdfTextLimitError(
                        f"the PDF's text passes the limit of {max_text_bytes} bytes (UTF-8) "
                        f"at page {index + 1} of {n}: its compressed content expands to more "
                        "text than one document may hold",
                        limit=max_text_bytes,
                    )
                pages.append(text)
                previous = 0
                for k, title, top in marks.get(index, []):
                    previous = _locate(textpage, raw, title, top, previous)
                    offsets[k] = len(_normalise(raw[:previous]))
            finally:
                textpage.close()
        finally:
            page.close()
    outline = tuple(
        OutlineEntry(level, title, page_index + 1, offsets.get(k, 0))
        for k, (page_index, level, title) in enumerate(order)
    )
    meta_title = _WS.sub(" ", _lenient(lambda: pdf.get_metadata_value("Title"))).strip()
    return PdfText(tuple(pages), outline, meta_title)


def _lenient(read: Callable[[], str]) -> str:
    """A string of the PDF's own (a bookmark's title, the /Title entry) that pypdfium2 decodes
    strictly from UTF-16: invalid UTF-16 (a lone surrogate) is repaired with U+FFFD from the
    bytes the error carries, and a string of nothing else reads as "" (no title), so one bad
    string does not refuse a PDF whose pages are readable."""
    try:
        text = read() or ""
    except UnicodeDecodeError as exc:
        text = bytes(exc.object).decode(exc.encoding, errors="replace")
    return text if text.replace("\ufffd", "").strip() else ""


def _normalise(raw: str) -> str:
    """PDFium's text as lines joined by "\\n"; soft hyphens at line ends join the word."""
    text = raw.replace("\r\n", "\n").replace("\r", "\n")
    text = re.sub(r"[\x02\xad]\n", "", text)
    return text.replace("\x02", "").replace("\xad", "").replace("\ufffe", "")


def _locate(
    textpage: pdfium.PdfTextPage, raw: str, title: str, top: float | None, start: int
) -> int:
    """Offset in the raw page text where the bookmark's heading begins (never before `start`)."""
    raw_off: int | None = None
    if top is not None:
        char = _first_char_below(textpage, top)
        if char is not None:
            raw_off = len(textpage.get_text_range(0, char)) if char else 0
    # The destination points at (or just below) the heading; its own line nearby wins.
    found = _find_title(raw, title, start, raw_off)
    if found is None and raw_off is not None:
        # Not near it (a destination at the page top over a heading far down the page): the
        # first line below the destination that begins with the title, never above it.
        found = _find_title(raw, title, max(start, raw_off), None)
    if found is not None:
        raw_off = found
    return start if raw_off is None else max(start, raw_off)


def _first_char_below(textpage: pdfium.PdfTextPage, top: float) -> int | None:
    """First char (reading order) whose top edge is at or below `top` (+ a small tolerance)."""
    count = textpage.count_chars()
    if count <= 0:
        return None
    lo, hi = 0, count
    while lo < hi:  # text runs top to bottom: binary search on the char tops
        mid = (lo + hi) // 2
        _left, _bottom, _right, char_top = textpage.get_charbox(mid)
        if char_top > top + 2.0 and not (char_top == 0 and _bottom == 0):
            lo = mid + 1
        else:
            hi = mid
    return lo if lo < count else None


def _find_title(raw: str, title: str, start: int, near: int | None) -> int | None:
    """Where `title` (optionally after its section number) begins a line from `start`, after
    any indent: the occurrence nearest to `near` (within 400 characters) when given, a line of
    the title alone before one it only begins; else the first. Never inside a line: a heading
    has a line of its own, and a mention in a sentence ("check the cluster backup status"
    under a bookmark "Backup") would cut the sentence where it stands and drop its words as
    the heading."""
    pattern = title_pattern(title)
    if pattern is None:
        return None
    best: tuple[bool, int, int] | None = None  # (only begins its line, distance, offset)
    for match in pattern.finditer(raw, start):
        at = match.start()
        if raw[raw.rfind("\n", 0, at) + 1 : at].strip(" \t"):
            continue
        if near is None:
            return at
        if at > near + 400:
            break
        distance = abs(at - near)
        if distance <= 400:
            rank = (_line_end(raw, match.end()) is None, distance, at)
            best = rank if best is None or rank < best else best
    return None if best is None else best[2]


def _line_end(raw: str, end: int) -> int | None:
    """Where the line that `end` stands in ends, when only spaces and at most one closing ':'
    or '.' stand between them (a heading's line: "Backup", "Backup:"); None otherwise."""
    at = end
    while at < len(raw) and raw[at] in " \t":
        at += 1
    if at < len(raw) and raw[at] in ":.":
        at += 1
        while at < len(raw) and raw[at] in " \t":
            at += 1
    return at if at == len(raw) or raw[at] in "\r\n" else None


def heading_end(text: str, title: str) -> int | None:
    """Where the body begins after `title` when `text` opens with it (after any whitespace,
    its section number allowed) on a line of its own; None when it does not, so a sentence
    that only begins with the title's word ("Intro text on page one." under a bookmark
    "Intro") keeps it."""
    pattern = title_pattern(title)
    body = text.lstrip()
    m = pattern.match(body) if pattern else None
    end = None if m is None else _line_end(body, m.end())
    return None if end is None else len(text) - len(body) + end


def title_pattern(title: str) -> re.Pattern[str] | None:
    """A regex for a heading's text in extracted text, from the start of a word: any
    whitespace between its words, an optional section number before it: digits or capitals
    ("2.1", "3)", "A.", "IV"), or lowercase letters closed by '.' or ')' ("a.", "iv)"). The
    title's letters match in either case, the number's only as written: "The" of "The backup
    copies" or "a" of "a backup" is no number."""
    words = [re.escape(w) for w in title.split()]
    if not words:
        return None
    number = r"(?:(?-i:(?:[0-9]{1,3}|[A-Z]{1,3})(?:\.[0-9]{1,3})*[.)]?|[a-z]{1,4}[.)])[ \t]+)?"
    return re.compile(r"(?<!\w)" + number + r"\s*".join(words), re.IGNORECASE)
