"""proto3 `optional` fields: unset reads as None, an explicit zero or false as itself."""

from __future__ import annotations

from visior.orchestrator.v1 import orchestrator_pb2
from visior.retrieval.v1 import retrieval_pb2

from services.common.structs import optional


def test_an_unset_optional_field_is_none_and_a_zero_is_zero():
    assert optional(retrieval_pb2.SearchRequest(), "max_results") is None
    assert optional(retrieval_pb2.SearchRequest(max_results=0), "max_results") == 0
    assert optional(retrieval_pb2.SearchParams(enable_rerank=False), "enable_rerank") is False
    assert optional(retrieval_pb2.SearchParams(), "enable_rerank") is None
    update = orchestrator_pb2.UpdateConfigRequest(max_tool_steps=0)
    assert (optional(update, "max_tool_steps"), optional(update, "window_radius")) == (0, None)
