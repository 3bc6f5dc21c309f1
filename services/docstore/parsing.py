"""Turning PDF, Markdown and plain text into pages, sections and chunks with deterministic ids."""

from __future__ import annotations

import codecs
import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from services.common.tokenizer import count_tokens, default_tokenizer
from services.docstore.chunking import (
    ChunkingConfig,
    Paragraph,
    chunk_paragraphs,
    whole_text_tokens,
)
from services.docstore.errors import ParseError, UnsupportedFormatError
from services.docstore.fields import MAX_TITLE_CHARS
from services.docstore.model import Chunk, Document, Section
from services.docstore.pdf import PdfText, read_pdf, title_pattern
from services.docstore.summaries import ExtractiveSummarizer, Summarizer, extractive_summary

__all__ = [
    "FORMATS",
    "PAGE_BREAK",
    "PARSER_VERSION",
    "SUFFIX_FORMATS",
    "ChunkingConfig",
    "ParseError",
    "Summarizer",
    "UnsupportedFormatError",
    "count_tokens",
    "decode_text",
    "derived_title",
    "extractive_summary",
    "guess_format",
    "parse_document",
    "slugify",
]

PARSER_VERSION = "2"
"""Bumped whenever parsing or chunking changes its output, so every generation changes too."""
FORMATS = ("markdown", "text", "pdf", "csv")
SUFFIX_FORMATS: Mapping[str, str] = {
    ".md": "markdown",
    ".markdown": "markdown",
    ".pdf": "pdf",
    ".csv": "csv",
    ".txt": "text",
    ".text": "text",
}
"""The format a file name's lowercase suffix stands for (guess_format reads it)."""
PAGE_BREAK = "\f"
TITLE_SEPARATOR = " › "
MAX_FIRST_LINE_TITLE = 120
"""A first line longer than this is a paragraph, not a title: the document without one is
titled by its doc_id."""

_MD_HEADING = re.compile(r"(#{1,6})\s+(\S.*)")
"""An ATX heading's level and text, on a stripped line (`_md_heading` drops closing #s);
linear: no pattern here can match the same characters two ways."""
_FENCE = re.compile(r"^(```|~~~)")
_SLUG = re.compile(r"[^0-9a-zа-яё]+")
# "2.3 Title", "1. Introduction", "8.1.3. aptitude", "7.8. Что такое виртуальный пакет?" — a
# short title with no sentence punctuation; a lowercase start only under a dotted number
# (a command name), never after a bare "1 " (a list item).
_NUMBERED = re.compile(
    r"^(?P<num>\d{1,2}(?:\.\d{1,2}){0,3})\.?\s+(?P<title>[^\W\d_][^\n]{0,150}?)\s*$"
)
_MAX_HEADING_WORDS = 12
_MAX_QUESTION_HEADING_WORDS = 24  # FAQ headings are whole questions
_CHAPTER = re.compile(
    r"^(?P<kw>глава|раздел|часть|приложение|chapter|part|appendix)\s+"
    r"(?P<num>\d{1,3}|[IVXLC]{1,6}|[A-ZА-Я])\b[.:]?\s*(?P<title>[^\n]{0,100}?)\s*$",
    re.IGNORECASE,
)
_DOT_LEADER = re.compile(r"(?:\.\s?){4,}")
_BARE_NUMBER = re.compile(r"^(\d{1,4}|[ivxlc]{1,6})$", re.IGNORECASE)


def slugify(text: str, limit: int = 40, fallback: str = "x") -> str:
    """A lowercase id fragment of letters and digits (Cyrillic kept); `fallback` when none."""
    slug = _SLUG.sub("-", text.lower()).strip("-")
    return slug[:limit].strip("-") or fallback


DERIVED_DOC_ID_CHARS = 100
"""The longest doc_id derived from a file name."""


def derived_doc_id(file_name: str) -> str:
    """The doc_id a file is stored under when the caller names none: its name without folders
    and suffix, slugified ("" when that leaves nothing)."""
    stem = file_name.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    return slugify(stem, DERIVED_DOC_ID_CHARS, fallback="")


def guess_format(file_name: str, content_type: str) -> str:
    """ "markdown", "text", "pdf" or "csv" from the file name or MIME type; else "unknown"."""
    name = file_name.lower()
    ct = content_type.lower().split(";", 1)[0].strip()
    by_name = SUFFIX_FORMATS.get(name[name.rfind(".") :]) if "." in name else None
    if ct in ("text/markdown", "text/x-markdown") or by_name == "markdown":
        return "markdown"
    if ct == "application/pdf" or by_name == "pdf":
        return "pdf"
    if ct in ("text/csv", "application/csv") or by_name == "csv":
        return "csv"
    if ct == "text/plain" or by_name == "text":
        return "text"
    return "text" if not ct and not name else "unknown"


def decode_text(content: bytes | str) -> str:
    """UTF-8 (BOM dropped; UTF-16 with a BOM accepted) or `ParseError` naming the bad byte."""
    if isinstance(content, str):
        return content.removeprefix("\ufeff")
    if content.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            return content.decode("utf-16")
        except UnicodeDecodeError as exc:
            raise ParseError(f"content is not valid UTF-16 text: {exc.reason}") from None
    try:
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ParseError(
            f"content is not UTF-8 text (byte {exc.start}: {content[exc.start : exc.start + 1]!r})"
        ) from None
    if "\x00" in text:
        raise ParseError("content is binary, not text (it contains NUL characters)")
    return text


@dataclass
class _RawSection:
    heading: str
    """The section's own heading ("" for text before the first heading)."""
    path: tuple[str, ...]
    """The heading path shown as the title ("Parent", "Child"); empty = the document title."""
    paragraphs: list[Paragraph] = field(default_factory=list)


def parse_document(
    *,
    tenant_id: str,
    doc_id: str,
    content: bytes | str = b"",
    fmt: str,
    title: str = "",
    product: str = "",
    version: str = "",
    tags: tuple[str, ...] = (),
    source: str = "user",
    metadata: Mapping[str, str] | None = None,
    config: ChunkingConfig | None = None,
    summarizer: Summarizer | None = None,
    pdf_reader: Callable[[bytes], PdfText] = read_pdf,
) -> Document:
    """Parse one document (PDF, Markdown or plain text) into pages, sections and chunks.

    `content` is the raw file (bytes; a str is taken as already-decoded text). Plain text and
    Markdown mark page breaks with form feeds. Raises `UnsupportedFormatError` for other
    formats (a knowledge-base CSV goes through `kb_csv.read_knowledge_base_csv`) and
    `ParseError` for unreadable input. `pdf_reader` reads a PDF's text (`read_pdf` in this
    process, or a `pdf_worker.PdfWorker`).
    """
    cfg = config or ChunkingConfig()
    summ = summarizer or ExtractiveSummarizer(cfg.summary_sentences)
    if fmt == "csv":
        raise UnsupportedFormatError(
            "a CSV file is a knowledge base (one article per row): use read_knowledge_base_csv"
        )
    if fmt not in FORMATS:
        raise UnsupportedFormatError(f"format {fmt!r} is not supported (markdown, text, pdf)")
    if fmt == "pdf":
        if isinstance(content, str):
            raise ParseError("a PDF must be given as bytes")
        pdf = pdf_reader(content)
        page_texts = pdf.pages
        sections = _pdf_sections(pdf, cfg)
        title = title or derived_title(pdf.title or _first_line(page_texts) or doc_id)
        if not any(p.strip() for p in page_texts):
            raise ParseError("the PDF has no text layer (a scan?); OCR is not supported")
    else:
        decoded = decode_text(content)
        page_texts = tuple(decoded.split(PAGE_BREAK))
        if fmt == "markdown":
            sections, heading_title = _markdown_sections(page_texts)
            title = title or derived_title(heading_title or doc_id)
        else:
            sections = _text_sections(page_texts)
            title = title or derived_title(_first_line(page_texts) or doc_id)
    # The parsed format last: caller metadata cannot claim a PDF is Markdown.
    meta = {**(metadata or {}), "format": fmt}
    generation = document_generation(
        content, fmt=fmt, title=title, product=product, version=version, tags=tags,
        source=source, metadata=meta, config=cfg, summarizer=summ.name,
    )  # fmt: skip
    built_sections, chunks = _build(doc_id, title, sections, cfg, summ)
    return Document(
        tenant_id=tenant_id,
        doc_id=doc_id,
        title=title,
        source=source,
        product=product,
        version=version,
        tags=tuple(tags),
        pages=max(1, len(page_texts)),
        sections=built_sections,
        chunks=chunks,
        generation=generation,
        metadata=meta,
        page_texts=page_texts,
        tokens=whole_text_tokens(page_texts, (c.text for c in chunks), cfg.encoding),
    )


def document_generation(
    content: bytes | str,
    *,
    fmt: str,
    title: str,
    product: str,
    version: str,
    tags: Sequence[str],
    source: str,
    metadata: Mapping[str, str],
    config: ChunkingConfig,
    summarizer: str,
) -> str:
    """16 hex digits that change whenever anything the parse depends on changes."""
    data = content.encode() if isinstance(content, str) else content
    head = {
        "parser": PARSER_VERSION,
        "content": hashlib.sha256(data).hexdigest(),
        "fmt": fmt,
        "title": title,
        "product": product,
        "version": version,
        "tags": list(tags),
        "source": source,
        "metadata": dict(sorted(metadata.items())),
        "config": asdict(config),
        "summarizer": summarizer,
    }
    blob = json.dumps(head, sort_keys=True, ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _build(
    doc_id: str,
    title: str,
    raw_sections: list[_RawSection],
    cfg: ChunkingConfig,
    summarizer: Summarizer,
) -> tuple[tuple[Section, ...], tuple[Chunk, ...]]:
    tok = default_tokenizer(cfg.encoding)
    sections: list[Section] = []
    chunks: list[Chunk] = []
    for index, raw in enumerate(raw_sections):
        pieces = chunk_paragraphs(raw.paragraphs, cfg, tok) if raw.paragraphs else []
        if not pieces:
            continue
        section_id = f"{doc_id}:s{index:03d}-{slugify(raw.heading or 'intro')}"
        section_title = derived_title(TITLE_SEPARATOR.join(raw.path) or raw.heading or title)
        first = len(chunks)
        for piece in pieces:
            chunks.append(
                Chunk(
                    doc_id=doc_id,
                    chunk_id=f"{doc_id}:c{len(chunks):05d}",
                    section_id=section_id,
                    ord=len(chunks),
                    text=piece.text,
                    tokens=piece.tokens,
                    page_start=piece.page_start,
                    page_end=piece.page_end,
                )
            )
        body = "\n\n".join(p.text for p in raw.paragraphs)
        sections.append(
            Section(
                section_id=section_id,
                ord=len(sections),
                title=section_title,
                summary=summarizer.summarize(section_title, body, cfg.summary_chars),
                page_start=min(c.page_start for c in chunks[first:]),
                page_end=max(c.page_end for c in chunks[first:]),
                first_chunk_ord=first,
                last_chunk_ord=len(chunks) - 1,
            )
        )
    return tuple(sections), tuple(chunks)


_WORD_END = re.compile(r"([\s\S]*\S)\s")


def derived_title(text: str) -> str:
    """A title the document gives itself (its PDF metadata title, its lone top Markdown
    heading, its first line; else its doc_id) or a section's (its heading path), held to the
    bound of a caller's title, fields.MAX_TITLE_CHARS: stripped, and when longer cut at the
    last space within the bound, or at the bound when there is none."""
    text = text.strip()
    if len(text) <= MAX_TITLE_CHARS:
        return text
    word_end = _WORD_END.match(text[: MAX_TITLE_CHARS + 1])
    return word_end.group(1) if word_end else text[:MAX_TITLE_CHARS]


def _first_line(page_texts: Sequence[str]) -> str:
    """The first non-blank line (Markdown '#' marks off) when it is short enough to be a
    title (MAX_FIRST_LINE_TITLE); else ""."""
    for page in page_texts:
        for line in page.split("\n"):
            line = line.strip().lstrip("#").strip()
            if line:
                return line if len(line) <= MAX_FIRST_LINE_TITLE else ""
    return ""


# --- Markdown -------------------------------------------------------------------------------


def _md_heading(line: str) -> tuple[int, str] | None:
    """(level, text) of a Markdown ATX heading ("## Title", "## Title ##"), or None; `line`
    is stripped."""
    m = _MD_HEADING.fullmatch(line)
    if m is None:
        return None
    text = m.group(2)
    return len(m.group(1)), text.rstrip("#").rstrip() or text


def _markdown_sections(page_texts: Sequence[str]) -> tuple[list[_RawSection], str]:
    """Sections by ATX headings (not inside code fences); the lone top heading is the title."""
    headings: list[tuple[int, str]] = []  # (level, text) in order, to find the title heading
    lines: list[tuple[int, str, int]] = []  # (page, line, heading level or 0)
    fence: str | None = None
    for page_no, page in enumerate(page_texts, start=1):
        for line in page.split("\n"):
            stripped = line.strip()
            m = _FENCE.match(stripped)
            if m:
                fence = None if fence == m.group(1) else (fence or m.group(1))
            heading = _md_heading(stripped) if fence is None else None
            if heading:
                level, text = heading
                headings.append((level, text))
                lines.append((page_no, text, level))
            else:
                lines.append((page_no, line.rstrip() if fence else stripped, 0))
    title_heading = _title_heading(headings)
    sections = [_RawSection("", ())]
    stack: list[tuple[int, str]] = []
    para: list[str] = []
    para_page = 1
    seen_headings = 0

    def flush() -> None:
        if para:
            sections[-1].paragraphs.append(Paragraph(" ".join(para), para_page))
            para.clear()

    prev_page = 1
    for page_no, line, level in lines:
        if page_no != prev_page:
            flush()
            prev_page = page_no
        if level:
            flush()
            is_title = seen_headings == 0 and title_heading is not None
            seen_headings += 1
            while stack and stack[-1][0] >= level:
                stack.pop()
            if not is_title:
                stack.append((level, line))
            sections.append(_RawSection(line, tuple(t for _, t in stack)))
        elif not line:
            flush()
        else:
            if not para:
                para_page = page_no
            para.append(line)
    flush()
    return sections, title_heading or ""


def _title_heading(headings: list[tuple[int, str]]) -> str | None:
    """The first heading when it is the only one at the shallowest level (the document title)."""
    if not headings:
        return None
    top = min(level for level, _ in headings)
    level, text = headings[0]
    if level == top and sum(1 for lv, _ in headings if lv == top) == 1:
        return text
    return None


# --- Plain text and numbered headings --------------------------------------------------------


class _Numbering:
    """Accepts a numbered heading only when it continues the numbering seen so far."""

    def __init__(self) -> None:
        self.current: list[int] = []

    def heading(self, line: str) -> tuple[int, str] | None:
        """(level, title) when `line` is the next heading in sequence, else None."""
        if len(line) > 160:
            return None
        m = _CHAPTER.match(line)
        if m:
            # "Раздел 6.3, «…»)." or "Глава 13, Помощь …" wrapped from body text is a
            # cross-reference, not a heading.
            title = m.group("title")
            if title[:1] in ",;)" or line.rstrip().endswith((").", "),", ",")):
                return None
            return 1, line
        m = _NUMBERED.match(line)
        if not m:
            return None
        title = m.group("title")
        words = len(title.split())
        limit = _MAX_QUESTION_HEADING_WORDS if title.endswith("?") else _MAX_HEADING_WORDS
        if title[-1:] in ".,;:" or words > limit:
            return None
        if title[0].islower() and "." not in m.group("num"):
            return None
        num = [int(p) for p in m.group("num").split(".")]
        if not self._follows(num):
            return None
        self.current = num
        return len(num), line

    def _follows(self, num: list[int]) -> bool:
        cur = self.current
        if not cur:
            return num[0] in (0, 1) and all(n == 1 for n in num[1:])
        if num == [*cur, 1]:
            return True
        k = len(num)
        return k <= len(cur) and num[: k - 1] == cur[: k - 1] and num[-1] == cur[k - 1] + 1


def _text_sections(page_texts: Sequence[str]) -> list[_RawSection]:
    """Sections by numbered headings ("1.", "2.3 Title", "Глава 2"); paragraphs by blank lines."""
    sections = [_RawSection("", ())]
    numbering = _Numbering()
    stack: list[tuple[int, str]] = []
    for page_no, page in enumerate(page_texts, start=1):
        para: list[str] = []
        for raw_line in [*page.split("\n"), ""]:
            line = raw_line.strip()
            found = numbering.heading(line) if line else None
            if found or not line:
                if para:
                    sections[-1].paragraphs.append(Paragraph(" ".join(para), page_no))
                    para = []
            if found:
                level, heading = found
                while stack and stack[-1][0] >= level:
                    stack.pop()
                stack.append((level, heading))
                sections.append(_RawSection(heading, tuple(t for _, t in stack)))
            elif line:
                para.append(line)
    return sections


# --- PDF -------------------------------------------------------------------------------------


def _pdf_sections(pdf: PdfText, cfg: ChunkingConfig) -> list[_RawSection]:
    """Sections from the outline; else numbered headings; else groups of pages."""
    furniture = _running_lines(pdf.pages)
    if pdf.outline:
        return _pdf_outline_sections(pdf, furniture)
    by_headings = _text_sections(
        ["\n".join(_pdf_lines(p, True, True, furniture)) for p in pdf.pages]
    )
    if len(by_headings) > 1:
        return by_headings
    groups: list[_RawSection] = []
    step = cfg.pdf_pages_per_section
    for first in range(0, len(pdf.pages), step):
        last = min(len(pdf.pages), first + step)
        name = f"pp. {first + 1}–{last}" if last > first + 1 else f"p. {first + 1}"
        section = _RawSection(name, (name,))
        for page_no in range(first + 1, last + 1):
            section.paragraphs.extend(
                _pdf_paragraphs(pdf.pages[page_no - 1], page_no, True, True, furniture)
            )
        groups.append(section)
    return groups


def _running_lines(pages: Sequence[str]) -> frozenset[str]:
    """Running headers/footers: edge lines (digits ignored) repeated on at least 40% of pages."""
    if len(pages) < 3:
        return frozenset()
    seen: dict[str, int] = {}
    for page in pages:
        lines = [line.strip() for line in page.split("\n") if line.strip()]
        for line in {*lines[:2], *lines[-2:]}:
            key = _furniture_key(line)
            seen[key] = seen.get(key, 0) + 1
    return frozenset(k for k, n in seen.items() if k and n >= max(3, 0.4 * len(pages)))


def _furniture_key(line: str) -> str:
    return re.sub(r"\d+", "#", line.strip()) if len(line) <= 100 else ""


def _pdf_outline_sections(pdf: PdfText, furniture: frozenset[str]) -> list[_RawSection]:
    entries = sorted(pdf.outline, key=lambda e: (e.page, e.offset))
    # Section k runs from its heading to the next heading; text before the first is the intro.
    bounds = [(1, 0), *((e.page, e.offset) for e in entries), (len(pdf.pages), -1)]
    sections = [_RawSection("", ())]
    stack: list[tuple[int, str]] = []
    for entry in entries:
        while stack and stack[-1][0] >= entry.level:
            stack.pop()
        stack.append((entry.level, entry.title))
        sections.append(_RawSection(entry.title, tuple(t for _, t in stack)))
    for k, section in enumerate(sections):
        (p0, o0), (p1, o1) = bounds[k], bounds[k + 1]
        first_piece = True
        for page_no in range(p0, p1 + 1):
            page = pdf.pages[page_no - 1]
            start = o0 if page_no == p0 else 0
            end = o1 if page_no == p1 and o1 >= 0 else len(page)
            piece = page[start:end]
            if first_piece and section.heading:
                piece = _drop_heading(piece, section.heading)
            first_piece = False
            section.paragraphs.extend(
                _pdf_paragraphs(piece, page_no, start == 0, end == len(page), furniture)
            )
    return sections


def _drop_heading(text: str, heading: str) -> str:
    pattern = title_pattern(heading)
    m = pattern.match(text.lstrip()) if pattern else None
    return text.lstrip()[m.end() :] if m else text


def _pdf_lines(text: str, page_start: bool, page_end: bool, furniture: frozenset[str]) -> list[str]:
    """Lines of a page (piece) without running headers/footers or a bare page number."""
    lines = [
        "" if _furniture_key(line) in furniture else _DOT_LEADER.sub(" … ", line).strip()
        for line in text.split("\n")
    ]
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    if page_end and lines and _BARE_NUMBER.match(lines[-1]):
        lines.pop()
    if page_start and lines and _BARE_NUMBER.match(lines[0]):
        lines.pop(0)
    return lines


def _pdf_paragraphs(
    text: str, page: int, page_start: bool, page_end: bool, furniture: frozenset[str]
) -> list[Paragraph]:
    """PDF lines joined into paragraphs: a short line ending a sentence closes one."""
    lines = _pdf_lines(text, page_start, page_end, furniture)
    lengths = sorted(len(line) for line in lines if line)
    typical = lengths[int(len(lengths) * 0.8)] if lengths else 0
    out: list[Paragraph] = []
    para: list[str] = []
    for line in lines:
        if line:
            para.append(line)
        if para and (not line or (line[-1] in ".!?:…" and len(line) < 0.8 * typical)):
            out.append(Paragraph(" ".join(para), page))
            para = []
    if para:
        out.append(Paragraph(" ".join(para), page))
    return out
