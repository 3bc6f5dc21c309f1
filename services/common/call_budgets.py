"""How long each RPC may take: one budget per RPC, for Envoy's JSON routes and the typed client.

Each budget names the RPC both ways a caller reaches it: its full gRPC method names (what
the typed client calls) and its HTTP binding from the proto's google.api.http option (what
Envoy routes). services.devtools.envoy_config makes its route timeouts from these, and
services.client gives a call without a timeout of its own the same budget, so an RPC has
as long over gRPC as over JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_TIMEOUT_S = 30.0
"""Budget of every RPC (and every `/internal/...` route) that has no CallBudget below."""
NO_OVERALL_TIMEOUT = 0.0
"""The budget of a stream: no overall deadline, only the idle timeout."""
STREAM_IDLE_TIMEOUT_S = 60.0
"""How long a streaming route (no overall timeout) may stay silent before Envoy ends it."""


@dataclass(frozen=True)
class CallBudget:
    """The budget of one RPC (or of RPCs sharing one HTTP binding, like GetHealth)."""

    timeout_s: float
    """Overall deadline in seconds; NO_OVERALL_TIMEOUT for a stream."""
    grpc_methods: tuple[str, ...]
    """Full gRPC method names, e.g. /visior.orchestrator.v1.OrchestratorService/Respond."""
    http_path: str
    """The exact HTTP path of the RPCs' google.api.http binding."""
    http_method: str | None = None
    """The binding's HTTP method, named only when the path serves several RPCs."""


HEALTH = CallBudget(
    5.0,
    (
        "/visior.orchestrator.v1.OrchestratorService/GetHealth",
        "/visior.llm.v1.LlmService/GetHealth",
        "/visior.retrieval.v1.RetrievalService/GetHealth",
        "/visior.toolsproxy.v1.ToolsProxyService/GetHealth",
    ),
    "/health",
)
RESPOND = CallBudget(
    120.0,
    ("/visior.orchestrator.v1.OrchestratorService/Respond",),
    "/internal/orchestrator/respond",
)
GENERATE = CallBudget(120.0, ("/visior.llm.v1.LlmService/Generate",), "/internal/llm/generate")
GENERATE_STREAM = CallBudget(
    NO_OVERALL_TIMEOUT,
    ("/visior.llm.v1.LlmService/GenerateStream",),
    "/internal/llm/generate:stream",
)
# Ingestion parses, chunks and embeds the whole document before it answers; at the
# measured 7-9 passages/s on 2 cores a large document needs minutes, not 30 s.
INGEST = CallBudget(
    300.0,
    ("/visior.retrieval.v1.IngestionService/IngestDocument",),
    "/internal/retrieval/documents",
    http_method="POST",
)

CALL_BUDGETS: tuple[CallBudget, ...] = (HEALTH, RESPOND, GENERATE, GENERATE_STREAM, INGEST)
"""Every RPC whose budget is not DEFAULT_TIMEOUT_S; of two on one path, the one naming an
HTTP method comes first (Envoy takes the first route that matches)."""

_BY_GRPC_METHOD: Mapping[str, float] = {
    method: budget.timeout_s for budget in CALL_BUDGETS for method in budget.grpc_methods
}


def grpc_method_timeout(method: str) -> float:
    """The budget in seconds of the gRPC `method` (full name): its CallBudget's, else
    DEFAULT_TIMEOUT_S; NO_OVERALL_TIMEOUT (0) for a stream."""
    return _BY_GRPC_METHOD.get(method, DEFAULT_TIMEOUT_S)
