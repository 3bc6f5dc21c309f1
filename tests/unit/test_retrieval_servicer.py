"""The Search response mapping: every field of a SearchResult reaches the proto."""

from __future__ import annotations

import pytest
from visior.retrieval.v1 import retrieval_pb2

from services.retrieval.search import ChunkHit, DocHit, SearchResult, SectionHit
from services.retrieval.servicer import search_response


def chunk(n: int) -> ChunkHit:
    return ChunkHit(
        doc_id=f"d{n}", section_id=f"s{n}", chunk_id=f"c{n}", text=f"текст {n}",
        tokens=10 + n, page_start=n, page_end=n + 1, score=0.5 + n / 100, ord=n,
    )  # fmt: skip


RESULT = SearchResult(
    hits=[chunk(1), chunk(2)],
    chunks=[chunk(3), chunk(4), chunk(5)],
    docs=[DocHit("d1", "Guide", 0.9), DocHit("d2", "", 0.4)],
    sections=[
        SectionHit("s1", "d1", "Intro", "Summary one", 1, 2, "c1", 0.8),
        SectionHit("s2", "d2", "", "", 0, 0, "c2", 0.1),
    ],
    mode="section_first",
    hybrid_used=True,
    rerank_used=True,
    elapsed_ms=12,
    backend="edge",
    language="ru",
    query_variants=("a", "b"),
    query_embedding_ms=1.5,
    engine_ms=3.25,
    rerank_ms=0.75,
)


def test_every_field_is_mapped() -> None:
    def hit(c: ChunkHit) -> retrieval_pb2.Hit:
        return retrieval_pb2.Hit(
            doc_id=c.doc_id, section_id=c.section_id, chunk_id=c.chunk_id, text=c.text,
            score=c.score, page_start=c.page_start, page_end=c.page_end,
        )  # fmt: skip

    def ctx(c: ChunkHit) -> retrieval_pb2.Chunk:
        return retrieval_pb2.Chunk(
            chunk_id=c.chunk_id, doc_id=c.doc_id, section_id=c.section_id, text=c.text,
            tokens=c.tokens, page_start=c.page_start, page_end=c.page_end, score=c.score,
            mcp_link=retrieval_pb2.McpLink(
                doc_id=c.doc_id, page_start=c.page_start, page_end=c.page_end
            ),
        )  # fmt: skip

    want = retrieval_pb2.SearchResponse(
        hits=[hit(c) for c in RESULT.hits],
        chunks=[ctx(c) for c in RESULT.chunks],
        used_docs=[
            retrieval_pb2.UsedDoc(doc_id="d1", score=0.9, title="Guide"),
            retrieval_pb2.UsedDoc(doc_id="d2", score=0.4),
        ],
        used_sections=[
            retrieval_pb2.UsedSection(
                section_id="s1", doc_id="d1", title="Intro", summary="Summary one",
                page_start=1, page_end=2, anchor_chunk_id="c1", score=0.8,
            ),
            retrieval_pb2.UsedSection(
                section_id="s2", doc_id="d2", anchor_chunk_id="c2", score=0.1
            ),
        ],
        meta=retrieval_pb2.SearchMeta(
            retrieval_time_ms=12, mode="section_first", hybrid_used=True, rerank_used=True,
            trace_id="trace-1", backend="edge", language="ru", query_variants=["a", "b"],
            query_embedding_ms=1.5, engine_ms=3.25, rerank_ms=0.75,
        ),
    )  # fmt: skip
    got = search_response(RESULT, "trace-1")
    assert got == want
    assert got.chunks[2].mcp_link.page_end == 6


def test_an_empty_result_still_carries_its_meta() -> None:
    empty = SearchResult(
        hits=[], chunks=[], docs=[], sections=[], mode="doc_first", hybrid_used=False,
        rerank_used=False, elapsed_ms=0, backend="edge",
    )  # fmt: skip
    got = search_response(empty, "t")
    assert not (got.hits or got.chunks or got.used_docs or got.used_sections)
    assert got.HasField("meta") and got.meta.mode == "doc_first" and got.meta.trace_id == "t"


async def test_get_health_runs_its_probe_off_the_event_loop() -> None:
    """The probe pings the store and the index: while one hangs, the loop serves others. The
    probe here answers only once a coroutine on the loop has run; on the loop it could not."""
    import asyncio
    import threading

    from services.retrieval.servicer import RetrievalServicer

    loop_ran = threading.Event()

    def probe() -> dict[str, str]:
        return {"status": "ok", "loop_ran": str(loop_ran.wait(5)).lower()}

    async def on_the_loop() -> None:
        await asyncio.sleep(0)
        loop_ran.set()

    servicer = RetrievalServicer(engine=None, probe=probe)  # type: ignore[arg-type]
    answer, _ = await asyncio.gather(
        servicer.GetHealth(retrieval_pb2.GetHealthRequest(), None),  # type: ignore[arg-type]
        on_the_loop(),
    )
    assert answer.status == "ok" and answer.details["loop_ran"] == "true"


async def test_health_calls_while_a_probe_runs_share_its_answer() -> None:
    """A hung store holds one worker thread, whatever the number of health polls."""
    import asyncio
    import threading

    from services.retrieval.servicer import RetrievalServicer

    release, runs = threading.Event(), []

    def probe() -> dict[str, str]:
        runs.append(1)
        release.wait(5)
        return {"status": "ok", "docstore": "sqlite"}

    servicer = RetrievalServicer(engine=None, probe=probe)  # type: ignore[arg-type]
    calls = [
        asyncio.ensure_future(servicer.GetHealth(retrieval_pb2.GetHealthRequest(), None))  # type: ignore[arg-type]
        for _ in range(5)
    ]
    await asyncio.sleep(0.05)
    release.set()
    answers = await asyncio.gather(*calls)
    assert len(runs) == 1 and all(a.details["docstore"] == "sqlite" for a in answers)
    await servicer.GetHealth(retrieval_pb2.GetHealthRequest(), None)  # type: ignore[arg-type]
    assert len(runs) == 2  # a later call asks again


async def test_a_hung_probe_answers_down_before_the_callers_deadline() -> None:
    """A store that hangs (PostgreSQL down: each ping waits the store's 5 s) must not outlast
    a balancer's probe behind the sidecar's 5 s route timeout: "down", with the reason."""
    import asyncio
    import threading
    import time

    from services.common.context import deadline_var
    from services.retrieval.servicer import RetrievalServicer

    release = threading.Event()

    def probe() -> dict[str, str]:
        release.wait(5)
        return {"status": "ok"}

    servicer = RetrievalServicer(engine=None, probe=probe)  # type: ignore[arg-type]
    deadline_var.set(time.monotonic() + 2.0)
    started = time.monotonic()
    answer = await servicer.GetHealth(retrieval_pb2.GetHealthRequest(), None)  # type: ignore[arg-type]
    took = time.monotonic() - started
    release.set()
    assert answer.status == "down" and "hangs" in answer.details["probe"]
    assert 1.5 < took < 2.0  # 1.8 s: the deadline less its margin (context.call_timeout)
    deadline_var.set(None)
    await asyncio.sleep(0.05)
    assert (await servicer.GetHealth(retrieval_pb2.GetHealthRequest(), None)).status == "ok"  # type: ignore[arg-type]


async def test_the_probe_runs_without_the_deadline_of_the_call_that_started_it() -> None:
    import time

    from services.common.context import deadline_var, remaining_seconds
    from services.retrieval.servicer import RetrievalServicer

    seen: list[float | None] = []

    def probe() -> dict[str, str]:
        seen.append(remaining_seconds())
        return {"status": "ok"}

    servicer = RetrievalServicer(engine=None, probe=probe)  # type: ignore[arg-type]
    deadline_var.set(time.monotonic() + 3.0)
    try:
        answer = await servicer.GetHealth(retrieval_pb2.GetHealthRequest(), None)  # type: ignore[arg-type]
    finally:
        deadline_var.set(None)
    assert answer.status == "ok" and seen == [None]


@pytest.mark.parametrize(
    ("source", "linked"), [("", True), ("user", True), ("knowledge_base", False)]
)
async def test_a_knowledge_base_searchs_chunks_carry_no_mcp_link(source, linked) -> None:
    # No document tool reads the knowledge base (its own search does): a link would lead a
    # caller to NOT_FOUND.
    from services.retrieval.servicer import RetrievalServicer

    class Engine:
        async def search(self, query):  # type: ignore[no-untyped-def]
            return RESULT

    servicer = RetrievalServicer(engine=Engine(), probe=lambda: {})  # type: ignore[arg-type]
    request = retrieval_pb2.SearchRequest(
        query="q", tenant_id="t", filters=retrieval_pb2.SearchFilters(source=source)
    )
    got = await servicer.Search(request, None)  # type: ignore[arg-type]
    assert [c.HasField("mcp_link") for c in got.chunks] == [linked] * len(RESULT.chunks)
    assert [c.doc_id for c in got.chunks] == [c.doc_id for c in RESULT.chunks]
