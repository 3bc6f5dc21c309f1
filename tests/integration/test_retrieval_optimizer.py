"""The retrieval server optimises its Edge shard in the background once ingestion pauses.

Qdrant Edge has no optimizers of its own: without this a shard filled through IngestDocument
would never get HNSW graphs, merged segments or vacuum.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from visior.retrieval.v1 import retrieval_pb2 as pb
from visior.retrieval.v1 import retrieval_pb2_grpc as pbg

from tests.retrieval_server import retrieval_channel

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


async def test_optimize_runs_at_start_and_after_ingestion_pauses(tmp_path):
    async with retrieval_channel(tmp_path, RETR_OPTIMIZE_QUIET_S="0.3") as channel:
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
    async with retrieval_channel(tmp_path, RETR_OPTIMIZE_QUIET_S="0") as channel:
        health = await pbg.RetrievalServiceStub(channel).GetHealth(pb.GetHealthRequest())
        assert "index_optimize_runs" not in health.details
