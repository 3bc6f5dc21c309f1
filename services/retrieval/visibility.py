"""Which ingest generation of each document is live: the document store decides, this caches it.

Ingestion writes index points of a new generation first and commits the document store
second, so a crash in between leaves points the store does not know: search hides every
point whose generation is not the store's, and recovery deletes them (services/retrieval/
ingestion.py). The cache is filled lazily from the store and updated by the ingestor of
the same process; a miss (another process ingested) is answered by the store itself.
"""

from __future__ import annotations

import threading
from typing import Protocol


class GenerationSource(Protocol):
    """The store's view: the committed generation of a document, None when it has none."""

    def document_generation(self, tenant_id: str, doc_id: str) -> str | None: ...


class Visibility:
    """Answers "is this (tenant, doc, generation) the committed one?" fast, for every hit."""

    def __init__(self, source: GenerationSource) -> None:
        self._source = source
        self._lock = threading.Lock()
        self._live: dict[tuple[str, str], str | None] = {}

    def is_live(self, tenant_id: str, doc_id: str, generation: str) -> bool:
        key = (tenant_id, doc_id)
        with self._lock:
            known = self._live.get(key, "")
        if known == generation:
            return True
        # Unknown here, or another generation: the store is the truth (another process may
        # have ingested since); remember what it says.
        current = self._source.document_generation(tenant_id, doc_id)
        with self._lock:
            self._live[key] = current
        return current == generation

    def set(self, tenant_id: str, doc_id: str, generation: str | None) -> None:
        """Record a commit (or, with None, a delete) made by this process."""
        with self._lock:
            self._live[(tenant_id, doc_id)] = generation
