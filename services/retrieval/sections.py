"""Section titles, summaries and page ranges for search results, cached per document generation;
an index of a tenant's document titles, for the query's title words (query.TitleIndex)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from services.docstore.model import Document, Section
from services.retrieval.query import TitleIndex


class DocumentSource(Protocol):
    """Reads a document's sections (not its chunks) from the document store."""

    def get_document(
        self, tenant_id: str, doc_id: str, *, with_chunks: bool = True
    ) -> Document | None: ...

    def list_documents(self, tenant_id: str, *, limit: int | None = None) -> list[Document]: ...


MAX_TITLED_DOCUMENTS = 1000
"""A tenant with more documents than this gets no title hint: listing them per search would
cost more than the hint is worth, and among that many titles any two words name one."""
TITLES_TTL_S = 30.0
"""How long a tenant's titles are reused; a document another process ingests or deletes is
seen within this time (one this process ingests or deletes, at once: forget)."""


DocSections = tuple[str, dict[str, Section]]
"""A document's title and its sections by section_id."""


class SectionCatalog:
    """An LRU of documents' section lists: search shapes `used_sections` without a store trip."""

    def __init__(
        self,
        source: DocumentSource,
        size: int = 8192,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
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
        self._clock = clock
        self._titles: OrderedDict[str, tuple[float, TitleIndex]] = OrderedDict()
        self._titles_epoch = 0
        """Bumped by forget(): a listing that began before it is used, not cached."""

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

    def title_index(self, tenant_id: str) -> TitleIndex:
        """The index of the tenant's document titles (empty past MAX_TITLED_DOCUMENTS), from
        the store at most once per TITLES_TTL_S."""
        now = self._clock()
        with self._lock:
            found = self._titles.get(tenant_id)
            if found is not None and now - found[0] < TITLES_TTL_S:
                return found[1]
            began = self._titles_epoch
        docs = self._source.list_documents(tenant_id, limit=MAX_TITLED_DOCUMENTS + 1)
        titles = TitleIndex(() if len(docs) > MAX_TITLED_DOCUMENTS else (d.title for d in docs))
        with self._lock:
            if began == self._titles_epoch:
                self._titles[tenant_id] = (now, titles)
                self._titles.move_to_end(tenant_id)
                while len(self._titles) > self._size:
                    self._titles.popitem(last=False)
        return titles

    def forget(self, tenant_id: str, doc_id: str) -> None:
        """Drop a document (re-ingested or deleted by this process)."""
        with self._lock:
            self._docs.pop((tenant_id, doc_id), None)
            self._titles.pop(tenant_id, None)
            self._titles_epoch += 1
            if self._reads:
                self._epoch += 1
                self._forgotten[(tenant_id, doc_id)] = self._epoch
