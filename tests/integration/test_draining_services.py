"""Each service's calls when it stops (SIGTERM: RunningServer.stop(grace)), as its app starts it.

A call still running a moment before the grace runs out ends with UNAVAILABLE and an
ErrorInfo reason DRAINING (services.common.draining), which tells its caller the handler ran
and the server is stopping. Before, only the LLM service did so: Orchestrator's Respond,
Retrieval's Search and IngestDocument and ToolsProxy's Execute ended with grpc's bare cancel
at the grace's end, UNAVAILABLE "Cancelling all calls" with no ErrorInfo, which the mesh reads
as "no handler ran" (services/client/errors.py) and, through Envoy, a 502 that is not the
mesh's error body.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from visior.llm.v1 import llm_pb2, llm_pb2_grpc
from visior.orchestrator.v1 import orchestrator_pb2, orchestrator_pb2_grpc
from visior.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc
from visior.toolsproxy.v1 import toolsproxy_pb2, toolsproxy_pb2_grpc

from services.common.errors import DRAINING
from services.common.runner import Closer
from services.common.server import RunningServer
from services.common.settings import Env, server_var
from services.common.status import error_info
from services.llm import app as llm_app
from services.llm.config import LlmSettings
from services.llm.servicer import LlmServicer
from services.orchestrator import app as orch_app
from services.orchestrator.config import OrchestratorSettings
from services.orchestrator.servicer import OrchestratorServicer
from services.retrieval import app as retrieval_app
from services.retrieval.config import RetrievalSettings
from services.retrieval.servicer import IngestionServicer, RetrievalServicer
from services.toolsproxy import app as tools_app
from services.toolsproxy.config import ToolsProxySettings
from services.toolsproxy.servicer import ToolsProxyServicer

GRACE_S = 2.0
STOP_BOUND_S = 10.0
"""Far past the grace: a stop that takes this long is stuck."""


@dataclass(frozen=True)
class Case:
    """One service's RPC: its app, the servicer class whose handler hangs, and the call."""

    key: str
    start: Callable[[Env], Awaitable[tuple[RunningServer, Closer]]]
    servicer: type
    method: str
    call: Callable[[grpc.aio.Channel], Any]


def _orchestrator(env: Env) -> Awaitable[tuple[RunningServer, Closer]]:
    return orch_app.start(OrchestratorSettings.from_env(env))


def _llm(env: Env) -> Awaitable[tuple[RunningServer, Closer]]:
    return llm_app.start(LlmSettings.from_env(env))


def _retrieval(env: Env) -> Awaitable[tuple[RunningServer, Closer]]:
    return retrieval_app.start(RetrievalSettings.from_env(env))


def _toolsproxy(env: Env) -> Awaitable[tuple[RunningServer, Closer]]:
    return tools_app.start(ToolsProxySettings.from_env(env))


CASES = [
    Case(
        "orchestrator",
        _orchestrator,
        OrchestratorServicer,
        "Respond",
        lambda ch: orchestrator_pb2_grpc.OrchestratorServiceStub(ch).Respond(
            orchestrator_pb2.RespondRequest()
        ),
    ),
    Case(
        "llm",
        _llm,
        LlmServicer,
        "Generate",
        lambda ch: llm_pb2_grpc.LlmServiceStub(ch).Generate(llm_pb2.GenerateRequest()),
    ),
    Case(
        "retrieval",
        _retrieval,
        RetrievalServicer,
        "Search",
        lambda ch: retrieval_pb2_grpc.RetrievalServiceStub(ch).Search(
            retrieval_pb2.SearchRequest()
        ),
    ),
    Case(
        "retrieval",
        _retrieval,
        IngestionServicer,
        "IngestDocument",
        lambda ch: retrieval_pb2_grpc.IngestionServiceStub(ch).IngestDocument(
            retrieval_pb2.IngestDocumentRequest()
        ),
    ),
    Case(
        "toolsproxy",
        _toolsproxy,
        ToolsProxyServicer,
        "Execute",
        lambda ch: toolsproxy_pb2_grpc.ToolsProxyServiceStub(ch).Execute(
            toolsproxy_pb2.ExecuteRequest()
        ),
    ),
]


class Hang:
    """A handler that runs until it is cancelled, noting that it began and that it ended."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = False

    def handler(self) -> Callable[..., Awaitable[Any]]:
        hang = self

        async def handle(_servicer: Any, _request: Any, _context: Any) -> Any:
            hang.started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                hang.cancelled = True
                raise

        return handle


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.key}-{c.method}")
async def test_a_call_running_when_the_service_stops_ends_draining(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hang = Hang()
    monkeypatch.setattr(case.servicer, case.method, hang.handler())
    env = Env({"VISIOR_DATA_DIR": str(tmp_path), server_var(case.key, "port"): "0"})
    running, close = await case.start(env)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            call = case.call(channel)
            await asyncio.wait_for(hang.started.wait(), STOP_BOUND_S)
            stop = asyncio.ensure_future(running.stop(GRACE_S))
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await call
            await asyncio.wait_for(stop, STOP_BOUND_S)
    finally:
        await running.stop(0)
        await close()
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    info = error_info(failed.value)
    assert info is not None, failed.value.details()
    assert info.reason == DRAINING
    assert hang.cancelled  # the handler was stopped where it waited, its cleanup ran
