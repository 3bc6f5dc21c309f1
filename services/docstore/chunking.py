"""Cutting a section's paragraphs into token-sized chunks with overlap, on sentence boundaries."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from services.common.lexical import split_sentences
from services.common.tokenizer import DEFAULT_ENCODING, BpeTokenizer, default_tokenizer
from services.common.untrusted import neutralise_markers


@dataclass(frozen=True)
class ChunkingConfig:
    """How documents are cut into chunks and summarised; part of every document's generation."""

    chunk_tokens: int = 200
    """Largest chunk in BPE tokens of `encoding` (cl100k_base), which no chunk exceeds (Retrieval's
    RETR_CHUNK_TOKENS)."""
    overlap_tokens: int = 32
    """Tokens of the previous chunk repeated at the start of the next one in the same section,
    at most half of chunk_tokens (Retrieval's RETR_CHUNK_OVERLAP_TOKENS)."""
    summary_chars: int = 400
    """Budget of a section summary, in characters."""
    summary_sentences: int = 3
    """At most this many sentences in an extractive section summary."""
    pdf_pages_per_section: int = 5
    """A PDF with neither an outline nor numbered headings gets one section per this many pages."""
    encoding: str = DEFAULT_ENCODING
    """The BPE encoding tokens are counted in."""

    def __post_init__(self) -> None:
        if self.chunk_tokens < 8:
            raise ValueError(f"chunk_tokens must be at least 8, got {self.chunk_tokens}")
        if not 0 <= self.overlap_tokens <= self.chunk_tokens // 2:
            raise ValueError(
                f"overlap_tokens must be between 0 and chunk_tokens/2 ({self.chunk_tokens // 2}),"
                f" got {self.overlap_tokens}"
            )
        if self.summary_chars < 0 or self.summary_sentences < 1:
            raise ValueError("summary_chars must be >= 0 and summary_sentences >= 1")
        if self.pdf_pages_per_section < 1:
            raise ValueError("pdf_pages_per_section must be at least 1")


@dataclass(frozen=True)
class Paragraph:
    """A paragraph of a section and the page it is on."""

    text: str
    page: int


@dataclass(frozen=True)
class ChunkText:
    """One chunk as the chunker cuts it, before ids are assigned."""

    text: str
    tokens: int
    page_start: int
    page_end: int


@dataclass(frozen=True)
class _Unit:
    text: str
    tokens: int
    page: int
    new_paragraph: bool


def chunk_paragraphs(
    paragraphs: Sequence[Paragraph],
    config: ChunkingConfig,
    tokenizer: BpeTokenizer | None = None,
) -> list[ChunkText]:
    """Pack sentences into chunks of at most `config.chunk_tokens`, overlapping by whole sentences.

    Paragraph breaks are kept as blank lines. A sentence longer than a chunk is cut between
    words (or, for a single giant word, between tokens). Overlap repeats the trailing
    sentences of the previous chunk (or its trailing words when one sentence is too long).
    """
    tok = tokenizer or default_tokenizer(config.encoding)
    units = _units(paragraphs, config.chunk_tokens, tok)
    limit = config.chunk_tokens
    out: list[ChunkText] = []
    current: list[_Unit] = []
    fresh = False  # whether `current` holds anything beyond the carried-over overlap
    used = 0  # BPE of a concatenation is within about one token per join of its parts' sum
    for unit in units:
        if current and used + 1 + unit.tokens > limit:
            if fresh:
                out.append(_finish(current, limit, tok))
            current = _overlap(current, config.overlap_tokens, limit - unit.tokens - 1, tok)
            used = sum(u.tokens + 1 for u in current) - 1 if current else 0
            fresh = False
        used += unit.tokens + (1 if current else 0)
        current.append(unit)
        fresh = True
    if current and fresh:
        out.append(_finish(current, limit, tok))
    return out


def _units(paragraphs: Sequence[Paragraph], limit: int, tok: BpeTokenizer) -> list[_Unit]:
    units: list[_Unit] = []
    for para in paragraphs:
        first = True
        for sentence in split_sentences(para.text):
            for piece in _fit(sentence, limit, tok):
                units.append(_Unit(piece, tok.count(piece), para.page, first))
                first = False
    return units


def _fit(sentence: str, limit: int, tok: BpeTokenizer) -> list[str]:
    """`sentence` cut into pieces of at most `limit` tokens, between words where possible."""
    if tok.count(sentence) <= limit:
        return [sentence]
    pieces: list[str] = []
    words: list[str] = []
    used = 0
    for word in sentence.split(" "):
        n = tok.count(" " + word)
        if n > limit:  # one giant "word" (a hash, a URL): cut it by tokens
            if words:
                pieces.append(" ".join(words))
                words, used = [], 0
            ids = tok.encode(word)
            pieces.extend(
                tok.decode(ids[i : i + limit]).strip("\ufffd") for i in range(0, len(ids), limit)
            )
            continue
        if words and used + n > limit:
            pieces.append(" ".join(words))
            words, used = [], 0
        words.append(word)
        used += n
    if words:
        pieces.append(" ".join(words))
    return [p for p in pieces if p]


def _join(units: Sequence[_Unit]) -> str:
    parts: list[str] = []
    for i, u in enumerate(units):
        if i:
            parts.append("\n\n" if u.new_paragraph else " ")
        parts.append(u.text)
    return "".join(parts)


def _finish(units: list[_Unit], limit: int, tok: BpeTokenizer) -> ChunkText:
    text = _join(units)
    tokens = tok.count(text)
    while tokens > limit and len(units) > 1:  # the estimate was short: trim (rare)
        units = units[:-1]
        text = _join(units)
        tokens = tok.count(text)
    if tokens > limit:
        text = tok.truncate(text, limit)
        tokens = tok.count(text)
    pages = [u.page for u in units]
    return ChunkText(text, tokens, min(pages), max(pages))


def _overlap(units: list[_Unit], budget: int, room: int, tok: BpeTokenizer) -> list[_Unit]:
    """The tail of `units` to repeat at the start of the next chunk: whole sentences, else words."""
    budget = min(budget, room)
    if budget <= 0:
        return []
    tail: list[_Unit] = []
    used = 0
    for u in reversed(units):
        if used + u.tokens + 1 > budget:
            break
        tail.insert(0, u)
        used += u.tokens + 1
    if tail:
        return [_Unit(tail[0].text, tail[0].tokens, tail[0].page, False), *tail[1:]]
    words = units[-1].text.split(" ")
    picked: list[str] = []
    for word in reversed(words[1:]):  # never the whole sentence: it did not fit
        if tok.count(" ".join([word, *picked])) > budget:
            break
        picked.insert(0, word)
    if not picked:
        return []
    text = " ".join(picked)
    return [_Unit(text, tok.count(text), units[-1].page, False)]


_SENTENCE_CLOSERS = (".", "!", "?", "…")
"""How a sentence ends, for telling a short overlap of whole sentences from a coincidence."""


def find_overlap(left: str, right: str, min_chars: int = 12) -> int:
    """Length of the longest suffix of ``left`` that is a prefix of ``right``: at least
    ``min_chars`` long, or shorter when it is whole sentences (0 if neither).

    The chunker carries whole trailing sentences into the next chunk, and the last may be
    short ("Yes, done."): ignored, it was repeated in every merged block that held it (about
    7 % of adjacent pairs of random sentences). A short match that is not whole sentences
    ("the") is taken for coincidence.
    """
    min_chars = max(1, min_chars)
    found = _long_overlap(left, right, min_chars)
    if found:
        return found
    for n in range(min(len(left), len(right), min_chars - 1), 0, -1):
        piece = right[:n]
        if (
            piece.endswith(_SENTENCE_CLOSERS)
            and (n == len(right) or right[n].isspace())
            and left.endswith(piece)
            and (n == len(left) or left[-n - 1].isspace())
            and (n == len(left) or left[:-n].rstrip().endswith(_SENTENCE_CLOSERS))
        ):
            return n
    return 0


def whole_text(page_texts: Iterable[str], chunk_texts: Iterable[str] = ()) -> str:
    """A document's text as a whole read gives it (ToolsProxy's load_documents_full): its
    pages' texts, stripped, blank ones left out, a blank line between them; its chunks joined
    (join_chunks) when it keeps no page text. Its length is the document's size in characters
    (ListDocuments' `chars`, the Orchestrator's S3 rule)."""
    pages = [text.strip() for text in page_texts if text.strip()]
    return "\n\n".join(pages) if pages else join_chunks(chunk_texts)


def whole_text_tokens(
    page_texts: Iterable[str], chunk_texts: Iterable[str] = (), encoding: str = DEFAULT_ENCODING
) -> int:
    """`whole_text`'s length in BPE tokens of `encoding` (a Document's `tokens`), as a whole read
    hands it to the model: its delimiter-like runs neutralised as ToolsProxy sends them
    (`<<<` is one token, `‹‹‹` six). What the read takes of the LLM service's conversation
    (the Orchestrator's S3 rule)."""
    text = neutralise_markers(whole_text(page_texts, chunk_texts))
    return default_tokenizer(encoding).count(text)


def join_chunks(texts: Iterable[str], joiner: str = "\n\n") -> str:
    """Consecutive chunks as one text: where a chunk begins with the end of the one before
    (`find_overlap`), it continues from there, so the overlap appears once and the text reads
    as the document does; elsewhere (another section, or no overlap found) `joiner` goes
    between them."""
    out: list[str] = []
    prev = ""
    for text in texts:
        cut = find_overlap(prev, text) if out else 0
        out.append(text[cut:] if cut else (joiner + text if out else text))
        prev = text
    return "".join(out)


def _long_overlap(left: str, right: str, min_chars: int) -> int:
    if len(left) < min_chars or len(right) < min_chars:
        return 0
    probe = right[:min_chars]
    # The leftmost start in `left` whose tail is a prefix of `right` is the longest overlap.
    position = left.find(probe, max(0, len(left) - len(right)))
    while position != -1:
        if right.startswith(left[position:]):
            return len(left) - position
        position = left.find(probe, position + 1)
    return 0
