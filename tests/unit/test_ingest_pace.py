"""Embedding at ingest (services/retrieval/ingestion.py): it runs before the ingest lock, in
slices, so a large document keeps no other ingest waiting, a caller who gives up stops it at
the next slice, and a document whose pace would run past the caller's deadline is refused as
soon as the pace shows it (DEADLINE_EXCEEDED), not after the deadline."""

from __future__ import annotations

import asyncio
import threading

import pytest

from services.common import errors
from services.docstore.parsing import parse_document
from services.retrieval.ingestion import EMBED_SLICE, IngestInput, chunk_texts
from tests.unit.test_ingestion import CallRecorder
from tests.unit.test_pdf_text_limit import embedder  # noqa: F401 (fixture)
from tests.unit.test_search import make_stack

MARK = "zeppelin"


def guide(parts: int, word: str = "topic") -> bytes:
    body = "\n\n".join(f"## Part {i}\n\nPart {i} covers the {word} {i}." for i in range(parts))
    return f"# Guide\n\n{body}\n".encode()


def passages(content: bytes) -> int:
    doc = parse_document(tenant_id="a", doc_id="g", content=content, fmt="markdown")
    return len(chunk_texts(doc))


class Gate(CallRecorder):
    """The real embedder; a slice holding MARK waits until `opened` (at most 20 s)."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.opened = threading.Event()
        self.waiting = threading.Event()

    def embed_passages(self, texts):
        if any(MARK in t for t in texts):
            self.waiting.set()
            self.opened.wait(20)
        return super().embed_passages(texts)


async def test_a_small_ingest_does_not_wait_for_a_large_one_being_embedded(
    tmp_path,
    embedder,  # noqa: F811
) -> None:
    gate = Gate(embedder)
    s = make_stack(tmp_path, gate)
    large = asyncio.create_task(
        s.ingestor.ingest(IngestInput("a", guide(100, MARK), file_name="large.md"))
    )
    await asyncio.to_thread(gate.waiting.wait, 20)
    try:
        small = await asyncio.wait_for(
            s.ingestor.ingest(IngestInput("a", guide(2), file_name="small.md")), 10
        )
        assert small.chunks > 0 and not large.done()
    finally:
        gate.opened.set()
    assert (await large).chunks > 2 * EMBED_SLICE
    s.index.close()


async def test_a_caller_who_gives_up_stops_the_embedding_at_the_next_slice(
    tmp_path,
    embedder,  # noqa: F811
) -> None:
    gate = Gate(embedder)
    s = make_stack(tmp_path, gate)
    content = guide(200, MARK)
    task = asyncio.create_task(s.ingestor.ingest(IngestInput("a", content, file_name="g.md")))
    await asyncio.to_thread(gate.waiting.wait, 20)
    task.cancel()
    gate.opened.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.2)  # a slice still in its thread ends; no other starts
    assert len(gate.calls) == 1 and passages(content) > 4 * EMBED_SLICE
    assert await s.ingestor.list("a") == ([], "")
    s.index.close()


class Paced(CallRecorder):
    """The real embedder on a clock that moves one second a passage."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def embed_passages(self, texts):
        self.now += len(texts)
        return super().embed_passages(texts)


@pytest.mark.parametrize("slack", [0, -1])
async def test_a_document_is_refused_as_soon_as_its_pace_runs_past_the_deadline(
    tmp_path,
    embedder,  # noqa: F811
    slack: int,
) -> None:
    """At one passage a second, N passages need N seconds: a deadline of N is met, one of
    N - 1 is refused after the second slice (the first pays the warm-up), not at its end."""
    paced = Paced(embedder)
    content = guide(150)
    n = passages(content)
    assert n > 4 * EMBED_SLICE
    s = make_stack(tmp_path, paced, clock=paced.clock)
    item = IngestInput("a", content, file_name="g.md")
    if slack == 0:
        out = await s.ingestor.ingest(item, time_left_s=n)
        assert out.chunks > 0 and sum(paced.calls) == n
        return
    with pytest.raises(errors.DeadlineExceededError) as info:
        await s.ingestor.ingest(item, time_left_s=n + slack)
    assert paced.calls == [EMBED_SLICE, EMBED_SLICE]
    assert f"{n} passages" in str(info.value) and "smaller files" in str(info.value)
    assert info.value.metadata == {"passages": str(n), "passages_per_second": "1.0"}
    assert await s.ingestor.list("a") == ([], "")
    s.index.close()


async def test_an_unchanged_document_is_not_embedded_again(
    tmp_path,
    embedder,  # noqa: F811
) -> None:
    recorder = CallRecorder(embedder)
    s = make_stack(tmp_path, recorder)
    item = IngestInput("a", guide(5), file_name="g.md")
    await s.ingestor.ingest(item)
    calls = len(recorder.calls)
    again = await s.ingestor.ingest(item)
    assert again.unchanged and len(recorder.calls) == calls
    s.index.close()
