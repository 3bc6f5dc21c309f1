"""Turning PDF, Markdown and plain text into pages, sections and chunks with deterministic ids."""

from __future__ import annotations

import codecs
import hashlib
import itertools
import json
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from services.common.document_limits import SECTION_SLUG_CHARS, is_mark, section_key
from services.common.tokenizer import count_tokens, default_tokenizer
from services.docstore.chunking import (
    ChunkingConfig,
    Paragraph,
    iter_chunks,
    iter_split,
    whole_text_tokens,
)
from services.docstore.errors import (
    ChunkLimitError,
    PageLimitError,
    ParseError,
    SectionLimitError,
    UnsupportedFormatError,
)
from services.docstore.fields import MAX_TITLE_CHARS, one_line
from services.docstore.model import Chunk, Document, Section
from services.docstore.pdf import MAX_PAGES, OutlineEntry, PdfText, heading_end, read_pdf
from services.docstore.summaries import ExtractiveSummarizer, Summarizer, extractive_summary

__all__ = [
    "CONTENT_TYPE_FORMATS",
    "FORMATS",
    "MAX_CHUNKS",
    "MAX_PAGES",
    "MAX_SECTIONS",
    "PAGE_BREAK",
    "PARSER_VERSION",
    "SUFFIX_FORMATS",
    "ChunkingConfig",
    "ParseError",
    "Summarizer",
    "UnsupportedFormatError",
    "accepted_formats",
    "count_tokens",
    "decode_text",
    "derived_title",
    "extractive_summary",
    "file_suffix",
    "guess_format",
    "parse_document",
    "slugify",
    "unsupported_format",
]

PARSER_VERSION = "5"
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
MAX_SECTIONS = 20_000
"""The most headings (each starts a section) one document may have; past it
`SectionLimitError` (`max_sections`), raised at the first heading past it.

The sample and benchmark documents have at most 155 sections (the Debian FAQ: 73 pages,
about 2 a page; its 250 KB text edition 115, one per 2 KB): at that density the page bound
(`MAX_PAGES`) and the default RETR_MAX_DOCUMENT_BYTES (32 MiB) come to 15,000-21,000. Each
section is a summary passage to embed and an entry of Retrieval's section cache besides its
chunks. Without a bound, 8 MiB of one-line Markdown sections (`# h` / `x`) made 1.4 million
of them and took 1.5 GiB to parse; at the bound parsing takes about 50 MiB."""
MAX_CHUNKS = 50_000
"""The most chunks one document may cut into; past it `ChunkLimitError` (`max_chunks`),
raised at the first chunk past it, before the rest of the document is cut.

The sample and benchmark documents cut into at most 459 chunks (69 pages, about 7 a page);
this is a hundred times that, about what the default RETR_MAX_DOCUMENT_BYTES (32 MiB) of
prose makes at the default chunk size, and at the e5 profile's pace (~7 passages/s) hours of
embedding. Ingesting a document at both bounds (20,000 sections, 50,000 chunks) peaked at
1.3 GiB in the Retrieval process, 0.5 GiB of it parsing."""

SUMMARY_INPUT_CHARS = 1 << 20
"""A section's summary is written from at most its first this many characters: 18 times the
longest section of the sample and benchmark documents (56 KB, ssh_config(5)'s options), and
a bound on what the summarizer holds for one section (its sentences and their word counts)."""

_MD_HEADING = re.compile(r"(#{1,6})\s+(\S.*)")
"""An ATX heading's level and text, on a stripped line (`_md_heading` drops closing #s);
linear: no pattern here can match the same characters two ways."""
_FENCE = re.compile(r"^(```|~~~)")
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
_PAGE_NUMBER = re.compile(
    r"\d{1,4}|(?=[mdclxvi])m{0,3}(?:cm|cd|d?c{0,3})(?:xc|xl|l?x{0,3})(?:ix|iv|v?i{0,3})"
)
"""A page number on a line of its own (fullmatch): digits, or a valid lowercase roman numeral,
the style of front matter's page numbers. An uppercase word of those letters ("CLI", "MIX")
is text."""


def slugify(text: str, limit: int = 40, fallback: str = "x") -> str:
    """A lowercase id fragment of at most `limit` characters: the letters and digits of `text`
    in any script (NFKC, so "ｆｕｌｌ" is "full" and "²" is "2"), every run of anything else one
    "-", none at either end; `fallback` when no letter or digit is left. One that is not
    empty is a valid doc_id (document_limits.is_doc_id) when `limit` is within its length."""
    lowered = unicodedata.normalize("NFKC", text).lower()
    kept: list[str] = []
    for char in lowered:
        # A combining mark stays with the letter it follows (हिन्दी); alone it is no letter.
        if char.isalnum() or (is_mark(char) and kept and kept[-1] != "-"):
            kept.append(char)
        elif kept and kept[-1] != "-":
            kept.append("-")
    return "".join(kept)[:limit].strip("-") or fallback


DERIVED_DOC_ID_CHARS = 100
"""The longest doc_id derived from a file name."""


def base_name(file_name: str) -> str:
    """A file name without its folders, split at "/" or, as Windows writes them, "\\"."""
    return re.split(r"[/\\]", file_name)[-1]


def derived_doc_id(file_name: str) -> str:
    """The doc_id a file is stored under when the caller names none: its name without folders
    and suffix (`base_name`), slugified ("" when that leaves no letter or digit)."""
    stem = base_name(file_name).rsplit(".", 1)[0]
    return slugify(stem, DERIVED_DOC_ID_CHARS, fallback="")


CONTENT_TYPE_FORMATS: Mapping[str, str] = {
    "text/markdown": "markdown",
    "text/x-markdown": "markdown",
    "application/pdf": "pdf",
    "text/csv": "csv",
    "application/csv": "csv",
    "text/plain": "text",
}
"""The format a MIME type (without its parameters) stands for, where the file name's suffix
names none."""


def file_suffix(file_name: str) -> str:
    """The suffix of a file name's last component (`base_name`) as written, its last "." on
    (".DOCX" of "a/Report.DOCX"); "" when it has none."""
    name = base_name(file_name)
    return name[name.rfind(".") :] if "." in name else ""


def guess_format(file_name: str, content_type: str) -> str:
    """ "markdown", "text", "pdf" or "csv": the file name's suffix (SUFFIX_FORMATS, any case)
    decides, else the MIME type (CONTENT_TYPE_FORMATS; a browser's application/octet-stream
    for a .md file does not turn it away); "text" for neither given; else "unknown"
    (`unsupported_format` says why)."""
    by_name = SUFFIX_FORMATS.get(file_suffix(file_name).lower())
    if by_name is not None:
        return by_name
    ct = content_type.lower().split(";", 1)[0].strip()
    return CONTENT_TYPE_FORMATS.get(ct, "text" if not ct and not file_name else "unknown")


SHOWN_NAME_CHARS = 40
"""The most characters of a file name, suffix or content type an `unsupported_format`
message quotes: `visior ingest` prints a message's first 500 (services/cli), and the list of
what is taken must fit after them."""


def unsupported_format(
    file_name: str, content_type: str, notes: Mapping[str, str] | None = None
) -> tuple[str, str]:
    """For a file `guess_format` finds no format for: the request field at fault and a
    message naming what was given and every suffix and content type taken.

    The field is "file_name" when its suffix names no format (nor does the content type, if
    one was given) or when the name has no suffix and no content type was given;
    "content_type" when the name has no suffix (or there is none) and the type names no
    format. `notes` adds a caller's rule to a format ({"csv": "only into tenant X"}). The
    file name itself is quoted only when it has no suffix: each quoted value is cut to
    SHOWN_NAME_CHARS, and the whole message stays within what `visior ingest` prints.
    """
    suffix, ct = file_suffix(file_name), content_type.strip()
    if suffix:
        field = "file_name"
        given = f"file_name's suffix {_shown(suffix)} names no format"
        if ct:
            given += f" (nor does content_type {_shown(ct)})"
    elif ct:
        field = "content_type"
        given = f"content_type {_shown(ct)} names no format, and " + (
            f"file_name {_shown(file_name)} has no suffix"
            if file_name
            else "no file_name was given"
        )
    else:
        field = "file_name"
        given = f"file_name {_shown(file_name)} has no suffix and no content_type was given"
    return field, f"unsupported format: {given}. {accepted_formats(notes)}"


def accepted_formats(notes: Mapping[str, str] | None = None) -> str:
    """Every suffix and content type `guess_format` reads, by format, from its tables; a
    format's note of `notes` after them."""

    def by_format(table: Mapping[str, str]) -> str:
        return ", ".join(
            f"{' '.join(k for k, f in table.items() if f == fmt)} ({fmt})"
            for fmt in FORMATS
            if fmt in table.values()
        )

    said = "".join(f"; {fmt} {note}" for fmt, note in (notes or {}).items())
    return (
        f"Taken: suffixes {by_format(SUFFIX_FORMATS)}; else content types "
        f"{by_format(CONTENT_TYPE_FORMATS)}{said}"
    )


def _shown(text: str) -> str:
    """`text` quoted, cut to SHOWN_NAME_CHARS characters."""
    cut = len(text) > SHOWN_NAME_CHARS
    return repr(text[: SHOWN_NAME_CHARS - 1] + "…" if cut else text)


def decode_text(content: bytes | str) -> str:
    """UTF-8 (BOM dropped; UTF-16 with a BOM accepted) with every line ending (CR LF, or a lone
    CR as old Mac files have) a LF, or `ParseError` naming the bad byte."""
    text = _decoded(content)
    if "\x00" in text:  # in any encoding: binary, or a file of another kind
        raise ParseError("content is binary, not text (it contains NUL characters)")
    return _lf_lines(text)


def _decoded(content: bytes | str) -> str:
    if isinstance(content, str):
        return content.removeprefix("\ufeff")
    if content.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            return content.decode("utf-16")
        except UnicodeDecodeError as exc:
            raise ParseError(f"content is not valid UTF-16 text: {exc.reason}") from None
    try:
        return content.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ParseError(
            f"content is not UTF-8 text (byte {exc.start}: {content[exc.start : exc.start + 1]!r})"
        ) from None


def _lf_lines(text: str) -> str:
    """`text` with CR LF and lone CR line endings as LF: lines are split at LF alone."""
    if "\r" not in text:
        return text
    return text.replace("\r\n", "\n").replace("\r", "\n")


_BLOCK = 1024
"""How many strings a `_Joined` keeps apart before it joins them into one."""


class _Joined:
    """Strings to be joined by `sep`, kept as blocks of `_BLOCK` already joined: a paragraph of
    a million one-word lines, or a section of a million one-word paragraphs, is then a
    thousand strings instead of a million objects of 60 bytes and more each."""

    def __init__(self, sep: str) -> None:
        self.sep = sep
        self._blocks: list[str] = []
        self._parts: list[str] = []

    def __bool__(self) -> bool:
        return bool(self._parts or self._blocks)

    def append(self, text: str) -> None:
        self._parts.append(text)
        if len(self._parts) == _BLOCK:
            self._blocks.append(self.sep.join(self._parts))
            self._parts = []

    def text(self) -> str:
        """The strings joined by `sep`."""
        return self.sep.join([*self._blocks, *self._parts])

    def parts(self) -> Iterator[str]:
        """The strings one at a time (when none of them holds `sep`)."""
        for block in self._blocks:
            yield from block.split(self.sep)
        yield from self._parts


class _Paragraphs:
    """A section's paragraphs as few objects: their texts, which hold no newline (a
    paragraph's lines are joined by spaces), joined by newlines; their pages as runs."""

    def __init__(self) -> None:
        self._texts = _Joined("\n")
        self._pages: list[list[int]] = []  # [page, paragraphs on it in a row]

    def __bool__(self) -> bool:
        return bool(self._texts)

    def __iter__(self) -> Iterator[Paragraph]:
        pages = (page for page, n in self._pages for _ in range(n))
        return map(Paragraph, self._texts.parts(), pages)

    def append(self, text: str, page: int) -> None:
        self._texts.append(text)
        if self._pages and self._pages[-1][0] == page:
            self._pages[-1][1] += 1
        else:
            self._pages.append([page, 1])

    def extend(self, paragraphs: Iterable[Paragraph]) -> None:
        for paragraph in paragraphs:
            self.append(paragraph.text, paragraph.page)

    def body(self, limit: int) -> str:
        """The paragraphs' texts, a blank line between them, cut at `limit` characters."""
        out: list[str] = []
        size = 0
        for text in self._texts.parts():
            if size >= limit:
                break
            out.append(text)
            size += len(text) + 2
        return "\n\n".join(out)[:limit]


@dataclass
class _RawSection:
    heading: str
    """The section's own heading ("" for text before the first heading)."""
    path: tuple[str, ...]
    """The heading path shown as the title ("Parent", "Child"); empty = the document title."""
    paragraphs: _Paragraphs = field(default_factory=_Paragraphs)
    page: int = 1
    """The page the heading is on."""
    heading_is_text: bool = True
    """Whether the heading is the document's own text (not a page group's name, "pp. 1–5")."""


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
    process, or a `pdf_worker.PdfWorker`). A caller's `title` is one line (its runs of
    whitespace, newlines too, one space); a blank one gives way to the document's own.
    """
    cfg = config or ChunkingConfig()
    summ = summarizer or ExtractiveSummarizer(cfg.summary_sentences)
    title = one_line(title)
    if fmt == "csv":
        raise UnsupportedFormatError(
            "a CSV file is a knowledge base (one article per row): use read_knowledge_base_csv"
        )
    if fmt not in FORMATS:
        parsed = ", ".join(f for f in FORMATS if f != "csv")
        raise UnsupportedFormatError(f"format {fmt!r} is not supported ({parsed})")
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
        page_texts = _text_pages(decode_text(content))
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


def _text_pages(text: str) -> tuple[str, ...]:
    """A text or Markdown document's pages (a form feed starts each), or `PageLimitError`
    for more than MAX_PAGES, counted before the text is cut."""
    breaks = text.count(PAGE_BREAK)
    if breaks >= MAX_PAGES:
        raise PageLimitError(
            f"the document has {breaks + 1} pages (each form feed starts one); at most "
            f"{MAX_PAGES} are accepted",
            limit=MAX_PAGES,
        )
    return tuple(text.split(PAGE_BREAK))


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
    _keep_bare_headings(raw_sections)
    sections: list[Section] = []
    chunks: list[Chunk] = []
    for index, raw in enumerate(raw_sections):
        section_id = section_key(doc_id, index, slugify(raw.heading or "intro", SECTION_SLUG_CHARS))
        first = len(chunks)
        for piece in iter_chunks(raw.paragraphs, cfg, tok):
            if len(chunks) == MAX_CHUNKS:
                raise ChunkLimitError(
                    f"the document cuts into more than {MAX_CHUNKS} chunks of at most "
                    f"{cfg.chunk_tokens} tokens",
                    limit=MAX_CHUNKS,
                )
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
        if len(chunks) == first:
            continue
        section_title = derived_title(TITLE_SEPARATOR.join(raw.path) or raw.heading or title)
        body = raw.paragraphs.body(SUMMARY_INPUT_CHARS)
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


def _keep_bare_headings(raw_sections: list[_RawSection]) -> None:
    """A heading with no text under it is dropped as a section when the next section is its
    child, whose title path carries it; any other such heading (the next one is a sibling or
    shallower, or there is none) becomes its own section's one line of text, so no heading's
    words are lost ("### Support: +7 495 123-45-67" followed by "### Sales: …")."""
    for raw, after in zip(raw_sections, [*raw_sections[1:], None], strict=True):
        if raw.paragraphs or not raw.path or not raw.heading_is_text:
            continue
        depth = len(raw.path)
        if after is not None and len(after.path) > depth and after.path[:depth] == raw.path:
            continue
        raw.paragraphs.append(raw.heading, raw.page)


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
        for line in iter_split(page, "\n"):
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


def _setext_level(line: str) -> int:
    """1 for a setext heading's underline of "=" (at most three spaces in, nothing else on
    the line), 2 for one of "-", else 0."""
    stripped = line.strip()
    if not stripped or len(line) - len(line.lstrip(" ")) > 3:
        return 0
    if stripped.strip("=") == "":
        return 1
    return 2 if stripped.strip("-") == "" else 0


def _is_thematic_break(line: str) -> bool:
    """Whether `line` is a thematic break ("---", "* * *", "___"): three or more of one of
    `-*_` and spaces or tabs between, at most three spaces in. It ends a paragraph and is
    no text of its own."""
    stripped = line.strip()
    if not stripped or stripped[0] not in "-*_" or len(line) - len(line.lstrip(" ")) > 3:
        return False
    marks = stripped.replace(" ", "").replace("\t", "")
    return len(marks) >= 3 and marks.strip(stripped[0]) == ""


_YAML_KEY = re.compile(r"[A-Za-z_][\w-]*[ \t]*:(?:[ \t]|$)")
_MAX_FRONT_MATTER_LINES = 200


def _front_matter_lines(page: str) -> int:
    """How many lines YAML front matter takes at the top of `page`, both "---" lines included;
    0 when there is none. Front matter opens with a "---" line followed by a "key:" line and
    closes with a "---" or "..." line within `_MAX_FRONT_MATTER_LINES`: a document that opens
    with a thematic break ("---", then "# Title") is no front matter."""
    lines = iter_split(page, "\n")
    if next(lines, "").rstrip() != "---" or not _YAML_KEY.match(next(lines, "")):
        return 0
    for count, line in enumerate(itertools.islice(lines, _MAX_FRONT_MATTER_LINES), start=3):
        if line.rstrip() in ("---", "..."):
            return count
    return 0


_LIST_OR_QUOTE = re.compile(r"(?:[-*+]|\d{1,9}[.)])(?:[ \t]|$)|>")
"""The start of a list item or block quote (on a stripped line): an underline after one is a
thematic break, not a setext heading."""


def _md_lines(page_texts: Sequence[str]) -> Iterator[tuple[int, str, int]]:
    """(page, line, heading level or 0) of every line: a heading's text, a line in a code
    fence right-stripped, a thematic break blank, any other stripped. Headings in code fences
    are lines.

    Headings are ATX ("## Title") or setext: a paragraph line underlined by "===" (level 1)
    or "---" (level 2) on the next line of its page. CommonMark makes the whole paragraph
    above an underline the heading; here it is the line just above, and the lines before it
    stay text. A "---" after a blank line (or a list item, or a block quote) is a thematic
    break. YAML front matter is text: its closing "---" underlines nothing."""
    fence: str | None = None
    front_matter = _front_matter_lines(page_texts[0]) if page_texts else 0
    for page_no, page in enumerate(page_texts, start=1):
        held: str | None = None  # a paragraph line an underline on the next line would head
        for index, line in enumerate(iter_split(page, "\n")):
            if page_no == 1 and index < front_matter:
                yield page_no, line.strip() if 0 < index < front_matter - 1 else "", 0
                continue
            if held is not None:
                level = _setext_level(line)
                yield page_no, held, level
                held = None
                if level:
                    continue
            stripped = line.strip()
            if not stripped or (fence is None and _is_thematic_break(line)):
                yield page_no, "", 0
                continue
            m = _FENCE.match(stripped)
            if m:
                fence = None if fence == m.group(1) else (fence or m.group(1))
            heading = _md_heading(stripped) if fence is None else None
            if heading:
                level, text = heading
                yield page_no, text, level
            elif fence is None and m is None and not _LIST_OR_QUOTE.match(stripped):
                held = stripped
            else:
                yield page_no, line.rstrip() if fence else stripped, 0
        if held is not None:
            yield page_no, held, 0


def _markdown_sections(page_texts: Sequence[str]) -> tuple[list[_RawSection], str]:
    """Sections by ATX and setext headings (not inside code fences); the lone top heading is
    the title.

    Two reads of the lines: the first takes the headings (the title is the first one only
    when no other is as shallow) and refuses a document of more than MAX_SECTIONS."""
    headings: list[tuple[int, str]] = []
    for _, text, level in _md_lines(page_texts):
        if level:
            if len(headings) == MAX_SECTIONS:
                raise _too_many_sections()
            headings.append((level, text))
    title_heading = _title_heading(headings)
    sections = [_RawSection("", ())]
    stack: list[tuple[int, str]] = []
    para = _Joined(" ")
    para_page = 1

    def flush() -> None:
        nonlocal para
        if para:
            sections[-1].paragraphs.append(para.text(), para_page)
            para = _Joined(" ")

    prev_page = 1
    for page_no, line, level in _md_lines(page_texts):
        if page_no != prev_page:
            flush()
            prev_page = page_no
        if level:
            flush()
            is_title = len(sections) == 1 and title_heading is not None
            while stack and stack[-1][0] >= level:
                stack.pop()
            if not is_title:
                stack.append((level, line))
            sections.append(_RawSection(line, tuple(t for _, t in stack), page=page_no))
        elif not line:
            flush()
        else:
            if not para:
                para_page = page_no
            para.append(line)
    flush()
    return sections, title_heading or ""


def _too_many_sections() -> SectionLimitError:
    return SectionLimitError(
        f"the document has more than {MAX_SECTIONS} headings (each starts a section)",
        limit=MAX_SECTIONS,
    )


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

    def heading(self, line: str) -> int | None:
        """The heading's level when `line` is the next heading in sequence, else None."""
        if len(line) > 160:
            return None
        m = _CHAPTER.match(line)
        if m:
            # "Раздел 6.3, «…»)." or "Глава 13, Помощь …" wrapped from body text is a
            # cross-reference, not a heading.
            title = m.group("title")
            if title[:1] in ",;)" or line.rstrip().endswith((").", "),", ",")):
                return None
            return 1
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
        return len(num)

    def _follows(self, num: list[int]) -> bool:
        cur = self.current
        if not cur:
            return num[0] in (0, 1) and all(n == 1 for n in num[1:])
        if num == [*cur, 1]:
            return True
        k = len(num)
        return k <= len(cur) and num[: k - 1] == cur[: k - 1] and num[-1] == cur[k - 1] + 1


def _text_sections(page_texts: Sequence[str]) -> list[_RawSection]:
    """Sections by numbered headings ("1.", "2.3 Title", "Глава 2"); paragraphs by blank lines.
    A numbered line with no text after it before the next ("1. Stop the service" in a
    list of steps) is a section of its own, and keeps its line as its text (`_build`)."""
    sections = [_RawSection("", ())]
    numbering = _Numbering()
    stack: list[tuple[int, str]] = []
    for page_no, page in enumerate(page_texts, start=1):
        para = _Joined(" ")
        for raw_line in iter_split(page, "\n"):
            line = raw_line.strip()
            if not line or (level := numbering.heading(line)) is None:
                para = _add_line(sections[-1], para, line, page_no)
                continue
            para = _add_line(sections[-1], para, "", page_no)
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, line))
            if len(sections) > MAX_SECTIONS:
                raise _too_many_sections()
            sections.append(_RawSection(line, tuple(t for _, t in stack), page=page_no))
        _add_line(sections[-1], para, "", page_no)
    return sections


def _add_line(section: _RawSection, para: _Joined, line: str, page: int) -> _Joined:
    """`line` added to the paragraph being read; a blank one ends it (into `section`)."""
    if line:
        para.append(line)
        return para
    if para:
        section.paragraphs.append(para.text(), page)
        return _Joined(" ")
    return para


# --- PDF -------------------------------------------------------------------------------------


def _pdf_sections(pdf: PdfText, cfg: ChunkingConfig) -> list[_RawSection]:
    """Sections from the outline; else numbered headings; else groups of pages."""
    furniture = _running_lines(pdf.pages)
    pages = [_without_furniture(page, furniture) for page in pdf.pages]
    if pdf.outline:
        return _pdf_outline_sections(pages, pdf.outline)
    by_headings = _text_sections(["\n".join(_pdf_lines(p, True, True)) for p in pages])
    if len(by_headings) > 1:
        return by_headings
    groups: list[_RawSection] = []
    step = cfg.pdf_pages_per_section
    for first in range(0, len(pages), step):
        last = min(len(pages), first + step)
        name = f"pp. {first + 1}–{last}" if last > first + 1 else f"p. {first + 1}"
        section = _RawSection(name, (name,), page=first + 1, heading_is_text=False)
        for page_no in range(first + 1, last + 1):
            section.paragraphs.extend(_pdf_paragraphs(pages[page_no - 1], page_no, True, True))
        groups.append(section)
    return groups


_EDGE_LINES = 2
"""Running headers and footers are looked for in a page's first and last this many
non-blank lines, and removed only there."""


def _running_lines(pages: Sequence[str]) -> frozenset[str]:
    """Running headers/footers: keys (digits as '#') of edge lines repeated on at least 40% of
    pages. A line of digits alone is no key: the body has such lines ("389", a port; "1", a
    runlevel), and a bare page number at a page's very edge goes by `_PAGE_NUMBER`."""
    if len(pages) < 3:
        return frozenset()
    seen: dict[str, int] = {}
    for page in pages:
        lines = [line.strip() for line in page.split("\n") if line.strip()]
        for line in {*lines[:_EDGE_LINES], *lines[-_EDGE_LINES:]}:
            key = _furniture_key(line)
            seen[key] = seen.get(key, 0) + 1
    return frozenset(
        k for k, n in seen.items() if k.replace("#", "").strip() and n >= max(3, 0.4 * len(pages))
    )


def _furniture_key(line: str) -> str:
    return re.sub(r"\d+", "#", line.strip()) if len(line) <= 100 else ""


def _without_furniture(page: str, furniture: frozenset[str]) -> str:
    """`page` with the running header and footer lines among its first and last non-blank
    lines (`_EDGE_LINES`) blanked to spaces: offsets into the page (an outline heading's)
    still hold, and the same words in the body stay."""
    if not furniture:
        return page
    lines = page.split("\n")
    filled = [i for i, line in enumerate(lines) if line.strip()]
    for i in {*filled[:_EDGE_LINES], *filled[-_EDGE_LINES:]}:
        if _furniture_key(lines[i]) in furniture:
            lines[i] = " " * len(lines[i])
    return "\n".join(lines)


def _pdf_outline_sections(
    pages: Sequence[str], outline: Sequence[OutlineEntry]
) -> list[_RawSection]:
    entries = sorted(outline, key=lambda e: (e.page, e.offset))
    # Section k runs from its heading to the next heading; text before the first is the intro.
    bounds = [(1, 0), *((e.page, e.offset) for e in entries), (len(pages), -1)]
    sections = [_RawSection("", ())]
    stack: list[tuple[int, str]] = []
    for entry in entries:
        while stack and stack[-1][0] >= entry.level:
            stack.pop()
        stack.append((entry.level, entry.title))
        sections.append(_RawSection(entry.title, tuple(t for _, t in stack), page=entry.page))
    for k, section in enumerate(sections):
        (p0, o0), (p1, o1) = bounds[k], bounds[k + 1]
        first_piece = True
        for page_no in range(p0, p1 + 1):
            page = pages[page_no - 1]
            start = o0 if page_no == p0 else 0
            end = o1 if page_no == p1 and o1 >= 0 else len(page)
            piece = page[start:end]
            if first_piece and section.heading:
                piece = _drop_heading(piece, section.heading)
            first_piece = False
            section.paragraphs.extend(_pdf_paragraphs(piece, page_no, start == 0, end == len(page)))
    return sections


def _drop_heading(text: str, heading: str) -> str:
    """`text` without the outline heading it opens with, when the heading stands on a line of
    its own (pdf.heading_end); else `text` whole."""
    end = heading_end(text, heading)
    return text if end is None else text[end:]


def _pdf_lines(text: str, page_start: bool, page_end: bool) -> list[str]:
    """Lines of a page (piece) without a bare page number at the page's edge."""
    lines = [_DOT_LEADER.sub(" … ", line).strip() for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    if page_end and lines and _PAGE_NUMBER.fullmatch(lines[-1]):
        lines.pop()
    if page_start and lines and _PAGE_NUMBER.fullmatch(lines[0]):
        lines.pop(0)
    return lines


def _pdf_paragraphs(text: str, page: int, page_start: bool, page_end: bool) -> list[Paragraph]:
    """PDF lines joined into paragraphs: a short line ending a sentence closes one."""
    lines = _pdf_lines(text, page_start, page_end)
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
