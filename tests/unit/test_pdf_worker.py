"""PDFs read in a worker process with capped memory (services/docstore/pdf_worker.py): a PDF
whose pages expand past the cap, or one that ends the reader, is refused and the service's
process is untouched; the next PDF gets a new worker. IngestDocument refuses such a PDF as
LIMIT_EXCEEDED (limit_name max_pdf_memory_bytes), like a file past RETR_MAX_DOCUMENT_BYTES."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from services.common import errors
from services.docstore.errors import PageLimitError, ParseError
from services.docstore.pdf import MAX_PAGES, MAX_TEXT_BYTES, PdfTextLimitError, read_pdf
from services.docstore.pdf_worker import (
    MEMORY_BYTES,
    PdfMemoryLimitError,
    PdfTimeLimitError,
    PdfWorker,
)
from services.retrieval.ingestion import IngestInput
from tests.unit.test_pdf_text_limit import compressed_pdf, embedder  # noqa: F401 (fixture)
from tests.unit.test_search import make_stack

SAMPLES = Path(__file__).resolve().parents[2] / "samples" / "docs"
MIB = 1 << 20
# One page of 100,000 lines: a 30 KB file that PDFium holds in about 1 GB while reading it.
BOMB_LINES = 100_000


@pytest.fixture(scope="module")
def worker():
    w = PdfWorker(256 * MIB)
    yield w
    w.close()


def test_the_worker_reads_a_pdf_as_the_service_process_would(worker) -> None:
    for path in sorted(SAMPLES.glob("*.pdf")):
        content = path.read_bytes()
        assert worker(content) == read_pdf(content), path.name


def test_a_pdf_past_the_memory_cap_is_refused_and_the_next_one_is_read(worker) -> None:
    with pytest.raises(PdfMemoryLimitError) as info:
        worker(compressed_pdf(lines=BOMB_LINES, pages=1))
    assert info.value.limit == 256 * MIB and str(256 * MIB) in str(info.value)
    sample = next(SAMPLES.glob("*.pdf")).read_bytes()
    assert worker(sample) == read_pdf(sample)


def test_the_same_pdf_is_read_under_a_cap_that_holds_it() -> None:
    bomb = compressed_pdf(lines=20_000, pages=1)  # ~320 MB while read
    small, large = PdfWorker(128 * MIB), PdfWorker(1024 * MIB)
    try:
        with pytest.raises(PdfMemoryLimitError):
            small(bomb)
        assert large(bomb) == read_pdf(bomb)
    finally:
        small.close()
        large.close()


def test_the_text_bound_and_parse_errors_come_back_as_in_the_service_process(worker) -> None:
    pdf = compressed_pdf(lines=100, pages=3)
    with pytest.raises(PdfTextLimitError) as info:
        worker(pdf, max_text_bytes=10_000)
    assert info.value.limit == 10_000 and "at page 2 of 3" in str(info.value)
    with pytest.raises(ParseError) as broken:
        worker(b"%PDF-1.4 this is no PDF")
    with pytest.raises(ParseError) as same:
        read_pdf(b"%PDF-1.4 this is no PDF")
    assert str(broken.value) == str(same.value)
    with pytest.raises(ParseError, match="no %PDF header"):
        worker(b"plain text")


def test_the_page_bound_comes_back_by_its_own_class(worker) -> None:
    """Every DocumentLimitError read_pdf raises crosses the process as itself, so the service
    answers LIMIT_EXCEEDED naming it (here `max_pages`), not a parse error."""
    with pytest.raises(PageLimitError) as info:
        worker(compressed_pdf(lines=1, pages=MAX_PAGES + 1))
    assert (info.value.limit, info.value.limit_name) == (MAX_PAGES, "max_pages")
    assert len(worker(compressed_pdf(lines=1, pages=MAX_PAGES)).pages) == MAX_PAGES


def test_a_worker_killed_between_pdfs_is_replaced(worker) -> None:
    sample = next(SAMPLES.glob("*.pdf")).read_bytes()
    worker(sample)
    child = worker._child
    assert child is not None
    child.kill()
    child.wait()
    assert worker(sample) == read_pdf(sample)
    assert worker._child is not child


@pytest.mark.parametrize(
    ("signum", "error"),
    [(signal.SIGSEGV, "the reader ended on it"), (signal.SIGABRT, "more than")],
)
def test_a_reader_that_ends_on_a_pdf_refuses_that_pdf(signum: int, error: str) -> None:
    """A crash is unreadable input; an abort is PDFium out of memory."""
    die = f"import os, sys; sys.stdin.buffer.read(1); os.kill(os.getpid(), {int(signum)})"
    w = PdfWorker(256 * MIB, command=(sys.executable, "-c", die))
    with pytest.raises(ParseError, match=error):
        w(b"%PDF-1.4")
    assert w._child is None
    w.close()


def test_the_service_cap_holds_a_pdf_at_the_text_bound() -> None:
    assert MEMORY_BYTES == 1 << 30 and PdfWorker().memory_bytes == MEMORY_BYTES
    assert MEMORY_BYTES >= 4 * MAX_TEXT_BYTES + MAX_TEXT_BYTES  # as strings, and pickled


async def test_an_ingest_past_the_memory_cap_is_refused_as_past_a_limit(
    tmp_path,
    embedder,  # noqa: F811 (fixture)
) -> None:
    worker = PdfWorker(128 * MIB)
    try:
        s = make_stack(tmp_path, embedder, pdf_reader=worker)
        with pytest.raises(errors.LimitExceededError) as info:
            await s.ingestor.ingest(
                IngestInput("a", compressed_pdf(lines=BOMB_LINES, pages=1), file_name="b.pdf")
            )
        assert info.value.reason == "LIMIT_EXCEEDED"
        assert info.value.metadata == {
            "field": "content",
            "limit": str(128 * MIB),
            "limit_name": "max_pdf_memory_bytes",
        }
        assert await s.ingestor.list("a") == ([], "")  # nothing of it written
        sample = next(SAMPLES.glob("*.pdf"))
        out = await s.ingestor.ingest(IngestInput("a", sample.read_bytes(), file_name=sample.name))
        assert out.chunks > 0
    finally:
        worker.close()


SLEEPER = "import sys, time; sys.stdin.buffer.read(16); time.sleep(60)"
"""A reader that takes the request and never answers (PDFium spinning on a page)."""


def test_a_pdf_read_past_its_time_limit_is_refused_and_the_reader_ended() -> None:
    w = PdfWorker(256 * MIB, read_seconds=0.5, command=(sys.executable, "-c", SLEEPER))
    with pytest.raises(PdfTimeLimitError, match=r"more than 0\.5 s") as info:
        w(b"%PDF-1.4")
    assert info.value.limit == 0.5 and w._child is None
    w.close()


def test_close_stops_a_read_in_progress_at_once_and_refuses_later_ones() -> None:
    w = PdfWorker(256 * MIB, command=(sys.executable, "-c", SLEEPER))
    failed: list[BaseException] = []

    def read() -> None:
        try:
            w(b"%PDF-1.4")
        except BaseException as exc:
            failed.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    for _ in range(500):  # until the child has the request
        if w._child is not None:
            break
        time.sleep(0.01)
    closer = threading.Thread(target=w.close)
    closer.start()
    closer.join(10)  # a bound on a hang, not a timing: the read would take 60 s
    reader.join(10)
    assert not closer.is_alive() and not reader.is_alive()
    assert len(failed) == 1 and "stopping" in str(failed[0])
    with pytest.raises(ParseError, match="stopping"):
        w(b"%PDF-1.4")


async def test_an_ingest_of_a_pdf_past_the_time_limit_is_refused_as_past_a_limit(
    tmp_path,
    embedder,  # noqa: F811 (fixture)
) -> None:
    worker = PdfWorker(256 * MIB, read_seconds=0.5, command=(sys.executable, "-c", SLEEPER))
    try:
        s = make_stack(tmp_path, embedder, pdf_reader=worker)
        with pytest.raises(errors.LimitExceededError) as info:
            await s.ingestor.ingest(IngestInput("a", b"%PDF-1.4 ...", file_name="slow.pdf"))
        assert info.value.metadata == {
            "field": "content", "limit": "0.5", "limit_name": "max_pdf_read_seconds",
        }  # fmt: skip
    finally:
        worker.close()
