"""Mock mode (retrieval-v1 §5: an in-memory index of fixed data, for tests) opens no document
store: it needs no writable data directory and no database, and health says "none". It
serves no ingestion (which would need the store): only RetrievalService is registered."""

from __future__ import annotations

import grpc
import pytest
from visior.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc

from services.common.topology import free_ports
from services.docstore.config import DocstoreSettings
from tests.retrieval_server import retrieval_channel


def _never_opened(self, *args, **kwargs):
    raise AssertionError("mock mode opened the document store")


@pytest.fixture
def no_store(monkeypatch):
    monkeypatch.setattr(DocstoreSettings, "open", _never_opened)


async def test_mock_mode_opens_no_document_store_and_health_says_none(tmp_path, no_store):
    async with retrieval_channel(tmp_path, RETR_MOCK_MODE="true") as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        health = await stub.GetHealth(retrieval_pb2.GetHealthRequest())
        found = await stub.Search(retrieval_pb2.SearchRequest(query="LDAP", tenant_id="t1"))
    assert health.status == "ok"
    assert health.details["docstore"] == "none" and health.details["backend"] == "mock"
    assert found.hits and found.meta.backend == "mock"
    assert not (tmp_path / "docstore.sqlite").exists()


def _data_dir_under_a_file(tmp_path) -> dict[str, str]:
    """A data directory that cannot be created: a regular file stands where its parent is."""
    (tmp_path / "file").write_text("")
    return {"VISIOR_DATA_DIR": str(tmp_path / "file" / "data")}


def _unreachable_database(tmp_path) -> dict[str, str]:
    port = free_ports(1)[0]
    return {"METADATA_DB_URL": f"postgresql://u:p@127.0.0.1:{port}/db",
            "RETR_DOCSTORE_TIMEOUT_S": "0.5"}  # fmt: skip


@pytest.mark.parametrize("where", [_data_dir_under_a_file, _unreachable_database])
async def test_mock_mode_serves_without_a_writable_data_dir_or_a_database(tmp_path, where):
    env = {"RETR_MOCK_MODE": "true", **where(tmp_path)}
    async with retrieval_channel(tmp_path, **env) as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        health = await stub.GetHealth(retrieval_pb2.GetHealthRequest())
        found = await stub.Search(retrieval_pb2.SearchRequest(query="LDAP", tenant_id="t1"))
        ingestion = retrieval_pb2_grpc.IngestionServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await ingestion.ListDocuments(retrieval_pb2.ListDocumentsRequest(tenant_id="t1"))
    assert (health.status, health.details["docstore"]) == ("ok", "none")
    assert [h.chunk_id for h in found.hits] == ["chunk_1", "chunk_2", "chunk_3"]
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED  # no ingestion in mock mode
