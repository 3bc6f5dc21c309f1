"""A document's pages, sections and chunks are bounded while it is parsed (parsing.MAX_PAGES,
MAX_SECTIONS, MAX_CHUNKS): a file within RETR_MAX_DOCUMENT_BYTES of form feeds or one-line
sections made millions of each and took gigabytes. Past a bound the parse stops there with a
DocumentLimitError naming it, which IngestDocument answers as LIMIT_EXCEEDED."""

from __future__ import annotations

import io

import pypdfium2 as pdfium
import pytest

from services.common import errors
from services.common.document_limits import (
    MAX_DOC_ID_CHARS,
    MAX_PART_ID_CHARS,
    SECTION_SLUG_CHARS,
    section_key,
)
from services.common.search_contract import Filters, validate_filters
from services.docstore import parsing
from services.docstore.errors import (
    ChunkLimitError,
    DocumentLimitError,
    PageLimitError,
    RowProblem,
    SectionLimitError,
)
from services.docstore.kb_csv import read_knowledge_base_csv
from services.docstore.parsing import MAX_PAGES, MAX_SECTIONS, parse_document
from services.docstore.pdf import read_pdf
from services.docstore.summaries import ExtractiveSummarizer
from services.retrieval.ingestion import IngestInput
from tests.unit.test_pdf_text_limit import embedder  # noqa: F401 (fixture)
from tests.unit.test_search import make_stack


def parse(content, fmt="markdown", **kw):
    return parse_document(tenant_id="t", doc_id="d", content=content, fmt=fmt, **kw)


class CountingSummarizer(ExtractiveSummarizer):
    """The extractive summarizer, counting the sections it is given."""

    name = "counting"

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def summarize(self, title, text, max_chars):
        self.calls += 1
        return super().summarize(title, text, max_chars)


def blank_pdf(pages: int) -> bytes:
    pdf = pdfium.PdfDocument.new()
    for _ in range(pages):
        pdf.new_page(100, 100)
    out = io.BytesIO()
    pdf.save(out)
    pdf.close()
    return out.getvalue()


# --- pages ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_form_feeds_start_pages_up_to_the_page_bound(fmt):
    at_bound = b"Backups run nightly.\n" + b"\f" * (MAX_PAGES - 1)
    assert parse(at_bound, fmt).pages == MAX_PAGES
    with pytest.raises(PageLimitError) as info:
        parse(at_bound + b"\f", fmt)
    assert (info.value.limit, info.value.limit_name) == (MAX_PAGES, "max_pages")
    assert f"{MAX_PAGES + 1} pages" in str(info.value)


def test_a_pdf_past_the_page_bound_is_a_limit_not_unreadable():
    pdf = blank_pdf(3)
    assert len(read_pdf(pdf, max_pages=3).pages) == 3
    with pytest.raises(PageLimitError) as info:
        read_pdf(pdf, max_pages=2)
    assert isinstance(info.value, DocumentLimitError)
    assert (info.value.limit, info.value.limit_name) == (2, "max_pages")
    assert "3 pages; at most 2" in str(info.value)


async def test_ingest_answers_a_page_bound_as_limit_exceeded(tmp_path, embedder):  # noqa: F811
    s = make_stack(tmp_path, embedder, pdf_reader=lambda content: read_pdf(content, max_pages=2))
    text = b"Backups run nightly.\n" + b"\f" * MAX_PAGES
    for content, name in ((text, "ff.txt"), (blank_pdf(3), "big.pdf")):
        with pytest.raises(errors.LimitExceededError) as info:
            await s.ingestor.ingest(IngestInput("a", content, file_name=name))
        assert info.value.reason == "LIMIT_EXCEEDED"
        assert info.value.metadata["limit_name"] == "max_pages"
        assert info.value.metadata["field"] == "content"
    assert await s.ingestor.list("a") == ([], "")


# --- sections ---------------------------------------------------------------------------------


def test_markdown_headings_up_to_the_section_bound():
    summarizer = CountingSummarizer()
    doc = parse(b"# h\nx\n" * MAX_SECTIONS, summarizer=summarizer)
    assert len(doc.sections) == MAX_SECTIONS
    summarizer.calls = 0
    with pytest.raises(SectionLimitError) as info:
        parse(b"# h\nx\n" * (MAX_SECTIONS + 1), summarizer=summarizer)
    assert (info.value.limit, info.value.limit_name) == (MAX_SECTIONS, "max_sections")
    assert summarizer.calls == 0  # refused while its headings were read, before any section


def test_numbered_headings_are_bounded_too(monkeypatch):
    monkeypatch.setattr(parsing, "MAX_SECTIONS", 3)
    text = "".join(f"{n}. Chapter {n}\nIts text.\n\n" for n in range(1, 4))
    assert len(parse(text.encode(), "text").sections) == 3
    with pytest.raises(SectionLimitError) as info:
        parse((text + "4. Chapter 4\nIts text.\n").encode(), "text")
    assert info.value.limit == 3


# --- chunks -----------------------------------------------------------------------------------


def test_chunking_stops_at_the_first_chunk_past_the_bound(monkeypatch):
    monkeypatch.setattr(parsing, "MAX_CHUNKS", 4)
    sections = "".join(f"# Part {n}\n\nBackups of part {n} run nightly.\n\n" for n in range(6))
    with pytest.raises(ChunkLimitError) as info:
        parse(sections.encode(), summarizer=(summarizer := CountingSummarizer()))
    assert (info.value.limit, info.value.limit_name) == (4, "max_chunks")
    assert summarizer.calls == 4  # the fifth chunk crossed it: the rest was never cut
    assert len(parse(sections.split("# Part 4")[0].encode()).chunks) == 4  # at the bound


def test_a_knowledge_base_article_past_a_bound_is_its_rows_problem():
    head = "id,title,content,topic,jurisdiction,updated_at\n"
    pages = "x" + "\f" * MAX_PAGES + "y"
    text = head + "a1,One,Short.,tax,RU,2024-01-01\n" + f'a2,Two,"{pages}",tax,RU,2024-01-01\n'
    text += "a3,Three,Also short.,tax,RU,2024-01-01\n"
    parsed = read_knowledge_base_csv(text.encode(), "kb")
    assert [d.doc_id for d in parsed.documents] == ["kb-a1", "kb-a3"]
    (problem,) = parsed.problems
    assert isinstance(problem, RowProblem) and problem.line == 3
    assert f"at most {MAX_PAGES}" in problem.message


def test_the_longest_section_and_chunk_ids_fit_what_a_filter_and_a_tool_take():
    """A section id is bounded (document_limits.MAX_PART_ID_CHARS, the search filter's and the
    document tools' limit): its document's longest id, the number of its last section and a
    slug of a heading as long as any, as ingestion writes it."""
    doc_id = "д" * MAX_DOC_ID_CHARS
    heading = "Заголовок " * 100
    doc = parse_document(
        tenant_id="t", doc_id=doc_id, content=f"# {heading}\ntext\n", fmt="markdown"
    )
    written = max((s.section_id for s in doc.sections), key=len)
    assert written == section_key(doc_id, 1, "заголовок-" * 3 + "заголовок")
    longest = section_key(doc_id, MAX_SECTIONS, "x" * SECTION_SLUG_CHARS)
    assert len(longest) <= MAX_PART_ID_CHARS
    assert all(len(c.chunk_id) <= MAX_PART_ID_CHARS for c in doc.chunks)
    validate_filters(Filters(section_ids=(longest,)))
