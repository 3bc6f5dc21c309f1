"""Prometheus metrics: one registry per server, RPC metrics in the go-grpc-prometheus style."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

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


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> int:
    """Expose `registry` on http://host:port/metrics; returns the bound port."""
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return int(server.server_address[1])
