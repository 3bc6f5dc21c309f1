"""The tools the model may call, and the rules every tool obeys.

Document tools read the document store inside the caller's tenant. `ToolExecutor` runs any
tool (document, search or external) under the same rules:

- tenant and user come from `Caller` (the request context), never from arguments: every
  schema is closed (`additionalProperties: false`) and `tenant_id`/`user_id` arguments are
  refused before the schema is even looked at;
- arguments are checked against the tool's JSON schema, whose limits are stated in it;
- rate limits by calls and by result tokens per `tenant_id:doc_id` of the documents a call
  reads (per tenant for calls that read none: searches, whatever ids they filter on, and
  external data), see `ratelimit.py`; a call in flight reserves the tokens a full result
  of prose holds (RESERVED_BYTES_PER_TOKEN; none when it returns no text) until its
  result's tokens are charged;
- every text field of a result (`text`, `content`, `snippet`) counts against the tool's
  `max_text_bytes`, is trimmed at a character boundary when over (its object gets
  `truncated: true`, and so does the result), and is returned as delimited data:
  `<<<DOCUMENT doc_id="…" pages="3-4">>>\\n…\\n<<<END DOCUMENT>>>` with the object labelled
  `content_type: untrusted_document_text` (`EXTERNAL` / `untrusted_external_text` for tools
  over external services). Any run of three or more `<` inside data is replaced by as many
  `‹`, so no document can write the end marker and step out of its delimiters;
- one JSON log line and one metrics observation per call.

A tool failing is a result (`Outcome` with an error code) the model can react to; a bug
in a tool propagates (the server turns it into INTERNAL) after being logged and counted; a
call the caller cancelled (or whose deadline passed) is logged and counted as CANCELLED and
the cancellation propagates.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram

from services.common.lexical import bm25_scores, first_match, search_terms
from services.common.metrics import LATENCY_BUCKETS_SECONDS
from services.common.shared_config import (
    DEFAULT_FULL_DOCUMENTS,
    DEFAULT_FULL_TEXT_BYTES,
    UTF8_MAX_BYTES,
)
from services.common.tokenizer import count_tokens as default_count_tokens
from services.common.tool_args import ArgumentError, check_arguments
from services.common.tool_contract import (
    ACCESS_DENIED,
    DOC_LOCAL_SEARCH,
    EXTERNAL_LABEL_FIELDS,
    INVALID_ARGUMENT,
    LOAD_DOCUMENTS_FULL,
    NOT_FOUND,
    RATE_LIMIT_EXCEEDED,
    READ_CHUNK_WINDOW,
    READ_DOC_METADATA,
    READ_DOC_PAGES,
    READ_DOC_SECTION,
    READ_DOC_SECTION_ARGUMENTS,
    READ_DOC_SECTION_DESCRIPTION,
    TEXT_FIELDS,
    UPSTREAM_UNAVAILABLE,
    WINDOW_TOO_LARGE,
    read_chunk_window_arguments,
    tool_arguments,
)
from services.common.tool_contract import ID_SCHEMA as _ID
from services.common.untrusted import format_pages
from services.common.untrusted import neutralise_markers as neutralise_markers
from services.common.untrusted import unwrap_untrusted as unwrap_untrusted
from services.common.untrusted import wrap_untrusted as wrap_untrusted
from services.docstore.chunking import join_chunks, whole_text
from services.docstore.errors import StoreUnavailableError
from services.docstore.model import TO_THE_END, Chunk, Document
from services.docstore.store import DocumentStore
from services.toolsproxy.ratelimit import RateLimiter, RateLimitExceeded, Reservation

OK = "OK"
"""The outcome code of a successful call in logs and metrics."""
INTERNAL = "INTERNAL"
"""The outcome code in logs and metrics of a call whose tool raised an unexpected exception."""
CANCELLED = "CANCELLED"
"""The outcome code in logs and metrics of a call cancelled before it ended (the caller went
away or its deadline passed)."""

MAX_LOCAL_SEARCH_RESULTS = 5
"""doc_local_search returns at most this many hits (the contract's `max_results` <= 5)."""
SNIPPET_CHARS = 300
"""Length of a doc_local_search snippet, in characters."""
MAX_PAGE_NUMBER = 1_000_000
RESERVED_BYTES_PER_TOKEN = 4
"""A call in flight reserves its text budget divided by this many tokens: about what a full
result of prose holds (cl100k: Russian and English prose run near 4 UTF-8 bytes a token),
not the most it could hold (a token a byte), so calls running at once are refused for
tokens they are likely to use, not for ones they almost never do."""
IDENTITY_ARGUMENTS = ("tenant_id", "user_id")
"""Argument names no tool accepts: identity comes from the request context only."""
log = logging.getLogger("visior.toolsproxy")


@dataclass(frozen=True)
class Caller:
    """Who the tool runs for: from the request's user context, never from arguments."""

    tenant_id: str
    user_id: str
    trace_id: str = ""


@dataclass(frozen=True)
class ToolLimits:
    """Size limits every tool obeys (MCP_PROXY_*)."""

    max_window_radius: int = 3
    """Per-side radius R of read_chunk_window: 2R+1 chunks in all (MCP_PROXY_MAX_WINDOW_RADIUS)."""
    max_text_bytes: int = 16_384
    """UTF-8 bytes of text in one result; more is cut at a character boundary
    (MCP_PROXY_MAX_TEXT_BYTES)."""
    max_pages_per_call: int = 5
    """Pages one read_doc_pages call may read, counted after page_end is clamped to the
    document's last page (MCP_PROXY_MAX_PAGES_PER_CALL)."""
    max_full_documents: int = DEFAULT_FULL_DOCUMENTS
    """Documents one load_documents_full call may ask for (MCP_PROXY_MAX_FULL_DOCUMENTS)."""
    max_full_text_bytes: int = DEFAULT_FULL_TEXT_BYTES
    """UTF-8 bytes of text in one load_documents_full result (MCP_PROXY_MAX_FULL_TEXT_BYTES)."""


class ToolFailure(Exception):
    """A tool failed in a way the model can react to: {status: error, error: {code, message}}."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


ToolResult = dict[str, Any]


MAX_METADATA_SECTIONS = 500
"""Sections one read_doc_metadata result lists at most."""


def _always_text(args: Mapping[str, Any]) -> bool:
    """Tool.returns_text of a tool that may return text whatever its arguments."""
    return True


def _never_text(args: Mapping[str, Any]) -> bool:
    """Tool.returns_text of a tool whose results hold no text field (read_doc_metadata)."""
    return False


def _content_asked(args: Mapping[str, Any]) -> bool:
    """Tool.returns_text of load_documents_full: text unless include_content is false."""
    return args.get("include_content", True) is not False


@dataclass(frozen=True)
class Tool:
    """A tool: its JSON schema (limits stated in it) and how it runs.

    `run(caller, args)` gets arguments already checked against `schema` and returns the
    result dict, or an awaitable of it (network tools are async); it raises ToolFailure
    for an error the model can react to. It returns raw text under `text`/`content`/
    `snippet`; the executor trims, delimits and labels it. `content` says where the text
    comes from: "document" (the tenant's documents, the knowledge base) or "external"
    (CBR, Tavily). `max_text_bytes` overrides the executor's per-result limit.
    `doc_rate_keys` says whether the documents a call names (`doc_id`, `document_ids`,
    `doc_ids`) are documents it reads, each its own rate-limit key; a search sets it False:
    its ids only filter the search, and it counts against the tenant key alone.
    `returns_text(args)` says whether a call with these (checked) arguments can return
    text: one that cannot reserves no tokens while it runs, so a key full of reservations
    does not refuse it.
    """

    name: str
    description: str
    schema: dict[str, Any]
    run: Callable[[Caller, dict[str, Any]], ToolResult | Awaitable[ToolResult]]
    content: str = "document"
    max_text_bytes: int | None = None
    doc_rate_keys: bool = True
    returns_text: Callable[[Mapping[str, Any]], bool] = _always_text


# --- untrusted text: trimming and delimiting -------------------------------------------------


DOCUMENT_TEXT = "untrusted_document_text"
"""The content_type of a result holding the tenant's documents (or the knowledge base)."""
EXTERNAL_TEXT = "untrusted_external_text"
"""The content_type of a result holding text from an outside service (CBR, Tavily)."""
_CONTENT_KINDS = {
    "document": ("DOCUMENT", DOCUMENT_TEXT),
    "external": ("EXTERNAL", EXTERNAL_TEXT),
}


def trim_text(text: str, max_bytes: int) -> tuple[str, bool]:
    """Cut `text` to at most `max_bytes` UTF-8 bytes without splitting a character."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text, False
    return data[: max(0, max_bytes)].decode("utf-8", errors="ignore"), True


def _marker_attrs(obj: Mapping[str, Any], inherited: Mapping[str, object]) -> dict[str, object]:
    """What the opening marker says about the texts of `obj`: document, section, chunk, pages,
    url, as `obj` states them, else as its parents did (`inherited`).

    Pages are format_pages' (`page_start` with `page_end`, or `page`): an object that states
    its pages without a known first page has no `pages` attribute, not its parents' one.
    """

    def scalar(key: str) -> object | None:
        v = obj.get(key)
        return v if isinstance(v, str | int) and not isinstance(v, bool) else None

    attrs = dict(inherited)
    for key in ("doc_id", "document_id", "section_id", "chunk_id", "url", "source"):
        if (v := scalar(key)) is not None:
            attrs["doc_id" if key == "document_id" else key] = v
    first, last, page = scalar("page_start"), scalar("page_end"), scalar("page")
    if first is not None and last is not None:
        pages = format_pages(first, last)
    elif page is not None:
        pages = format_pages(page)
    else:
        return attrs
    if pages is None:
        attrs.pop("pages", None)
    else:
        attrs["pages"] = pages
    return attrs


@dataclass
class ShapedResult:
    """A result made safe to hand to the model, with what it carries."""

    result: ToolResult
    truncated: bool = False
    texts: list[tuple[str | None, str]] = field(default_factory=list)
    """(doc_id the text came from, if known; the text as returned, without markers)."""


class _Shaper:
    """Walks a result: copies it, neutralises every string, trims, wraps and labels texts."""

    def __init__(self, budget: int, content: str) -> None:
        self.left = budget
        self.kind, self.content_type = _CONTENT_KINDS.get(content, _CONTENT_KINDS["document"])
        self.shaped = ShapedResult({})

    def value(self, v: Any, attrs: dict[str, object]) -> Any:
        if isinstance(v, dict):
            return self.obj(v, attrs)
        if isinstance(v, list | tuple):
            return [self.value(x, attrs) for x in v]
        if isinstance(v, str):
            return neutralise_markers(v)
        return v

    def obj(self, d: Mapping[str, Any], inherited: dict[str, object]) -> dict[str, Any]:
        attrs = _marker_attrs(d, inherited)
        out: dict[str, Any] = {}
        holds_text = cut = False
        for key, v in d.items():
            if key in TEXT_FIELDS and isinstance(v, str):
                text, trimmed = trim_text(neutralise_markers(v), self.left)
                self.left -= len(text.encode("utf-8"))
                doc = attrs.get("doc_id")
                self.shaped.texts.append((doc if isinstance(doc, str) else None, text))
                out[key] = wrap_untrusted(text, self.kind, attrs)
                holds_text = True
                cut = cut or trimmed
            elif self.kind == "EXTERNAL" and key in EXTERNAL_LABEL_FIELDS and isinstance(v, str):
                # What the outside service wrote, beside its text: delimited as well, so it
                # reaches the model only as data (EXTERNAL_LABEL_FIELDS); not budgeted.
                label = neutralise_markers(v)
                out[key] = wrap_untrusted(label, self.kind, attrs) if label else label
            else:
                out[key] = self.value(v, attrs)
        if holds_text:
            out["content_type"] = self.content_type
            out["truncated"] = cut or d.get("truncated") is True
            self.shaped.truncated = self.shaped.truncated or cut
        return out


def shape_result(result: Mapping[str, Any], max_text_bytes: int, content: str) -> ShapedResult:
    """A copy of `result` with its texts trimmed to `max_text_bytes` in all, delimited, labelled.

    The budget counts the text itself (after neutralising), not the markers around it. Texts
    take the budget in the order they appear; once it is spent, later texts are empty and
    marked truncated. The result always carries a top-level `truncated`. An external
    result's labels (EXTERNAL_LABEL_FIELDS: a headline, a web page's title) are delimited as
    EXTERNAL too, whole and outside the budget; a document's titles stay plain fields.
    """
    shaper = _Shaper(max_text_bytes, content)
    out = shaper.obj(result, {})
    out["truncated"] = shaper.shaped.truncated or out.get("truncated") is True
    shaper.shaped.result = out
    return shaper.shaped


# --- document tools ---------------------------------------------------------------------------


def snippet(text: str, terms: list[str], size: int = SNIPPET_CHARS) -> str:
    """About `size` characters of `text` around the first query term in it, with ellipses."""
    found = first_match(text, terms)
    start = max(0, found - size // 3) if found >= 0 else 0
    if start > 0:
        space = text.rfind(" ", 0, start)
        if space >= 0 and start - space < 40:
            start = space + 1
    end = min(len(text), start + size)
    if end < len(text):
        space = text.rfind(" ", start, end)
        if space >= 0 and end - space < 40:
            end = space
    return ("…" if start > 0 else "") + text[start:end].strip() + ("…" if end < len(text) else "")


class DocumentTools:
    """The document tools over a document store, every read inside the caller's tenant.

    read_chunk_window, read_doc_section, read_doc_pages, read_doc_metadata,
    doc_local_search, load_documents_full; `tools` maps their names to `Tool`s.

    A call makes its reads in one snapshot of the store (`DocumentStore.snapshot`): a
    document ingested again or deleted while it is read is read as it was, whole, never
    one version's sections or page count with another's text.
    """

    def __init__(self, store: DocumentStore, limits: ToolLimits) -> None:
        self._store = store
        self._limits = limits
        self.tools = {t.name: t for t in (*self._read_tools(limits), *self._search_tools(limits))}

    def _read_tools(self, limits: ToolLimits) -> tuple[Tool, ...]:
        """read_chunk_window, read_doc_section, read_doc_pages, read_doc_metadata."""
        r = limits.max_window_radius
        per_side = {
            "type": "integer",
            "minimum": 0,
            "maximum": r,
            "x-maximum-code": WINDOW_TOO_LARGE,
        }
        page = {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_NUMBER}
        return (
            Tool(
                READ_CHUNK_WINDOW,
                "Read the chunks around an anchor chunk of a document: `radius` chunks on "
                f"each side (at most {r}, so at most {2 * r + 1} chunks; fewer at the "
                "document's edges), or window_before/window_after. Default radius "
                f"{min(1, r)}.",
                read_chunk_window_arguments(per_side),
                self.read_chunk_window,
            ),
            Tool(
                READ_DOC_SECTION,
                READ_DOC_SECTION_DESCRIPTION,
                READ_DOC_SECTION_ARGUMENTS,
                self.read_doc_section,
            ),
            Tool(
                READ_DOC_PAGES,
                "Read pages page_start..page_end (1-based, inclusive) of a document, at most "
                f"{limits.max_pages_per_call} pages per call; page_end defaults to "
                "page_start and is clamped to the last page. A longer range returns its "
                f"first {limits.max_pages_per_call} pages with truncated: true and "
                "next_page_start, the page_start of the call that reads on (null when the "
                "range was read to its end); so does a range whose pages' text is past "
                "the result's size limit, at the first page that would not fit whole.",
                tool_arguments(
                    {"doc_id": _ID, "page_start": page, "page_end": page},
                    ["doc_id", "page_start"],
                    {"x-max-pages-per-call": limits.max_pages_per_call},
                ),
                self.read_doc_pages,
            ),
            Tool(
                READ_DOC_METADATA,
                "Read a document's title, page count, tags and sections with their page "
                f"ranges (at most {MAX_METADATA_SECTIONS} sections, titles within the text "
                "limit; sections_total and truncated say when some were left out).",
                tool_arguments({"doc_id": _ID}, ["doc_id"]),
                self.read_doc_metadata,
                returns_text=_never_text,  # titles are short fields, not text
            ),
        )

    def _search_tools(self, limits: ToolLimits) -> tuple[Tool, ...]:
        """doc_local_search, load_documents_full."""
        ids = {
            "type": "array",
            "items": _ID,
            "minItems": 1,
            "maxItems": limits.max_full_documents,
        }
        return (
            Tool(
                DOC_LOCAL_SEARCH,
                "Keyword search (BM25) inside one document: the best chunks with their "
                f"section, pages and a snippet; at most {MAX_LOCAL_SEARCH_RESULTS} results.",
                tool_arguments(
                    {
                        "doc_id": _ID,
                        "query": {"type": "string", "minLength": 1, "maxLength": 500},
                        "max_results": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": MAX_LOCAL_SEARCH_RESULTS,
                        },
                    },
                    ["doc_id", "query"],
                ),
                self.doc_local_search,
            ),
            Tool(
                LOAD_DOCUMENTS_FULL,
                "Load the whole text of the given documents (at most "
                f"{limits.max_full_documents}) for answering from full context, with each "
                "document's size in characters and `total_chars` (full context suits up to "
                f"{limits.max_full_text_bytes // UTF8_MAX_BYTES:,} characters in all). "
                "Give document_ids (alias doc_ids); "
                "include_content=false returns the sizes only.",
                tool_arguments(
                    {
                        "document_ids": ids,
                        "doc_ids": ids,
                        "include_content": {"type": "boolean"},
                    },
                    [],
                    {"x-max-text-bytes": limits.max_full_text_bytes},
                ),
                self.load_documents_full,
                max_text_bytes=limits.max_full_text_bytes,
                returns_text=_content_asked,
            ),
        )

    def _doc(self, caller: Caller, doc_id: str) -> Document:
        doc = self._store.get_document(caller.tenant_id, doc_id, with_chunks=False)
        if doc is None:
            # The same answer whether the document is another tenant's or does not exist:
            # the caller learns nothing about other tenants.
            raise ToolFailure(NOT_FOUND, f"document {doc_id!r} not found")
        return doc

    def _all_chunks(self, caller: Caller, doc_id: str) -> list[Chunk]:
        return self._store.chunk_range(caller.tenant_id, doc_id, 0, TO_THE_END)

    def read_chunk_window(self, caller: Caller, args: dict[str, Any]) -> ToolResult:
        """2R+1 chunks around the anchor (R per side, fewer at the document's edges)."""
        if "radius" in args and ("window_before" in args or "window_after" in args):
            raise ToolFailure(
                INVALID_ARGUMENT, "give radius or window_before/window_after, not both"
            )
        default = min(1, self._limits.max_window_radius)
        before = args.get("window_before", args.get("radius", default))
        after = args.get("window_after", args.get("radius", default))
        with self._store.snapshot():
            doc = self._doc(caller, args["doc_id"])
            anchor = self._store.chunk_by_id(caller.tenant_id, doc.doc_id, args["anchor_chunk_id"])
            if anchor is None:
                raise ToolFailure(
                    NOT_FOUND, f"chunk {args['anchor_chunk_id']!r} not found in {doc.doc_id!r}"
                )
            chunks = self._store.chunk_range(
                caller.tenant_id, doc.doc_id, anchor.ord - before, anchor.ord + after
            )
        return {
            "doc_id": doc.doc_id,
            "title": doc.title,
            "anchor_chunk_id": anchor.chunk_id,
            "radius": {"before": before, "after": after},
            "max_radius": self._limits.max_window_radius,
            "chunk_ids": [c.chunk_id for c in chunks],
            "page_start": min(c.page_start for c in chunks),
            "page_end": max(c.page_end for c in chunks),
            "text": join_chunks(c.text for c in chunks),
        }

    def read_doc_section(self, caller: Caller, args: dict[str, Any]) -> ToolResult:
        """The text of one section, with its page range."""
        with self._store.snapshot():
            doc = self._doc(caller, args["doc_id"])
            section = next((s for s in doc.sections if s.section_id == args["section_id"]), None)
            if section is None:
                raise ToolFailure(
                    NOT_FOUND, f"section {args['section_id']!r} not found in {doc.doc_id!r}"
                )
            chunks = self._store.chunk_range(
                caller.tenant_id, doc.doc_id, section.first_chunk_ord, section.last_chunk_ord
            )
        return {
            "doc_id": doc.doc_id,
            "section_id": section.section_id,
            "title": section.title,
            "page_start": section.page_start,
            "page_end": section.page_end,
            "text": join_chunks(c.text for c in chunks),
        }

    def read_doc_pages(self, caller: Caller, args: dict[str, Any]) -> ToolResult:
        """Pages page_start..page_end, one text per page, at most max_pages_per_call of them.

        A range starting past the last page is NOT_FOUND; one running past it is clamped to
        the last page. A longer range than max_pages_per_call (a search hit's mcp_link names
        its chunk's pages, and a chunk may span more: slides, short pages) returns its first
        max_pages_per_call pages with `truncated` and `next_page_start`, where the next call
        starts; `next_page_start` is None when the range was read to its end. The pages end
        before the first that would not fit max_text_bytes whole (`_whole_pages`).
        """
        first = args["page_start"]
        asked_last = args.get("page_end", first)
        if asked_last < first:
            raise ToolFailure(
                INVALID_ARGUMENT, f"page_end {asked_last} is before page_start {first}"
            )
        with self._store.snapshot():
            doc = self._doc(caller, args["doc_id"])
            if first > doc.pages:
                raise ToolFailure(
                    NOT_FOUND, f"page {first} not in {doc.doc_id!r}, which has {doc.pages} page(s)"
                )
            wanted = min(asked_last, doc.pages)
            last = min(wanted, first + self._limits.max_pages_per_call - 1)
            pages = self._page_texts(caller, doc.doc_id, first, last)
        pages = self._whole_pages(pages)
        last = int(pages[-1]["page"]) if pages else last
        cut = last < wanted
        return {
            "doc_id": doc.doc_id,
            "title": doc.title,
            "page_start": first,
            "page_end": last,
            "pages_in_document": doc.pages,
            "pages": pages,
            "truncated": cut,
            "next_page_start": last + 1 if cut else None,
        }

    def _page_texts(
        self, caller: Caller, doc_id: str, first: int, last: int
    ) -> list[dict[str, Any]]:
        """{page, text} of pages first..last; rebuilt from the chunks on them when the store
        holds no page texts (older store files)."""
        pages = self._store.pages_text(caller.tenant_id, doc_id, first, last)
        if pages:
            return [{"page": p.number, "text": p.text} for p in pages]
        chunks = self._all_chunks(caller, doc_id)
        return [
            {
                "page": n,
                "text": join_chunks(c.text for c in chunks if c.page_start <= n <= c.page_end),
            }
            for n in range(first, last + 1)
        ]

    def _whole_pages(self, pages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The leading `pages` whose texts fit max_text_bytes together, so that a call that
        reads on from `next_page_start` skips nothing; the first page always (a page longer
        than the budget is cut, its rest never readable whole)."""
        left = self._limits.max_text_bytes
        kept: list[dict[str, Any]] = []
        for page in pages:
            size = len(neutralise_markers(page["text"]).encode("utf-8"))
            if kept and size > left:
                break
            kept.append(page)
            left -= size
        return kept

    def read_doc_metadata(self, caller: Caller, args: dict[str, Any]) -> ToolResult:
        """Title, pages, tags, product, version and sections with their page ranges: the
        first MAX_METADATA_SECTIONS sections whose titles fit in max_text_bytes (a document
        of thousands of headings made a result of megabytes, past the gRPC message limit)."""
        doc = self._doc(caller, args["doc_id"])
        budget = self._limits.max_text_bytes
        sections = []
        for s in doc.sections[:MAX_METADATA_SECTIONS]:
            budget -= len(s.title.encode("utf-8"))
            if budget < 0:
                break
            sections.append(
                {
                    "section_id": s.section_id,
                    "title": s.title,
                    "page_start": s.page_start,
                    "page_end": s.page_end,
                }
            )
        return {
            "doc_id": doc.doc_id,
            "title": doc.title,
            "pages": doc.pages,
            "tags": list(doc.tags),
            "product": doc.product,
            "version": doc.version,
            "sections": sections,
            "sections_total": len(doc.sections),
            "truncated": len(sections) < len(doc.sections),
        }

    def doc_local_search(self, caller: Caller, args: dict[str, Any]) -> ToolResult:
        """BM25 over one document's chunks: best chunks with section, pages and snippet."""
        terms = search_terms(args["query"])
        if not terms:
            raise ToolFailure(
                INVALID_ARGUMENT, "query has no words to search for (stop words do not count)"
            )
        with self._store.snapshot():
            doc = self._doc(caller, args["doc_id"])
            chunks = self._all_chunks(caller, doc.doc_id)
        scores = bm25_scores(terms, [search_terms(c.text) for c in chunks])
        ranked = sorted((i for i, s in enumerate(scores) if s > 0), key=lambda i: (-scores[i], i))
        titles = {s.section_id: s.title for s in doc.sections}
        hits = [
            {
                "chunk_id": chunks[i].chunk_id,
                "section_id": chunks[i].section_id,
                "section_title": titles.get(chunks[i].section_id, ""),
                "page_start": chunks[i].page_start,
                "page_end": chunks[i].page_end,
                "score": round(scores[i], 4),
                "snippet": snippet(chunks[i].text, terms),
            }
            for i in ranked[: args.get("max_results", 3)]
        ]
        return {
            "doc_id": doc.doc_id,
            "title": doc.title,
            "query": args["query"],
            "matching_chunks": len(ranked),
            "hits": hits,
        }

    def load_documents_full(self, caller: Caller, args: dict[str, Any]) -> ToolResult:
        """Whole documents (page texts joined), each with `chars`, and `total_chars`.

        `chars` is the full length of a document's text (chunking.whole_text, the size
        ListDocuments states), before any trimming to the tool's max_text_bytes, so the
        caller can apply the 50,000-character rule; a document whose
        text was cut is marked `truncated`. Any document not found fails the whole call.
        """
        if ("document_ids" in args) == ("doc_ids" in args):
            raise ToolFailure(INVALID_ARGUMENT, "give document_ids (or its alias doc_ids)")
        wanted = list(dict.fromkeys(args.get("document_ids") or args["doc_ids"]))
        with self._store.snapshot():
            docs = [
                self._store.get_document(caller.tenant_id, d, with_chunks=False) for d in wanted
            ]
            missing = [doc_id for doc_id, doc in zip(wanted, docs, strict=True) if doc is None]
            if missing:
                listed = ", ".join(map(repr, missing))
                raise ToolFailure(NOT_FOUND, f"document(s) not found: {listed}")
            texts = [(doc, self._whole_text(caller, doc.doc_id)) for doc in docs if doc is not None]
        include = args.get("include_content", True)
        out = []
        for doc, text in texts:
            entry: dict[str, Any] = {
                "document_id": doc.doc_id,
                "title": doc.title,
                "pages": doc.pages,
                "chars": len(text),
            }
            if include:
                entry["content"] = text
            out.append(entry)
        return {"documents": out, "total_chars": sum(d["chars"] for d in out)}

    def _whole_text(self, caller: Caller, doc_id: str) -> str:
        """A document's whole text (chunking.whole_text): its pages, or its chunks when the
        store holds no page texts."""
        pages = self._store.pages_text(caller.tenant_id, doc_id, 1, TO_THE_END)
        chunks = () if pages else self._all_chunks(caller, doc_id)
        return whole_text((p.text for p in pages), (c.text for c in chunks))


# --- the executor -----------------------------------------------------------------------------


class ToolMetrics(Protocol):
    """Receives one observation per tool call."""

    def observe(
        self, tool: str, tenant_id: str, outcome_code: str, latency_s: float, tokens: int
    ) -> None:
        """`outcome_code` is OK, an error code, CANCELLED or INTERNAL; `tokens` those of the
        result text."""


class NoMetrics:
    """Discards observations."""

    def observe(
        self, tool: str, tenant_id: str, outcome_code: str, latency_s: float, tokens: int
    ) -> None:
        return None


class PrometheusToolMetrics:
    """visior_tool_calls_total{tool,outcome}, visior_tool_call_seconds{tool},
    visior_tool_result_tokens_total{tool}.

    The tenant is not a label (unbounded cardinality); it is in the per-call log line.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter(
            "visior_tool_calls_total", "Tool calls, by outcome code.", ["tool", "outcome"],
            registry=registry,
        )  # fmt: skip
        self.seconds = Histogram(
            "visior_tool_call_seconds", "Time to run a tool call, in seconds.", ["tool"],
            buckets=LATENCY_BUCKETS_SECONDS, registry=registry,
        )  # fmt: skip
        self.tokens = Counter(
            "visior_tool_result_tokens_total", "Tokens of text returned by tools.", ["tool"],
            registry=registry,
        )  # fmt: skip

    def observe(
        self, tool: str, tenant_id: str, outcome_code: str, latency_s: float, tokens: int
    ) -> None:
        self.calls.labels(tool, outcome_code).inc()
        self.seconds.labels(tool).observe(latency_s)
        if tokens:
            self.tokens.labels(tool).inc(tokens)


@dataclass(frozen=True)
class Outcome:
    """{status, result | error}; `retry_after_s` is set with RATE_LIMIT_EXCEEDED."""

    status: str
    result: dict[str, Any] | None = None
    error_code: str = ""
    error_message: str = ""
    retry_after_s: int = 0


_LOG_LEVELS = {INTERNAL: logging.ERROR, CANCELLED: logging.WARNING}
"""The level of a call's log line by outcome code; INFO for any other."""


def _error(code: str, message: str, retry_after_s: int = 0) -> Outcome:
    return Outcome("error", error_code=code, error_message=message, retry_after_s=retry_after_s)


def _named_documents(args: Mapping[str, Any]) -> list[str]:
    """The doc ids a call names (doc_id, document_ids, doc_ids): the rate-limit keys of a tool
    whose `doc_rate_keys` is set."""
    ids: list[str] = []
    if isinstance(args.get("doc_id"), str):
        ids.append(args["doc_id"])
    for key in ("document_ids", "doc_ids"):
        if isinstance(args.get(key), list):
            ids.extend(v for v in args[key] if isinstance(v, str))
    return list(dict.fromkeys(ids))


def _reserve(tool: Tool, args: Mapping[str, Any], budget: int) -> int:
    """The tokens a call reserves while it runs: what `budget` bytes of prose hold, or none
    for a call that returns no text. Its result's real count replaces it once charged."""
    return budget // RESERVED_BYTES_PER_TOKEN if tool.returns_text(args) else 0


def check_tool(tool: Tool) -> None:
    """Raise ValueError unless the tool's schema is closed and takes no identity arguments."""
    schema = tool.schema
    if schema.get("type") != "object" or schema.get("additionalProperties") is not False:
        raise ValueError(
            f"tool {tool.name}: schema must be an object with additionalProperties false"
        )
    named = set(IDENTITY_ARGUMENTS) & set(schema.get("properties", {}))
    if named:
        raise ValueError(f"tool {tool.name}: identity comes from the caller, not {sorted(named)}")
    if tool.content not in _CONTENT_KINDS:
        raise ValueError(f"tool {tool.name}: content must be one of {sorted(_CONTENT_KINDS)}")


class ToolExecutor:
    """Looks a tool up, checks caller and arguments, applies limits, runs it, shapes the result.

    `limits.max_text_bytes` caps the text of every result (a tool's own `max_text_bytes`
    overrides it); `rate_limiter` defaults to RateLimiter() with the default limits;
    `count_tokens` counts result tokens for the token rate limit and metrics.
    Raises ValueError at construction for a tool that breaks the rules (see `check_tool`).
    """

    def __init__(
        self,
        tools: dict[str, Tool],
        *,
        limits: ToolLimits | None = None,
        rate_limiter: RateLimiter | None = None,
        metrics: ToolMetrics | None = None,
        count_tokens: Callable[[str], int] = default_count_tokens,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        for tool in tools.values():
            check_tool(tool)
        self._tools = dict(tools)
        self._limits = limits or ToolLimits()
        self._limiter = rate_limiter or RateLimiter()
        self._metrics: ToolMetrics = metrics or NoMetrics()
        self._count_tokens = count_tokens
        self._timer = timer

    def catalogue(self) -> list[Tool]:
        """Every tool, by name."""
        return sorted(self._tools.values(), key=lambda t: t.name)

    async def execute(self, name: str, arguments: dict[str, Any], caller: Caller) -> Outcome:
        """Run tool `name` for `caller`; every failure the caller can cause is an Outcome."""
        started = self._timer()
        label = name if name in self._tools else "unknown"
        code, tokens, truncated = INTERNAL, 0, False
        try:
            outcome, tokens = await self._execute(name, arguments, caller)
            code = OK if outcome.status == "ok" else outcome.error_code
            truncated = bool(outcome.result and outcome.result.get("truncated"))
            return outcome
        except asyncio.CancelledError:
            # The caller went away or its deadline passed: not a fault of the tool.
            code = CANCELLED
            raise
        finally:
            latency = max(0.0, self._timer() - started)
            self._metrics.observe(label, caller.tenant_id, code, latency, tokens)
            log.log(
                _LOG_LEVELS.get(code, logging.INFO),
                "tool_call",
                extra={
                    "tool": label,
                    "tenant_id": caller.tenant_id,
                    "user_id": caller.user_id,
                    "trace_id": caller.trace_id or None,
                    "latency_ms": round(latency * 1000, 3),
                    "outcome": code,
                    "tokens": tokens,
                    "truncated": truncated,
                },
            )

    async def _execute(
        self, name: str, arguments: dict[str, Any], caller: Caller
    ) -> tuple[Outcome, int]:
        tool = self._tools.get(name)
        if tool is None:
            return _error(NOT_FOUND, f"unknown tool {name!r}"), 0
        if not caller.tenant_id.strip():
            return _error(ACCESS_DENIED, "the request carries no tenant"), 0
        if isinstance(arguments, dict):
            named = [k for k in IDENTITY_ARGUMENTS if k in arguments]
            if named:
                return _error(
                    INVALID_ARGUMENT,
                    f"{', '.join(named)} cannot be a tool argument: it comes from the request",
                ), 0
        try:
            args = check_arguments(tool.schema, arguments)
        except ArgumentError as exc:
            return _error(exc.code, str(exc)), 0
        budget = tool.max_text_bytes or self._limits.max_text_bytes
        try:
            reservation = self._limiter.acquire(
                caller.tenant_id,
                _named_documents(args) if tool.doc_rate_keys else (),
                reserve=_reserve(tool, args, budget),
            )
        except RateLimitExceeded as exc:
            return _error(RATE_LIMIT_EXCEEDED, str(exc), exc.retry_after_s), 0
        try:
            return await self._run(tool, args, caller, reservation, budget)
        finally:
            reservation.release()

    async def _run(
        self,
        tool: Tool,
        args: dict[str, Any],
        caller: Caller,
        reservation: Reservation,
        budget: int,
    ) -> tuple[Outcome, int]:
        try:
            if inspect.iscoroutinefunction(tool.run):
                raw = await tool.run(caller, args)
            else:
                # A synchronous tool reads the document store, which may answer over the
                # network (PostgreSQL): in a worker thread, never on the event loop.
                raw = await asyncio.to_thread(tool.run, caller, args)
                if inspect.isawaitable(raw):
                    raw = await raw
        except ToolFailure as exc:
            if exc.code == NOT_FOUND and tool.doc_rate_keys and _named_documents(args):
                self._limiter.record_unknown(caller.tenant_id)
            return _error(exc.code, exc.message), 0
        except StoreUnavailableError:  # the store's error names its host: not for the model
            log.warning("document store unavailable", exc_info=True)
            return _error(UPSTREAM_UNAVAILABLE, "the document store is unavailable right now"), 0
        shaped = shape_result(raw, budget, tool.content)
        return Outcome("ok", result=shaped.result), self._charge(reservation, shaped)

    def _charge(self, reservation: Reservation, shaped: ShapedResult) -> int:
        """Count the result's tokens and charge them to the documents they came from."""
        total = 0
        for doc_id, text in shaped.texts:
            tokens = self._count_tokens(text) if text else 0
            reservation.charge(tokens, doc_id)
            total += tokens
        return total
