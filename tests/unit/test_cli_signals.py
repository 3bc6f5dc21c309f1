"""`visior run` and `visior demo` stop the mesh whatever signal ends them, from before its
start to the end of its stop (the processes themselves: tests/integration/
test_cli_stops_its_processes.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

import services.cli.main as cli
from services.devtools.mesh import Mesh
from services.devtools.processes import child_pids

SIGNALS = [signal.SIGTERM, signal.SIGHUP, signal.SIGINT]


class Unhandled(Exception):
    """A stop signal reached the test's own handler: the CLI had none installed."""


def _unhandled(signum: int, frame: FrameType | None) -> None:
    raise Unhandled(signal.Signals(signum).name)


@pytest.fixture(autouse=True)
def guard() -> Iterator[None]:
    """A signal the CLI does not handle fails the test instead of ending pytest."""
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    for sig in SIGNALS:
        signal.signal(sig, _unhandled)
    yield
    for sig, handler in previous.items():
        signal.signal(sig, handler)


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What happened to the mesh; it starts and stops nothing."""
    seen: list[str] = []
    monkeypatch.setattr(Mesh, "start", lambda self: seen.append("start") or self)
    monkeypatch.setattr(Mesh, "stop", lambda self: seen.append("stop"))
    return seen


def _run(tmp_path: Path) -> list[str]:
    return ["run", "--data-dir", str(tmp_path / "data"), "--workdir", str(tmp_path / "run")]


def _signal_during_start(monkeypatch: pytest.MonkeyPatch, events: list[str], sig: int) -> None:
    def start(self: Mesh) -> Mesh:
        events.append("start")
        signal.raise_signal(sig)
        events.append("started")
        return self

    monkeypatch.setattr(Mesh, "start", start)


@pytest.mark.parametrize("sig", SIGNALS)
def test_demo_stopped_during_the_start_stops_the_mesh_and_exits_128_plus_the_signal(
    monkeypatch: pytest.MonkeyPatch, events: list[str], sig: int
) -> None:
    _signal_during_start(monkeypatch, events, sig)
    assert cli.main(["demo"]) == 128 + sig
    assert events == ["start", "stop"]


@pytest.mark.parametrize("sig", SIGNALS)
def test_run_stopped_during_the_start_stops_the_mesh_and_exits_0(
    monkeypatch: pytest.MonkeyPatch, events: list[str], sig: int, tmp_path: Path
) -> None:
    _signal_during_start(monkeypatch, events, sig)
    assert cli.main(_run(tmp_path)) == 0
    assert events == ["start", "stop"]


def test_run_stopped_once_up_says_it_stops_and_stops(
    monkeypatch: pytest.MonkeyPatch,
    events: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(cli, "_print_where", lambda mesh: signal.raise_signal(signal.SIGTERM))
    assert cli.main(_run(tmp_path)) == 0
    assert events == ["start", "stop"]
    assert capsys.readouterr().out == "stopping …\nstopped\n"


def test_a_signal_during_the_stop_does_not_cut_it_short(
    monkeypatch: pytest.MonkeyPatch, events: list[str], tmp_path: Path
) -> None:
    def stop(self: Mesh) -> None:
        events.append("stop")
        signal.raise_signal(signal.SIGTERM)  # a second `kill`, an impatient Ctrl-C
        events.append("stopped")

    _signal_during_start(monkeypatch, events, signal.SIGTERM)
    monkeypatch.setattr(Mesh, "stop", stop)
    assert cli.main(_run(tmp_path)) == 0
    assert events == ["start", "stop", "stopped"]


def test_a_signal_as_a_demo_ends_normally_still_lets_it_stop(
    monkeypatch: pytest.MonkeyPatch, events: list[str]
) -> None:
    def stop(self: Mesh) -> None:
        events.append("stop")
        signal.raise_signal(signal.SIGTERM)
        events.append("stopped")

    monkeypatch.setattr(Mesh, "stop", stop)
    monkeypatch.setattr(cli, "_print_where", lambda mesh: None)
    monkeypatch.setattr(cli, "ingest_samples", lambda url, timeout: 3)  # the demo ends here
    assert cli.main(["demo"]) == 3
    assert events == ["start", "stop", "stopped"]


@pytest.mark.parametrize("command", ["run", "demo"])
def test_the_handlers_before_the_command_are_back_after_it(
    monkeypatch: pytest.MonkeyPatch, events: list[str], tmp_path: Path, command: str
) -> None:
    _signal_during_start(monkeypatch, events, signal.SIGTERM)
    cli.main(_run(tmp_path) if command == "run" else ["demo"])
    assert {signal.getsignal(sig) for sig in SIGNALS} == {_unhandled}


def test_a_child_whose_popen_a_signal_interrupted_is_stopped_too(
    monkeypatch: pytest.MonkeyPatch, events: list[str]
) -> None:
    lost: list[subprocess.Popen[bytes]] = []

    def start(self: Mesh) -> Mesh:
        # Forked, then Stopped inside Popen: the mesh never got the Popen to stop.
        lost.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]))
        signal.raise_signal(signal.SIGTERM)
        return self

    monkeypatch.setattr(Mesh, "start", start)
    try:
        assert cli.main(["demo"]) == 128 + signal.SIGTERM
        assert lost[0].pid not in child_pids()
    finally:
        if lost[0].pid in child_pids():
            lost[0].kill()
            lost[0].wait()
