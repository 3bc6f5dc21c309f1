"""One language instruction per prompt: the request's locale, else the question's language.

The orchestrator names the language (LANGUAGE_NOTE); the LLM service's prompt adds no other
language rule when the caller sends a system prompt (docs/architecture.md §14).
"""

from __future__ import annotations

import re
from datetime import date

import pytest

from services.llm.extractive import answer_language
from services.llm.model import GenerateInput, Turn
from services.llm.prompt import ANSWER_FORMAT, DEFAULT_LANGUAGE_RULE, build_prompt
from services.orchestrator.model import (
    LlmOutcome,
    RespondInput,
    RetrievalOutcome,
    SectionCandidate,
    User,
)
from services.orchestrator.respond import LANGUAGE_NOTE, Responder
from services.orchestrator.runtime_config import ConfigHolder, RuntimeConfig
from services.orchestrator.scenarios import locale_language, parse_model_decision, rule_decision

LANGUAGE_WORDS = re.compile(r"\b(?:Russian|English)\b|на русском|на английском", re.IGNORECASE)
SECTION = SectionCandidate("d", "s", "T", "summary", 0.9, 1, 2, "d:c1")


class Retriever:
    async def search(self, request):
        return RetrievalOutcome((SECTION,), 1)

    async def document_sizes(self, user, doc_ids):
        return {d: (100, 40, "Title") for d in doc_ids}


class Generator:
    def __init__(self):
        self.requests = []

    async def generate(self, request):
        self.requests.append(request)
        return LlmOutcome("ok", (), 0, 1)


def llm_system(request) -> str:
    """The system message the LLM service builds from the orchestrator's request."""
    req = GenerateInput(
        messages=tuple(Turn(m.role, m.content) for m in request.messages),
        mode=request.mode,
        system_prompt=request.system_prompt,
    )
    return build_prompt(req)[0].content


@pytest.mark.parametrize(
    ("locale", "query", "language"),
    [
        ("", "Как настроить LDAP?", "Russian"),
        ("", "How do I set up LDAP?", "English"),
        ("en-US", "Как настроить LDAP?", "English"),
        ("ru-RU", "How do I set up LDAP?", "Russian"),
        ("ru", "What is LDAP?", "Russian"),
        ("en_GB", "Что такое НДС?", "English"),
        ("de-DE", "How do I set up LDAP?", "English"),  # not offered: the question decides
        ("de-DE", "Как настроить LDAP?", "Russian"),
    ],
)
@pytest.mark.parametrize(
    "extra",
    [{}, {"selected_doc_ids": ("d",)}, {"query": "курс доллара"}, {"query": "помоги"}],
)
async def test_every_prompt_carries_exactly_one_language_instruction(
    locale, query, language, extra
):
    kw = {"query": query, **extra}
    generator = Generator()
    responder = Responder(Retriever(), generator, ConfigHolder(RuntimeConfig(), 3),
                          model_routing=False, today=lambda: date(2026, 1, 1))  # fmt: skip
    await responder.respond(RespondInput(user=User("t", "u"), locale=locale, **kw))
    (request,) = generator.requests
    system = llm_system(request)
    expected = language
    if extra.get("query"):  # the extra query replaced the question: its language decides
        expected = {"en": "English", "ru": "Russian"}.get(locale_language(locale), "Russian")
    found = LANGUAGE_WORDS.findall(system)
    assert found == [expected], system
    code = "en" if expected == "English" else "ru"
    assert LANGUAGE_NOTE[code].strip() in system
    # The extractive responder reads the same one instruction.
    assert answer_language(kw["query"], system) == code


def test_the_answer_format_names_no_language():
    assert not LANGUAGE_WORDS.search(ANSWER_FORMAT)


def test_a_request_without_a_system_prompt_gets_the_default_language_rule_once():
    system = build_prompt(GenerateInput(messages=(Turn("user", "Hi"),)))[0].content
    assert system.count(DEFAULT_LANGUAGE_RULE) == 1
    with_own = build_prompt(
        GenerateInput(messages=(Turn("user", "Hi"),), system_prompt="Answer in English.")
    )[0].content
    assert DEFAULT_LANGUAGE_RULE not in with_own
    assert LANGUAGE_WORDS.findall(with_own) == ["English"]


@pytest.mark.parametrize(
    ("locale", "expected"),
    [("ru-RU", "ru"), ("EN-us", "en"), ("en", "en"), ("ru_RU.UTF-8", "ru"), ("de-DE", ""),
     ("", ""), ("  ", ""), ("english", "")],
)  # fmt: skip
def test_locale_language(locale, expected):
    assert locale_language(locale) == expected


def test_the_locale_decides_the_clarification_questions_language_too():
    d = rule_decision("помоги", today=date(2026, 1, 1), locale="en-US")
    assert d.language == "en" and d.clarifications[0].startswith("What exactly")
    model = '{"scenario": "S5", "intent": "clarify"}'
    parsed = parse_model_decision(model, query="help", today=date(2026, 1, 1), locale="ru-RU")
    assert parsed is not None and parsed.language == "ru"
