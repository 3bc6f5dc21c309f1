"""ListDocuments paging: the page token and the request's limits (services/retrieval/listing.py)."""

from __future__ import annotations

import pytest

from services.common import errors
from services.common.document_limits import MAX_DOC_ID_CHARS
from services.retrieval.listing import (
    DEFAULT_PAGE_SIZE,
    MAX_LISTED_IDS,
    MAX_PAGE_SIZE,
    list_page,
    page_token,
)


@pytest.mark.parametrize("doc_id", ["a", "guide-1.2_x", "é", "a\x00b", "x" * 128])
def test_a_token_is_read_back_as_its_position(doc_id: str) -> None:
    token = page_token(doc_id)
    assert token.isascii() and "=" not in token  # safe in a query string as it is
    assert list_page(0, token, ()).after == doc_id


def test_defaults_and_the_page_size_limit() -> None:
    assert list_page(0, "", ()) == list_page(DEFAULT_PAGE_SIZE, "", ())
    assert list_page(0, "", ()).after == "" and list_page(0, "", ()).doc_ids is None
    assert list_page(1, "", ()).size == 1
    assert list_page(MAX_PAGE_SIZE, "", ()).size == MAX_PAGE_SIZE  # at the limit
    with pytest.raises(errors.LimitExceededError) as past:
        list_page(MAX_PAGE_SIZE + 1, "", ())
    assert past.value.metadata == {"field": "page_size", "limit": str(MAX_PAGE_SIZE)}
    with pytest.raises(errors.InvalidArgumentError) as negative:
        list_page(-1, "", ())
    assert not isinstance(negative.value, errors.LimitExceededError)


def test_the_doc_ids_limit() -> None:
    at = tuple(f"d{i}" for i in range(MAX_LISTED_IDS))
    assert list_page(0, "", at).doc_ids == at
    with pytest.raises(errors.LimitExceededError) as past:
        list_page(0, "", (*at, "one-more"))
    assert past.value.metadata["field"] == "doc_ids"


@pytest.mark.parametrize("doc_id", ["", "-lead", "has space", "d" * (MAX_DOC_ID_CHARS + 1)])
def test_a_doc_id_no_document_could_have_is_refused(doc_id: str) -> None:
    longest = "д" * MAX_DOC_ID_CHARS
    assert list_page(0, "", ("guide", longest)).doc_ids == ("guide", longest)
    with pytest.raises(errors.InvalidArgumentError) as refused:
        list_page(0, "", ("guide", doc_id))
    assert refused.value.metadata == {"field": "doc_ids"}
    assert not isinstance(refused.value, errors.LimitExceededError)
    assert len(str(refused.value)) < 2 * MAX_DOC_ID_CHARS + 200


@pytest.mark.parametrize(
    "token",
    ["guide", "v1.", "v1.!!!", "v2." + page_token("a")[3:], page_token("a") + "=", "v1.gA",
     "v1." + "A" * 2000],
)  # fmt: skip
def test_a_token_this_service_did_not_give_is_refused(token: str) -> None:
    with pytest.raises(errors.InvalidArgumentError) as bad:
        list_page(0, token, ())
    assert bad.value.metadata == {"field": "page_token"}
