"""Where a server listens: one HOST setting feeds both the gRPC bind address and the metrics
exporter's, an IPv6 address in brackets or bare, and the exporter lets go of its port when
the server stops or fails to start, so a server started again in the same process binds it."""

from __future__ import annotations

import asyncio
import socket
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from services.common.server import (
    ListenError,
    RunningServer,
    bare_host,
    grpc_host,
    start_server,
)
from services.common.settings import ServerSettings
from services.common.topology import free_ports

CALL_TIMEOUT_S = 10.0
SERVING = health_pb2.HealthCheckResponse.SERVING


def _register_nothing(server: grpc.aio.Server) -> None:
    pass


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


needs_ipv6 = pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback here")


@pytest.fixture
def taken_v6_port() -> Iterator[int]:
    """A port another socket listens on at ::1."""
    if not _has_ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    with socket.socket(socket.AF_INET6) as holder:
        holder.bind(("::1", 0))
        holder.listen()
        yield holder.getsockname()[1]


async def _start(settings: ServerSettings) -> RunningServer:
    return await start_server(
        settings, _register_nothing, ("toy.v1.Toy",), CollectorRegistry(), domain="visior.toy"
    )


async def _health(target: str) -> int:
    async with grpc.aio.insecure_channel(target) as channel:
        answer = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT_S
        )
    return int(answer.status)


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=CALL_TIMEOUT_S) as answer:
        return str(answer.read().decode())


def _listening(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        return s.connect_ex((host, port)) == 0


@pytest.mark.parametrize(
    ("host", "grpc_form", "bare_form"),
    [
        ("::1", "[::1]", "::1"),
        ("[::1]", "[::1]", "::1"),
        ("::", "[::]", "::"),
        ("[fe80::1%eth0]", "[fe80::1%eth0]", "fe80::1%eth0"),
        ("127.0.0.1", "127.0.0.1", "127.0.0.1"),
        ("localhost", "localhost", "localhost"),
        ("", "", ""),
        ("[", "[", "["),  # no address: left as it is, for the bind to refuse
    ],
)
def test_each_listener_gets_the_host_in_its_own_form(
    host: str, grpc_form: str, bare_form: str
) -> None:
    assert grpc_host(host) == grpc_form
    assert bare_host(host) == bare_form


@needs_ipv6
@pytest.mark.parametrize("host", ["::1", "[::1]"])
async def test_an_ipv6_host_bare_or_in_brackets_serves_grpc_and_metrics(host: str) -> None:
    [metrics_port] = free_ports(1)
    running = await _start(ServerSettings("toy", host=host, port=0, metrics_port=metrics_port))
    try:
        assert running.metrics_port == metrics_port
        assert await _health(f"[::1]:{running.port}") == SERVING
        page = await asyncio.to_thread(_scrape, f"http://[::1]:{metrics_port}/metrics")
        assert "grpc_server_started_total" in page
    finally:
        await running.stop(0)


@needs_ipv6
@pytest.mark.parametrize("host", ["::1", "[::1]"])
async def test_a_taken_metrics_port_on_an_ipv6_host_names_the_metrics_address(
    host: str, taken_v6_port: int
) -> None:
    with pytest.raises(
        ListenError, match=rf"^cannot listen for metrics on \[::1\]:{taken_v6_port}:"
    ):
        running = await _start(ServerSettings("toy", host=host, port=0, metrics_port=taken_v6_port))
        await running.stop(0)  # only when the test fails


async def test_the_metrics_port_is_let_go_at_stop_and_taken_again_by_a_restart() -> None:
    [metrics_port] = free_ports(1)
    settings = ServerSettings("toy", port=0, metrics_port=metrics_port)
    for _ in range(2):  # the second start binds the port the first one held
        running = await _start(settings)
        assert running.metrics_port == metrics_port
        assert _listening("127.0.0.1", metrics_port)
        await running.stop(0)
        assert not _listening("127.0.0.1", metrics_port)
    await running.stop(0)  # stopping again does nothing


async def test_a_failed_start_lets_go_of_the_metrics_and_grpc_ports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One call: two distinct ports, kept from other workers until the servers bind them.
    metrics_port, grpc_port = free_ports(2)
    settings = ServerSettings("toy", port=grpc_port, metrics_port=metrics_port)

    async def fail(self: RunningServer, serving: bool) -> None:
        raise RuntimeError("the health servicer failed")

    with monkeypatch.context() as patched:
        patched.setattr(RunningServer, "set_serving", fail)
        with pytest.raises(RuntimeError, match="the health servicer failed"):
            await _start(settings)
    assert not _listening("127.0.0.1", metrics_port)
    assert not _listening("127.0.0.1", grpc_port)
    running = await _start(settings)  # a start in the same process binds both again
    try:
        assert (running.port, running.metrics_port) == (grpc_port, metrics_port)
    finally:
        await running.stop(0)
