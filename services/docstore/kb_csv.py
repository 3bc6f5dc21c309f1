"""The knowledge-base CSV (agent.md §6): one row = one Markdown article = one Document."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, TypedDict

from services.common import errors
from services.common.search_contract import KB_SOURCE, kb_tag
from services.docstore.chunking import ChunkingConfig
from services.docstore.errors import (
    ChunkLimitError,
    KnowledgeBaseError,
    ParseError,
    RowProblem,
)
from services.docstore.fields import MAX_TAGS, check_fields, normalized_tags, one_line
from services.docstore.model import Document
from services.docstore.parsing import (
    MAX_CHUNKS,
    base_name,
    decode_text,
    parse_document,
    slugify,
)
from services.docstore.summaries import Summarizer

REQUIRED_COLUMNS = ("title", "content", "topic", "jurisdiction", "updated_at")
"""Every knowledge-base CSV has these columns (header names are case-insensitive)."""
DEFAULT_KB_FILE = "train_data.csv"
"""The knowledge base's file (agent.md) when an ingest names none."""
SNIFF_CHARS = 1024
"""The header's first characters the delimiter is guessed from: csv.Sniffer is about
quadratic in its sample, and a header's delimiters show within its first names."""
_TAG_SPLIT = re.compile(r"[;,]")
_RU_DATE = re.compile(r"^(\d{2})\.(\d{2})\.(\d{4})$")
_ROW_METADATA = ("topic", "jurisdiction", "url")
"""The metadata an article takes from its row's cells (the rest is made by this module)."""
MAX_FIELD_CHARS = 2**31 - 1
"""The csv field size limit a knowledge-base CSV is read under. csv's default (131,072
characters) refused a longer article as malformed CSV and left the rows after it unread.
No field of a file Retrieval accepts reaches this one (a field is at most its file, and
RETR_MAX_DOCUMENT_BYTES at most 256 MiB), and it is the largest every platform's csv takes
(a C long); an article is held to a document's bounds (pages, sections, chunks) instead."""


def kb_file_key(file_name: str) -> str:
    """Which knowledge-base CSV a file is, by its base name: re-ingesting it replaces the
    articles an earlier version of it wrote (the spec's train_data.csv when unnamed)."""
    return base_name(file_name) or DEFAULT_KB_FILE


@dataclass(frozen=True)
class KnowledgeBaseParse:
    """The articles of a knowledge-base CSV and the rows that could not be used."""

    documents: list[Document]
    problems: list[RowProblem]

    def strict(self) -> list[Document]:
        """Every row as a Document (source="knowledge_base"), or `KnowledgeBaseError` listing
        every bad row by line number."""
        if self.problems:
            shown = "; ".join(str(p) for p in self.problems[:20])
            more = f" (and {len(self.problems) - 20} more)" if len(self.problems) > 20 else ""
            raise KnowledgeBaseError(
                f"{len(self.problems)} bad row(s) in the knowledge-base CSV: {shown}{more}",
                problems=tuple(self.problems),
            )
        return self.documents


def read_knowledge_base_csv(
    content: bytes | str,
    tenant_id: str,
    *,
    file_name: str = DEFAULT_KB_FILE,
    config: ChunkingConfig | None = None,
    summarizer: Summarizer | None = None,
    doc_id_prefix: str = "kb-",
) -> KnowledgeBaseParse:
    """Parse every usable row; bad rows are reported (with their line numbers), not raised.

    Besides REQUIRED_COLUMNS, a row's `id` makes the doc_id (else the title does), `tags` are
    split on , or ; and normalised as a request's are (`fields.normalized_tags`), and
    `product`, `version` and `url` are kept when present. A row is held to the bounds an
    IngestDocument request is (`fields.check_fields`): its title, product, version, tags
    (topic and jurisdiction are two of them) and topic, jurisdiction and url metadata; a row
    past them is a bad row.

    Raises `KnowledgeBaseError` only when the file as a whole is unusable: no header, or
    required columns missing (the error names them).
    """
    text = decode_text(content)
    _allow_long_fields()
    try:
        dialect: type[csv.Dialect] | csv.Dialect = csv.Sniffer().sniff(
            text[:SNIFF_CHARS].split("\n", 1)[0], delimiters=",;\t"
        )
    except csv.Error:
        dialect = csv.excel
    reader = csv.reader(io.StringIO(text, newline=""), dialect)
    try:
        header = next(reader)
    except StopIteration:
        raise KnowledgeBaseError("the knowledge-base CSV is empty (no header row)") from None
    except csv.Error as exc:
        raise KnowledgeBaseError(f"line 1: {exc}") from None
    names = [h.strip().lower() for h in header]
    missing = tuple(c for c in REQUIRED_COLUMNS if c not in names)
    if missing:
        raise KnowledgeBaseError(
            f"the knowledge-base CSV lacks column(s) {', '.join(missing)}; it has: "
            f"{', '.join(n for n in names if n) or 'none'}",
            missing_columns=missing,
        )
    return _articles(
        reader,
        names,
        lambda cells, line: _article(
            cells, tenant_id, file_name, line, config, summarizer, doc_id_prefix
        ),
    )


def _articles(
    reader: Any,  # a csv reader: its records, and line_num
    names: list[str],
    article: Callable[[Mapping[str, str], int], Document],
) -> KnowledgeBaseParse:
    """Every record of `reader` after the header as an `article` (cells by column name, its
    first line), or the problem that kept it out. The articles of one file are held to the
    chunks one document may hold (`parsing.MAX_CHUNKS`, ChunkLimitError at the record that
    crosses it): a file of many small rows takes memory and the index as one long document
    would."""
    index = {name: i for i, name in reversed(list(enumerate(names)))}
    documents: list[Document] = []
    problems: list[RowProblem] = []
    seen: dict[str, int] = {}
    chunks = 0
    line = reader.line_num + 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            problems.append(RowProblem(line, f"malformed CSV: {exc}"))
            break
        start, line = line, reader.line_num + 1
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(names):
            problems.append(
                RowProblem(start, f"has {len(row)} fields; the header has {len(names)}")
            )
            continue
        try:
            doc = article({name: row[i].strip() for name, i in index.items()}, start)
        except ParseError as exc:
            problems.append(RowProblem(start, str(exc)))
            continue
        if doc.doc_id in seen:
            problems.append(
                RowProblem(start, f"doc_id {doc.doc_id!r} repeats line {seen[doc.doc_id]}")
            )
            continue
        chunks += len(doc.chunks)
        if chunks > MAX_CHUNKS:
            raise ChunkLimitError(
                f"the knowledge-base CSV cuts into more than {MAX_CHUNKS} chunks in all (line "
                f"{start} crosses it); split it into files of fewer articles",
                limit=MAX_CHUNKS,
            )
        seen[doc.doc_id] = start
        documents.append(doc)
    return KnowledgeBaseParse(documents, problems)


def _allow_long_fields() -> None:
    """Raise csv's field size limit to MAX_FIELD_CHARS. The limit is one value for the whole
    process (the csv module has no per-reader setting), so it is only ever raised, never set
    back: no reader, in this thread or another, sees it fall mid-file. Other CSV readers of
    the process get the raised limit too (the services read no other CSV)."""
    if csv.field_size_limit() < MAX_FIELD_CHARS:
        csv.field_size_limit(MAX_FIELD_CHARS)


class _OwnFields(TypedDict):
    """An article's title, product and version as the document keeps them."""

    title: str
    product: str
    version: str


def _article(
    cells: Mapping[str, str],
    tenant_id: str,
    file_name: str,
    line: int,
    config: ChunkingConfig | None,
    summarizer: Summarizer | None,
    prefix: str,
) -> Document:
    empty = [c for c in ("title", "content", "topic", "jurisdiction") if not cells[c]]
    if empty:
        raise ParseError(f"empty {', '.join(empty)}")
    updated_at = _iso_date(cells["updated_at"])
    # A request's fields are normalised by the same rules (fields.one_line, normalized_tags).
    own = _OwnFields(
        title=one_line(cells["title"]),
        product=one_line(cells.get("product", "")),
        version=one_line(cells.get("version", "")),
    )
    key = cells.get("id", "") or cells["title"]
    doc_id = prefix + slugify(key, 100, fallback="")
    if doc_id == prefix:
        raise ParseError("no doc_id can be made from id/title (no letters or digits)")
    # topic and jurisdiction also travel as tags, so search can filter on them
    # (search_general_kb's topic/jurisdiction arguments). Normalised as a request's tags are.
    tags = normalized_tags([
        *_TAG_SPLIT.split(cells.get("tags", "")),
        kb_tag("topic", cells["topic"]),
        kb_tag("jurisdiction", cells["jurisdiction"]),
    ])  # fmt: skip
    metadata = {
        "topic": cells["topic"],
        "jurisdiction": cells["jurisdiction"],
        "updated_at": updated_at,
        "file_name": file_name,
        # Which CSV wrote the article, for pruning on its re-ingest. A key of its own: articles
        # written before pruning existed carry file_name "train_data.csv" whatever their
        # file, and must never be taken for that file's.
        "kb_file": file_name,
        "line": str(line),
    }
    if cells.get("url"):
        metadata["url"] = cells["url"]
    try:
        check_fields(
            **own,
            tags=tags,
            # The row's own metadata; file_name (and format) are the service's.
            metadata={k: metadata[k] for k in _ROW_METADATA if k in metadata},
            file_name=file_name,
        )
    except errors.ServiceError as exc:
        many = exc.metadata.get("field") == "tags" and len(tags) > MAX_TAGS
        note = " (the topic and jurisdiction tags included)" if many else ""
        raise ParseError(f"{exc.message}{note}") from None
    doc = parse_document(
        tenant_id=tenant_id,
        doc_id=doc_id,
        content=cells["content"].replace("\r\n", "\n"),
        fmt="markdown",
        **own,
        tags=tags,
        source=KB_SOURCE,
        metadata=metadata,
        config=config,
        summarizer=summarizer,
    )
    if not doc.chunks:  # Markdown marks alone ("---", "#"): a bad row, named by its line
        raise ParseError("content has no text (Markdown marks alone)")
    return doc


def _iso_date(value: str) -> str:
    """`value` as YYYY-MM-DD (ISO date or datetime, or DD.MM.YYYY), else ParseError."""
    m = _RU_DATE.match(value)
    if m:
        value = f"{m.group(3)}-{m.group(2)}-{m.group(1)}"
    try:
        return date.fromisoformat(value).isoformat()
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(value).date().isoformat()
    except ValueError:
        raise ParseError(f"updated_at {value!r} is not a date (YYYY-MM-DD or DD.MM.YYYY)") from None
