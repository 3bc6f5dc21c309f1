"""Where `visior run` puts the mesh: `--ports free` moves every port off the fixed ones, a
port variable the caller set is never overwritten unsaid, a taken port's error names how to
move the mesh, and the banner lists the MCP endpoint when it is on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import services.cli.main as cli
from services.common.topology import Ports
from services.devtools import mesh as mesh_mod
from services.devtools.mesh import Mesh, MeshError, PortsError

PORT_VARS = [
    "ORCH_PORT",
    "LLM_SERVICE_PORT",
    "RETR_PORT",
    "MCP_PROXY_PORT",
    "ORCH_METRICS_PORT",
    "LLM_SERVICE_METRICS_PORT",
    "RETR_METRICS_PORT",
    "MCP_PROXY_METRICS_PORT",
    "ORCH_RETRIEVAL_URL",
    "ORCH_LLM_SERVICE_URL",
    "MCP_PROXY_URL",
    "MCP_PROXY_RETRIEVAL_URL",
]
"""Every variable the mesh sets for its services (configuration.md's names)."""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [*PORT_VARS, "MCP_PROXY_MCP_ENABLED", "MCP_PROXY_MCP_PORT", "MCP_PROXY_MCP_HOST"]:
        monkeypatch.delenv(name, raising=False)


def _all(ports: Ports) -> list[int]:
    return [*ports.grpc.values(), *ports.http.values(), *ports.metrics.values(), ports.envoy_admin]


def _run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *flags: str) -> tuple[int, Mesh]:
    """`visior run <flags>` up to its mesh's start, which fails at once: nothing runs."""
    built: list[Mesh] = []

    def start(self: Mesh) -> Mesh:
        built.append(self)
        raise MeshError("not started in a unit test")

    monkeypatch.setattr(Mesh, "start", start)
    argv = ["run", "--data-dir", str(tmp_path / "d"), "--workdir", str(tmp_path / "w"), *flags]
    return cli.main(argv), built[0]


def test_the_set_of_variables_is_what_the_mesh_sets(tmp_path: Path) -> None:
    assert set(Mesh(Ports(), tmp_path, tmp_path).wiring()) == set(PORT_VARS)


# --- another place for the whole mesh ---


def test_run_listens_on_the_fixed_ports_unless_told(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rc, mesh = _run(monkeypatch, tmp_path)
    assert rc == 1 and mesh.ports == Ports()


def test_run_ports_free_moves_every_port_off_the_fixed_ones(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rc, mesh = _run(monkeypatch, tmp_path, "--ports", "free")
    assert rc == 1
    moved = _all(mesh.ports)
    assert len(set(moved)) == len(moved) == 13
    assert not set(moved) & set(_all(Ports()))
    assert mesh.bank_port not in moved
    # The services are told the moved ports and neighbours.
    env = mesh.env()
    assert env["ORCH_PORT"] == str(mesh.ports.grpc["orchestrator"])
    assert env["ORCH_RETRIEVAL_URL"] == f"127.0.0.1:{mesh.ports.grpc['retrieval']}"


def test_run_help_names_the_ports_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    assert "--ports {fixed,free}" in capsys.readouterr().out


def test_a_taken_port_names_the_way_to_move_the_mesh(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    taken = Ports().http["orchestrator"]
    monkeypatch.setattr(mesh_mod, "listening_allowed", lambda port: port != taken)
    monkeypatch.setattr(Mesh, "start_service", _no_start)
    argv = ["run", "--data-dir", str(tmp_path / "d"), "--workdir", str(tmp_path / "w")]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert f"{taken} (Envoy's orchestrator JSON listener)" in err
    assert "visior run --ports free" in err


def _no_start(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a service was started")


# --- a port variable the caller set ---


@pytest.mark.parametrize("name", PORT_VARS)
def test_a_port_variable_in_the_environment_stops_the_start_naming_it(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(name, "60999" if "PORT" in name else "127.0.0.1:60999")
    monkeypatch.setattr(Mesh, "start_service", _no_start)
    mesh = Mesh(Ports.free(), tmp_path / "d", tmp_path / "w", bank_standin=True)
    with pytest.raises(PortsError, match=f"{name}=") as caught:
        mesh.start()
    assert "60999" in str(caught.value)
    assert mesh.bank is None


def test_run_says_which_variable_and_how_to_move_the_mesh(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RETR_PORT", "60053")
    monkeypatch.setattr(Mesh, "start_service", _no_start)
    argv = ["run", "--data-dir", str(tmp_path / "d"), "--workdir", str(tmp_path / "w")]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "RETR_PORT=60053" in err and "unset it" in err
    assert "visior run --ports free" in err


@pytest.mark.parametrize("value", ["", "  "])
def test_a_blank_port_variable_is_unset(
    value: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ORCH_PORT", value)
    Mesh(Ports(), tmp_path, tmp_path).check_caller_env()


def test_a_port_variable_the_mesh_agrees_with_or_is_given_is_kept(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ORCH_PORT", str(Ports().grpc["orchestrator"]))
    Mesh(Ports(), tmp_path, tmp_path).check_caller_env()
    monkeypatch.setenv("RETR_METRICS_PORT", "0")
    given = Mesh(Ports(), tmp_path, tmp_path, env={"RETR_METRICS_PORT": "0"})
    given.check_caller_env()  # the mesh's own env is the caller's word, and wins
    assert given.env()["RETR_METRICS_PORT"] == "0"


# --- the MCP endpoint ---


def test_the_banner_lists_the_mcp_endpoint_when_it_is_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mesh = Mesh(Ports(), tmp_path, tmp_path)
    cli._print_where(mesh)
    assert "/mcp" not in capsys.readouterr().out
    monkeypatch.setenv("MCP_PROXY_MCP_ENABLED", "true")
    cli._print_where(mesh)
    assert "http://127.0.0.1:8090/mcp" in capsys.readouterr().out
    monkeypatch.setenv("MCP_PROXY_MCP_PORT", "18090")
    cli._print_where(mesh)
    assert "http://127.0.0.1:18090/mcp" in capsys.readouterr().out


def test_the_mcp_port_is_checked_before_the_start_when_the_endpoint_is_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    mesh = Mesh(Ports.free(), tmp_path, tmp_path)
    assert 8090 not in mesh.listen_ports().values()
    monkeypatch.setenv("MCP_PROXY_MCP_ENABLED", "true")
    assert mesh.listen_ports()["the MCP endpoint, MCP_PROXY_MCP_PORT"] == 8090
