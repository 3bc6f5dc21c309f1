"""terminate(): the one way the dev tools stop a child process."""

from __future__ import annotations

import signal
import subprocess
import sys

from services.devtools.processes import terminate


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
