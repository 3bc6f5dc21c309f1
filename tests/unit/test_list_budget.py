"""ListDocuments' response byte budget (services/retrieval/listing.py MAX_LIST_RESPONSE_BYTES):
a page of large documents ends early, within the budget, and its next_page_token goes on
after the last document sent; a page of small documents is not cut; one document at its
fields' bounds (services/docstore/fields.py) always fits."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from visior.retrieval.v1 import retrieval_pb2

from services.common import errors
from services.common.document_limits import MAX_DOC_ID_CHARS
from services.docstore.fields import (
    MAX_METADATA,
    MAX_METADATA_KEY_CHARS,
    MAX_METADATA_VALUE,
    MAX_TITLE_CHARS,
    SERVICE_METADATA,
)
from services.docstore.model import Document
from services.retrieval import listing
from services.retrieval.embeddings import EmbeddingSettings
from services.retrieval.factories import build_embedder
from services.retrieval.listing import (
    FIRST_READ_ROWS,
    MAX_LIST_RESPONSE_BYTES,
    MAX_PAGE_SIZE,
    ListPage,
    fitting,
    list_page,
    listed_bytes,
    listing_key,
    page_token,
    read_page,
)
from services.retrieval.servicer import IngestionServicer
from tests.unit.test_search import make_stack

WIDE = "\U0001d538"
"""A character of four UTF-8 bytes, the most any character takes."""
TENANT = "t"
ALL = listing_key(TENANT, ())
"""The listing of all of TENANT's documents: what its tokens are bound to."""


@pytest.fixture(scope="module")
def embedder():
    return build_embedder(EmbeddingSettings(profile="fast"))


def wide(prefix: str, chars: int) -> str:
    return prefix + WIDE * (chars - len(prefix))


def largest(n: int) -> Document:
    """Document number `n`, every listed field at its bound in four-byte characters."""
    own = {wide(f"{k:02d}", MAX_METADATA_KEY_CHARS): wide("", MAX_METADATA_VALUE)
           for k in range(MAX_METADATA)}  # fmt: skip
    service = {key: wide("", MAX_METADATA_VALUE) for key in SERVICE_METADATA}
    return Document(
        tenant_id=TENANT, doc_id=wide(f"d{n:03d}", MAX_DOC_ID_CHARS),
        title=wide("", MAX_TITLE_CHARS), source="knowledge_base", generation="g" * 128,
        metadata=own | service,
    )  # fmt: skip


def bound(doc: Document) -> int:
    return listed_bytes(doc.doc_id, doc.title, doc.source, doc.generation, doc.metadata)


def info(doc: Document, count: int) -> retrieval_pb2.DocumentInfo:
    return retrieval_pb2.DocumentInfo(
        doc_id=doc.doc_id, title=doc.title, pages=count, sections=count, chunks=count,
        chars=count, source=doc.source, generation=doc.generation, metadata=dict(doc.metadata),
        tokens=count,
    )  # fmt: skip


async def pages(
    servicer: IngestionServicer, **request
) -> list[retrieval_pb2.ListDocumentsResponse]:
    """Every response of one listing, following next_page_token to the end."""
    out, token = [], ""
    while True:
        req = retrieval_pb2.ListDocumentsRequest(tenant_id=TENANT, page_token=token, **request)
        out.append(await servicer.ListDocuments(req, None))  # type: ignore[arg-type]
        token = out[-1].next_page_token
        if not token or len(out) > 100:
            return out


@pytest.mark.parametrize("count", [0, 7, 2**31 - 1, -1])
def test_one_document_at_the_field_bounds_fits_the_budget(count):
    doc = largest(0)
    response = retrieval_pb2.ListDocumentsResponse(
        documents=[info(doc, count)], next_page_token=page_token(doc.doc_id, ALL)
    )
    assert bound(doc) + len(page_token(doc.doc_id, ALL)) + 3 >= response.ByteSize()
    assert response.ByteSize() > 150_000  # a thousand of them: far past gRPC's 4 MiB
    assert bound(doc) + len(page_token(doc.doc_id, ALL)) + 3 <= MAX_LIST_RESPONSE_BYTES
    assert MAX_LIST_RESPONSE_BYTES < 4 << 20  # below gRPC's default receive limit


@pytest.mark.parametrize(
    "doc",
    [
        Document(tenant_id=TENANT, doc_id="a", title=""),
        Document(tenant_id=TENANT, doc_id="a", title="x" * 200, metadata={"k": "v" * 300}),
        Document(tenant_id=TENANT, doc_id="a", title="", metadata={"": ""}),
    ],
)
def test_listed_bytes_is_never_below_the_encoded_size(doc):
    for count in (0, 1, 300, 2**31 - 1, -1):
        encoded = retrieval_pb2.ListDocumentsResponse(documents=[info(doc, count)]).ByteSize()
        assert bound(doc) >= encoded


@pytest.mark.parametrize("by_ids", [False, True])
async def test_large_documents_are_listed_in_pages_within_the_budget_each_exactly_once(
    tmp_path, embedder, by_ids
):
    s = make_stack(tmp_path, embedder)
    docs = [largest(n) for n in range(45)]
    for doc in docs:
        s.store.put(doc)
    ids = sorted(d.doc_id for d in docs)
    request = {"page_size": MAX_PAGE_SIZE, "doc_ids": ids if by_ids else []}
    responses = await pages(IngestionServicer(s.ingestor), **request)
    sizes = [len(r.documents) for r in responses]
    assert len(sizes) > 1  # cut: 45 such documents are ~7 MiB
    assert max(r.ByteSize() for r in responses) <= MAX_LIST_RESPONSE_BYTES
    # Cut where the budget ends, not earlier: as many as the budget holds.
    most = (MAX_LIST_RESPONSE_BYTES - len(page_token(ids[0], ALL)) - 3) // bound(docs[0])
    assert sizes[:-1] == [most] * (len(sizes) - 1)
    listed = [d.doc_id for r in responses for d in r.documents]
    assert listed == ids  # every document once, in doc_id order
    assert responses[0].documents[0].metadata == dict(docs[0].metadata)
    s.index.close()


async def test_a_page_of_small_documents_is_not_cut(tmp_path, embedder):
    s = make_stack(tmp_path, embedder)
    ids = [f"doc-{n:04d}" for n in range(MAX_PAGE_SIZE + 5)]
    for doc_id in ids:
        s.store.put(Document(TENANT, doc_id, f"Title of {doc_id}", metadata={"format": "md"}))
    responses = await pages(IngestionServicer(s.ingestor), page_size=MAX_PAGE_SIZE)
    assert [len(r.documents) for r in responses] == [MAX_PAGE_SIZE, 5]
    assert responses[0].next_page_token == page_token(ids[MAX_PAGE_SIZE - 1], ALL)
    assert [d.doc_id for r in responses for d in r.documents] == ids
    s.index.close()


async def test_a_single_document_at_the_field_bounds_is_listed(tmp_path, embedder):
    s = make_stack(tmp_path, embedder)
    doc = largest(0)
    s.store.put(doc)
    (response,) = await pages(IngestionServicer(s.ingestor), page_size=1)
    assert [d.doc_id for d in response.documents] == [doc.doc_id]
    assert response.next_page_token == ""
    s.index.close()


async def test_a_token_is_taken_only_by_its_own_listing(tmp_path, embedder):
    """A next_page_token continues the listing it came from; presented with another tenant_id
    or doc_ids it is INVALID_ARGUMENT, never a page of that other listing."""
    s = make_stack(tmp_path, embedder)
    for tenant in (TENANT, "other"):
        for n in range(5):
            s.store.put(small(tenant, f"doc-{n}"))
    servicer = IngestionServicer(s.ingestor)

    async def ask(tenant: str, token: str, doc_ids=()) -> list[str]:
        request = retrieval_pb2.ListDocumentsRequest(
            tenant_id=tenant, page_size=2, page_token=token, doc_ids=doc_ids
        )
        response = await servicer.ListDocuments(request, None)  # type: ignore[arg-type]
        return [d.doc_id for d in response.documents] + [response.next_page_token]

    *_, token = await ask(TENANT, "")
    *_, by_ids = await ask(TENANT, "", ["doc-3", "doc-0", "doc-1"])
    for tenant, doc_ids, given in [
        ("other", [], token),  # another tenant: its documents sort after doc-1 too
        (TENANT, ["doc-0", "doc-1", "doc-2"], token),  # the whole tenant's, with a filter
        ("other", ["doc-3", "doc-0", "doc-1"], by_ids),  # the same filter, another tenant
        (TENANT, [], by_ids),  # a filter's, without it
        (TENANT, ["doc-0", "doc-1"], by_ids),  # a filter's, with fewer
    ]:
        with pytest.raises(errors.InvalidArgumentError) as other:
            await ask(tenant, given, doc_ids)
        assert other.value.metadata == {"field": "page_token"}
        assert "belongs to another listing" in str(other.value)
    *continued, last = await ask(TENANT, token)  # its own listing: continued after doc-1
    assert continued == ["doc-2", "doc-3"] and last
    assert await ask(TENANT, by_ids, ["doc-1", "doc-0", "doc-3", "doc-3"]) == ["doc-3", ""]
    s.index.close()


async def test_a_listing_by_doc_ids_continues_with_them_in_any_order(tmp_path, embedder):
    """Every page asked with the same doc_ids shuffled and repeated: every document once."""
    s = make_stack(tmp_path, embedder)
    ids = [f"doc-{n:02d}" for n in range(15)]
    for doc_id in ids:
        s.store.put(small(TENANT, doc_id))
    s.store.put(small("other", "doc-01"))
    wanted = [*ids[1::2], "absent"]
    servicer, rng = IngestionServicer(s.ingestor), random.Random(3)
    for page_size in (1, 2, 3, 7):
        listed, token, calls = [], "", 0
        while calls < 20:
            asked = [*wanted, *rng.sample(wanted, 3)]
            rng.shuffle(asked)
            request = retrieval_pb2.ListDocumentsRequest(
                tenant_id=TENANT, page_size=page_size, page_token=token, doc_ids=asked
            )
            response = await servicer.ListDocuments(request, None)  # type: ignore[arg-type]
            listed += [d.doc_id for d in response.documents]
            token, calls = response.next_page_token, calls + 1
            if not token:
                break
        assert listed == ids[1::2], page_size  # every one once, in doc_id order
    s.index.close()


# -- how much a page reads ---------------------------------------------------------------------


def reference_page(rows: list[Document], page: ListPage) -> tuple[list[str], str]:
    """The page cut from one read of page.size + 1 rows (`rows`: that read), the plain way:
    the page's doc_ids and its next_page_token."""
    kept = fitting(((d.doc_id, bound(d)) for d in rows[: page.size]), page.listing)
    token = page_token(rows[kept - 1].doc_id, page.listing) if len(rows) > kept else ""
    return [d.doc_id for d in rows[:kept]], token


def reference(store, tenant: str, page: ListPage) -> tuple[list[str], str]:
    rows = store.list_summaries(tenant, after=page.after, limit=page.size + 1, doc_ids=page.doc_ids)
    return reference_page(rows, page)


def count_reads(monkeypatch, store) -> list[tuple[int, int]]:
    """(limit, rows returned) of every list_summaries call on `store` from here on (the
    listing's one read of each batch: the documents with their counts)."""
    reads: list[tuple[int, int]] = []
    real = store.list_summaries

    def counted(tenant_id, **kwargs):
        rows = real(tenant_id, **kwargs)
        reads.append((kwargs["limit"], len(rows)))
        return rows

    monkeypatch.setattr(store, "list_summaries", counted)
    return reads


def small(tenant: str, doc_id: str) -> Document:
    return Document(tenant, doc_id, f"Title of {doc_id}", metadata={"format": "md"})


async def test_a_page_of_large_documents_reads_one_batch_not_the_page_size(
    tmp_path, embedder, monkeypatch
):
    s = make_stack(tmp_path, embedder)
    docs = [largest(n) for n in range(FIRST_READ_ROWS + 32)]
    for doc in docs:
        s.store.put(doc)
    page = list_page(TENANT, MAX_PAGE_SIZE, "", ())
    expected = reference(s.store, TENANT, page)
    reads = count_reads(monkeypatch, s.store)
    summaries, token = await s.ingestor.list(TENANT, page)
    assert ([d.doc_id for d in summaries], token) == expected
    assert 1 < len(summaries) < 20  # cut at the budget: ~19 of them fit
    # One batch, far below the page size's 1001 rows (~160 MB at these documents' size).
    assert reads == [(FIRST_READ_ROWS, FIRST_READ_ROWS)]
    s.index.close()


@pytest.mark.parametrize(
    ("stored", "page_size", "reads"),
    [
        (100, MAX_PAGE_SIZE, [(FIRST_READ_ROWS, 100)]),  # a tenant of fewer: one query
        (MAX_PAGE_SIZE + 5, 0, [(101, 101)]),  # the default page size: one query
        (MAX_PAGE_SIZE + 5, 20, [(21, 21)]),
        # A full page of small documents: batches of 128, 128, 256, 489 (1001 rows, as
        # one read of page_size + 1).
        (MAX_PAGE_SIZE + 5, MAX_PAGE_SIZE, [(128, 128), (128, 128), (256, 256), (489, 489)]),
    ],
)
async def test_small_documents_are_read_in_few_queries(
    tmp_path, embedder, monkeypatch, stored, page_size, reads
):
    s = make_stack(tmp_path, embedder)
    ids = [f"doc-{n:04d}" for n in range(stored)]
    for doc_id in ids:
        s.store.put(small(TENANT, doc_id))
    page = list_page(TENANT, page_size, "", ())
    expected = reference(s.store, TENANT, page)
    seen = count_reads(monkeypatch, s.store)
    summaries, token = await s.ingestor.list(TENANT, page)
    assert ([d.doc_id for d in summaries], token) == expected
    assert len(summaries) == min(stored, page.size)
    assert seen == reads
    s.index.close()


def mixed_layout() -> list[Document]:
    """Small documents with runs of documents at the field bounds: in the first batch, across
    the batches' boundaries (128, 256, 512), one longer than a page's budget, and scattered."""
    large = {*range(3, 6), *range(120, 140), *range(250, 258), *range(380, 400)}
    large |= {*range(500, 546), *range(0, 760, 37)}
    return [
        replace(largest(0), doc_id=f"doc-{n:04d}") if n in large else small(TENANT, f"doc-{n:04d}")
        for n in range(760)
    ]


@pytest.mark.parametrize("by_ids", [False, True])
async def test_pages_are_those_of_one_read_of_the_page_size(tmp_path, embedder, by_ids):
    s = make_stack(tmp_path, embedder)
    docs = mixed_layout()
    for doc in docs:
        s.store.put(doc)
    # Small tenants ending at and around the batches' boundaries.
    ends = {f"end{n}": n for n in (FIRST_READ_ROWS - 1, FIRST_READ_ROWS, FIRST_READ_ROWS + 1,
                                   2 * FIRST_READ_ROWS, 4 * FIRST_READ_ROWS)}  # fmt: skip
    for tenant, stored in ends.items():
        for n in range(stored):
            s.store.put(small(tenant, f"doc-{n:04d}"))
    ids = [d.doc_id for d in docs]
    wanted = (tuple(ids[::3] + ids[1:200:5] + ["doc-9999", "absent"]),) if by_ids else ((),)
    for tenant in [TENANT, *ends]:
        for page_size in (1, 2, 19, 20, 100, 127, 128, 129, 255, 256, 257, 500, MAX_PAGE_SIZE):
            listed, token = [], ""
            while True:
                page = list_page(tenant, page_size, token, *wanted)
                expected = reference(s.store, tenant, page)
                summaries, token = await s.ingestor.list(tenant, page)
                assert ([d.doc_id for d in summaries], token) == expected, (tenant, page_size)
                listed += expected[0]
                if not token:
                    break
            every = s.store.list_summaries(tenant, doc_ids=page.doc_ids)
            assert listed == [d.doc_id for d in every]
    s.index.close()


def test_read_page_cuts_as_one_read_of_the_page_size_does(monkeypatch):
    """Random documents against a small budget: every page as the reference cuts it, and
    never a row read past the one that decides the page."""
    rng = random.Random(7)
    for _ in range(400):
        monkeypatch.setattr(listing, "MAX_LIST_RESPONSE_BYTES", rng.choice([2000, 20_000]))
        lengths = rng.choice([[0, 10], [0, 10, 100], [0, 10, 100, 900, 2500, 25_000]])
        docs = [
            Document(TENANT, f"d{n:04d}", "t" * rng.choice(lengths))
            for n in range(rng.choice([0, 1, 5, 127, 128, 129, 300, 700, 1100]))
        ]
        size = rng.choice([1, 2, 3, 10, 50, 127, 128, 129, 256, 500, MAX_PAGE_SIZE])
        after = rng.choice(["", *(d.doc_id for d in docs[:50])])
        page = ListPage(after=after, size=size, doc_ids=None, listing=ALL)
        rows = [d for d in docs if d.doc_id > after]
        read_rows: list[Document] = []

        def read(start, limit, rows=rows, read_rows=read_rows):
            batch = [d for d in rows if d.doc_id > start][:limit]
            read_rows.extend(batch)
            return batch

        kept, more = read_page(read, page)
        ids, token = reference_page(rows[: size + 1], page)
        assert [d.doc_id for d in kept] == ids
        assert more == bool(token)
        # Read no further than the row after the page's last document.
        assert len(read_rows) <= max(len(ids) + 1, FIRST_READ_ROWS, 2 * len(ids))
        assert len(read_rows) <= size + 1
