"""Stopping the child processes the dev tools start (servers, Envoy, the local model)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Collection
from pathlib import Path

PROC = Path("/proc")


def dying_with_us(cmd: list[str]) -> list[str]:
    """`cmd`, run so that the child gets SIGTERM when this process dies, even by SIGKILL
    (Linux's parent-death signal, which util-linux's setpriv sets before it execs `cmd`).

    The signal follows the thread that starts the child, so only the main thread's children
    get it: a worker thread's end would stop them. Elsewhere, or without setpriv, `cmd` as it
    is (preexec_fn could set the signal without setpriv, but is unsafe beside other threads).
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None or threading.current_thread() is not threading.main_thread():
        return cmd
    return [setpriv, "--pdeathsig", "TERM", "--", *cmd]


def terminate(proc: subprocess.Popen[bytes], grace: float) -> int | None:
    """SIGTERM `proc` if it still runs, wait up to `grace` seconds, then SIGKILL; its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def exited(pid: int) -> bool:
    """Whether our child process `pid` has exited, without reaping it: the Popen that started
    it still gets its exit code. A child already reaped has exited too."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def child_pids() -> set[int]:
    """This process's children, running or not yet reaped, from /proc (empty without it)."""
    me = os.getpid()
    found = set()
    for entry in PROC.glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        # pid (comm) state ppid …: the name may hold spaces and parentheses.
        if int(stat.rpartition(")")[2].split()[1]) == me:
            found.add(int(entry.name))
    return found


def stop_strays(before: Collection[int], grace: float) -> list[int]:
    """SIGTERM this process's children that are not in `before` (child_pids() taken earlier),
    wait up to `grace` seconds, SIGKILL those left, and reap them all; their pids.

    For children no Popen holds any longer: a signal handler's exception that interrupts
    Popen after its fork loses the Popen, and the child would outlive its parent unseen.
    Only for a process whose every child is its own to stop (the CLI): anything started
    since `before` counts.
    """
    strays = sorted(child_pids() - set(before))
    for pid in strays:
        _send(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    left = set(strays)
    while left and time.monotonic() < deadline:
        left = {pid for pid in left if not _reaped(pid)}
        if left:
            time.sleep(0.05)
    for pid in left:
        _send(pid, signal.SIGKILL)
        _reaped(pid, block=True)
    return strays


def _send(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _reaped(pid: int, block: bool = False) -> bool:
    """Reap child `pid` if it has exited (wait for it with `block`); whether it is gone."""
    try:
        return os.waitpid(pid, 0 if block else os.WNOHANG)[0] != 0
    except ChildProcessError:  # reaped already
        return True
