"""Assembles the retrieval process: store, index, engines, servicers, server."""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry
from visior.retrieval.v1 import retrieval_pb2_grpc

from services.common.runner import Closer
from services.common.server import RunningServer, start_server
from services.docstore.sqlite_store import SqliteDocumentStore
from services.retrieval.config import RetrievalSettings
from services.retrieval.ingestion import Ingestor
from services.retrieval.keyword_index import KeywordIndex
from services.retrieval.mock import MockSearchEngine
from services.retrieval.search import SearchEngine
from services.retrieval.servicer import IngestionServicer, RetrievalServicer, SearchBackend

log = logging.getLogger("visior.retrieval")

SERVICE_NAMES = ("visior.retrieval.v1.RetrievalService", "visior.retrieval.v1.IngestionService")


async def start(settings: RetrievalSettings) -> tuple[RunningServer, Closer]:
    store = SqliteDocumentStore(settings.docstore_path)
    index = KeywordIndex()
    ingestor = Ingestor(store, index, settings.max_document_bytes)
    engine: SearchBackend
    if settings.mock_mode:
        engine = MockSearchEngine(settings.defaults)
        backend = "mock"
    else:
        docs = ingestor.load_index()
        log.info("index loaded", extra={"documents": docs, "chunks": index.chunk_count()})
        engine = SearchEngine(index, settings.defaults)
        backend = "keyword"

    def probe() -> dict[str, str]:
        try:
            store.ping()
        except Exception as exc:  # the health answer must say why, not raise
            return {"status": "down", "backend": backend, "docstore": f"error: {exc}"}
        return {
            "status": "ok",
            "backend": backend,
            "docstore": "sqlite",
            "chunks": str(index.chunk_count()),
        }

    def register(server):  # type: ignore[no-untyped-def]
        retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(
            RetrievalServicer(engine, probe), server
        )
        retrieval_pb2_grpc.add_IngestionServiceServicer_to_server(
            IngestionServicer(ingestor), server
        )

    running = await start_server(
        settings.server, register, SERVICE_NAMES, CollectorRegistry(), domain="visior.retrieval"
    )

    async def close() -> None:
        store.close()

    return running, close
