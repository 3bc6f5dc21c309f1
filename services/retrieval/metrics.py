"""Retrieval metrics under the spec's names (retrieval.md §7.4, issue 3).

Every Search counts in `retrieval_requests_total{outcome}`, whatever its outcome: `ok`, or
the error's reason as the LLM service labels its requests (services/common/outcomes.py), so
that an error rate is `outcome!="ok"` over all of them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from services.common import errors
from services.retrieval.search import SearchResult

_MS_BUCKETS = (1, 2.5, 5, 10, 15, 20, 25, 35, 50, 75, 100, 150, 250, 500, 1000, 2500)


class RetrievalMetrics:
    """retrieval_requests_total{outcome}, retrieval_latency_ms, retrieval_mode_count{mode}, ..."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "retrieval_requests_total", "Searches, by outcome (ok, or the error's reason).",
            ["outcome"], registry=registry,
        )  # fmt: skip
        self.latency = Histogram(
            "retrieval_latency_ms", "Search time in milliseconds.", buckets=_MS_BUCKETS,
            registry=registry,
        )  # fmt: skip
        self.modes = Counter(
            "retrieval_mode_count", "Searches by retrieval mode.", ["mode"], registry=registry
        )
        self.hybrid = Counter(
            "retrieval_hybrid_usage_total", "Searches that fused dense and BM25.",
            registry=registry,
        )  # fmt: skip
        self.rerank = Counter(
            "retrieval_rerank_usage_total", "Searches that were reranked.", registry=registry
        )
        self.empty = Counter(
            "retrieval_empty_results_total", "Searches with no hit.", registry=registry
        )
        self.hits = Counter("retrieval_hits_total", "Hits returned.", registry=registry)
        self.errors = Counter(
            "retrieval_errors_total", "Searches that failed, by reason.", ["reason"],
            registry=registry,
        )  # fmt: skip
        self.backend_unavailable = Counter(
            "backend_unavailable_total",
            "Searches that found a backend down (the vector store, the embedder, the store).",
            registry=registry,
        )  # fmt: skip

    def finished(self, outcome: str) -> None:
        """One Search ended: `ok`, or the error's reason (an empty answer to a backend outage,
        RETR_EMPTY_ON_BACKEND_ERROR, is the outage's: it is counted a failure too)."""
        self.requests.labels(outcome).inc()

    def observe(self, result: SearchResult) -> None:
        """An answered search (an empty answer to an outage included): what it found."""
        self.latency.observe(result.elapsed_ms)
        self.modes.labels(result.mode).inc()
        if result.hybrid_used:
            self.hybrid.inc()
        if result.rerank_used:
            self.rerank.inc()
        if not result.hits:
            self.empty.inc()
        self.hits.inc(len(result.hits))

    def failed(self, reason: str) -> None:
        """A failed search, under its error's reason (INVALID_ARGUMENT, backend_unavailable, …)."""
        self.errors.labels(reason).inc()
        if reason == errors.BackendUnavailableError.default_reason:
            self.backend_unavailable.inc()
