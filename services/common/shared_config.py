"""Settings that more than one service reads, declared once (see services/common/settings.py).

Two services that must agree on a value read it under the same name: the window radius
limit and the size and document count of a whole-document read (the Orchestrator and
ToolsProxy), the LLM
service's first-prompt limit (the LLM service and the Orchestrator, which shapes first
prompts to fit), its answer limit (the Orchestrator asks for no longer one) and its
conversation limit (the Orchestrator reads documents whole only when one tool result holds
them), the data directory and the document store (Retrieval and ToolsProxy).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from services.common.prompt_limits import (
    DEFAULT_LLM_COMPLETION_TOKENS,
    DEFAULT_LLM_PROMPT_TOKENS,
    LLM_PROMPT_RESERVE_TOKENS,
    MIN_LLM_COMPLETION_TOKENS,
)
from services.common.search_contract import DEFAULT_WINDOW_RADIUS, window_radius
from services.common.settings import Env, Var, integer, text

MAX_RADIUS, MAX_TOTAL_WINDOW = 50, 101

PROXY_MAX_WINDOW_RADIUS = integer(
    "MCP_PROXY_MAX_WINDOW_RADIUS", DEFAULT_WINDOW_RADIUS, 0, MAX_RADIUS,
    also=("RAG_WINDOW_RADIUS",),
    default_doc=f"{DEFAULT_WINDOW_RADIUS}, or from MCP_PROXY_MAX_CHUNK_WINDOW",
    doc="ToolsProxy's largest window radius R per side (a window is 2R+1 chunks); the "
    "Orchestrator's radius never exceeds it.",
)  # fmt: skip
LEGACY_CHUNK_WINDOW = integer(
    "MCP_PROXY_MAX_CHUNK_WINDOW", None, 1, MAX_TOTAL_WINDOW,
    doc="Legacy total window N (orchestrator.md §5): read as R = floor((N-1)/2) where no "
    "radius is set, for both the Orchestrator's radius and ToolsProxy's limit.",
)  # fmt: skip
UTF8_MAX_BYTES = 4
"""UTF-8 bytes one character takes at most: a limit in bytes holds a quarter as many
characters of any script."""
JSON_CHAR_BYTES = 6
"""JSON bytes the Respond and Generate body limits count for one character of a text field:
enough for raw UTF-8 (at most 4 bytes) and for the \\uXXXX escape Python's json.dumps writes
by default (ensure_ascii) for a character of the Basic Multilingual Plane, Cyrillic included.
json.dumps escapes a character beyond it (an emoji, CJK Extension B) as two escapes, 12 bytes:
a text of such characters near its limit can exceed the route's limit when so escaped; sent as
raw UTF-8 (`ensure_ascii=False`) it fits."""
TEXT_ENVELOPE_BYTES = 1 << 20
"""Room a Respond or Generate body leaves for everything but the texts its limit counts: ids,
names, filters, the message roles and the JSON around them. For Generate also the fields its
limit does not count: the system prompt and each context chunk text (each bounded on its own
by the validator, not all at once within this room), stop sequences, anchors and planned
calls; they share it, and a body with more of them is refused with 413."""


def text_body_bytes(chars: int) -> int:
    """The body limit of a JSON route whose request texts hold at most `chars` characters in
    all: JSON_CHAR_BYTES a character plus TEXT_ENVELOPE_BYTES. It is also the gRPC message
    limit of the service behind the route: a proto message is never larger than the JSON it
    was transcoded from (a string is raw UTF-8 in proto, raw or escaped in JSON), so every body
    Envoy lets through reaches the service's validator."""
    return chars * JSON_CHAR_BYTES + TEXT_ENVELOPE_BYTES


MAX_REQUEST_METADATA_BYTES = 2 << 20
"""The most request metadata a gRPC server of the mesh takes, as grpc counts it: names and
values plus 32 bytes an entry (HTTP/2's header list size), pseudo-headers included. More
than any Envoy sidecar lets through (services/devtools/envoy_config.py checks its header
limits against it; the retrieval listener's, sized for ListDocuments' query string, is the
largest), so a JSON request Envoy takes never meets grpc's default limit (8 KiB, at most
16 KiB), whose refusal is a RESOURCE_EXHAUSTED without ErrorInfo that reads as a rate limit."""
MAX_CONTEXT_CHARS = 50_000
"""Characters of selected documents the Orchestrator reads whole (S3) by default: the
default of ORCH_MAX_CONTEXT_CHARS (agent.md §10's max_context_chars)."""
DEFAULT_FULL_TEXT_BYTES = MAX_CONTEXT_CHARS * UTF8_MAX_BYTES
"""ToolsProxy's default for one load_documents_full result: MAX_CONTEXT_CHARS characters of
any script."""
DEFAULT_FULL_DOCUMENTS = 10
"""Documents one load_documents_full call may ask for, by default."""
PROXY_MAX_FULL_DOCUMENTS = integer(
    "MCP_PROXY_MAX_FULL_DOCUMENTS", DEFAULT_FULL_DOCUMENTS, 1, 50,
    doc="Documents one load_documents_full call may ask for. The Orchestrator reads selected "
    "documents whole (S3) only when there are no more of them than this.",
)  # fmt: skip
WHOLE_READ_CHARS_PER_TOKEN = 2
"""Characters of document text one cl100k token holds, for a document Retrieval holds no
token count of (ListDocuments' `tokens` 0): rounded down from what Russian text with figures
and markup measures (2.1-2.4, samples/docs; English 3.5-4.8). Denser text (tables of numbers,
prose of rare words: 1.5-1.8) takes more, which only a count sees."""
WHOLE_READ_CALL_TOKENS = 300
"""Tokens a whole read takes beside its documents: the planned call's turn, the result's
message (role, tool name, call id) and the JSON header around the documents' entries."""
WHOLE_READ_DOCUMENT_TOKENS = 140
"""Tokens one document adds to a whole read beside its text when its id and title are not
known (an estimate): ordinary ids and titles take ≈ 100 (tests/unit/test_whole_read_room.py)."""
WHOLE_READ_ENTRY_TOKENS = 72
"""Tokens one document adds to a whole read beside its text, id and title: its entry's keys,
page count and size (69 at their longest), content type and delimiters."""
WHOLE_READ_ID_COPIES = 3
"""A document's id stands three times in a whole read: the call's arguments, its entry in the
header, its delimiters; its title once."""


def estimated_tokens(chars: int) -> int:
    """Tokens of `chars` characters of document text whose count is not known
    (WHOLE_READ_CHARS_PER_TOKEN)."""
    return -(-chars // WHOLE_READ_CHARS_PER_TOKEN)


def entry_tokens(count: Callable[[str], int], doc_id: str, title: str) -> int:
    """Tokens one document adds to a whole read beside its text, its id and title counted
    with `count` (the cl100k tokenizer's)."""
    title_json = json.dumps(title, ensure_ascii=False)
    return WHOLE_READ_ENTRY_TOKENS + WHOLE_READ_ID_COPIES * count(doc_id) + count(title_json)


def ordinary_entries(documents: int) -> int:
    """What the entries of `documents` documents whose ids and titles are not known take."""
    return WHOLE_READ_DOCUMENT_TOKENS * documents


def whole_read_tokens(text_tokens: int, entries: int) -> int:
    """Tokens a whole read (S3) takes of the conversation, as the LLM service feeds it to the
    model: its documents' texts (`text_tokens`), their `entries` (`entry_tokens` each, or
    `ordinary_entries`) and the call and result around them."""
    return text_tokens + WHOLE_READ_CALL_TOKENS + entries


MAX_FULL_TEXT_BYTES = 3 << 20
PROXY_MAX_FULL_TEXT_BYTES = integer(
    "MCP_PROXY_MAX_FULL_TEXT_BYTES", DEFAULT_FULL_TEXT_BYTES, 256, MAX_FULL_TEXT_BYTES,
    doc="UTF-8 bytes of text in one load_documents_full result. The Orchestrator reads "
    "selected documents whole (S3) only up to a quarter of it in characters, so this limit "
    "never cuts a whole read.",
)  # fmt: skip
MIN_PROMPT_ROOM_TOKENS = 1024
"""The least room the Orchestrator's own part of a first prompt needs (its PromptFitter.room,
services/orchestrator/prompt_budget.py): the longest system prompt it sends (the routing
prompt, ≈ 520 tokens) with a short question, or a scenario's system prompt with a short
question and one listed section."""
MIN_FIRST_PROMPT_TOKENS = LLM_PROMPT_RESERVE_TOKENS + MIN_PROMPT_ROOM_TOKENS
"""The smallest first prompt a Respond works in: the lowest MAX_PROMPT_TOKENS and the lowest
context_token_budget (ORCH_CONTEXT_TOKEN_BUDGET, UpdateConfig). The Orchestrator's room is the
lower of the two less LLM_PROMPT_RESERVE_TOKENS (what the LLM service adds); below this it
holds no short question, and every Respond is refused."""
MAX_PROMPT_TOKENS = integer(
    "MAX_PROMPT_TOKENS", DEFAULT_LLM_PROMPT_TOKENS, MIN_FIRST_PROMPT_TOKENS,
    doc="The LLM service's first prompt, context included, in tokens (llm-service.md §11): "
    "a longer one is refused with LLM_LIMIT_EXCEEDED. The Orchestrator reads it too and "
    "shapes every first prompt to fit; its lowest value leaves room for the Orchestrator's "
    "longest system prompt and a short question beside what the LLM service adds.",
)  # fmt: skip
MAX_COMPLETION_TOKENS = integer(
    "MAX_COMPLETION_TOKENS", DEFAULT_LLM_COMPLETION_TOKENS, MIN_LLM_COMPLETION_TOKENS,
    doc="Each model answer of the LLM service, in tokens (llm-service.md §11); reserved for "
    "the final answer. A request's max_tokens above it is refused with LLM_LIMIT_EXCEEDED; "
    "the Orchestrator reads it too and asks for no more.",
)  # fmt: skip
DEFAULT_MAX_TOTAL_TOKENS = 32_768
"""LLM_SERVICE_MAX_TOTAL_TOKENS by default, unless the first prompt and one answer need more:
room for the full-context scenario (S3) at the default ORCH_MAX_CONTEXT_CHARS of text of 1.8
characters a token or more."""
DEFAULT_TOOL_RESULT_ROOM = 2048
"""What the default LLM_SERVICE_MAX_TOTAL_TOKENS leaves at the least for tool results past
the first prompt and one answer."""
MAX_TOTAL_TOKENS = integer(
    "LLM_SERVICE_MAX_TOTAL_TOKENS", None, 512,
    default_doc=f"max({DEFAULT_MAX_TOTAL_TOKENS}, MAX_PROMPT_TOKENS + MAX_COMPLETION_TOKENS + "
    f"{DEFAULT_TOOL_RESULT_ROOM})",
)  # fmt: skip
"""The LLM service's conversation limit; documented by the field it fills
(services/llm/loop.py LoopSettings.max_total_tokens)."""
DATA_DIR = text(
    "VISIOR_DATA_DIR", "data",
    doc="Where the local data lives: the Qdrant Edge shard (index/), the SQLite document "
    "store (docstore.sqlite) and the ingest journal, unless set otherwise.",
)  # fmt: skip


def radius(env: Env, primary: Var) -> int:
    """`primary` (a per-side radius), else the legacy total window (docs/architecture.md §8)."""
    return window_radius(primary.read(env, None), LEGACY_CHUNK_WINDOW.read(env))


def proxy_max_window_radius(env: Env) -> int:
    """ToolsProxy's per-side radius limit, as both ToolsProxy and the Orchestrator read it."""
    return radius(env, PROXY_MAX_WINDOW_RADIUS)


def proxy_full_text_bytes(env: Env) -> int:
    """ToolsProxy's load_documents_full limit in UTF-8 bytes (MCP_PROXY_MAX_FULL_TEXT_BYTES)."""
    return int(PROXY_MAX_FULL_TEXT_BYTES.read(env))


def proxy_full_text_chars(env: Env) -> int:
    """Characters of any script a whole load_documents_full result holds."""
    return proxy_full_text_bytes(env) // UTF8_MAX_BYTES


def proxy_full_documents(env: Env) -> int:
    """Documents one load_documents_full call may ask for (MCP_PROXY_MAX_FULL_DOCUMENTS)."""
    return int(PROXY_MAX_FULL_DOCUMENTS.read(env))


def llm_completion_limit(env: Env) -> int:
    """The LLM service's answer limit in tokens (MAX_COMPLETION_TOKENS)."""
    return int(MAX_COMPLETION_TOKENS.read(env))


def llm_prompt_limit(env: Env) -> int:
    """The LLM service's first-prompt limit in tokens (MAX_PROMPT_TOKENS)."""
    return int(MAX_PROMPT_TOKENS.read(env))


def llm_total_limit(env: Env) -> int:
    """The LLM service's conversation limit in tokens (LLM_SERVICE_MAX_TOTAL_TOKENS)."""
    floor = llm_prompt_limit(env) + llm_completion_limit(env) + DEFAULT_TOOL_RESULT_ROOM
    return int(MAX_TOTAL_TOKENS.read(env, max(DEFAULT_MAX_TOTAL_TOKENS, floor)))


def tool_result_room(total: int, prompt: int, completion: int) -> int:
    """One tool result's ceiling in the LLM service, in tokens: what its first prompt and one
    answer leave of its total."""
    return total - prompt - completion


def llm_tool_result_limit(env: Env) -> int:
    """`tool_result_room` of the LLM service's three limits as `env` sets them."""
    return tool_result_room(llm_total_limit(env), llm_prompt_limit(env), llm_completion_limit(env))


def data_dir(env: Env) -> Path:
    return Path(DATA_DIR.read(env))
