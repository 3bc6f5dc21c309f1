"""retrieval_errors_total counts every failed search, by its error's reason (retrieval-v1 §7);
retrieval_requests_total{outcome} counts every search, `ok` or the error's reason, as the LLM
service's llm_requests_total{outcome} does (services/common/outcomes.py)."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from visior.retrieval.v1 import retrieval_pb2 as pb
from visior.retrieval.v1 import retrieval_pb2_grpc as pbg

from services.common import errors
from services.common.breaker import BreakerPolicy, CircuitBreaker
from services.common.context import deadline_var
from services.common.settings import Env
from services.common.status import error_info
from services.common.tokenizer import default_tokenizer
from services.retrieval import app
from services.retrieval.config import RetrievalSettings
from services.retrieval.engine import BackendUnavailableError, EngineSettings, RetrievalEngine
from services.retrieval.index.server import QdrantServerIndex
from services.retrieval.metrics import RetrievalMetrics
from services.retrieval.search import SearchDefaults
from tests.unit.test_search import Stack, embedder, make_stack, q, shared  # noqa: F401


def metered(
    stack: Stack, registry: CollectorRegistry, embedder_=None, **settings: bool
) -> RetrievalEngine:
    e = stack.engine
    return RetrievalEngine(
        index=stack.index, embedder=embedder_ or e._embedder, sections=stack.sections,
        chunks=stack.store,
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
    assert sample(registry, "retrieval_requests_total", outcome=reason) == 1
    assert sample(registry, "backend_unavailable_total") == 0
    await engine.search(q())
    assert sample(registry, "retrieval_requests_total", outcome="ok") == 1
    assert sample(registry, "retrieval_requests_total", outcome=reason) == 1
    assert sample(registry, "retrieval_errors_total", reason=reason) == 1


async def test_a_down_backend_counts_once_per_search(tmp_path, embedder):  # noqa: F811
    index = QdrantServerIndex.from_url("http://127.0.0.1:9", "c", embedder.dim, timeout=0.2)
    registry = CollectorRegistry()
    engine = metered(make_stack(tmp_path, embedder, index=index), registry)
    for _ in range(2):
        with pytest.raises(BackendUnavailableError):
            await engine.search(q())
    assert sample(registry, "retrieval_errors_total", reason="backend_unavailable") == 2
    assert sample(registry, "retrieval_requests_total", outcome="backend_unavailable") == 2
    assert sample(registry, "backend_unavailable_total") == 2
    # Answering empty instead (RETR_EMPTY_ON_BACKEND_ERROR): the failure still counts, once.
    registry = CollectorRegistry()
    fallback = metered(
        make_stack(tmp_path / "f", embedder, index=index), registry, empty_on_backend_error=True
    )
    assert (await fallback.search(q())).hits == []
    assert sample(registry, "retrieval_errors_total", reason="backend_unavailable") == 1
    assert sample(registry, "retrieval_requests_total", outcome="backend_unavailable") == 1
    assert sample(registry, "retrieval_requests_total", outcome="ok") == 0
    assert sample(registry, "backend_unavailable_total") == 1


class _Embedder:
    """The stack's embedder, whose query embedding waits for `release` and then raises
    `fails` (a bug, not a backend being down) or answers."""

    def __init__(self, inner, fails: Exception | None = None) -> None:
        self.inner, self.name, self.fails = inner, inner.name, fails
        self.release, self.entered = threading.Event(), threading.Event()

    @property
    def dim(self) -> int:
        return self.inner.dim

    def embed_queries(self, texts):
        self.entered.set()
        self.release.wait(5)
        if self.fails is not None:
            raise self.fails
        return self.inner.embed_queries(texts)


async def test_a_bug_counts_internal(shared):  # noqa: F811
    registry = CollectorRegistry()
    broken = _Embedder(shared.engine._embedder, fails=RuntimeError("a bug"))
    broken.release.set()
    with pytest.raises(RuntimeError):
        await metered(shared, registry, embedder_=broken).search(q())
    assert sample(registry, "retrieval_requests_total", outcome="INTERNAL") == 1
    assert sample(registry, "retrieval_errors_total", reason="INTERNAL") == 1


async def test_a_search_the_caller_left_counts_cancelled(shared):  # noqa: F811
    registry = CollectorRegistry()
    slow = _Embedder(shared.engine._embedder)
    task = asyncio.ensure_future(metered(shared, registry, embedder_=slow).search(q()))
    try:
        assert await asyncio.to_thread(slow.entered.wait, 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        slow.release.set()
    assert sample(registry, "retrieval_requests_total", outcome="CANCELLED") == 1
    assert sample(registry, "retrieval_requests_total", outcome="ok") == 0


async def test_a_failure_past_the_callers_deadline_counts_deadline_exceeded(shared):  # noqa: F811
    registry = CollectorRegistry()
    token = deadline_var.set(time.monotonic() - 1)
    try:
        with pytest.raises(errors.ServiceError):
            await metered(shared, registry).search(q(max_results=51))
    finally:
        deadline_var.reset(token)
    assert sample(registry, "retrieval_requests_total", outcome="DEADLINE_EXCEEDED") == 1


async def test_the_server_counts_every_search_by_outcome(tmp_path):
    """Through the real server: a refused search and an answered one, each under its
    outcome, so an error rate is outcome!="ok" over the total."""
    env = {"RETR_PORT": "0", "VISIOR_DATA_DIR": str(tmp_path), "RETR_EMBEDDING_PROFILE": "fast"}
    running, close = await app.start(RetrievalSettings.from_env(Env(env)))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pbg.RetrievalServiceStub(channel)
            await stub.Search(pb.SearchRequest(query="LDAP", tenant_id="acme"))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Search(pb.SearchRequest(query="LDAP", tenant_id="acme", max_results=51))
    finally:
        await running.server.stop(0)
        await close()
    reason = error_info(info.value).reason
    assert reason == "LIMIT_EXCEEDED"
    assert sample(running.registry, "retrieval_requests_total", outcome="ok") == 1
    assert sample(running.registry, "retrieval_requests_total", outcome=reason) == 1
