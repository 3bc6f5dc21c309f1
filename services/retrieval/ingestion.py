"""Ingestion: parse a document, write it to the document store, then to the index."""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.common import errors
from services.docstore.parsing import UnsupportedFormatError, guess_format, parse_document, slugify
from services.docstore.sqlite_store import SqliteDocumentStore
from services.retrieval.keyword_index import KeywordIndex

# Letters of any script (ids are derived from file names, often Russian), digits, . _ -
_DOC_ID = re.compile(r"^[^\W_][\w.-]{0,127}$")
MAX_TAGS = 32


@dataclass(frozen=True)
class IngestInput:
    """One document to ingest, as the domain sees it."""

    tenant_id: str
    content: bytes
    doc_id: str = ""
    file_name: str = ""
    content_type: str = ""
    title: str = ""
    product: str = ""
    version: str = ""
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class IngestOutcome:
    doc_id: str
    sections: int
    chunks: int
    pages: int
    replaced: bool


@dataclass(frozen=True)
class DocumentSummary:
    doc_id: str
    title: str
    pages: int
    sections: int
    chunks: int
    chars: int
    source: str


class Ingestor:
    """Writes documents to the store first and the index second; the store is the source of truth."""

    def __init__(
        self, store: SqliteDocumentStore, index: KeywordIndex, max_document_bytes: int
    ) -> None:
        self._store = store
        self._index = index
        self._max_bytes = max_document_bytes

    def load_index(self) -> int:
        """Rebuild the in-process index from the store; returns the number of documents."""
        docs = 0
        tenants: dict[tuple[str, str], None] = {}
        for tenant_id, doc_id, _title, _chunk in self._store.all_chunks():
            tenants[(tenant_id, doc_id)] = None
        for tenant_id, doc_id in tenants:
            doc = self._store.get_document(tenant_id, doc_id)
            if doc is not None:
                self._index.add(doc)
                docs += 1
        return docs

    def ingest(self, item: IngestInput) -> IngestOutcome:
        if not item.tenant_id.strip():
            raise errors.InvalidArgumentError(
                "tenant_id is required", metadata={"field": "tenant_id"}
            )
        if not item.content:
            raise errors.InvalidArgumentError("content is empty", metadata={"field": "content"})
        if len(item.content) > self._max_bytes:
            raise errors.LimitExceededError(
                f"document is {len(item.content)} bytes; the limit is {self._max_bytes}",
                metadata={"field": "content", "limit": str(self._max_bytes)},
            )
        if len(item.tags) > MAX_TAGS:
            raise errors.LimitExceededError(
                f"at most {MAX_TAGS} tags", metadata={"field": "tags", "limit": str(MAX_TAGS)}
            )
        stem = item.file_name.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        doc_id = item.doc_id or slugify(stem, 100, fallback="")
        if not _DOC_ID.match(doc_id):
            if item.doc_id:
                raise errors.InvalidArgumentError(
                    "doc_id must be 1-128 characters of letters, digits, '.', '_' or '-'",
                    metadata={"field": "doc_id"},
                )
            raise errors.InvalidArgumentError(
                "no doc_id could be made from file_name; give doc_id",
                metadata={"field": "file_name"},
            )
        fmt = guess_format(item.file_name, item.content_type)
        try:
            text = item.content.decode("utf-8")
        except UnicodeDecodeError:
            raise errors.InvalidArgumentError(
                "content is not UTF-8 text", metadata={"field": "content"}
            ) from None
        try:
            doc = parse_document(
                tenant_id=item.tenant_id,
                doc_id=doc_id,
                text=text,
                fmt=fmt,
                title=item.title,
                product=item.product,
                version=item.version,
                tags=item.tags,
            )
        except UnsupportedFormatError as exc:
            raise errors.InvalidArgumentError(str(exc), reason="UNSUPPORTED_FORMAT") from None
        if not doc.chunks:
            raise errors.InvalidArgumentError(
                "the document has no text", metadata={"field": "content"}
            )
        replaced = self._store.put(doc)
        self._index.add(doc)
        return IngestOutcome(doc_id, len(doc.sections), len(doc.chunks), doc.pages, replaced)

    def delete(self, tenant_id: str, doc_id: str) -> bool:
        if not tenant_id.strip():
            raise errors.InvalidArgumentError(
                "tenant_id is required", metadata={"field": "tenant_id"}
            )
        if not doc_id.strip():
            raise errors.InvalidArgumentError("doc_id is required", metadata={"field": "doc_id"})
        deleted = self._store.delete(tenant_id, doc_id)
        self._index.remove(tenant_id, doc_id)
        return deleted

    def list(self, tenant_id: str) -> list[DocumentSummary]:
        if not tenant_id.strip():
            raise errors.InvalidArgumentError(
                "tenant_id is required", metadata={"field": "tenant_id"}
            )
        out = []
        for doc in self._store.list_documents(tenant_id):
            sections, chunks, chars = self._store.counts(tenant_id, doc.doc_id)
            out.append(
                DocumentSummary(
                    doc.doc_id, doc.title, doc.pages, sections, chunks, chars, doc.source
                )
            )
        return out
