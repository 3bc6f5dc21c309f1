"""ToolsProxy at its default limits with calls running at once: each call in flight reserves
about what a full result holds (none when it returns no text), so calls under the token
limits are admitted and only those that reach them wait; and a document that changes while
read_chunk_window reads it is read as it was, whole."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from services.docstore.model import TO_THE_END
from services.docstore.parsing import ChunkingConfig, parse_document
from services.docstore.sqlite_store import SqliteDocumentStore
from services.toolsproxy.ratelimit import IN_FLIGHT_WAIT_S, RateLimiter, RateLimits
from services.toolsproxy.search_tools import SearchCall, SearchHitView, SearchTools
from services.toolsproxy.tools import (
    RESERVED_BYTES_PER_TOKEN,
    Caller,
    DocumentTools,
    ToolExecutor,
    ToolLimits,
)

A = Caller("a", "u1", "trace-1")
CFG = ChunkingConfig(chunk_tokens=8, overlap_tokens=0)
GUIDE = "# Guide\n\n" + "\f".join(f"## S{i}\n\nsection {i} text about topic{i}." for i in range(4))


def parsed(doc_id: str, text: str) -> Any:
    return parse_document(tenant_id="a", doc_id=doc_id, content=text, fmt="markdown", config=CFG)


@pytest.fixture
def store(tmp_path):
    s = SqliteDocumentStore(tmp_path / "s.sqlite")
    s.put(parsed("guide", GUIDE))
    yield s
    s.close()


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the calls did not get there")


# --- whole reads in flight on one document ----------------------------------------------------


class HeldWholeReads:
    """The store, with every whole-document read (pages to the end) held until `open` is set."""

    def __init__(self, store: SqliteDocumentStore) -> None:
        self._store = store
        self.open = threading.Event()
        self.held = 0
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def pages_text(self, tenant_id: str, doc_id: str, first: int, last: int) -> Any:
        if last == TO_THE_END:
            with self._lock:
                self.held += 1
            assert self.open.wait(10)
        return self._store.pages_text(tenant_id, doc_id, first, last)


async def test_whole_reads_in_flight_leave_the_document_to_calls_under_its_limit(store):
    # Defaults: a whole read reserves 200,000 / 4 = 50,000 of the document's 100,000 tokens.
    limits, rates = ToolLimits(), RateLimits()
    assert limits.max_full_text_bytes // RESERVED_BYTES_PER_TOKEN * 2 == rates.tokens_per_minute
    held = HeldWholeReads(store)
    ex = ToolExecutor(DocumentTools(held, limits).tools)  # type: ignore[arg-type]
    whole = {"document_ids": ["guide"]}
    first = asyncio.create_task(ex.execute("load_documents_full", whole, A))
    await until(lambda: held.held == 1)  # half the document's tokens reserved
    pages = await ex.execute("read_doc_pages", {"doc_id": "guide", "page_start": 1}, A)
    assert pages.status == "ok", pages
    second = asyncio.create_task(ex.execute("load_documents_full", whole, A))
    await until(lambda: held.held == 2)  # admitted: the reservations now reach the limit
    refused = await ex.execute("read_doc_pages", {"doc_id": "guide", "page_start": 1}, A)
    assert (refused.error_code, refused.retry_after_s) == ("RATE_LIMIT_EXCEEDED", IN_FLIGHT_WAIT_S)
    # Calls that return no text reserve nothing: only tokens really used could refuse them.
    metadata = await ex.execute("read_doc_metadata", {"doc_id": "guide"}, A)
    assert metadata.status == "ok", metadata
    sizes_only = {**whole, "include_content": False}
    sizes = asyncio.create_task(ex.execute("load_documents_full", sizes_only, A))
    await until(lambda: held.held == 3)  # admitted: it reads the text to count it
    held.open.set()
    outcomes = await asyncio.gather(first, second, sizes)
    assert [o.status for o in outcomes] == ["ok"] * 3, outcomes
    # Each settled to the few tokens it returned: the document has room again.
    again = await ex.execute("read_doc_pages", {"doc_id": "guide", "page_start": 1}, A)
    assert again.status == "ok", again


async def test_a_whole_read_reserving_past_the_limit_is_admitted_and_settles(store):
    # 4,000 bytes reserve 1,000 tokens, past a limit of 600: the read is admitted alone and
    # holds the whole limit while it runs; once it ends, only what it returned is left.
    limits = ToolLimits(max_full_text_bytes=4_000)
    held = HeldWholeReads(store)
    ex = ToolExecutor(
        DocumentTools(held, limits).tools,  # type: ignore[arg-type]
        limits=limits,
        rate_limiter=RateLimiter(RateLimits(tokens_per_minute=600)),
    )
    read = asyncio.create_task(ex.execute("load_documents_full", {"document_ids": ["guide"]}, A))
    await until(lambda: held.held == 1)
    out = await ex.execute("read_doc_pages", {"doc_id": "guide", "page_start": 1}, A)
    assert out.error_code == "RATE_LIMIT_EXCEEDED"
    assert (await ex.execute("read_doc_metadata", {"doc_id": "guide"}, A)).status == "ok"
    held.open.set()
    assert (await read).status == "ok"
    out = await ex.execute("read_doc_pages", {"doc_id": "guide", "page_start": 1}, A)
    assert out.status == "ok", out


# --- searches in flight on one tenant ---------------------------------------------------------


class HeldSearcher:
    """Answers every search with one short hit once `open` is set."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.running = 0

    async def search(self, call: SearchCall) -> list[SearchHitView]:
        self.running += 1
        await self.open.wait()
        return [SearchHitView("d1", "d1:s1", "d1:c1", "Leave", "28 days of leave.", 0.9, 1, 1)]


async def test_searches_in_flight_are_admitted_until_their_reservations_reach_the_tenant_limit():
    # Defaults: a search reserves 16,384 / 4 = 4,096 of the tenant's 200,000 tokens, so 49
    # run at once (48 × 4,096 < 200,000) and the 50th, at 200,704, waits.
    reserve = ToolLimits().max_text_bytes // RESERVED_BYTES_PER_TOKEN
    limit = RateLimits().tenant_tokens_per_minute
    admitted = -(-limit // reserve)
    assert (admitted - 1) * reserve < limit <= admitted * reserve
    searcher = HeldSearcher()
    ex = ToolExecutor(SearchTools(searcher).tools)
    query = {"query": "vacation"}
    tasks = [
        asyncio.create_task(ex.execute("search_user_documents", query, Caller("a", f"u{i}")))
        for i in range(admitted)
    ]
    await until(lambda: searcher.running == admitted)
    past = await ex.execute("search_user_documents", query, A)
    assert (past.error_code, past.retry_after_s) == ("RATE_LIMIT_EXCEEDED", IN_FLIGHT_WAIT_S)
    searcher.open.set()
    assert {o.status for o in await asyncio.gather(*tasks)} == {"ok"}
    assert (await ex.execute("search_user_documents", query, A)).status == "ok"


# --- a document that changes while read_chunk_window reads it ---------------------------------


class ChangesAfterTheAnchor:
    """The store as seen when an operator deletes or ingests the document again between the
    anchor's lookup and the read of its window."""

    def __init__(self, store: SqliteDocumentStore, change: Callable[[], None]) -> None:
        self._store = store
        self._change = change

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def chunk_by_id(self, *args: Any) -> Any:
        anchor = self._store.chunk_by_id(*args)
        self._change()
        return anchor


@pytest.mark.parametrize("change", ["deleted", "ingested again, shorter"])
async def test_a_document_changed_under_read_chunk_window_is_read_as_it_was(store, change):
    # The call's reads are one snapshot of the store: the window is the version whose anchor
    # was found, whole.
    def changed() -> None:
        if change == "deleted":
            store.delete("a", "guide")
        else:
            store.put(parsed("guide", "# Guide\n\nOne short section now."))

    window = {"doc_id": "guide", "anchor_chunk_id": "guide:c00003"}
    before = await ToolExecutor(DocumentTools(store, ToolLimits()).tools).execute(
        "read_chunk_window", window, A
    )
    assert before.status == "ok", before
    ex = ToolExecutor(DocumentTools(ChangesAfterTheAnchor(store, changed), ToolLimits()).tools)  # type: ignore[arg-type]
    out = await ex.execute("read_chunk_window", window, A)
    assert out == before
    after = await ex.execute("read_chunk_window", window, A)
    assert (after.status, after.error_code) == ("error", "NOT_FOUND")  # it did change
