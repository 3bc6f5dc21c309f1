"""The orchestrator's document sizes against a real grpc.aio IngestionService that cuts
its pages short, as Retrieval does for large documents (its response byte budget)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from visior.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc

from services.orchestrator.clients import GrpcRetriever
from services.orchestrator.model import User


class _Ingestion(retrieval_pb2_grpc.IngestionServiceServicer):
    """Holds d0..d4 (chars 100, 101, ...; tokens 40, 41, ...) and answers at most `per_page`
    of them a page."""

    def __init__(self, per_page: int) -> None:
        self.per_page = per_page
        self.requests: list[retrieval_pb2.ListDocumentsRequest] = []

    async def ListDocuments(self, request, context):  # type: ignore[no-untyped-def]
        self.requests.append(request)
        held = [f"d{i}" for i in range(5)]
        asked = [d for d in held if d in set(request.doc_ids)]
        start = int(request.page_token or 0)
        page = asked[start : start + min(self.per_page, request.page_size)]
        end = start + len(page)
        return retrieval_pb2.ListDocumentsResponse(
            documents=[
                retrieval_pb2.DocumentInfo(
                    doc_id=d, title=d.upper(), chars=100 + int(d[1:]), tokens=40 + int(d[1:])
                )
                for d in page
            ],
            next_page_token=str(end) if end < len(asked) else "",
        )


@pytest.fixture
async def serve() -> AsyncIterator:  # type: ignore[type-arg]
    started: list[tuple[grpc.aio.Server, grpc.aio.Channel]] = []

    async def start(per_page: int) -> tuple[_Ingestion, GrpcRetriever]:
        servicer = _Ingestion(per_page)
        server = grpc.aio.server()
        retrieval_pb2_grpc.add_IngestionServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        started.append((server, channel))
        return servicer, GrpcRetriever(channel)

    yield start
    for server, channel in started:
        await channel.close()
        await server.stop(None)


@pytest.mark.parametrize("per_page", [1, 2, 5])
async def test_every_page_is_read_when_retrieval_cuts_them_short(serve, per_page) -> None:
    servicer, retriever = await serve(per_page)
    asked = ("d0", "d1", "d3", "d4", "missing")
    sizes = await retriever.document_sizes(User("t", "u"), asked)
    assert sizes == {
        "d0": (100, 40, "D0"),
        "d1": (101, 41, "D1"),
        "d3": (103, 43, "D3"),
        "d4": (104, 44, "D4"),
    }
    assert all(list(r.doc_ids) == list(asked) for r in servicer.requests)
    # Each request continues with the token of the page before; no page is asked twice.
    tokens = ["", *(str(end) for end in range(per_page, 4, per_page))]
    assert [r.page_token for r in servicer.requests] == tokens


async def test_no_ids_asks_nothing(serve) -> None:
    servicer, retriever = await serve(5)
    assert await retriever.document_sizes(User("t", "u"), ()) == {}
    assert servicer.requests == []
