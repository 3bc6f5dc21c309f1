"""gRPC adapter for the tools proxy's search port: RetrievalService.Search."""

from __future__ import annotations

import grpc
from visior.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc

from services.common.status import call_downstream
from services.toolsproxy.search_tools import SearchCall, SearchHitView


class GrpcSearcher:
    """Searcher over RetrievalService.Search (deadline and retries come from the channel)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)

    async def search(self, call: SearchCall) -> list[SearchHitView]:
        tag = call.filters.get("tag", "")
        request = retrieval_pb2.SearchRequest(
            query=call.query,
            tenant_id=call.tenant_id,
            max_results=call.top_k,
            filters=retrieval_pb2.SearchFilters(
                doc_ids=list(call.doc_ids), source=call.source, tags=[tag] if tag else []
            ),
            trace_id=call.trace_id,
        )
        response = await call_downstream(self._stub.Search, request, "retrieval")
        titles = {(s.doc_id, s.section_id): s.title for s in response.used_sections}
        return [
            SearchHitView(
                doc_id=h.doc_id, section_id=h.section_id, chunk_id=h.chunk_id,
                title=titles.get((h.doc_id, h.section_id), ""), text=h.text, score=h.score,
                page_start=h.page_start, page_end=h.page_end,
            )
            for h in response.hits
        ]  # fmt: skip
