"""Request headers Envoy lets through reach the gRPC servers as metadata the servers take:
a gateway's large JWT or cookie is not refused by grpc's default limit (16 KiB) as a bare
RESOURCE_EXHAUSTED."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from services.common.server import RunningServer, server_options, start_server
from services.common.settings import ServerSettings
from services.common.shared_config import MAX_REQUEST_METADATA_BYTES
from services.common.topology import Ports
from services.devtools import envoy_config

KiB = 1024


@pytest.fixture
async def running() -> AsyncIterator[RunningServer]:
    server = await start_server(
        ServerSettings("toy", port=0), lambda s: None, (), CollectorRegistry(), domain="visior.toy"
    )
    yield server
    await server.stop(0)


async def _check(port: int, metadata: list[tuple[str, str]]) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), metadata=metadata, timeout=10
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_the_servers_take_metadata_up_to_the_shared_limit() -> None:
    options = dict(server_options(ServerSettings("toy")))
    assert options["grpc.max_metadata_size"] == MAX_REQUEST_METADATA_BYTES
    assert options["grpc.absolute_max_metadata_size"] == MAX_REQUEST_METADATA_BYTES


async def test_a_server_takes_a_40_kib_header(running: RunningServer) -> None:
    await _check(running.port, [("authorization", "Bearer " + "j" * 40 * KiB)])


async def test_a_server_takes_what_the_largest_listener_lets_through(
    running: RunningServer,
) -> None:
    """Envoy's largest request-line-and-headers limit (the retrieval listener's), spent on
    headers: one long cookie and the rest of Envoy's header count."""
    many = [(f"x-h{i}", "v") for i in range(envoy_config.ENVOY_MAX_HEADERS - 2)]
    cookie = envoy_config.MAX_REQUEST_HEADERS_KB * KiB - sum(len(k) + len(v) for k, v in many)
    await _check(running.port, [*many, ("cookie", "c" * cookie)])


def test_every_listener_lets_through_no_more_than_the_servers_take() -> None:
    config = yaml.safe_load(envoy_config.render(Ports(), "visior.pb"))
    for listener in config["static_resources"]["listeners"]:
        hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
        headers_kb = hcm.get("max_request_headers_kb", envoy_config.ENVOY_DEFAULT_HEADERS_KB)
        assert envoy_config.upstream_metadata_bytes(headers_kb) <= MAX_REQUEST_METADATA_BYTES


def test_a_listener_letting_through_more_than_the_servers_take_is_not_rendered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        envoy_config, "LISTENER_HEADERS_KB", {"retrieval": MAX_REQUEST_METADATA_BYTES // KiB}
    )
    with pytest.raises(ValueError, match="MAX_REQUEST_METADATA_BYTES"):
        envoy_config.render(Ports(), "visior.pb")
