"""Server bootstrap: interceptors, health, reflection, limits, keepalive, metrics, graceful stop."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry

from services.common.interceptors import ServerInterceptor
from services.common.metrics import RpcMetrics, serve_metrics
from services.common.reflection import enable_reflection
from services.common.settings import ServerSettings
from services.common.shared_config import MAX_REQUEST_METADATA_BYTES
from services.common.tracing import Tracing, install_tracing

log = logging.getLogger("visior.server")

Register = Callable[[grpc.aio.Server], None]


@dataclass
class RunningServer:
    """A started server and what tests and the runner need to reach it."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    service_names: tuple[str, ...]
    registry: CollectorRegistry
    metrics_port: int | None = None
    companions: list[Callable[[float], Awaitable[None]]] = field(default_factory=list)
    """The stops of the process's other listeners (ToolsProxy's MCP endpoint): each runs
    beside the gRPC server's, with the same grace."""

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", *self.service_names):
            await self.health.set(name, status)

    async def stop(self, grace: float, drain: float = 0.0) -> None:
        """Health NOT_SERVING, wait `drain` s for balancers to notice, then refuse new RPCs
        and let in-flight ones finish for up to `grace` s (on the companion listeners too)."""
        await self.set_serving(False)
        if drain > 0:
            await asyncio.sleep(drain)
        await asyncio.gather(self.server.stop(grace), *(stop(grace) for stop in self.companions))


def server_options(settings: ServerSettings) -> list[tuple[str, int]]:
    """The grpc options of a server: message and metadata limits, keepalive."""
    ms = settings.keepalive_seconds * 1000
    return [
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        ("grpc.max_send_message_length", settings.max_message_bytes),
        # grpc refuses metadata past the hard limit, and a random share of it between the
        # soft and the hard one: both at one value, a request under it is always taken.
        ("grpc.max_metadata_size", MAX_REQUEST_METADATA_BYTES),
        ("grpc.absolute_max_metadata_size", MAX_REQUEST_METADATA_BYTES),
        ("grpc.keepalive_time_ms", ms),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.so_reuseport", 0),
    ]


async def start_server(
    settings: ServerSettings,
    register: Register,
    service_names: Sequence[str],
    registry: CollectorRegistry,
    *,
    domain: str,
    tracing: Tracing | None = None,
) -> RunningServer:
    """Build and start a grpc.aio server on settings.host:settings.port (0 = any free port).

    Spans go to `tracing`, else to the process's own when settings.tracing enables it."""
    tracing = tracing or install_tracing(settings.tracing, settings.service)
    server = grpc.aio.server(
        interceptors=[ServerInterceptor(domain, RpcMetrics(registry), tracing)],
        options=server_options(settings),
        maximum_concurrent_rpcs=settings.max_concurrent_rpcs,
    )
    register(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = tuple(service_names)
    enable_reflection((*names, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    port = server.add_insecure_port(f"{settings.host}:{settings.port}")
    if port == 0:
        raise OSError(f"cannot bind {settings.host}:{settings.port}")
    await server.start()
    running = RunningServer(server, port, health_servicer, names, registry)
    await running.set_serving(True)
    if settings.metrics_port:
        running.metrics_port = serve_metrics(registry, settings.host, settings.metrics_port)
    log.info(
        "listening",
        extra={"grpc": f"{settings.host}:{port}", "metrics_port": running.metrics_port},
    )
    return running


async def run_until_signal(running: RunningServer, grace: float, drain: float = 0.0) -> None:
    """Serve until SIGTERM or SIGINT, then stop gracefully."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stopping", extra={"grace_seconds": grace, "drain_seconds": drain})
    await running.stop(grace, drain)
    log.info("stopped")
