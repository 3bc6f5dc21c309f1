"""A PDF's text is bounded while it is read (services/docstore/pdf.py, MAX_TEXT_BYTES): a
Flate-compressed content stream expands without limit, so the file's size bounds nothing.
Reading stops at the page whose text crosses the bound, and IngestDocument refuses the
document as it refuses a file over RETR_MAX_DOCUMENT_BYTES (LIMIT_EXCEEDED, field content)."""

from __future__ import annotations

import math
import zlib

import pytest

from services.common import errors
from services.docstore.pdf import MAX_TEXT_BYTES, PdfTextLimitError, read_pdf
from services.retrieval.embeddings import EmbeddingSettings
from services.retrieval.factories import build_embedder
from services.retrieval.ingestion import IngestInput
from tests.pdf_bytes import assemble_pdf
from tests.unit.test_search import make_stack

LINE = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor."


def compressed_pdf(lines: int, pages: int, line: str = LINE) -> bytes:
    """`pages` pages that all draw one Flate-compressed content stream of `line` (Latin-1)
    `lines` times: a few KB of file for lines x pages lines of text."""
    escaped = line.encode("latin-1").replace(b"\\", b"\\\\").replace(b"(", b"\\(")
    content = b"BT /F1 10 Tf 12 TL 50 780 Td " + b"(%b) Tj T* " % escaped * lines + b"ET"
    stream = zlib.compress(content, 9)
    font = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>"
    contents = 4 + pages
    page = (
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
        b"/Resources << /Font << /F1 3 0 R >> >> /Contents %d 0 R >>" % contents
    )
    kids = b" ".join(b"%d 0 R" % (4 + i) for i in range(pages))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [%b] /Count %d >>" % (kids, pages),
        font,
        *[page] * pages,
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n%b\nendstream" % (len(stream), stream),
    ]
    return assemble_pdf(objects)


def text_bytes(pages: tuple[str, ...]) -> int:
    return sum(len(page.encode()) for page in pages)


def test_a_compression_bomb_stops_at_the_page_that_crosses_the_bound():
    # 1,000 pages of 160 KB of text each from a file of ~150 KB: 160 MB of text in all,
    # past the default bound too. Read with a 1 MiB bound, reading stops at page 7.
    bomb = compressed_pdf(lines=2_000, pages=1_000)
    assert len(bomb) < 200_000
    page_bytes = text_bytes(read_pdf(compressed_pdf(lines=2_000, pages=1)).pages)
    assert page_bytes * 1_000 > MAX_TEXT_BYTES
    limit = 1 << 20
    with pytest.raises(PdfTextLimitError) as info:
        read_pdf(bomb, max_text_bytes=limit)
    stop = math.floor(limit / page_bytes) + 1  # the first page whose text passes the bound
    assert f"at page {stop} of 1000" in str(info.value)
    assert str(limit) in str(info.value)
    assert info.value.limit == limit


def test_text_at_the_bound_is_accepted_and_a_byte_past_it_refused():
    # "é" is two bytes of UTF-8: the bound counts bytes, not characters.
    pdf = compressed_pdf(lines=40, pages=3, line="Café crème, résumé: " * 3)
    pages = read_pdf(pdf).pages
    exact = text_bytes(pages)
    assert exact > sum(len(page) for page in pages)
    assert read_pdf(pdf, max_text_bytes=exact).pages == pages
    with pytest.raises(PdfTextLimitError, match=rf"limit of {exact - 1} bytes .* at page 3 of 3"):
        read_pdf(pdf, max_text_bytes=exact - 1)


@pytest.fixture(scope="module")
def embedder():
    return build_embedder(EmbeddingSettings(profile="fast"))


async def test_an_ingest_past_the_bound_is_refused_as_a_file_past_the_byte_limit(
    tmp_path, embedder
):
    limit = 10_000
    pdf = compressed_pdf(lines=100, pages=3)  # ~24 KB of text: ingested whole without the bound
    s = make_stack(
        tmp_path, embedder, pdf_reader=lambda content: read_pdf(content, max_text_bytes=limit)
    )
    with pytest.raises(errors.LimitExceededError) as info:
        await s.ingestor.ingest(IngestInput("a", pdf, file_name="bomb.pdf"))
    assert info.value.code == errors.INVALID_ARGUMENT
    assert info.value.reason == "LIMIT_EXCEEDED"
    assert info.value.metadata == {
        "field": "content",
        "limit": str(limit),
        "limit_name": "max_pdf_text_bytes",
    }
    assert await s.ingestor.list("a") == ([], "")  # nothing of it written
