"""What the orchestrator, the LLM service and ToolsProxy agree on about tools, in one place:
the tools' names (agent.md §3), the codes of a failed tool call (ExecuteResponse.error.code,
toolsproxy.proto), the result fields that hold document text, the shape of an id argument,
and the defaults of the arguments the orchestrator plans (the Bank of Russia's calendar
among them).

ToolsProxy defines the tools (their schemas are the contract, services/common/tool_args.py
checks arguments against them); the orchestrator plans calls by these names and the LLM
service offers, checks and reads them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any

from services.common.document_limits import MAX_PART_ID_CHARS
from services.common.search_contract import (
    check_tenant_id,
    check_user,
    missing_user_context,
    refuse_reserved_tenant,
)

# -- tool names ------------------------------------------------------------------------------
READ_CHUNK_WINDOW = "read_chunk_window"
READ_DOC_SECTION = "read_doc_section"
READ_DOC_PAGES = "read_doc_pages"
READ_DOC_METADATA = "read_doc_metadata"
DOC_LOCAL_SEARCH = "doc_local_search"
LOAD_DOCUMENTS_FULL = "load_documents_full"
SEARCH_USER_DOCUMENTS = "search_user_documents"
SEARCH_GENERAL_KB = "search_general_kb"
FETCH_CBR_DATA = "fetch_cbr_data"
FETCH_FINANCE_NEWS = "fetch_finance_news"
TOOL_NAMES = (
    READ_CHUNK_WINDOW, READ_DOC_SECTION, READ_DOC_PAGES, READ_DOC_METADATA, DOC_LOCAL_SEARCH,
    LOAD_DOCUMENTS_FULL, SEARCH_USER_DOCUMENTS, SEARCH_GENERAL_KB, FETCH_CBR_DATA,
    FETCH_FINANCE_NEWS,
)  # fmt: skip
"""Every tool of the contract (agent.md §5); ToolsProxy serves each of them."""

READ_TOOLS = (READ_CHUNK_WINDOW, READ_DOC_SECTION)
"""The tools that read a listed section: the document scenarios offer these."""
FULL_TEXT_TOOLS = (LOAD_DOCUMENTS_FULL, READ_DOC_PAGES)
"""The tools that read whole documents (S3)."""
EXTERNAL_TOOLS = frozenset({FETCH_CBR_DATA, FETCH_FINANCE_NEWS})
"""Tools over services outside the mesh (the Bank of Russia, Tavily)."""

# -- codes of a failed tool call -------------------------------------------------------------
ACCESS_DENIED = "ACCESS_DENIED"
WINDOW_TOO_LARGE = "WINDOW_TOO_LARGE"
RATE_LIMIT_EXCEEDED = "RATE_LIMIT_EXCEEDED"
NOT_FOUND = "NOT_FOUND"
INVALID_ARGUMENT = "INVALID_ARGUMENT"
UPSTREAM_UNAVAILABLE = "UPSTREAM_UNAVAILABLE"

# -- who calls -------------------------------------------------------------------------------


def check_tool_user(tenant_id: str, user_id: str, roles: tuple[str, ...] = ()) -> None:
    """A tool runs for a tenant and a user (docs/architecture.md §16): ToolsProxy refuses an
    Execute without both, and the LLM service a Generate that offers tools, with the same
    errors. The rate limits and the logs name the user: no tool runs for an anonymous one,
    and the knowledge base's reserved tenant is never a caller's own."""
    if not tenant_id.strip():
        raise missing_user_context("user.tenant_id", "user.tenant_id is required")
    if not user_id.strip():
        raise missing_user_context("user.user_id", "user.user_id is required")
    check_tenant_id(tenant_id, "user.tenant_id")
    check_user(user_id, roles, "user.")
    refuse_reserved_tenant(tenant_id, "user.tenant_id", "search it with search_general_kb")


# -- arguments and results -------------------------------------------------------------------
ID_SCHEMA: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": MAX_PART_ID_CHARS}
"""A doc_id, section_id or chunk id argument."""


def tool_arguments(
    properties: Mapping[str, Any], required: Sequence[str], extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A tool's argument schema: a closed object, so unknown arguments (a tenant_id among
    them) are refused. `extra`: the tool's own `x-` keys."""
    return {
        "type": "object",
        "properties": dict(properties),
        "required": list(required),
        "additionalProperties": False,
        **(extra or {}),
    }


def read_chunk_window_arguments(per_side: Mapping[str, Any]) -> dict[str, Any]:
    """read_chunk_window's arguments; `per_side` is the schema of a radius (ToolsProxy's
    names its maximum, MCP_PROXY_MAX_WINDOW_RADIUS)."""
    return tool_arguments(
        {
            "doc_id": ID_SCHEMA,
            "anchor_chunk_id": ID_SCHEMA,
            "radius": per_side,
            "window_before": per_side,
            "window_after": per_side,
        },
        ["doc_id", "anchor_chunk_id"],
    )


READ_DOC_SECTION_DESCRIPTION = "Read the full text of one section of a document."
READ_DOC_SECTION_ARGUMENTS = tool_arguments(
    {"doc_id": ID_SCHEMA, "section_id": ID_SCHEMA}, ["doc_id", "section_id"]
)
TEXT_FIELDS = ("text", "content", "snippet")
"""Result fields holding untrusted text: ToolsProxy limits and delimits them, the LLM service
counts and reads them."""
EXTERNAL_LABEL_FIELDS = ("title",)
"""Short fields of an external tool's result (CBR, Tavily) holding free text the outside
service wrote: a news headline, a web page's title. ToolsProxy delimits them as EXTERNAL data
like TEXT_FIELDS (they keep their meaning and place, and do not count against the text
budget); the LLM service moves every delimited field out of the JSON header into the
delimited texts. A document's titles are not among them: the tenant's own, they stay plain
(neutralised) fields; nor is the bank's name of a currency, reference data held to a
currency name's shape (toolsproxy/cbr.py), which a small model read as the answer when it
stood apart as a block of its own."""
NEWS_QUERY_MAX_CHARS = 400
"""Longest fetch_finance_news query (Tavily advises queries under 400 characters); ToolsProxy
refuses a longer one, the orchestrator cuts what it plans to this."""
NEWS_MAX_RESULTS = 5
"""Most results of one fetch_finance_news call (agent.md §5.3: 3-5), the number a call that
gives no `max_results` gets, and what the orchestrator plans."""
NEWS_SEARCH_DEPTH = "advanced"
"""fetch_finance_news's `search_depth` when a call gives none (agent.md §5.3 asks for
advanced), and what the orchestrator plans."""
SEARCH_TOP_K = 5
"""search_user_documents' and search_general_kb's `top_k` when a call gives none, and what
the orchestrator plans."""
MAX_TOOL_QUERY_CHARS = 1000
"""Longest query of search_user_documents and search_general_kb: a model's search words,
tighter than what Retrieval itself takes (search_contract.MAX_QUERY_CHARS, a user's
question). ToolsProxy refuses a longer one, the orchestrator cuts what it plans to this."""

# -- the Bank of Russia's calendar (fetch_cbr_data) ------------------------------------------
BANK_TIMEZONE = timezone(timedelta(hours=3), "MSK")
"""The Bank of Russia publishes on Moscow time (UTC+3, no daylight saving since 2014)."""
KEY_RATE_DAYS = 30
"""Days fetch_cbr_data's key_rate looks back from its last day: the range when a call gives
no date_from, and how far back it seeks the rate in force on a `date`. The orchestrator
plans this range."""
CBR_MAX_RANGE_DAYS = 366
"""Longest date_to - date_from, in days, of one fetch_cbr_data call (a leap year's whole
length): ToolsProxy refuses a longer range, and the orchestrator asks back for a shorter
period rather than plan one."""


def bank_today(now: datetime | None = None) -> date:
    """Today on the bank's calendar: the Moscow date at `now` (an aware datetime; default the
    current time). fetch_cbr_data's default day and the orchestrator's "today" are this date,
    so between 21:00 and 24:00 UTC both are already the next day."""
    return (now or datetime.now(UTC)).astimezone(BANK_TIMEZONE).date()
