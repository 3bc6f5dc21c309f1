"""LlmService settings (llm-service.md §11 names, LLM_SERVICE_* for the server)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.settings import (
    DownstreamSettings,
    Env,
    Fields,
    ServerSettings,
    SettingsError,
    downstream,
    integer,
    number,
    retry_attempts,
)
from services.common.shared_config import llm_prompt_limit
from services.model_runtime.client import RuntimeSettings
from services.model_runtime.config import JSON_MODE, URL, runtime_settings

DEFAULT_PORT = 50052
MAX_TOOL_RESULT_TOKENS = 24_576
"""One tool result's ceiling in tokens, whatever room the total leaves."""


@dataclass(frozen=True)
class LlmSettings:
    """Everything the LLM service reads from the environment."""

    server: ServerSettings
    """gRPC server knobs (LLM_SERVICE_HOST, LLM_SERVICE_PORT, ...)."""
    runtime_url: str
    """OpenAI-compatible runtime (LLM_RUNTIME_URL); empty -> the extractive responder."""
    default_model: str
    """Model name when the request names none (DEFAULT_MODEL_NAME)."""
    max_tool_steps: int
    """Tool calls per request (MAX_TOOL_STEPS)."""
    max_prompt_tokens: int
    """Prompt budget (MAX_PROMPT_TOKENS)."""
    max_completion_tokens: int
    """Completion budget (MAX_COMPLETION_TOKENS)."""
    enable_json_mode: bool
    """JSON-mode tool calls for runtimes without native tools (ENABLE_JSON_MODE)."""
    tools_proxy: DownstreamSettings
    """Where ToolsProxyService listens (MCP_PROXY_URL), the per-call deadline
    (LLM_SERVICE_MCP_TIMEOUT_SECONDS) and retries (LLM_SERVICE_RETRY_ATTEMPTS)."""
    runtime: RuntimeSettings | None
    """The OpenAI-compatible runtime (LLM_RUNTIME_*); None -> the extractive responder."""
    max_total_tokens: int
    """The conversation at any step incl. tool results and the answer
    (LLM_SERVICE_MAX_TOTAL_TOKENS)."""
    max_tool_result_tokens: int
    """One tool result as the model sees it: what the first prompt and the answer leave of
    LLM_SERVICE_MAX_TOTAL_TOKENS, at most 24576 (computed, not read)."""
    watchdog_s: float
    """The whole Generate, every model and tool call (LLM_SERVICE_WATCHDOG_SECONDS)."""
    external_tool_timeout_s: float = 10.0
    """One call of fetch_cbr_data or fetch_finance_news (LLM_SERVICE_EXTERNAL_TOOL_TIMEOUT_S);
    the other tools' is tools_proxy.timeout_seconds (LLM_SERVICE_MCP_TIMEOUT_SECONDS)."""

    @classmethod
    def from_env(cls, env: Env | None = None) -> LlmSettings:
        env = env or Env()
        runtime = runtime_settings(env)
        # Declared once, read by the orchestrator too (it shapes first prompts to fit).
        max_prompt = llm_prompt_limit(env)
        max_completion = MAX_COMPLETION.read(env)
        # Room for the agent's full-context scenario (S3: up to 50,000 characters of
        # selected documents, ~22k cl100k tokens of Russian text).
        max_total = MAX_TOTAL.read(env, max(32_768, max_prompt + max_completion + 2048))
        if max_total < max_prompt + max_completion:
            raise SettingsError(
                "LLM_SERVICE_MAX_TOTAL_TOKENS must be at least MAX_PROMPT_TOKENS + "
                "MAX_COMPLETION_TOKENS"
            )
        return SETTINGS.read(
            env,
            max_tool_result_tokens=min(
                MAX_TOOL_RESULT_TOKENS, max_total - max_prompt - max_completion
            ),
            server=ServerSettings.from_env("llm", "LLM_SERVICE_", env, DEFAULT_PORT),
            runtime_url=URL.read(env),
            default_model=runtime.default_model if runtime else "extractive",
            max_prompt_tokens=max_prompt,
            max_completion_tokens=max_completion,
            enable_json_mode=JSON_MODE.read(env),
            tools_proxy=TOOLS_PROXY.read(env, retry_attempts("LLM_SERVICE_")),
            runtime=runtime,
            max_total_tokens=max_total,
        )


TOKENS = Fields(
    LlmSettings,
    max_completion_tokens=integer("MAX_COMPLETION_TOKENS", 512, 16),
    max_total_tokens=integer(
        "LLM_SERVICE_MAX_TOTAL_TOKENS", None, 512,
        default_doc="max(32768, MAX_PROMPT_TOKENS + MAX_COMPLETION_TOKENS + 2048)",
    ),
)  # fmt: skip
MAX_COMPLETION, MAX_TOTAL = TOKENS.vars["max_completion_tokens"], TOKENS.vars["max_total_tokens"]
TOOLS_PROXY = downstream(
    "MCP_PROXY_URL", "LLM_SERVICE_MCP_TIMEOUT_SECONDS", 5.0, "ToolsProxyService",
    "127.0.0.1:50054",
    doc="ToolsProxyService (llm-service.md §11): host:port or a grpc:// / http:// URL.",
)  # fmt: skip
SETTINGS = Fields(
    LlmSettings,
    max_tool_steps=integer("MAX_TOOL_STEPS", 3, 0, 20),
    watchdog_s=number("LLM_SERVICE_WATCHDOG_SECONDS", 60.0, 0.1),
    external_tool_timeout_s=number("LLM_SERVICE_EXTERNAL_TOOL_TIMEOUT_S", minimum=0.1),
)
