"""Where each service of the mesh listens: one table used by the services' defaults, the
runner, the Envoy config and the tests."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


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


def default_grpc_target(key: str) -> str:
    """host:port where service `key` listens when nothing says otherwise (`Ports`' defaults),
    which is also where the services that call it look for it by default."""
    return f"127.0.0.1:{Ports().grpc[key]}"


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free on 127.0.0.1 now that no caller of this function on
    this machine was handed in the last `_PORT_HOLD_S` seconds.

    A port picked here stays unbound until the server it is meant for binds it. So the
    ports come from outside the kernel's ephemeral range (where outgoing connections and
    binds to port 0 take theirs), handed out in turn under a lock file (`_PORT_STATE`), so
    two processes starting meshes at once (pytest-xdist workers, benchmarks) never get the
    same one.
    """
    ephemeral = _ephemeral_ports()
    candidates = [p for p in range(_FIRST_PORT, 65536) if p not in ephemeral]
    with _PORT_STATE.open("a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
        f.seek(0)
        state = json.loads(f.read() or "{}")
        now = time.time()
        held = {int(p): t for p, t in state.get("held", {}).items() if now - t < _PORT_HOLD_S}
        at = state.get("next", 0) % len(candidates)
        picked: list[int] = []
        tried = 0
        while len(picked) < count and tried < len(candidates):
            port = candidates[(at + tried) % len(candidates)]
            tried += 1
            if port not in held and _bindable(port):
                picked.append(port)
                held[port] = now
        if len(picked) < count:
            raise OSError(f"not {count} free TCP ports on 127.0.0.1 outside the ephemeral range")
        at = (at + tried) % len(candidates)
        f.seek(0)
        f.truncate()
        f.write(json.dumps({"next": at, "held": held}))
    return picked


_FIRST_PORT = 16384
_PORT_HOLD_S = 120.0
"""How long a port handed out is kept from other callers (its server binds it by then)."""
_PORT_STATE = Path(tempfile.gettempdir()) / f"visior-free-ports-{os.getuid()}.json"


def _ephemeral_ports() -> range:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return range(int(low), int(high) + 1)
    except (OSError, ValueError):
        return range(32768, 61000)  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
