"""Retrieval's per-search log line (retrieval-v1 §7, retrieval.md §7.4) and its slow-search
warning (above 300 ms)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from services.common.logging import trace_id_bound
from services.common.search_contract import KB_TENANT, Filters
from services.common.settings import Env
from services.retrieval import engine as engine_module
from services.retrieval.config import RetrievalSettings
from services.retrieval.embeddings import EmbeddingSettings
from services.retrieval.engine import EngineSettings
from services.retrieval.factories import build_embedder, build_reranker
from services.retrieval.rerank import RerankSettings
from services.retrieval.search import SearchQuery, SearchResult
from services.retrieval.search_log import (
    MAX_FILTER_VALUE_CHARS,
    MAX_FILTER_VALUES,
    SearchTiming,
    filters_logged,
    log_search,
)
from tests.fakes.rerank_server import FakeRerankServer
from tests.unit.json_logs import json_lines
from tests.unit.test_search import fill, make_stack, q


@dataclass
class Plan:
    q: SearchQuery
    tenant_id: str = "t1"
    max_results: int = 10
    mode: str = "section_first"
    ranking: str = "hybrid"
    variants: tuple[str, ...] = ("v1", "v2")
    variants_source: str = "synonyms"
    language: str = "ru"


def timing() -> SearchTiming:
    return SearchTiming(embed_ms=1.25, engine_ms=3.5, section_candidates=4, chunk_candidates=12)


def result(elapsed_ms: int, hits: int = 3) -> SearchResult:
    return SearchResult(
        hits=[object()] * hits,  # type: ignore[list-item]
        chunks=[object()] * 2,  # type: ignore[list-item]
        docs=[object()],  # type: ignore[list-item]
        sections=[object()] * 2,  # type: ignore[list-item]
        mode="section_first",
        hybrid_used=True,
        rerank_used=False,
        elapsed_ms=elapsed_ms,
        backend="qdrant-edge",
    )


def one_search_line(elapsed_ms: int, slow_ms: float) -> dict[str, Any]:
    plan = Plan(SearchQuery("secret question", "t1", filters=Filters(product="x", tags=("a",))))
    with json_lines("retrieval") as logs:
        log_search(plan, result(elapsed_ms), timing(), slow_ms)
    [line] = logs.events("search")
    assert "secret question" not in logs.raw[0]  # the query's text is the user's
    return line


def test_one_line_with_the_spec_fields():
    line = one_search_line(elapsed_ms=42, slow_ms=300)
    assert (line["level"], line["service"], line["logger"]) == (
        "info", "retrieval", "visior.retrieval.search",
    )  # fmt: skip
    assert line["tenant_id"] == "t1" and line["max_results"] == 10
    assert line["searched_tenant"] == "t1"
    assert line["filters"] == {"product": "x", "tags": ["a"]}
    assert (line["mode"], line["ranking"], line["backend"]) == (
        "section_first", "hybrid", "qdrant-edge",
    )  # fmt: skip
    assert (line["hits_count"], line["docs_count"], line["sections_count"]) == (3, 1, 2)
    assert line["context_chunks"] == 2
    assert (line["doc_candidates"], line["section_candidates"], line["chunk_candidates"]) == (
        None, 4, 12,
    )  # fmt: skip
    assert line["rerank_candidates"] is None and line["rerank_used"] is False
    assert (line["latency_ms"], line["embed_ms"], line["engine_ms"], line["rerank_ms"]) == (
        42, 1.25, 3.5, 0.0,
    )  # fmt: skip
    assert (line["query_variants"], line["query_variants_source"]) == (2, "synonyms")
    assert "slow" not in line


def test_a_search_at_the_slow_threshold_is_info_and_one_past_it_a_warning():
    at = one_search_line(elapsed_ms=300, slow_ms=300)
    assert at["level"] == "info" and "slow" not in at
    past = one_search_line(elapsed_ms=301, slow_ms=300)
    assert past["level"] == "warning" and past["slow"] is True
    assert past["slow_search_ms"] == 300 and past["latency_ms"] == 301


def test_a_zero_threshold_never_warns():
    assert one_search_line(elapsed_ms=60_000, slow_ms=0)["level"] == "info"


def test_list_filters_are_logged_up_to_the_limit_and_counted_past_it():
    at = [f"d{i}" for i in range(MAX_FILTER_VALUES)]
    assert filters_logged(Filters(doc_ids=tuple(at))) == {"doc_ids": at}
    past = (*at, "one-more")
    assert filters_logged(Filters(doc_ids=past, section_ids=("s",))) == {
        "doc_ids": at,
        "doc_ids_count": MAX_FILTER_VALUES + 1,
        "section_ids": ["s"],
    }
    assert filters_logged(Filters()) == {}


def test_filter_values_are_logged_cut_to_their_limit():
    at, past = "p" * MAX_FILTER_VALUE_CHARS, "d" * 300_000
    logged = filters_logged(Filters(product=at, version=past, doc_ids=(past,) * 25))
    assert logged["product"] == at
    assert logged["version"] == "d" * MAX_FILTER_VALUE_CHARS + "…"
    assert logged["doc_ids"] == ["d" * MAX_FILTER_VALUE_CHARS + "…"] * MAX_FILTER_VALUES
    assert logged["doc_ids_count"] == 25


def test_a_knowledge_base_search_is_logged_under_the_caller():
    ask = SearchQuery("q", "caller", filters=Filters(source="knowledge_base"))
    with json_lines("retrieval") as logs:
        log_search(Plan(ask, tenant_id=KB_TENANT), result(5), timing(), 0)
    [line] = logs.events("search")
    assert (line["tenant_id"], line["searched_tenant"]) == ("caller", KB_TENANT)
    [event] = logs.events("query_expansion")
    assert event["tenant_id"] == "caller"


def test_the_slow_search_threshold_is_300_ms():
    assert RetrievalSettings.from_env(Env({})).engine.slow_search_ms == 300.0


# --- through the engine --------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedder():
    return build_embedder(EmbeddingSettings(profile="fast"))


async def test_every_engine_search_writes_one_line_under_the_request_trace(tmp_path, embedder):
    stack = make_stack(tmp_path, embedder, settings=EngineSettings(slow_search_ms=1234.0))
    await fill(stack)
    try:
        with json_lines("retrieval") as logs, trace_id_bound("tr-search"):
            first = await stack.engine.search(q(mode="doc_first", max_results=3))
            second = await stack.engine.search(
                q(mode="chunk_priority", filters=Filters(doc_ids=("guide", "notes")))
            )
    finally:
        stack.index.close()
    lines = logs.events("search")
    assert len(lines) == 2
    for line, r in zip(lines, (first, second), strict=True):
        assert line["trace_id"] == "tr-search" and line["tenant_id"] == "a"
        assert line["hits_count"] == len(r.hits) > 0
        assert (line["mode"], line["backend"], line["latency_ms"]) == (
            r.mode, r.backend, r.elapsed_ms,
        )  # fmt: skip
        assert line["chunk_candidates"] >= len(r.hits)
        assert 1 <= line["section_candidates"] <= line["chunk_candidates"]
    assert lines[0]["max_results"] == 3 and lines[0]["filters"] == {}
    assert lines[0]["doc_candidates"] >= len({h.doc_id for h in first.hits})
    assert lines[1]["doc_candidates"] is None  # chunk_priority has no document stage
    assert lines[1]["filters"] == {"doc_ids": ["guide", "notes"]}


async def test_knowledge_base_searches_are_logged_under_each_caller(tmp_path, embedder):
    stack = make_stack(tmp_path, embedder)
    await fill(stack)
    kb = Filters(source="knowledge_base")
    try:
        with json_lines("retrieval") as logs:
            for caller in ("a", "b"):
                assert (
                    await stack.engine.search(q(query="НДФЛ ставка", tenant_id=caller, filters=kb))
                ).hits
    finally:
        stack.index.close()
    lines = logs.events("search")
    assert [(x["tenant_id"], x["searched_tenant"]) for x in lines] == [
        ("a", KB_TENANT), ("b", KB_TENANT),
    ]  # fmt: skip


async def test_the_engine_passes_its_slow_threshold(tmp_path, embedder, monkeypatch):
    seen: list[float] = []
    monkeypatch.setattr(engine_module, "log_search", lambda *a: seen.append(a[3]))
    stack = make_stack(tmp_path, embedder, settings=EngineSettings(slow_search_ms=77.0))
    await fill(stack)
    try:
        await stack.engine.search(q())
    finally:
        stack.index.close()
    assert seen == [77.0]


async def test_a_reranked_search_logs_the_candidates_sent_to_the_reranker(tmp_path, embedder):
    with FakeRerankServer() as server:
        reranker = build_reranker(RerankSettings(url=server.url, api_style="tei", timeout_s=1.0))
        stack = make_stack(tmp_path, embedder, reranker=reranker)
        await fill(stack)
        try:
            with json_lines("retrieval") as logs:
                r = await stack.engine.search(q(enable_rerank=True, mode="chunk_priority"))
        finally:
            stack.index.close()
    [line] = logs.events("search")
    assert r.rerank_used and line["rerank_used"] is True
    assert 0 < line["rerank_candidates"] <= line["chunk_candidates"]
    assert line["rerank_ms"] == round(r.rerank_ms, 3)


def test_a_search_with_query_variants_writes_a_query_expansion_event():
    plan = Plan(SearchQuery("secret question", "t1"))
    with json_lines("retrieval") as logs:
        log_search(plan, result(5), timing(), 0)
    [event] = logs.events("query_expansion")
    assert (event["tenant_id"], event["variants"], event["source"], event["language"]) == (
        "t1",
        2,
        "synonyms",
        "ru",
    )
    assert not any("v1" in line or "secret question" in line for line in logs.raw)


def test_no_query_expansion_event_without_variants():
    plan = Plan(SearchQuery("q", "t1"), variants=(), variants_source="")
    with json_lines("retrieval") as logs:
        log_search(plan, result(5), timing(), 0)
    assert logs.events("query_expansion") == [] and len(logs.events("search")) == 1
