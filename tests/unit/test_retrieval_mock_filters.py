"""Mock mode (retrieval-v1 §4/§5) applies a request's filters and limits to its fixed list as
the real engine applies them to its candidates: the same validation, defaults and shaping."""

from __future__ import annotations

import pytest
from visior.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc

from services.common import errors
from services.common.search_contract import Filters
from services.common.tokenizer import default_tokenizer
from services.retrieval.mock import MockSearchEngine
from services.retrieval.search import SearchDefaults, SearchQuery
from tests.retrieval_server import retrieval_channel

ALL = ["chunk_1", "chunk_2", "chunk_3"]
"""The fixed list's own documents' chunks, best first: doc_1's (0.92, 0.81), doc_2's (0.64)."""


async def search(defaults: SearchDefaults | None = None, **kw):
    engine = MockSearchEngine(defaults or SearchDefaults())
    return await engine.search(SearchQuery(**{"query": "q", "tenant_id": "t", **kw}))


def ids(result) -> list[str]:
    return [h.chunk_id for h in result.hits]


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        (Filters(), ALL),
        (Filters(doc_ids=("doc_2",)), ["chunk_3"]),
        (Filters(doc_ids=("doc_2", "doc_1")), ALL),
        (Filters(doc_ids=("nope",)), []),
        (Filters(section_ids=("sec_ldap",)), ["chunk_2"]),
        (Filters(section_ids=("sec_ldap", "sec_changes")), ["chunk_2", "chunk_3"]),
        (Filters(tags=("admin", "release")), ALL),
        (Filters(tags=("nope", "release")), ["chunk_3"]),  # any of the tags
        (Filters(tags=("nope",)), []),
        (Filters(product="orion-x"), ALL),
        (Filters(product="other"), []),
        (Filters(product="orion-x", version="2.2"), ["chunk_3"]),
        (Filters(version="2.1", tags=("release",)), []),  # every filter holds at once
        (Filters(doc_ids=("doc_1",), section_ids=("sec_changes",)), []),
        (Filters(source="user"), ALL),
        (Filters(source="knowledge_base"), ["kb_chunk_1"]),  # the shared corpus, asked for
        (Filters(source="knowledge_base", doc_ids=("doc_1",)), []),
    ],
)
async def test_filters_narrow_the_fixed_list(filters, expected):
    result = await search(filters=filters)
    assert ids(result) == expected
    assert {h.doc_id for h in result.hits} == {d.doc_id for d in result.docs}
    assert {(h.doc_id, h.section_id) for h in result.hits} == {
        (s.doc_id, s.section_id) for s in result.sections
    }
    assert [c.chunk_id for c in result.chunks] == expected  # no context outside the filters


async def test_the_knowledge_base_is_never_mixed_into_a_tenants_own_documents():
    assert "kb_chunk_1" not in ids(await search(max_results=50))
    assert [d.doc_id for d in (await search(filters=Filters(source="knowledge_base"))).docs] == [
        "kb_depreciation"
    ]


@pytest.mark.parametrize(
    ("min_score", "expected"),
    [(None, ALL), (0.0, ALL), (0.64, ALL), (0.92, ["chunk_1"]), (0.95, [])],
)  # fmt: skip
async def test_min_score_drops_the_weaker_hits(min_score, expected):
    result = await search(min_score=min_score)
    assert ids(result) == expected
    assert len(result.docs) == len({h.doc_id for h in result.hits})


async def test_the_servers_min_score_is_the_default():
    assert ids(await search(SearchDefaults(min_score=0.8))) == ["chunk_1", "chunk_2"]
    assert ids(await search(SearchDefaults(min_score=0.8), min_score=0.0)) == ALL


async def test_topk_per_doc_max_docs_and_max_sections():
    assert ids(await search(topk_per_doc=1)) == ["chunk_1", "chunk_3"]
    assert ids(await search(SearchDefaults(topk_per_doc=1))) == ["chunk_1", "chunk_3"]
    assert ids(await search(topk_per_doc=0)) == ALL  # 0: no limit
    r = await search(max_docs=1)
    assert ids(r) == ["chunk_1", "chunk_2"] and [d.doc_id for d in r.docs] == ["doc_1"]
    r = await search(max_sections=2)
    assert ids(r) == ["chunk_1", "chunk_2"]
    assert [s.section_id for s in r.sections] == ["sec_intro", "sec_ldap"]


async def test_max_chunks_and_context_token_limit_bound_the_context():
    tokens = default_tokenizer().count((await search()).hits[0].text)  # chunk_1's
    r = await search(max_chunks=1)
    assert ids(r) == ALL and [c.chunk_id for c in r.chunks] == ["chunk_1"]
    r = await search(context_token_limit=tokens)
    assert ids(r) == ALL  # the hits are not the context
    assert [c.chunk_id for c in r.chunks] == ["chunk_1"]
    assert sum(c.tokens for c in r.chunks) <= tokens
    r = await search(context_token_limit=tokens - 1)
    assert r.chunks == [] and ids(r) == ALL
    r = await search(SearchDefaults(context_token_limit=tokens))
    assert [c.chunk_id for c in r.chunks] == ["chunk_1"]


async def test_hits_carry_their_token_counts_and_sections_their_titles():
    r = await search()
    tokenizer = default_tokenizer()
    assert all(h.tokens == tokenizer.count(h.text) > 0 for h in r.hits)
    assert [(s.section_id, s.title) for s in r.sections] == [
        ("sec_intro", "Introduction"),
        ("sec_ldap", "LDAP integration"),
        ("sec_changes", "Changes"),
    ]


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"ranking": "bogus"}, "params.ranking"),
        ({"fusion": "bogus"}, "params.fusion"),
    ],
)
async def test_a_ranking_or_fusion_the_engine_refuses_is_refused_the_same_way(kw, field):
    """The rest of search.validate (limits, filters, mode) was already shared; see
    test_retrieval_mock.py."""
    with pytest.raises(errors.InvalidArgumentError) as info:
        await search(**kw)
    assert info.value.metadata["field"] == field


async def test_the_same_request_gets_the_same_answer():
    a = await search(filters=Filters(tags=("admin", "release")), topk_per_doc=1)
    b = await search(filters=Filters(tags=("admin", "release")), topk_per_doc=1)
    assert a == b and ids(a) == ["chunk_1", "chunk_3"]


async def test_filters_and_limits_reach_the_mock_through_the_service(tmp_path):
    async with retrieval_channel(tmp_path, RETR_MOCK_MODE="true") as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        r = await stub.Search(
            retrieval_pb2.SearchRequest(
                query="q", tenant_id="t1", filters=retrieval_pb2.SearchFilters(doc_ids=["doc_2"])
            )
        )
        assert [h.chunk_id for h in r.hits] == ["chunk_3"]
        assert [d.doc_id for d in r.used_docs] == ["doc_2"]
        r = await stub.Search(
            retrieval_pb2.SearchRequest(
                query="q", tenant_id="t1", params=retrieval_pb2.SearchParams(min_score=0.9)
            )
        )
        assert [h.chunk_id for h in r.hits] == ["chunk_1"]
