"""A knowledge-base article longer than csv's default field limit (131,072 characters) is read
like any other: it was refused as malformed CSV and every row after it left unread."""

from __future__ import annotations

import csv

import pytest

from services.docstore import kb_csv
from services.docstore.errors import ChunkLimitError
from services.docstore.kb_csv import MAX_FIELD_CHARS, read_knowledge_base_csv
from services.retrieval.config import MAX_DOCUMENT_BYTES

HEAD = "id,title,content,topic,jurisdiction,updated_at\n"


def row(i: int, chars: int) -> str:
    body = ("Статья о порядке налогообложения. " * (chars // 34 + 1))[:chars]
    return f'a{i},Article {i},"{body}",tax,RU,2024-01-01\n'


@pytest.fixture
def default_field_limit():
    """csv's own default for the test, and the process's limit put back after it."""
    before = csv.field_size_limit()
    csv.field_size_limit(131_072)
    yield
    csv.field_size_limit(before)


@pytest.mark.usefixtures("default_field_limit")
def test_an_article_past_csvs_default_field_limit_is_read_with_the_rows_after_it():
    text = HEAD + row(1, 1_000) + row(2, 300_000) + row(3, 1_000) + "a4,Bad,x,tax,RU,never\n"
    parsed = read_knowledge_base_csv(text.encode(), "kb")
    assert [d.doc_id for d in parsed.documents] == ["kb-a1", "kb-a2", "kb-a3"]
    assert [p.line for p in parsed.problems] == [5]  # the rows after the article are checked
    long = parsed.documents[1]
    assert sum(len(c.text) for c in long.chunks) >= 300_000 - 100


def test_the_field_limit_is_raised_never_lowered():
    before = csv.field_size_limit()
    try:
        csv.field_size_limit(MAX_FIELD_CHARS - 1)
        read_knowledge_base_csv((HEAD + row(1, 100)).encode(), "kb").strict()
        assert csv.field_size_limit() == MAX_FIELD_CHARS
        csv.field_size_limit(MAX_FIELD_CHARS + 1)
        read_knowledge_base_csv((HEAD + row(1, 100)).encode(), "kb").strict()
        assert csv.field_size_limit() == MAX_FIELD_CHARS + 1
    finally:
        csv.field_size_limit(before)


def test_no_file_retrieval_accepts_holds_a_field_past_the_limit():
    assert MAX_FIELD_CHARS >= MAX_DOCUMENT_BYTES.maximum


def test_a_files_articles_are_held_to_one_documents_chunks(monkeypatch):
    # Each short row is one chunk: at the bound the file is read, one row past it refused
    # at that row, before the rest is parsed (600,000 tiny rows took 1.5 GB unbounded).
    monkeypatch.setattr(kb_csv, "MAX_CHUNKS", 3)
    at = read_knowledge_base_csv((HEAD + "".join(row(i, 40) for i in range(3))).encode(), "kb")
    assert [len(d.chunks) for d in at.strict()] == [1, 1, 1]
    with pytest.raises(ChunkLimitError) as info:
        read_knowledge_base_csv((HEAD + "".join(row(i, 40) for i in range(4))).encode(), "kb")
    assert (info.value.limit, info.value.limit_name) == (3, "max_chunks")
    assert "line 5 crosses it" in str(info.value)


def test_bad_and_repeated_rows_count_no_chunks(monkeypatch):
    monkeypatch.setattr(kb_csv, "MAX_CHUNKS", 2)
    text = HEAD + row(1, 40) + row(1, 40) + "a9,Bad,x,tax,RU,never\n" + row(2, 40)
    parsed = read_knowledge_base_csv(text.encode(), "kb")
    assert [d.doc_id for d in parsed.documents] == ["kb-a1", "kb-a2"]
    assert [p.line for p in parsed.problems] == [3, 4]


def test_a_row_whose_content_is_markdown_marks_alone_is_a_bad_row_named_by_its_line():
    parsed = read_knowledge_base_csv(
        (HEAD + row(1, 40) + "a2,Marks,---,tax,RU,2024-01-01\n").encode(), "kb"
    )
    assert [d.doc_id for d in parsed.documents] == ["kb-a1"]
    assert [str(p) for p in parsed.problems] == [
        "line 3: content has no text (Markdown marks alone)"
    ]
