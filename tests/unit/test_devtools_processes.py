"""terminate(): the one way the dev tools stop a child process; stop_strays(): the children no
Popen holds any longer; exited(): a child's liveness without reaping it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from services.devtools import processes
from services.devtools.processes import (
    child_pids,
    dying_with_us,
    exited,
    stop_strays,
    terminate,
)


def _python(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)


def test_a_running_process_gets_sigterm_and_its_exit_code_is_returned() -> None:
    proc = _python("import time; print('up', flush=True); time.sleep(60)")
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    assert terminate(proc, grace=30) == -signal.SIGTERM


def test_an_exited_process_keeps_its_own_exit_code() -> None:
    proc = _python("raise SystemExit(3)")
    proc.wait()
    assert terminate(proc, grace=30) == 3


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    proc = _python(
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        " print('up', flush=True); time.sleep(60)"
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    assert terminate(proc, grace=0.2) == -signal.SIGKILL


# --- children no Popen holds any longer (stop_strays) ---

SLEEPER = "import time; print('up', flush=True); time.sleep(60)"


def _started(code: str = SLEEPER) -> subprocess.Popen[bytes]:
    proc = _python(code)
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    return proc


def test_a_child_started_since_the_snapshot_is_stopped_and_reaped() -> None:
    before = child_pids()
    proc = _started()
    try:
        assert proc.pid in child_pids()
        assert stop_strays(before, grace=30) == [proc.pid]
        assert proc.pid not in child_pids()  # reaped: not even a zombie
    finally:
        if proc.pid in child_pids():
            proc.kill()
            proc.wait()


def test_a_child_from_before_the_snapshot_is_left_alone() -> None:
    proc = _started()
    try:
        assert stop_strays(child_pids(), grace=30) == []
        assert proc.poll() is None
    finally:
        terminate(proc, grace=30)


def test_a_stray_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    before = child_pids()
    proc = _started(
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        " print('up', flush=True); time.sleep(60)"
    )
    try:
        assert stop_strays(before, grace=0.2) == [proc.pid]
        assert proc.pid not in child_pids()
    finally:
        if proc.pid in child_pids():
            proc.kill()
            proc.wait()


def test_exited_tells_a_running_child_from_a_dead_one_and_leaves_its_exit_code() -> None:
    proc = _started()
    assert not exited(proc.pid)
    proc.kill()
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped
    assert exited(proc.pid)
    assert proc.wait() == -signal.SIGKILL
    assert exited(proc.pid)  # reaped: exited all the same


# --- children that outlive a killed parent (dying_with_us) ---


def test_a_child_gets_sigterm_when_its_parent_is_killed(tmp_path: Path) -> None:
    """A parent killed by SIGKILL (no handler of its own runs) still stops its child: the
    parent-death signal set through setpriv sends it SIGTERM."""
    marker = tmp_path / "terminated"
    child = (
        "import signal, sys, time\n"
        f"stop = lambda *_: (open({str(marker)!r}, 'w').close(), sys.exit(0))\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = _python(
        "import subprocess, sys, time\n"
        "from services.devtools.processes import dying_with_us\n"
        f"subprocess.Popen(dying_with_us([sys.executable, '-c', {child!r}]))\n"
        "time.sleep(60)\n"
    )
    assert parent.stdout is not None and parent.stdout.readline() == b"up\n"  # the child's
    parent.kill()
    parent.wait()
    give_up = time.monotonic() + 30
    while not marker.exists():
        assert time.monotonic() < give_up, "the child was not stopped"
        time.sleep(0.05)


def test_a_child_of_the_main_thread_runs_under_setpriv() -> None:
    cmd = ["envoy", "-c", "x.yaml"]
    wrapped = dying_with_us(cmd)
    assert Path(wrapped[0]).name == "setpriv"
    assert wrapped[1:] == ["--pdeathsig", "TERM", "--", *cmd]


def test_a_worker_thread_s_child_is_left_as_it_is() -> None:
    """The signal follows the thread that starts the child: from a worker thread the command
    is left as it is, or the thread's end would stop the child."""
    cmd = ["envoy", "-c", "x.yaml"]
    found: list[list[str]] = []
    worker = threading.Thread(target=lambda: found.append(dying_with_us(cmd)))
    worker.start()
    worker.join()
    assert found == [cmd]


def test_without_setpriv_the_command_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processes.shutil, "which", lambda name: None)
    assert dying_with_us(["envoy"]) == ["envoy"]
