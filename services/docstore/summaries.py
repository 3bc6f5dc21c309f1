"""Section summaries: extractive by default, replaceable by any `Summarizer` (an LLM, say)."""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from typing import Protocol

from services.common import lexical
from services.docstore.chunking import ChunkingConfig, join_chunks
from services.docstore.model import Document

_WORD = re.compile(r"[0-9a-zа-яё]{3,}", re.IGNORECASE)


class Summarizer(Protocol):
    """Writes the summary of one section; `name` identifies it in the document's generation."""

    name: str

    def summarize(self, title: str, text: str, max_chars: int) -> str:
        """A summary of `text` (the section titled `title`) of at most `max_chars` characters."""
        ...


class ExtractiveSummarizer:
    """The section's first sentence plus its most central ones, in reading order, within budget.

    Centrality is the cosine between a sentence's word counts and the whole section's, so the
    picked sentences are the ones that share most vocabulary with the rest of the section.
    """

    name = "extractive-v1"

    def __init__(self, max_sentences: int = ChunkingConfig.summary_sentences) -> None:
        self.max_sentences = max_sentences

    def summarize(self, title: str, text: str, max_chars: int) -> str:
        """Leading + most central sentences of `text`, at most `max_chars` characters."""
        if max_chars <= 0:
            return ""
        sentences = lexical.sentences(text)
        if not sentences:
            return ""
        whole = Counter(w.lower() for w in _WORD.findall(text))
        # The section's norm once, not once a sentence (that made a long section quadratic).
        norm = math.sqrt(sum(n * n for n in whole.values()))
        ranked = sorted(
            range(1, len(sentences)), key=lambda i: (-_cosine(sentences[i], whole, norm), i)
        )
        picked = [0]
        used = len(sentences[0])
        for i in ranked:
            if len(picked) >= self.max_sentences:
                break
            if used + 1 + len(sentences[i]) <= max_chars:
                picked.append(i)
                used += 1 + len(sentences[i])
        out = " ".join(sentences[i] for i in sorted(picked))
        return clip_text(out, max_chars)


def _cosine(sentence: str, whole: Counter[str], whole_norm: float) -> float:
    """The cosine of the sentence's word counts and `whole`'s (whose norm is `whole_norm`)."""
    words = Counter(w.lower() for w in _WORD.findall(sentence))
    if not words:
        return 0.0
    dot = sum(n * whole[w] for w, n in words.items())
    norm = math.sqrt(sum(n * n for n in words.values())) * whole_norm
    return dot / norm if norm else 0.0


def clip_text(text: str, limit: int) -> str:
    """`text` within `limit` characters: whole, or cut at a word boundary (when one falls in
    the second half) and ended with "…", trailing punctuation and dashes dropped; "" when
    not even one character and the ellipsis fit."""
    if len(text) <= limit:
        return text
    if limit <= 1:
        return ""
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:—-") + "…"


def extractive_summary(text: str, limit: int) -> str:
    """The default extractive summary of `text` within `limit` characters."""
    return ExtractiveSummarizer().summarize("", text, limit)


def mix_generation(generation: str, summarizer_name: str) -> str:
    """A generation derived from `generation` for summaries written by `summarizer_name`."""
    digest = hashlib.sha256(f"{generation}\0summarizer={summarizer_name}".encode()).hexdigest()
    return digest[: len(generation) or 16]


def section_texts(doc: Document) -> dict[str, str]:
    """Each section's text by section_id: its chunks in order, joined by `join_chunks`."""
    out: dict[str, list[str]] = {}
    for chunk in doc.chunks:
        out.setdefault(chunk.section_id, []).append(chunk.text)
    return {k: join_chunks(v) for k, v in out.items()}
