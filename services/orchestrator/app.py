"""Assembles the orchestrator process."""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry
from visior.orchestrator.v1 import orchestrator_pb2_grpc

from services.common.channels import open_channel
from services.common.metrics import ClientRpcMetrics
from services.common.runner import Closer
from services.common.server import RunningServer, start_server
from services.common.topology import SERVICE_BY_KEY
from services.common.tracing import install_tracing
from services.orchestrator.clients import GrpcGenerator, GrpcRetriever
from services.orchestrator.config import OrchestratorSettings
from services.orchestrator.mock import MockGenerator, MockRetriever
from services.orchestrator.respond import Responder
from services.orchestrator.runtime_config import ConfigHolder
from services.orchestrator.servicer import OrchestratorServicer

SERVICE_NAMES = SERVICE_BY_KEY["orchestrator"].grpc_services
log = logging.getLogger("visior.orchestrator")


async def start(settings: OrchestratorSettings) -> tuple[RunningServer, Closer]:
    for sentence in settings.held:
        log.warning(sentence)
    size = settings.server.max_message_bytes
    registry = CollectorRegistry()
    calls = ClientRpcMetrics(registry)
    tracing = install_tracing(settings.server.tracing, settings.server.service)
    retrieval = open_channel(settings.retrieval, size, calls, tracing)
    llm = open_channel(settings.llm, size, calls, tracing)
    config = ConfigHolder(settings.runtime, settings.max_window_radius)
    responder = Responder(
        GrpcRetriever(retrieval, min_score=settings.score_threshold),
        GrpcGenerator(llm, settings.llm.timeout_seconds),
        config,
        model_routing=settings.model_routing,
        enable_filters=settings.enable_filters,
        llm_prompt_limit=settings.llm_prompt_limit,
        llm_completion_limit=settings.llm_completion_limit,
        default_top_k=settings.default_top_k,
        max_context_chars=settings.max_context_chars,
        max_documents=settings.max_full_documents,
        result_tokens=settings.llm_tool_result_tokens,
        score_threshold=settings.score_threshold,
        mock=(MockRetriever(min_score=settings.score_threshold), MockGenerator()),
    )

    def register(server):  # type: ignore[no-untyped-def]
        orchestrator_pb2_grpc.add_OrchestratorServiceServicer_to_server(
            OrchestratorServicer(responder, config), server
        )

    running = await start_server(
        settings.server,
        register,
        SERVICE_NAMES,
        registry,
        domain="visior.orchestrator",
        tracing=tracing,
    )

    async def close() -> None:
        await retrieval.close()
        await llm.close()

    return running, close
