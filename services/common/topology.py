"""Where each service of the mesh listens: one table used by the runner, Envoy config and tests."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ServiceSpec:
    """One service of the mesh and how its sidecar exposes it."""

    key: str
    """Short name: orchestrator, llm, retrieval, toolsproxy."""
    module: str
    """Python module run with `python -m` to start the server."""
    grpc_services: tuple[str, ...]
    """Fully qualified gRPC services its Envoy listener transcodes."""
    env_prefix: str
    """Prefix of the service's own settings (ORCH_, LLM_SERVICE_, RETR_, MCP_PROXY_)."""


SERVICES: tuple[ServiceSpec, ...] = (
    ServiceSpec(
        "orchestrator",
        "services.orchestrator",
        ("visior.orchestrator.v1.OrchestratorService",),
        "ORCH_",
    ),
    ServiceSpec("llm", "services.llm", ("visior.llm.v1.LlmService",), "LLM_SERVICE_"),
    ServiceSpec(
        "retrieval",
        "services.retrieval",
        ("visior.retrieval.v1.RetrievalService", "visior.retrieval.v1.IngestionService"),
        "RETR_",
    ),
    ServiceSpec(
        "toolsproxy",
        "services.toolsproxy",
        ("visior.toolsproxy.v1.ToolsProxyService",),
        "MCP_PROXY_",
    ),
)
SERVICE_BY_KEY = {s.key: s for s in SERVICES}


def _numbered(first: int) -> dict[str, int]:
    """The services' default ports in SERVICES order from `first` on."""
    return {spec.key: first + i for i, spec in enumerate(SERVICES)}


@dataclass(frozen=True)
class Ports:
    """Ports of one mesh instance: gRPC, Envoy sidecar (JSON) and Prometheus per service."""

    grpc: dict[str, int] = field(default_factory=lambda: _numbered(50051))
    """orchestrator 50051, llm 50052, retrieval 50053, toolsproxy 50054."""
    http: dict[str, int] = field(default_factory=lambda: _numbered(8081))
    """The Envoy listeners: 8081..8084 in the same order."""
    metrics: dict[str, int] = field(default_factory=lambda: _numbered(9181))
    """Prometheus: 9181..9184 in the same order."""
    envoy_admin: int = 9901

    @classmethod
    def free(cls) -> Ports:
        """Ports the OS says are free now, for tests and benchmarks that run beside `make run`."""
        keys = [s.key for s in SERVICES]
        picked = free_ports(3 * len(keys) + 1)
        n = len(keys)
        return cls(
            grpc=dict(zip(keys, picked[:n], strict=True)),
            http=dict(zip(keys, picked[n : 2 * n], strict=True)),
            metrics=dict(zip(keys, picked[2 * n : 3 * n], strict=True)),
            envoy_admin=picked[-1],
        )


def free_ports(count: int) -> list[int]:
    """Return `count` distinct TCP ports that are free on 127.0.0.1 right now."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
