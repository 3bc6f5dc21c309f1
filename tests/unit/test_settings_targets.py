"""A gRPC target setting names a host grpc can resolve and a port: an IPv6 address goes in
brackets (`::1:50052` is a host name to grpc, which it cannot look up), a host of punctuation
alone is refused, and so is a target without a port; each refusal names the setting."""

from __future__ import annotations

import re

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.client.client import Target
from services.common.settings import Env, SettingsError, grpc_address, grpc_target
from services.orchestrator.config import OrchestratorSettings

SETTING = "ORCH_RETRIEVAL_URL"


def refused(value: str, match: str) -> None:
    """`value` is refused with `match`, naming the setting, by every reader of a target."""
    with pytest.raises(SettingsError, match=rf"^X={match}"):
        grpc_target(value, "X")
    with pytest.raises(SettingsError, match=rf"^X={match}"):
        grpc_address(value, "X", default_host="h")
    with pytest.raises(SettingsError, match=rf"^{SETTING}={match}"):
        OrchestratorSettings.from_env(Env({SETTING: value}))
    with pytest.raises(ValueError, match=rf"^target={match}"):
        Target.parse(value, "h")


@pytest.mark.parametrize(
    "value",
    ["::1:50052", "grpc://::1:50052", "http://::1:50052/", "dns:///::1:50052", ":::50052",
     "fe80::1:50052", "::1", "::"],
)  # fmt: skip
def test_an_ipv6_address_out_of_brackets_is_refused(value: str) -> None:
    refused(value, r".*an IPv6 address goes in brackets, before the port \(\[::1\]:50051\)")


@pytest.mark.parametrize(
    ("value", "target", "address"),
    [
        ("[::1]:50052", "[::1]:50052", ("::1", 50052)),
        ("grpc://[::1]:50052/", "[::1]:50052", ("::1", 50052)),
        ("[::]:1", "[::]:1", ("::", 1)),
        ("[fe80::1]:65535", "[fe80::1]:65535", ("fe80::1", 65535)),
        ("[::ffff:127.0.0.1]:50052", "[::ffff:127.0.0.1]:50052", ("::ffff:127.0.0.1", 50052)),
    ],
)
def test_an_ipv6_address_in_brackets_is_taken(
    value: str, target: str, address: tuple[str, int]
) -> None:
    assert grpc_target(value, "X") == target
    assert grpc_address(value, "X") == address
    assert OrchestratorSettings.from_env(Env({SETTING: value})).retrieval.target == target


@pytest.mark.parametrize(
    "value", ["[::1:50052", "[]:50052", "[127.0.0.1]:50052", "[localhost]:50052", "[:::]:50052"]
)
def test_brackets_around_what_is_not_an_ipv6_address_are_refused(value: str) -> None:
    refused(value, r".*is not an IPv6 address in brackets")


@pytest.mark.parametrize(
    "value",
    ["[::1]", "grpc://[::1]/", "[::1]50052", "[::1]x50052", "retrieval", "http://retrieval/",
     "retrieval:", "[::1]:"],
)  # fmt: skip
def test_a_target_without_a_port_is_refused(value: str) -> None:
    refused(value, r".* is not host:port$")


@pytest.mark.parametrize(
    "host", ["-", ".", "_", "..", "-.-", "a b", "h\u00e9", "r/x", "*", "%", "\u0661"]
)
def test_a_host_that_is_no_name_or_address_is_refused(host: str) -> None:
    refused(f"{host}:50052", rf".*'{re.escape(host)}' is not a host name or address$")


@pytest.mark.parametrize("host", ["a", "9", "a-b_c.d", "127.0.0.1", "-a", "a.", "_svc"])
def test_a_host_with_a_letter_or_digit_in_the_name_charset_is_taken(host: str) -> None:
    assert grpc_target(f"{host}:50052", "X") == f"{host}:50052"


async def test_a_bracketed_ipv6_target_reaches_a_server_there() -> None:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    try:
        port = server.add_insecure_port("[::1]:0")
    except RuntimeError:
        port = 0
    if port == 0:
        await server.stop(None)
        pytest.skip("no IPv6 loopback on this machine")
    await server.start()
    try:
        target = grpc_target(f"grpc://[::1]:{port}", "X")
        async with grpc.aio.insecure_channel(target) as channel:
            answer = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10
            )
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop(None)
