"""Turning Markdown and plain text into sections and chunks with deterministic ids."""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.docstore.model import Chunk, Document, Section

_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_WORD = re.compile(r"\S+")
_SENTENCE = re.compile(r"(?<=[.!?…])\s+")
_SLUG = re.compile(r"[^0-9a-zа-яё]+")
PAGE_BREAK = "\f"


class UnsupportedFormatError(ValueError):
    """The file's format has no parser (yet)."""


@dataclass(frozen=True)
class ChunkingConfig:
    """How text is cut into chunks."""

    chunk_words: int = 120
    """Target chunk size in words (a stand-in for tokens until the tokenizer lands)."""
    summary_chars: int = 400
    """Length of the extractive section summary."""


def slugify(text: str, limit: int = 40, fallback: str = "x") -> str:
    """A lowercase id fragment of letters and digits (Cyrillic kept); `fallback` when none."""
    slug = _SLUG.sub("-", text.lower()).strip("-")
    return slug[:limit].strip("-") or fallback


def count_tokens(text: str) -> int:
    """Rough token count (words x 4/3) until the real tokenizer arrives."""
    return max(1, round(len(_WORD.findall(text)) * 4 / 3))


def extractive_summary(text: str, limit: int) -> str:
    """The first sentences of `text`, up to `limit` characters."""
    out = ""
    for sentence in _SENTENCE.split(" ".join(text.split())):
        if out and len(out) + 1 + len(sentence) > limit:
            break
        out = f"{out} {sentence}".strip()
    return out[:limit]


def guess_format(file_name: str, content_type: str) -> str:
    name = file_name.lower()
    ct = content_type.lower()
    if ct in ("text/markdown", "text/x-markdown") or name.endswith((".md", ".markdown")):
        return "markdown"
    if ct == "text/plain" or name.endswith(".txt"):
        return "text"
    if ct == "application/pdf" or name.endswith(".pdf"):
        return "pdf"
    if ct == "text/csv" or name.endswith(".csv"):
        return "csv"
    return "text" if not ct and not name else "unknown"


def parse_document(
    *,
    tenant_id: str,
    doc_id: str,
    text: str,
    fmt: str,
    title: str = "",
    source: str = "user",
    product: str = "",
    version: str = "",
    tags: tuple[str, ...] = (),
    config: ChunkingConfig | None = None,
) -> Document:
    """Parse Markdown or plain text into a Document. Form feeds mark page breaks."""
    if fmt not in ("markdown", "text"):
        raise UnsupportedFormatError(f"format {fmt!r} is not supported yet (markdown, text)")
    cfg = config or ChunkingConfig()
    blocks = _blocks(text, markdown=fmt == "markdown")
    if not title:
        title = next((h for h, _, _ in blocks if h), "") or doc_id
    sections: list[Section] = []
    chunks: list[Chunk] = []
    pages = max(1, text.count(PAGE_BREAK) + 1)
    for sec_ord, (heading, paragraphs, _) in enumerate(blocks):
        if not paragraphs:
            continue
        section_id = f"{doc_id}:s{sec_ord:03d}-{slugify(heading or 'intro')}"
        first = len(chunks)
        for words, page_start, page_end in _chunk_words(paragraphs, cfg.chunk_words):
            chunk_text = " ".join(words)
            chunks.append(
                Chunk(
                    chunk_id=f"{doc_id}:c{len(chunks):05d}",
                    section_id=section_id,
                    ord=len(chunks),
                    text=chunk_text,
                    tokens=count_tokens(chunk_text),
                    page_start=page_start,
                    page_end=page_end,
                )
            )
        body = " ".join(c.text for c in chunks[first:])
        sections.append(
            Section(
                section_id=section_id,
                ord=len(sections),
                title=heading or title,
                summary=extractive_summary(body, cfg.summary_chars),
                page_start=chunks[first].page_start,
                page_end=chunks[-1].page_end,
                first_chunk_ord=first,
                last_chunk_ord=len(chunks) - 1,
            )
        )
    return Document(
        tenant_id=tenant_id,
        doc_id=doc_id,
        title=title,
        source=source,
        product=product,
        version=version,
        tags=tags,
        pages=pages,
        sections=tuple(sections),
        chunks=tuple(chunks),
    )


def _blocks(text: str, *, markdown: bool) -> list[tuple[str, list[tuple[str, int]], int]]:
    """(heading, [(paragraph, page)], level) in order; text before any heading has heading ''."""
    blocks: list[tuple[str, list[tuple[str, int]], int]] = [("", [], 0)]
    page = 1
    para: list[str] = []

    def flush() -> None:
        if para:
            blocks[-1][1].append((" ".join(para), page))
            para.clear()

    for raw in text.split("\n"):
        for i, part in enumerate(raw.split(PAGE_BREAK)):
            if i:
                flush()
                page += 1
            line = part.strip()
            match = _HEADING.match(line) if markdown else None
            if match:
                flush()
                blocks.append((match.group(2).strip(), [], len(match.group(1))))
            elif not line:
                flush()
            else:
                para.append(line)
    flush()
    return blocks


def _chunk_words(
    paragraphs: list[tuple[str, int]], target: int
) -> list[tuple[list[str], int, int]]:
    """Pack paragraphs into chunks of about `target` words, splitting long paragraphs."""
    out: list[tuple[list[str], int, int]] = []
    words: list[str] = []
    start = end = paragraphs[0][1]
    for text, page in paragraphs:
        para_words = text.split()
        if words and len(words) + len(para_words) > target:
            out.append((words, start, end))
            words = []
        if not words:
            start = page
        while len(para_words) > target:
            if words:
                out.append((words, start, end))
                words = []
            out.append((para_words[:target], page, page))
            para_words = para_words[target:]
            start = page
        words.extend(para_words)
        end = page
    if words:
        out.append((words, start, end))
    return out
