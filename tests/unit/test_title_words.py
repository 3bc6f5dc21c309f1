"""Words that name one of the tenant's documents by its title leave the keyword query
(query.TitleIndex; the titles from SectionCatalog.title_index)."""

from __future__ import annotations

import pytest

from services.docstore.model import Document
from services.retrieval.query import TITLE_KEEP, TITLE_RUN, TitleIndex
from services.retrieval.search import SearchQuery
from services.retrieval.sections import MAX_TITLED_DOCUMENTS, TITLES_TTL_S, SectionCatalog
from tests.unit.small_corpus import StandInEmbedder, small_corpus


def without_titles(text: str, titles: tuple[str, ...]) -> str:
    return TitleIndex(titles).without_titles(text)


TITLES = ("Debian New Maintainers’ Guide", "Руководство начинающего разработчика Debian")


@pytest.mark.parametrize(
    ("query", "keyword"),
    [
        ("Which Latin saying about practice does the maintainers' guide quote?",
         "Which Latin saying about practice does the quote?"),
        ("Which mailing list does the Debian New Maintainers’ Guide recommend for novices?",
         "Which mailing list does the recommend for novices?"),
        # Short and stop words between the title's words do not break the run.
        ("Какую поговорку приводит руководство для начинающих о примерах и правилах?",
         "Какую поговорку приводит для о примерах и правилах?"),
        # Inflected forms match (crude stems): начинающего / начинающих.
        ("Какую латинскую поговорку о правилах приводит руководство начинающего разработчика?",
         "Какую латинскую поговорку о правилах приводит ?"),
    ],
)  # fmt: skip
def test_a_title_named_in_the_query_leaves_the_keyword_query(query, keyword):
    assert without_titles(query, TITLES) == keyword


@pytest.mark.parametrize(
    "query",
    [
        # One title word is not a name: "guide" and "Debian" stand apart.
        "Which tool does the guide use to upload a package to the Debian archive?",
        # The query is about the document itself: fewer than TITLE_KEEP words would remain.
        "What is the Debian New Maintainers Guide?",
        "Debian New Maintainers Guide contents",
        # Stop words are not content: "Как стать" keeps nothing to search for.
        "Как стать разработчиком Debian?",
        "Что такое fanotify?",
    ],
)
def test_a_query_that_names_no_title_or_only_a_title_is_kept(query):
    assert without_titles(query, TITLES) == query


def test_the_run_and_the_rest_are_counted_at_their_limits():
    assert (TITLE_RUN, TITLE_KEEP) == (2, 2)
    title = ("Operator Handbook",)
    # A run of TITLE_RUN words and TITLE_KEEP words left: the title goes.
    assert without_titles("operator handbook proverb quoted", title) == "proverb quoted"
    # One word fewer left: the query is about the handbook, kept whole.
    assert without_titles("operator handbook proverb", title) == "operator handbook proverb"
    # A run of one word is not a name.
    assert without_titles("operator proverb quoted here", title) == "operator proverb quoted here"
    # The title's words apart (another content word between them) are no run.
    q = "operator proverb handbook quoted"
    assert without_titles(q, title) == q


@pytest.mark.parametrize(
    "title",
    [
        "Server Con\ufb01guration Handbook",
        "Server Con\u00adfiguration Handbook",
        "Ｓｅｒｖｅｒ Configuration Handbook",
    ],
)
def test_a_title_is_read_in_the_queries_normal_form(title):
    # The query reaches the index normalised (NFKC, format characters out); so does the title.
    assert without_titles("server configuration proverb quoted", (title,)) == "proverb quoted"


def test_a_title_of_one_content_word_names_nothing():
    assert without_titles("fanotify(7) queue limit events", ("fanotify(7)",)) == (
        "fanotify(7) queue limit events"
    )


# --- the tenant's titles


class Listing:
    def __init__(self, titles: list[str]) -> None:
        self.docs = [Document("t", f"d{i}", title) for i, title in enumerate(titles)]
        self.calls = 0

    def get_document(self, tenant_id, doc_id, *, with_chunks=True):
        return None

    def list_documents(self, tenant_id, *, limit=None):
        self.calls += 1
        return self.docs[:limit]


Q = "Which proverb does the operator handbook quote?"
STRIPPED = "Which proverb does the quote?"


def test_titles_are_read_once_per_ttl_and_again_after_a_forget():
    now = [0.0]
    source = Listing(["Plant Runbook", ""])
    catalog = SectionCatalog(source, clock=lambda: now[0])
    assert catalog.title_index("t").without_titles(Q) == Q
    source.docs.append(Document("t", "new", "Operator Handbook"))
    now[0] = TITLES_TTL_S - 0.1
    assert catalog.title_index("t").without_titles(Q) == Q and source.calls == 1
    now[0] = TITLES_TTL_S
    assert catalog.title_index("t").without_titles(Q) == STRIPPED and source.calls == 2
    source.docs.pop()
    catalog.forget("t", "new")  # this process deleted it: seen at once
    assert catalog.title_index("t").without_titles(Q) == Q and source.calls == 3


def test_a_tenant_past_the_document_limit_gets_no_titles():
    titles = [f"Operator Handbook {i}" for i in range(MAX_TITLED_DOCUMENTS + 1)]
    at_limit = SectionCatalog(Listing(titles[:MAX_TITLED_DOCUMENTS]))
    assert at_limit.title_index("t").without_titles(Q) == STRIPPED
    past = SectionCatalog(Listing(titles))
    assert not past.title_index("t") and past.title_index("t").without_titles(Q) == Q


# --- the engine


HANDBOOK = """# Operator Handbook

## Front matter

Operator Handbook, revision 3. The Operator Handbook for operators of the plant. Operator
Handbook contents follow.

## Sayings

An old proverb says that practice makes perfect.
"""


class FlatEmbedder(StandInEmbedder):
    name = "flat"

    def _row(self, text: str) -> list[float]:
        return [1.0, 0.0]


@pytest.fixture(scope="module")
def handbook(tmp_path_factory):
    with small_corpus(
        tmp_path_factory.mktemp("titles"), FlatEmbedder(), "handbook.md", HANDBOOK
    ) as corpus:
        yield corpus


async def test_the_keyword_search_finds_the_passage_not_the_pages_that_repeat_the_title(
    handbook, monkeypatch
):
    engine = handbook.engine()
    found = await engine.search(SearchQuery(query=Q, tenant_id="t", ranking="sparse"))
    assert "proverb" in found.hits[0].text
    # With no titles known the title's repetitions win: the test's premise.
    monkeypatch.setattr(handbook.sections, "title_index", lambda tenant_id: TitleIndex(()))
    plain = await engine.search(SearchQuery(query=Q, tenant_id="t", ranking="sparse"))
    assert "Handbook" in plain.hits[0].text and "proverb" not in plain.hits[0].text


async def test_a_title_word_is_no_exact_term(handbook, monkeypatch):
    """A Russian question's Latin word that names one of the documents says which document,
    not what in it: it is no exact term (query.exact_terms) of the weighted fusion."""
    assert TitleIndex(("Operator Handbook",)).names("handbook")
    assert not TitleIndex(("Operator Handbook",)).names("proverb")
    engine = handbook.engine()
    index = engine._index.index
    sent: list[str] = []
    real = index.search_ids_batch

    def recorded(queries):
        sent.extend(q.text or "" for q in queries)
        return real(queries)

    monkeypatch.setattr(index, "search_ids_batch", recorded)
    query = "Какую поговорку о practice цитирует Operator Handbook?"
    await engine.search(SearchQuery(query=query, tenant_id="t"))
    assert "practice" in sent  # the exact list: the question's own Latin word alone
    assert not any("Handbook" in t and "поговорку" not in t for t in sent)
