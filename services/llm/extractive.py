"""The built-in extractive responder (DESIGN §2.9): a ChatRuntime without a model.

`ExtractiveRuntime` answers the tool loop (services/llm/loop.py) the way a model would: on
the first call it asks to read the best section the prompt lists (read_chunk_window on its
anchor, or read_doc_section when no anchor chunk is known); after a tool error it tries the
next section; once it has read text, it answers by quoting the sentences of that text that
share the most words with the question, with the source and pages. Without tools it quotes
the context chunks of the prompt. The answer says it is extractive.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from services.llm.chat import ChatMessage, Completion, StreamDelta, StreamEvent, ToolCall, ToolSpec
from services.llm.model import (
    Anchor,
    GenerationParams,
)
from services.llm.prompt import (
    CALLER_TOOL_KIND,
    CONTEXT_KIND,
    delimited_blocks,
    is_service_note,
    listed_anchors,
)
from services.llm.toolcalls import (
    READ_CHUNK_WINDOW,
    READ_DOC_SECTION,
    ToolContent,
    parse_tool_content,
)

EXTRACTIVE = "extractive"
_WORD = re.compile(r"\w+", re.UNICODE)
_SENTENCE = re.compile(r"(?<=[.!?…])\s+")
_PIECE = re.compile(r"\S+\s*")
MAX_QUOTED_SENTENCES = 3
MAX_SECTIONS_TRIED = 2
"""Sections the responder tries to read before it answers from what it has."""
NOT_FOUND = (
    "В доступных документах не нашлось ответа на этот вопрос.\n\n"
    "_Ответ составлен без языковой модели (extractive)._"
)


def _stems(text: str) -> set[str]:
    return {w[:6] for w in _WORD.findall(text.lower()) if len(w) > 2}


def best_sentences(text: str, question: str, limit: int = MAX_QUOTED_SENTENCES) -> list[str]:
    """The sentences of `text` sharing most words with `question`, in document order."""
    q = _stems(question)
    sentences = [s.strip() for s in _SENTENCE.split(" ".join(text.split())) if s.strip()]
    ranked = sorted(range(len(sentences)), key=lambda i: (-len(_stems(sentences[i]) & q), i))[
        :limit
    ]
    return [sentences[i] for i in sorted(ranked) if _stems(sentences[i]) & q] or sentences[:1]


@dataclass(frozen=True)
class Reading:
    """Text the responder quotes from, and where it comes from."""

    doc_id: str
    title: str
    text: str
    page_start: int
    page_end: int


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _pages(attr: str) -> tuple[int, int]:
    first, _, last = attr.partition("-")
    return _int(first), _int(last or first)


def compose(question: str, reading: Reading | None) -> str:
    """The extractive answer: quotes from `reading` with the source and pages (Russian)."""
    if reading is None or not reading.text.strip():
        return NOT_FOUND
    quotes = "\n".join(f"> {s}" for s in best_sentences(reading.text, question))
    pages = (
        f"стр. {reading.page_start}"
        if reading.page_start == reading.page_end
        else f"стр. {reading.page_start}–{reading.page_end}"
    )
    return (
        f"Вот что говорится в документе «{reading.title or reading.doc_id}» ({pages}):\n\n"
        f"{quotes}\n\n"
        f"**Источник:** {reading.doc_id}, {pages}.\n\n"
        "_Ответ составлен без языковой модели: это цитаты из документов (extractive)._"
    )


def _reading_from_tool(content: ToolContent) -> Reading | None:
    texts = [b for b in content.texts if b.text.strip()]
    if not texts:
        return None
    r = content.result
    first = texts[0].attrs
    doc_id = str(r.get("doc_id") or r.get("document_id") or first.get("doc_id", ""))
    start, end = _int(r.get("page_start")), _int(r.get("page_end"))
    if not start and "pages" in first:
        start, end = _pages(first["pages"])
    return Reading(
        doc_id, str(r.get("title") or ""), "\n\n".join(b.text for b in texts), start, end or start
    )


def _reading_from_context(system: str) -> Reading | None:
    blocks = delimited_blocks(system, CONTEXT_KIND)
    if not blocks:
        return None
    b = blocks[0]
    start, end = _pages(b.attrs.get("pages", ""))
    doc_id = b.attrs.get("doc_id", "")
    return Reading(doc_id, doc_id, b.text, start, end)


def _question(messages: Sequence[ChatMessage]) -> str:
    for m in reversed(messages):
        if m.role != "user" or is_service_note(m):
            continue
        if m.content.startswith(f"<<<{CALLER_TOOL_KIND}"):
            continue
        return m.content
    return ""


def _tried(anchor: Anchor, asked: list[dict[str, Any]]) -> bool:
    return any(
        a.get("doc_id") == anchor.doc_id
        and (
            (anchor.anchor_chunk_id and a.get("anchor_chunk_id") == anchor.anchor_chunk_id)
            or (anchor.section_id and a.get("section_id") == anchor.section_id)
        )
        for a in asked
    )


class ExtractiveRuntime:
    """A ChatRuntime that reads with tools and answers by quotation; no model involved."""

    name = EXTRACTIVE
    extractive = True

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        params: GenerationParams,
        *,
        timeout_s: float,
        model: str = "",
    ) -> Completion:
        """The next move: a tool call, or the answer."""
        return self.respond(messages, tools)

    async def stream(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        params: GenerationParams,
        *,
        timeout_s: float,
        model: str = "",
    ) -> AsyncIterator[StreamEvent]:
        """`complete`, with the answer handed out word by word first."""
        completion = self.respond(messages, tools)
        for piece in _PIECE.findall(completion.content):
            yield StreamDelta(piece)
        yield completion

    def respond(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> Completion:
        """What a model would answer to `messages` with `tools` offered."""
        system = "\n\n".join(m.content for m in messages if m.role == "system")
        asked: list[dict[str, Any]] = []
        reading: Reading | None = None
        for m in messages:
            if m.role == "assistant":
                for call in m.tool_calls:
                    try:
                        args = json.loads(call.arguments or "{}")
                    except json.JSONDecodeError:
                        args = {}
                    asked.append(args if isinstance(args, dict) else {})
            elif m.role == "tool":
                content = parse_tool_content(m.content)
                if content is not None and content.ok:
                    reading = _reading_from_tool(content) or reading
        if reading is None and tools and len(asked) < MAX_SECTIONS_TRIED:
            read = self._next_read(system, {t.name for t in tools}, asked)
            if read is not None:
                return Completion("", (read,), finish_reason="tool_calls", model=EXTRACTIVE)
        answer = compose(_question(messages), reading or _reading_from_context(system))
        return Completion(answer, model=EXTRACTIVE)

    @staticmethod
    def _next_read(system: str, names: set[str], asked: list[dict[str, Any]]) -> ToolCall | None:
        anchors = listed_anchors(system) or [
            Anchor(b.attrs.get("doc_id", ""), b.attrs.get("section_id", ""),
                   b.attrs.get("chunk_id", ""))
            for b in delimited_blocks(system, CONTEXT_KIND)
        ]  # fmt: skip
        for anchor in anchors:
            if not anchor.doc_id or _tried(anchor, asked):
                continue
            call_id = f"extractive-{len(asked) + 1}"
            if anchor.anchor_chunk_id and READ_CHUNK_WINDOW in names:
                args = {"doc_id": anchor.doc_id, "anchor_chunk_id": anchor.anchor_chunk_id}
                return ToolCall(call_id, READ_CHUNK_WINDOW, json.dumps(args, ensure_ascii=False))
            if anchor.section_id and READ_DOC_SECTION in names:
                args = {"doc_id": anchor.doc_id, "section_id": anchor.section_id}
                return ToolCall(call_id, READ_DOC_SECTION, json.dumps(args, ensure_ascii=False))
        return None
