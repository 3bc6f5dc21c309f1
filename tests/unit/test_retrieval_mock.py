"""Retrieval's mock mode (RETR_MOCK_MODE, retrieval-v1 §5): stable hits from a fixed list, no
index, no embedder, no reranker."""

import grpc
import pytest
from visior.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc

from services.common import errors
from services.retrieval import app
from services.retrieval.mock import MockSearchEngine
from services.retrieval.search import SearchDefaults, SearchQuery
from tests.retrieval_server import retrieval_channel

EXPECTED_HITS = [
    ("doc_1", "sec_intro", "chunk_1", 1, 2, pytest.approx(0.92)),
    ("doc_1", "sec_ldap", "chunk_2", 6, 7, pytest.approx(0.81)),
    ("doc_2", "sec_changes", "chunk_3", 1, 1, pytest.approx(0.64)),
]


def _no_backend(*args, **kwargs):
    raise AssertionError("mock mode touched a search backend")


@pytest.fixture
def no_backend(monkeypatch):
    for name in ("build_embedder", "open_index", "build_reranker"):
        monkeypatch.setattr(app, name, _no_backend)


async def test_search_in_mock_mode_returns_the_fixed_shape_without_a_backend(tmp_path, no_backend):
    async with retrieval_channel(tmp_path, RETR_MOCK_MODE="true") as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        request = retrieval_pb2.SearchRequest(
            query="How is LDAP set up?", tenant_id="t1", trace_id="tr-9"
        )
        first = await stub.Search(request)
        again = await stub.Search(
            retrieval_pb2.SearchRequest(query="something else", tenant_id="t2", trace_id="tr-9")
        )
    hits = [(h.doc_id, h.section_id, h.chunk_id, h.page_start, h.page_end, h.score)
            for h in first.hits]  # fmt: skip
    assert hits == EXPECTED_HITS
    assert all(h.text for h in first.hits)
    assert [(c.chunk_id, c.mcp_link.doc_id, c.mcp_link.page_start) for c in first.chunks] == [
        ("chunk_1", "doc_1", 1),
        ("chunk_2", "doc_1", 6),
        ("chunk_3", "doc_2", 1),
    ]
    assert [(d.doc_id, d.title) for d in first.used_docs] == [
        ("doc_1", "Orion X guide"),
        ("doc_2", "Orion X release notes"),
    ]
    assert [(s.doc_id, s.section_id, s.anchor_chunk_id) for s in first.used_sections] == [
        ("doc_1", "sec_intro", "chunk_1"),
        ("doc_1", "sec_ldap", "chunk_2"),
        ("doc_2", "sec_changes", "chunk_3"),
    ]
    assert first.meta.backend == "mock" and first.meta.trace_id == "tr-9"
    assert not first.meta.hybrid_used and not first.meta.rerank_used
    assert first == again  # deterministic: the same hits whatever the query


async def test_mock_mode_still_refuses_an_invalid_search(tmp_path, no_backend):
    async with retrieval_channel(tmp_path, RETR_MOCK_MODE="true") as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Search(retrieval_pb2.SearchRequest(query="", tenant_id="t1"))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(("max_results", "count"), [(None, 3), (1, 1), (2, 2), (50, 3)])
async def test_mock_engine_caps_the_fixed_hits_at_max_results(max_results, count):
    engine = MockSearchEngine(SearchDefaults())
    result = await engine.search(SearchQuery(query="q", tenant_id="t", max_results=max_results))
    assert len(result.hits) == count
    # As the engine's: used_sections and the context are the selection's (max_sections,
    # max_chunks), not max_results'.
    assert len(result.sections) == len(result.chunks) == 3
    assert result.backend == "mock"


async def test_mock_engine_applies_the_request_limits():
    engine = MockSearchEngine(SearchDefaults())
    with pytest.raises(errors.LimitExceededError):
        await engine.search(SearchQuery(query="q", tenant_id="t", max_results=51))
    with pytest.raises(errors.InvalidArgumentError):
        await engine.search(SearchQuery(query="q", tenant_id=""))


@pytest.mark.parametrize("query", ["", "   ", "\u200b", "\u200e\ufeff\x01"])
async def test_mock_engine_refuses_a_query_with_nothing_to_search_as_the_engine_does(query):
    with pytest.raises(errors.InvalidArgumentError) as caught:
        await MockSearchEngine(SearchDefaults()).search(SearchQuery(query=query, tenant_id="t"))
    assert caught.value.metadata["field"] == "query"
