"""What a search's caps leave in the answer (topk_per_doc, max_docs, max_sections), the
section_first shortlist and the context at its token limit, over a real Qdrant Edge shard
and the fast-profile embedder (docs/architecture.md §5)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from services.common.search_contract import Filters
from services.common.tokenizer import default_tokenizer
from services.docstore.model import StoredPoint
from services.retrieval.embeddings import EmbeddingSettings
from services.retrieval.engine import RequestLimits, shortlist_sections
from services.retrieval.factories import build_embedder
from services.retrieval.ingestion import IngestInput
from services.retrieval.search import MODES, SearchQuery, SearchResult
from services.retrieval.servicer import search_response
from tests.unit.test_search import Reverse, Stack, fill, make_stack

SAMPLES = Path(__file__).resolve().parents[2] / "samples" / "docs"
BIG = "# LDAP handbook\n\n" + "".join(
    f"## LDAP setup step {i}\n\nConfigure LDAP server binding, LDAP directory sync and "
    f"LDAP authentication, part {i}.\n\n"
    for i in range(40)
)
"""One document whose 40 sections all match the query better than any other document."""
SMALL = "# Note {n}\n\n## Misc\n\nThe LDAP server configuration is described in the handbook; see also topic {n}.\n"
LDAP = "LDAP server configuration"


@pytest.fixture(scope="module")
def embedder():
    return build_embedder(EmbeddingSettings(profile="fast"))


@pytest.fixture(scope="module")
def one_big(tmp_path_factory, embedder):
    """Tenant t: big.md (40 LDAP sections) and b, c, d.md (one LDAP sentence each)."""
    stack = make_stack(tmp_path_factory.mktemp("big"), embedder)

    async def ingest() -> None:
        await stack.ingestor.ingest(IngestInput("t", BIG.encode(), file_name="big.md"))
        for n in "bcd":
            text = SMALL.format(n=n).encode()
            await stack.ingestor.ingest(IngestInput("t", text, file_name=f"{n}.md"))

    asyncio.run(ingest())
    yield stack
    stack.index.close()


@pytest.fixture(scope="module")
def samples(tmp_path_factory, embedder):
    """Tenant demo: the sample Markdown documents (the mesh's demo tenant)."""
    stack = make_stack(tmp_path_factory.mktemp("samples"), embedder)

    async def ingest() -> None:
        for path in sorted(SAMPLES.glob("*.md")):
            await stack.ingestor.ingest(IngestInput("demo", path.read_bytes(), file_name=path.name))

    asyncio.run(ingest())
    yield stack
    stack.index.close()


def assert_consistent(r: SearchResult, q: SearchQuery) -> None:
    """The invariants every answer keeps, whatever the caps."""
    sections = {(s.doc_id, s.section_id) for s in r.sections}
    docs = {d.doc_id for d in r.docs}
    assert len(r.hits) <= (q.max_results or 10)
    assert len(r.chunks) <= (q.max_chunks or 40)
    assert not q.max_docs or len(r.docs) <= q.max_docs
    assert not q.max_sections or len(r.sections) <= q.max_sections
    for h in [*r.hits, *r.chunks]:
        assert (h.doc_id, h.section_id) in sections and h.doc_id in docs
        assert 0.0 <= h.score <= 1.0
    assert all(0.0 <= x.score <= 1.0 for x in [*r.sections, *r.docs])
    if q.topk_per_doc:
        assert max(Counter(h.doc_id for h in r.hits).values(), default=0) <= q.topk_per_doc
    assert [h.score for h in r.hits] == sorted((h.score for h in r.hits), reverse=True)


# -- topk_per_doc / max_docs: the other documents fill the answer ----------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("caps", "hits", "docs"),
    [
        ({"max_results": 3, "topk_per_doc": 1}, 3, 3),
        ({"max_results": 3, "topk_per_doc": 1, "max_chunks": 3}, 3, 3),
        ({"max_results": 4, "max_docs": 4, "topk_per_doc": 1}, 4, 4),
        ({"max_results": 5, "max_docs": 4, "topk_per_doc": 1}, 4, 4),  # one past: 4 docs
        ({"max_results": 1, "max_chunks": 1, "topk_per_doc": 1}, 1, 1),
        ({"max_results": 6, "topk_per_doc": 2}, 5, 4),  # big's 2, then b, c, d
    ],
)
async def test_one_large_document_does_not_crowd_out_the_others(one_big, mode, caps, hits, docs):
    # Before: big.md filled the first max(max_chunks, max_results) candidates and was cut
    # to topk_per_doc, so the answer was big's one hit.
    q = SearchQuery(query=LDAP, tenant_id="t", mode=mode, **caps)
    r = await one_big.engine.search(q)
    assert_consistent(r, q)
    assert len(r.hits) == hits
    assert len({h.doc_id for h in r.hits}) == docs
    assert r.hits[0].doc_id == "big"


@pytest.mark.parametrize("mode", MODES)
async def test_the_caps_still_hold(one_big, mode):
    q = SearchQuery(query=LDAP, tenant_id="t", mode=mode, max_results=5, max_docs=1)
    r = await one_big.engine.search(q)
    assert_consistent(r, q)
    assert {h.doc_id for h in r.hits} == {"big"} and len(r.hits) == 5
    q = SearchQuery(query=LDAP, tenant_id="t", mode=mode, max_results=5, max_docs=2, topk_per_doc=1)
    r = await one_big.engine.search(q)
    assert_consistent(r, q)
    assert len(r.hits) == 2 and len({h.doc_id for h in r.hits}) == 2


class CountingIndex:
    """The stack's index, counting the batched rank calls a search makes."""

    def __init__(self, stack: Stack) -> None:
        self.calls = 0
        self._inner = stack.index.search_ids_batch
        stack.index.search_ids_batch = self  # type: ignore[method-assign]

    def __call__(self, queries):
        self.calls += 1
        return self._inner(queries)


@pytest.mark.parametrize("mode", ["section_first", "chunk_priority", "hybrid_only"])
async def test_only_a_short_answer_fetches_again_and_a_bounded_number_of_times(one_big, mode):
    counter = CountingIndex(one_big)
    try:
        await one_big.engine.search(SearchQuery(query=LDAP, tenant_id="t", mode=mode))
        assert counter.calls == 1
        counter.calls = 0
        short = SearchQuery(
            query=LDAP, tenant_id="t", mode=mode, max_results=3, max_chunks=3, topk_per_doc=1
        )
        r = await one_big.engine.search(short)
        assert len({h.doc_id for h in r.hits}) == 3
        assert 1 < counter.calls <= 5
        # Short, but at the caller's max_sections or max_docs: nothing deeper can get in.
        for caps in ({"max_sections": 1}, {"max_docs": 1}):
            counter.calls = 0
            capped = SearchQuery(
                query=LDAP,
                tenant_id="t",
                mode=mode,
                max_results=3,
                max_chunks=3,
                topk_per_doc=1,
                **caps,
            )
            r = await one_big.engine.search(capped)
            assert len(r.hits) == 1 and counter.calls == 1, caps
    finally:
        del one_big.index.search_ids_batch


# -- section_first's shortlist ------------------------------------------------------------


@pytest.mark.parametrize("ranking", ["hybrid", "dense", "sparse"])
@pytest.mark.parametrize("max_sections", [1, 2])
async def test_a_small_section_shortlist_still_answers(samples, ranking, max_sections):
    # The reviewer's repro: the section ranked first by its summary had no fetched chunk,
    # tied with the section of the best chunk and won by its id; the answer was empty.
    for query in ("пользователя parts", "LDAP", "отпуск", "release backup"):
        base = await samples.engine.search(
            SearchQuery(query=query, tenant_id="demo", ranking=ranking, max_results=1, max_chunks=1)
        )
        q = SearchQuery(
            query=query,
            tenant_id="demo",
            ranking=ranking,
            max_results=1,
            max_chunks=1,
            max_sections=max_sections,
        )
        r = await samples.engine.search(q)
        assert_consistent(r, q)
        assert bool(r.hits) == bool(base.hits), query


async def test_the_repro_answers_with_the_section_of_the_best_chunk(samples):
    q = SearchQuery(
        query="пользователя parts", tenant_id="demo", max_results=1, max_chunks=1, max_sections=1
    )
    r = await samples.engine.search(q)
    base = await samples.engine.search(replace_sections(q))
    assert_consistent(r, q)
    assert [h.chunk_id for h in r.hits] == [base.hits[0].chunk_id]
    assert r.hits[0].section_id.endswith("ldap-интеграции")


def replace_sections(q: SearchQuery) -> SearchQuery:
    return SearchQuery(
        query=q.query, tenant_id=q.tenant_id, max_results=q.max_results, max_chunks=q.max_chunks
    )


def point(doc: str, section: str, n: int = 0) -> StoredPoint:
    return StoredPoint(n, doc, f"{doc}:{section}", f"{doc}:c{n}", "chunk", n, 1, 1, 10, "g")


def limits(max_sections: int, topk_per_doc: int = 0) -> RequestLimits:
    return RequestLimits(
        max_results=10,
        max_docs=20,
        max_sections=max_sections,
        max_chunks=40,
        token_limit=4096,
        topk_per_doc=topk_per_doc,
        min_score=0.0,
        hard_trim=False,
    )


def test_a_tie_goes_to_the_better_chunk_never_to_the_id():
    # "a" is first by its summary alone, "z" holds the best chunk: 0.5 each after fusion.
    sections = [(point("a", "s"), 0.9), (point("z", "s"), 0.1)]
    chunks = [(point("z", "s", 1), 0.8), (point("a", "s", 2), 0.1)]
    assert shortlist_sections(limits(1), sections, chunks) == {("z", "z:s")}
    # Without a chunk a section takes no place, however well its summary matches.
    assert shortlist_sections(limits(1), sections, chunks[:1]) == {("z", "z:s")}
    assert shortlist_sections(limits(2), sections, chunks[:1]) == {("z", "z:s")}
    # Equal chunks too: the earlier one in the chunk ranking, whatever the ids.
    tied = [(point("z", "s", 1), 0.5), (point("a", "s", 2), 0.5)]
    even = [(point("a", "s"), 0.5), (point("z", "s"), 0.5)]
    assert shortlist_sections(limits(1), even, tied) == {("z", "z:s")}
    assert shortlist_sections(limits(1), even, tied[::-1]) == {("a", "a:s")}


def test_a_document_takes_at_most_topk_per_doc_places():
    sections = [(point("big", f"s{i}"), 1.0 - i / 10) for i in range(4)]
    chunks = [(point("big", f"s{i}", i), 1.0 - i / 10) for i in range(4)]
    chunks.append((point("b", "s", 9), 0.2))
    assert shortlist_sections(limits(2, topk_per_doc=1), sections, chunks) == {
        ("big", "big:s0"),
        ("b", "b:s"),
    }
    assert shortlist_sections(limits(2), sections, chunks) == {("big", "big:s0"), ("big", "big:s1")}


# -- the context at its token limit ----------------------------------------------------------


async def test_the_context_never_keeps_a_worse_chunk_in_place_of_the_best(samples):
    tok = default_tokenizer()
    q = SearchQuery(query="LDAP", tenant_id="demo", max_results=3)
    full = await samples.engine.search(q)
    best = full.hits[0]
    assert best.doc_id == "orion-x-admin-guide" and best.tokens > 40
    for limit in (40, best.tokens - 1):
        r = await samples.engine.search(SearchQuery(**{**vars(q), "context_token_limit": limit}))
        assert r.chunks == [], limit  # not the vacation policy's or the notes' shorter chunk
        trimmed = await samples.engine.search(
            SearchQuery(**{**vars(q), "context_token_limit": limit, "hard_trim": True})
        )
        assert [c.chunk_id for c in trimmed.chunks] == [best.chunk_id]
        assert trimmed.chunks[0].tokens == tok.count(trimmed.chunks[0].text) == limit
    at = await samples.engine.search(SearchQuery(**{**vars(q), "context_token_limit": best.tokens}))
    assert [c.chunk_id for c in at.chunks] == [best.chunk_id] and at.chunks[0].text == best.text


# -- hybrid_only is dense + BM25 and nothing else ------------------------------------------


@pytest.mark.parametrize(
    "asked",
    [
        {},
        {"ranking": "dense"},
        {"ranking": "sparse"},
        {"enable_hybrid": False},
        {"enable_rerank": True},
        {"ranking": "dense", "enable_hybrid": False, "enable_rerank": True},
    ],
)
async def test_hybrid_only_ranks_hybrid_and_never_reranks_whatever_the_request_says(
    tmp_path, embedder, asked
):
    # Documented (proto SearchParams.retrieval_mode, docs/architecture.md §5), not refused:
    # callers send one ranking to every mode. meta reports what ran.
    reranker = Reverse()
    stack = make_stack(tmp_path, embedder, reranker=reranker)
    try:
        await fill(stack)
        ask = SearchQuery(query="LDAP integration setup", tenant_id="a", **asked)
        plain = await stack.engine.search(SearchQuery(**{**vars(ask), "mode": "hybrid_only"}))
        hybrid = SearchQuery(query=ask.query, tenant_id="a", mode="hybrid_only")
        assert plain.hybrid_used and not plain.rerank_used and not reranker.calls
        assert plain.hits == (await stack.engine.search(hybrid)).hits
        # The same fields in another mode do what they say.
        other = await stack.engine.search(SearchQuery(**{**vars(ask), "mode": "chunk_priority"}))
        assert other.hybrid_used == (not asked or asked == {"enable_rerank": True})
        assert other.rerank_used == bool(asked.get("enable_rerank"))
    finally:
        stack.index.close()


# -- max_docs / max_sections below max_results: the kept documents fill the answer ---------


GUIDE = (
    "# Directory guide\n\n## LDAP server configuration\n\nLDAP server configuration: bind DN, LDAP server URL, LDAP configuration sync.\n\n"
    + "".join(
        f"## Appendix {i}\n\nAppendix {i} on printers, paper trays and toner; LDAP is named once.\n\n"
        for i in range(6)
    )
)
"""One document: a section matching the query best, and six that barely match it."""


LONG_NOTE = "# Note {n}\n\n## LDAP\n\n" + " ".join(
    f"The LDAP server configuration of site {{n}} is described in runbook {k}, with its own "
    "bind account, base DN and sync schedule, and reviewed every quarter by the team."
    for k in range(60)
)
"""A note of one section whose several chunks each match the query better than the
guide's appendices."""


@pytest.fixture(scope="module")
def crowded(tmp_path_factory, embedder):
    """Tenant t: guide.md, and 30 long notes whose chunks crowd the guide's six weak sections
    out of the first fetch of candidates (fewer sections than a section_first shortlist)."""
    stack = make_stack(tmp_path_factory.mktemp("crowded"), embedder)

    async def ingest() -> None:
        await stack.ingestor.ingest(IngestInput("t", GUIDE.encode(), file_name="guide.md"))
        for n in range(30):
            text = LONG_NOTE.format(n=n).encode()
            await stack.ingestor.ingest(IngestInput("t", text, file_name=f"note{n}.md"))

    asyncio.run(ingest())
    yield stack
    stack.index.close()


@pytest.mark.parametrize("mode", ["section_first", "chunk_priority", "hybrid_only"])
async def test_the_kept_document_fills_the_answer_past_a_crowded_first_fetch(crowded, mode):
    """The reviewer's repro: max_docs 1 with room for 10 hits gave 2 of the best document's
    chunks while a search of that document alone gives more: the first fetch was filled by
    the other documents' candidates, and no deeper fetch was made at the cap."""
    q = SearchQuery(query=LDAP, tenant_id="t", mode=mode, max_results=10, max_docs=1)
    r = await crowded.engine.search(q)
    assert_consistent(r, q)
    alone = await crowded.engine.search(
        SearchQuery(
            query=LDAP, tenant_id="t", mode=mode, max_results=10,
            filters=Filters(doc_ids=(r.hits[0].doc_id,)),
        )
    )  # fmt: skip
    assert r.hits[0].doc_id == "guide" and len(alone.hits) > 2
    assert len(r.hits) == len(alone.hits), [h.chunk_id for h in r.hits]


@pytest.mark.parametrize("mode", ["section_first", "chunk_priority", "hybrid_only"])
@pytest.mark.parametrize("query", ["LDAP", "отпуск", "release backup", "пользователя parts"])
async def test_one_document_fills_the_answer_as_its_own_search_does(samples, mode, query):
    """max_docs 1 with room for 10 hits: as many of the best document's chunks as a search
    of that document alone finds (the reviewer's repro: 2 of its 5, the first fetch filled by
    the other documents' candidates, and no deeper fetch at max_docs)."""
    q = SearchQuery(query=query, tenant_id="demo", mode=mode, max_results=10, max_docs=1)
    r = await samples.engine.search(q)
    assert_consistent(r, q)
    if not r.hits:
        return
    doc = r.hits[0].doc_id
    alone = await samples.engine.search(
        SearchQuery(
            query=query,
            tenant_id="demo",
            mode=mode,
            max_results=10,
            filters=Filters(doc_ids=(doc,)),
        )
    )
    assert len(r.hits) == len(alone.hits), (doc, [h.chunk_id for h in r.hits])


# -- the context's entries name every chunk they hold -----------------------------------------


async def test_a_merged_context_entry_names_every_chunk_it_holds(samples):
    """The reviewer's repro: an entry of two merged chunks was reported under the first
    one's id only, the second's id nowhere in the context."""
    q = SearchQuery(query="LDAP", tenant_id="demo", max_results=10, max_chunks=40)
    r = await samples.engine.search(q)
    merged = [c for c in r.chunks if len(c.merged) > 1]
    assert merged, [c.merged for c in r.chunks]
    for c in r.chunks:
        assert c.merged[0] == c.chunk_id and not c.truncated
        assert all(m.startswith(f"{c.doc_id}:") for m in c.merged)
    response = search_response(r, "t")
    assert [list(c.chunk_ids) for c in response.chunks] == [list(c.merged) for c in r.chunks]
    ids = [m for c in r.chunks for m in c.merged]
    assert len(ids) == len(set(ids))  # a chunk is in one entry at most


async def test_a_context_entry_cut_to_fit_says_so(samples):
    q = SearchQuery(
        query="LDAP", tenant_id="demo", max_results=10, context_token_limit=100, hard_trim=True
    )
    r = await samples.engine.search(q)
    assert sum(c.tokens for c in r.chunks) == 100
    assert sum(c.truncated for c in r.chunks) == 1  # the one chunk hard_trim cut
    assert [c.truncated for c in search_response(r, "t").chunks] == [c.truncated for c in r.chunks]
