"""Tool calls as the Orchestrator and the LLM service both see them (llm.v1's PlannedCall and
ToolCallRecord in domain form): one definition for the two ends of the wire."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PlannedCall:
    """A tool call decided before the model is asked (the Orchestrator's scenario knows it:
    load the selected documents, fetch the rates); the LLM service runs it first."""

    tool_name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolCallRecord:
    """A tool call the LLM service executed: its name, arguments and a short result summary."""

    name: str
    arguments: dict[str, Any]
    result_summary: str
