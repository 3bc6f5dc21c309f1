"""The mesh reads the services' settings by their own rules: a blank value is unset, and a
stopping service gets its own drain and grace (services/common/settings.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from services.common.settings import Env, ServerSettings
from services.common.topology import Ports
from services.devtools import mesh as mesh_mod
from services.devtools.local_model import LocalModelConfig
from services.devtools.mesh import LOCAL_RESPOND_TIMEOUT_S, Mesh, local_model_env
from services.model_runtime.config import runtime_settings
from services.orchestrator.config import OrchestratorSettings

LOCAL_URL = "http://127.0.0.1:5999"


class _RunningModel:
    """Stands in for a started `LocalModel` in the env the mesh builds (no process)."""

    alias = "tiny-alias"
    base_url = LOCAL_URL
    config = LocalModelConfig(n_ctx=4096)
    pid = 1

    def alive(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [*local_model_env("u", "m", 8192), "MAX_COMPLETION_TOKENS"]:
        monkeypatch.delenv(name, raising=False)
    for prefix in ("ORCH_", "LLM_SERVICE_", "RETR_", "MCP_PROXY_"):
        monkeypatch.delenv(prefix + "GRACE_SECONDS", raising=False)
        monkeypatch.delenv(prefix + "DRAIN_SECONDS", raising=False)


def _mesh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, name: str, value: str
) -> Mesh:
    """A mesh asked for the local model, with `name`=`value` in the process environment or
    in the mesh's own `env`."""
    if where == "environment":
        monkeypatch.setenv(name, value)
    given = {name: value} if where == "mesh env" else None
    return Mesh(
        Ports(), tmp_path, tmp_path, env=given, local_model=LocalModelConfig(data_dir=tmp_path)
    )


# --- a blank value is unset ---


@pytest.mark.parametrize("value", ["", " ", "\t\n"])
def test_a_blank_runtime_url_is_no_remote_runtime(value: str) -> None:
    assert mesh_mod.remote_runtime({"LLM_RUNTIME_URL": value}) is None


def test_the_remote_runtime_is_the_url_as_the_llm_service_reads_it() -> None:
    env = {"LLM_RUNTIME_URL": "  http://runtime.example:8000 ", "DEFAULT_MODEL_NAME": "m"}
    settings = runtime_settings(Env(env))
    assert settings is not None
    assert mesh_mod.remote_runtime(env) == settings.url == "http://runtime.example:8000"


@pytest.mark.parametrize("where", ["environment", "mesh env"])
def test_a_blank_runtime_url_starts_the_local_model(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mesh = _mesh(tmp_path, monkeypatch, where, "LLM_RUNTIME_URL", " ")
    assert mesh.remote_runtime is None
    assert mesh.model is not None
    mesh.model = _RunningModel()  # type: ignore[assignment]
    settings = runtime_settings(Env(mesh.env()))  # the LLM service starts
    assert settings is not None and settings.url == LOCAL_URL


@pytest.mark.parametrize("where", ["environment", "mesh env"])
def test_a_blank_setting_gets_the_local_models_value(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mesh = _mesh(tmp_path, monkeypatch, where, "ORCH_LLM_TIMEOUT_SECONDS", "  ")
    mesh.model = _RunningModel()  # type: ignore[assignment]
    env = mesh.env()
    assert env["ORCH_LLM_TIMEOUT_SECONDS"] == f"{LOCAL_RESPOND_TIMEOUT_S:g}"
    orch = OrchestratorSettings.from_env(Env(env))  # the orchestrator starts
    assert orch.llm.timeout_seconds == LOCAL_RESPOND_TIMEOUT_S


@pytest.mark.parametrize("where", ["environment", "mesh env"])
def test_a_set_setting_still_wins_over_the_local_models(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mesh = _mesh(tmp_path, monkeypatch, where, "ORCH_LLM_TIMEOUT_SECONDS", "42")
    mesh.model = _RunningModel()  # type: ignore[assignment]
    assert mesh.env()["ORCH_LLM_TIMEOUT_SECONDS"] == "42"


# --- a stopping service gets its own drain and grace ---


def test_the_stop_wait_is_the_services_own_drain_and_grace() -> None:
    default = ServerSettings("orchestrator")
    margin = mesh_mod.STOP_MARGIN_S
    wait = mesh_mod.stop_wait
    assert wait("orchestrator", {}) == default.drain_seconds + default.grace_seconds + margin
    env = {"ORCH_GRACE_SECONDS": "30", "ORCH_DRAIN_SECONDS": "2", "LLM_SERVICE_GRACE_SECONDS": "99"}
    assert wait("orchestrator", env) == 32 + margin
    assert wait("llm", env) == 99 + default.drain_seconds + margin
    assert wait("retrieval", {"RETR_GRACE_SECONDS": " "}) == wait("retrieval", {})
    # A value the service refuses: it never started, any wait will do.
    assert wait("toolsproxy", {"MCP_PROXY_GRACE_SECONDS": "soon"}) == wait("toolsproxy", {})


class _Proc:
    pid = 4242

    def poll(self) -> int | None:
        return None


@pytest.mark.parametrize("where", ["environment", "mesh env"])
def test_stop_service_waits_for_the_grace_the_service_was_started_with(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits: list[float] = []

    def popen(*_: Any, **__: Any) -> _Proc:
        return _Proc()

    def terminate(_: subprocess.Popen[bytes], grace: float) -> int:
        waits.append(grace)
        return 0

    monkeypatch.setattr(mesh_mod.subprocess, "Popen", popen)
    monkeypatch.setattr(mesh_mod, "terminate", terminate)
    mesh = _mesh(tmp_path, monkeypatch, where, "ORCH_GRACE_SECONDS", "30")
    mesh.start_service("orchestrator")
    monkeypatch.setenv("ORCH_GRACE_SECONDS", "1")  # after the start: not what it runs with
    assert mesh.stop_service("orchestrator") == 0
    drain = ServerSettings("orchestrator").drain_seconds
    assert len(waits) == 1 and waits[0] > 30 + drain
    assert waits == [30 + drain + mesh_mod.STOP_MARGIN_S]


# --- each service listens where the mesh put it ---


def test_each_service_reads_the_ports_the_mesh_gives_it(tmp_path: Path) -> None:
    ports = Ports(
        grpc={"orchestrator": 1001, "llm": 1002, "retrieval": 1003, "toolsproxy": 1004},
        metrics={"orchestrator": 2001, "llm": 2002, "retrieval": 2003, "toolsproxy": 2004},
    )
    env = Env(Mesh(ports, tmp_path, tmp_path).env())
    for key in ports.grpc:
        server = ServerSettings.for_service(key, env)
        assert (server.port, server.metrics_port) == (ports.grpc[key], ports.metrics[key])
