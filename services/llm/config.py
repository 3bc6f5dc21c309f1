"""LlmService settings (llm-service.md §11 names, LLM_SERVICE_* for the server)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.generate_contract import MAX_TOOL_STEPS_LIMIT
from services.common.settings import (
    MAX_TIMEOUT_SECONDS,
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
from services.common.shared_config import (
    MAX_TOTAL_TOKENS,
    llm_completion_limit,
    llm_prompt_limit,
    llm_total_limit,
    tool_result_room,
)
from services.llm.engine import GENERATE_MAX_REQUEST_BYTES
from services.llm.extractive import EXTRACTIVE
from services.llm.loop import MIN_TOOL_RESULT_ROOM, LoopSettings
from services.model_runtime.client import RuntimeSettings
from services.model_runtime.config import runtime_settings


@dataclass(frozen=True)
class LlmSettings:
    """Everything the LLM service reads from the environment."""

    server: ServerSettings
    """gRPC server knobs (LLM_SERVICE_HOST, LLM_SERVICE_PORT, ...)."""
    tools_proxy: DownstreamSettings
    """Where ToolsProxyService listens (MCP_PROXY_URL), the per-call deadline
    (LLM_SERVICE_MCP_TIMEOUT_SECONDS) and retries (LLM_SERVICE_RETRY_ATTEMPTS)."""
    runtime: RuntimeSettings | None
    """The OpenAI-compatible runtime (LLM_RUNTIME_URL, ENABLE_JSON_MODE, ...); None when
    LLM_RUNTIME_URL is unset -> the extractive responder."""
    loop: LoopSettings
    """The tool loop's limits (MAX_TOOL_STEPS, MAX_PROMPT_TOKENS, MAX_COMPLETION_TOKENS,
    LLM_SERVICE_MAX_TOTAL_TOKENS, LLM_SERVICE_WATCHDOG_SECONDS, the tool deadlines)."""

    @classmethod
    def from_env(cls, env: Env | None = None) -> LlmSettings:
        env = env or Env()
        runtime = runtime_settings(env)
        # Declared once, read by the orchestrator too (it shapes first prompts to fit and
        # reads documents whole only when one tool result holds them).
        max_prompt = llm_prompt_limit(env)
        max_completion = llm_completion_limit(env)
        max_total = llm_total_limit(env)
        room = check_tool_result_room(max_total, max_prompt, max_completion)
        tools_proxy = TOOLS_PROXY.read(env, retry_attempts("LLM_SERVICE_"))
        loop = LOOP.read(
            env,
            max_prompt_tokens=max_prompt,
            max_completion_tokens=max_completion,
            max_total_tokens=max_total,
            max_tool_result_tokens=room,
            tool_timeout_s=tools_proxy.timeout_seconds,
            default_model=runtime.default_model if runtime else EXTRACTIVE,
        )
        return cls(
            # Every Generate body Envoy lets through reaches the validator (a 400 naming the
            # field), not grpc's bare RESOURCE_EXHAUSTED.
            server=ServerSettings.for_service(
                "llm", env, max_message_bytes=GENERATE_MAX_REQUEST_BYTES
            ),
            tools_proxy=tools_proxy,
            runtime=runtime,
            loop=loop,
        )


def check_tool_result_room(max_total: int, max_prompt: int, max_completion: int) -> int:
    """One tool result's room (LoopSettings.max_tool_result_tokens): what the first prompt
    and one answer leave of the total. A total that leaves less than MIN_TOOL_RESULT_ROOM is
    refused: every tool call would fail with LLM_LIMIT_EXCEEDED."""
    room = tool_result_room(max_total, max_prompt, max_completion)
    if room < MIN_TOOL_RESULT_ROOM:
        raise SettingsError(
            f"LLM_SERVICE_MAX_TOTAL_TOKENS={max_total} leaves {room} tokens for a tool result "
            f"past MAX_PROMPT_TOKENS={max_prompt} and MAX_COMPLETION_TOKENS={max_completion}; "
            f"it must leave at least {MIN_TOOL_RESULT_ROOM}: raise "
            "LLM_SERVICE_MAX_TOTAL_TOKENS or lower MAX_PROMPT_TOKENS"
        )
    return room


MIN_TOOL_STEPS = 1
"""The lowest MAX_TOOL_STEPS. The Orchestrator plans one tool call for S2 (the rates, the key
rate, the news, the knowledge base) and S3 (the selected documents read whole), and the LLM
service refuses a plan of more calls than MAX_TOOL_STEPS as the caller's error
(INVALID_ARGUMENT, relayed as a 400): at 0 it would refuse every such request."""
LOOP = Fields(
    LoopSettings,
    max_tool_steps=integer("MAX_TOOL_STEPS", minimum=MIN_TOOL_STEPS, maximum=MAX_TOOL_STEPS_LIMIT),
    max_total_tokens=MAX_TOTAL_TOKENS,
    watchdog_s=number("LLM_SERVICE_WATCHDOG_SECONDS", minimum=0.1, maximum=MAX_TIMEOUT_SECONDS),
    external_tool_timeout_s=number(
        "LLM_SERVICE_EXTERNAL_TOOL_TIMEOUT_S", minimum=0.1, maximum=MAX_TIMEOUT_SECONDS
    ),
)  # fmt: skip
TOOLS_PROXY = downstream(
    "MCP_PROXY_URL", "LLM_SERVICE_MCP_TIMEOUT_SECONDS", 5.0, "toolsproxy",
    doc="ToolsProxyService (llm-service.md §11): host:port or a grpc:// / http:// URL.",
)  # fmt: skip
