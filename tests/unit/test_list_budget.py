"""ListDocuments' response byte budget (services/retrieval/listing.py MAX_LIST_RESPONSE_BYTES):
a page of large documents ends early, within the budget, and its next_page_token goes on
after the last document sent; a page of small documents is not cut; one document at its
fields' bounds (services/docstore/fields.py) always fits."""

from __future__ import annotations

import pytest
from visior.retrieval.v1 import retrieval_pb2

from services.docstore.fields import (
    MAX_METADATA,
    MAX_METADATA_KEY_CHARS,
    MAX_METADATA_VALUE,
    MAX_TITLE_CHARS,
    SERVICE_METADATA,
)
from services.docstore.model import Document
from services.retrieval.embeddings import EmbeddingSettings
from services.retrieval.factories import build_embedder
from services.retrieval.limits import MAX_DOC_ID_CHARS
from services.retrieval.listing import (
    MAX_LIST_RESPONSE_BYTES,
    MAX_PAGE_SIZE,
    listed_bytes,
    page_token,
)
from services.retrieval.servicer import IngestionServicer
from tests.unit.test_search import make_stack

WIDE = "\U0001d538"
"""A character of four UTF-8 bytes, the most any character takes."""
TENANT = "t"


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
        documents=[info(doc, count)], next_page_token=page_token(doc.doc_id)
    )
    assert bound(doc) + len(page_token(doc.doc_id)) + 3 >= response.ByteSize()
    assert response.ByteSize() > 150_000  # a thousand of them: far past gRPC's 4 MiB
    assert bound(doc) + len(page_token(doc.doc_id)) + 3 <= MAX_LIST_RESPONSE_BYTES
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
    most = (MAX_LIST_RESPONSE_BYTES - len(page_token(ids[0])) - 3) // bound(docs[0])
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
    assert responses[0].next_page_token == page_token(ids[MAX_PAGE_SIZE - 1])
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
