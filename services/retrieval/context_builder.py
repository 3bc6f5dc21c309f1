"""Token-aware context builder (retrieval.md §5.6): diverse, ordered, merged, within a token limit.

Rules, in the order they apply:

1. Diversity: candidates are taken round-robin across documents (documents ordered by
   their best score, each document's chunks by score), so one document cannot fill the
   window before every other document has had its best chunk; ``max_chunks_per_doc``
   caps a document outright.
2. Fit: in that priority order a chunk is kept when the whole context, counted exactly
   with the tokenizer, still fits ``token_limit``. Once a chunk does not fit, no chunk
   scoring lower than it is kept: the lowest scores are dropped, never a better chunk for
   a worse one that happens to be shorter. (A later chunk scoring at least as high, one
   the round-robin put after another document's best, is still tried.)
3. Merging: kept chunks of one section with consecutive ``ord`` form one block, in
   document order, pages spanning all parts. Chunks overlap by a few dozen tokens; the
   overlap (the longest suffix of one chunk that is a prefix of the next) appears once.
4. Hard trim (optional): when the window still has room, the first chunk that did not
   fit is cut to the room left, however little, as the one truncated block.
5. Output: blocks grouped by document (documents by best score), in reading order
   inside a document, or by score with ``order="score"``. The total never exceeds the
   limit.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from services.common.tokenizer import BpeTokenizer, Tokenizer, default_tokenizer
from services.docstore.chunking import find_overlap
from services.retrieval.search import ChunkHit

ORDERS = ("document", "score")
_PieceKey = str | tuple[str, str, bool]
SPLITTING_ENCODINGS = frozenset({"cl100k_base", "o200k_base", "o200k_harmony", "llama3", "qwen3"})
"""Encodings (BpeTokenizer) whose count of a text is the sum of the counts of its two parts
when it is cut at a space between two letters. Each splits a text into words by a regular
expression before the BPE, and none of those words spans such a space: the space starts the
next word, and what ends the word before it does not depend on what follows. Checked in
tests/unit/test_context_builder.py."""
_SPACE_BETWEEN_WORDS = re.compile(r"(?<=[^\W\d_]) (?=[^\W\d_])")
"""A space between two word characters that are not digits: letters, or the few other
numeric characters, which `_word_start` rules out."""


class ContextBlock(NamedTuple):
    """One contiguous passage of the context: one chunk or several adjacent ones merged."""

    doc_id: str
    section_id: str
    chunk_ids: tuple[str, ...]
    """Chunks the block contains, in document order."""
    text: str
    tokens: int
    """Tokens of ``text`` (plus ``block_overhead_tokens``)."""
    score: float
    """Best score of its chunks."""
    page_start: int
    page_end: int
    ord_start: int
    ord_end: int
    truncated: bool = False
    """True when the last chunk was cut to fit (hard trim)."""


@dataclass(frozen=True)
class ContextResult:
    """The blocks chosen, what they cost, and what was left out."""

    blocks: tuple[ContextBlock, ...]
    total_tokens: int
    token_limit: int
    dropped_chunk_ids: tuple[str, ...] = ()
    """Candidates left out (over the limit or over the per-document cap), by priority."""

    @property
    def chunk_ids(self) -> tuple[str, ...]:
        """Every chunk included, block by block."""
        return tuple(cid for block in self.blocks for cid in block.chunk_ids)


@dataclass(frozen=True)
class ContextOptions:
    """How the builder chooses and shapes blocks."""

    max_chunks_per_doc: int = 0
    """Chunks one document may contribute; 0 = no cap (diversity still round-robins)."""
    merge_adjacent: bool = True
    """Merge consecutive chunks of a section into one block, overlap removed."""
    hard_trim: bool = False
    """Cut the first chunk that does not fit to fill the room left exactly."""
    block_overhead_tokens: int = 0
    """Tokens reserved per block for the caller's header / separator in the prompt."""
    order: str = "document"
    """``document``: grouped by document, reading order inside; ``score``: best block first."""
    joiner: str = "\n"
    """Placed between adjacent chunks whose overlap is not found."""
    min_overlap_chars: int = 12
    """Shortest shared suffix/prefix taken as chunk overlap (shorter ones are coincidence)."""

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {self.order!r}")
        if self.max_chunks_per_doc < 0 or self.block_overhead_tokens < 0:
            raise ValueError("max_chunks_per_doc and block_overhead_tokens must be >= 0")


@dataclass
class _Piece:
    """A kept chunk; ``text`` is cut when trimmed (overlaps with neighbours already removed)."""

    cand: ChunkHit
    text: str
    trimmed: bool = False
    continues: bool = False
    """The text starts exactly where the previous chunk's ends (its overlap was cut off)."""
    key: _PieceKey = field(init=False)
    """What the text is a function of within one build: the chunk id, and for a trimmed
    piece its text and whether it continues the piece before it."""

    def __post_init__(self) -> None:
        self.key = (
            (self.cand.chunk_id, self.text, self.continues) if self.trimmed else self.cand.chunk_id
        )


@dataclass
class _State:
    """Kept pieces per (doc, section), sorted by ord, with each section's token cost."""

    pieces: dict[tuple[str, str], list[_Piece]] = field(default_factory=dict)
    cost: dict[tuple[str, str], int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.cost.values())


class ContextBuilder:
    """Builds the LLM context from search candidates; pure, reusable, thread-safe."""

    def __init__(
        self, tokenizer: Tokenizer | None = None, options: ContextOptions | None = None
    ) -> None:
        self._tok = tokenizer or default_tokenizer()
        self._opt = options or ContextOptions()

    # -- public -----------------------------------------------------------------------

    def build(self, candidates: Iterable[ChunkHit], token_limit: int) -> ContextResult:
        """Choose, merge and order blocks so their tokens sum to at most ``token_limit``."""
        if token_limit < 0:
            raise ValueError(f"token_limit must be >= 0, got {token_limit}")
        overlaps: dict[tuple[str, str], int] = {}
        priority, capped = self._priority(candidates)
        # A chunk's own count comes from ingestion (same tokenizer, same text): encoding
        # each candidate again was a sixth of a search's time after the index.
        counts = {c.text: c.tokens for c in priority if c.tokens > 0}
        ctx = _Run(self._tok, self._opt, counts, overlaps)

        state = _State()
        rejected: list[ChunkHit] = []
        floor: float | None = None  # the best score of a chunk that did not fit
        for cand in priority:
            if floor is not None and cand.score < floor:
                rejected.append(cand)
                continue
            key = (cand.doc_id, cand.section_id)
            trial = _insert(state.pieces.get(key, []), _Piece(cand, cand.text))
            cost = ctx.section_cost(trial)
            if state.total - state.cost.get(key, 0) + cost <= token_limit:
                state.pieces[key], state.cost[key] = trial, cost
            else:
                rejected.append(cand)
                floor = cand.score if floor is None else max(floor, cand.score)

        if self._opt.hard_trim and rejected:
            trimmed = self._trim_one(ctx, state, rejected, token_limit)
            if trimmed is not None:
                rejected.remove(trimmed)

        blocks = [b for key in state.pieces for b in ctx.blocks(state.pieces[key])]
        blocks = self._order(blocks)
        total = sum(b.tokens for b in blocks)
        assert total <= token_limit, (total, token_limit)  # guaranteed by construction
        dropped = tuple(c.chunk_id for c in rejected) + tuple(c.chunk_id for c in capped)
        return ContextResult(tuple(blocks), total, token_limit, dropped)

    # -- steps ------------------------------------------------------------------------

    def _priority(self, candidates: Iterable[ChunkHit]) -> tuple[list[ChunkHit], list[ChunkHit]]:
        """Round-robin across documents by score, and the candidates over the per-doc cap."""
        best: dict[str, ChunkHit] = {}
        for cand in candidates:
            seen = best.get(cand.chunk_id)
            if seen is None or cand.score > seen.score:
                best[cand.chunk_id] = cand
        by_doc: dict[str, list[ChunkHit]] = {}
        for cand in best.values():
            if cand.text:
                by_doc.setdefault(cand.doc_id, []).append(cand)
        for chunks in by_doc.values():
            chunks.sort(key=lambda c: (-c.score, c.ord, c.chunk_id))
        docs = sorted(by_doc, key=lambda d: (-by_doc[d][0].score, d))
        cap = self._opt.max_chunks_per_doc
        capped = [c for d in docs for c in (by_doc[d][cap:] if cap else [])]
        lists = [by_doc[d][:cap] if cap else by_doc[d] for d in docs]
        priority: list[ChunkHit] = []
        for rank in range(max((len(x) for x in lists), default=0)):
            priority.extend(chunks[rank] for chunks in lists if rank < len(chunks))
        return priority, capped

    def _trim_one(
        self,
        ctx: _Run,
        state: _State,
        rejected: list[ChunkHit],
        token_limit: int,
    ) -> ChunkHit | None:
        """Add the first rejected chunk (the first that did not fit), cut to the room left;
        return it, or None when there is no room or its cut text would be blank."""
        room = token_limit - state.total - self._opt.block_overhead_tokens
        if room < 1:
            return None
        cand = rejected[0]
        key = (cand.doc_id, cand.section_id)
        pieces = state.pieces.get(key, [])
        before = next((p for p in pieces if p.cand.ord == cand.ord - 1), None)
        after = next((p for p in pieces if p.cand.ord == cand.ord + 1), None)
        core = cand.text
        continues = False
        if after is not None and self._opt.merge_adjacent:
            cut = find_overlap(core, after.text, self._opt.min_overlap_chars)
            core = core[: len(core) - cut]
        if before is not None and self._opt.merge_adjacent:
            cut = find_overlap(before.text, core, self._opt.min_overlap_chars)
            core, continues = core[cut:], cut > 0
        old_cost = state.cost.get(key, 0)
        budget = token_limit - (state.total - old_cost)
        keep, fit, text = room, None, ""
        # BPE counts are not additive at joins: shrink until the exact count fits, then grow
        # while it still does, so the context fills the limit to the token.
        while keep >= 1:
            longer, text = text, self._tok.truncate(core, keep)
            if not text.strip() or (fit is not None and text == longer):
                break
            trial = _insert(pieces, _Piece(cand, text, trimmed=True, continues=continues))
            cost = ctx.section_cost(trial)
            if cost <= budget:
                fit = trial, cost
                if cost == budget:
                    break
                keep += budget - cost
            elif fit is not None:
                break  # grown past the limit: the last fit stands
            else:
                keep -= max(1, cost - budget)
        if fit is None:
            return None
        state.pieces[key], state.cost[key] = fit
        return cand

    def _order(self, blocks: list[ContextBlock]) -> list[ContextBlock]:
        if self._opt.order == "score":
            return sorted(blocks, key=lambda b: (-b.score, b.doc_id, b.ord_start))
        doc_best: dict[str, float] = {}
        for b in blocks:
            doc_best[b.doc_id] = max(doc_best.get(b.doc_id, b.score), b.score)
        return sorted(blocks, key=lambda b: (-doc_best[b.doc_id], b.doc_id, b.ord_start))


def _insert(pieces: list[_Piece], piece: _Piece) -> list[_Piece]:
    """A new list with ``piece`` in ord order (the input is not changed)."""
    out = [*pieces, piece]
    out.sort(key=lambda p: (p.cand.ord, p.cand.chunk_id))
    return out


class _Run:
    """Block assembly and exact token costs, with caches shared within one build."""

    def __init__(
        self,
        tok: Tokenizer,
        opt: ContextOptions,
        counts: dict[str, int],
        overlaps: dict[tuple[str, str], int],
    ) -> None:
        self._tok = tok
        self._opt = opt
        self._counts = counts
        self._overlaps = overlaps
        # Each candidate is tried with its section's merged text: counted whole, a section
        # of n consecutive candidates cost n^2 chunks of BPE work. Where the count adds up
        # across a space between words, a block is counted in segments cut at the first such
        # space in the text each piece adds; a segment's count is kept by the pieces it is
        # made of, so a trial counts only the segments the new piece changes: exactly the
        # whole text's count, for the work of one chunk.
        self._segmented = isinstance(tok, BpeTokenizer) and tok.name in SPLITTING_ENCODINGS
        self._links: dict[tuple[_PieceKey, _PieceKey], tuple[str, int]] = {}
        self._segments: dict[tuple[_PieceKey | None, ...], int] = {}
        self._group_counts: dict[tuple[_PieceKey, ...], int] = {}

    def count(self, text: str) -> int:
        found = self._counts.get(text)
        if found is None:
            found = self._counts[text] = self._tok.count(text)
        return found

    def _groups(self, pieces: Sequence[_Piece]) -> list[list[_Piece]]:
        """Runs of consecutive ord; a trimmed piece ends its run (its tail is gone)."""
        groups: list[list[_Piece]] = []
        for piece in pieces:
            last = groups[-1][-1] if groups else None
            if (
                self._opt.merge_adjacent
                and last is not None
                and not last.trimmed
                and piece.cand.ord == last.cand.ord + 1
            ):
                groups[-1].append(piece)
            else:
                groups.append([piece])
        return groups

    def _join(self, left: _Piece, right: _Piece) -> str:
        """The text ``right`` adds after ``left``: without the overlap, or after the joiner."""
        if right.continues:  # its leading overlap was removed when it was cut
            return right.text
        if right.trimmed:
            return self._opt.joiner + right.text
        key = (left.cand.chunk_id, right.cand.chunk_id)
        cut = self._overlaps.get(key)
        if cut is None:
            cut = self._overlaps[key] = find_overlap(
                left.text, right.text, self._opt.min_overlap_chars
            )
        return right.text[cut:] if cut else self._opt.joiner + right.text

    def _text(self, group: list[_Piece]) -> str:
        parts = [group[0].text]
        parts.extend(self._join(a, b) for a, b in itertools.pairwise(group))
        return "".join(parts)

    def section_cost(self, pieces: Sequence[_Piece]) -> int:
        """Exact tokens of the blocks these pieces form (with per-block overhead)."""
        count = self._segment_count if self._segmented else self._whole_count
        return sum(count(g) + self._opt.block_overhead_tokens for g in self._groups(pieces))

    def _whole_count(self, group: list[_Piece]) -> int:
        return self.count(self._text(group))

    def _segment_count(self, group: list[_Piece]) -> int:
        """Tokens of the group's text (`_text`), summed over its segments: each begins at the
        first space between two letters in the text a piece adds (SPLITTING_ENCODINGS)."""
        keys = [p.key for p in group]
        counted = self._group_counts.get(tuple(keys))
        if counted is not None:
            return counted
        links = [self._link(group[j - 1], group[j]) for j in range(1, len(group))]
        total, begin = 0, 0  # the segment begins in the text piece `begin` adds
        for end, (_, at) in enumerate(links, start=1):
            if at >= 0:
                total += self._segment(group, keys, links, begin, end)
                begin = end
        total += self._segment(group, keys, links, begin, len(group))
        self._group_counts[tuple(keys)] = total
        return total

    def _link(self, left: _Piece, right: _Piece) -> tuple[str, int]:
        """The text `right` adds after `left` (`_join`) and where its first space between two
        letters is (-1: none)."""
        found = self._links.get((left.key, right.key))
        if found is None:
            part = self._join(left, right)
            found = self._links[(left.key, right.key)] = (part, _word_start(part))
        return found

    def _segment(
        self,
        group: list[_Piece],
        keys: list[_PieceKey],
        links: list[tuple[str, int]],
        begin: int,
        end: int,
    ) -> int:
        """Tokens of the group's text from the split in piece `begin`'s text (its start when
        0) to the split in piece `end`'s (the group's end when there is no such piece). The
        text is a function of the pieces from `begin - 1` to `end`: counted once by them."""
        last = end == len(group)
        key = (
            keys[begin - 1] if begin else None,
            *keys[begin : end + 1],
            *((None,) if last else ()),
        )
        found = self._segments.get(key)
        if found is None:
            parts = [group[0].text, *(part for part, _ in links)]
            head = parts[begin][links[begin - 1][1] :] if begin else parts[0]
            tail = "" if last else parts[end][: links[end - 1][1]]
            found = self._segments[key] = self.count("".join([head, *parts[begin + 1 : end], tail]))
        return found

    def blocks(self, pieces: Sequence[_Piece]) -> list[ContextBlock]:
        out: list[ContextBlock] = []
        for group in self._groups(pieces):
            text = self._text(group)
            starts = [p.cand.page_start for p in group if p.cand.page_start > 0]
            ends = [p.cand.page_end for p in group if p.cand.page_end > 0]
            first = group[0].cand
            out.append(
                ContextBlock(
                    doc_id=first.doc_id,
                    section_id=first.section_id,
                    chunk_ids=tuple(p.cand.chunk_id for p in group),
                    text=text,
                    tokens=self.count(text) + self._opt.block_overhead_tokens,
                    score=max(p.cand.score for p in group),
                    page_start=min(starts) if starts else 0,
                    page_end=max(ends + starts) if ends or starts else 0,
                    ord_start=first.ord,
                    ord_end=group[-1].cand.ord,
                    truncated=any(p.trimmed for p in group),
                )
            )
        return out


def _word_start(text: str) -> int:
    """Where the first space between two letters of `text` is (-1: none)."""
    for m in _SPACE_BETWEEN_WORDS.finditer(text):
        at = m.start()
        if text[at - 1].isalpha() and text[at + 1].isalpha():
            return at
    return -1


def build_context(
    candidates: Iterable[ChunkHit],
    token_limit: int,
    tokenizer: Tokenizer | None = None,
    options: ContextOptions | None = None,
) -> ContextResult:
    """One-shot :meth:`ContextBuilder.build`."""
    return ContextBuilder(tokenizer, options).build(candidates, token_limit)
