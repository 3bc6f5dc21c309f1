"""Token management (llm-service.md §7): count every message, fit the context, keep the totals.

Three limits, all in tokens of the real offline tokenizer (services/common/tokenizer.py):

- `max_prompt_tokens` caps the first prompt (system prompt, tool instructions, context,
  messages and the tool definitions the runtime is sent). Context chunks are dropped or cut,
  lowest score first, to fit; a prompt that does not fit without context is a caller error.
- `max_completion_tokens` caps each model answer; it is reserved for the final answer.
- `max_total_tokens` caps the conversation the model sees at any step: the prompt plus every
  tool call and tool result the loop appended, plus the completion reserve. The caller's
  `context_token_budget` (prompt plus tool text, orchestrator.md §3.5) may lower it.

Going past a limit raises `limit_exceeded`'s LIMIT_EXCEEDED error with reason
LLM_LIMIT_EXCEEDED (HTTP 400).
Counts are estimates of the runtime's own count: the chat template adds a few tokens per
message (MESSAGE_OVERHEAD), which is counted here so the estimate errs high.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace

from services.common import errors
from services.common.bounded_cache import BoundedCache
from services.common.prompt_limits import (
    LLM_LIMIT_EXCEEDED,
    MESSAGE_TOKENS,
    PROMPT_LIMIT_NAME,
    REPLY_TOKENS,
)
from services.common.tokenizer import Tokenizer
from services.llm.model import ContextChunk
from services.model_runtime.chat import ChatMessage, ToolSpec, message_chars

MESSAGE_OVERHEAD = MESSAGE_TOKENS
"""Tokens a chat template adds around one message (role marker, start and end tokens);
shared with the orchestrator, which shapes first prompts to this count."""
REPLY_OVERHEAD = REPLY_TOKENS
"""Tokens of the assistant turn the runtime opens for the answer (shared likewise)."""
TOOL_CALL_OVERHEAD = 6
"""Tokens around one tool call of an assistant message (id, type, function wrapper)."""
TOOL_SPEC_OVERHEAD = 8
"""Tokens around one tool definition in the request (type, function wrapper)."""
JOIN_SLACK = 2
"""Tokens a context block may add where it is joined to its neighbours (BPE merges)."""
MIN_TRIMMED_CHUNK_TOKENS = 48
"""A context chunk is cut to fit only when at least this many of its tokens remain."""


def limit_exceeded(
    message: str, limit_name: str, limit: int, **extra: str
) -> errors.LimitExceededError:
    """An LLM_LIMIT_EXCEEDED error naming the service's limit and its value in the metadata
    (`errors.limit_metadata`)."""
    return errors.over_limit(message, limit, name=limit_name, reason=LLM_LIMIT_EXCEEDED, **extra)


# Counting is a measurable share of the loop (bench/llm_overhead.py): the same messages,
# texts and tool definitions are counted again at every step (a tool result is counted when
# it is rendered, again as a message; a call id when the result's room is priced, again
# when the result is added). The caches are keyed by value (texts and frozen messages; a
# tool spec by its parameters object, kept alive by the entry) and bounded: by entries, and
# the text and message caches also by the characters their keys hold, since a request may
# bring 64 messages of 32,768 characters (and be refused only once they are counted).
_CACHE_LIMIT = 4096
"""Entries of each cache."""
_CACHE_CHARS = 1 << 22
"""Characters of text the text cache keeps, and again the message cache (4,194,304: at most
8 MB each for Cyrillic, 16 MB for astral text; a conversation of the default limits is
about 20,000 characters)."""
_TEXT_CACHE: BoundedCache[tuple[str, str], int] = BoundedCache(_CACHE_LIMIT, _CACHE_CHARS)
_MESSAGE_CACHE: BoundedCache[tuple[str, ChatMessage], int] = BoundedCache(
    _CACHE_LIMIT, _CACHE_CHARS
)
_TOOL_CACHE: dict[tuple[str, str, str, int], tuple[object, int]] = {}


def count_tokens(tokenizer: Tokenizer, text: str) -> int:
    """`tokenizer.count(text)`, remembered: the same text is counted once."""
    key = (tokenizer.name, text)
    found = _TEXT_CACHE.get(key)
    if found is None:
        found = tokenizer.count(text)
        _TEXT_CACHE.put(key, found, len(text))
    return found


def message_tokens(tokenizer: Tokenizer, message: ChatMessage) -> int:
    """Tokens of one message as a chat template renders it (content, name, tool calls)."""
    key = (tokenizer.name, message)
    found = _MESSAGE_CACHE.get(key)
    if found is None:
        found = _count_message(tokenizer, message)
        _MESSAGE_CACHE.put(key, found, message_chars(message))
    return found


def _count_message(tokenizer: Tokenizer, message: ChatMessage) -> int:
    n = MESSAGE_OVERHEAD + count_tokens(tokenizer, message.content)
    if message.name:
        n += count_tokens(tokenizer, message.name) + 1
    if message.tool_call_id:
        n += count_tokens(tokenizer, message.tool_call_id)
    for call in message.tool_calls:
        n += (
            TOOL_CALL_OVERHEAD
            + count_tokens(tokenizer, call.name)
            + count_tokens(tokenizer, call.arguments)
        )
    return n


def tools_tokens(tokenizer: Tokenizer, tools: Sequence[ToolSpec]) -> int:
    """Tokens of the tool definitions sent with a request (their JSON, as runtimes render it)."""
    total = 0
    for t in tools:
        # The parameters dict is the catalogue's own object, shared by every request.
        key = (tokenizer.name, t.name, t.description, id(t.parameters))
        hit = _TOOL_CACHE.get(key)
        # The entry keeps its parameters object alive, so its id cannot be reused by another.
        n = hit[1] if hit is not None and hit[0] is t.parameters else None
        if n is None:
            n = TOOL_SPEC_OVERHEAD + tokenizer.count(
                json.dumps(
                    {"name": t.name, "description": t.description, "parameters": t.parameters},
                    ensure_ascii=False,
                )
            )
            if len(_TOOL_CACHE) >= _CACHE_LIMIT:
                _TOOL_CACHE.clear()
            _TOOL_CACHE[key] = (t.parameters, n)
        total += n
    return total


def prompt_tokens(
    tokenizer: Tokenizer, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] = ()
) -> int:
    """Tokens of a whole request: every message, the tool definitions and the reply opener."""
    return (
        sum(message_tokens(tokenizer, m) for m in messages)
        + tools_tokens(tokenizer, tools)
        + REPLY_OVERHEAD
    )


def fit_prompt(
    build: Callable[[Sequence[ContextChunk]], list[ChatMessage]],
    chunks: Sequence[ContextChunk],
    *,
    tools: Sequence[ToolSpec],
    limit: int,
    tokenizer: Tokenizer,
    render_chunk: Callable[[ContextChunk], str],
    limit_name: str = PROMPT_LIMIT_NAME,
) -> tuple[list[ChatMessage], tuple[ContextChunk, ...]]:
    """The prompt `build(kept)` for the best context that fits `limit` tokens, and `kept`.

    Chunks are taken best score first while they fit whole; then the best chunk left out
    is cut to the room that remains (when at least MIN_TRIMMED_CHUNK_TOKENS of it fit).
    Kept chunks stay in the caller's order. `render_chunk` is how the prompt shows a chunk,
    used to price chunks without rebuilding the prompt for each. Raises LLM_LIMIT_EXCEEDED,
    naming `limit_name` (the limit that set `limit`), when the prompt does not fit without
    context.
    """
    bare = build(())
    fixed = prompt_tokens(tokenizer, bare, tools)
    if fixed > limit:
        raise limit_exceeded(
            f"the prompt is {fixed} tokens without context; the limit is {limit} ({limit_name})",
            limit_name,
            limit,
            field="messages",
        )
    if not chunks:
        return bare, ()
    # What showing any context costs besides the chunks (header, data rule): price it once.
    probe = replace(chunks[0], text="")
    framing = prompt_tokens(tokenizer, build((probe,)), tools) - count_tokens(
        tokenizer, render_chunk(probe)
    )
    room = limit - framing - JOIN_SLACK
    order = sorted(range(len(chunks)), key=lambda i: (-chunks[i].score, i))
    kept: dict[int, ContextChunk] = {}
    left_out: list[int] = []
    for i in order:
        cost = count_tokens(tokenizer, render_chunk(chunks[i])) + JOIN_SLACK
        if cost <= room:
            kept[i] = chunks[i]
            room -= cost
        else:
            left_out.append(i)
    if left_out:
        best = chunks[left_out[0]]
        frame = count_tokens(tokenizer, render_chunk(replace(best, text=""))) + JOIN_SLACK + 1
        if room - frame >= MIN_TRIMMED_CHUNK_TOKENS:
            text = tokenizer.truncate(best.text, room - frame).rstrip() + "…"
            kept[left_out[0]] = replace(best, text=text)
    selected = [kept[i] for i in sorted(kept)]
    while True:
        messages = build(selected)
        if prompt_tokens(tokenizer, messages, tools) <= limit or not selected:
            return messages, tuple(selected)
        # The per-chunk prices were a hair low (tokens merge across joins): drop the worst.
        worst = min(range(len(selected)), key=lambda i: (selected[i].score, -i))
        del selected[worst]


@dataclass(eq=False)
class TokenBudget:
    """The token account of one request, updated by the tool loop as the conversation grows.

    `conversation` is what the model would be sent now; `prompt_used` / `completion_used`
    add up every runtime call (the runtime's own counts when it reports them).
    """

    tokenizer: Tokenizer
    _: KW_ONLY
    max_prompt_tokens: int
    max_completion_tokens: int
    max_total_tokens: int
    context_token_budget: int | None = None
    conversation: int = field(default=0, init=False)
    prompt_used: int = field(default=0, init=False)
    completion_used: int = field(default=0, init=False)
    tool_result_tokens: int = field(default=0, init=False)
    calls: int = field(default=0, init=False)

    @property
    def conversation_limit(self) -> int:
        """The most the conversation may hold while the completion reserve still fits."""
        limit = self.max_total_tokens - self.max_completion_tokens
        if self.context_token_budget is not None:
            limit = min(limit, self.context_token_budget)
        return limit

    @property
    def prompt_limit(self) -> int:
        """The most the first prompt may hold."""
        return min(self.max_prompt_tokens, self.conversation_limit)

    def prompt_limit_name(self) -> str:
        """Which limit sets `prompt_limit`: max_prompt_tokens, else `limit_name()`'s."""
        if self.prompt_limit == self.max_prompt_tokens:
            return PROMPT_LIMIT_NAME
        return self.limit_name()

    def limit_name(self) -> str:
        """Which limit bounds the conversation: the caller's context budget or the total."""
        if (
            self.context_token_budget is not None
            and self.context_token_budget < self.max_total_tokens - self.max_completion_tokens
        ):
            return "context_token_budget"
        return "max_total_tokens"

    def start(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> int:
        """Open the account with the first prompt; raises when it is past `prompt_limit`."""
        self.conversation = prompt_tokens(self.tokenizer, messages, tools)
        if self.conversation > self.prompt_limit:
            raise limit_exceeded(
                f"the prompt is {self.conversation} tokens; the limit is {self.prompt_limit}",
                self.prompt_limit_name(),
                self.prompt_limit,
                field="messages",
            )
        return self.conversation

    def add(self, message: ChatMessage) -> int:
        """Count a message appended to the conversation; returns its tokens."""
        n = message_tokens(self.tokenizer, message)
        self.conversation += n
        if message.role == "tool":
            self.tool_result_tokens += n
        return n

    def add_note(self, message: ChatMessage) -> int:
        """Count a note of the loop's own into the conversation as far as its room goes.
        Returns the tokens past the room, which ride on the conversation (`notes_room`)."""
        n = message_tokens(self.tokenizer, message)
        kept = min(n, max(0, self.room()))
        self.conversation += kept
        return n - kept

    def room(self) -> int:
        """Tokens the conversation may still grow by (negative when past the limit)."""
        return self.conversation_limit - self.conversation

    def notes_room(self) -> int:
        """Tokens `max_total_tokens` leaves past the conversation and the answer's share: the
        room of the loop's notes riding on the conversation before they take from the answer.
        It holds `room()` and what the caller's context budget keeps of the total besides."""
        return self.max_total_tokens - self.max_completion_tokens - self.conversation

    def before_call(self) -> int:
        """Check the conversation still fits; the completion cap for the next runtime call."""
        if self.conversation > self.conversation_limit:
            raise limit_exceeded(
                f"the conversation is {self.conversation} tokens with tool calls and results; "
                f"the limit is {self.conversation_limit} plus {self.max_completion_tokens} "
                "for the answer",
                self.limit_name(),
                self.conversation_limit,
            )
        return self.max_completion_tokens

    def record_call(self, *, reported_prompt: int, completion: int, notes: int = 0) -> int:
        """Add one runtime call to the totals: its prompt as the runtime reported it, else our
        own count (the conversation and the `notes` tokens that rode on it in the call; no
        prompt is 0 tokens, so 0 is no report), and its `completion` (the runtime's count, else
        the caller's estimate). Returns the prompt tokens counted for the call."""
        self.calls += 1
        prompt = reported_prompt if reported_prompt > 0 else self.conversation + notes
        self.prompt_used += prompt
        self.completion_used += max(0, completion)
        return prompt
