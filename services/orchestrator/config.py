"""OrchestratorService settings (ORCH_* and orchestrator.md §5)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.generate_contract import MODEL_NAME_RULE, is_model_name
from services.common.prompt_limits import DEFAULT_LLM_COMPLETION_TOKENS
from services.common.search_contract import DEFAULT_WINDOW_RADIUS, MAX_RESULTS_LIMIT
from services.common.settings import (
    DownstreamSettings,
    Env,
    Fields,
    ServerSettings,
    SettingsError,
    Var,
    downstream,
    flag,
    integer,
    number,
    retry_attempts,
    text,
)
from services.common.shared_config import (
    DEFAULT_FULL_DOCUMENTS,
    MAX_CONTEXT_CHARS,
    MAX_FULL_TEXT_BYTES,
    MAX_RADIUS,
    UTF8_MAX_BYTES,
    llm_completion_limit,
    llm_prompt_limit,
    llm_tool_result_limit,
    proxy_full_documents,
    proxy_full_text_chars,
    proxy_max_window_radius,
    radius,
)
from services.orchestrator.respond import RESPOND_MAX_REQUEST_BYTES
from services.orchestrator.runtime_config import DEFAULT_MAX_RESULTS, LIMITS, RuntimeConfig

MAX_CONTEXT_CHARS_LIMIT = MAX_FULL_TEXT_BYTES // UTF8_MAX_BYTES
"""ORCH_MAX_CONTEXT_CHARS's ceiling: what ToolsProxy's largest load_documents_full result
(MCP_PROXY_MAX_FULL_TEXT_BYTES, at most 3 MiB) holds of any script."""


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
    """The tools proxy's per-side limit (MCP_PROXY_MAX_WINDOW_RADIUS, services/common/shared_config.py)."""
    enable_filters: bool
    """Pass the request's metadata filters (product, version, tags, source) to Retrieval
    (ORCH_ENABLE_FILTERS, orchestrator.md §3.2); off, only the tenant and doc/section ids
    scope the search."""
    llm_prompt_limit: int
    """The LLM service's first-prompt limit in tokens, read from its own setting
    (MAX_PROMPT_TOKENS, services/common/shared_config.py):
    every first prompt is shaped to fit it."""
    model_routing: bool
    """Ask the model for the scenario decision (JSON with `intent`) before the rules
    (ORCH_MODEL_ROUTING); with an extractive LLM service the rules decide anyway."""
    default_top_k: int = DEFAULT_MAX_RESULTS
    """Sections in the first prompt when the request gives no max_results (ORCH_DEFAULT_TOP_K,
    agent.md §10's default_top_k; 1..50). Fewer make a CPU model's first prompt shorter."""
    max_context_chars: int = MAX_CONTEXT_CHARS
    """Selected documents up to this many characters in total are read whole (S3), above it
    searched (S4) (ORCH_MAX_CONTEXT_CHARS, agent.md §10's max_context_chars)."""
    llm_completion_limit: int = DEFAULT_LLM_COMPLETION_TOKENS
    """The LLM service's answer limit in tokens, read from its own setting
    (MAX_COMPLETION_TOKENS, services/common/shared_config.py): the routing call asks for no
    more."""
    max_full_documents: int = DEFAULT_FULL_DOCUMENTS
    """Selected documents are read whole (S3) only when there are no more of them than one
    load_documents_full call of ToolsProxy takes (MCP_PROXY_MAX_FULL_DOCUMENTS)."""
    llm_tool_result_tokens: int | None = None
    """One tool result's room in the LLM service (LLM_SERVICE_MAX_TOTAL_TOKENS less
    MAX_PROMPT_TOKENS and MAX_COMPLETION_TOKENS): selected documents are read whole (S3)
    only when it holds them uncut, counted in tokens (scenarios.Selection.fits_whole); None: not
    bounded."""
    score_threshold: float | None = None
    """The lowest relevance score (0..1) a hit may have: sent as Search's params.min_score
    and as the score_threshold of the knowledge-base search S2 plans (ORCH_SCORE_THRESHOLD,
    agent.md §10's score_threshold); None leaves Retrieval's own default (RETR_MIN_SCORE). A
    score is relative to the query's best candidates in hybrid ranking (RETR_MIN_SCORE)."""
    held: tuple[str, ...] = ()
    """A sentence per setting held below what it asked for (ToolsProxy's limits), which the
    service logs as a warning at start."""

    @classmethod
    def from_env(cls, env: Env | None = None) -> OrchestratorSettings:
        env = env or Env()
        proxy_max = proxy_max_window_radius(env)
        attempts = retry_attempts("ORCH_")
        asked_radius, asked_chars = radius(env, WINDOW_RADIUS), int(MAX_CONTEXT.read(env))
        whole_chars = proxy_full_text_chars(env)
        # A window or a whole read is never one ToolsProxy would refuse or cut.
        limits = (
            ("ORCH_WINDOW_RADIUS", asked_radius, proxy_max, "MCP_PROXY_MAX_WINDOW_RADIUS"),
            (
                "ORCH_MAX_CONTEXT_CHARS",
                asked_chars,
                whole_chars,
                "MCP_PROXY_MAX_FULL_TEXT_BYTES / 4",
            ),
        )
        held = tuple(
            f"{name}={asked} is held to {limit} ({why})"
            for name, asked, limit, why in limits
            if asked > limit
        )
        runtime = RUNTIME.read(env, window_radius=min(asked_radius, proxy_max))
        if runtime.default_model and not is_model_name(runtime.default_model):
            raise SettingsError(f"ORCH_DEFAULT_MODEL must be {MODEL_NAME_RULE}")
        return SETTINGS.read(
            env,
            max_context_chars=min(asked_chars, whole_chars),
            max_full_documents=proxy_full_documents(env),
            llm_tool_result_tokens=llm_tool_result_limit(env),
            held=held,
            # Every Respond body Envoy lets through reaches the validator (a 400 naming the
            # field), not grpc's bare RESOURCE_EXHAUSTED.
            server=ServerSettings.for_service(
                "orchestrator", env, max_message_bytes=RESPOND_MAX_REQUEST_BYTES
            ),
            retrieval=RETRIEVAL.read(env, attempts),
            llm=LLM.read(env, attempts),
            runtime=runtime,
            max_window_radius=proxy_max,
            llm_prompt_limit=llm_prompt_limit(env),
            llm_completion_limit=llm_completion_limit(env),
        )


MAX_CONTEXT = integer(
    "ORCH_MAX_CONTEXT_CHARS", MAX_CONTEXT_CHARS, 1, MAX_CONTEXT_CHARS_LIMIT,
    default_doc=f"{MAX_CONTEXT_CHARS}; at most MCP_PROXY_MAX_FULL_TEXT_BYTES / 4",
    doc="Selected documents up to this many characters in total are read whole (S3), above "
    "it searched (S4) (agent.md §10's max_context_chars). Held to what one "
    "load_documents_full result of ToolsProxy holds of any script, so ToolsProxy never cuts a "
    "whole read. A selection is also read whole only when one tool result of the LLM "
    "service holds it uncut (LLM_SERVICE_MAX_TOTAL_TOKENS less MAX_PROMPT_TOKENS and "
    "MAX_COMPLETION_TOKENS), weighed in the tokens Retrieval counted of each document "
    "(ListDocuments' tokens); so a model with a small context searches the documents instead "
    "of reading their beginning. Set the LLM service's three token limits in the "
    "Orchestrator's environment too.",
)  # fmt: skip
WINDOW_RADIUS = integer(
    "ORCH_WINDOW_RADIUS", DEFAULT_WINDOW_RADIUS, 0, MAX_RADIUS, also=("RAG_WINDOW_RADIUS",),
    default_doc=f"{DEFAULT_WINDOW_RADIUS}, or from MCP_PROXY_MAX_CHUNK_WINDOW; "
    "at most MCP_PROXY_MAX_WINDOW_RADIUS",
    doc="The largest window radius R per side the model's reads grow to (1 → 2 → … → R; "
    "orchestrator.md §5): a window is 2R+1 chunks.",
)  # fmt: skip
RETRIEVAL = downstream("ORCH_RETRIEVAL_URL", "ORCH_RETRIEVAL_TIMEOUT_SECONDS", 5.0, "retrieval")
LLM = downstream("ORCH_LLM_SERVICE_URL", "ORCH_LLM_TIMEOUT_SECONDS", 60.0, "llm")


def _limited(name: str, field_name: str) -> Var:
    """The setting of a runtime field, held to the range UpdateConfig holds the field to."""
    low, high = LIMITS[field_name]
    return integer(name, minimum=low, maximum=high)


RUNTIME = Fields(
    RuntimeConfig,
    default_model=text("ORCH_DEFAULT_MODEL"),
    prompt_token_budget=_limited("ORCH_PROMPT_TOKEN_BUDGET", "prompt_token_budget"),
    context_token_budget=_limited("ORCH_CONTEXT_TOKEN_BUDGET", "context_token_budget"),
    max_tool_steps=_limited("ORCH_MAX_TOOL_STEPS", "max_tool_steps"),
    mock_mode=flag("ORCH_MOCK_MODE"),
)
SETTINGS = Fields(
    OrchestratorSettings,
    enable_filters=flag("ORCH_ENABLE_FILTERS", True),
    model_routing=flag("ORCH_MODEL_ROUTING", True),
    default_top_k=integer("ORCH_DEFAULT_TOP_K", minimum=1, maximum=MAX_RESULTS_LIMIT),
    score_threshold=number("ORCH_SCORE_THRESHOLD", minimum=0.0, maximum=1.0),
)
