"""Exact terms of a query: abbreviations ("What is FTBFS?", «Что такое RC?») and a Russian
question's borrowed Latin words («… (hardening) …»). A dense embedding reads the first as
noise and the second as a small part of a sentence, BM25 matches either exactly, so the
engine adds the BM25 list of those words alone to the weighted fusion (query.exact_terms,
fusion.add_exact_matches, the engine's `exact` list)."""

from __future__ import annotations

import pytest

from services.retrieval.engine import EXACT_WEIGHT
from services.retrieval.fusion import add_exact_matches
from services.retrieval.query import exact_terms
from services.retrieval.search import SearchQuery
from tests.unit.small_corpus import StandInEmbedder, small_corpus

# -- acronyms -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "found"),
    [
        ("What is FTBFS?", ("FTBFS",)),
        ("Что такое RC?", ("RC",)),
        ("Кто такой DM в Debian?", ("DM", "Debian")),
        ("Is HTTP2 faster than HTTP2 over TLS?", ("HTTP2", "TLS")),
        # Two to eight characters, a capital letter first.
        ("What is a B tree?", ()),
        ("What does ABCDEFGH mean?", ("ABCDEFGH",)),
        ("What does ABCDEFGHI mean?", ()),
        ("What does 3GPP mean?", ()),
        # Parts of identifiers and hyphenated words are not abbreviations of their own.
        ("When is FAN_ALLOW sent?", ()),
        ("Is X-Forwarded-For kept?", ()),
        ("How does dh_make work?", ()),
        ("Debian Linux", ()),
        # A query written all in capitals says nothing about any one word.
        ("WHAT IS FTBFS", ()),
        ("", ()),
    ],
)
def test_acronyms_are_the_words_written_in_capitals(query, found):
    assert exact_terms(query) == found


@pytest.mark.parametrize(
    ("query", "found"),
    [
        # A Russian question's borrowed Latin words are matched as written too.
        ("Как включить все флаги усиления безопасности (hardening) при сборке пакета?",
         ("hardening",)),
        ("Как настроить LDAP в Kubernetes?", ("LDAP", "Kubernetes")),
        ("Что делает dh_make?", ("dh_make",)),
        ("Как передать DEB_BUILD_OPTIONS=nocheck?", ("DEB_BUILD_OPTIONS", "nocheck")),
        # Three letters or more, no stop words, whole words only.
        ("Что такое io в Linux?", ("Linux",)),
        ("Что значит the и and в man?", ("man",)),
        ("Что делает X-Forwarded-For?", ()),
        # A URL or an address is no words of the question.
        ("Как открыть https://docs.example.com/setup в браузере?", ()),
        ("Почему не открывается www.debian.org/doc?", ()),
        ("Кому писать на debian-mentors@lists.debian.org о пакете?", ()),
        # A text longer than a question (an answer S3 looks its pages up by) gives none.
        ("Плановые работы в Orion X проводятся по субботам с часу ночи до пяти утра, "
         "администраторы получают уведомление в Telegram за двое суток до начала работ "
         "и подтверждают его", ()),
        # Not in an English query: its words are the sentence itself.
        ("How does dh_make work?", ()),
        ("Debian Linux", ()),
    ],
)  # fmt: skip
def test_a_russian_querys_latin_words_are_exact_terms(query, found):
    assert exact_terms(query) == found


# -- add_exact_matches --------------------------------------------------------------------

FUSED = [(1, 1.0), (2, 0.4), (3, 0.2)]


def test_exact_matches_are_added_at_their_weight_and_the_scale_stays_zero_to_one():
    out = add_exact_matches(FUSED, [(3, 8.0), (4, 4.0)], 0.5)
    # 3: (0.2 + 0.5 * 8/8) / 1.5; 4 (only an exact match): 0.5 * 4/8 / 1.5; 1: 1.0 / 1.5.
    assert [k for k, _ in out] == [1, 3, 2, 4]
    scores = dict(out)
    assert scores[1] == pytest.approx(1.0 / 1.5)
    assert scores[3] == pytest.approx(0.7 / 1.5)
    assert scores[2] == pytest.approx(0.4 / 1.5)
    assert scores[4] == pytest.approx(0.25 / 1.5)
    assert all(0.0 <= s <= 1.0 for s in scores.values())
    # The last exact match keeps its share (max normalisation, not min-max's 0).
    assert scores[4] > 0


def test_a_strong_exact_match_overtakes_the_dense_favourite():
    out = add_exact_matches([(1, 0.7), (2, 0.3)], [(2, 5.0)], EXACT_WEIGHT)
    assert out[0][0] == 2


def test_no_exact_matches_leave_the_fusion_as_it_is():
    assert add_exact_matches(FUSED, [], 0.5) == FUSED


def test_a_key_repeated_in_the_exact_list_counts_once_with_its_best_score():
    out = dict(add_exact_matches([(1, 0.0)], [(1, 2.0), (1, 4.0)], 1.0))
    assert out[1] == pytest.approx(0.5)


@pytest.mark.parametrize("weight", [-0.1, float("nan"), float("inf")])
def test_a_weight_that_is_not_finite_and_non_negative_is_refused(weight):
    with pytest.raises(ValueError, match="weight"):
        add_exact_matches(FUSED, [(1, 1.0)], weight)


def test_weight_zero_keeps_the_order_and_scores():
    assert add_exact_matches(FUSED, [(3, 1.0)], 0.0) == FUSED


# -- the engine ---------------------------------------------------------------------------

GUIDE = """# Guide

## Queue

Events wait in the queue in order.

## Builds

A clean chroot verifies the build dependencies and avoids FTBFS (Fails To Build From Source) bugs.
"""


class QueueEmbedder(StandInEmbedder):
    """A stand-in embedding that knows "build" and nothing of FTBFS: a query naming only the
    abbreviation points where the text without the concept does (the queue section)."""

    name = "queue"

    def _row(self, text: str) -> list[float]:
        return [1.0 if "build" in text else 0.0, 0.3]


@pytest.fixture(scope="module")
def guide_engine(tmp_path_factory):
    with small_corpus(
        tmp_path_factory.mktemp("acronyms"), QueueEmbedder(), "guide.md", GUIDE
    ) as corpus:
        yield corpus.engine()


@pytest.mark.parametrize("mode", ["section_first", "chunk_priority", "hybrid_only"])
async def test_an_abbreviation_finds_the_passage_that_writes_it(guide_engine, mode):
    found = await guide_engine.search(SearchQuery(query="What is FTBFS?", tenant_id="t", mode=mode))
    assert "FTBFS" in found.hits[0].text
    assert all(0.0 <= h.score <= 1.0 for h in found.hits)
    # Written in lower case it is a word like any other: the dense favourite stays first.
    plain = await guide_engine.search(SearchQuery(query="what is ftbfs", tenant_id="t", mode=mode))
    assert "queue" in plain.hits[0].text


async def test_an_abbreviation_the_documents_never_write_changes_nothing(guide_engine):
    upper = await guide_engine.search(SearchQuery(query="Queue QWERTY", tenant_id="t"))
    lower = await guide_engine.search(SearchQuery(query="Queue qwerty", tenant_id="t"))
    assert [(h.chunk_id, h.score) for h in upper.hits] == [
        (h.chunk_id, h.score) for h in lower.hits
    ]


@pytest.mark.parametrize(
    ("params", "extra"),
    [({}, 2), ({"fusion": "rrf"}, 0), ({"ranking": "sparse"}, 0), ({"ranking": "dense"}, 0)],
)
async def test_the_abbreviation_list_is_asked_of_the_index_only_when_the_fusion_reads_it(
    guide_engine, monkeypatch, params, extra
):
    index = guide_engine._index.index
    sizes: list[int] = []
    original = index.search_ids_batch

    def counted(queries):
        sizes.append(len(queries))
        return original(queries)

    monkeypatch.setattr(index, "search_ids_batch", counted)
    for query in ("What is FTBFS?", "what is ftbfs"):
        await guide_engine.search(SearchQuery(query=query, tenant_id="t", **params))
    # section_first: one list per level (sections, chunks) more for the abbreviation.
    assert sizes[0] - sizes[1] == extra
