"""The typed client's errors as callers read them."""

from google.rpc import error_details_pb2
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from services.client.errors import InvalidArgument, from_grpc_error


def _error(metadata: dict[str, str]) -> InvalidArgument:
    info = error_details_pb2.ErrorInfo(reason="LIMIT_EXCEEDED", domain="visior.retrieval")
    for key, value in metadata.items():
        info.metadata[key] = value
    err = from_grpc_error(GRPCError(Status.INVALID_ARGUMENT, "max_results is 51", [info]))
    assert isinstance(err, InvalidArgument)
    return err


def test_metadata_is_sorted_by_key_whatever_order_the_map_came_in() -> None:
    one = _error({"limit": "50", "field": "max_results", "downstream": "retrieval"})
    other = _error({"field": "max_results", "downstream": "retrieval", "limit": "50"})
    assert list(one.metadata) == ["downstream", "field", "limit"]
    assert str(one.metadata) == str(other.metadata)
    assert one.reason == "LIMIT_EXCEEDED" and one.domain == "visior.retrieval"


def test_an_error_without_error_info_has_empty_metadata() -> None:
    err = from_grpc_error(GRPCError(Status.INVALID_ARGUMENT, "bad"))
    assert err.metadata == {} and err.reason == "INVALID_ARGUMENT"
