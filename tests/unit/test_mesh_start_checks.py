"""Mesh.start() succeeds only with its own processes running on its own ports, and alive()
watches every process it started, Envoy included."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.common.topology import Ports
from services.devtools import mesh as mesh_mod
from services.devtools.envoy import EnvoyProcess
from services.devtools.mesh import Mesh, MeshError


class _Proc:
    """A started child process, never run: running until `exit_code` is set."""

    pid = 4242

    def __init__(self, cmd: list[str] | None = None) -> None:
        self.cmd = cmd or []
        self.exit_code: int | None = None

    def poll(self) -> int | None:
        return self.exit_code

    @property
    def returncode(self) -> int | None:
        return self.exit_code


@pytest.fixture
def no_children(monkeypatch: pytest.MonkeyPatch) -> list[_Proc]:
    """Popen that records the processes the mesh would start and starts nothing."""
    started: list[_Proc] = []

    def popen(cmd: list[str], **_: Any) -> _Proc:
        started.append(_Proc(list(cmd)))
        return started[-1]

    monkeypatch.setattr(mesh_mod.subprocess, "Popen", popen)
    return started


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    m = Mesh(Ports.free(), tmp_path / "data", tmp_path / "run", bank_standin=True)
    yield m
    m.stop()


def _listen(port: int) -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


# --- a port the mesh needs is taken ---


ROLES = [
    "orchestrator gRPC",
    "toolsproxy metrics",
    "Envoy's retrieval JSON listener",
    "Envoy admin",
    "the bank stand-in",
]


def test_the_mesh_checks_every_port_it_listens_on(mesh: Mesh) -> None:
    p = mesh.ports
    expected = {*p.grpc.values(), *p.http.values(), *p.metrics.values(), p.envoy_admin}
    assert set(mesh.listen_ports().values()) == {*expected, mesh.bank_port}
    assert set(ROLES) <= set(mesh.listen_ports())


@pytest.mark.parametrize("role", ROLES)
def test_a_port_something_listens_on_stops_the_start_before_anything_runs(
    mesh: Mesh, no_children: list[_Proc], role: str
) -> None:
    port = mesh.listen_ports()[role]
    with _listen(port), pytest.raises(MeshError) as caught:
        mesh.start()
    assert f"{port} ({role})" in str(caught.value)
    assert no_children == [] and mesh.bank is None


def test_another_grpc_server_answering_health_on_a_services_port_is_no_start(
    mesh: Mesh, no_children: list[_Proc]
) -> None:
    # A gRPC server (SO_REUSEPORT, as gRPC binds) that says SERVING for whoever asks.
    port = mesh.ports.grpc["orchestrator"]
    other = grpc.server(futures.ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), other)
    other.add_insecure_port(f"127.0.0.1:{port}")
    other.start()
    try:
        with pytest.raises(MeshError, match=f"{port} \\(orchestrator gRPC\\)"):
            mesh.start()
    finally:
        other.stop(0)
    assert no_children == []


# --- a service that exits once found healthy ---


class _CountingHealth(health.HealthServicer):
    """Says SERVING, and counts the checks it answered."""

    def __init__(self) -> None:
        super().__init__()
        self.checks = 0

    def Check(self, request: health_pb2.HealthCheckRequest, context: Any) -> Any:
        self.checks += 1
        return super().Check(request, context)


class _ExitsOnceAnswered(_Proc):
    """A service whose port another process answers for: it exits (cannot bind) once that
    process has said SERVING."""

    def __init__(self, answered: _CountingHealth) -> None:
        super().__init__()
        self._answered = answered

    def poll(self) -> int | None:
        if self._answered.checks:
            self.exit_code = 1
        return self.exit_code


def test_a_serving_answer_while_the_service_exits_is_no_start(
    mesh: Mesh, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = mesh.ports.grpc["orchestrator"]
    answered = _CountingHealth()
    other = grpc.server(futures.ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(answered, other)
    other.add_insecure_port(f"127.0.0.1:{port}")
    other.start()
    monkeypatch.setattr(mesh_mod.subprocess, "Popen", lambda *_, **__: _ExitsOnceAnswered(answered))
    monkeypatch.setattr(mesh_mod, "terminate", lambda proc, grace: proc.poll())
    try:
        mesh.start_service("orchestrator")
        with pytest.raises(MeshError, match="orchestrator exited with 1"):
            mesh.wait_healthy("orchestrator", timeout=30)
    finally:
        other.stop(0)
    assert answered.checks == 1


def test_a_process_that_exits_before_the_start_ends_fails_it_and_all_stop(
    mesh: Mesh, no_children: list[_Proc], monkeypatch: pytest.MonkeyPatch
) -> None:
    stopped: list[object] = []
    monkeypatch.setattr(mesh_mod, "terminate", lambda proc, grace: stopped.append(proc))
    monkeypatch.setattr(Mesh, "wait_healthy", lambda self, key, timeout=30.0: None)

    class EnvoyUp(EnvoyProcess):
        def start(self, config_text: str, workdir: str | Path, **kw: Any) -> None:
            """Envoy started, and by then the LLM service has died."""
            (llm,) = [p for p in no_children if "services.llm" in p.cmd]
            llm.exit_code = 1

        def wait_ready(self, timeout: float = 15.0) -> None:
            pass

    mesh.envoy = EnvoyUp()
    with pytest.raises(MeshError, match="llm exited during start-up"):
        mesh.start()
    assert len(stopped) == 4 and mesh.bank is None


# --- alive() watches Envoy ---


def test_alive_says_when_envoy_has_died(mesh: Mesh, tmp_path: Path) -> None:
    fake_envoy = tmp_path / "envoy"
    fake_envoy.write_text("#!/bin/sh\nexec sleep 600\n")
    fake_envoy.chmod(0o755)
    mesh.envoy = EnvoyProcess(binary=str(fake_envoy))
    admin = "admin: {address: {socket_address: {port_value: 1}}}"
    mesh.envoy.start(admin, tmp_path / "envoy-run")
    pid = mesh.envoy.pid
    assert pid is not None
    assert mesh.alive() == {"envoy": True}
    os.kill(pid, signal.SIGKILL)
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # dead, left for its Popen to reap
    assert mesh.alive() == {"envoy": False}
    assert mesh.envoy.stop() == -signal.SIGKILL  # its Popen still gets the exit code
    assert "envoy" not in mesh.alive()
