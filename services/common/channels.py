"""Channels to downstream services: deadline on every call, trace id propagated, reads retried
on UNAVAILABLE, everything else only where grpc knows it never reached a handler, optional
client metrics."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import grpc

from services.common.interceptors import ClientContextInterceptor, ClientStreamContextInterceptor
from services.common.metrics import ClientRpcMetrics
from services.common.settings import DEFAULT_MAX_MESSAGE_BYTES, DownstreamSettings
from services.common.tracing import Tracing

READ_METHODS = (
    {"service": "visior.retrieval.v1.RetrievalService"},  # Search, GetHealth
    {"service": "visior.retrieval.v1.IngestionService", "method": "ListDocuments"},
    {"service": "visior.toolsproxy.v1.ToolsProxyService", "method": "ListTools"},
    {"service": "visior.toolsproxy.v1.ToolsProxyService", "method": "GetHealth"},
    {"service": "visior.llm.v1.LlmService", "method": "GetHealth"},
    {"service": "visior.orchestrator.v1.OrchestratorService", "method": "GetConfig"},
    {"service": "visior.orchestrator.v1.OrchestratorService", "method": "GetHealth"},
)
"""The calls that only read: run twice, they cost a second read and change nothing."""


def _method_names(config_names: Sequence[Mapping[str, str]]) -> tuple[str, ...]:
    """Service-config names as request paths: "/pkg.Service/Method", or "/pkg.Service/" for
    all of a service's methods."""
    return tuple(f"/{n['service']}/{n.get('method', '')}" for n in config_names)


def _service_config(attempts: int) -> str:
    # grpc-core answers UNAVAILABLE without telling whether a handler ran: for a peer it
    # cannot reach, and for a call a stopping or crashing peer cut off mid-way ("Cancelling
    # all calls", a reset connection). Only reads are retried on it by this policy: a
    # Generate, Respond, tool call or ingest repeated on another replica would do its work
    # twice. Those are sent again only when they reached no server at all
    # (ClientContextInterceptor), besides grpc's transparent retries (a call the peer's
    # transport refused). A handler's own UNAVAILABLE carries a negative
    # grpc-retry-pushback-ms (interceptors.py) and is not retried either.
    policy = {
        "methodConfig": [
            {
                "name": list(READ_METHODS),
                "retryPolicy": {
                    "maxAttempts": max(2, min(attempts, 5)),
                    "initialBackoff": "0.2s",
                    "maxBackoff": "1s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
    return json.dumps(policy)


def open_channel(
    settings: DownstreamSettings,
    max_message_bytes: int,
    metrics: ClientRpcMetrics | None = None,
    tracing: Tracing | None = None,
) -> grpc.aio.Channel:
    """An insecure channel to settings.target (the mesh is loopback / sidecar-local).

    It sends at most `max_message_bytes` (the service's own message limit: what it forwards
    is within what it accepted) and receives at most that or DEFAULT_MAX_MESSAGE_BYTES,
    whichever is larger: a service whose own requests are held small still takes its
    downstreams' replies (a whole-document read, a search's context), which their own limits
    bound.

    Every call carries the trace id (x-trace-id, and traceparent when tracing is on) and a
    deadline; with `metrics`, calls are counted in the grpc_client_* metrics; with
    `tracing`, each call is a CLIENT span."""
    options: list[tuple[str, object]] = [
        ("grpc.max_receive_message_length", max(max_message_bytes, DEFAULT_MAX_MESSAGE_BYTES)),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.enable_retries", 1 if settings.retry_attempts > 1 else 0),
        # A restarted neighbour is reconnected within ~0.1 s, not grpc's default 1 s+ backoff
        # (during which every call fails fast); the retry backoff below outlasts it. Not
        # grpc.min_reconnect_backoff_ms: grpc-core takes it as the minimum connect timeout
        # (default 20 s), and at 100 ms a neighbour that accepted the TCP connection but was
        # too busy (or stopped) to finish the HTTP/2 handshake in 100 ms failed every call at
        # once with "failed to connect to all addresses" instead of waiting for it.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 500),
    ]
    if settings.retry_attempts > 1:
        options.append(("grpc.service_config", _service_config(settings.retry_attempts)))
    return grpc.aio.insecure_channel(
        settings.target,
        options=options,
        interceptors=[
            ClientContextInterceptor(
                settings.timeout_seconds,
                metrics,
                tracing,
                settings.target,
                attempts=settings.retry_attempts,
                retried=_method_names(READ_METHODS),
            ),
            ClientStreamContextInterceptor(
                settings.timeout_seconds, metrics, tracing, settings.target
            ),
        ],
    )
