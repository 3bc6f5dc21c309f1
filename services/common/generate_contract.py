"""What the Orchestrator and the LLM service exchange, in domain form (llm.v1's UserContext,
messages, PlannedCall and ToolCallRecord): one definition for the two ends of the wire, as
search_contract.py is for a search."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_TOOL_STEPS_LIMIT = 20
"""The most tool steps either end allows: the LLM service's MAX_TOOL_STEPS and the
Orchestrator's max_tool_steps (ORCH_MAX_TOOL_STEPS, UpdateConfig), which the former caps."""
MAX_MESSAGE_CHARS = 32_768
"""The most characters one message's text may have: the LLM service refuses a longer message
of a Generate, and the Orchestrator a longer history turn of a Respond (its question is held
lower, to search_contract.MAX_QUERY_CHARS)."""
MAX_MODEL_CHARS = 200
_MODEL_NAME = re.compile(rf"[^\s\x00-\x1f\x7f]{{1,{MAX_MODEL_CHARS}}}")
MODEL_NAME_RULE = f"1-{MAX_MODEL_CHARS} characters without spaces or control characters"
"""A model's name as runtimes spell them ("qwen2.5:1.5b", "org/Model-7B-Instruct"): what a
Generate's `model` may be, and the Orchestrator's default_model (ORCH_DEFAULT_MODEL,
UpdateConfig), which it sends as one."""


def is_model_name(name: str) -> bool:
    return _MODEL_NAME.fullmatch(name) is not None


ANSWER_LANGUAGES = ("ru", "en")
"""The languages answers are given in (GenerateRequest.answer_language; docs/architecture.md
§14: the callers are bilingual)."""

_CYRILLIC = re.compile(r"[а-яё]", re.IGNORECASE)
_LATIN = re.compile(r"[a-z]", re.IGNORECASE)
_LOWERCASE_LATIN = re.compile(r"[a-z]")
_LATIN_WORD = re.compile(r"[A-Za-z]+")
CAPITALS_NAME_WORDS = 2
"""Latin words in capitals a question may have and still be no language's words ("LDAP",
"HTTP 502", "USD RATE"): more make a sentence written in capitals ("HOW DO I RESET MY
PASSWORD?" is English)."""


_QUOTED = re.compile(r"«[^»]*»|“[^”]*”|„[^“”]*[“”]|\"[^\"]*\"|`[^`]*`")
_LOWERCASE_CYRILLIC_WORD = re.compile(r"(?<![^\W\d_])[а-яё]+(?![^\W\d_])")


def text_language(text: str) -> str:
    """The language a text is written in: "en" when its Latin letters outnumber its
    Cyrillic ones, else "ru" (agent.md §8: Russian by default)."""
    return "en" if len(_LATIN.findall(text)) > len(_CYRILLIC.findall(text)) else "ru"


def question_language(question: str) -> str:
    """The language a question is asked in, which its answer is given in: "ru" when, outside
        its quotes, it has a lowercase Cyrillic word (Russian is written with them; "Как настроить
        LDAP в Kubernetes?" is Russian though its Latin letters outnumber the Cyrillic ones); else
        by the letters outside its quotes (`text_language`: "What is НДС?", "What does «Не удалось
        подключиться» mean?" are English). Capitals alone ("LDAP", "HTTP 502?") are no
        language's words: Russian, the default (agent.md §8); a sentence in capitals keeps its
    letters' language (CAPITALS_NAME_WORDS)."""
    bare = _QUOTED.sub(" ", question)
    if _LOWERCASE_CYRILLIC_WORD.search(bare):
        return "ru"
    latin_words = _LATIN_WORD.findall(bare)
    if (
        latin_words
        and len(latin_words) <= CAPITALS_NAME_WORDS
        and not _LOWERCASE_LATIN.search(bare)
    ):
        return "ru"
    return text_language(bare if _LATIN.search(bare) or _CYRILLIC.search(bare) else question)


QUESTION_PREFIX = "Question: "
LISTING_HEADER = "\n\nSections found:\n"
"""A document scenario's first user turn is the question and the sections found for it:
"Question: …\n\nSections found:\n…" (`question_turn`); the LLM service reads the two apart
(`turn_parts`) to judge the question and count the listing as read."""


def question_turn(question: str, listing: str | None) -> str:
    """The user turn for `question` with the sections' `listing`, or the question alone for
    None."""
    if listing is None:
        return question
    return f"{QUESTION_PREFIX}{question}{LISTING_HEADER}{listing}"


def turn_parts(turn: str) -> tuple[str, str]:
    """A user turn's question and the listing `question_turn` put after it ("" when the turn
    holds none: any other turn is all question, its blank lines included). The listing holds
    no blank line (its entries fold white space), so the last LISTING_HEADER opens it, and
    only in a turn that opens with QUESTION_PREFIX: a question may quote the header itself."""
    question, header, listing = turn.rpartition(LISTING_HEADER)
    if not header or not question.startswith(QUESTION_PREFIX):
        return turn, ""
    return question.removeprefix(QUESTION_PREFIX), listing


@dataclass(frozen=True)
class User:
    """Who the request is for, from the request's user context (never from tool arguments)."""

    tenant_id: str
    user_id: str = ""
    roles: tuple[str, ...] = ()


@dataclass(frozen=True)
class Turn:
    """One message of the conversation: its role (system, user, assistant, tool) and text."""

    role: str
    content: str


CLARIFY_HEADER = "Ask the user these clarifying questions, briefly:"


def clarify_list(questions: Sequence[str]) -> str:
    """The clarifying questions as the Orchestrator's system prompt lists them (S5): a line
    each after CLARIFY_HEADER, the list closed by a line end, so what follows it (the answer
    language) is no question."""
    return CLARIFY_HEADER + "\n" + "".join(f"- {' '.join(q.split())}\n" for q in questions)


def listed_clarifications(system: str) -> list[str]:
    """The questions `clarify_list` wrote into a system prompt, in order."""
    start = system.find(CLARIFY_HEADER + "\n")
    if start < 0:
        return []
    out = []
    for line in system[start + len(CLARIFY_HEADER) + 1 :].split("\n"):
        if not line.startswith("- "):
            break
        out.append(line[2:].strip())
    return out


def last_question(messages: Sequence[Turn]) -> str:
    """The question of a conversation: its last user turn, without the sections listed after
    it (`turn_parts`); "" without a user turn."""
    for turn in reversed(messages):
        if turn.role == "user":
            return turn_parts(turn.content)[0]
    return ""


@dataclass(frozen=True)
class PlannedCall:
    """A tool call decided before the model is asked (the Orchestrator's scenario knows it:
    load the selected documents, fetch the rates); the LLM service runs it first."""

    tool_name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolCallRecord:
    """A tool call the LLM service executed: its name, arguments and a short result summary."""

    name: str
    arguments: dict[str, Any]
    result_summary: str


def failed_call_summary(code: str, message: str) -> str:
    """The `result_summary` of a tool call that failed or was refused."""
    return f"tool_error {code}: {message}"
