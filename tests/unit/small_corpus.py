"""One small document ingested for real (SQLite store, Edge index, a stand-in embedder) and a
RetrievalEngine over it: the engine-level retrieval tests' shared setup."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from services.common.breaker import BreakerPolicy, CircuitBreaker
from services.common.tokenizer import default_tokenizer
from services.docstore.sqlite_store import SqliteDocumentStore
from services.retrieval.engine import EngineSettings, RetrievalEngine
from services.retrieval.index.edge import EdgeIndex
from services.retrieval.ingestion import IngestInput, Ingestor
from services.retrieval.journal import IngestJournal
from services.retrieval.search import SearchDefaults
from services.retrieval.sections import SectionCatalog


class StandInEmbedder:
    """A stand-in embedding: `_row` gives a text's (lower-cased) unnormalised vector."""

    name = "stand-in"
    dim = 2

    def _row(self, text: str) -> list[float]:
        raise NotImplementedError

    def _embed(self, texts: Any) -> np.ndarray:
        m = np.asarray([self._row(t.lower()) for t in texts], dtype=np.float32)
        return m / np.linalg.norm(m, axis=1, keepdims=True)

    def embed_queries(self, texts: Any) -> np.ndarray:
        return self._embed(texts)

    def embed_passages(self, texts: Any) -> np.ndarray:
        return self._embed(texts)


@dataclass
class SmallCorpus:
    store: SqliteDocumentStore
    index: EdgeIndex
    sections: SectionCatalog
    embedder: Any

    def engine(self, settings: EngineSettings | None = None, chunks: Any = None) -> RetrievalEngine:
        """The engine as the server builds it, over this corpus (`chunks`: another view of
        the store, e.g. one that counts reads)."""
        return RetrievalEngine(
            index=self.index, embedder=self.embedder, sections=self.sections,
            chunks=chunks or self.store, tokenizer=default_tokenizer(),
            defaults=SearchDefaults(), settings=settings or EngineSettings(),
            breaker=CircuitBreaker("vector store", BreakerPolicy(3, 60)),
        )  # fmt: skip


def ingesting_stack(
    tmp: Path, embedder: Any, summarizer: Any = None
) -> tuple[SqliteDocumentStore, EdgeIndex, SectionCatalog, Ingestor]:
    """A document store, an Edge index, the section catalog and an Ingestor over them, in
    `tmp`; close the index (and the store) when done."""
    store = SqliteDocumentStore(tmp / "docstore.sqlite")
    index = EdgeIndex(str(tmp / "index"), embedder.dim)
    sections = SectionCatalog(store)
    ingestor = Ingestor(
        store=store, index=index, embedder=embedder, sections=sections,
        journal=IngestJournal(tmp / "journal.jsonl"), max_document_bytes=1 << 20,
        summarizer=summarizer,
    )  # fmt: skip
    return store, index, sections, ingestor


@contextlib.contextmanager
def small_corpus(tmp: Path, embedder: Any, file_name: str, text: str) -> Iterator[SmallCorpus]:
    """`text` ingested as `file_name` for tenant "t" under `tmp`; the index closes on exit."""
    store, index, sections, ingestor = ingesting_stack(tmp, embedder)
    try:
        asyncio.run(ingestor.ingest(IngestInput("t", text.encode(), file_name=file_name)))
        yield SmallCorpus(store, index, sections, embedder)
    finally:
        index.close()
