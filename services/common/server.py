"""Server bootstrap: interceptors, health, reflection, limits, keepalive, metrics, graceful stop."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIServer

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry, disable_created_metrics, start_http_server

from services.common.draining import RunningCalls
from services.common.interceptors import ServerInterceptor
from services.common.metrics import RpcMetrics
from services.common.reflection import enable_reflection
from services.common.settings import ServerSettings
from services.common.shared_config import MAX_REQUEST_METADATA_BYTES
from services.common.tracing import Tracing, install_tracing

log = logging.getLogger("visior.server")

Register = Callable[[grpc.aio.Server], None]


class ListenError(OSError):
    """The server cannot listen where its settings say: the port is taken, or the host is not
    an address of this machine."""


class HealthServicer(health.aio.HealthServicer):
    """grpc's health servicer, whose Watch streams end when the server stops.

    A Watch never ends on its own, and server.stop(grace) waits for every open call: one
    watcher held every stop for the whole grace period. `end_watches` ends them: a watcher
    last told SERVING is told NOT_SERVING, then the stream ends UNAVAILABLE (as grpc ends the
    calls it cancels at stop), which tells a client to look for another server.
    """

    def __init__(self) -> None:
        super().__init__()
        self._watches: set[asyncio.Task[None]] = set()
        self._ending = False

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: Any) -> None:
        sent = _SentStatus(context)
        if not self._ending:
            # grpc's Watch runs in a task of its own, so that ending it ends this call with
            # a status: a cancelled handler sends none, and its call stays open.
            watch = asyncio.ensure_future(super().Watch(request, sent))
            self._watches.add(watch)
            try:
                await asyncio.wait((watch,))
            finally:
                watch.cancel()  # this call was cancelled (the caller went away)
                self._watches.discard(watch)
            if not watch.cancelled():
                return watch.result()  # grpc's Watch ends only by an error: raise it
        if sent.last == health_pb2.HealthCheckResponse.SERVING:
            await context.write(
                health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.NOT_SERVING)
            )
        await context.abort(grpc.StatusCode.UNAVAILABLE, "the server is stopping")

    def end_watches(self) -> None:
        """End every Watch stream, and any opened from now on."""
        self._ending = True
        for watch in self._watches:
            watch.cancel()


class _SentStatus:
    """A Watch's context, keeping the last status written through it."""

    def __init__(self, context: Any) -> None:
        self._context = context
        self.last: int | None = None

    async def write(self, message: health_pb2.HealthCheckResponse) -> None:
        await self._context.write(message)
        self.last = message.status

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


class MetricsExporter:
    """The Prometheus HTTP exporter of a server's registry (http://host:port/metrics), in a
    thread of its own. Stopped with its server, so that a server started again in the same
    process can bind the same port."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        """Serve `registry` on `host` (an IPv6 address without brackets) and `port`; OSError
        when that cannot be bound. Without the `*_created` series: in the Prometheus text
        format they are extra gauges that double the series count and carry nothing a
        dashboard uses."""
        disable_created_metrics()
        self._server: WSGIServer
        self._thread: threading.Thread
        self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        self.port = int(self._server.server_address[1])
        """The bound port."""

    async def stop(self) -> None:
        """Stop serving and let go of the port; stopping again does nothing. Runs in a
        worker thread: the exporter's loop notices the stop only at its next poll."""
        await asyncio.to_thread(self._shut_down)

    def _shut_down(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


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
    metrics: MetricsExporter | None = None
    """The Prometheus exporter serving `registry` on `metrics_port`, stopped last."""
    interceptor: ServerInterceptor | None = None
    """The server's interceptor: told when the server begins to stop (`draining`)."""
    calls: RunningCalls | None = None
    """The server's calls in flight (services.common.draining): those still running as the
    stop's grace is about to run out end with UNAVAILABLE DRAINING."""

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", *self.service_names):
            await self.health.set(name, status)

    async def stop(self, grace: float, drain: float = 0.0) -> None:
        """Health NOT_SERVING for good (each service's own GetHealth too), wait `drain` s for
        balancers to notice, end the health Watch streams, then refuse new RPCs and let
        in-flight ones finish for up to `grace` s (on the companion listeners too).

        A call still running END_MARGIN_S before the grace runs out (at most half the grace:
        services.common.draining) ends with UNAVAILABLE DRAINING, a reason its caller can
        read, before grpc cancels what is left with a bare UNAVAILABLE at the grace's end."""
        await self.health.enter_graceful_shutdown()
        if self.interceptor is not None:
            self.interceptor.draining = True
        if drain > 0:
            await asyncio.sleep(drain)
        if isinstance(self.health, HealthServicer):
            self.health.end_watches()
        ending = self.calls.end_before(grace) if self.calls is not None else None
        try:
            await asyncio.gather(
                self.server.stop(grace), *(stop(grace) for stop in self.companions)
            )
        finally:
            if ending is not None:
                ending.cancel()  # every call has ended
            if self.metrics is not None:
                await self.metrics.stop()


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
    # The cap is the interceptor's, not grpc's maximum_concurrent_rpcs: grpc's counts health
    # and reflection calls too, and refuses without an ErrorInfo or a count in the metrics.
    calls = RunningCalls(settings.service)
    interceptor = ServerInterceptor(
        domain,
        RpcMetrics(registry),
        tracing,
        max_concurrent_rpcs=settings.max_concurrent_rpcs,
        calls=calls,
    )
    server = grpc.aio.server(interceptors=[interceptor], options=server_options(settings))
    register(server)
    health_servicer = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = tuple(service_names)
    enable_reflection((*names, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    port = await _bind(server, grpc_host(settings.host), settings.port)
    metrics = await _start_metrics(server, settings, registry) if settings.metrics_port else None
    metrics_port = metrics.port if metrics else None
    running = RunningServer(
        server, port, health_servicer, names, registry, metrics_port, metrics=metrics,
        interceptor=interceptor, calls=calls,
    )  # fmt: skip
    try:
        await server.start()
        await running.set_serving(True)
    except BaseException:
        # Stopped, so that nothing keeps the ports: a start in the same process binds them.
        await running.stop(0)
        raise
    log.info(
        "listening",
        extra={"grpc": f"{grpc_host(settings.host)}:{port}", "metrics_port": running.metrics_port},
    )
    return running


def grpc_host(host: str) -> str:
    """`host` as grpc's bind address takes it: an IPv6 address in brackets ([::1]), whether
    the setting gives it so or bare (::1, which grpc reads as a name it cannot resolve)."""
    bare = bare_host(host)
    return f"[{bare}]" if ":" in bare else bare


def bare_host(host: str) -> str:
    """`host` as a socket binds it (the metrics exporter): an IPv6 address without brackets,
    whether the setting gives it so or in brackets ([::1], which is no address to bind)."""
    if host.startswith("[") and host.endswith("]"):
        return host[1:-1]
    return host


async def _bind(server: grpc.aio.Server, host: str, port: int) -> int:
    """The port `server` listens on at `host`:`port` (0 = any free one); ListenError, the
    unstarted server stopped, when it cannot bind there."""
    address = f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError:  # grpc's "Failed to bind to address ...", which names no cause
        bound = 0
    if bound == 0:  # older grpc returned 0
        # Stopped, not left to the collector: a grpc.aio server dropped unstarted is
        # finalised whenever, on whatever event loop, and grpc's aio state is global.
        await server.stop(None)
        raise ListenError(cannot_listen("gRPC", address))
    return int(bound)


async def _start_metrics(
    server: grpc.aio.Server, settings: ServerSettings, registry: CollectorRegistry
) -> MetricsExporter:
    """The exporter of `registry` on settings.host and settings.metrics_port; ListenError,
    the unstarted gRPC server stopped (letting go of its port), when it cannot bind there."""
    try:
        return MetricsExporter(registry, bare_host(settings.host), settings.metrics_port)
    except OSError as exc:
        await server.stop(None)
        where = f"{grpc_host(settings.host)}:{settings.metrics_port}"
        cause = exc.strerror or type(exc).__name__
        raise ListenError(f"{cannot_listen('metrics', where)} ({cause})") from None


def cannot_listen(what: str, address: str) -> str:
    """The ListenError message for `what` (gRPC, metrics, MCP) at `address`."""
    return (
        f"cannot listen for {what} on {address}: the port is in use, or the host is not an "
        "address of this machine"
    )


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
