"""`visior` from any directory and with a stray variable.

Every path the launcher hands to a child process (Envoy, the local model server, the
services) is absolute, a relative one taken from the caller's working directory; the CLI's
defaults are the repository's data/ and .run/. The services' check of undeclared names runs
for the commands that start them, and a setting the CLI cannot use is one `error:` line
and exit code 2. Nothing is started: the processes are fakes that record their command.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

import services.cli.main as cli
from services.common.settings import SettingsError
from services.common.topology import Ports, free_ports
from services.devtools import envoy as envoy_mod
from services.devtools import local_model as lm
from services.devtools import mesh as mesh_mod
from services.devtools.envoy import REPO_ROOT, EnvoyProcess
from services.devtools.local_model import LocalModelConfig
from services.devtools.mesh import Mesh, MeshError

STRAY = "ORCH_TIMEOUT"
"""A prefixed name no service declares."""


class FakeProc:
    """A child process that is never started: records its command line and options."""

    calls: list[tuple[list[str], dict[str, Any]]]

    def __init__(self, cmd: list[str], **kw: Any) -> None:
        FakeProc.calls.append((list(cmd), kw))
        self.pid = 4242
        self.returncode = None

    def poll(self) -> None:
        return None


@pytest.fixture
def caller_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The caller's working directory: anywhere but the repository."""
    here = tmp_path.resolve() / "caller"
    here.mkdir()
    monkeypatch.chdir(here)
    for name in ("VISIOR_DATA_DIR", "LLM_RUNTIME_URL", STRAY):
        monkeypatch.delenv(name, raising=False)
    return here


@pytest.fixture
def fake_procs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], dict[str, Any]]]:
    FakeProc.calls = []
    monkeypatch.setattr(subprocess, "Popen", FakeProc)
    monkeypatch.setattr(envoy_mod, "envoy_binary", lambda: "envoy")
    monkeypatch.setattr(envoy_mod, "terminate", lambda proc, grace: 0)
    monkeypatch.setattr(mesh_mod, "terminate", lambda proc, grace: 0)
    monkeypatch.setattr(mesh_mod, "exited", lambda pid: False)
    monkeypatch.setattr(Mesh, "check_ports_free", lambda self: None)  # Ports(): make run's
    monkeypatch.setattr(Mesh, "wait_healthy", lambda self, key, timeout=30.0: None)
    monkeypatch.setattr(EnvoyProcess, "wait_ready", lambda self, timeout=15.0: None)
    return FakeProc.calls


def _arg(cmd: list[str], flag: str) -> Path:
    return Path(cmd[cmd.index(flag) + 1])


# --- A: paths handed to the children ---------------------------------------------------------


def test_a_relative_mesh_gives_its_children_absolute_paths(caller_dir: Path, fake_procs) -> None:
    mesh = Mesh(Ports(), "d", "w").start()
    mesh.stop()
    assert (mesh.data_dir, mesh.workdir) == (caller_dir / "d", caller_dir / "w")
    envoy_cmd, envoy_kw = next(c for c in fake_procs if "-c" in c[0])
    config = _arg(envoy_cmd, "-c")
    assert config == caller_dir / "w" / "envoy" / "envoy.yaml" and config.is_file()
    assert envoy_kw["cwd"] == str(REPO_ROOT)
    services = [kw for cmd, kw in fake_procs if "-c" not in cmd]
    assert len(services) == 4
    assert {kw["env"]["VISIOR_DATA_DIR"] for kw in services} == {str(caller_dir / "d")}


def test_envoy_gets_an_absolute_config_path(caller_dir: Path, fake_procs, monkeypatch) -> None:
    proc = EnvoyProcess()
    proc.start("admin: {address: {socket_address: {port_value: 9901}}}", "run/envoy")
    proc.stop()
    assert _arg(fake_procs[0][0], "-c") == caller_dir / "run" / "envoy" / "envoy.yaml"
    ran: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: ran.append(cmd))
    envoy_mod.validate("run/envoy/envoy.yaml")
    assert _arg(ran[0], "-c") == caller_dir / "run" / "envoy" / "envoy.yaml"


@pytest.mark.parametrize("given", ["d", None])
def test_the_model_server_gets_an_absolute_model_path(
    caller_dir: Path, monkeypatch: pytest.MonkeyPatch, given: str | None
) -> None:
    monkeypatch.setattr(lm, "missing", lambda reqs: [])
    monkeypatch.setattr(lm, "verified", lambda path, spec: True)
    monkeypatch.setattr(lm, "gguf_name", lambda path: "qwen")
    config = LocalModelConfig(install=False) if given is None else LocalModelConfig(Path(given))
    model = lm.LocalModel(config=config, progress=lambda message: None)
    path = _arg(model.command(model.prepare()), "--model")
    root = REPO_ROOT / "data" if given is None else caller_dir / given
    assert path == root / "models" / lm.QWEN_CODER_1_5B.file_name
    assert lm.LocalModel("w", config).config.data_dir == caller_dir / "w"


def _mesh_of(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> tuple[int, Mesh]:
    """The Mesh `visior <argv>` builds (its start fails at once: nothing runs)."""
    built: list[Mesh] = []

    def start(self: Mesh) -> Mesh:
        built.append(self)
        raise MeshError("not started in a unit test")

    monkeypatch.setattr(Mesh, "start", start)
    rc = cli.main(argv)
    return rc, built[0]


@pytest.mark.parametrize("data_dir", [None, "rel-data"])
def test_the_cli_defaults_are_the_repositorys_and_a_relative_path_the_callers(
    caller_dir: Path, monkeypatch: pytest.MonkeyPatch, data_dir: str | None
) -> None:
    if data_dir is not None:
        monkeypatch.setenv("VISIOR_DATA_DIR", data_dir)
    expected = REPO_ROOT / "data" if data_dir is None else caller_dir / data_dir
    rc, mesh = _mesh_of(monkeypatch, ["run", "--model", "local"])
    assert rc == 1 and mesh.model is not None
    assert (mesh.data_dir, mesh.workdir) == (expected, REPO_ROOT / ".run")
    assert mesh.model.config.data_dir == expected
    assert mesh.model.log_path == REPO_ROOT / ".run" / "model.log"
    rc, mesh = _mesh_of(monkeypatch, ["demo", "--model", "local"])
    assert mesh.model is not None and mesh.model.config.data_dir == expected
    argv = ["run", "--model", "local", "--data-dir", "x", "--workdir", "y"]
    rc, mesh = _mesh_of(monkeypatch, argv)
    assert (mesh.data_dir, mesh.workdir) == (caller_dir / "x", caller_dir / "y")
    assert mesh.model is not None and mesh.model.config.data_dir == caller_dir / "x"


# --- B: the undeclared-name check and SettingsError ------------------------------------------


@pytest.mark.parametrize("command", ["list", "ask", "ingest"])
def test_a_stray_variable_does_not_stop_a_client_command(
    caller_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    monkeypatch.setenv(STRAY, "5")
    url = f"http://127.0.0.1:{free_ports(1)[0]}"  # nothing listens there
    (caller_dir / "a.md").write_text("# a\n\ntext\n", encoding="utf-8")
    argv = {
        "list": ["list", "--tenant", "t"],
        "ask": ["ask", "q"],
        "ingest": ["ingest", "a.md", "--tenant", "t"],
    }[command]
    assert cli.main([*argv, "--url", url, "--timeout", "5"]) == 1
    out = capsys.readouterr()
    said = out.err if command != "ingest" else out.out
    assert url in said or "failed" in said  # the connection failed, not the setting
    assert STRAY not in out.err + out.out


@pytest.mark.parametrize("command", ["run", "demo"])
def test_a_stray_variable_stops_run_and_demo_with_one_error_line(
    caller_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    monkeypatch.setenv(STRAY, "5")
    monkeypatch.setattr(Mesh, "start", lambda self: pytest.fail("nothing starts"))
    assert cli.main([command]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {STRAY} is set, but no Visior service reads it")
    assert err.count("\n") == 1


def test_a_settings_error_in_run_is_one_error_line_and_exit_2(
    caller_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(*args: Any, **kw: Any) -> int:
        raise SettingsError("MAX_COMPLETION_TOKENS=9 is below the minimum 16")

    monkeypatch.setattr(cli, "run", run)
    assert cli.main(["run"]) == 2
    assert capsys.readouterr().err == "error: MAX_COMPLETION_TOKENS=9 is below the minimum 16\n"
