"""The typed client follows the services' rules: how a gRPC target is written, what may be retried."""

import pytest
from google.rpc import error_details_pb2
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

from services.client.client import Target
from services.client.errors import Unavailable, from_exception, from_grpc_error
from services.common.settings import SettingsError, grpc_address, grpc_target


@pytest.mark.parametrize(
    ("value", "target"),
    [
        ("grpc://llm:50052", Target("llm", 50052)),
        ("http://retrieval:50053/", Target("retrieval", 50053)),
        ("dns:///orchestrator:50051", Target("orchestrator", 50051)),
        ("grpc://[::1]:50053", Target("::1", 50053)),
    ],
)
def test_target_takes_the_urls_the_services_url_settings_take(value, target):
    assert Target.parse(value, "h") == target
    assert str(target) == grpc_target(value, "X").replace("[", "").replace("]", "")


@pytest.mark.parametrize(
    ("value", "target"),
    [
        ("svc:50053", Target("svc", 50053)),
        ("[::1]:50053", Target("::1", 50053)),
        (":50051", Target("h", 50051)),
        ("grpc://:50051", Target("h", 50051)),
        (7, Target("h", 7)),
        (("svc", "8"), Target("svc", 8)),
    ],
)
def test_target_keeps_its_own_forms(value, target):
    assert Target.parse(value, "h") == target


@pytest.mark.parametrize("value", ["no-port", "svc:", "http://svc", "svc:port", "", "50051"])
def test_target_refuses_what_is_not_host_port(value):
    with pytest.raises(ValueError, match="is not host:port"):
        Target.parse(value, "h")


def test_a_service_setting_still_needs_a_host():
    with pytest.raises(SettingsError):
        grpc_target(":50051", "X")
    assert grpc_address(":50051", "X", default_host="h") == ("h", 50051)
    assert grpc_target("[::1]:50051", "X") == "[::1]:50051"  # grpc's own spelling, kept


def _unavailable(*details: object) -> Unavailable:
    err = from_grpc_error(GRPCError(Status.UNAVAILABLE, "down", list(details)))
    assert isinstance(err, Unavailable)
    return err


def test_a_transport_unavailable_is_retryable():
    assert _unavailable().retryable is True
    refused = from_exception(ConnectionRefusedError("refused"))
    assert isinstance(refused, Unavailable) and refused.retryable is True


def test_a_connection_lost_after_the_request_went_out_is_not_retryable():
    # grpclib's StreamTerminatedError: the request was sent, the handler may have run.
    dropped = from_exception(StreamTerminatedError("Connection lost"))
    assert isinstance(dropped, Unavailable) and dropped.handler_may_have_run
    assert dropped.retryable is False


def test_a_handlers_own_unavailable_is_not_retryable():
    # e.g. the LLM service after its runtime timed out: the handler ran and retried already.
    info = error_details_pb2.ErrorInfo(reason="LLM_RUNTIME_ERROR", domain="visior.llm")
    err = _unavailable(info)
    assert err.reason == "LLM_RUNTIME_ERROR" and err.retryable is False


@pytest.mark.parametrize("status", [Status.INVALID_ARGUMENT, Status.INTERNAL, Status.UNKNOWN])
def test_no_other_status_is_retryable(status):
    assert from_grpc_error(GRPCError(status, "no")).retryable is False
