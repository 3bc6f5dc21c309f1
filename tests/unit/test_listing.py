"""ListDocuments paging: the page token and the request's limits (services/retrieval/listing.py)."""

from __future__ import annotations

import pytest

from services.common import errors
from services.common.document_limits import MAX_DOC_ID_CHARS
from services.common.search_contract import MAX_TENANT_ID_CHARS
from services.retrieval.listing import (
    DEFAULT_PAGE_SIZE,
    MAX_LISTED_IDS,
    MAX_PAGE_SIZE,
    list_page,
    listing_key,
    page_token,
)

T = "t"
ALL = listing_key(T, ())
"""The listing of all of tenant T's documents."""
WIDE = "\U0001d538"
"""A character of four UTF-8 bytes: a doc_id of MAX_DOC_ID_CHARS of them has the longest token."""


@pytest.mark.parametrize(
    "doc_id", ["a", "guide-1.2_x", "é", "a\x00b", "x" * 128, WIDE * MAX_DOC_ID_CHARS]
)
def test_a_token_is_read_back_as_its_position(doc_id: str) -> None:
    token = page_token(doc_id, ALL)
    assert token.isascii() and "=" not in token  # safe in a query string as it is
    assert len(token) <= 1024  # the longest a token is read
    assert list_page(T, 0, token, ()).after == doc_id


def test_defaults_and_the_page_size_limit() -> None:
    assert list_page(T, 0, "", ()) == list_page(T, DEFAULT_PAGE_SIZE, "", ())
    assert list_page(T, 0, "", ()).after == "" and list_page(T, 0, "", ()).doc_ids is None
    assert list_page(T, 0, "", ()).listing == ALL
    assert list_page(T, 1, "", ()).size == 1
    assert list_page(T, MAX_PAGE_SIZE, "", ()).size == MAX_PAGE_SIZE  # at the limit
    with pytest.raises(errors.LimitExceededError) as past:
        list_page(T, MAX_PAGE_SIZE + 1, "", ())
    assert past.value.metadata == {"field": "page_size", "limit": str(MAX_PAGE_SIZE)}
    with pytest.raises(errors.InvalidArgumentError) as negative:
        list_page(T, -1, "", ())
    assert not isinstance(negative.value, errors.LimitExceededError)


def test_the_doc_ids_limit() -> None:
    at = tuple(f"d{i}" for i in range(MAX_LISTED_IDS))
    assert list_page(T, 0, "", at).doc_ids == at
    with pytest.raises(errors.LimitExceededError) as past:
        list_page(T, 0, "", (*at, "one-more"))
    assert past.value.metadata["field"] == "doc_ids"


@pytest.mark.parametrize("doc_id", ["", "-lead", "has space", "d" * (MAX_DOC_ID_CHARS + 1)])
def test_a_doc_id_no_document_could_have_is_refused(doc_id: str) -> None:
    longest = "д" * MAX_DOC_ID_CHARS
    assert list_page(T, 0, "", ("guide", longest)).doc_ids == ("guide", longest)
    with pytest.raises(errors.InvalidArgumentError) as refused:
        list_page(T, 0, "", ("guide", doc_id))
    assert refused.value.metadata == {"field": "doc_ids"}
    assert not isinstance(refused.value, errors.LimitExceededError)
    assert len(str(refused.value)) < 2 * MAX_DOC_ID_CHARS + 200


@pytest.mark.parametrize(
    "token",
    ["guide", "v2.", "v2.!!!", "v1." + page_token("a", ALL)[3:], page_token("a", ALL) + "=",
     f"v2.{ALL}.gA", f"v2.{ALL}." + "A" * 2000, f"v2.{ALL}.", f"v2.{ALL}YQ", f"v2.{ALL}.YQ.YQ",
     f"v2.{ALL.upper()}.YQ", f"v2.{ALL[:-1]}.YQ", f"v2.{ALL}0.YQ", f"v2.{ALL[:-1]}g.YQ",
     f"v2..{ALL}.YQ", "v2.YQ",
     "v1.YQ"],  # a token of the version before, bound to no listing
)  # fmt: skip
def test_a_token_this_service_did_not_give_is_refused(token: str) -> None:
    assert list_page(T, 0, f"v2.{ALL}.YQ", ()).after == "a"  # the one spelling of that
    with pytest.raises(errors.InvalidArgumentError) as bad:
        list_page(T, 0, token, ())
    assert bad.value.metadata == {"field": "page_token"}
    assert "not a token this service gave out" in str(bad.value)


# -- a token belongs to its listing: the tenant_id and the doc_ids filter ----------------------


def refused_as_another_listing(tenant_id: str, token: str, doc_ids: tuple[str, ...]) -> None:
    with pytest.raises(errors.InvalidArgumentError) as other:
        list_page(tenant_id, 0, token, doc_ids)
    assert other.value.metadata == {"field": "page_token"}
    assert not isinstance(other.value, errors.LimitExceededError)
    assert "belongs to another listing" in str(other.value)
    assert "start again without one" in str(other.value)


@pytest.mark.parametrize(
    ("tenant_a", "tenant_b"),
    [("a", "b"), ("t", "T"), ("a", "a:b"), ("t", "t" * MAX_TENANT_ID_CHARS),
     ("x" * MAX_TENANT_ID_CHARS, "x" * (MAX_TENANT_ID_CHARS - 1) + "y")],
)  # fmt: skip
def test_a_token_of_another_tenant_is_refused(tenant_a: str, tenant_b: str) -> None:
    for doc_ids in [(), ("guide",)]:
        token = page_token("guide", list_page(tenant_a, 0, "", doc_ids).listing)
        assert list_page(tenant_a, 0, token, doc_ids).after == "guide"  # its own listing
        refused_as_another_listing(tenant_b, token, doc_ids)


@pytest.mark.parametrize("tenant_id", ["", "t" * (MAX_TENANT_ID_CHARS + 1)])
def test_a_tenant_id_no_tenant_has_is_the_error_whatever_the_token(tenant_id: str) -> None:
    token = page_token("guide", list_page("a", 0, "", ()).listing)
    with pytest.raises(errors.InvalidArgumentError) as info:
        list_page(tenant_id, 0, token, ())
    assert info.value.metadata.get("field") == "tenant_id"


@pytest.mark.parametrize(
    ("asked", "other"),
    [
        ((), ("a",)),  # the whole tenant, then a filter
        (("a",), ()),  # a filter, then the whole tenant
        (("a", "b"), ("a",)),  # fewer
        (("a",), ("a", "b")),  # more
        (("a", "b"), ("a", "c")),  # others
        (("ab",), ("a", "b")),  # the same characters, other ids
        (("t",), ()),  # the tenant's own id as a doc_id
    ],
)
def test_a_token_of_another_doc_ids_filter_is_refused(
    asked: tuple[str, ...], other: tuple[str, ...]
) -> None:
    token = page_token("a", list_page(T, 0, "", asked).listing)
    assert list_page(T, 0, token, asked).after == "a"
    refused_as_another_listing(T, token, other)


def test_a_token_of_a_filter_at_the_limits_is_refused_past_them() -> None:
    at = tuple(f"{i:04d}" + "d" * (MAX_DOC_ID_CHARS - 4) for i in range(MAX_LISTED_IDS))
    page = list_page(T, MAX_PAGE_SIZE, "", at)
    token = page_token(at[-1], page.listing)
    assert len(token) == len(page_token(at[-1], ALL))  # as long whatever the filter
    assert list_page(T, MAX_PAGE_SIZE, token, at).after == at[-1]
    assert list_page(T, MAX_PAGE_SIZE, token, at[::-1]).after == at[-1]
    refused_as_another_listing(T, token, at[:-1])  # one id fewer
    refused_as_another_listing(T, token, (*at[:-1], at[-1][:-1] + "x"))  # one id other
    refused_as_another_listing(T, token, ())


@pytest.mark.parametrize(
    "same", [("b", "a"), ("a", "b", "a"), ("b", "b", "a", "a"), ("a", "b", "b")]
)
def test_the_same_doc_ids_in_another_order_or_repeated_continue(same: tuple[str, ...]) -> None:
    token = page_token("a", list_page(T, 0, "", ("a", "b")).listing)
    page = list_page(T, 0, token, same)
    assert page.after == "a" and page.doc_ids == same  # the store still gets them as asked
    assert page.listing == listing_key(T, ("a", "b"))


def test_listing_keys_do_not_run_into_each_other() -> None:
    """Length-prefixed parts: a tenant_id or doc_ids split or joined otherwise is another
    listing; the key is 16 lowercase hex digits."""
    keys = {
        listing_key("ab", ()), listing_key("a", ("b",)), listing_key("ab", ("c",)),
        listing_key("a", ("bc",)), listing_key("a", ("b", "c")), listing_key("a", ("bc", "")),
        listing_key("", ("a",)), listing_key("a", ()), listing_key("b", ("a",)),
    }  # fmt: skip
    assert len(keys) == 9
    assert all(len(k) == 16 and set(k) <= set("0123456789abcdef") for k in keys)
    assert listing_key("a", ("b", "c")) == listing_key("a", ["c", "b", "c"])
