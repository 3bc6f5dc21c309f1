"""A document's fields follow one rule whichever way they come in, an IngestDocument request or
a knowledge-base CSV's row (services/docstore/fields.py): tags each stripped of surrounding
white space, empty ones dropped, repeats dropped in first order (normalized_tags); the title,
product and version one line (one_line); the limits hold the fields so normalised, and a
search filter is held to the same rules."""

from __future__ import annotations

import pytest

from services.common import errors
from services.common.document_limits import MAX_TAG_CHARS
from services.common.search_contract import KB_TENANT, Filters
from services.docstore.fields import (
    MAX_TAGS,
    MAX_TITLE_CHARS,
    filter_text,
    normalized_tags,
    one_line,
)
from services.docstore.kb_csv import read_knowledge_base_csv
from services.retrieval.embeddings import EmbeddingSettings
from services.retrieval.factories import build_embedder
from services.retrieval.ingestion import IngestInput
from services.retrieval.search import SearchQuery
from tests.unit.test_search import make_stack

GUIDE = b"# Budget\n\n## Quarterly report\n\nThe quarterly budget report lists every expense.\n"
KB_HEADER = "id,title,content,topic,jurisdiction,updated_at,tags\n"


@pytest.fixture(scope="module")
def embedder():
    return build_embedder(EmbeddingSettings(profile="fast"))


def test_the_rule():
    assert normalized_tags([" finance ", "", "finance", "\tQ1\n", "  ", "q1", "Q1"]) == (
        "finance",
        "Q1",
        "q1",  # tags are compared as written: case is kept
    )
    assert normalized_tags(()) == () and normalized_tags(["\u00a0"]) == ()


async def test_a_request_stores_its_tags_normalised_and_a_filter_finds_them(tmp_path, embedder):
    s = make_stack(tmp_path, embedder)
    tags = (" finance ", "", "finance")
    out = await s.ingestor.ingest(IngestInput("a", GUIDE, file_name="budget.md", tags=tags))
    audit = IngestInput("a", GUIDE, file_name="audit.md", tags=("\taudit ", ""))
    await s.ingestor.ingest(audit)
    query = SearchQuery("quarterly budget report", "a", ranking="sparse")
    assert {h.doc_id for h in (await s.engine.search(query)).hits} == {"audit", "budget"}
    # A filter's tag is held to the same rule: the value the document was sent with finds it;
    # a blank one matches nothing (no document keeps one), never widening the filter.
    for tags, found in (
        (("finance",), {"budget"}),
        ((" finance ",), {"budget"}),
        (("audit",), {"audit"}),
        (("\taudit ",), {"audit"}),
        ((" ",), set()),
    ):
        filtered = SearchQuery(**{**vars(query), "filters": Filters(tags=tags)})
        assert {h.doc_id for h in (await s.engine.search(filtered)).hits} == found, tags
    stored = s.store.get_document("a", out.doc_id)
    assert stored is not None and tuple(stored.tags) == ("finance",)
    # The same request with its tags written apart is the same document: unchanged.
    again = IngestInput("a", GUIDE, file_name="budget.md", tags=("finance", " finance"))
    assert (await s.ingestor.ingest(again)).unchanged
    s.index.close()


async def test_the_tag_limits_hold_the_normalised_tags(tmp_path, embedder):
    s = make_stack(tmp_path, embedder)
    # More entries than MAX_TAGS, but as many tags once blanks and repeats are gone.
    wide = " " + "t" * MAX_TAG_CHARS + " "  # at the limit once stripped
    tags = (*(f"t{i}" for i in range(MAX_TAGS - 1)), "", " t0 ", "t1", wide)
    assert len(tags) > MAX_TAGS
    out = await s.ingestor.ingest(IngestInput("a", GUIDE, file_name="a.md", tags=tags))
    stored = s.store.get_document("a", out.doc_id)
    assert stored is not None and len(stored.tags) == MAX_TAGS
    for tags, limit in (
        ([f"t{i}" for i in range(MAX_TAGS + 1)], MAX_TAGS),
        (["t" * (MAX_TAG_CHARS + 1)], MAX_TAG_CHARS),
    ):
        with pytest.raises(errors.LimitExceededError) as info:
            await s.ingestor.ingest(IngestInput("a", GUIDE, file_name="b.md", tags=tuple(tags)))
        assert info.value.metadata == {"field": "tags", "limit": str(limit)}
    s.index.close()


async def test_blank_tags_are_no_tags_on_a_knowledge_base_csv(tmp_path, embedder):
    # A CSV's articles take their tags from its rows: a request's tags are refused, and blank
    # ones are none (as a blank title is).
    s = make_stack(tmp_path, embedder)
    content = (KB_HEADER + "v,VAT,VAT rates.,tax,RU,2026-01-10,\n").encode()
    out = await s.ingestor.ingest(
        IngestInput(KB_TENANT, content, file_name="train_data.csv", tags=(" ", ""))
    )
    assert out.doc_ids == ("kb-v",)
    s.index.close()


def test_a_knowledge_base_row_and_a_request_follow_the_same_rule():
    cells = " finance ;;finance; Q1 ,topic:tax"
    parsed = read_knowledge_base_csv(
        (KB_HEADER + f'v,VAT,VAT rates.,tax,RU,2026-01-10,"{cells}"\n').encode(), KB_TENANT
    )
    (doc,) = parsed.strict()
    # The row's own tags, then its topic and jurisdiction (a repeat of one is dropped).
    assert doc.tags == ("finance", "Q1", "topic:tax", "jurisdiction:ru")
    assert doc.tags == normalized_tags([*cells.replace(";", ",").split(","), "topic:tax",
                                        "jurisdiction:ru"])  # fmt: skip


def test_a_title_product_or_version_is_one_line():
    assert one_line("  Orion\u00a0 X\n 2 ") == "Orion X 2" and one_line(" \t") == ""
    assert filter_text(" Orion  X ") == "Orion X" and filter_text("  ") == "  "


async def test_product_and_version_are_stored_one_line_and_a_filter_finds_them(tmp_path, embedder):
    s = make_stack(tmp_path, embedder)
    sent = IngestInput(
        "a", GUIDE, file_name="budget.md", title=" Budget\n guide ", product=" Orion  X ",
        version="\t1.0 ",
    )  # fmt: skip
    out = await s.ingestor.ingest(sent)
    stored = s.store.get_document("a", out.doc_id)
    assert stored is not None
    assert (stored.title, stored.product, stored.version) == ("Budget guide", "Orion X", "1.0")
    query = SearchQuery("quarterly budget report", "a", ranking="sparse")
    for product, version, found in (
        ("Orion X", "", True),
        (" Orion  X ", "1.0", True),
        ("", " 1.0", True),
        ("Orion", "", False),
        ("  ", "", False),  # blank: matches nothing, never widening the filter
    ):
        filters = Filters(product=product, version=version)
        hits = (await s.engine.search(SearchQuery(**{**vars(query), "filters": filters}))).hits
        assert bool(hits) == found, (product, version)
    # The same request with its fields written apart is the same document: unchanged.
    again = IngestInput(
        "a", GUIDE, file_name="budget.md", title="Budget guide", product="Orion X", version="1.0"
    )
    assert (await s.ingestor.ingest(again)).unchanged
    s.index.close()


async def test_the_title_limit_holds_the_title_as_stored(tmp_path, embedder):
    s = make_stack(tmp_path, embedder)
    at_limit = "T" * (MAX_TITLE_CHARS - 2) + "      x"  # 1,022 + 5 spaces: 1,024 stored
    out = await s.ingestor.ingest(IngestInput("a", GUIDE, file_name="a.md", title=at_limit))
    stored = s.store.get_document("a", out.doc_id)
    assert stored is not None and len(stored.title) == MAX_TITLE_CHARS
    past = "T" * (MAX_TITLE_CHARS - 1) + "  x"
    with pytest.raises(errors.LimitExceededError) as info:
        await s.ingestor.ingest(IngestInput("a", GUIDE, file_name="b.md", title=past))
    assert info.value.metadata["field"] == "title"
    s.index.close()


@pytest.mark.parametrize("key", ["file_name", "format", "kb_file"])
async def test_the_services_own_metadata_keys_are_refused(tmp_path, embedder, key):
    """kb_file names the CSV an article came from, which its re-ingest prunes by: a caller's
    document claiming one would be deleted by that CSV's next ingest."""
    s = make_stack(tmp_path, embedder)
    item = IngestInput(KB_TENANT, GUIDE, file_name="note.md", metadata={key: "train_data.csv"})
    with pytest.raises(errors.InvalidArgumentError) as info:
        await s.ingestor.ingest(item)
    assert info.value.metadata == {"field": "metadata"} and "reserved" in str(info.value)
    s.index.close()
