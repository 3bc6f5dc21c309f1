"""Runs the whole mesh as real processes: four `python -m services.<svc>` servers and Envoy.

Used by `make run`, the CLI's `demo`, the end-to-end tests and the benchmarks. With
`bank_standin=True` it also runs the local stand-in of the Bank of Russia DailyInfo service
(services/devtools/cbr_standin.py) in a thread and points the ToolsProxy at it in demo mode.
With `local_model=LocalModelConfig(...)` it first starts the local model (llama.cpp's server on
the pinned registry weights, services/devtools/local_model.py) and points the LLM service (and
Retrieval's model features, when switched on) at it, unless a remote runtime is configured.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.prompt_limits import DEFAULT_LLM_PROMPT_TOKENS
from services.common.settings import Env, ServerSettings, SettingsError, server_var
from services.common.shared_config import MIN_FIRST_PROMPT_TOKENS, llm_completion_limit
from services.common.topology import SERVICES, Ports, free_ports
from services.devtools.cbr_standin import PATH as BANK_PATH
from services.devtools.cbr_standin import BankStandIn
from services.devtools.envoy import REPO_ROOT, EnvoyProcess, absolute_path
from services.devtools.envoy_config import STREAM_IDLE, render
from services.devtools.local_model import LocalModel, LocalModelConfig
from services.devtools.processes import dying_with_us, exited, terminate
from services.llm.loop import MIN_TOOL_RESULT_ROOM
from services.model_runtime.config import URL as RUNTIME_URL


class MeshError(RuntimeError):
    """A process of the mesh did not start or did not become healthy, or a port it needs is
    taken."""


class PortsError(MeshError):
    """The mesh cannot take its ports, nothing started: one is taken (check_ports_free), or
    the process environment gives a service another port or neighbour than the mesh would
    (check_caller_env). Other ports for the whole mesh answer both."""


LOCAL_CALL_TIMEOUT_S = 300.0
"""One call to the local model: a cold 3,000-token prompt takes ≈50 s at ≈60 tokens/s
prefill on 2 cores, plus decoding at 15-18 tokens/s."""
LOCAL_CONTEXT_MARGIN = 1024
"""Tokens of the model's context the LLM service's budget leaves free (see local_model_env)."""
LOCAL_RESPOND_TIMEOUT_S = 900.0
"""A whole Respond with the local model: a few tool steps, each a model call."""


STOP_MARGIN_S = 5.0
"""Seconds a stopping service gets after its own drain and grace: closing its clients and
stores, and the interpreter's exit."""


def remote_runtime(env: Mapping[str, str]) -> str | None:
    """The runtime URL the user configured in `env`, if any (then nothing local starts), read
    as the LLM service reads LLM_RUNTIME_URL: a blank value is unset."""
    return RUNTIME_URL.read(Env(env)) or None


def local_model_env(
    base_url: str, model_name: str, n_ctx: int, env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """What the services get with the local model: its URL and name, CPU-sized timeouts and a
    token ceiling inside its context. Set by the mesh unless the caller's env names them
    (the URL and model name always).

    The first prompt's ceiling leaves room for one answer of MAX_COMPLETION_TOKENS as the
    LLM service reads it from `env` (default the process environment): the user's value,
    else the service's own default, and for one minimal tool result (MIN_TOOL_RESULT_ROOM,
    which the LLM service requires at start). SettingsError when that leaves less than
    MIN_FIRST_PROMPT_TOKENS (the least MAX_PROMPT_TOKENS the services start with) for a
    prompt.
    """
    call, respond = f"{LOCAL_CALL_TIMEOUT_S:g}", f"{LOCAL_RESPOND_TIMEOUT_S:g}"
    total = max(1024, n_ctx - LOCAL_CONTEXT_MARGIN)
    completion = llm_completion_limit(Env(os.environ if env is None else env))
    # The first prompt, one answer and one minimal tool result must fit the total (the LLM
    # service checks it at start).
    prompt = min(DEFAULT_LLM_PROMPT_TOKENS, total - completion - MIN_TOOL_RESULT_ROOM)
    if prompt < MIN_FIRST_PROMPT_TOKENS:
        raise SettingsError(
            f"MAX_COMPLETION_TOKENS={completion} and {MIN_TOOL_RESULT_ROOM} tokens for a tool "
            f"result leave {prompt} of the local model's {total}-token budget (n_ctx {n_ctx}) "
            f"for the first prompt, which needs at least {MIN_FIRST_PROMPT_TOKENS}: lower "
            "MAX_COMPLETION_TOKENS or raise the n_ctx"
        )
    return {
        # services/model_runtime/client.py; Retrieval's summaries and query variants use them
        # too when switched on (services/retrieval/llm_assist.py).
        "LLM_RUNTIME_URL": base_url,
        "DEFAULT_MODEL_NAME": model_name,
        "LLM_RUNTIME_TIMEOUT_S": call,
        # The LLM service's whole Generate (services/llm/config.py) and the orchestrator's
        # deadline for it (services/orchestrator/config.py).
        "LLM_SERVICE_WATCHDOG_SECONDS": respond,
        "ORCH_LLM_TIMEOUT_SECONDS": respond,
        # Prompt + completion + tool results must fit the server's context. The budget counts
        # cl100k tokens (the model's own count is 0.87-1.02 of it on the harness documents)
        # and not JSON mode's tool instruction: LOCAL_CONTEXT_MARGIN tokens are kept for both.
        "LLM_SERVICE_MAX_TOTAL_TOKENS": str(total),
        "MAX_PROMPT_TOKENS": str(prompt),
        # The model writes no native tool_calls: tools go through JSON mode, each step
        # constrained by a json_schema (services/model_runtime/client.py); greedy decoding makes its
        # answers repeatable.
        "ENABLE_JSON_MODE": "true",
        "LLM_RUNTIME_TEMPERATURE": "0",
        # Prefill runs at ~60 tokens/s on 2 cores: five sections in the first prompt (the
        # answer cites five at most), and the rules route (they route every question of the
        # answer harness's gold set as it expects; a routing call costs 11-40 s here).
        "ORCH_DEFAULT_TOP_K": "5",
        # One read and one follow-up: each read costs 15-40 s of prefill and decoding here.
        "ORCH_MAX_TOOL_STEPS": "2",
        "ORCH_MODEL_ROUTING": "false",
    }


def listening_allowed(port: int) -> bool:
    """Whether a server may listen on 127.0.0.1:`port` now, i.e. nothing listens there. The
    probe binds as the servers and Envoy do (SO_REUSEADDR), so the connections of an earlier
    run still in TIME_WAIT do not count; a listener does, SO_REUSEPORT or not."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def stop_wait(key: str, env: Mapping[str, str]) -> float:
    """Seconds the mesh waits for service `key` after SIGTERM before SIGKILL: the drain and
    grace the service reads from `env` (the env it was started with), plus STOP_MARGIN_S."""
    try:
        server = ServerSettings.for_service(key, Env(env))
    except SettingsError:  # the service refused this env at start: nothing is in flight
        server = ServerSettings(key)
    return server.drain_seconds + server.grace_seconds + STOP_MARGIN_S


LOCAL_FORCED = ("LLM_RUNTIME_URL", "DEFAULT_MODEL_NAME")
"""Keys of `local_model_env` that always win: they name the process the mesh started."""


def local_envoy_timeouts() -> dict[str, float]:
    """Envoy route timeouts with the local model: a little over the orchestrator's own, and
    a stream may stay silent for a little over one model call (a cold prompt's prefill alone
    takes about 50 s on 2 cores)."""
    return {
        "/internal/orchestrator/respond": LOCAL_RESPOND_TIMEOUT_S + 30,
        "/internal/llm/generate": LOCAL_RESPOND_TIMEOUT_S + 15,
        STREAM_IDLE: LOCAL_CALL_TIMEOUT_S + 15,
    }


class Mesh:
    """Four servers + Envoy on `ports`, data under `data_dir`, logs under `workdir` (a
    relative one is the caller's: each is made absolute before any child gets it).

    `bank_standin=True` starts the demo stand-in of the Bank of Russia on 127.0.0.1:`bank_port`
    (a free port when 0) before the services and gives the ToolsProxy
    ``MCP_PROXY_CBR_URL`` = its URL and ``MCP_PROXY_CBR_DEMO=true`` (overriding the caller's
    environment), so `fetch_cbr_data` answers offline and labels its results as demo data.
    `fault_injection=True` gives Envoy the header-driven fault filter (fault tests only; see
    services/devtools/envoy_config.render).
    `local_model` starts the local model before the services (log ``<workdir>/model.log``)
    and gives them `local_model_env`; with ``LLM_RUNTIME_URL`` set (not blank) in the
    environment or `env`, nothing local starts.
    `stop_service` gives each service its own drain and grace (``<PREFIX>DRAIN_SECONDS``,
    ``<PREFIX>GRACE_SECONDS`` in the env it was started with) plus STOP_MARGIN_S before SIGKILL.
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
        local_model: LocalModelConfig | None = None,
    ) -> None:
        self.ports = ports
        self.data_dir = absolute_path(data_dir)
        """Absolute (absolute_path): the services run in the repository root, the caller
        anywhere."""
        self.workdir = absolute_path(workdir)
        """Absolute (absolute_path): Envoy gets its config path under it."""
        self._extra_env = dict(env or {})
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: dict[str, IO[bytes]] = {}
        self._envs: dict[str, dict[str, str]] = {}
        """The env each running service was started with."""
        self.envoy = EnvoyProcess(concurrency=envoy_concurrency)
        self._access_log = access_log
        self._timeouts = envoy_timeouts
        self._fault_injection = fault_injection
        self.bank_standin = bank_standin
        self.bank_port = (bank_port or free_ports(1)[0]) if bank_standin else 0
        self.bank: BankStandIn | None = None
        """The running stand-in, between start() and stop()."""
        self.remote_runtime = remote_runtime({**os.environ, **self._extra_env})
        """The user's runtime URL; when set, `local_model` is ignored."""
        self.model: LocalModel | None = None
        """The local model, when asked for and no remote runtime is configured."""
        if local_model is not None and self.remote_runtime is None:
            self.model = LocalModel(config=local_model, log_path=self.log_path("model"))

    @property
    def bank_url(self) -> str | None:
        """The stand-in's DailyInfo URL when `bank_standin`, else None (the proxy's default)."""
        if not self.bank_standin:
            return None
        return f"http://127.0.0.1:{self.bank_port}{BANK_PATH}"

    def wiring(self) -> dict[str, str]:
        """The variables by which the mesh puts every service on its `ports` and tells it its
        neighbours: each service's gRPC and metrics port, and the addresses it calls."""
        p = self.ports
        return {
            **{server_var(s.key, "port"): str(p.grpc[s.key]) for s in SERVICES},
            **{server_var(s.key, "metrics_port"): str(p.metrics[s.key]) for s in SERVICES},
            "ORCH_RETRIEVAL_URL": f"127.0.0.1:{p.grpc['retrieval']}",
            "ORCH_LLM_SERVICE_URL": f"127.0.0.1:{p.grpc['llm']}",
            "MCP_PROXY_URL": f"127.0.0.1:{p.grpc['toolsproxy']}",
            "MCP_PROXY_RETRIEVAL_URL": f"127.0.0.1:{p.grpc['retrieval']}",
        }

    def check_caller_env(self) -> None:
        """PortsError naming each variable of `wiring` the process environment sets (not
        blank, as the services read it) to another value than the mesh's, unless the mesh's
        own `env` names it: the mesh would overwrite it, and the service would not be where
        the caller said."""
        caller = Env(os.environ)
        differ = [
            f"{name}={found[1]} (the mesh's: {mine})"
            for name, mine in self.wiring().items()
            if name not in self._extra_env
            and (found := caller.raw([name])) is not None
            and found[1] != mine
        ]
        if differ:
            raise PortsError(
                f"set in the environment: {', '.join(differ)}; the mesh gives every service "
                "its ports and its neighbours' addresses itself and would overwrite "
                f"{'these' if len(differ) > 1 else 'it'}: unset "
                f"{'them' if len(differ) > 1 else 'it'}; to move the services, give the mesh "
                "other ports"
            )

    def mcp_endpoint(self) -> tuple[str, int] | None:
        """(URL, port) of the ToolsProxy's MCP endpoint when the environment the services get
        enables it (MCP_PROXY_MCP_*, read as the ToolsProxy reads them; the mesh sets none of
        them), else None; also None for a value the ToolsProxy would refuse at start, which
        then says why. Port 0 (the OS picks one) gives no URL either."""
        given = Env({**os.environ, **self._extra_env})
        if given.raw(["MCP_PROXY_MCP_ENABLED"]) is None:  # off, without the import below
            return None
        # Imported here: the ToolsProxy's settings pull in the MCP SDK, which the client
        # commands never need.
        from services.toolsproxy.config import mcp_settings

        try:
            mcp = mcp_settings(given)
        except SettingsError:
            return None
        if not mcp.enabled or not mcp.port:
            return None
        host = "127.0.0.1" if mcp.host in ("0.0.0.0", "::") else mcp.host  # every address
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{mcp.port}{mcp.path}", mcp.port

    def env(self) -> dict[str, str]:
        """The environment every service process gets: ports, targets, data dir, then the
        caller's `env`. With the local model running, also `local_model_env`: its LOCAL_FORCED
        names always, the others where neither the process environment nor `env` sets them
        (a blank value is unset, as the services read it)."""
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "VISIOR_DATA_DIR": str(self.data_dir),
            **self.wiring(),
        }
        env.update(self._extra_env)
        if self.model is not None and self.model.alive():
            given = {**os.environ, **self._extra_env}
            try:
                local = local_model_env(
                    self.model.base_url, self.model.alias, self.model.config.n_ctx, given
                )
            except SettingsError as exc:
                raise MeshError(f"the LLM service cannot run on the local model: {exc}") from exc
            caller = Env(given)
            env.update(
                {k: v for k, v in local.items() if k in LOCAL_FORCED or caller.raw([k]) is None}
            )
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
        env = self._envs[key] = self.env()
        self._procs[key] = subprocess.Popen(
            dying_with_us([sys.executable, "-m", spec.module]),
            cwd=str(REPO_ROOT),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def wait_healthy(self, key: str, timeout: float = 30.0) -> None:
        """Block until the service's grpc.health.v1 says SERVING, and the service still runs:
        a SERVING from another process on its port is no start."""
        deadline = time.monotonic() + timeout
        target = f"127.0.0.1:{self.ports.grpc[key]}"
        with grpc.insecure_channel(target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                self._check_running(key)
                try:
                    status = stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status
                    if status == health_pb2.HealthCheckResponse.SERVING:
                        self._check_running(key)
                        return
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise MeshError(f"{key} not healthy after {timeout:g}s:\n{self.log_tail(key)}")
                time.sleep(0.1)

    def _check_running(self, key: str) -> None:
        """MeshError with its log tail when service `key` has exited."""
        proc = self._procs[key]
        if proc.poll() is not None:
            raise MeshError(f"{key} exited with {proc.returncode}:\n{self.log_tail(key)}")

    def listen_ports(self) -> dict[str, int]:
        """Each port this mesh will listen on, by the role that listens there (a port 0 is
        picked by the OS, so is left out)."""
        p = self.ports
        roles: dict[str, int] = {}
        for spec in SERVICES:
            roles[f"{spec.key} gRPC"] = p.grpc[spec.key]
            roles[f"{spec.key} metrics"] = p.metrics[spec.key]
            roles[f"Envoy's {spec.key} JSON listener"] = p.http[spec.key]
        roles["Envoy admin"] = p.envoy_admin
        if mcp := self.mcp_endpoint():
            roles["the MCP endpoint, MCP_PROXY_MCP_PORT"] = mcp[1]
        if self.bank_standin and self.bank is None:
            roles["the bank stand-in"] = self.bank_port
        if self.model is not None and not self.model.alive():
            roles["the local model"] = self.model.config.port
        return {role: port for role, port in roles.items() if port}

    def check_ports_free(self) -> None:
        """PortsError naming each port of `listen_ports` something already listens on, and the
        role that needs it: a server that cannot bind exits, but another process on its port
        could answer the health checks in its place."""
        taken = [
            f"{port} ({role})"
            for role, port in self.listen_ports().items()
            if not listening_allowed(port)
        ]
        if taken:
            raise PortsError(
                f"already in use on 127.0.0.1: {', '.join(taken)}; stop what listens there or "
                "give the mesh other ports"
            )

    def start(self) -> Mesh:
        """The bank stand-in (if asked), the four servers (healthy), then Envoy (ready);
        PortsError, with nothing started, when the environment gives a service other ports
        (check_caller_env) or a port it needs is taken (check_ports_free)."""
        self.check_caller_env()
        self.check_ports_free()
        try:
            if self.bank_standin and self.bank is None:
                try:
                    self.bank = BankStandIn(self.bank_port).start()
                except OSError as exc:
                    raise MeshError(
                        f"the bank stand-in cannot listen on 127.0.0.1:{self.bank_port}: {exc}"
                    ) from exc
            if self.model is not None:
                try:
                    self.model.start()
                except RuntimeError as exc:
                    raise MeshError(f"the local model did not start: {exc}") from exc
            for spec in SERVICES:
                self.start_service(spec.key)
            for spec in SERVICES:
                self.wait_healthy(spec.key)
            config = render(
                self.ports,
                str(REPO_ROOT / "envoy" / "visior.pb"),
                access_log=self._access_log,
                timeouts=self.envoy_timeouts(),
                fault_injection=self._fault_injection,
            )
            self.envoy.start(config, self.workdir / "envoy")
            self.envoy.wait_ready()
            self._check_all_running()
        except BaseException:
            self.stop()
            raise
        return self

    def envoy_timeouts(self) -> dict[str, float] | None:
        """The caller's route timeouts over the local model's (when it runs)."""
        if self.model is None:
            return dict(self._timeouts) if self._timeouts is not None else None
        return {**local_envoy_timeouts(), **(self._timeouts or {})}

    def stop_service(self, key: str) -> int | None:
        """SIGTERM one service and wait for it (SIGKILL after `stop_wait`); its exit code."""
        proc = self._procs.pop(key, None)
        env = self._envs.pop(key, {})
        if proc is None:
            return None
        rc = terminate(proc, stop_wait(key, env))
        log = self._logs.pop(key, None)
        if log:
            log.close()
        return rc

    def stop(self) -> None:
        """Envoy, the servers, the local model, then the bank stand-in; safe to call twice."""
        self.envoy.stop()
        for key in list(self._procs):
            self.stop_service(key)
        if self.model is not None:
            self.model.stop()
        if self.bank is not None:
            self.bank.stop()
            self.bank = None

    def alive(self) -> dict[str, bool]:
        """Whether each process started is still running: the servers, the local model and
        Envoy. (The bank stand-in is a thread of this process.)"""
        alive = {k: p.poll() is None for k, p in self._procs.items()}
        if self.model is not None and self.model.pid is not None:
            alive["model"] = self.model.alive()
        if self.envoy.pid is not None:
            alive["envoy"] = not exited(self.envoy.pid)
        return alive

    def _check_all_running(self) -> None:
        """MeshError naming the processes that have exited since they were found ready."""
        dead = [key for key, up in self.alive().items() if not up]
        if dead:
            raise MeshError(f"{', '.join(dead)} exited during start-up; see {self.workdir}/")

    def pids(self) -> dict[str, int]:
        pids = {k: p.pid for k, p in self._procs.items()}
        if self.model is not None and self.model.pid is not None:
            pids["model"] = self.model.pid
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
