"""The four servers in one event loop on free ports, wired to each other: for integration tests."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from services.common.runner import Closer
from services.common.server import RunningServer
from services.common.settings import Env, server_var
from services.common.topology import SERVICES
from services.llm import app as llm_app
from services.llm.config import LlmSettings
from services.orchestrator import app as orch_app
from services.orchestrator.config import OrchestratorSettings
from services.retrieval import app as retrieval_app
from services.retrieval.config import RetrievalSettings
from services.toolsproxy import app as tools_app
from services.toolsproxy.config import ToolsProxySettings


class InProcessMesh:
    """`async with InProcessMesh(tmp_path) as mesh: mesh.port("orchestrator")`."""

    def __init__(self, data_dir: str | Path, env: Mapping[str, str] | None = None) -> None:
        self._env = {
            "VISIOR_DATA_DIR": str(data_dir),
            **{server_var(s.key, "port"): "0" for s in SERVICES},
            # The embedder choice is the one knob a test run sets for every server it starts.
            **{k: v for k, v in os.environ.items() if k == "RETR_EMBEDDING_PROFILE"},
            **(env or {}),
        }
        self.servers: dict[str, RunningServer] = {}
        self._closers: list[Closer] = []

    def port(self, key: str) -> int:
        return self.servers[key].port

    def target(self, key: str) -> str:
        return f"127.0.0.1:{self.port(key)}"

    async def _add(self, key: str, started: tuple[RunningServer, Closer]) -> None:
        self.servers[key], closer = started
        self._closers.append(closer)

    async def __aenter__(self) -> InProcessMesh:
        # Python calls __aexit__ only after __aenter__ returned: a server that fails to start
        # must not leave the ones before it listening.
        try:
            await self._start_all()
        except BaseException:
            await self.close()
            raise
        return self

    async def _start_all(self) -> None:
        env = dict(self._env)
        await self._add(
            "retrieval", await retrieval_app.start(RetrievalSettings.from_env(Env(env)))
        )
        env.setdefault("MCP_PROXY_RETRIEVAL_URL", self.target("retrieval"))
        await self._add("toolsproxy", await tools_app.start(ToolsProxySettings.from_env(Env(env))))
        env.setdefault("MCP_PROXY_URL", self.target("toolsproxy"))
        await self._add("llm", await llm_app.start(LlmSettings.from_env(Env(env))))
        env.setdefault("ORCH_RETRIEVAL_URL", self.target("retrieval"))
        env.setdefault("ORCH_LLM_SERVICE_URL", self.target("llm"))
        await self._add(
            "orchestrator", await orch_app.start(OrchestratorSettings.from_env(Env(env)))
        )

    async def stop(self, key: str, grace: float = 0.0) -> None:
        """Stop one server (to test what its callers do when it is gone)."""
        await self.servers[key].stop(grace)

    async def close(self) -> None:
        """Stop every server started, then close what they opened; safe to call twice."""
        servers, self.servers = list(self.servers.values()), {}
        closers, self._closers = self._closers, []
        for running in reversed(servers):
            await running.stop(0)
        for close in reversed(closers):
            await close()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
