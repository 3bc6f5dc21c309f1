"""OrchestratorService settings (ORCH_* and orchestrator.md §5)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.prompt_limits import llm_prompt_limit
from services.common.search_contract import MAX_RESULTS_LIMIT, window_radius
from services.common.settings import (
    DownstreamSettings,
    Env,
    ServerSettings,
    SettingsError,
    downstream,
)
from services.orchestrator.runtime_config import RuntimeConfig
from services.orchestrator.scenarios import MAX_CONTEXT_CHARS

DEFAULT_PORT = 50051
MAX_CONTEXT_CHARS_LIMIT = 786_432
"""ORCH_MAX_CONTEXT_CHARS's ceiling: what ToolsProxy's largest load_documents_full result
(MCP_PROXY_MAX_FULL_TEXT_BYTES, at most 3 MiB) holds at 4 UTF-8 bytes a character."""


@dataclass(frozen=True)
class OrchestratorSettings:
    """Everything the orchestrator reads from the environment."""

    server: ServerSettings
    """gRPC server knobs (ORCH_HOST, ORCH_PORT, ...)."""
    retrieval: DownstreamSettings
    """RetrievalService target (ORCH_RETRIEVAL_URL) and deadline (ORCH_RETRIEVAL_TIMEOUT_SECONDS)."""
    llm: DownstreamSettings
    """LlmService target (ORCH_LLM_SERVICE_URL) and deadline (ORCH_LLM_TIMEOUT_SECONDS)."""
    runtime: RuntimeConfig
    """Initial runtime config (ORCH_DEFAULT_MODEL, ORCH_PROMPT_TOKEN_BUDGET, ...)."""
    max_window_radius: int
    """The tools proxy's per-side limit (MCP_PROXY_MAX_WINDOW_RADIUS / RAG_WINDOW_RADIUS)."""
    enable_filters: bool
    """Pass the request's metadata filters (product, version, tags, source) to Retrieval
    (ORCH_ENABLE_FILTERS, orchestrator.md §3.2); off, only the tenant and doc/section ids
    scope the search."""
    llm_prompt_limit: int
    """The LLM service's first-prompt limit in tokens, read from its own setting
    (LLM_SERVICE_MAX_PROMPT_TOKENS / MAX_PROMPT_TOKENS, services/common/prompt_limits.py):
    every first prompt is shaped to fit it."""
    model_routing: bool
    """Ask the model for the scenario decision (JSON with `intent`) before the rules
    (ORCH_MODEL_ROUTING); with an extractive LLM service the rules decide anyway."""
    default_top_k: int = 10
    """Sections in the first prompt when the request gives no max_results (ORCH_DEFAULT_TOP_K,
    agent.md §10's default_top_k; 1..50). Fewer make a CPU model's first prompt shorter."""
    max_context_chars: int = MAX_CONTEXT_CHARS
    """Selected documents up to this many characters in total are read whole (S3), above it
    searched (S4) (ORCH_MAX_CONTEXT_CHARS, agent.md §10's max_context_chars)."""
    score_threshold: float | None = None
    """The lowest relevance score (0..1) a hit may have: sent as Search's params.min_score
    (ORCH_SCORE_THRESHOLD, agent.md §10's score_threshold); None leaves Retrieval's own
    default (RETR_MIN_SCORE)."""

    @classmethod
    def from_env(cls, env: Env | None = None) -> OrchestratorSettings:
        env = env or Env()
        proxy_max = window_radius(
            env,
            ["MCP_PROXY_MAX_WINDOW_RADIUS", "RAG_WINDOW_RADIUS"],
            ["MCP_PROXY_MAX_CHUNK_WINDOW"],
        )
        radius = min(
            window_radius(
                env, ["ORCH_WINDOW_RADIUS", "RAG_WINDOW_RADIUS"],
                ["ORCH_WINDOW_MAX", "MCP_PROXY_MAX_CHUNK_WINDOW"],
            ),
            proxy_max,
        )  # fmt: skip
        attempts = env.integer("ORCH_RETRY_ATTEMPTS", 3, minimum=1, maximum=5)
        retrieval = downstream(
            env, ["ORCH_RETRIEVAL_URL"], "127.0.0.1:50053", ["ORCH_RETRIEVAL_TIMEOUT_SECONDS"], 5.0
        )
        llm = downstream(
            env, ["ORCH_LLM_SERVICE_URL"], "127.0.0.1:50052", ["ORCH_LLM_TIMEOUT_SECONDS"], 60.0
        )
        return cls(
            server=ServerSettings.from_env("orchestrator", "ORCH_", env, DEFAULT_PORT),
            retrieval=DownstreamSettings(retrieval.target, retrieval.timeout_seconds, attempts),
            llm=DownstreamSettings(llm.target, llm.timeout_seconds, attempts),
            runtime=RuntimeConfig(
                default_model=env.text("ORCH_DEFAULT_MODEL", ""),
                prompt_token_budget=env.integer(
                    "ORCH_PROMPT_TOKEN_BUDGET", 2048, minimum=1, maximum=131_072
                ),
                context_token_budget=env.integer(
                    "ORCH_CONTEXT_TOKEN_BUDGET", 8192, minimum=1, maximum=1_048_576
                ),
                max_tool_steps=env.integer("ORCH_MAX_TOOL_STEPS", 3, minimum=0, maximum=20),
                window_radius=radius,
                mock_mode=env.flag("ORCH_MOCK_MODE", False),
            ),
            max_window_radius=proxy_max,
            enable_filters=env.flag("ORCH_ENABLE_FILTERS", True),
            model_routing=env.flag("ORCH_MODEL_ROUTING", True),
            default_top_k=env.integer(
                "ORCH_DEFAULT_TOP_K", 10, minimum=1, maximum=MAX_RESULTS_LIMIT
            ),
            llm_prompt_limit=llm_prompt_limit(env),
            max_context_chars=env.integer(
                "ORCH_MAX_CONTEXT_CHARS", MAX_CONTEXT_CHARS, minimum=1,
                maximum=MAX_CONTEXT_CHARS_LIMIT,
            ),
            score_threshold=_score_threshold(env),
        )  # fmt: skip


def _score_threshold(env: Env) -> float | None:
    """ORCH_SCORE_THRESHOLD: a relevance score in 0..1, or None when unset."""
    if env.raw(["ORCH_SCORE_THRESHOLD"]) is None:
        return None
    value = env.number("ORCH_SCORE_THRESHOLD", 0.0, minimum=0.0)
    if value > 1.0:  # scores are in [0, 1]: every search would come back empty
        raise SettingsError(f"ORCH_SCORE_THRESHOLD={value} is above the maximum 1.0")
    return value
