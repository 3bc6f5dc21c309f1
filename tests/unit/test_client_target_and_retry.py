"""The typed client follows the services' rules: how a gRPC target is written, what may be
retried, which trace ids and metadata may be sent, how long a stream may stay silent."""

import pytest
from google.rpc import error_details_pb2
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from visior_sdk.visior.llm.v1 import GenerateRequest, GenerateStreamRequest
from visior_sdk.visior.llm.v1 import GetHealthRequest as LlmGetHealthRequest
from visior_sdk.visior.retrieval.v1 import SearchRequest
from visior_sdk.visior.toolsproxy.v1 import ExecuteRequest

from services.client.client import Target, VisiorClient, _body_trace
from services.client.errors import Unavailable, from_exception, from_grpc_error
from services.common.call_budgets import STREAM_IDLE_TIMEOUT_S
from services.common.settings import SettingsError, grpc_address, grpc_target
from services.common.topology import free_ports
from services.devtools.envoy import REPO_ROOT
from services.devtools.envoy_config import STREAM_IDLE
from services.devtools.mesh import local_envoy_timeouts


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


BAD_TRACE_IDS = ["трасса", "two words", "x" * 129, "id\n"]
"""Trace ids the services refuse (services.common.context.check_trace_id)."""


@pytest.mark.parametrize("trace_id", BAD_TRACE_IDS)
def test_a_trace_id_the_services_refuse_is_refused_when_the_client_is_built(trace_id):
    with pytest.raises(ValueError, match="trace_id"):
        VisiorClient({"retrieval": 1}, trace_id=trace_id)


@pytest.mark.parametrize(
    "metadata",
    [{"x-note": "значение"}, {"bad key": "v"}, {"grpc-timeout": "1S"}, {"x-trace-id": "a b"}],
)
def test_metadata_grpc_cannot_send_is_refused_when_the_client_is_built(metadata):
    with pytest.raises(ValueError, match=r"^metadata"):
        VisiorClient({"retrieval": 1}, metadata=metadata)


@pytest.mark.parametrize(
    ("metadata", "error", "match"),
    [
        ({"x-note": "значение"}, ValueError, "cannot be sent as gRPC metadata"),
        ({"x-trace-id": "a b"}, ValueError, "trace_id must be"),  # ASCII, yet no trace id
        ({"x-note-bin": "not bytes"}, TypeError, "-bin takes bytes"),
    ],
)
async def test_per_call_metadata_grpc_cannot_send_fails_before_sending(metadata, error, match):
    # Nobody listens on the port: an error raised while sending would be Unavailable.
    (port,) = free_ports(1)
    async with VisiorClient({"retrieval": port}) as visior:
        with pytest.raises(error, match=match):
            await visior.retrieval.search(SearchRequest(query="q"), metadata=metadata)


@pytest.mark.parametrize(
    ("request_", "trace"),
    [
        (ExecuteRequest(tool_name="t", trace_id="body-1"), "body-1"),
        (GenerateStreamRequest(request=GenerateRequest(trace_id="body-2")), "body-2"),
        (GenerateStreamRequest(), ""),
        (ExecuteRequest(tool_name="t"), ""),
        (LlmGetHealthRequest(), ""),  # no trace_id field
        *[(ExecuteRequest(tool_name="t", trace_id=bad), "") for bad in BAD_TRACE_IDS],
    ],
)
def test_the_trace_id_the_servers_log_a_request_under_is_its_bodys(request_, trace):
    # services.common.interceptors takes a body's trace_id over x-trace-id (the LLM service
    # GenerateStream's inner one); one it refuses is not sent as x-trace-id.
    assert _body_trace(request_) == trace


def test_the_client_page_names_the_local_models_stream_idle_timeout():
    # A typed client left at the default cuts streams the local-model mesh keeps open.
    local = local_envoy_timeouts()[STREAM_IDLE]
    assert local > STREAM_IDLE_TIMEOUT_S
    page = (REPO_ROOT / "docs" / "client.md").read_text(encoding="utf-8")
    assert f"Envoy's stream idle timeout to {local:g} s" in page
    assert "local_envoy_timeouts()[STREAM_IDLE]" in (VisiorClient.__doc__ or "")
