"""LlmService settings (llm-service.md §11 names, LLM_SERVICE_* for the server)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.prompt_limits import llm_prompt_limit
from services.common.settings import (
    DownstreamSettings,
    Env,
    ServerSettings,
    SettingsError,
    downstream,
)
from services.model_runtime.client import RuntimeSettings

DEFAULT_PORT = 50052


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
    """Where ToolsProxyService listens (MCP_PROXY_URL) and the per-call deadline."""
    runtime: RuntimeSettings | None
    """The OpenAI-compatible runtime (LLM_RUNTIME_*); None -> the extractive responder."""
    max_total_tokens: int
    """The conversation at any step incl. tool results and the answer (MAX_TOTAL_TOKENS)."""
    max_tool_result_tokens: int
    """One tool result as the model sees it (LLM_SERVICE_MAX_TOOL_RESULT_TOKENS)."""
    max_consecutive_tool_errors: int
    """Tool errors in a row that abort (LLM_SERVICE_MAX_CONSECUTIVE_TOOL_ERRORS)."""
    watchdog_s: float
    """The whole Generate, every model and tool call (LLM_SERVICE_WATCHDOG_SECONDS)."""
    external_tool_timeout_s: float = 10.0
    """One call of fetch_cbr_data or fetch_finance_news (LLM_SERVICE_EXTERNAL_TOOL_TIMEOUT_S);
    the other tools' is tools_proxy.timeout_seconds (LLM_SERVICE_MCP_TIMEOUT_SECONDS)."""

    @classmethod
    def from_env(cls, env: Env | None = None) -> LlmSettings:
        env = env or Env()
        runtime_url = env.text(["LLM_SERVICE_RUNTIME_URL", "LLM_RUNTIME_URL"], "")
        runtime = RuntimeSettings.from_env(env) if RuntimeSettings.configured_in(env) else None
        # Declared once, read by the orchestrator too (it shapes first prompts to fit).
        max_prompt = llm_prompt_limit(env)
        max_completion = env.integer(
            ["LLM_SERVICE_MAX_COMPLETION_TOKENS", "MAX_COMPLETION_TOKENS"], 512, minimum=16
        )
        max_total = env.integer(
            ["LLM_SERVICE_MAX_TOTAL_TOKENS", "MAX_TOTAL_TOKENS"],
            # Room for the agent's full-context scenario (S3: up to 50,000 characters of
            # selected documents, ~22k cl100k tokens of Russian text).
            max(32_768, max_prompt + max_completion + 2048),
            minimum=512,
        )
        if max_total < max_prompt + max_completion:
            raise SettingsError(
                "MAX_TOTAL_TOKENS must be at least MAX_PROMPT_TOKENS + MAX_COMPLETION_TOKENS"
            )
        return cls(
            server=ServerSettings.from_env("llm", "LLM_SERVICE_", env, DEFAULT_PORT),
            runtime_url=runtime_url,
            default_model=runtime.default_model if runtime else "extractive",
            max_tool_steps=env.integer(
                ["LLM_SERVICE_MAX_TOOL_STEPS", "MAX_TOOL_STEPS"], 3, minimum=0, maximum=20
            ),
            max_prompt_tokens=max_prompt,
            max_completion_tokens=max_completion,
            enable_json_mode=env.flag(["LLM_SERVICE_ENABLE_JSON_MODE", "ENABLE_JSON_MODE"], False),
            tools_proxy=downstream(
                env,
                ["LLM_SERVICE_MCP_PROXY_URL", "MCP_PROXY_URL"],
                "127.0.0.1:50054",
                ["LLM_SERVICE_MCP_TIMEOUT_SECONDS"],
                5.0,
            ),
            runtime=runtime,
            max_total_tokens=max_total,
            max_tool_result_tokens=env.integer(
                "LLM_SERVICE_MAX_TOOL_RESULT_TOKENS",
                min(24_576, max_total - max_prompt - max_completion),
                minimum=64,
                maximum=max_total,
            ),
            max_consecutive_tool_errors=env.integer(
                "LLM_SERVICE_MAX_CONSECUTIVE_TOOL_ERRORS", 2, minimum=1, maximum=10
            ),
            watchdog_s=env.number("LLM_SERVICE_WATCHDOG_SECONDS", 60.0, minimum=0.1),
            external_tool_timeout_s=env.number(
                "LLM_SERVICE_EXTERNAL_TOOL_TIMEOUT_S", 10.0, minimum=0.1
            ),
        )
