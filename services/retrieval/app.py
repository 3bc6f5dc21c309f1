"""Assembles the retrieval process: store, index, embedder, engine, ingestion, servicers, server."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import httpx
from prometheus_client import CollectorRegistry
from visior.retrieval.v1 import retrieval_pb2_grpc

from services.common import errors
from services.common.breaker import CircuitBreaker
from services.common.health import watch_probe
from services.common.http import quiet_http_client_logs
from services.common.http_tracing import traced_async_client, traced_client
from services.common.runner import Closer
from services.common.server import RunningServer, start_server
from services.common.tokenizer import default_tokenizer
from services.common.topology import SERVICE_BY_KEY
from services.common.tracing import Tracing, install_tracing
from services.docstore.health import store_health
from services.docstore.pdf_worker import PdfWorker
from services.docstore.store import DocumentStore
from services.model_runtime.client import OpenAiChatRuntime
from services.retrieval.config import RetrievalSettings
from services.retrieval.embeddings import Embedder
from services.retrieval.engine import RetrievalEngine
from services.retrieval.factories import build_embedder, build_reranker
from services.retrieval.index.base import IndexUnavailableError
from services.retrieval.index.edge import EdgeIndex
from services.retrieval.index.qdrant_common import VectorIndex
from services.retrieval.index.server import QdrantServerIndex
from services.retrieval.index_maintenance import IndexOptimizer
from services.retrieval.ingestion import Ingestor
from services.retrieval.journal import IngestJournal
from services.retrieval.llm_assist import LlmAssistSettings, LlmQueryExpander, LlmSummarizer
from services.retrieval.metrics import RetrievalMetrics
from services.retrieval.mock import MockSearchEngine
from services.retrieval.query import load_synonyms
from services.retrieval.rerank import RerankClient, Reranker
from services.retrieval.sections import SectionCatalog
from services.retrieval.servicer import IngestionServicer, RetrievalServicer, SearchBackend

log = logging.getLogger("visior.retrieval")

SERVICE_NAMES = SERVICE_BY_KEY["retrieval"].grpc_services


def open_index(settings: RetrievalSettings, dim: int) -> VectorIndex:
    """The configured index backend (Edge in-process by default, or a Qdrant server)."""
    if settings.index.backend == "qdrant":
        return QdrantServerIndex.from_url(
            settings.index.qdrant_url,
            settings.index.qdrant_collection,
            dim,
            api_key=settings.index.qdrant_api_key or None,
            timeout=settings.index.timeout_s,
            hnsw_ef=settings.index.hnsw_ef,
            quantization=settings.index.quantization,
        )
    return EdgeIndex(
        settings.index.path,
        dim,
        hnsw_ef=settings.index.hnsw_ef,
        quantization=settings.index.quantization,
        indexing_threshold_kb=settings.index.indexing_threshold_kb or None,
    )


def llm_assistants(
    settings: LlmAssistSettings, http: httpx.AsyncClient
) -> tuple[LlmSummarizer | None, LlmQueryExpander | None]:
    """The summarizer and the query expander that are switched on (None for the others).

    Each has its own runtime client and so its own circuit breaker: slow summaries of a
    big ingest must not open the breaker the searches' expander goes through.
    """
    runtime = settings.runtime
    if runtime is None:
        return None, None
    summarizer = expander = None
    if settings.summaries:
        summarizer = LlmSummarizer(
            OpenAiChatRuntime(runtime, http),
            model=runtime.default_model,
            timeout_s=runtime.timeout_s,
            concurrency=settings.summary_concurrency,
            budget_s=settings.summary_budget_s,
        )
    if settings.query_variants:
        timeout_s = min(runtime.timeout_s, settings.query_variants_timeout_s)
        expander = LlmQueryExpander(
            OpenAiChatRuntime(replace(runtime, timeout_s=timeout_s), http),
            model=runtime.default_model,
            timeout_s=timeout_s,
            cache_size=settings.query_variants_cache,
        )
    log.info(
        "llm assistance",
        extra={"summaries": settings.summaries, "query_variants": settings.query_variants,
               "model": runtime.default_model},
    )  # fmt: skip
    return summarizer, expander


@dataclass
class _Stack:
    """What `start` assembled: the search backend and what it holds open."""

    engine: SearchBackend
    backend: str
    reranker: Reranker | None = None
    rerank_http: httpx.AsyncClient | None = None
    ingestor: Ingestor | None = None
    index: VectorIndex | None = None
    optimizer: IndexOptimizer | None = None
    http: httpx.AsyncClient | None = None
    pdf_reader: PdfWorker | None = None

    @property
    def reranker_kind(self) -> str:
        if isinstance(self.reranker, RerankClient):
            return "http"
        return "none" if self.reranker is None else "local-model"

    async def close(self) -> None:
        if self.optimizer is not None:
            await self.optimizer.stop()
        if self.index is not None:
            self.index.close()
        if self.http is not None:
            await self.http.aclose()
        if isinstance(self.reranker, RerankClient):
            await self.reranker.aclose()
        if self.rerank_http is not None:
            await self.rerank_http.aclose()
        if self.pdf_reader is not None:
            await asyncio.to_thread(self.pdf_reader.close)  # waits for the child to exit


def _open_reranker(
    settings: RetrievalSettings, tracing: Tracing | None
) -> tuple[Reranker | None, httpx.AsyncClient | None]:
    """The reranker and, when tracing, the traced HTTP client it calls through."""
    # The reranker's HTTP calls as spans: a traced client of ours (closed with the stack),
    # else the client's own.
    rerank_http = (
        traced_async_client(tracing, peer="reranker", propagate=True)
        if tracing is not None and settings.rerank.url and not settings.rerank.model_path
        else None
    )
    # A local reranker's model loads here, and files that are not a usable cross-encoder
    # stop the start (SettingsError) before any store is open.
    reranker = None if settings.mock_mode else build_reranker(settings.rerank, rerank_http)
    return reranker, rerank_http


def _open_ingestor(
    settings: RetrievalSettings,
    store: DocumentStore,
    index: VectorIndex,
    embedder: Embedder,
    sections: SectionCatalog,
    summarizer: LlmSummarizer | None,
    pdf_reader: PdfWorker,
) -> tuple[Ingestor, int]:
    """The ingestor, after recovering what the journal left; and the index's point count
    (-1 when the index is unavailable)."""
    ingestor = Ingestor(
        store=store,
        index=index,
        embedder=embedder,
        sections=sections,
        journal=IngestJournal(settings.journal_path),
        max_document_bytes=settings.max_document_bytes,
        chunking=settings.chunking,
        summarizer=summarizer,
        pdf_reader=pdf_reader,
    )
    try:
        recovered = ingestor.recover()
        ingestor.complete_stored_documents()
        points = index.count()
    except IndexUnavailableError as exc:
        # Serve anyway: searches answer backend_unavailable (502) until the store is back,
        # health says so, and the journal keeps what recovery still has to do.
        log.warning("index unavailable at start", extra={"error": str(exc)})
        recovered, points = 0, -1
    log.info(
        "index open",
        extra={"backend": index.backend, "points": points, "recovered": recovered,
               "embedder": embedder.name},
    )  # fmt: skip
    return ingestor, points


def _optimizer(
    settings: RetrievalSettings, index: VectorIndex, ingestor: Ingestor, points: int
) -> IndexOptimizer | None:
    """Edge runs no optimizers of its own (HNSW, merges, vacuum): without this a shard
    filled through IngestDocument would be searched unindexed for good."""
    if not isinstance(index, EdgeIndex) or settings.index.optimize_quiet_s <= 0:
        return None
    optimizer = IndexOptimizer(
        index, quiet_s=settings.index.optimize_quiet_s, busy=lambda: ingestor.ingesting > 0
    )
    if points >= 0:  # the shard opened: index what an earlier run left, then serve
        optimizer.run_blocking()
    return optimizer


def _search_stack(
    settings: RetrievalSettings,
    store: DocumentStore,
    tracing: Tracing | None,
    registry: CollectorRegistry,
    reranker: Reranker | None,
) -> _Stack:
    """The real search stack: embedder, index, ingestion, optional LLM assistance, engine."""
    embedder = build_embedder(
        settings.embedding,
        traced_client(
            tracing, peer="embeddings", propagate=True, timeout=settings.embedding.timeout_s
        )
        if tracing is not None and settings.embedding.profile == "remote"
        else None,
    )
    index = open_index(settings, embedder.dim)
    sections = SectionCatalog(store)
    http, summarizer, expander = None, None, None
    if settings.llm.runtime is not None:
        http = traced_async_client(
            tracing, peer="llm-runtime", propagate=True, follow_redirects=False
        )
        summarizer, expander = llm_assistants(settings.llm, http)
    pdf_reader = PdfWorker()
    ingestor, points = _open_ingestor(
        settings, store, index, embedder, sections, summarizer, pdf_reader
    )
    engine = RetrievalEngine(
        index=index,
        embedder=embedder,
        sections=sections,
        chunks=store,
        tokenizer=default_tokenizer(),
        defaults=settings.defaults,
        settings=settings.engine,
        breaker=CircuitBreaker(
            "vector store",
            settings.index.breaker,
        ),
        reranker=reranker,
        synonyms=load_synonyms(settings.synonyms_path or None),
        expander=expander,
        metrics=RetrievalMetrics(registry),
    )
    return _Stack(
        engine,
        index.backend,
        reranker=reranker,
        ingestor=ingestor,
        index=index,
        optimizer=_optimizer(settings, index, ingestor, points),
        http=http,
        pdf_reader=pdf_reader,
    )


def _health_probe(
    settings: RetrievalSettings, store: DocumentStore | None, stack: _Stack
) -> Callable[[], dict[str, str]]:
    """The health answer: backend, docstore ("none" in mock mode, which opens none),
    reranker and index state; in production a down vector store fails it
    (backend_unavailable)."""

    def probe() -> dict[str, str]:
        stored = store_health(store) if store is not None else {"docstore": "none"}
        details = {"backend": stack.backend, "docstore": stored["docstore"],
                   "reranker": stack.reranker_kind}  # fmt: skip
        if stored.get("status", "ok") != "ok":
            return {"status": "down", **details}
        if stack.index is not None:
            state = stack.index.health()
            details.update({f"index_{k}": v for k, v in state.items() if k != "status"})
            details["index"] = state.get("status", "ok")
            if stack.optimizer is not None:
                details.update({f"index_{k}": v for k, v in stack.optimizer.details().items()})
            if state.get("status") != "ok" and settings.production:
                # Production: health fails, so probes and load balancers take this replica out.
                raise errors.BackendUnavailableError("the vector store is down", metadata=details)
        details["production"] = str(settings.production).lower()
        return {"status": "ok", **details}

    return probe


async def start(settings: RetrievalSettings) -> tuple[RunningServer, Closer]:
    quiet_http_client_logs()
    registry = CollectorRegistry()
    tracing = install_tracing(settings.server.tracing, settings.server.service)
    reranker, rerank_http = _open_reranker(settings, tracing)
    store: DocumentStore | None = None
    if settings.mock_mode:
        # Fixed hits from memory (retrieval-v1 §5): no document store is opened (no data
        # directory or database needed), and no ingestion is served, which would need one.
        stack = _Stack(MockSearchEngine(settings.defaults), "mock")
    else:
        store = settings.docstore.open()
        stack = _search_stack(settings, store, tracing, registry, reranker)
    stack.rerank_http = rerank_http
    probe = _health_probe(settings, store, stack)

    def register(server):  # type: ignore[no-untyped-def]
        retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(
            RetrievalServicer(stack.engine, probe), server
        )
        if stack.ingestor is not None:
            retrieval_pb2_grpc.add_IngestionServiceServicer_to_server(
                IngestionServicer(stack.ingestor), server
            )

    running = await start_server(
        settings.server,
        register,
        # Only what this process serves is advertised (mock mode serves no ingestion).
        SERVICE_NAMES if stack.ingestor is not None else SERVICE_NAMES[:1],
        registry,
        domain="visior.retrieval",
        tracing=tracing,
    )
    if stack.optimizer is not None:
        stack.optimizer.start()
    watcher = (
        asyncio.create_task(watch_probe(running, probe))
        if settings.production and stack.index is not None
        else None
    )

    async def close() -> None:
        if watcher is not None:
            watcher.cancel()
        await stack.close()
        if store is not None:
            store.close()

    return running, close
