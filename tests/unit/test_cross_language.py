"""Cross-language retrieval over mixed-language documents: a Russian question finds the
untranslated English passage of a Russian document (and back), because a candidate in the other
language than the query gets its keyword (BM25) evidence from its dense score
(fusion.impute_cross_language, passage_language, the engine's RETR_CROSS_LANGUAGE)."""

from __future__ import annotations

import pytest

from services.common.settings import Env, SettingsError
from services.docstore.sqlite_store import SqliteDocumentStore
from services.retrieval import engine as engine_module
from services.retrieval.config import RetrievalSettings
from services.retrieval.engine import EngineSettings, RetrievalEngine
from services.retrieval.fusion import impute_cross_language, weighted_fusion
from services.retrieval.query import passage_language
from services.retrieval.search import SearchQuery
from tests.unit.small_corpus import SmallCorpus, StandInEmbedder, small_corpus

# -- passage_language ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("Очередь событий читается приложением.", "ru"),
        ("Before Linux 5.13, the limit was 16384.", "en"),
        ("Флаг FAN_UNLIMITED_QUEUE снимает предел", "mixed"),
        ("16384 — 2.6.36 %%", "other"),
        ("", "other"),
        # Cyrillic share at the Russian threshold (60 %) and just under it.
        ("абвгдеabcd", "ru"),
        ("абвгдabcde", "mixed"),
        # Cyrillic share at the English threshold (10 %) and just over it.
        ("аbcdefghij", "en"),
        ("абcdefghij", "mixed"),
    ],
)
def test_passage_language_by_cyrillic_share(text, language):
    assert passage_language(text) == language


# -- impute_cross_language ----------------------------------------------------------------

DENSE = [(1, 0.9), (2, 0.8), (3, 0.5)]
SPARSE = [(2, 10.0), (3, 6.0), (4, 2.0)]


def test_a_candidate_in_the_other_language_gets_its_dense_score_as_keyword_evidence():
    # Dense min-max: 1 -> 1.0, 2 -> 0.75, 3 -> 0.0. Keyword range 2..10: 1 -> 10 (its own: none);
    # 3 -> 2, below its own 6, which stays.
    out = impute_cross_language(DENSE, SPARSE, {1: "en", 2: "ru", 3: "en"}, "ru")
    assert out == [(2, 10.0), (1, 10.0), (3, 6.0), (4, 2.0)]
    fused = weighted_fusion({"dense": DENSE, "sparse": out}, {"dense": 0.7, "sparse": 0.3})
    assert fused[0] == (1, pytest.approx(1.0))  # 0.7 * 1.0 + 0.3 * max(0, 1.0)
    before = weighted_fusion({"dense": DENSE, "sparse": SPARSE}, {"dense": 0.7, "sparse": 0.3})
    assert before[0][0] == 2  # without it the keyword share decides for the Russian chunk


def test_english_queries_fill_in_for_russian_candidates():
    out = impute_cross_language(DENSE, SPARSE, {1: "ru", 2: "en", 3: "en"}, "en")
    assert dict(out)[1] == 10.0 and dict(out)[2] == 10.0 and dict(out)[3] == 6.0


@pytest.mark.parametrize(
    ("languages", "query_language"),
    [
        ({1: "ru", 2: "ru", 3: "ru"}, "ru"),  # same language: BM25 saw them fairly
        ({1: "mixed", 2: "other", 3: "mixed"}, "ru"),  # mixed text has words of both
        ({}, "ru"),  # unknown (section points, unlisted points)
        ({1: "en", 2: "en", 3: "en"}, "mixed"),  # the query is neither ru nor en
        ({1: "en", 2: "en", 3: "en"}, "de"),
    ],
)
def test_scores_are_unchanged_unless_query_and_candidate_languages_differ(
    languages, query_language
):
    assert impute_cross_language(DENSE, SPARSE, languages, query_language) == SPARSE


def test_empty_lists_stay_as_they_are():
    assert impute_cross_language(DENSE, [], {1: "en"}, "ru") == []
    assert impute_cross_language([], SPARSE, {1: "en"}, "ru") == SPARSE


def test_one_keyword_score_for_all_is_filled_in_below_it_in_proportion():
    out = impute_cross_language([(1, 0.9), (2, 0.5), (3, 0.1)], [(9, 4.0)], {2: "en"}, "ru")
    assert out == [(9, 4.0), (2, pytest.approx(2.0))]  # d = 0.5 of 0..4


def test_non_finite_keyword_scores_are_left_out_of_the_range():
    out = impute_cross_language(DENSE, [(2, 8.0), (5, float("nan")), (4, 2.0)], {1: "en"}, "ru")
    assert out[0] == (2, 8.0) and dict(out)[1] == 8.0


# -- the engine ---------------------------------------------------------------------------

RU_MAN_PAGE = """# fanotify

## Ограничения

Before Linux 5.13, the hardcoded limit on the number of queued events was 16384.

## Чтение

Очередь событий читается приложением, каждое событие очереди обрабатывается по порядку.

## Прочее

Справочная страница переведена добровольцами.
"""


class ConceptEmbedder(StandInEmbedder):
    """A stand-in for a multilingual model: a text's vector says which concepts it names, in
    either language ("limit", "queue"), so the dense side sees across languages by design."""

    name = "concepts"
    dim = 3
    _CONCEPTS = (("предел", "limit", "16384"), ("очеред", "queue"))

    def _row(self, text: str) -> list[float]:
        return [*(1.0 if any(w in text for w in words) else 0.0 for words in self._CONCEPTS), 0.3]


class CountingStore:
    """The document store, counting chunk-text reads."""

    def __init__(self, store: SqliteDocumentStore) -> None:
        self.store = store
        self.chunk_reads: list[int] = []
        self.point_reads: list[int] = []

    def points_by_ids(self, tenant_id, ids):
        self.point_reads.append(len(ids))
        return self.store.points_by_ids(tenant_id, ids)

    def chunks_by_ids(self, tenant_id, keys):
        self.chunk_reads.append(len(keys))
        return self.store.chunks_by_ids(tenant_id, keys)

    def replacements(self, tenant_id):
        return self.store.replacements(tenant_id)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    with small_corpus(
        tmp_path_factory.mktemp("xlang"), ConceptEmbedder(), "fanotify.md", RU_MAN_PAGE
    ) as corpus:
        yield corpus


def engine(corpus: SmallCorpus, *, cross_language: bool, store=None) -> RetrievalEngine:
    return corpus.engine(EngineSettings(cross_language=cross_language), chunks=store)


QUESTION = "Какой предел очереди событий?"


@pytest.mark.parametrize("mode", ["section_first", "chunk_priority", "hybrid_only"])
async def test_a_russian_question_finds_the_untranslated_english_passage_first(corpus, mode):
    ask = SearchQuery(query=QUESTION, tenant_id="t", mode=mode)
    found = await engine(corpus, cross_language=True).search(ask)
    assert found.language == "ru"
    assert "16384" in found.hits[0].text
    # Without it the Russian chunk that shares the question's words wins on their keyword score.
    before = await engine(corpus, cross_language=False).search(ask)
    assert "Очередь событий" in before.hits[0].text


async def test_rrf_fusion_fills_in_too(corpus):
    ask = SearchQuery(query=QUESTION, tenant_id="t", fusion="rrf", mode="chunk_priority")
    assert "16384" in (await engine(corpus, cross_language=True).search(ask)).hits[0].text
    before = await engine(corpus, cross_language=False).search(ask)
    assert "Очередь событий" in before.hits[0].text


@pytest.mark.parametrize("ranking", ["dense", "sparse"])
async def test_single_list_rankings_are_untouched(corpus, ranking):
    counting = CountingStore(corpus.store)
    ask = SearchQuery(query=QUESTION, tenant_id="t", ranking=ranking, max_results=1, max_chunks=1)
    on = await engine(corpus, cross_language=True, store=counting).search(ask)
    off = await engine(corpus, cross_language=False).search(ask)
    assert [(h.chunk_id, h.score) for h in on.hits] == [(h.chunk_id, h.score) for h in off.hits]
    assert counting.chunk_reads == [1]  # the hit's text only: no language read


async def test_chunk_languages_are_read_once_then_cached(corpus):
    counting = CountingStore(corpus.store)
    e = engine(corpus, cross_language=True, store=counting)
    ask = SearchQuery(query=QUESTION, tenant_id="t", max_results=1, max_chunks=1)
    await e.search(ask)
    first = list(counting.chunk_reads)
    # The languages of the chunk list's dense candidates (keep 1 x candidate factor 2), then
    # the hit's text; section points have no chunk text and are not read.
    assert first == [2, 1]
    point_reads = len(counting.point_reads)
    await e.search(ask)
    assert counting.chunk_reads[len(first) :] == [1]  # the hit's text only
    # The candidates' fields only: section points, which have no language, are cached too.
    assert len(counting.point_reads) == point_reads + 1


async def test_the_language_cache_is_bounded_at_its_limit(corpus, monkeypatch):
    ask = SearchQuery(query=QUESTION, tenant_id="t")
    e = engine(corpus, cross_language=True)
    await e.search(ask)
    seen = len(e._languages)  # chunk and section points of the search's dense lists
    assert seen > 2
    for limit, kept in ((seen, seen), (seen - 1, seen - 1)):  # at the limit, one past it
        monkeypatch.setattr(engine_module, "CHUNK_LANGUAGES_CACHED", limit)
        counting = CountingStore(corpus.store)
        e = engine(corpus, cross_language=True, store=counting)
        await e.search(ask)
        assert len(e._languages) == kept
        reads = len(counting.point_reads)
        await e.search(ask)
        # Everything cached: only the candidates' fields are read; one evicted: it is read again.
        assert len(counting.point_reads) - reads == (1 if kept == seen else 2)


async def test_another_tenant_reads_nothing_of_the_first(corpus):
    counting = CountingStore(corpus.store)
    r = await engine(corpus, cross_language=True, store=counting).search(
        SearchQuery(query=QUESTION, tenant_id="other")
    )
    assert r.hits == [] and counting.chunk_reads == []


# -- settings -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "value", "expected"),
    [
        (None, None, True),  # e5, the default profile
        ("e5", "false", False),
        ("remote", None, True),
        ("fast", None, False),  # USE: off unless asked for
        ("fast", "true", True),
    ],
)
def test_retr_cross_language_setting(profile, value, expected):
    env = {} if value is None else {"RETR_CROSS_LANGUAGE": value}
    if profile is not None:
        env["RETR_EMBEDDING_PROFILE"] = profile
    if profile == "remote":
        env["RETR_EMBEDDING_URL"] = "http://127.0.0.1:9/v1"
        env["RETR_EMBEDDING_MODEL"] = "e5"
    assert RetrievalSettings.from_env(Env(env)).engine.cross_language is expected


def test_retr_cross_language_must_be_a_boolean():
    with pytest.raises(SettingsError, match="RETR_CROSS_LANGUAGE"):
        RetrievalSettings.from_env(Env({"RETR_CROSS_LANGUAGE": "sometimes"}))
