"""One home for a document's field bounds (services/docstore/fields.py): an IngestDocument
request and a knowledge-base CSV's rows are held to the same limits, and the metadata the
service adds (file_name, format) cannot be claimed or overrun by a caller."""

from __future__ import annotations

import pytest

from services.common import errors
from services.common.document_limits import MAX_PRODUCT_CHARS, MAX_TAG_CHARS
from services.common.search_contract import KB_TENANT
from services.docstore.fields import (
    MAX_METADATA,
    MAX_METADATA_VALUE,
    MAX_TAGS,
    MAX_TITLE_CHARS,
    check_fields,
)
from services.docstore.kb_csv import read_knowledge_base_csv
from services.retrieval.embeddings import EmbeddingSettings
from services.retrieval.factories import build_embedder
from services.retrieval.ingestion import IngestInput
from tests.unit.test_search import make_stack

HEADER = "id,title,content,topic,jurisdiction,updated_at,tags,product,version,url\n"
GOOD = "ok,Good article,Text about tax.,tax,RU,2026-01-10,a;b,Bank,1.0,https://e.x/1\n"


@pytest.fixture(scope="module")
def embedder():
    return build_embedder(EmbeddingSettings(profile="fast"))


def row(
    doc_id: str = "r1",
    title: str = "Title",
    *,
    tags: str = "",
    product: str = "",
    version: str = "",
    topic: str = "tax",
    url: str = "",
) -> str:
    return f"{doc_id},{title},Some text.,{topic},RU,2026-01-10,{tags},{product},{version},{url}\n"


def parse(*rows: str):
    return read_knowledge_base_csv((HEADER + GOOD + "".join(rows)).encode(), KB_TENANT)


@pytest.mark.parametrize(
    ("bad_row", "named"),
    [
        (row(title="T" * (MAX_TITLE_CHARS + 1)), "title"),
        (row(product="P" * (MAX_PRODUCT_CHARS + 1)), "product"),
        (row(version="V" * (MAX_PRODUCT_CHARS + 1)), "version"),
        (row(tags="t" * (MAX_TAG_CHARS + 1)), "tag"),
        (row(tags=";".join(f"t{i}" for i in range(MAX_TAGS - 1))), "tags"),
        (row(topic="x" * MAX_TAG_CHARS), "tag 'topic:"),
        (row(url="u" * (MAX_METADATA_VALUE + 1)), "metadata 'url'"),
    ],
)
def test_a_knowledge_base_row_past_a_field_limit_is_a_bad_row_named_by_its_line(bad_row, named):
    parsed = parse(bad_row)
    assert [d.doc_id for d in parsed.documents] == ["kb-ok"]  # the good row stays
    assert len(parsed.problems) == 1
    problem = parsed.problems[0]
    assert problem.line == 3
    assert named in problem.message
    with pytest.raises(ValueError, match="line 3: "):
        parsed.strict()


def test_the_reviewers_row_is_refused():
    tags = ";".join("t" * 205 + str(i) for i in range(42))
    parsed = parse(row(title="T" * 3000, tags=tags, product="P" * 999))
    assert len(parsed.problems) == 1 and parsed.documents[0].doc_id == "kb-ok"


def test_the_topic_and_jurisdiction_tags_count_against_the_tag_limit():
    at = parse(row(tags=";".join(f"t{i}" for i in range(MAX_TAGS - 2))))
    assert not at.problems
    assert len(at.documents[1].tags) == MAX_TAGS
    past = parse(row(tags=";".join(f"t{i}" for i in range(MAX_TAGS - 1))))
    assert "topic and jurisdiction" in past.problems[0].message


def test_a_knowledge_base_row_at_every_limit_is_an_article():
    parsed = parse(
        row(
            title="T" * MAX_TITLE_CHARS,
            tags="t" * MAX_TAG_CHARS,
            product="P" * MAX_PRODUCT_CHARS,
            version="V" * MAX_PRODUCT_CHARS,
            url="u" * MAX_METADATA_VALUE,
        )
    )
    assert not parsed.problems
    doc = parsed.documents[1]
    assert len(doc.title) == MAX_TITLE_CHARS and doc.product == "P" * MAX_PRODUCT_CHARS


async def test_an_ingest_of_a_csv_with_a_row_past_a_limit_names_the_row(tmp_path, embedder):
    s = make_stack(tmp_path, embedder)
    content = (HEADER + GOOD + row(product="P" * 999)).encode()
    with pytest.raises(errors.InvalidArgumentError) as info:
        await s.ingestor.ingest(IngestInput(KB_TENANT, content, file_name="train_data.csv"))
    assert info.value.reason == "PARSE_ERROR"
    assert "line 3: product is 999 characters" in info.value.message
    assert await s.ingestor.list(KB_TENANT) == ([], "")  # nothing of the file written
    s.index.close()


@pytest.mark.parametrize("key", ["file_name", "format"])
async def test_a_request_may_not_set_the_services_metadata(tmp_path, embedder, key):
    s = make_stack(tmp_path, embedder)
    item = IngestInput("a", b"# T\n\nText.", file_name="guide.md", metadata={key: "x.pdf"})
    with pytest.raises(errors.InvalidArgumentError) as info:
        await s.ingestor.ingest(item)
    assert info.value.reason == "INVALID_ARGUMENT"
    assert info.value.metadata["field"] == "metadata" and key in info.value.message
    s.index.close()


async def test_a_request_file_name_is_bounded_as_the_metadata_value_it_becomes(tmp_path, embedder):
    s = make_stack(tmp_path, embedder)
    long_name = "n" * MAX_METADATA_VALUE + ".md"
    item = IngestInput("a", b"# T\n\nText.", doc_id="d1", file_name=long_name)
    with pytest.raises(errors.LimitExceededError) as info:
        await s.ingestor.ingest(item)
    assert info.value.metadata == {"field": "file_name", "limit": str(MAX_METADATA_VALUE)}
    s.index.close()


async def test_a_request_at_the_limits_stores_its_metadata_and_the_services(tmp_path, embedder):
    s = make_stack(tmp_path, embedder)
    own = {f"k{i}": "v" * MAX_METADATA_VALUE for i in range(MAX_METADATA)}
    name = "n" * (MAX_METADATA_VALUE - 3) + ".md"
    item = IngestInput("a", b"# T\n\nText.", doc_id="d1", file_name=name, metadata=own)
    await s.ingestor.ingest(item)
    stored = s.store.get_document("a", "d1")
    assert stored is not None
    assert dict(stored.metadata) == {**own, "file_name": name, "format": "markdown"}
    s.index.close()


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"tags": ["t"] * (MAX_TAGS + 1)}, "tags"),
        ({"tags": ["t" * (MAX_TAG_CHARS + 1)]}, "tags"),
        ({"title": "t" * (MAX_TITLE_CHARS + 1)}, "title"),
        ({"product": "p" * (MAX_PRODUCT_CHARS + 1)}, "product"),
        ({"version": "v" * (MAX_PRODUCT_CHARS + 1)}, "version"),
        ({"metadata": {f"k{i}": "v" for i in range(MAX_METADATA + 1)}}, "metadata"),
        ({"metadata": {"k" * 129: "v"}}, "metadata"),
        ({"metadata": {"k": "v" * (MAX_METADATA_VALUE + 1)}}, "metadata"),
        ({"file_name": "f" * (MAX_METADATA_VALUE + 1)}, "file_name"),
    ],
)
def test_check_fields_names_the_field_past_its_limit(fields, field):
    with pytest.raises(errors.LimitExceededError) as info:
        check_fields(**fields)
    assert info.value.reason == "LIMIT_EXCEEDED"
    assert info.value.metadata["field"] == field


def test_the_refusal_of_a_metadata_map_does_not_depend_on_its_order():
    # A protobuf map's order on the wire is not the caller's: decoding the same request
    # again may list its entries in another order, and it must be refused the same way.
    long_keys = {"я" * 642: "", "я" * 152: ""}
    long_values = {"b": "v" * (MAX_METADATA_VALUE + 1), "a": "w" * (MAX_METADATA_VALUE + 2)}
    for metadata in (long_keys, long_values):
        messages = set()
        for entries in (list(metadata.items()), list(reversed(metadata.items()))):
            with pytest.raises(errors.LimitExceededError) as info:
                check_fields(metadata=dict(entries))
            messages.add(info.value.message)
        assert len(messages) == 1, messages
