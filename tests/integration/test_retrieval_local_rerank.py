"""The retrieval server started with RERANK_MODEL_PATH reranks with the local cross-encoder."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from visior.retrieval.v1 import retrieval_pb2 as pb
from visior.retrieval.v1 import retrieval_pb2_grpc as pbg

from services.common.settings import SettingsError
from services.retrieval.local_rerank import LocalCrossEncoder
from services.retrieval.rerank import RerankSettings
from tests.fakes.tiny_cross_encoder import write_model_dir
from tests.retrieval_server import retrieval_channel

QUERY = "ldap integration setup"
DOCS = {
    "guide.md": "# LDAP integration setup guide\n\nLDAP integration setup: open settings, then "
    "auth, and enter the LDAP server address for the LDAP integration setup.",
    "notes.md": "# Release notes\n\nLDAP sync of large groups is fixed. This is the relevant "
    "note, relevant for every release.",
    "weather.md": "# Weather\n\nThe weather report for today: daily backups are kept.",
}


async def _search(channel: grpc.aio.Channel, rerank: bool) -> pb.SearchResponse:
    params = pb.SearchParams(retrieval_mode="chunk_priority", enable_rerank=rerank)
    return await pbg.RetrievalServiceStub(channel).Search(
        pb.SearchRequest(tenant_id="t1", query=QUERY, params=params)
    )


async def test_search_reranks_with_the_local_model(tmp_path: Path) -> None:
    model = write_model_dir(tmp_path / "reranker")
    async with retrieval_channel(
        tmp_path / "data", RERANK_MODEL_PATH=str(model), RETR_OPTIMIZE_QUIET_S="0"
    ) as channel:
        ingest = pbg.IngestionServiceStub(channel)
        for name, text in DOCS.items():
            await ingest.IngestDocument(
                pb.IngestDocumentRequest(tenant_id="t1", file_name=name, content=text.encode())
            )
        plain = await _search(channel, rerank=False)
        reranked = await _search(channel, rerank=True)
        health = await pbg.RetrievalServiceStub(channel).GetHealth(pb.GetHealthRequest())
    assert health.details["reranker"] == "local-model"
    assert not plain.meta.rerank_used and reranked.meta.rerank_used
    assert plain.hits[0].doc_id != reranked.hits[0].doc_id  # the model changed the order
    # The order and the scores are the model's own for the hits' texts.
    local = LocalCrossEncoder(RerankSettings(model_path=str(model)))
    expected = await local.rerank(QUERY, [h.text for h in reranked.hits])
    assert [reranked.hits[r.index].chunk_id for r in expected] == [
        h.chunk_id for h in reranked.hits
    ]
    assert [h.score for h in reranked.hits] == pytest.approx([r.score for r in expected])
    assert "relevant" in reranked.hits[0].text


async def test_a_broken_model_directory_stops_the_server_at_start(tmp_path: Path) -> None:
    model = write_model_dir(tmp_path / "reranker")
    (model / "model.onnx").write_bytes(b"not an onnx graph")
    with pytest.raises(SettingsError, match="cannot load the ONNX model"):
        async with retrieval_channel(tmp_path / "data", RERANK_MODEL_PATH=str(model)):
            pass
    # The model loads before any store opens: nothing was created, nothing is left open.
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())
