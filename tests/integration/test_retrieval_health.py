"""Retrieval health reports the vector store; in production mode a down store fails health."""

from __future__ import annotations

import grpc
import pytest
from visior.retrieval.v1 import retrieval_pb2 as pb
from visior.retrieval.v1 import retrieval_pb2_grpc as pbg

from services.common.status import error_info
from services.common.topology import free_ports
from tests.retrieval_server import retrieval_channel


async def _health(tmp_path, production: bool):
    env = {
        "RETR_INDEX_BACKEND": "qdrant", "QDRANT_URL": f"http://127.0.0.1:{free_ports(1)[0]}",
        "RETR_INDEX_TIMEOUT_S": "0.2", "RETR_PRODUCTION": str(production).lower(),
    }  # fmt: skip
    async with retrieval_channel(tmp_path, **env) as channel:
        return await pbg.RetrievalServiceStub(channel).GetHealth(pb.GetHealthRequest())


async def test_a_down_store_is_reported_but_served_outside_production(tmp_path):
    health = await _health(tmp_path, production=False)
    assert health.status == "ok"
    assert health.details["index"] == "down" and health.details["backend"] == "qdrant"


async def test_a_down_store_fails_health_in_production(tmp_path):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _health(tmp_path, production=True)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert error_info(info.value).reason == "backend_unavailable"
