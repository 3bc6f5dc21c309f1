"""Paging of ListDocuments: the request's limits, the response's byte budget and the opaque
page token.

A page is the tenant's documents after a doc_id, in doc_id order, at most `page_size` of
them and no more than fit MAX_LIST_RESPONSE_BYTES. The token carries the last doc_id of the
page before and a digest of its listing (`listing_key`: the tenant_id and the doc_ids
filter); a token is taken only by the listing it came from, any other is INVALID_ARGUMENT.
It is a position, not a grant: whatever it says, the listing stays inside the request's
tenant (and its doc_ids).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import itertools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from services.common import errors
from services.common.document_limits import check_doc_ids
from services.common.search_contract import check_tenant_id

if TYPE_CHECKING:
    from services.docstore.model import DocumentSummary

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
MAX_LISTED_IDS = 1000
"""At most this many doc_ids in one ListDocuments request."""
MAX_LIST_RESPONSE_BYTES = 3 << 20
"""The most bytes one ListDocumentsResponse takes encoded: a page ends before the document
that would take it past this, and its next_page_token continues there.

Below 4 MiB, the receive limit of any default gRPC client (grpcurl's, a caller's grpcio
channel), with room to spare; the Orchestrator's channel to Retrieval takes more; Envoy's MAX_RESPONSE_BYTES (32 MiB), which buffers
it for JSON, is far above. One document at its fields' bounds (services/docstore/fields.py)
takes about 160 KB, so a page always holds at least one."""
_COUNTS_BYTES = 5 * 11
"""DocumentInfo's five int32 fields (pages, sections, chunks, chars, tokens) at their longest:
a one-byte tag and a ten-byte varint each."""
_TOKEN_PREFIX = "v2."
"""How every token this service gives starts."""
_LISTING_KEY_CHARS = 16
"""Hex characters of a listing's digest in its tokens (64 bits of SHA-256)."""
_HEX_KEY = re.compile(rf"[0-9a-f]{{{_LISTING_KEY_CHARS}}}")
FIRST_READ_ROWS = 128
"""Rows of a page's first read from the store (`read_page`): a page of DEFAULT_PAGE_SIZE and
the row after it in one query."""


@dataclass(frozen=True)
class ListPage:
    """One validated page request."""

    after: str
    """List the documents whose doc_id sorts after this one ("" = from the first)."""
    size: int
    doc_ids: tuple[str, ...] | None
    """Only these documents; None = all of the tenant's."""
    listing: str
    """`listing_key` of the request's tenant_id and doc_ids: what its tokens are bound to."""


def listing_key(tenant_id: str, doc_ids: Iterable[str]) -> str:
    """The digest of one listing a page token carries: SHA-256 of the tenant_id and the
    doc_ids filter as a set (sorted, each once: the same documents in another order are the
    same listing), each length-prefixed, cut to _LISTING_KEY_CHARS hex characters."""
    digest = hashlib.sha256()
    for part in (tenant_id, *sorted(set(doc_ids))):
        encoded = part.encode()
        digest.update(len(encoded).to_bytes(4, "big") + encoded)
    return digest.hexdigest()[:_LISTING_KEY_CHARS]


def page_token(last_doc_id: str, listing: str) -> str:
    """The token that asks for the documents after `last_doc_id` in the listing whose
    `listing_key` is `listing`: "v2.<listing>.<last_doc_id in unpadded URL-safe base64>"."""
    position = base64.urlsafe_b64encode(last_doc_id.encode()).decode().rstrip("=")
    return f"{_TOKEN_PREFIX}{listing}.{position}"


def _field_bytes(size: int) -> int:
    """A length-delimited protobuf field of `size` bytes, encoded: a one-byte tag (field
    numbers below 16), the size as a varint, the bytes."""
    return 1 + max(1, -(-size.bit_length() // 7)) + size


def _text_bytes(text: str) -> int:
    return _field_bytes(len(text.encode()))


def listed_bytes(
    doc_id: str, title: str, source: str, generation: str, metadata: Mapping[str, str]
) -> int:
    """An upper bound on the bytes one document takes in a ListDocumentsResponse: its
    DocumentInfo (these strings' UTF-8 and every metadata entry, the counts at their longest)
    as one field of the response. Computed from the strings, without building the message."""
    info = sum(map(_text_bytes, (doc_id, title, source, generation))) + _COUNTS_BYTES
    info += sum(
        _field_bytes(_text_bytes(key) + _text_bytes(value)) for key, value in metadata.items()
    )
    return _field_bytes(info)


def fitting(listed: Iterable[tuple[str, int]], listing: str) -> int:
    """How many of a page's documents, given in order as (doc_id, listed_bytes), one response
    carries: the most whose sizes and the next_page_token after the last of them (of the
    listing `listing`) stay within MAX_LIST_RESPONSE_BYTES, and always the first. Reads
    `listed` no further than it must."""
    used = kept = 0
    for doc_id, size in listed:
        used += size
        if kept and used + _text_bytes(page_token(doc_id, listing)) > MAX_LIST_RESPONSE_BYTES:
            break
        kept += 1
    return kept


def read_page(
    read: Callable[[str, int], Sequence[DocumentSummary]], page: ListPage
) -> tuple[list[DocumentSummary], bool]:
    """The documents of `page`, the first `page.size` after `page.after` cut where `fitting`
    cuts them, and whether any document follows them.

    `read(after, limit)` gives at most `limit` documents whose doc_id sorts after `after`, in
    doc_id order (the store's list_summaries with the page's doc_ids). It is called in
    batches, each after the last document of the one before, until the page is decided:
    FIRST_READ_ROWS rows first, then as many as were read before; page.size + 1 rows in all
    at most, the last of them only to tell whether more follow. One call when the first
    batch decides the page: a page.size below FIRST_READ_ROWS, fewer documents left, or the
    budget reached within it.

    Memory: the rows of the batches before the last one all fit the budget (reading stops
    at the first that does not), so at most about MAX_LIST_RESPONSE_BYTES of rows are held,
    plus the last batch: at most max(FIRST_READ_ROWS, rows read before it) rows.
    """
    rows = _batched(read, page)
    read_rows: list[DocumentSummary] = []

    def listed() -> Iterator[tuple[str, int]]:
        for doc in itertools.islice(rows, page.size):
            read_rows.append(doc)
            yield (
                doc.doc_id,
                listed_bytes(doc.doc_id, doc.title, doc.source, doc.generation, doc.metadata),
            )

    kept = fitting(listed(), page.listing)
    # `fitting` stopped at a document past the budget, or the row after a full page exists.
    more = len(read_rows) > kept or next(rows, None) is not None
    return read_rows[:kept], more


def _batched(
    read: Callable[[str, int], Sequence[DocumentSummary]], page: ListPage
) -> Iterator[DocumentSummary]:
    """`page`'s first page.size + 1 rows, read in the batches `read_page` describes when
    they are reached."""
    after, total, done = page.after, page.size + 1, 0
    limit = min(total, FIRST_READ_ROWS)
    while limit:
        batch = read(after, limit)
        yield from batch
        if len(batch) < limit:
            return
        after, done = batch[-1].doc_id, done + len(batch)
        limit = min(total - done, done)


def _after(token: str, listing: str) -> str:
    """The position `token` continues at: "" for no token; INVALID_ARGUMENT for a token
    this service would not have given, or one of a listing other than `listing`."""
    if not token:
        return ""
    bad = errors.InvalidArgumentError(
        "page_token is not a token this service gave out; start again without one",
        metadata={"field": "page_token"},
    )
    if not token.startswith(_TOKEN_PREFIX) or len(token) > 1024:
        raise bad
    key, dot, body = token[len(_TOKEN_PREFIX) :].partition(".")
    if not dot:
        raise bad
    try:
        after = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
    except (binascii.Error, ValueError):
        raise bad from None
    # One spelling per position and listing: the token this service gives for them and no
    # other (a key of _LISTING_KEY_CHARS lowercase hex digits, the position unpadded).
    if not after or not _HEX_KEY.fullmatch(key) or page_token(after, key) != token:
        raise bad
    if key != listing:
        raise errors.InvalidArgumentError(
            "page_token belongs to another listing (other tenant_id or doc_ids); "
            "start again without one",
            metadata={"field": "page_token"},
        )
    return after


def list_page(tenant_id: str, page_size: int, token: str, doc_ids: tuple[str, ...]) -> ListPage:
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
        raise errors.too_many("doc_ids", len(doc_ids), MAX_LISTED_IDS)
    check_doc_ids(doc_ids, "doc_ids")
    check_tenant_id(tenant_id)  # before its token is judged: an empty one has no listing
    listing = listing_key(tenant_id, doc_ids)
    return ListPage(
        after=_after(token, listing),
        size=page_size or DEFAULT_PAGE_SIZE,
        doc_ids=tuple(doc_ids) if doc_ids else None,
        listing=listing,
    )
