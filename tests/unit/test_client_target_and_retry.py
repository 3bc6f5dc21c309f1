"""The typed client follows the services' rules: how a gRPC target is written, what may be
retried, which trace ids, metadata and timeouts may be sent, how long a stream may stay
silent."""

import pytest
from google.rpc import error_details_pb2
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.metadata import Deadline
from visior_sdk.visior.llm.v1 import GenerateRequest, GenerateStreamRequest
from visior_sdk.visior.llm.v1 import GetHealthRequest as LlmGetHealthRequest
from visior_sdk.visior.retrieval.v1 import SearchRequest
from visior_sdk.visior.toolsproxy.v1 import ExecuteRequest

from services.client.client import Target, VisiorClient, _body_trace
from services.client.errors import (
    ResourceExhausted,
    Unavailable,
    from_exception,
    from_grpc_error,
)
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


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (0, "the port is not in 1..65535"),
        (70000, "the port is not in 1..65535"),
        (("svc", 0), "the port is not in 1..65535"),
        (("svc", "70000"), "the port is not in 1..65535"),
        (("svc", "port"), "is not host:port"),
        (("svc", " 8"), "is not host:port"),
        (("svc", 8.0), "is not host:port"),
        (("svc", 1, 2), r"not \(host, port\)"),
        ((" svc", 50053), "' svc' is not a host name or address"),
        (("sv\nc", 50053), "'sv\\\\nc' is not a host name or address"),
        (("", 50053), "is not host:port"),
    ],
)
def test_every_target_form_refuses_what_the_string_form_refuses(value, match):
    with pytest.raises(ValueError, match=match):
        Target.parse(value, "h")


@pytest.mark.parametrize(
    ("host", "port"),
    [("h", 0), ("h", 65536), (" h", 1), ("", 1), ("h/x", 1), ("[::1]", 1), ("...", 1), ("é", 1)],
)
def test_a_target_built_directly_is_held_to_the_same_rule(host, port):
    with pytest.raises(ValueError, match=r"is not a host name or address|is not in 1\.\.65535"):
        Target(host, port)


@pytest.mark.parametrize("host", ["", " h", "h\t"])
def test_a_bare_port_on_a_host_that_is_none_is_refused(host):
    with pytest.raises(ValueError, match=r"is not host:port|is not a host name or address"):
        VisiorClient({"retrieval": 50053}, host=host)


@pytest.mark.parametrize("host", ["svc", "10.0.0.5", "::1", "fe80::1%eth0", "my_host-1.local"])
def test_a_target_built_directly_takes_what_the_string_form_takes(host):
    target = Target(host, 50053)
    bracketed = f"[{host}]" if ":" in host else host
    assert Target.parse(f"{bracketed}:50053", "h") == target


def test_a_pair_names_an_ipv6_host_as_a_string_does():
    assert Target.parse(("[::1]", 50053), "h") == Target.parse("[::1]:50053", "h")
    assert Target.parse(("::1", "50053"), "h") == Target("::1", 50053)
    assert Target.parse(50053, "::1") == Target("::1", 50053)


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -float("inf"), 0.0, -1.0])
def test_a_client_timeout_that_is_no_positive_finite_number_is_refused(timeout):
    with pytest.raises(ValueError, match="timeout must be a positive, finite number"):
        VisiorClient({"retrieval": 1}, timeout=timeout)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"timeout": float("inf")}, "timeout must be a finite number"),
        ({"timeout": float("nan")}, "timeout must be a finite number"),
        ({"deadline": Deadline.from_timeout(float("inf"))}, "deadline must be a finite"),
    ],
)
async def test_a_call_timeout_that_is_not_finite_fails_before_sending(options, match):
    # Nobody listens on the port: a call that went out would be Unavailable (or, for
    # infinity, grpclib's OverflowError while encoding grpc-timeout).
    (port,) = free_ports(1)
    async with VisiorClient({"retrieval": port}) as visior:
        with pytest.raises(ValueError, match=match):
            await visior.retrieval.search(SearchRequest(query="q"), **options)


def _busy(**metadata: str) -> ResourceExhausted:
    info = error_details_pb2.ErrorInfo(reason="SERVER_BUSY", domain="visior.retrieval")
    info.metadata.update(metadata)
    err = from_grpc_error(GRPCError(Status.RESOURCE_EXHAUSTED, "retry later", [info]))
    assert isinstance(err, ResourceExhausted)
    return err


def test_only_a_servers_own_busy_refusal_is_retryable():
    # services.common.interceptors refuses at its concurrency cap before any handler runs.
    assert _busy(limit="256", limit_name="max_concurrent_rpcs").retryable is True
    # A SERVER_BUSY passed on by a handler that ran: the Orchestrator's from retrieval
    # (services.common.status.from_rpc_error), the LLM tool loop's from ToolsProxy.
    passed_on = [
        {"downstream": "retrieval", "downstream_code": "RESOURCE_EXHAUSTED"},
        {"limit": "2", "limit_name": "max_consecutive_tool_errors", "downstream": "toolsproxy"},
        {"limit": "2", "limit_name": "max_concurrent_rpcs", "downstream": "retrieval"},
        {},
    ]
    assert [_busy(**metadata).retryable for metadata in passed_on] == [False] * 4
    info = error_details_pb2.ErrorInfo(reason="RATE_LIMIT_EXCEEDED", domain="visior.toolsproxy")
    info.metadata.update(limit_name="max_concurrent_rpcs")
    limited = from_grpc_error(GRPCError(Status.RESOURCE_EXHAUSTED, "slow down", [info]))
    assert limited.retryable is False
