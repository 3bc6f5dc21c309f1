"""Fitting the first prompt to the LLM service's limit, in tokens of the shared tokenizer.

The LLM service refuses a first prompt past its limit; the orchestrator shapes what it sends
so that never happens for an ordinary question (docs/architecture.md §17):

- the section list (S1, S4) is at most `prompt_token_budget` tokens, the question with it
  at most MAX_MESSAGE_CHARS characters (one message), and with everything else it must fit
  `limit` (the LLM's prompt limit, lowered by the caller's context budget)
  less the room the LLM's own additions take (LLM_PROMPT_RESERVE_TOKENS and the anchors);
- past that, the lowest-scored summaries are shortened first (to MIN_SUMMARY_TOKENS), then
  the lowest-scored sections are dropped; the oldest history turns go only when not even
  the best section fits beside them;
- a question that alone does not fit is the caller's error (LLM_LIMIT_EXCEEDED, 400).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.common import errors
from services.common.generate_contract import MAX_MESSAGE_CHARS, question_turn
from services.common.prompt_limits import (
    ANCHOR_LINE_SLACK,
    LLM_LIMIT_EXCEEDED,
    LLM_PROMPT_RESERVE_TOKENS,
    MAX_LISTED_ANCHORS,
    MESSAGE_TOKENS,
    PROMPT_LIMIT_NAME,
    REPLY_TOKENS,
    anchor_line,
)
from services.common.shared_config import MIN_FIRST_PROMPT_TOKENS
from services.common.tokenizer import Tokenizer
from services.common.untrusted import format_pages
from services.orchestrator.model import SectionCandidate, Turn

MIN_SUMMARY_TOKENS = 24
"""A summary is shortened to no fewer tokens than this; past that its section is dropped."""
MAX_TITLE_TOKENS = 48
"""A section title is cut to this many tokens in the list."""
JOIN_SLACK = 1
"""Tokens one list entry may add where it is joined to its neighbours (BPE merges)."""
NO_SECTIONS = "No document sections matched the question."
MIN_CONTEXT_TOKEN_BUDGET = MIN_FIRST_PROMPT_TOKENS
"""The lowest context_token_budget (ORCH_CONTEXT_TOKEN_BUDGET, UpdateConfig), the lowest
MAX_PROMPT_TOKENS too: `PromptFitter.room` takes the lower of the two, less
LLM_PROMPT_RESERVE_TOKENS, and below this a short question does not fit."""


@dataclass(frozen=True)
class FirstPrompt:
    """What the first prompt holds after fitting."""

    history: tuple[Turn, ...]
    """The history turns kept (the newest ones)."""
    question: str
    """The last user message: the question, with the section list when there is one."""
    sections: tuple[SectionCandidate, ...]
    """The sections listed (their anchors go into the tool policy), best first."""
    tokens: int
    """The orchestrator's count of its own part: system prompt, history, question, anchors."""


def _cut(tokenizer: Tokenizer, text: str, max_tokens: int) -> str:
    if tokenizer.count(text) <= max_tokens:
        return text
    return tokenizer.truncate(text, max(0, max_tokens - 1)).rstrip() + "…"


def _entry(i: int, s: SectionCandidate, title: str, summary: str) -> str:
    """One listed section; its pages as the texts the model reads state them (`pages="3"`,
    `pages="3-5"`), none when they are not known."""
    pages = format_pages(s.page_start, s.page_end)
    return (
        f"{i}. doc_id={s.doc_id} section_id={s.section_id} anchor_chunk_id={s.anchor_chunk_id} "
        f"{f'pages={pages} ' if pages else ''}score={s.score:.3f}\n   title: {title}\n"
        f"   summary: {summary}"
    )


class PromptFitter:
    """Counts and trims first prompts for one LLM prompt limit."""

    def __init__(
        self, tokenizer: Tokenizer, limit: int, reserve: int = LLM_PROMPT_RESERVE_TOKENS
    ) -> None:
        self.tokenizer = tokenizer
        self.limit = limit
        self.reserve = reserve

    def _message(self, text: str) -> int:
        return MESSAGE_TOKENS + self.tokenizer.count(text)

    def room(self, context_token_budget: int) -> int:
        """Tokens the orchestrator's own part of a first prompt may hold: the lower of the
        LLM's prompt limit and `context_token_budget`, less the reserve for what the LLM
        service adds."""
        return min(self.limit, context_token_budget) - self.reserve

    def fit(
        self,
        *,
        system: str,
        history: Sequence[Turn],
        query: str,
        context_token_budget: int,
        sections: Sequence[SectionCandidate] | None = None,
        list_budget: int = 0,
    ) -> FirstPrompt:
        """The first prompt within the limit. `sections` None: no section list (S2, S3, S5);
        `list_budget` caps the section list's tokens (prompt_token_budget)."""
        room = self.room(context_token_budget)
        base = self.tokenizer.count(system) + REPLY_TOKENS
        kept = list(history)
        turns = [self._message(t.content) for t in kept]
        bare = base + self._message(question_turn(query, "" if sections is not None else None))
        # The smallest section list worth sending: the best section with a short summary.
        least = 0
        if sections:
            least = self._entry_cost(1, sections[0], MIN_SUMMARY_TOKENS)[0]
        if bare + least > room:
            raise errors.over_limit(
                f"the question is {bare} tokens with the instructions; at most {room - least} "
                "fit the model's prompt",
                room,
                field="query",
                name=PROMPT_LIMIT_NAME,
                reason=LLM_LIMIT_EXCEEDED,
            )
        while kept and bare + least + sum(turns) > room:
            kept.pop(0)  # the oldest turn goes first
            turns.pop(0)
        used = bare + sum(turns)
        if sections is None:
            return FirstPrompt(tuple(kept), query, (), used)
        if not sections:
            question = question_turn(query, NO_SECTIONS)
            used = base + sum(turns) + self._message(question)
            return FirstPrompt(tuple(kept), question, (), used)
        listed, question = self._fit_sections(
            query, sections, list_room=min(list_budget, room - used), room=room - used
        )
        used = base + sum(turns) + self._message(question) + self._anchors(listed)
        return FirstPrompt(tuple(kept), question, listed, used)

    def _anchors(self, sections: Sequence[SectionCandidate]) -> int:
        return sum(
            self.tokenizer.count(anchor_line(s.doc_id, s.section_id, s.anchor_chunk_id))
            + ANCHOR_LINE_SLACK
            for s in sections[:MAX_LISTED_ANCHORS]
        )

    def _entry_cost(
        self, i: int, s: SectionCandidate, summary_tokens: int | None
    ) -> tuple[int, str]:
        """(tokens of the entry, its anchor line and join, the summary as cut)."""
        tok = self.tokenizer
        title = _cut(tok, " ".join(s.title.split()), MAX_TITLE_TOKENS)
        summary = " ".join(s.summary.split())
        if summary_tokens is not None:
            summary = _cut(tok, summary, summary_tokens)
        entry = tok.count(_entry(i, s, title, summary)) + JOIN_SLACK
        anchor = (
            tok.count(anchor_line(s.doc_id, s.section_id, s.anchor_chunk_id)) + ANCHOR_LINE_SLACK
            if i <= MAX_LISTED_ANCHORS
            else 0
        )
        return entry + anchor, summary

    def _fit_sections(
        self, query: str, sections: Sequence[SectionCandidate], *, list_room: int, room: int
    ) -> tuple[tuple[SectionCandidate, ...], str]:
        """The sections and the question holding their list: the list within `list_room`
        tokens, what it adds to the prompt (list and anchors) within `room`, and the question
        with it within MAX_MESSAGE_CHARS characters."""
        tok = self.tokenizer
        kept = list(sections)
        caps: list[int | None] = [None] * len(kept)
        empty = tok.count(question_turn(query, ""))
        while True:
            summaries = [self._entry_cost(i, s, caps[i - 1])[1] for i, s in enumerate(kept, 1)]
            listing = "\n".join(
                _entry(i, s, _cut(tok, " ".join(s.title.split()), MAX_TITLE_TOKENS), summary)
                for i, (s, summary) in enumerate(zip(kept, summaries, strict=True), 1)
            )
            question = question_turn(query, listing)
            adds = tok.count(question) - empty + self._anchors(kept)
            # The turn is also one message the LLM service holds to MAX_MESSAGE_CHARS: its
            # characters over that count as tokens to cut (a token holds at least one).
            over = max(
                tok.count(listing) - list_room, adds - room, len(question) - MAX_MESSAGE_CHARS
            )
            if over <= 0:
                return tuple(kept), question
            # The lowest-scored summary that can still be shortened, else the lowest section;
            # the best section stays (`fit` checked it fits with a short summary).
            order = sorted(range(len(kept)), key=lambda j: (kept[j].score, -j))
            for j in order:
                have = tok.count(summaries[j])
                if have > MIN_SUMMARY_TOKENS:
                    caps[j] = max(MIN_SUMMARY_TOKENS, min(have - 1, have - over))
                    break
            else:
                if len(kept) == 1:
                    return tuple(kept), question
                j = order[0]
                del kept[j]
                del caps[j]
