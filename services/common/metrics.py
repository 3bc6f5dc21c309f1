"""Prometheus metrics: one registry per server, RPC metrics in the go-grpc-prometheus style."""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
)

LATENCY_BUCKETS_SECONDS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


_TEXTS = {
    "server": ("RPCs started on the server.", "RPCs completed on the server, by status code.",
               "Time to handle an RPC, in seconds."),
    "client": ("RPCs started by the client.", "RPCs completed by the client, by status code.",
               "Time from starting an RPC to its status, in seconds."),
}  # fmt: skip

RpcKey = tuple[str, str, str]
"""(grpc_service, grpc_method, grpc_type)."""


class RpcMetrics:
    """grpc_server_started_total, grpc_server_handled_total{grpc_code} and
    grpc_server_handling_seconds; with side="client" the grpc_client_* trio for the calls this
    service makes to the next hop (one instance per registry and side, shared by its users).

    Labelled children are resolved once per method (and code): `.labels()` hashes and locks
    on every call, which is a measurable share of a cheap RPC (bench/transport.py).
    """

    def __init__(self, registry: CollectorRegistry, side: str = "server") -> None:
        started, handled, seconds = _TEXTS[side]
        labels = ["grpc_service", "grpc_method", "grpc_type"]
        self.started = Counter(f"grpc_{side}_started_total", started, labels, registry=registry)
        self.handled = Counter(
            f"grpc_{side}_handled_total", handled, [*labels, "grpc_code"], registry=registry
        )
        self.handling_seconds = Histogram(
            f"grpc_{side}_handling_seconds",
            seconds,
            labels,
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=registry,
        )
        self._started: dict[RpcKey, Any] = {}
        self._seconds: dict[RpcKey, Any] = {}
        self._handled: dict[tuple[str, str, str, str], Any] = {}

    def start(self, key: RpcKey) -> None:
        """Count a started call."""
        child = self._started.get(key)
        if child is None:
            child = self._started[key] = self.started.labels(*key)
        child.inc()

    def done(self, key: RpcKey, code: str, seconds: float) -> None:
        """Count a finished call by status code and observe its duration."""
        hkey = (*key, code)
        handled = self._handled.get(hkey)
        if handled is None:
            handled = self._handled[hkey] = self.handled.labels(*hkey)
        handled.inc()
        child = self._seconds.get(key)
        if child is None:
            child = self._seconds[key] = self.handling_seconds.labels(*key)
        child.observe(seconds)


class ClientRpcMetrics(RpcMetrics):
    """The grpc_client_* metrics (RpcMetrics with side="client")."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry, "client")


def split_method(method: str | bytes) -> tuple[str, str]:
    """("pkg.Service", "Method") of a full gRPC method name "/pkg.Service/Method"."""
    text = method.decode() if isinstance(method, bytes) else method
    service, _, name = text.lstrip("/").partition("/")
    return service, name
