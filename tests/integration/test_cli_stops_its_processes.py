"""`visior run` and `visior demo` as real processes: a SIGTERM, once the mesh is up or
during its start, leaves none of the processes they started, and `run` ends when Envoy dies.

Every process the CLI starts inherits its environment, so a mark put there finds them all,
even the ones an exiting CLI left to init.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from services.devtools.envoy import REPO_ROOT

pytestmark = pytest.mark.e2e

MARK = "CLI_TEST_MARK"
"""Set in the CLI's environment (no service prefix: the services accept it)."""
UP_S = 180.0
"""Longest the mesh may take to come up on a loaded machine."""
STOP_S = 120.0
"""Longest the CLI may take to stop everything."""

LAUNCHER = """
import sys
import services.cli.main as cli
from services.common.topology import Ports


class FreePorts:
    # `run` listens on Ports()' fixed ports: here on free ones, beside any `make run`.
    def __new__(cls):
        return Ports.free()

    free = staticmethod(Ports.free)


cli.Ports = FreePorts
sys.exit(cli.main(sys.argv[1:]))
"""


def _environ(pid: int) -> dict[str, str]:
    """A process's environment; empty when it is gone, a zombie or not ours."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


@dataclass
class Cli:
    proc: subprocess.Popen[bytes]
    mark: str
    out: Path
    err: Path

    def started(self) -> dict[int, str]:
        """The live processes the CLI started (and theirs), by pid: their names."""
        return {
            pid: _comm(pid)
            for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
            if pid != self.proc.pid and _environ(pid).get(MARK) == self.mark
        }

    def said(self) -> str:
        return self.out.read_text(errors="replace") + self.err.read_text(errors="replace")


def _wait_for(predicate: Callable[[], object], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return bool(predicate())
        time.sleep(0.1)
    return True


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Cli]]:
    """Start `visior <args>` with a mark; at the end, kill whatever it left."""
    launched: list[Cli] = []

    def start(*args: str) -> Cli:
        mark = uuid.uuid4().hex
        out, err = tmp_path / f"{mark}.out", tmp_path / f"{mark}.err"
        env = {**os.environ, MARK: mark, "PYTHONUNBUFFERED": "1"}
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-c", LAUNCHER, *args],
                cwd=str(REPO_ROOT),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
            )
        launched.append(Cli(proc, mark, out, err))
        return launched[-1]

    yield start
    for cli in launched:
        if cli.proc.poll() is None:
            cli.proc.kill()
            cli.proc.wait()
        for pid in cli.started():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _stopped(cli: Cli) -> int:
    """SIGTERM the CLI; its exit code, once nothing it started runs any longer."""
    cli.proc.send_signal(signal.SIGTERM)
    rc = cli.proc.wait(STOP_S)
    # A grandchild (Retrieval's PDF reader) ends when its parent closes its stdin: give it
    # the moment that takes.
    _wait_for(lambda: not cli.started(), 10)
    assert cli.started() == {}, cli.said()
    return rc


def _run(tmp_path: Path) -> list[str]:
    return ["run", "--data-dir", str(tmp_path / "data"), "--workdir", str(tmp_path / "run")]


def _up(cli: Cli, last_line: str) -> dict[int, str]:
    assert _wait_for(lambda: last_line in cli.said(), UP_S), cli.said()
    started = cli.started()
    assert sorted(started.values()).count("envoy") == 1, started
    assert len(started) >= 5, started  # the four servers and Envoy
    return started


def _starting(cli: Cli) -> None:
    """Wait until the CLI has started a service, and has not finished starting the mesh."""
    assert _wait_for(lambda: cli.started(), UP_S), cli.said()
    assert "Visior mesh is up" not in cli.said()


def test_run_stops_everything_on_sigterm(launch: Callable[..., Cli], tmp_path: Path) -> None:
    cli = launch(*_run(tmp_path))
    _up(cli, "Ctrl-C stops everything.")
    assert _stopped(cli) == 0
    assert cli.out.read_text().endswith("stopping …\nstopped\n")


def test_run_stops_everything_on_sigterm_during_its_start(
    launch: Callable[..., Cli], tmp_path: Path
) -> None:
    cli = launch(*_run(tmp_path))
    _starting(cli)
    assert _stopped(cli) == 0


def test_demo_stops_everything_and_removes_its_directory_on_sigterm(
    launch: Callable[..., Cli],
) -> None:
    cli = launch("demo")
    started = _up(cli, "logs in ")
    data_dirs = {Path(_environ(pid).get("VISIOR_DATA_DIR", "")) for pid in started}
    assert _stopped(cli) == 128 + signal.SIGTERM
    (demo_dir,) = {d.parent for d in data_dirs if d.name == "data"}
    assert demo_dir.name.startswith("visior-demo-") and not demo_dir.exists()


def test_demo_stops_everything_on_sigterm_during_its_start(launch: Callable[..., Cli]) -> None:
    cli = launch("demo")
    _starting(cli)
    assert _stopped(cli) == 128 + signal.SIGTERM


def test_run_ends_and_stops_everything_when_envoy_dies(
    launch: Callable[..., Cli], tmp_path: Path
) -> None:
    cli = launch(*_run(tmp_path))
    started = _up(cli, "Ctrl-C stops everything.")
    (envoy,) = [pid for pid, name in started.items() if name == "envoy"]
    os.kill(envoy, signal.SIGKILL)
    assert cli.proc.wait(STOP_S) == 1
    assert "error: envoy exited" in cli.said()
    assert _wait_for(lambda: not cli.started(), 10), cli.started()


def test_run_killed_by_sigkill_leaves_nothing_running(
    launch: Callable[..., Cli], tmp_path: Path
) -> None:
    """SIGKILL gives the CLI no handler to run: its children stop on their parent-death
    signal (services.devtools.processes.dying_with_us), each as at a SIGTERM."""
    cli = launch(*_run(tmp_path))
    _up(cli, "Ctrl-C stops everything.")
    cli.proc.kill()
    cli.proc.wait()
    assert _wait_for(lambda: not cli.started(), STOP_S), cli.started()
