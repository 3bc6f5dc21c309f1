"""The document tools: read text from the document store inside the caller's tenant, within limits."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from services.docstore.model import Document
from services.docstore.sqlite_store import SqliteDocumentStore
from services.toolsproxy.schema import SchemaError, check

ACCESS_DENIED = "ACCESS_DENIED"
WINDOW_TOO_LARGE = "WINDOW_TOO_LARGE"
NOT_FOUND = "NOT_FOUND"
INVALID_ARGUMENT = "INVALID_ARGUMENT"

_ID = {"type": "string", "minLength": 1, "maxLength": 200}


@dataclass(frozen=True)
class Caller:
    """Who the tool runs for: from the request's user context, never from arguments."""

    tenant_id: str
    user_id: str
    trace_id: str = ""


@dataclass(frozen=True)
class ToolLimits:
    """Limits every tool obeys (MCP_PROXY_*)."""

    max_window_radius: int = 3
    """Per-side radius R of read_chunk_window (2R+1 chunks in all)."""
    max_text_bytes: int = 16_384
    """Largest text in one result; longer text is cut at a character boundary."""


class ToolFailure(Exception):
    """A tool failed in a way the model can react to: {status: error, error: {code, message}}."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


ToolResult = dict[str, Any]


@dataclass(frozen=True)
class Tool:
    """A tool: its JSON schema (limits stated in it) and how it runs.

    `run(caller, args)` gets arguments already checked against `schema` and returns the
    result dict, or an awaitable of it (network tools are async); it raises ToolFailure
    for an error the model can react to.
    """

    name: str
    description: str
    schema: dict[str, Any]
    run: Callable[[Caller, dict[str, Any]], ToolResult | Awaitable[ToolResult]]


def trim_text(text: str, max_bytes: int) -> tuple[str, bool]:
    """Cut `text` to at most `max_bytes` UTF-8 bytes without splitting a character."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text, False
    return data[:max_bytes].decode("utf-8", errors="ignore"), True


class DocumentTools:
    """read_chunk_window, read_doc_section, read_doc_metadata over a document store."""

    def __init__(self, store: SqliteDocumentStore, limits: ToolLimits) -> None:
        self._store = store
        self._limits = limits
        r = limits.max_window_radius
        self.tools = {
            t.name: t
            for t in (
                Tool(
                    "read_chunk_window",
                    "Read the chunks around an anchor chunk of a document: `radius` chunks on "
                    f"each side (at most {r}), or window_before/window_after.",
                    {
                        "type": "object",
                        "properties": {
                            "doc_id": _ID,
                            "anchor_chunk_id": _ID,
                            "radius": {"type": "integer", "minimum": 0},
                            "window_before": {"type": "integer", "minimum": 0},
                            "window_after": {"type": "integer", "minimum": 0},
                        },
                        "required": ["doc_id", "anchor_chunk_id"],
                        "additionalProperties": False,
                        "x-max-radius": r,
                    },
                    self.read_chunk_window,
                ),
                Tool(
                    "read_doc_section",
                    "Read the full text of one section of a document.",
                    {
                        "type": "object",
                        "properties": {"doc_id": _ID, "section_id": _ID},
                        "required": ["doc_id", "section_id"],
                        "additionalProperties": False,
                    },
                    self.read_doc_section,
                ),
                Tool(
                    "read_doc_metadata",
                    "Read a document's title, page count and sections with their page ranges.",
                    {
                        "type": "object",
                        "properties": {"doc_id": _ID},
                        "required": ["doc_id"],
                        "additionalProperties": False,
                    },
                    self.read_doc_metadata,
                ),
            )
        }

    def _doc(self, caller: Caller, doc_id: str) -> Document:
        doc = self._store.get_document(caller.tenant_id, doc_id, with_chunks=False)
        if doc is None:
            # The same answer whether the document is another tenant's or does not exist:
            # the caller learns nothing about other tenants.
            raise ToolFailure(NOT_FOUND, f"document {doc_id!r} not found")
        return doc

    def _text(self, parts: list[str]) -> dict[str, Any]:
        text, truncated = trim_text("\n\n".join(parts), self._limits.max_text_bytes)
        return {"text": text, "truncated": truncated}

    def read_chunk_window(self, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        r_max = self._limits.max_window_radius
        if "radius" in args and ("window_before" in args or "window_after" in args):
            raise ToolFailure(
                INVALID_ARGUMENT, "give radius or window_before/window_after, not both"
            )
        before = args.get("window_before", args.get("radius", 1))
        after = args.get("window_after", args.get("radius", 1))
        if max(before, after) > r_max:
            raise ToolFailure(
                WINDOW_TOO_LARGE,
                f"asked radius {max(before, after)} per side; allowed at most {r_max}",
            )
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
            "chunk_ids": [c.chunk_id for c in chunks],
            "page_start": min(c.page_start for c in chunks),
            "page_end": max(c.page_end for c in chunks),
            **self._text([c.text for c in chunks]),
        }

    def read_doc_section(self, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
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
            **self._text([c.text for c in chunks]),
        }

    def read_doc_metadata(self, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        doc = self._doc(caller, args["doc_id"])
        return {
            "doc_id": doc.doc_id,
            "title": doc.title,
            "pages": doc.pages,
            "tags": list(doc.tags),
            "product": doc.product,
            "version": doc.version,
            "sections": [
                {
                    "section_id": s.section_id,
                    "title": s.title,
                    "page_start": s.page_start,
                    "page_end": s.page_end,
                }
                for s in doc.sections
            ],
        }


@dataclass(frozen=True)
class Outcome:
    """{status, result | error}."""

    status: str
    result: dict[str, Any] | None = None
    error_code: str = ""
    error_message: str = ""


class ToolExecutor:
    """Looks a tool up, checks the caller and arguments, runs it; failures become results."""

    def __init__(self, tools: dict[str, Tool]) -> None:
        self._tools = tools

    def catalogue(self) -> list[Tool]:
        return sorted(self._tools.values(), key=lambda t: t.name)

    async def execute(self, name: str, arguments: dict[str, Any], caller: Caller) -> Outcome:
        tool = self._tools.get(name)
        if tool is None:
            return Outcome("error", error_code=NOT_FOUND, error_message=f"unknown tool {name!r}")
        try:
            args = check(tool.schema, arguments)
            result = tool.run(caller, args)
            if inspect.isawaitable(result):
                result = await result
            return Outcome("ok", result=result)
        except SchemaError as exc:
            return Outcome("error", error_code=INVALID_ARGUMENT, error_message=str(exc))
        except ToolFailure as exc:
            return Outcome("error", error_code=exc.code, error_message=exc.message)
