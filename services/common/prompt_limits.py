"""The first prompt's size, as the orchestrator and the LLM service both count it.

The LLM service refuses a first prompt past its `max_prompt_tokens` (LLM_LIMIT_EXCEEDED);
the orchestrator shapes every first prompt to fit under that same limit, so an ordinary
question is trimmed, never refused. Both read the limit from the same environment variable
(MAX_PROMPT_TOKENS, services/common/shared_config.py) and count with the same tokenizer
(services/common/tokenizer.py).

The anchor line of the tool-use block is written (anchor_line) and read (parse_anchor_line)
here only.
"""

from __future__ import annotations

import json
import re

LLM_LIMIT_EXCEEDED = "LLM_LIMIT_EXCEEDED"
"""The reason of the LLM service's refusal of a request past its limits."""
PROMPT_LIMIT_NAME = "max_prompt_tokens"
"""The `limit_name` of a refusal of a first prompt past MAX_PROMPT_TOKENS (the LLM service's,
or the Orchestrator's own for a question that alone cannot fit); the Orchestrator reads it in
the LLM service's refusals to learn a lower limit."""
COMPLETION_LIMIT_NAME = "max_completion_tokens"
"""The `limit_name` of the LLM service's refusal of a max_tokens past MAX_COMPLETION_TOKENS."""
DEFAULT_LLM_PROMPT_TOKENS = 4096
DEFAULT_LLM_COMPLETION_TOKENS = 512
MIN_LLM_COMPLETION_TOKENS = 16
MESSAGE_TOKENS = 4
"""Tokens the LLM service counts around one chat message (its budget's MESSAGE_OVERHEAD)."""
REPLY_TOKENS = 3
"""Tokens the LLM service counts for the reply opener (its budget's REPLY_OVERHEAD)."""
LLM_PROMPT_RESERVE_TOKENS = 1024
"""What the LLM service adds to the caller's system prompt and messages, anchors aside:
its rules, answer format and data rule, the tool-use block and the tool definitions.
Measured at most ≈ 800 for the tools any scenario offers (tests/unit/
test_orchestrator_budget.py checks real requests against the LLM's own count)."""
ANCHOR_LINE_SLACK = 1
"""Tokens each anchor line of the tool-use block adds besides its text (the line break)."""
MAX_LISTED_ANCHORS = 20
"""The LLM service lists at most this many anchors in the tool-use block."""

_JSON_STRING = r'("(?:[^"\\]|\\.)*")'
_ANCHOR_LINE = re.compile(
    rf"- doc_id={_JSON_STRING} section_id={_JSON_STRING} anchor_chunk_id={_JSON_STRING}"
)


def anchor_line(doc_id: str, section_id: str, anchor_chunk_id: str) -> str:
    """One anchor as the LLM service's tool-use block lists it."""
    return (
        f"- doc_id={json.dumps(doc_id, ensure_ascii=False)} "
        f"section_id={json.dumps(section_id, ensure_ascii=False)} "
        f"anchor_chunk_id={json.dumps(anchor_chunk_id, ensure_ascii=False)}"
    )


def parse_anchor_line(line: str) -> tuple[str, str, str] | None:
    """The (doc_id, section_id, anchor_chunk_id) of a line as anchor_line writes it; None for
    any other line (one whose quoted values are not JSON strings included)."""
    m = _ANCHOR_LINE.fullmatch(line)
    if m is None:
        return None
    try:
        doc_id, section_id, chunk_id = (json.loads(g) for g in m.groups())
    except ValueError:
        return None
    return doc_id, section_id, chunk_id
