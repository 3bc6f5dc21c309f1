"""A real PostgreSQL server for the tests: initdb into a temporary directory, pg_ctl start on a
free loopback port, stopped at the end (no Docker, no system service).

The binaries come from Debian's `postgresql` package (/usr/lib/postgresql/<major>/bin, not on
PATH); `make test` and `make test-fast` install it when missing. initdb and postgres refuse
to run as root: as root they run as the package's `postgres` system user. Fixtures:
`pg_server` (one per session), `pg_url` (a fresh, empty database per test) and `open_store`
(document stores on either backend, for the tests both stores must pass).
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from services.common.topology import free_ports
from services.docstore.factory import open_document_store
from services.docstore.store import DocumentStore

INSTALL_HINT = (
    "PostgreSQL server binaries not found (looked for /usr/lib/postgresql/*/bin/initdb and "
    "initdb on PATH). Install them: `apt-get update && apt-get install -y postgresql` "
    "(`make test` / `make test-fast` do this), or set VISIOR_PG_BIN to their directory."
)


def find_bin_dir() -> Path:
    """The directory holding initdb, pg_ctl and postgres (newest major first)."""
    explicit = os.environ.get("VISIOR_PG_BIN")
    candidates = [Path(explicit)] if explicit else []
    majors = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates += majors
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).parent)
    for d in candidates:
        if (d / "initdb").is_file() and (d / "pg_ctl").is_file():
            return d
    pytest.fail(INSTALL_HINT, pytrace=False)


class PgCluster:
    """One throwaway cluster: trust auth for user `postgres`, loopback TCP + a socket in its dir."""

    def __init__(self, bin_dir: Path | None = None) -> None:
        self.bin_dir = bin_dir or find_bin_dir()
        self.root = Path(tempfile.mkdtemp(prefix="visior-pg-"))
        self.data = self.root / "data"
        self.port = free_ports(1)[0]
        self.host = "127.0.0.1"
        self._as_postgres: list[str] = []
        if os.geteuid() == 0:
            runuser = shutil.which("runuser")
            if runuser is None:
                pytest.fail("running as root needs `runuser` to start PostgreSQL as `postgres`")
            try:
                shutil.chown(self.root, user="postgres", group="postgres")
            except LookupError:
                pytest.fail(
                    "running as root: PostgreSQL refuses root and there is no `postgres` user "
                    "(the Debian package creates it): " + INSTALL_HINT,
                    pytrace=False,
                )
            self._as_postgres = [runuser, "-u", "postgres", "--"]
        self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
            "--locale=C", "--no-sync",
        )  # fmt: skip
        self.start()

    def _run(self, tool: str, *args: str) -> None:
        cmd = [*self._as_postgres, str(self.bin_dir / tool), *args]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(
                f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}\n{tail}"
            )

    def start(self) -> None:
        options = (
            f"-p {self.port} -h {self.host} -k {self.root} -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=300"
        )
        self._run(
            "pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data),
            "-l", str(self.root / "server.log"), "-o", options,
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "stop", "-w", "-t", "60", "-D", str(self.data), "-m", mode)

    def url(self, dbname: str = "postgres", password: str | None = None) -> str:
        auth = f"postgres:{password}" if password else "postgres"
        return f"postgresql://{auth}@{self.host}:{self.port}/{dbname}"

    _names = itertools.count()

    def create_database(self) -> str:
        """A new empty database; its name."""
        name = f"visior_test_{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
        return name

    def drop_database(self, name: str) -> None:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        except RuntimeError:
            pass  # already stopped
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgCluster]:
    """One PostgreSQL server for the session."""
    cluster = PgCluster()
    yield cluster
    cluster.destroy()


@pytest.fixture
def pg_url(pg_server: PgCluster) -> Iterator[str]:
    """The URL of a fresh, empty database on the session's server, dropped afterwards."""
    name = pg_server.create_database()
    yield pg_server.url(name)
    pg_server.drop_database(name)


Opener = Callable[..., DocumentStore]
"""Opens a document store (each call a new one) on the location `open_store` chose."""


@pytest.fixture(params=["sqlite", "postgresql"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens stores (each call a new one, with its own connections) on one location of the
    parametrized backend: an SQLite file, or a fresh database on the test PostgreSQL."""
    where = (
        str(tmp_path / "s.sqlite")
        if request.param == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    opened: list[DocumentStore] = []

    def opener(**kw: Any) -> DocumentStore:
        store = open_document_store(where, **kw)
        opened.append(store)
        return store

    yield opener
    for store in opened:
        store.close()
