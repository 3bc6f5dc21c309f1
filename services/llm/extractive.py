"""The built-in extractive responder (DESIGN §2.9): the tool loop without a model.

It asks for tools the way a model would (read the window around the best anchor, else
the section), then answers by quoting the sentences of what it read that share the most
words with the question, with the source and pages. The answer says it is extractive.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from services.common.untrusted import unwrap_untrusted
from services.llm.model import Anchor, GenerateInput, ToolCallRecord, ToolRunner

_WORD = re.compile(r"\w+", re.UNICODE)
_SENTENCE = re.compile(r"(?<=[.!?…])\s+")
MAX_QUOTED_SENTENCES = 3


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


def _summary(result: dict[str, Any]) -> str:
    pages = f"pp. {result.get('page_start')}–{result.get('page_end')}"
    size = len(unwrap_untrusted(result.get("text", "")))
    return f"read {size} characters of {result.get('doc_id')} ({pages})"


@dataclass(frozen=True)
class Reading:
    doc_id: str
    title: str
    text: str
    page_start: int
    page_end: int


class ExtractiveResponder:
    """Answers from the documents by tool calls and quotation; no model involved."""

    def __init__(self, tools: ToolRunner) -> None:
        self._tools = tools

    async def answer(
        self, req: GenerateInput, max_steps: int, sink: Any = None
    ) -> tuple[str, list[ToolCallRecord]]:
        question = next((m.content for m in reversed(req.messages) if m.role == "user"), "")
        calls: list[ToolCallRecord] = []
        reading: Reading | None = None
        if req.user is not None and max_steps > 0:
            for name, args in self._plan(req):
                if len(calls) >= max_steps:
                    break
                result = await self._tools.execute(name, args, req.user, req.trace_id)
                if result.status == "ok" and result.result:
                    record = ToolCallRecord(name, args, _summary(result.result))
                    calls.append(record)
                    if sink is not None:
                        await sink.tool_call(record)
                    reading = Reading(
                        result.result.get("doc_id", ""),
                        result.result.get("title", ""),
                        unwrap_untrusted(result.result.get("text", "")),
                        int(result.result.get("page_start", 0)),
                        int(result.result.get("page_end", 0)),
                    )
                    break
                record = ToolCallRecord(
                    name, args, f"tool_error {result.error_code}: {result.error_message}"
                )
                calls.append(record)
                if sink is not None:
                    await sink.tool_call(record)
        if reading is None and req.context_chunks:
            c = req.context_chunks[0]
            reading = Reading(c.doc_id, c.doc_id, c.text, c.page_start, c.page_end)
        return self._compose(question, reading), calls

    def _plan(self, req: GenerateInput) -> list[tuple[str, dict[str, Any]]]:
        """The tool calls a model would make, best anchor first, as the policy allows."""
        allowed = set(req.policy.allowed_tools)
        anchors = list(req.policy.anchors) or [
            Anchor(c.doc_id, c.section_id, c.chunk_id) for c in req.context_chunks
        ]
        radius = req.policy.radius_schedule[0] if req.policy.radius_schedule else 1
        plan: list[tuple[str, dict[str, Any]]] = []
        for a in anchors[:2]:
            if a.anchor_chunk_id and "read_chunk_window" in allowed:
                plan.append(
                    (
                        "read_chunk_window",
                        {
                            "doc_id": a.doc_id,
                            "anchor_chunk_id": a.anchor_chunk_id,
                            "radius": radius,
                        },
                    )
                )
            elif "read_doc_section" in allowed:
                plan.append(("read_doc_section", {"doc_id": a.doc_id, "section_id": a.section_id}))
        return plan

    @staticmethod
    def _compose(question: str, reading: Reading | None) -> str:
        if reading is None or not reading.text.strip():
            return (
                "В доступных документах не нашлось ответа на этот вопрос.\n\n"
                "_Ответ составлен без языковой модели (extractive)._"
            )
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
