"""Section titles, summaries and page ranges for search results, cached per document generation."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Protocol

from services.docstore.model import Document, Section


class DocumentSource(Protocol):
    """Reads a document's sections (not its chunks) from the document store."""

    def get_document(
        self, tenant_id: str, doc_id: str, *, with_chunks: bool = True
    ) -> Document | None: ...


DocSections = tuple[str, dict[str, Section]]
"""A document's title and its sections by section_id."""


class SectionCatalog:
    """An LRU of documents' section lists: search shapes `used_sections` without a store trip."""

    def __init__(self, source: DocumentSource, size: int = 8192) -> None:
        # 2048 missed ~1 document in 5 on a 2,500-document tenant mix (9 store queries per
        # search); an entry is a title and a few section summaries (~1-2 KB).
        self._source = source
        self._size = size
        self._lock = threading.Lock()
        self._docs: OrderedDict[tuple[str, str], DocSections] = OrderedDict()
        # A read that began before a forget() may hold the old version (a search reading while
        # a re-ingest commits): it must not refill the cache with it. forget() stamps the key
        # with a new epoch; a read caches only when its key has no stamp newer than the epoch
        # it began in. Stamps are needed only while reads are in flight, so they go then.
        self._epoch = 0
        self._forgotten: dict[tuple[str, str], int] = {}
        self._reads = 0

    def document(self, tenant_id: str, doc_id: str) -> DocSections | None:
        """The document's title and sections, None when the store does not have it."""
        key = (tenant_id, doc_id)
        with self._lock:
            found = self._docs.get(key)
            if found is not None:
                self._docs.move_to_end(key)
                return found
            began = self._epoch
            self._reads += 1
        try:
            doc = self._source.get_document(tenant_id, doc_id, with_chunks=False)
        except BaseException:
            with self._lock:
                self._read_done()
            raise
        entry = None if doc is None else (doc.title, {s.section_id: s for s in doc.sections})
        with self._lock:
            fresh = self._forgotten.get(key, began) <= began
            self._read_done()
            if entry is not None and fresh:
                self._docs[key] = entry
                while len(self._docs) > self._size:
                    self._docs.popitem(last=False)
        return entry

    def _read_done(self) -> None:
        self._reads -= 1
        if not self._reads:
            self._forgotten.clear()

    def forget(self, tenant_id: str, doc_id: str) -> None:
        """Drop a document (re-ingested or deleted by this process)."""
        with self._lock:
            self._docs.pop((tenant_id, doc_id), None)
            if self._reads:
                self._epoch += 1
                self._forgotten[(tenant_id, doc_id)] = self._epoch
