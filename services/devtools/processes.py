"""Stopping the child processes the dev tools start (servers, Envoy, the local model)."""

from __future__ import annotations

import signal
import subprocess


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
