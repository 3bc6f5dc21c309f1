"""Runs the whole mesh as real processes: four `python -m services.<svc>` servers and Envoy.

Used by `make run`, the CLI's `demo`, the end-to-end tests and the benchmarks. With
`bank_standin=True` it also runs the local stand-in of the Bank of Russia DailyInfo service
(services/devtools/cbr_standin.py) in a thread and points the ToolsProxy at it in demo mode.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.devtools.cbr_standin import PATH as BANK_PATH
from services.devtools.cbr_standin import BankStandIn
from services.devtools.envoy import REPO_ROOT, EnvoyProcess
from services.devtools.envoy_config import render
from services.devtools.topology import SERVICES, Ports


class MeshError(RuntimeError):
    """A process of the mesh did not start or did not become healthy."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Mesh:
    """Four servers + Envoy on `ports`, data under `data_dir`, logs under `workdir`.

    `bank_standin=True` starts the demo stand-in of the Bank of Russia on 127.0.0.1:`bank_port`
    (a free port when 0) before the services and gives the ToolsProxy
    ``MCP_PROXY_CBR_URL`` = its URL and ``MCP_PROXY_CBR_DEMO=true`` (overriding the caller's
    environment), so `fetch_cbr_data` answers offline and labels its results as demo data.
    `fault_injection=True` gives Envoy the header-driven fault filter (fault tests only; see
    services/devtools/envoy_config.render).
    """

    def __init__(
        self,
        ports: Ports,
        data_dir: str | Path,
        workdir: str | Path,
        *,
        env: Mapping[str, str] | None = None,
        envoy_concurrency: int = 2,
        access_log: bool = False,
        envoy_timeouts: Mapping[str, float] | None = None,
        bank_standin: bool = False,
        bank_port: int = 0,
        fault_injection: bool = False,
    ) -> None:
        self.ports = ports
        self.data_dir = Path(data_dir)
        self.workdir = Path(workdir)
        self._extra_env = dict(env or {})
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: dict[str, IO[bytes]] = {}
        self.envoy = EnvoyProcess(concurrency=envoy_concurrency)
        self._access_log = access_log
        self._timeouts = envoy_timeouts
        self._fault_injection = fault_injection
        self.bank_standin = bank_standin
        self.bank_port = (bank_port or _free_port()) if bank_standin else 0
        self.bank: BankStandIn | None = None
        """The running stand-in, between start() and stop()."""

    @property
    def bank_url(self) -> str | None:
        """The stand-in's DailyInfo URL when `bank_standin`, else None (the proxy's default)."""
        if not self.bank_standin:
            return None
        return f"http://127.0.0.1:{self.bank_port}{BANK_PATH}"

    def env(self) -> dict[str, str]:
        """The environment every service process gets: ports, targets, data dir."""
        p = self.ports
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "VISIOR_DATA_DIR": str(self.data_dir),
            "ORCH_PORT": str(p.grpc["orchestrator"]),
            "LLM_SERVICE_PORT": str(p.grpc["llm"]),
            "RETR_PORT": str(p.grpc["retrieval"]),
            "MCP_PROXY_PORT": str(p.grpc["toolsproxy"]),
            "ORCH_METRICS_PORT": str(p.metrics["orchestrator"]),
            "LLM_SERVICE_METRICS_PORT": str(p.metrics["llm"]),
            "RETR_METRICS_PORT": str(p.metrics["retrieval"]),
            "MCP_PROXY_METRICS_PORT": str(p.metrics["toolsproxy"]),
            "ORCH_RETRIEVAL_URL": f"127.0.0.1:{p.grpc['retrieval']}",
            "ORCH_LLM_SERVICE_URL": f"127.0.0.1:{p.grpc['llm']}",
            "MCP_PROXY_URL": f"127.0.0.1:{p.grpc['toolsproxy']}",
            "MCP_PROXY_RETRIEVAL_URL": f"127.0.0.1:{p.grpc['retrieval']}",
        }
        env.update(self._extra_env)
        if self.bank_url is not None:
            env["MCP_PROXY_CBR_URL"] = self.bank_url
            env["MCP_PROXY_CBR_DEMO"] = "true"
        return env

    def log_path(self, key: str) -> Path:
        return self.workdir / f"{key}.log"

    def start_service(self, key: str) -> None:
        spec = next(s for s in SERVICES if s.key == key)
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = self.log_path(key).open("ab")
        self._logs[key] = log
        self._procs[key] = subprocess.Popen(
            [sys.executable, "-m", spec.module],
            cwd=str(REPO_ROOT),
            env=self.env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def wait_healthy(self, key: str, timeout: float = 30.0) -> None:
        """Block until the service's grpc.health.v1 says SERVING."""
        deadline = time.monotonic() + timeout
        target = f"127.0.0.1:{self.ports.grpc[key]}"
        with grpc.insecure_channel(target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                proc = self._procs[key]
                if proc.poll() is not None:
                    raise MeshError(f"{key} exited with {proc.returncode}:\n{self.log_tail(key)}")
                try:
                    status = stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status
                    if status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise MeshError(f"{key} not healthy after {timeout:g}s:\n{self.log_tail(key)}")
                time.sleep(0.1)

    def start(self) -> Mesh:
        """The bank stand-in (if asked), the four servers (healthy), then Envoy (ready)."""
        try:
            if self.bank_standin and self.bank is None:
                try:
                    self.bank = BankStandIn(self.bank_port).start()
                except OSError as exc:
                    raise MeshError(
                        f"the bank stand-in cannot listen on 127.0.0.1:{self.bank_port}: {exc}"
                    ) from exc
            for spec in SERVICES:
                self.start_service(spec.key)
            for spec in SERVICES:
                self.wait_healthy(spec.key)
            config = render(
                self.ports,
                str(REPO_ROOT / "envoy" / "visior.pb"),
                access_log=self._access_log,
                timeouts=self._timeouts,
                fault_injection=self._fault_injection,
            )
            self.envoy.start(config, self.workdir / "envoy")
            self.envoy.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop_service(self, key: str, grace: float = 10.0) -> int | None:
        """SIGTERM one service and wait for it (SIGKILL after `grace` + 5 s)."""
        proc = self._procs.pop(key, None)
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace + 5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log = self._logs.pop(key, None)
        if log:
            log.close()
        return proc.returncode

    def stop(self) -> None:
        """Envoy, the servers, then the bank stand-in; safe to call twice."""
        self.envoy.stop()
        for key in list(self._procs):
            self.stop_service(key)
        if self.bank is not None:
            self.bank.stop()
            self.bank = None

    def alive(self) -> dict[str, bool]:
        return {k: p.poll() is None for k, p in self._procs.items()}

    def pids(self) -> dict[str, int]:
        pids = {k: p.pid for k, p in self._procs.items()}
        if self.envoy.pid:
            pids["envoy"] = self.envoy.pid
        return pids

    def log_tail(self, key: str, lines: int = 30) -> str:
        path = self.log_path(key)
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def json_url(self, key: str) -> str:
        return f"http://127.0.0.1:{self.ports.http[key]}"

    def __enter__(self) -> Mesh:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
