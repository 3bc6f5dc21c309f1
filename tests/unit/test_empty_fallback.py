"""RETR_EMPTY_ON_BACKEND_ERROR (retrieval.md §7.2: "вернуть пустой список чанков"): with the
flag on, every backend a search needs being down (the vector store, the embedding backend,
the document store) answers an empty result, logged and counted; with it off each stays
UNAVAILABLE backend_unavailable. A caller's mistake is refused either way."""

from __future__ import annotations

import logging

import grpc
import pytest
from prometheus_client import CollectorRegistry
from visior.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc

from services.common import errors
from services.common.breaker import BreakerPolicy, CircuitBreaker
from services.common.status import error_info
from services.common.tokenizer import default_tokenizer
from services.common.topology import free_ports
from services.docstore.errors import StoreUnavailableError
from services.retrieval.embeddings import EmbeddingBackendError
from services.retrieval.engine import EngineSettings, RetrievalEngine
from services.retrieval.metrics import RetrievalMetrics
from services.retrieval.rerank import RerankResult
from services.retrieval.search import SearchDefaults
from services.retrieval.sections import SectionCatalog
from tests.retrieval_server import retrieval_channel
from tests.unit.test_retrieval_metrics import sample
from tests.unit.test_search import Stack, embedder, q, shared  # noqa: F401


class DownEmbedder:
    """The remote embedding backend unreachable: every query embedding fails."""

    def __init__(self, inner) -> None:
        self.inner, self.name = inner, inner.name
        self.calls = 0

    @property
    def dim(self) -> int:
        return self.inner.dim

    def embed_queries(self, texts):
        self.calls += 1
        raise EmbeddingBackendError("embedding backend unreachable: ConnectError", retryable=True)

    def embed_passages(self, texts):
        raise AssertionError("a search embeds no passages")


class DownStore:
    """The document store down for the reads named in `down` (ChunkStore and
    DocumentSource methods); the others pass through to `store`."""

    def __init__(self, store, *down: str) -> None:
        self.store, self.down = store, set(down)
        self.failed: list[str] = []

    def __getattr__(self, name):
        if name in self.down:

            def fail(*args, **kwargs):
                self.failed.append(name)
                raise StoreUnavailableError(
                    "document store (PostgreSQL db:5432): connection refused"
                )

            return fail
        return getattr(self.store, name)


class Keep:
    """A reranker that keeps the order it was given."""

    async def rerank(self, query: str, texts: list[str]) -> list[RerankResult]:
        return [RerankResult(i, 1.0 - 0.01 * i) for i in range(len(texts))]


def engine(
    stack: Stack,
    registry: CollectorRegistry,
    *,
    empty: bool,
    embedder_=None,
    chunks=None,
    sections=None,
    reranker=None,
) -> RetrievalEngine:
    return RetrievalEngine(
        index=stack.index, embedder=embedder_ or stack.engine._embedder,
        sections=sections or SectionCatalog(stack.store), chunks=chunks or stack.store,
        tokenizer=default_tokenizer(), defaults=SearchDefaults(),
        settings=EngineSettings(empty_on_backend_error=empty),
        breaker=CircuitBreaker("vector store", BreakerPolicy(3, 60)),
        reranker=reranker, metrics=RetrievalMetrics(registry),
    )  # fmt: skip


def outages(shared: Stack) -> dict[str, dict]:  # noqa: F811
    """Engine arguments for each outage, by name, and the reads each one fails."""
    return {
        "embedder": {"embedder_": DownEmbedder(shared.engine._embedder)},
        # Reading the ranked candidates' fields, before any shaping.
        "store: candidates": {"chunks": DownStore(shared.store, "points_by_ids")},
        # Reading the hits' texts.
        "store: texts": {"chunks": DownStore(shared.store, "chunks_by_ids")},
        # Reading the sections' titles and summaries while shaping the answer; with rerank
        # that runs after the reranker, in a hop of its own.
        "store: sections": {"sections": SectionCatalog(DownStore(shared.store, "get_document"))},
        "store: sections after rerank": {
            "sections": SectionCatalog(DownStore(shared.store, "get_document")),
            "reranker": Keep(),
        },
    }


OUTAGES = [
    "embedder", "store: candidates", "store: texts", "store: sections",
    "store: sections after rerank",
]  # fmt: skip


@pytest.mark.parametrize("outage", OUTAGES)
async def test_with_the_flag_on_a_down_backend_answers_empty_logged_and_counted(
    shared,  # noqa: F811
    outage,
    caplog,
):
    registry = CollectorRegistry()
    e = engine(shared, registry, empty=True, **outages(shared)[outage])
    request = q(enable_rerank=True) if "rerank" in outage else q()
    with caplog.at_level(logging.WARNING, logger="visior.retrieval.engine"):
        r = await e.search(request)
    assert (r.hits, r.chunks, r.docs, r.sections) == ([], [], [], [])
    assert r.backend == "qdrant-edge" and r.mode == "section_first"
    assert sample(registry, "retrieval_errors_total", reason="backend_unavailable") == 1
    assert sample(registry, "backend_unavailable_total") == 1
    # Answered, but counted under the outage's reason, as retrieval_errors_total counts it.
    assert sample(registry, "retrieval_requests_total", outcome="backend_unavailable") == 1
    assert sample(registry, "retrieval_requests_total", outcome="ok") == 0
    [record] = [r for r in caplog.records if "answering empty" in r.getMessage()]
    assert record.backend == ("embedder" if outage == "embedder" else "docstore")


@pytest.mark.parametrize("outage", OUTAGES)
async def test_with_the_flag_off_a_down_backend_stays_backend_unavailable(
    shared,  # noqa: F811
    outage,
):
    registry = CollectorRegistry()
    e = engine(shared, registry, empty=False, **outages(shared)[outage])
    request = q(enable_rerank=True) if "rerank" in outage else q()
    with pytest.raises(errors.BackendUnavailableError) as info:
        await e.search(request)
    assert info.value.code == errors.UNAVAILABLE
    assert info.value.reason == "backend_unavailable"
    assert sample(registry, "retrieval_errors_total", reason="backend_unavailable") == 1
    assert sample(registry, "retrieval_requests_total", outcome="backend_unavailable") == 1
    assert sample(registry, "retrieval_requests_total", outcome="ok") == 0


@pytest.mark.parametrize("outage", OUTAGES)
async def test_the_outage_is_hit_where_it_is_named(shared, outage):  # noqa: F811
    """Each stand-in is called by the search (a test of the tests: an outage nothing reads
    would pass the two above for nothing)."""
    args = outages(shared)[outage]
    e = engine(shared, CollectorRegistry(), empty=True, **args)
    await e.search(q(enable_rerank=True) if "rerank" in outage else q())
    if "embedder_" in args:
        assert args["embedder_"].calls == 1
    elif "chunks" in args:
        assert args["chunks"].failed
    else:
        assert args["sections"]._source.failed == ["get_document"]


@pytest.mark.parametrize(
    ("kw", "error"),
    [
        ({"max_results": 51}, errors.LimitExceededError),
        ({"query": ""}, errors.InvalidArgumentError),
        ({"ranking": "bogus"}, errors.InvalidArgumentError),
        ({"tenant_id": ""}, errors.InvalidArgumentError),
    ],
)
async def test_with_the_flag_on_a_callers_mistake_is_still_refused(shared, kw, error):  # noqa: F811
    registry = CollectorRegistry()
    e = engine(shared, registry, empty=True, embedder_=DownEmbedder(shared.engine._embedder),
               chunks=DownStore(shared.store, "points_by_ids", "chunks_by_ids"))  # fmt: skip
    with pytest.raises(error) as info:
        await e.search(q(**kw))
    assert info.value.code == errors.INVALID_ARGUMENT
    assert sample(registry, "backend_unavailable_total") == 0


# -- through the service, as retrieval.md §7.2's caller sees it -----------------------------


def remote_embedder_down() -> dict[str, str]:
    """A remote embedding backend at a port nobody listens on."""
    return {
        "RETR_EMBEDDING_PROFILE": "remote",
        "RETR_EMBEDDING_URL": f"http://127.0.0.1:{free_ports(1)[0]}/v1",
        "RETR_EMBEDDING_MODEL": "m", "RETR_EMBEDDING_DIM": "384",
        "RETR_EMBEDDING_TIMEOUT_S": "0.5",
    }  # fmt: skip


async def test_a_down_embedder_answers_empty_through_the_service_with_the_flag_on(tmp_path):
    env = {**remote_embedder_down(), "RETR_EMPTY_ON_BACKEND_ERROR": "true"}
    async with retrieval_channel(tmp_path, **env) as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        r = await stub.Search(retrieval_pb2.SearchRequest(query="LDAP settings", tenant_id="t1"))
        assert (list(r.hits), list(r.chunks)) == ([], [])
        with pytest.raises(grpc.aio.AioRpcError) as info:  # a caller's mistake still fails
            await stub.Search(retrieval_pb2.SearchRequest(query="", tenant_id="t1"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_down_embedder_is_backend_unavailable_through_the_service_with_the_flag_off(
    tmp_path,
):
    async with retrieval_channel(tmp_path, **remote_embedder_down()) as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Search(retrieval_pb2.SearchRequest(query="LDAP settings", tenant_id="t1"))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    found = error_info(info.value)
    assert found is not None and found.reason == "backend_unavailable"
