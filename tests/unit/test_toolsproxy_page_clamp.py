"""read_doc_pages clamps page_end to the document's last page before counting the pages
against MCP_PROXY_MAX_PAGES_PER_CALL, and returns the first pages of a longer range with
where to read on."""

import asyncio

import pytest

from services.docstore.parsing import ChunkingConfig, parse_document
from services.docstore.sqlite_store import SqliteDocumentStore
from services.toolsproxy.ratelimit import RateLimiter, RateLimits
from services.toolsproxy.tools import Caller, DocumentTools, ToolExecutor, ToolLimits

LIMITS = ToolLimits(max_pages_per_call=5)
A = Caller("a", "u1", "trace-1")


def pages_doc(doc_id: str, pages: int):
    content = f"# {doc_id}\n\n" + "\f".join(
        f"## P{i}\n\npage {i} text." for i in range(1, pages + 1)
    )
    return parse_document(
        tenant_id="a",
        doc_id=doc_id,
        content=content,
        fmt="markdown",
        config=ChunkingConfig(chunk_tokens=16, overlap_tokens=0),
    )


@pytest.fixture
def executor(tmp_path):
    store = SqliteDocumentStore(tmp_path / "s.sqlite")
    store.put(pages_doc("short", 3))
    store.put(pages_doc("long", 20))
    tools = DocumentTools(store, LIMITS).tools
    yield ToolExecutor(
        dict(tools),
        limits=LIMITS,
        rate_limiter=RateLimiter(RateLimits(calls_per_minute=0, tokens_per_minute=0)),
    )
    store.close()


def read(executor, doc_id, page_start, page_end):
    args = {"doc_id": doc_id, "page_start": page_start, "page_end": page_end}
    return asyncio.run(executor.execute("read_doc_pages", args, A))


def test_a_wide_range_on_a_short_document_reads_its_pages(executor):
    out = read(executor, "short", 1, 10)
    assert out.status == "ok", (out.error_code, out.error_message)
    assert [p["page"] for p in out.result["pages"]] == [1, 2, 3]
    assert (out.result["page_start"], out.result["page_end"]) == (1, 3)
    assert out.result["pages_in_document"] == 3


def test_the_limit_counts_the_clamped_range(executor):
    tail = read(executor, "long", 16, 30)  # 15 asked, pages 16-20 exist: 5, at the limit
    assert tail.status == "ok", (tail.error_code, tail.error_message)
    assert [p["page"] for p in tail.result["pages"]] == [16, 17, 18, 19, 20]
    assert (tail.result["truncated"], tail.result["next_page_start"]) == (False, None)
    over = read(executor, "long", 15, 30)  # pages 15-20: 6, one past the limit
    assert over.status == "ok", (over.error_code, over.error_message)
    assert [p["page"] for p in over.result["pages"]] == [15, 16, 17, 18, 19]
    assert (over.result["truncated"], over.result["next_page_start"]) == (True, 20)


def test_a_chunk_range_longer_than_the_limit_is_read_a_call_at_a_time(executor):
    # A search hit's mcp_link is its chunk's pages, which may be more than one call reads.
    read_pages, start, calls = [], 1, 0
    while start is not None:
        out = read(executor, "long", start, 12)
        assert out.status == "ok", (out.error_code, out.error_message)
        read_pages += [p["page"] for p in out.result["pages"]]
        assert len(out.result["pages"]) <= 5
        assert out.result["truncated"] is (out.result["next_page_start"] is not None)
        start, calls = out.result["next_page_start"], calls + 1
    assert (read_pages, calls) == (list(range(1, 13)), 3)


@pytest.mark.parametrize(("page_start", "page_end"), [(3, 2), (0, 4), (-1, 1)])
def test_a_range_that_is_not_one_is_still_refused(executor, page_start, page_end):
    out = read(executor, "long", page_start, page_end)
    assert (out.status, out.error_code) == ("error", "INVALID_ARGUMENT")


def test_a_range_starting_past_the_last_page_is_not_found(executor):
    out = read(executor, "short", 4, 10)
    assert (out.status, out.error_code) == ("error", "NOT_FOUND")
    assert "3 page" in out.error_message


def test_the_schema_states_the_limit_and_the_clamp(executor):
    tool = DocumentTools(None, LIMITS).tools["read_doc_pages"]
    assert tool.schema["x-max-pages-per-call"] == 5
    assert "at most 5 pages per call" in tool.description
    assert "clamped to the last page" in tool.description
    assert "first 5 pages with truncated: true and next_page_start" in tool.description


def test_pages_past_the_byte_budget_are_left_for_the_next_call(tmp_path):
    # Pages of ~1,900 bytes against 4,096: two fit whole; the third is left for the next
    # call (next_page_start), never cut and skipped. A page alone past the budget is cut.
    limits = ToolLimits(max_pages_per_call=5, max_text_bytes=4096)
    store = SqliteDocumentStore(tmp_path / "s.sqlite")
    body = "\f".join(f"## P{i}\n\npage {i} " + "word " * 380 for i in range(1, 9))
    store.put(parse_document(tenant_id="a", doc_id="big", content=f"# big\n\n{body}",
                             fmt="markdown"))  # fmt: skip
    huge = "## H\n\n" + "word " * 2000 + "\f## I\n\nend."
    store.put(parse_document(tenant_id="a", doc_id="huge", content=huge, fmt="markdown"))
    executor = ToolExecutor(
        dict(DocumentTools(store, limits).tools), limits=limits,
        rate_limiter=RateLimiter(RateLimits(calls_per_minute=0, tokens_per_minute=0)),
    )  # fmt: skip
    try:
        seen, start, calls = [], 1, 0
        while start is not None:
            out = read(executor, "big", start, 8)
            assert out.status == "ok", (out.error_code, out.error_message)
            pages = out.result["pages"]
            assert all(not p["truncated"] for p in pages)  # every page returned whole
            assert out.result["page_end"] == pages[-1]["page"]
            seen += [p["page"] for p in pages]
            start, calls = out.result["next_page_start"], calls + 1
        assert (seen, calls) == (list(range(1, 9)), 4)
        alone = read(executor, "huge", 1, 2)
        assert [p["page"] for p in alone.result["pages"]] == [1]
        assert alone.result["pages"][0]["truncated"] is True
        assert (alone.result["truncated"], alone.result["next_page_start"]) == (True, 2)
    finally:
        store.close()
