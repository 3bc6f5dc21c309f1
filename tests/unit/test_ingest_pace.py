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
from services.retrieval.ingestion import (
    EMBED_SLICE,
    KB_TENANT,
    PACE_SLICES,
    IngestInput,
    chunk_texts,
)
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
    N - 1 is refused once PACE_SLICES slices after the first (the warm-up) are timed, not at
    the end."""
    paced = Paced(embedder)
    content = guide(250)
    n = passages(content)
    assert n > (PACE_SLICES + 2) * EMBED_SLICE
    s = make_stack(tmp_path, paced, clock=paced.clock)
    item = IngestInput("a", content, file_name="g.md")
    if slack == 0:
        out = await s.ingestor.ingest(item, time_left_s=n)
        assert out.chunks > 0 and sum(paced.calls) == n
        return
    with pytest.raises(errors.DeadlineExceededError) as info:
        await s.ingestor.ingest(item, time_left_s=n + slack)
    assert paced.calls == [EMBED_SLICE] * (PACE_SLICES + 1)
    assert f"{n} passages" in str(info.value) and "smaller files" in str(info.value)
    assert info.value.metadata == {"passages": str(n), "passages_per_second": "1.0"}
    assert await s.ingestor.list("a") == ([], "")
    s.index.close()


class Spiked(Paced):
    """One passage a second, but for one slow slice (a search or a collection beside it)."""

    def __init__(self, inner, slow_slice: int, seconds: float) -> None:
        super().__init__(inner)
        self.slow_slice, self.seconds = slow_slice, seconds

    def embed_passages(self, texts):
        if len(self.calls) == self.slow_slice:
            self.now += self.seconds - len(texts)
        return super().embed_passages(texts)


async def test_one_slow_slice_does_not_make_the_pace(
    tmp_path,
    embedder,  # noqa: F811
) -> None:
    """The second slice takes 10 times its time; the median of the timed ones is the pace,
    and the file, which ends within its deadline, is written."""
    spiked = Spiked(embedder, slow_slice=1, seconds=10 * EMBED_SLICE)
    content = guide(250)
    n = passages(content)
    s = make_stack(tmp_path, spiked, clock=spiked.clock)
    out = await s.ingestor.ingest(
        IngestInput("a", content, file_name="g.md"), time_left_s=n + 10 * EMBED_SLICE
    )
    assert out.chunks > 0 and sum(spiked.calls) == n
    s.index.close()


async def test_a_knowledge_base_file_of_small_articles_is_paced_as_one(
    tmp_path,
    embedder,  # noqa: F811
) -> None:
    """300 articles of one passage each: the file's pace, not each article's (which never
    reaches a timed slice), meets the deadline; its articles are embedded in shared slices."""
    paced = Paced(embedder)
    s = make_stack(tmp_path, paced, clock=paced.clock)
    rows = "".join(
        f"a{i},Article {i},Article {i} explains topic {i} in one sentence.,tax,RU,2026-01-10,\n"
        for i in range(300)
    )
    csv = ("id,title,content,topic,jurisdiction,updated_at,tags\n" + rows).encode()
    item = IngestInput(KB_TENANT, csv, file_name="kb.csv")
    with pytest.raises(errors.DeadlineExceededError, match="300 passages"):
        await s.ingestor.ingest(item, time_left_s=10)
    assert paced.calls == [EMBED_SLICE] * (PACE_SLICES + 1)
    paced.calls.clear()
    out = await s.ingestor.ingest(item, time_left_s=300)  # at the limit
    assert len(out.doc_ids) == 300 and len(paced.calls) == -(-300 // EMBED_SLICE)
    s.index.close()


class KeepSummaries:
    """A summarizer whose summaries are the parser's (its generation differs)."""

    name, concurrency = "keep", 2

    def generation(self, doc):
        return doc.generation + "-keep"

    async def summarize_sections(self, doc, max_chars):
        return doc


async def test_a_re_ingest_whose_summaries_were_skipped_is_embedded_before_the_lock_too(
    tmp_path,
    embedder,  # noqa: F811
) -> None:
    """The store holds the generation but the index lost its points (a lost index, which an
    operator re-ingests): it is embedded before the lock and paced like any other."""

    class Watched(Paced):
        def __init__(self, inner) -> None:
            super().__init__(inner)
            self.ingestor = None
            self.locked: list[bool] = []

        def embed_passages(self, texts):
            self.locked.append(self.ingestor._lock.locked())
            return super().embed_passages(texts)

    watched = Watched(embedder)
    s = make_stack(tmp_path, watched, summarizer=KeepSummaries(), clock=watched.clock)
    watched.ingestor = s.ingestor
    item = IngestInput("a", guide(250), file_name="g.md")
    first = await s.ingestor.ingest(item)
    s.index.delete_document("a", first.doc_id)
    watched.locked.clear()
    with pytest.raises(errors.DeadlineExceededError):
        await s.ingestor.ingest(item, time_left_s=first.chunks / 4)
    assert watched.locked and not any(watched.locked)
    again = await s.ingestor.ingest(item)
    assert again.replaced and not any(watched.locked)
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
