"""Paging of ListDocuments: the request's limits and the opaque page token.

A page is the tenant's documents after a doc_id, in doc_id order, at most `page_size` of
them. The token carries the last doc_id of the page before; it is a position, not a
grant: whatever it says, the listing stays inside the request's tenant (and its doc_ids).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from services.common import errors

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
MAX_LISTED_IDS = 1000
"""At most this many doc_ids in one ListDocuments request."""
_TOKEN_PREFIX = "v1."


@dataclass(frozen=True)
class ListPage:
    """One validated page request."""

    after: str
    """List the documents whose doc_id sorts after this one ("" = from the first)."""
    size: int
    doc_ids: tuple[str, ...] | None
    """Only these documents; None = all of the tenant's."""


def page_token(last_doc_id: str) -> str:
    """The token that asks for the documents after `last_doc_id`."""
    return _TOKEN_PREFIX + base64.urlsafe_b64encode(last_doc_id.encode()).decode().rstrip("=")


def _after(token: str) -> str:
    if not token:
        return ""
    bad = errors.InvalidArgumentError(
        "page_token is not a token this service gave out; start again without one",
        metadata={"field": "page_token"},
    )
    if not token.startswith(_TOKEN_PREFIX) or len(token) > 1024:
        raise bad
    body = token[len(_TOKEN_PREFIX) :]
    try:
        after = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
    except (binascii.Error, ValueError):
        raise bad from None
    if not after or page_token(after) != token:  # one spelling per position
        raise bad
    return after


def list_page(page_size: int, token: str, doc_ids: tuple[str, ...]) -> ListPage:
    """The page a ListDocuments request asks for; InvalidArgumentError / LimitExceededError
    for one the service must refuse."""
    if page_size < 0:
        raise errors.InvalidArgumentError(
            "page_size must not be negative", metadata={"field": "page_size"}
        )
    if page_size > MAX_PAGE_SIZE:
        raise errors.over_limit(
            f"page_size is {page_size}; the limit is {MAX_PAGE_SIZE}",
            MAX_PAGE_SIZE,
            field="page_size",
        )
    if len(doc_ids) > MAX_LISTED_IDS:
        raise errors.over_limit(
            f"doc_ids has {len(doc_ids)} values; the limit is {MAX_LISTED_IDS}",
            MAX_LISTED_IDS,
            field="doc_ids",
        )
    return ListPage(
        after=_after(token),
        size=page_size or DEFAULT_PAGE_SIZE,
        doc_ids=tuple(doc_ids) if doc_ids else None,
    )
