"""The retrieval server optimises its Edge shard in the background once ingestion pauses.

Qdrant Edge has no optimizers of its own: without this a shard filled through IngestDocument
would never get HNSW graphs, merged segments or vacuum.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from visior.retrieval.v1 import retrieval_pb2 as pb
from visior.retrieval.v1 import retrieval_pb2_grpc as pbg

from services.common.settings import Env
from services.retrieval import app
from services.retrieval.config import RetrievalSettings

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "docs" / "vacation-policy.md"


async def _runs(stub: pbg.RetrievalServiceStub, at_least: int) -> dict[str, str]:
    for _ in range(300):
        details = dict((await stub.GetHealth(pb.GetHealthRequest())).details)
        if (
            int(details["index_optimize_runs"]) >= at_least
            and details["index_optimizing"] == "false"
        ):
            return details
        await asyncio.sleep(0.05)
    raise AssertionError(f"no optimize run #{at_least}: {details}")


@contextlib.asynccontextmanager
async def _retrieval(tmp_path: Path, quiet_s: str) -> AsyncIterator[grpc.aio.Channel]:
    env = {
        "RETR_PORT": "0", "VISIOR_DATA_DIR": str(tmp_path), "RETR_EMBEDDING_PROFILE": "fast",
        "RETR_OPTIMIZE_QUIET_S": quiet_s,
    }  # fmt: skip
    running, close = await app.start(RetrievalSettings.from_env(Env(env)))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            yield channel
    finally:
        await running.server.stop(0)
        await close()


async def test_optimize_runs_at_start_and_after_ingestion_pauses(tmp_path):
    async with _retrieval(tmp_path, "0.3") as channel:
        search = pbg.RetrievalServiceStub(channel)
        first = await _runs(search, 1)  # the start-up run, before serving
        assert "index_optimize_error" not in first
        await pbg.IngestionServiceStub(channel).IngestDocument(
            pb.IngestDocumentRequest(
                tenant_id="t1", file_name=SAMPLE.name, content=SAMPLE.read_bytes()
            )
        )
        await _runs(search, 2)  # the run after the ingest's writes went quiet
        await asyncio.sleep(1.0)  # nothing written since: no third run
        details = await _runs(search, 2)
        assert details["index_optimize_runs"] == "2"
        found = await search.Search(pb.SearchRequest(tenant_id="t1", query="vacation days"))
        assert found.hits and found.hits[0].doc_id


async def test_zero_turns_the_optimizer_off(tmp_path):
    async with _retrieval(tmp_path, "0") as channel:
        health = await pbg.RetrievalServiceStub(channel).GetHealth(pb.GetHealthRequest())
        assert "index_optimize_runs" not in health.details
