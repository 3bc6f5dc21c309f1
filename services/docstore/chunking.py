"""Cutting a section's paragraphs into token-sized chunks with overlap, on sentence boundaries."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass

from services.common.lexical import split_sentences
from services.common.tokenizer import (
    DEFAULT_ENCODING,
    LONGEST_TOKEN_BYTES,
    BpeTokenizer,
    default_tokenizer,
)
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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class _Unit:
    text: str
    tokens: int
    page: int
    new_paragraph: bool
    glued: bool = False
    """A piece of the same word as the unit before it: joined to it with nothing between."""


def chunk_paragraphs(
    paragraphs: Iterable[Paragraph],
    config: ChunkingConfig,
    tokenizer: BpeTokenizer | None = None,
) -> list[ChunkText]:
    """Pack sentences into chunks of at most `config.chunk_tokens`, overlapping by whole sentences.

    Paragraph breaks are kept as blank lines. A sentence longer than a chunk is cut between
    words (or, for a single giant word, between tokens at character boundaries). Overlap
    repeats the trailing sentences of the previous chunk (or its trailing words when one
    sentence is too long).
    """
    return list(iter_chunks(paragraphs, config, tokenizer))


def iter_chunks(
    paragraphs: Iterable[Paragraph],
    config: ChunkingConfig,
    tokenizer: BpeTokenizer | None = None,
) -> Iterator[ChunkText]:
    """`chunk_paragraphs` one chunk at a time, reading sentences only as far as the chunk it
    cuts: a caller that bounds the chunks stops the work at its bound."""
    tok = tokenizer or default_tokenizer(config.encoding)
    limit = config.chunk_tokens
    units = _units(paragraphs, limit, tok)
    backlog: deque[_Unit] = deque()  # units to read before `units`: what a chunk handed back
    current: list[_Unit] = []
    carried = 0  # how many of `current`'s first units repeat the previous chunk (overlap)
    used = 0  # BPE of a concatenation is within about one token per join of its parts' sum
    while True:
        unit = backlog.popleft() if backlog else next(units, None)
        if unit is not None and (not current or used + 1 + unit.tokens <= limit):
            used += unit.tokens + (1 if current else 0)
            current.append(unit)
            continue
        if unit is not None:
            backlog.appendleft(unit)
        kept = current
        if len(current) > carried:
            chunk, kept, left = _finish(current, carried, limit, tok)
            yield chunk
            backlog.extendleft(reversed(left))
        if not backlog:
            return
        current = _overlap(kept, config.overlap_tokens, limit - backlog[0].tokens - 1, tok)
        carried = len(current)
        used = sum(u.tokens + 1 for u in current) - 1 if current else 0


def _units(paragraphs: Iterable[Paragraph], limit: int, tok: BpeTokenizer) -> Iterator[_Unit]:
    """The paragraphs' sentences, and the pieces of those longer than `limit`, each with its
    real token count, which is within `limit`: a chunk of one unit always fits."""
    for para in paragraphs:
        first = True
        for sentence in _sentences(para.text):
            for piece, glued in _fit(sentence, limit, tok):
                if not piece:
                    continue
                tokens = tok.count(piece)
                if tokens > limit:  # a giant word's piece that encodes longer on its own
                    for k, part in enumerate(_by_characters(piece, limit)):
                        yield _Unit(part, tok.count(part), para.page, first, glued or k > 0)
                        first = False
                    continue
                yield _Unit(piece, tokens, para.page, first, glued)
                first = False


_CUT = re.compile(r"[^\W_]\s")
"""A letter or digit before whitespace: never a sentence's end, which is a stop (and the
quotes or brackets closing it) before whitespace (lexical.split_sentences)."""


def _sentences(text: str) -> Iterator[str]:
    """`split_sentences(text)` a slice at a time: a paragraph of a million sentences (or one
    sentence of a million words) is never a list of them. A slice ends after a letter or
    digit that whitespace follows, so the sentence that runs over the cut is joined back."""
    start = 0
    carry = ""
    while len(text) - start > _SPLIT_SLICE:
        cut = _CUT.search(text, start + _SPLIT_SLICE)
        if cut is None:
            break
        sentences = split_sentences(text[start : cut.start() + 1])
        if carry:
            sentences[0] = f"{carry} {sentences[0]}"
        carry = sentences.pop()
        yield from sentences
        start = cut.start() + 1
    sentences = split_sentences(text[start:])
    if carry:
        if sentences:
            sentences[0] = f"{carry} {sentences[0]}"
        else:
            sentences = [carry]
    yield from sentences


def _fit(sentence: str, limit: int, tok: BpeTokenizer) -> Iterator[tuple[str, bool]]:
    """`sentence` cut into pieces of at most `limit` tokens, between words where possible;
    each with whether it goes on the word of the piece before (a giant word's pieces). The
    pieces joined (by a space, or nothing when glued) are the sentence. A text of more than
    `limit` times LONGEST_TOKEN_BYTES characters has more than `limit` tokens, which it knows
    without counting them (a list of every token of a 32 MiB sentence)."""
    if len(sentence) <= limit * LONGEST_TOKEN_BYTES and tok.count(sentence) <= limit:
        yield sentence, False
        return
    words: list[str] = []
    used = 0  # the words' tokens counted one by one: the piece's count, give or take a few
    for word in iter_split(sentence, " "):
        spaced = _word_tokens(" " + word, limit, tok)
        while words and used + spaced > limit:
            words = yield from _fill(words, limit, tok)
            used = _words_tokens(words, limit, tok)
        if words:
            words.append(word)
            used += spaced
            continue
        alone = _word_tokens(word, limit, tok)
        if max(alone, spaced) > limit:  # one giant "word" (a hash, a URL): cut it by tokens
            for k, piece in enumerate(_cut_word(word, limit, tok)):
                yield piece, k > 0
            continue
        words, used = [word], alone
    while words:
        words = yield from _fill(words, limit, tok)


def _word_tokens(word: str, limit: int, tok: BpeTokenizer) -> int:
    """Tokens of `word`; `limit` + 1 for one too long to be worth counting."""
    return tok.count(word) if len(word) <= limit * LONGEST_TOKEN_BYTES else limit + 1


def _words_tokens(words: Sequence[str], limit: int, tok: BpeTokenizer) -> int:
    """Tokens of `words` counted one by one, as `_fit` adds them up: the first on its own, each
    other after its space (" данные" is one token of cl100k_base, "данные" three)."""
    if not words:
        return 0
    return _word_tokens(words[0], limit, tok) + sum(
        _word_tokens(" " + word, limit, tok) for word in words[1:]
    )


def _fill(
    words: list[str], limit: int, tok: BpeTokenizer
) -> Generator[tuple[str, bool], None, list[str]]:
    """Yields the longest run of `words`' first words whose text is within `limit` tokens as a
    piece (the first word at least, which is within it alone); returns the words after it.
    The words' own counts only estimate the piece's, so its text is counted."""
    end = len(words)
    piece = " ".join(words)
    while end > 1 and tok.count(piece) > limit:
        end -= 1
        piece = " ".join(words[:end])
    yield piece, False
    return words[end:]


_SPLIT_SLICE = 1 << 16
"""`iter_split` splits this many characters at a time (and on to the next separator)."""


def iter_split(text: str, sep: str) -> Iterator[str]:
    """`text.split(sep)` a slice at a time: a text of a million short pieces is never a list
    of a million strings."""
    start = 0
    while len(text) - start > _SPLIT_SLICE:
        end = text.find(sep, start + _SPLIT_SLICE)
        if end < 0:
            break
        yield from text[start:end].split(sep)
        start = end + len(sep)
    yield from text[start:].split(sep)


def _cut_word(word: str, limit: int, tok: BpeTokenizer) -> Iterator[str]:
    """`word` in pieces of at most `limit` of its tokens, cut only between characters: the
    pieces join back to `word`. A cut that falls inside a character's UTF-8 bytes moves back
    to the character's start, and the character goes whole to the next piece. A word is
    encoded a window at a time (2 * limit * LONGEST_TOKEN_BYTES characters, more than 2 * limit
    tokens), so a word of megabytes is never a list of all its tokens."""
    if "\ufffd" in word:
        # A cut inside a character decodes to U+FFFD, which the word's own would match.
        yield from _by_characters(word, limit)
        return
    window = 2 * limit * LONGEST_TOKEN_BYTES
    position = 0
    while position < len(word):
        part = word[position : position + window]
        final = position + window >= len(word)
        ids = tok.encode(part)
        start = offset = 0
        # Short of the window's end its last `limit` tokens are cut from the next window.
        while start < len(ids) and (final or len(ids) - start > limit):
            end = min(len(ids), start + limit)
            piece = tok.decode(ids[start:end])
            # `start` is at a character's start, so the piece is the word's own text exactly
            # when `end` is too; at most 3 tokens end inside one character (limit >= 8).
            while not part.startswith(piece, offset) and end > start + 1:
                end -= 1
                piece = tok.decode(ids[start:end])
            if not part.startswith(piece, offset):
                # No piece decodes back to the word as written (an encoding that normalises,
                # as qwen3 does to NFC): the rest goes by characters.
                yield from _by_characters(word[position + offset :], limit)
                return
            yield piece
            offset += len(piece)
            start = end
        position += offset


def _by_characters(word: str, limit: int) -> Iterator[str]:
    """`word` in pieces of limit/4 characters: a character is at most 4 bytes and a token at
    least 1, so each piece is within `limit` tokens."""
    step = max(1, limit // 4)
    yield from (word[i : i + step] for i in range(0, len(word), step))


def _join(units: Sequence[_Unit]) -> str:
    parts: list[str] = []
    for i, u in enumerate(units):
        if i and not u.glued:
            parts.append("\n\n" if u.new_paragraph else " ")
        parts.append(u.text)
    return "".join(parts)


def _finish(
    units: list[_Unit], carried: int, limit: int, tok: BpeTokenizer
) -> tuple[ChunkText, list[_Unit], list[_Unit]]:
    """The chunk of `units` (the first `carried` of them repeated from the chunk before), the
    units it holds, and the units left over for the next chunk.

    The units' counts add up to within a token or so per join of the chunk's real count, and
    can fall short of it: then the last units go back to start the next chunk, and when the
    first new unit is still too long after the repeated ones, repeated ones are dropped from
    the front. A unit alone is within `limit`, so nothing is ever cut off or lost."""
    start, end = 0, len(units)
    text = _join(units)
    tokens = tok.count(text)
    while tokens > limit and end - start > 1:
        if end > carried + 1:
            end -= 1
        else:
            start += 1
        text = _join(units[start:end])
        tokens = tok.count(text)
    kept = units[start:end]
    pages = [u.page for u in kept]
    return ChunkText(text, tokens, min(pages), max(pages)), kept, units[end:]


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
