"""search_user_documents and search_general_kb: Retrieval searches run for the caller's tenant."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from services.common import errors
from services.common.search_contract import (
    KB_FACET_CHARS,
    KB_FACETS,
    KB_SOURCE,
    USER_SOURCE,
    check_query,
    kb_tag,
)
from services.common.tool_contract import (
    ID_SCHEMA,
    INVALID_ARGUMENT,
    MAX_TOOL_QUERY_CHARS,
    SEARCH_GENERAL_KB,
    SEARCH_TOP_K,
    SEARCH_USER_DOCUMENTS,
    UPSTREAM_UNAVAILABLE,
    tool_arguments,
)
from services.common.wording import fold_case
from services.toolsproxy.tools import DOCUMENT_TEXT, Caller, Tool, ToolFailure

MAX_TOP_K = 20
MAX_DOC_IDS = 50


@dataclass(frozen=True)
class SearchHitView:
    """One passage as the model sees it (text is document data, never instructions)."""

    doc_id: str
    section_id: str
    chunk_id: str
    title: str
    text: str
    score: float
    page_start: int
    page_end: int


@dataclass(frozen=True)
class SearchCall:
    """A search asked of Retrieval; the tenant comes from the Caller, never from arguments."""

    tenant_id: str
    query: str
    top_k: int
    doc_ids: tuple[str, ...] = ()
    source: str = ""
    filters: dict[str, str] = field(default_factory=dict)
    trace_id: str = ""


class Searcher(Protocol):
    """The Retrieval port (services/toolsproxy/clients.py adapts RetrievalService.Search)."""

    async def search(self, call: SearchCall) -> list[SearchHitView]: ...


_KB_FACETS: dict[str, Any] = {
    facet: {"type": "string", "maxLength": KB_FACET_CHARS} for facet in KB_FACETS
}
"""What a knowledge-base article is tagged with (`kb_tag`): search_general_kb's filters."""


def _facet(args: Mapping[str, Any], name: str) -> str:
    """search_general_kb's `name` (topic, jurisdiction), as an argument of its own or in
    `filters` (agent.md §3: `query, top_k, filters?`); given both ways, they must agree."""
    given = args.get(name, "").strip()
    nested = args.get("filters", {}).get(name, "").strip()
    if given and nested and fold_case(given) != fold_case(nested):
        raise ToolFailure(INVALID_ARGUMENT, f"{name} and filters.{name} disagree: give one of them")
    return given or nested


def _hits(hits: Sequence[SearchHitView], threshold: float) -> dict[str, Any]:
    kept = [h for h in hits if h.score >= threshold]
    return {
        "content_type": DOCUMENT_TEXT,
        "hits": [
            {
                "doc_id": h.doc_id, "section_id": h.section_id, "chunk_id": h.chunk_id,
                "title": h.title, "text": h.text, "score": round(h.score, 4),
                "page_start": h.page_start, "page_end": h.page_end,
            }
            for h in kept
        ],
        "total": len(kept),
    }  # fmt: skip


class SearchTools:
    """The two search tools over a Searcher; rate-limited on the tenant key whatever
    document ids they filter on (`Tool.doc_rate_keys`)."""

    def __init__(self, searcher: Searcher) -> None:
        self._searcher = searcher
        common = {
            "query": {"type": "string", "minLength": 1, "maxLength": MAX_TOOL_QUERY_CHARS},
            "top_k": {"type": "integer", "minimum": 1, "maximum": MAX_TOP_K},
            "score_threshold": {"type": "number", "minimum": 0, "maximum": 1},
        }
        self.tools = {
            t.name: t
            for t in (
                Tool(
                    SEARCH_USER_DOCUMENTS,
                    "Search the user's own documents (all of them, or only `document_ids`) "
                    f"and return the best passages with pages; top_k at most {MAX_TOP_K}.",
                    tool_arguments(
                        {
                            **common,
                            "document_ids": {
                                "type": "array",
                                "items": ID_SCHEMA,
                                "maxItems": MAX_DOC_IDS,
                            },
                        },
                        ["query"],
                    ),
                    self.search_user_documents,
                    doc_rate_keys=False,  # document_ids filter the search: the tenant key
                ),
                Tool(
                    SEARCH_GENERAL_KB,
                    "Search the shared knowledge base (general questions: taxes, law, "
                    "finance); optional topic/jurisdiction (also as filters, agent.md's "
                    f"spelling); top_k at most {MAX_TOP_K}.",
                    tool_arguments(
                        {
                            **common,
                            **_KB_FACETS,
                            "filters": {
                                "type": "object",
                                "properties": _KB_FACETS,
                                "additionalProperties": False,
                            },
                        },
                        ["query"],
                    ),
                    self.search_general_kb,
                    doc_rate_keys=False,
                ),
            )
        }

    async def _run(self, call: SearchCall, threshold: float) -> dict[str, Any]:
        # Retrieval refuses a query it cannot search; refused there it would come back as our
        # own error (DOWNSTREAM_REJECTED) and reach the model as an outage to wait out.
        try:
            check_query(call.query)
        except errors.InvalidArgumentError as exc:
            raise ToolFailure(INVALID_ARGUMENT, exc.message) from None
        try:
            hits = await self._searcher.search(call)
        except errors.InvalidArgumentError as exc:
            raise ToolFailure(INVALID_ARGUMENT, exc.message) from None
        except errors.ServiceError as exc:
            raise ToolFailure(
                UPSTREAM_UNAVAILABLE, f"search is unavailable right now ({exc.reason})"
            ) from None
        return _hits(hits, threshold)

    async def search_user_documents(self, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        call = SearchCall(
            tenant_id=caller.tenant_id,
            query=args["query"],
            top_k=args.get("top_k", SEARCH_TOP_K),
            doc_ids=tuple(args.get("document_ids", ())),
            source=USER_SOURCE,
            trace_id=caller.trace_id,
        )
        return await self._run(call, float(args.get("score_threshold", 0.0)))

    async def search_general_kb(self, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        # The knowledge base is read through Retrieval's source filter, which searches the
        # reserved knowledge-base tenant; the caller's tenant still travels for audit and
        # rate limits, and the caller cannot name any other tenant.
        # Knowledge-base articles carry topic:<x> and jurisdiction:<y> tags. Tag filters are
        # any-of, so the topic filters hard and the jurisdiction, when both are given, only
        # joins the query text; alone, it filters hard.
        query = args["query"]
        filters: dict[str, str] = {}
        topic, jurisdiction = (_facet(args, name) for name in _KB_FACETS)
        if topic:
            filters["tag"] = kb_tag("topic", topic)
            if jurisdiction:
                query = f"{query} {jurisdiction}"
        elif jurisdiction:
            filters["tag"] = kb_tag("jurisdiction", jurisdiction)
        call = SearchCall(
            tenant_id=caller.tenant_id,
            query=query,
            top_k=args.get("top_k", SEARCH_TOP_K),
            source=KB_SOURCE,
            filters=filters,
            trace_id=caller.trace_id,
        )
        return await self._run(call, float(args.get("score_threshold", 0.0)))
