"""The retrieval service in-process, as `python -m services.retrieval` starts it, for tests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from services.common.settings import Env
from services.retrieval import app
from services.retrieval.config import RetrievalSettings


@contextlib.asynccontextmanager
async def retrieval_channel(data_dir: Path, **env: str) -> AsyncIterator[grpc.aio.Channel]:
    """`app.start` on a free port over `data_dir` with the fast embedder, and a channel to it;
    stopped and closed on exit. `env` adds or overrides settings (RETR_*, QDRANT_URL, ...)."""
    settings = {
        "RETR_PORT": "0", "VISIOR_DATA_DIR": str(data_dir), "RETR_EMBEDDING_PROFILE": "fast",
        **env,
    }  # fmt: skip
    running, close = await app.start(RetrievalSettings.from_env(Env(settings)))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            yield channel
    finally:
        await running.server.stop(0)
        await close()
