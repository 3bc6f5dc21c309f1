"""A data dir written before the document store listed each document's index points is
searchable after an upgrade: the retrieval server lists them at start (complete_stored_documents)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from visior.retrieval.v1 import retrieval_pb2 as pb
from visior.retrieval.v1 import retrieval_pb2_grpc as pbg

from tests.retrieval_server import retrieval_channel

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "docs" / "vacation-policy.md"


async def _serve_and(tmp_path: Path, ingest: bool) -> list[pb.SearchHit]:
    async with retrieval_channel(tmp_path, RETR_OPTIMIZE_QUIET_S="0") as channel:
        if ingest:
            await pbg.IngestionServiceStub(channel).IngestDocument(
                pb.IngestDocumentRequest(
                    tenant_id="t1", file_name=SAMPLE.name, content=SAMPLE.read_bytes()
                )
            )
        found = await pbg.RetrievalServiceStub(channel).Search(
            pb.SearchRequest(tenant_id="t1", query="vacation days")
        )
        return list(found.hits)


async def test_a_store_from_before_the_points_list_is_listed_at_start(tmp_path):
    hits = await _serve_and(tmp_path, ingest=True)
    assert hits
    conn = sqlite3.connect(tmp_path / "docstore.sqlite")
    assert conn.execute("SELECT count(*) FROM points").fetchone()[0] > 0
    conn.execute("DROP TABLE points")  # the schema of the previous version
    conn.commit()
    conn.close()
    again = await _serve_and(tmp_path, ingest=False)
    assert [(h.doc_id, h.chunk_id, h.score) for h in again] == [
        (h.doc_id, h.chunk_id, h.score) for h in hits
    ]
