"""search_user_documents / search_general_kb: tenant from the caller, limits, failures as results."""

from __future__ import annotations

import pytest

from services.common import errors
from services.common.search_contract import KB_TENANT
from services.common.untrusted import unwrap_untrusted
from services.docstore.kb_csv import read_knowledge_base_csv
from services.toolsproxy.ratelimit import RateLimiter, RateLimits
from services.toolsproxy.search_tools import MAX_TOP_K, SearchCall, SearchHitView, SearchTools
from services.toolsproxy.tools import Caller, ToolExecutor

A = Caller("tenant-a", "u1", "tr-1")


class FakeSearcher:
    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[SearchCall] = []
        self.fail = fail

    async def search(self, call: SearchCall) -> list[SearchHitView]:
        self.calls.append(call)
        if self.fail:
            raise self.fail
        return [
            SearchHitView("d1", "d1:s001", "d1:c00001", "LDAP", "Open Settings.", 0.9, 2, 2),
            SearchHitView("d2", "d2:s001", "d2:c00003", "Notes", "LDAP sync fixed.", 0.3, 1, 1),
        ]


def executor(searcher: FakeSearcher) -> ToolExecutor:
    return ToolExecutor(SearchTools(searcher).tools)


async def test_user_search_runs_in_the_callers_tenant_with_pages():
    s = FakeSearcher()
    out = await executor(s).execute(
        "search_user_documents", {"query": "LDAP", "document_ids": ["d1"], "top_k": 3}, A
    )
    assert out.status == "ok"
    hit = out.result["hits"][0]
    assert {k: hit[k] for k in ("doc_id", "section_id", "chunk_id", "title", "score")} == {
        "doc_id": "d1", "section_id": "d1:s001", "chunk_id": "d1:c00001", "title": "LDAP",
        "score": 0.9,
    }  # fmt: skip
    assert (hit["page_start"], hit["page_end"]) == (2, 2)
    # Passages are data: delimited so the model can tell them from instructions.
    assert hit["text"].startswith("<<<DOCUMENT") and hit["text"].endswith("<<<END DOCUMENT>>>")
    assert unwrap_untrusted(hit["text"]) == "Open Settings."
    assert hit["content_type"] == "untrusted_document_text"
    call = s.calls[0]
    assert (call.tenant_id, call.doc_ids, call.top_k, call.source) == (
        "tenant-a",
        ("d1",),
        3,
        "user",
    )
    assert call.trace_id == "tr-1"


async def test_score_threshold_drops_weak_hits():
    out = await executor(FakeSearcher()).execute(
        "search_user_documents", {"query": "LDAP", "score_threshold": 0.5}, A
    )
    assert [h["doc_id"] for h in out.result["hits"]] == ["d1"]


async def test_knowledge_base_search_uses_the_source_filter_and_topic_tag():
    s = FakeSearcher()
    out = await executor(s).execute(
        "search_general_kb", {"query": "НДС", "topic": "Tax", "jurisdiction": "RU"}, A
    )
    assert out.status == "ok"
    call = s.calls[0]
    assert call.source == "knowledge_base" and call.tenant_id == "tenant-a"
    assert call.filters == {"tag": "topic:tax"} and call.query == "НДС RU"
    await executor(s).execute("search_general_kb", {"query": "НДС", "jurisdiction": "RU"}, A)
    assert s.calls[1].filters == {"tag": "jurisdiction:ru"}


async def test_the_kb_tool_takes_its_facets_as_filters_too():
    """agent.md §3 spells search_general_kb's input `query, top_k, filters?`."""
    s = FakeSearcher()
    out = await executor(s).execute(
        "search_general_kb", {"query": "НДС", "filters": {"topic": "Tax", "jurisdiction": "RU"}}, A
    )
    assert out.status == "ok"
    assert s.calls[0].filters == {"tag": "topic:tax"} and s.calls[0].query == "НДС RU"
    agreed = {"query": "НДС", "topic": "tax", "filters": {"topic": "TAX"}}
    assert (await executor(s).execute("search_general_kb", agreed, A)).status == "ok"
    assert s.calls[1].filters == {"tag": "topic:tax"}
    for refused in ({"query": "НДС", "topic": "tax", "filters": {"topic": "travel"}},
                    {"query": "НДС", "filters": {"tags": ["x"]}}):  # fmt: skip
        out = await executor(s).execute("search_general_kb", refused, A)
        assert (out.status, out.error_code) == ("error", "INVALID_ARGUMENT")
    assert len(s.calls) == 2


@pytest.mark.parametrize("argument", ["topic", "jurisdiction"])
async def test_the_kb_tool_filters_on_the_tag_a_csv_article_carries(argument):
    csv = (
        "title,content,topic,jurisdiction,updated_at\n"
        'VAT,"# VAT\n\nThe rate is 20%.", Tax , RU ,2025-01-01\n'
    )
    (article,) = read_knowledge_base_csv(csv, KB_TENANT).strict()
    s = FakeSearcher()
    asked = {"topic": "TAX ", "jurisdiction": "ru"}[argument]
    await executor(s).execute("search_general_kb", {"query": "VAT", argument: asked}, A)
    assert s.calls[0].filters["tag"] in article.tags


@pytest.mark.parametrize(
    ("args", "ok"),
    [
        ({"query": "x", "top_k": MAX_TOP_K}, True),
        ({"query": "x", "top_k": MAX_TOP_K + 1}, False),
        ({"query": "x", "top_k": 0}, False),
        ({"query": ""}, False),
        ({"query": "x", "tenant_id": "tenant-b"}, False),  # no tenant from arguments
        ({"query": "x", "document_ids": ["d"] * 51}, False),
        ({"query": "x", "score_threshold": 1.5}, False),
    ],
)
async def test_arguments_at_and_past_the_limits(args, ok):
    out = await executor(FakeSearcher()).execute("search_user_documents", args, A)
    assert (out.status == "ok") is ok
    if not ok:
        assert out.error_code == "INVALID_ARGUMENT"


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (errors.UnavailableError("down", reason="backend_unavailable"), "UPSTREAM_UNAVAILABLE"),
        (errors.LimitExceededError("too long"), "INVALID_ARGUMENT"),
        (errors.InternalError("bug"), "UPSTREAM_UNAVAILABLE"),
    ],
)
async def test_retrieval_failures_are_results_the_model_can_react_to(exc, code):
    out = await executor(FakeSearcher(fail=exc)).execute("search_general_kb", {"query": "x"}, A)
    assert (out.status, out.error_code) == ("error", code)


async def test_searches_count_against_the_tenant_key_whatever_ids_they_name():
    # Document ids only filter a search: made-up ones must not open new rate-limit keys.
    s = FakeSearcher()
    ex = ToolExecutor(
        SearchTools(s).tools,
        rate_limiter=RateLimiter(RateLimits(calls_per_minute=60, tenant_calls_per_minute=3)),
    )
    for i in range(2):  # at the limit: the third call of the tenant
        args = {"query": "LDAP", "document_ids": [f"made-up-{i}", f"other-{i}"]}
        assert (await ex.execute("search_user_documents", args, A)).status == "ok"
    assert (await ex.execute("search_general_kb", {"query": "tax"}, A)).status == "ok"
    out = await ex.execute(
        "search_user_documents", {"query": "LDAP", "document_ids": ["made-up-3"]}, A
    )  # one past it
    assert out.error_code == "RATE_LIMIT_EXCEEDED" and "tenant" in out.error_message
    assert out.retry_after_s == 60 and len(s.calls) == 3
    other = Caller("tenant-b", "u2")
    assert (await ex.execute("search_general_kb", {"query": "tax"}, other)).status == "ok"
