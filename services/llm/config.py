"""LlmService settings (llm-service.md §11 names, LLM_SERVICE_* for the server)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.settings import (
    DownstreamSettings,
    Env,
    ServerSettings,
    SettingsError,
    downstream,
)

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

    @classmethod
    def from_env(cls, env: Env | None = None) -> LlmSettings:
        env = env or Env()
        runtime_url = env.text(["LLM_SERVICE_RUNTIME_URL", "LLM_RUNTIME_URL"], "")
        if runtime_url:
            # The OpenAI-compatible runtime client is still to come; refusing to start beats
            # answering extractively when an operator asked for a model.
            raise SettingsError(
                "LLM_RUNTIME_URL is not supported yet: unset it to use the extractive responder"
            )
        return cls(
            server=ServerSettings.from_env("llm", "LLM_SERVICE_", env, DEFAULT_PORT),
            runtime_url=runtime_url,
            default_model=env.text(
                ["LLM_SERVICE_DEFAULT_MODEL_NAME", "DEFAULT_MODEL_NAME"], "extractive"
            ),
            max_tool_steps=env.integer(
                ["LLM_SERVICE_MAX_TOOL_STEPS", "MAX_TOOL_STEPS"], 3, minimum=0, maximum=20
            ),
            max_prompt_tokens=env.integer(
                ["LLM_SERVICE_MAX_PROMPT_TOKENS", "MAX_PROMPT_TOKENS"], 4096, minimum=256
            ),
            max_completion_tokens=env.integer(
                ["LLM_SERVICE_MAX_COMPLETION_TOKENS", "MAX_COMPLETION_TOKENS"], 512, minimum=16
            ),
            enable_json_mode=env.flag(["LLM_SERVICE_ENABLE_JSON_MODE", "ENABLE_JSON_MODE"], False),
            tools_proxy=downstream(
                env,
                ["LLM_SERVICE_MCP_PROXY_URL", "MCP_PROXY_URL"],
                "127.0.0.1:50054",
                ["LLM_SERVICE_MCP_TIMEOUT_SECONDS"],
                5.0,
            ),
        )
