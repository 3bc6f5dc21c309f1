"""A file ingestion has no parser for is refused saying what was received (the file name's
suffix, else the content type, else that neither was given), every suffix and content type
it takes, and the request field at fault (ErrorInfo metadata `field`)."""

from __future__ import annotations

import httpx
import pytest

from services.cli import main as cli
from services.common import errors
from services.common.search_contract import KB_TENANT
from services.docstore.fields import MAX_METADATA_VALUE
from services.docstore.parsing import CONTENT_TYPE_FORMATS, SUFFIX_FORMATS
from services.retrieval.embeddings import EmbeddingSettings
from services.retrieval.factories import build_embedder
from services.retrieval.ingestion import IngestInput
from tests.unit.test_search import make_stack

HTML = b"<html><body><p>Backups run daily.</p></body></html>"


@pytest.fixture(scope="module")
def embedder():
    return build_embedder(EmbeddingSettings(profile="fast"))


def assert_lists_what_is_taken(message: str) -> None:
    for suffix in SUFFIX_FORMATS:
        assert suffix in message
    for content_type in CONTENT_TYPE_FORMATS:
        assert content_type in message
    # A CSV is taken only as the knowledge base: the message says so.
    assert "csv only into the knowledge-base tenant" in message and repr(KB_TENANT) in message
    assert "'unknown'" not in message


async def refusal(tmp_path, embedder, item: IngestInput) -> errors.InvalidArgumentError:
    s = make_stack(tmp_path, embedder)
    try:
        with pytest.raises(errors.InvalidArgumentError) as info:
            await s.ingestor.ingest(item)
        assert await s.ingestor.list(item.tenant_id) == ([], "")  # nothing stored
    finally:
        s.index.close()
    assert info.value.reason == "UNSUPPORTED_FORMAT"
    assert_lists_what_is_taken(info.value.message)
    return info.value


@pytest.mark.parametrize(
    ("file_name", "content_type", "suffix"),
    [
        ("page.html", "", ".html"),
        ("docs/report.docx", "", ".docx"),
        ("Report.DOCX", "", ".DOCX"),  # as the caller wrote it
        # The suffix decides; a content type naming no format either is named beside it.
        ("page.html", "text/html", ".html"),
    ],
)
async def test_an_unknown_suffix_is_named_and_the_field_is_file_name(
    tmp_path, embedder, file_name, content_type, suffix
):
    item = IngestInput("a", HTML, file_name=file_name, content_type=content_type)
    exc = await refusal(tmp_path, embedder, item)
    assert exc.metadata == {"field": "file_name"}
    assert f"file_name's suffix {suffix!r} names no format" in exc.message
    if content_type:
        assert repr(content_type) in exc.message


@pytest.mark.parametrize(
    ("file_name", "doc_id"), [("README", ""), ("", "page"), ("notes.v2/README", "")]
)
async def test_no_suffix_and_an_unknown_content_type_names_the_type(
    tmp_path, embedder, file_name, doc_id
):
    item = IngestInput(
        "a", HTML, doc_id=doc_id, file_name=file_name, content_type="text/html; charset=utf-8"
    )
    exc = await refusal(tmp_path, embedder, item)
    assert exc.metadata == {"field": "content_type"}
    assert "'text/html; charset=utf-8'" in exc.message
    assert ("no suffix" if file_name else "no file_name") in exc.message


async def test_no_suffix_and_no_content_type_says_neither_was_given(tmp_path, embedder):
    exc = await refusal(tmp_path, embedder, IngestInput("a", b"Some text.", file_name="README"))
    assert exc.metadata == {"field": "file_name"}
    assert "'README' has no suffix" in exc.message and "no content_type" in exc.message


@pytest.mark.parametrize(
    "file_name",
    ["n" * (MAX_METADATA_VALUE - 5) + ".html", "a." + "h" * (MAX_METADATA_VALUE - 2),
     "n" * MAX_METADATA_VALUE],
)  # fmt: skip
async def test_the_cli_prints_the_whole_message_however_long_the_names(
    tmp_path, embedder, file_name
):
    # `visior ingest` prints the server's message, cut to http_error's limit: the names are
    # cut short in the message so that the list of what is taken always fits.
    item = IngestInput("a", HTML, file_name=file_name, content_type="x/" + "y" * 5000)
    exc = await refusal(tmp_path, embedder, item)
    body = {"code": 3, "message": exc.message, "details": [{"reason": exc.reason}]}
    kind, printed = cli.http_error(httpx.Response(400, json=body))
    assert kind == "HTTP 400 UNSUPPORTED_FORMAT" and printed == exc.message
    assert_lists_what_is_taken(printed)
