"""Prometheus metrics: one registry per server, RPC metrics in the go-grpc-prometheus style."""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    start_http_server,
)

LATENCY_BUCKETS_SECONDS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


class RpcMetrics:
    """grpc_server_started_total, grpc_server_handled_total{grpc_code}, grpc_server_handling_seconds."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["grpc_service", "grpc_method", "grpc_type"]
        self.started = Counter(
            "grpc_server_started_total", "RPCs started on the server.", labels, registry=registry
        )
        self.handled = Counter(
            "grpc_server_handled_total",
            "RPCs completed on the server, by status code.",
            [*labels, "grpc_code"],
            registry=registry,
        )
        self.handling_seconds = Histogram(
            "grpc_server_handling_seconds",
            "Time to handle an RPC, in seconds.",
            labels,
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=registry,
        )


class ClientRpcMetrics:
    """grpc_client_started_total, grpc_client_handled_total{grpc_code}, grpc_client_handling_seconds:
    the calls this service makes to the next hop (one instance per registry, shared by its
    channels)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["grpc_service", "grpc_method", "grpc_type"]
        self.started = Counter(
            "grpc_client_started_total", "RPCs started by the client.", labels, registry=registry
        )
        self.handled = Counter(
            "grpc_client_handled_total",
            "RPCs completed by the client, by status code.",
            [*labels, "grpc_code"],
            registry=registry,
        )
        self.handling_seconds = Histogram(
            "grpc_client_handling_seconds",
            "Time from starting an RPC to its status, in seconds.",
            labels,
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=registry,
        )
        self._children: dict[tuple[str, ...], tuple[Any, Any]] = {}
        self._handled: dict[tuple[str, ...], Any] = {}

    def start(self, method: str, kind: str) -> tuple[Any, Any]:
        """Count a started call; returns its (key, histogram child) for `done`."""
        key = (*_split(method), kind)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (
                self.started.labels(*key),
                self.handling_seconds.labels(*key),
            )
        children[0].inc()
        return key, children[1]

    def done(self, key: tuple[str, ...], seconds_child: Any, code: str, seconds: float) -> None:
        hkey = (*key, code)
        handled = self._handled.get(hkey)
        if handled is None:
            handled = self._handled[hkey] = self.handled.labels(*hkey)
        handled.inc()
        seconds_child.observe(seconds)


def _split(method: str) -> tuple[str, str]:
    service, _, name = method.lstrip("/").partition("/")
    return service, name


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> int:
    """Expose `registry` on http://host:port/metrics; returns the bound port.

    Without the `*_created` series: in the Prometheus text format they are extra gauges
    that double the series count and carry nothing a dashboard uses."""
    disable_created_metrics()
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return int(server.server_address[1])
