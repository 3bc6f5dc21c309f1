"""Assembles the LLM service process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from visior.llm.v1 import llm_pb2_grpc

from services.common.channels import open_channel
from services.common.runner import Closer
from services.common.server import RunningServer, start_server
from services.llm.config import LlmSettings
from services.llm.engine import Budgets, LlmEngine
from services.llm.extractive import ExtractiveResponder
from services.llm.servicer import LlmServicer
from services.llm.tools_client import GrpcToolRunner

SERVICE_NAMES = ("visior.llm.v1.LlmService",)


async def start(settings: LlmSettings) -> tuple[RunningServer, Closer]:
    channel = open_channel(settings.tools_proxy, settings.server.max_message_bytes)
    engine = LlmEngine(
        ExtractiveResponder(GrpcToolRunner(channel)),
        Budgets(
            settings.max_tool_steps, settings.max_prompt_tokens, settings.max_completion_tokens
        ),
        settings.default_model,
    )

    def register(server):  # type: ignore[no-untyped-def]
        llm_pb2_grpc.add_LlmServiceServicer_to_server(LlmServicer(engine, "extractive"), server)

    running = await start_server(
        settings.server, register, SERVICE_NAMES, CollectorRegistry(), domain="visior.llm"
    )

    async def close() -> None:
        await channel.close()

    return running, close
