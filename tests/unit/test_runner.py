"""services.common.runner: the start-up heap freeze, run_service's exit on a bad setting
(found while loading or while starting: status 2 and one log line, not a traceback) and on
an address it cannot listen on (status 1, one line), and a RunningServer's stop taking its
companion listeners along."""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from grpc_health.v1 import health
from prometheus_client import CollectorRegistry

from services.common.runner import freeze_startup_heap, run_service
from services.common.server import RunningServer
from services.common.settings import ServerSettings, SettingsError
from services.common.startup import DependencyUnavailableError
from services.docstore.errors import StoreUnavailableError
from services.retrieval.embeddings import EmbeddingBackendError
from services.retrieval.index.base import IndexLockedError, IndexUnavailableError


class Node:
    def __init__(self) -> None:
        self.peer: Node | None = None


def test_the_startup_heap_is_frozen_so_full_collections_skip_it():
    gc.unfreeze()
    try:
        heap = [Node() for _ in range(200_000)]  # a big start-up heap, cycles included
        for a, b in itertools.pairwise(heap):
            a.peer, b.peer = b, a
        gc.collect()
        unfrozen_gen2 = len(gc.get_objects(generation=2))
        frozen = freeze_startup_heap()
        assert frozen >= len(heap)
        # The objects left to the collector are what came after start-up, not the heap.
        assert len(gc.get_objects(generation=2)) < unfrozen_gen2 - len(heap)
        assert all(gc.is_tracked(n) for n in heap[:3]) and heap[1].peer is heap[2]
    finally:
        gc.unfreeze()


_ROOT = Path(__file__).resolve().parents[2]
_PATH = os.pathsep.join([str(_ROOT / "gen" / "python"), str(_ROOT)])


@dataclass(frozen=True)
class _Settings:
    server: ServerSettings


@pytest.fixture(autouse=True)
def _keep_logging():
    """run_service configures the root logger (JSON to stderr); put pytest's back after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_a_setting_refused_while_loading_exits_2(capfd: pytest.CaptureFixture[str]) -> None:
    def load() -> _Settings:
        raise SettingsError("RETR_PORT must be a number")

    async def start(settings: _Settings):  # pragma: no cover - never reached
        raise AssertionError("started with bad settings")

    with pytest.raises(SystemExit) as exit_info:
        run_service(load, start)
    assert exit_info.value.code == 2
    err = capfd.readouterr().err
    assert "bad setting: RETR_PORT must be a number" in err
    assert "Traceback" not in err


def test_a_setting_refused_while_starting_exits_2(capfd: pytest.CaptureFixture[str]) -> None:
    started = []

    def load() -> _Settings:
        return _Settings(server=ServerSettings(service="test"))

    async def start(settings: _Settings):
        started.append(settings)
        raise SettingsError("RERANK_MODEL_PATH /m: cannot load the ONNX model")

    with pytest.raises(SystemExit) as exit_info:
        run_service(load, start)
    assert started and exit_info.value.code == 2
    err = capfd.readouterr().err
    assert "bad setting: RERANK_MODEL_PATH /m: cannot load the ONNX model" in err
    assert "Traceback" not in err


_LISTEN_ON_A_TAKEN_PORT = """
import sys
from dataclasses import dataclass
from prometheus_client import CollectorRegistry
from services.common.runner import run_service
from services.common.server import start_server
from services.common.settings import ServerSettings

@dataclass(frozen=True)
class Settings:
    server: ServerSettings

async def start(settings):
    running = await start_server(
        settings.server, lambda server: None, (), CollectorRegistry(), domain="visior.test"
    )
    await running.stop(0)
    raise AssertionError("listening on a taken port")

run_service(lambda: Settings(ServerSettings(service="test", port=int(sys.argv[1]))), start)
"""
"""run_service as a service's process runs it: a grpc.aio server made on asyncio.run's loop
is left in its own process, not in the test worker's, where grpc's aio engine outlives it."""


def test_a_port_it_cannot_listen_on_exits_1_naming_it() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-c", _LISTEN_ON_A_TAKEN_PORT, str(port)],
            capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": _PATH},
        )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert f"cannot start: cannot listen for gRPC on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr


class _HeldServer:
    """A grpc.aio.Server stand-in whose stop waits until a companion has started stopping."""

    def __init__(self, companion_started: asyncio.Event) -> None:
        self.companion_started = companion_started
        self.grace: float | None = None

    async def stop(self, grace: float) -> None:
        self.grace = grace
        await self.companion_started.wait()


async def test_companion_listeners_stop_beside_the_grpc_server_with_its_grace() -> None:
    started = asyncio.Event()
    graces: list[float] = []

    async def companion(grace: float) -> None:
        graces.append(grace)
        started.set()

    server = _HeldServer(started)
    servicer = health.aio.HealthServicer()
    running = RunningServer(server, 0, servicer, (), CollectorRegistry(), companions=[companion])  # type: ignore[arg-type]
    # One after the other, the gRPC stop would wait for the companion for ever.
    await asyncio.wait_for(running.stop(7.0), timeout=5)
    assert server.grace == 7.0 and graces == [7.0]


# -- start-up failures with no bad setting: one "cannot start" line, exit 1 ------------------


def _exit_of(failure: BaseException, capfd: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """run_service's exit status and stderr when starting raises `failure`."""

    async def start(settings: _Settings):
        raise failure

    with pytest.raises(SystemExit) as exit_info:
        run_service(lambda: _Settings(ServerSettings(service="test")), start)
    code = exit_info.value.code
    assert isinstance(code, int)
    return code, capfd.readouterr().err


@pytest.mark.parametrize(
    "failure",
    [
        StoreUnavailableError("document store (PostgreSQL postgresql://u:***@h:1/db): refused"),
        EmbeddingBackendError("cannot reach the embedding backend"),
    ],
    ids=["store", "embedder"],
)
def test_an_unreachable_dependency_while_starting_is_one_line_and_exit_1(
    failure: BaseException, capfd: pytest.CaptureFixture[str]
) -> None:
    code, err = _exit_of(failure, capfd)
    assert code == 1
    assert f"cannot start: {failure}" in err
    assert "Traceback" not in err


def test_the_shared_start_error_base_is_one_line_and_exit_1(
    capfd: pytest.CaptureFixture[str],
) -> None:
    class Held(DependencyUnavailableError):
        pass

    code, err = _exit_of(Held("the index is open in another process"), capfd)
    assert code == 1
    assert "cannot start: the index is open in another process" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("cls", [IndexUnavailableError, IndexLockedError])
def test_an_index_that_cannot_be_opened_while_starting_is_one_line_and_exit_1(
    cls: type[Exception], capfd: pytest.CaptureFixture[str]
) -> None:
    code, err = _exit_of(cls("Qdrant Edge shard /d/index is already open"), capfd)
    assert code == 1
    assert "cannot start: Qdrant Edge shard /d/index is already open" in err
