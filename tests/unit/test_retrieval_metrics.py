"""retrieval_errors_total counts every failed search, by its error's reason (retrieval-v1 §7)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.common import errors
from services.common.breaker import BreakerPolicy, CircuitBreaker
from services.common.tokenizer import default_tokenizer
from services.retrieval.engine import BackendUnavailableError, EngineSettings, RetrievalEngine
from services.retrieval.index.server import QdrantServerIndex
from services.retrieval.metrics import RetrievalMetrics
from services.retrieval.search import SearchDefaults
from tests.unit.test_search import Stack, embedder, make_stack, q, shared  # noqa: F401


def metered(stack: Stack, registry: CollectorRegistry, **settings: bool) -> RetrievalEngine:
    e = stack.engine
    return RetrievalEngine(
        index=stack.index, embedder=e._embedder, sections=stack.sections, chunks=stack.store,
        tokenizer=default_tokenizer(), defaults=SearchDefaults(),
        settings=EngineSettings(**settings),
        breaker=CircuitBreaker("vector store", BreakerPolicy(3, 60)),
        metrics=RetrievalMetrics(registry),
    )  # fmt: skip


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """A sample's value as /metrics prints it (0 when absent)."""
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


async def test_a_refused_search_counts_under_its_reason(shared):  # noqa: F811
    registry = CollectorRegistry()
    engine = metered(shared, registry)
    with pytest.raises(errors.InvalidArgumentError) as info:
        await engine.search(q(max_results=51))
    reason = info.value.reason
    assert sample(registry, "retrieval_errors_total", reason=reason) == 1
    assert sample(registry, "backend_unavailable_total") == 0
    await engine.search(q())
    assert sample(registry, "retrieval_requests_total") == 1
    assert sample(registry, "retrieval_errors_total", reason=reason) == 1


async def test_a_down_backend_counts_once_per_search(tmp_path, embedder):  # noqa: F811
    index = QdrantServerIndex.from_url("http://127.0.0.1:9", "c", embedder.dim, timeout=0.2)
    registry = CollectorRegistry()
    engine = metered(make_stack(tmp_path, embedder, index=index), registry)
    for _ in range(2):
        with pytest.raises(BackendUnavailableError):
            await engine.search(q())
    assert sample(registry, "retrieval_errors_total", reason="backend_unavailable") == 2
    assert sample(registry, "backend_unavailable_total") == 2
    # Answering empty instead (RETR_EMPTY_ON_BACKEND_ERROR): the failure still counts, once.
    registry = CollectorRegistry()
    fallback = metered(
        make_stack(tmp_path / "f", embedder, index=index), registry, empty_on_backend_error=True
    )
    assert (await fallback.search(q())).hits == []
    assert sample(registry, "retrieval_errors_total", reason="backend_unavailable") == 1
    assert sample(registry, "backend_unavailable_total") == 1
