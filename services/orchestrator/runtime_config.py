"""The orchestrator's runtime configuration (GET/POST /internal/orchestrator/config).

It lives in this replica's memory: an update changes this process only and is lost on
restart. With several replicas, send the update to each (or set the env vars and roll).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from services.common import errors
from services.common.generate_contract import MAX_TOOL_STEPS_LIMIT, MODEL_NAME_RULE, is_model_name
from services.common.search_contract import DEFAULT_WINDOW_RADIUS
from services.orchestrator.prompt_budget import MIN_CONTEXT_TOKEN_BUDGET

log = logging.getLogger("visior.orchestrator")

LIMITS: dict[str, tuple[int, int]] = {
    "prompt_token_budget": (1, 131_072),
    "context_token_budget": (MIN_CONTEXT_TOKEN_BUDGET, 1_048_576),
    "max_tool_steps": (0, MAX_TOOL_STEPS_LIMIT),
}
"""The range of each numeric field, for its ORCH_* setting and for UpdateConfig."""
DEFAULT_MAX_RESULTS = 10
"""Sections in the first prompt when a request gives no max_results (ORCH_DEFAULT_TOP_K's
default)."""


@dataclass(frozen=True)
class RuntimeConfig:
    """orchestrator.md §2's configuration."""

    default_model: str = ""
    """Model name sent to the LLM service; empty = the LLM service's own DEFAULT_MODEL_NAME."""
    prompt_token_budget: int = 2048
    """Tokens the section list of a first prompt (S1, S4) may hold: past it the Orchestrator
    shortens the lowest-scored summaries, then drops the lowest-scored sections. It is not
    sent to the LLM service; the whole prompt is bounded by MAX_PROMPT_TOKENS and
    ORCH_CONTEXT_TOKEN_BUDGET."""
    context_token_budget: int = 8192
    """Tokens the conversation the model sees may hold, the answer aside: the first prompt
    plus every tool call and tool result. Sent to the LLM service, which caps the
    conversation at it (or at LLM_SERVICE_MAX_TOTAL_TOKENS less MAX_COMPLETION_TOKENS when
    that is lower); the Orchestrator shapes its first prompts to it less what the LLM
    service adds (LLM_PROMPT_RESERVE_TOKENS). Its lowest value leaves room for the
    routing prompt and a short question; S3 raises it to fit the selected documents whole."""
    max_tool_steps: int = 3
    """Tool calls the model may make per request (the LLM service's MAX_TOOL_STEPS caps it).
    The one call the Orchestrator plans (S2, S3) is made whatever it is, 0 included; in S3 it
    counts among them. S1 and S4 answer from sections read, so they allow at least one."""
    window_radius: int = DEFAULT_WINDOW_RADIUS
    """Largest per-side radius of read_chunk_window (the schedule grows 1 → 2 → … → R)."""
    mock_mode: bool = False
    """Answer from deterministic in-process stand-ins instead of Retrieval and the LLM."""


@dataclass(frozen=True)
class ConfigUpdate:
    """Fields to change; None keeps the current value."""

    default_model: str | None = None
    prompt_token_budget: int | None = None
    context_token_budget: int | None = None
    max_tool_steps: int | None = None
    window_radius: int | None = None
    window_max: int | None = None
    mock_mode: bool | None = None


class ConfigHolder:
    """Holds the current RuntimeConfig; updates are validated and applied whole or not at all."""

    def __init__(self, initial: RuntimeConfig, max_window_radius: int) -> None:
        self._config = initial
        self._max_radius = max_window_radius

    @property
    def current(self) -> RuntimeConfig:
        return self._config

    def update(self, u: ConfigUpdate) -> RuntimeConfig:
        changes: dict[str, object] = {}
        if u.default_model is not None:
            # "" means "the LLM service's own DEFAULT_MODEL_NAME"; blanks alone are a mistake.
            if u.default_model and not is_model_name(u.default_model):
                raise errors.invalid(
                    "default_model",
                    f"default_model must be empty (the LLM default) or {MODEL_NAME_RULE}",
                )
            changes["default_model"] = u.default_model
        for name, (lo, hi) in LIMITS.items():
            value = getattr(u, name)
            if value is not None:
                if not lo <= value <= hi:
                    raise errors.invalid(name, f"{name} must be within {lo}..{hi}")
                changes[name] = value
        if u.window_radius is not None and u.window_max is not None:
            raise errors.invalid(
                "window_max", "give window_radius or the legacy window_max, not both"
            )
        radius = u.window_radius
        if u.window_max is not None:
            if u.window_max < 0:
                raise errors.invalid("window_max", "window_max must not be negative")
            # The legacy per-side maximum, held to the tools proxy's (docs/architecture.md §8).
            radius = min(u.window_max, self._max_radius)
        if radius is not None:
            if not 0 <= radius <= self._max_radius:
                raise errors.invalid(
                    "window_radius",
                    f"window_radius must be within 0..{self._max_radius} (the tools proxy's limit)",
                )
            changes["window_radius"] = radius
        if u.mock_mode is not None:
            changes["mock_mode"] = u.mock_mode
        before = self._config
        self._config = replace(before, **changes)  # type: ignore[arg-type]
        changed = {
            k: [getattr(before, k), v] for k, v in changes.items() if getattr(before, k) != v
        }
        if changed:
            # A record of what this replica now runs with (replicas do not share it).
            log.warning("runtime config changed", extra={"changed": changed})
        return self._config
