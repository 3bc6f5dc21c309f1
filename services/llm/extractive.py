"""The built-in extractive responder (docs/architecture.md §11): a ChatRuntime without a model.

`ExtractiveRuntime` answers the tool loop (services/llm/loop.py) the way a model would. While
it has read no document text and the prompt lists a section it has not tried, it asks to
read it (read_chunk_window on its anchor, or read_doc_section when no anchor chunk is known;
after a tool error, the next section; MAX_SECTIONS_TRIED in all, then it answers from what it
has, saying what could not be read; the loop counts none of its tool errors). Otherwise it answers from every tool result in the conversation, the caller's planned
calls included, in the answer format of agent.md §8: Markdown, a short conclusion, the
details, the sources, then the extractive marker line.

- document text (read tools, load_documents_full, search hits): the sentences sharing the
  most words with the question, quoted with their document and pages (read_doc_pages: the
  page each is on); knowledge-base hits are marked as resting on the corporate knowledge base;
- Bank of Russia data (fetch_cbr_data): currency rates, rate dynamics, the key rate, the
  bank's news, footnoted `[Источник: cbr.ru]`; data from a demo stand-in is labelled so; a
  series over a period gives its first and last values, its lowest and highest and how many
  values it has, and how many were left out when it was thinned to the token budget
  (toolcalls.render_result); a result with nothing readable says the rates could not be
  read, never that the documents do not answer;
- finance news (fetch_finance_news): titles with links and dates, `[Источник: Tavily]`;
- nothing at all: the context chunks of the prompt if any; else the clarification questions
  the system prompt carries (lines ending with "?"), a polite short answer in chat mode, or
  "not found" when documents were expected.

Russian by default; English when the question is written in Latin script or the system
prompt asks for English.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from services.common.currencies import named_currencies
from services.common.generate_contract import (
    listed_clarifications,
    question_language,
    text_language,
    turn_parts,
)
from services.common.lexical import Bm25, search_terms, split_sentences
from services.common.tokenizer import default_tokenizer
from services.common.tool_contract import (
    DOC_LOCAL_SEARCH,
    FETCH_CBR_DATA,
    FETCH_FINANCE_NEWS,
    LOAD_DOCUMENTS_FULL,
    READ_CHUNK_WINDOW,
    READ_DOC_SECTION,
    READ_TOOLS,
    SEARCH_GENERAL_KB,
    SEARCH_USER_DOCUMENTS,
)
from services.common.untrusted import (
    DelimitedText,
    delimited_blocks,
    is_wrapped,
    parse_pages,
    strip_delimited,
    unwrap_untrusted,
)
from services.llm.model import Anchor
from services.llm.prompt import (
    CALLER_TOOL_KIND,
    CONTEXT_KIND,
    RAG_RULES,
    is_service_note,
    listed_anchors,
    noted_language,
)
from services.llm.toolcalls import (
    ToolContent,
    fill_placeholders,
    parse_tool_content,
    series_value,
)
from services.model_runtime.chat import (
    LENGTH,
    ChatMessage,
    ChatRequest,
    Completion,
    StreamDelta,
    StreamEvent,
    ToolCall,
    ToolSpec,
    before_stop,
)

EXTRACTIVE = "extractive"
_NOT_READING = frozenset(
    {SEARCH_USER_DOCUMENTS, SEARCH_GENERAL_KB, DOC_LOCAL_SEARCH, FETCH_CBR_DATA, FETCH_FINANCE_NEWS}
)
"""Tools whose results do not count as reading a document (the responder may still read)."""
_PIECE = re.compile(r"\S+\s*")
_ASKS_ENGLISH = re.compile(
    r"\b(?:answer|respond|reply|write)\b[^.\n]{0,20}\bin english\b|на английском", re.IGNORECASE
)
_ASKS_RUSSIAN = re.compile(
    r"\b(?:answer|respond|reply|write)\b[^.\n]{0,20}\bin russian\b|на русском", re.IGNORECASE
)
_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s*")
MAX_QUOTED_SENTENCES = 3
MAX_PASSAGES = 3
"""Documents (or search hits) quoted in one answer."""
MAX_SECTIONS_TRIED = 2
"""Sections the responder tries to read before it answers from what it has."""
MAX_RATES = 3
"""Currency rates shown when the question names none."""
MAX_LISTED = 10
"""News items or dated values listed in the details."""
MAX_SNIPPET_CHARS = 240
DEFAULT_CURRENCIES = ("USD", "EUR", "CNY")
_DEMO_WORDS = ("demo", "stand-in", "standin", "stub", "mock", "fake", "демо", "заглушк")

RU, EN = "ru", "en"
_TEXT: dict[str, dict[str, str]] = {
    RU: {
        "summary": "**Кратко:** {}",
        "details": "**Подробности**",
        "sources": "**Источники**",
        "marker_docs": "_Ответ составлен без языковой модели: это цитаты из документов "
        "(extractive)._",
        "marker": "_Ответ составлен без языковой модели (extractive)._",
        "not_found": "В доступных документах не нашлось ответа на этот вопрос.",
        "no_match": "Прямого ответа в найденных фрагментах нет; вот самые близкие из них.",
        "missing_term": "В документах нет ответа на этот вопрос: {} в прочитанном тексте не "
        "встречается. Самые близкие фрагменты:",
        "from_doc": "Из документа «{}»{}:",
        "from_kb": "Из базы знаний, «{}»{}:",
        "kb_note": "_Основывается на корпоративной базе знаний._",
        "kb_source": "База знаний: ",
        "pages_one": "стр. {}",
        "pages_range": "стр. {}–{}",
        "pages_count": "{} стр.",
        "nothing_docs": "В документах ничего не нашлось по этому запросу.",
        "nothing_kb": "В базе знаний ничего не нашлось по этому запросу.",
        "footnote": "[Источник: {}]",
        "cbr": "cbr.ru",
        "cbr_demo": "демо-заглушка ЦБ РФ",
        "demo": "⚠️ **Демо-данные:** получены от локальной заглушки Банка России ({}), "
        "а не с cbr.ru; это не официальные значения.",
        "demo_suffix": " (демо-заглушка)",
        "rate": "Курс {code} на {date}: {value} ₽ за {nominal} {code}.",
        "rate_item": "- {code}{name}: {value} ₽ за {nominal} {code}",
        "rates_set": "Официальные курсы Банка России, установлены {}.",
        "no_rates": "Банк России не установил курсов на эту дату.",
        "dynamic": "Курс {code} с {first} по {last}: {v1} ₽ → {v2} ₽ за {nominal} {code}.",
        "dynamic_item": "- {}: {} ₽",
        "no_dynamic": "Банк России не устанавливал курс {} за этот период.",
        "dynamic_in_force": "С {first} по {last} Банк России не устанавливал новый курс {code}; "
        "в эти дни действовал курс, установленный {on}: {value} ₽ за {nominal} {code}.",
        "key_rate_in_force": "С {first} по {last} Банк России не устанавливал ключевую ставку; "
        "в эти дни действовала ставка {value} % годовых, установленная {on}.",
        "values": "Значений за период: {}.",
        "values_range": "Значений за период: {count}; минимум {low} ({low_on}), максимум {high} "
        "({high_on}).",
        "rub": "{} ₽",
        "percent": "{} %",
        "thinned": "Ответ Банка России не поместился целиком: здесь {kept} из {count} значений "
        "(первое, последнее, минимум, максимум и промежуточные); не вошло значений: {omitted}.",
        "key_rate_period": "С {first} по {last}: {v1} % → {v2} % годовых.",
        "key_rate": "Ключевая ставка Банка России на {}: {} % годовых.",
        "key_rate_changes": "Изменения за период:",
        "key_rate_item": "- с {}: {} %",
        "no_key_rate": "Банк России не публиковал ключевую ставку за этот период.",
        "cbr_unread": "Данные Банка России получены, но прочитать из них курсы или ставку не "
        "удалось.",
        "cbr_news": "Новости Банка России: {}.",
        "no_news": "Новостей по запросу не нашлось.",
        "news": "Найдено финансовых новостей: {}; главная — «{}».",
        "news_source": "Tavily — поиск финансовых новостей",
        "failed": "Не удалось получить данные ({}): {}.",
        "unread": "Документы не удалось прочитать ({}), поэтому ответить на вопрос по ним нельзя.",
        "unread_partly": "Документы не удалось прочитать целиком ({}): ответ опирается на "
        "фрагменты, найденные поиском.",
        "clarify": "Чтобы ответить точнее, уточните, пожалуйста:",
        "thanks": "Пожалуйста! Если появятся вопросы — спрашивайте.",
        "hello": "Здравствуйте! Я Visior: отвечаю на вопросы по вашим документам и "
        "корпоративной базе знаний, подсказываю курсы и ключевую ставку Банка России и "
        "финансовые новости. Чем могу помочь?",
    },
    EN: {
        "summary": "**In short:** {}",
        "details": "**Details**",
        "sources": "**Sources**",
        "marker_docs": "_Composed without a language model: quotes from the documents "
        "(extractive)._",
        "marker": "_Composed without a language model (extractive)._",
        "not_found": "The available documents do not answer this question.",
        "no_match": "The passages found do not answer this directly; here are the closest.",
        "missing_term": "The documents do not answer this: {} does not occur in the text read. "
        "The closest passages:",
        "from_doc": "From “{}”{}:",
        "from_kb": "From the knowledge base, “{}”{}:",
        "kb_note": "_Based on the corporate knowledge base._",
        "kb_source": "Knowledge base: ",
        "pages_one": "p. {}",
        "pages_range": "pp. {}–{}",
        "pages_count": "{} pages",
        "nothing_docs": "Nothing was found in the documents for this request.",
        "nothing_kb": "Nothing was found in the knowledge base for this request.",
        "footnote": "[Source: {}]",
        "cbr": "cbr.ru",
        "cbr_demo": "Bank of Russia demo stand-in",
        "demo": "⚠️ **Demo data:** served by a local stand-in of the Bank of Russia ({}), "
        "not by cbr.ru; these are not official values.",
        "demo_suffix": " (demo stand-in)",
        "rate": "{code} rate on {date}: {value} RUB per {nominal} {code}.",
        "rate_item": "- {code}{name}: {value} RUB per {nominal} {code}",
        "rates_set": "Official rates of the Bank of Russia, set on {}.",
        "no_rates": "The Bank of Russia set no rates for this date.",
        "dynamic": "{code} rate from {first} to {last}: {v1} → {v2} RUB per {nominal} {code}.",
        "dynamic_item": "- {}: {} RUB",
        "no_dynamic": "The Bank of Russia set no {} rate in this period.",
        "dynamic_in_force": "The Bank of Russia set no new {code} rate from {first} to {last}; "
        "the rate in force on those days is the one set on {on}: {value} RUB per {nominal} "
        "{code}.",
        "key_rate_in_force": "The Bank of Russia set no key rate from {first} to {last}; the "
        "rate in force on those days is {value}% per annum, set on {on}.",
        "values": "Values in the period: {}.",
        "values_range": "Values in the period: {count}; lowest {low} ({low_on}), highest {high} "
        "({high_on}).",
        "rub": "{} RUB",
        "percent": "{}%",
        "thinned": "The Bank of Russia's answer did not fit whole: {kept} of its {count} values "
        "are here (the first, the last, the lowest, the highest and some between), {omitted} "
        "left out.",
        "key_rate_period": "From {first} to {last}: {v1}% → {v2}% per annum.",
        "key_rate": "Bank of Russia key rate on {}: {}% per annum.",
        "key_rate_changes": "Changes in the period:",
        "key_rate_item": "- from {}: {}%",
        "no_key_rate": "The Bank of Russia published no key rate in this period.",
        "cbr_unread": "The Bank of Russia data arrived, but no rates could be read from it.",
        "cbr_news": "News of the Bank of Russia: {}.",
        "no_news": "No news was found for this request.",
        "news": "Finance news found: {}; the top one is “{}”.",
        "news_source": "Tavily — finance news search",
        "failed": "Could not get the data ({}): {}.",
        "unread": "The documents could not be read ({}), so this question cannot be answered "
        "from them.",
        "unread_partly": "The documents could not be read in full ({}): the answer rests on "
        "the passages the search found.",
        "clarify": "To answer precisely, please clarify:",
        "thanks": "You are welcome! Ask any time.",
        "hello": "Hello! I am Visior: I answer questions about your documents and the "
        "corporate knowledge base, and give Bank of Russia rates, the key rate and finance "
        "news. How can I help?",
    },
}
NOT_FOUND = f"{_TEXT[RU]['not_found']}\n\n{_TEXT[RU]['marker']}"
NOT_FOUND_EN = f"{_TEXT[EN]['not_found']}\n\n{_TEXT[EN]['marker']}"


_NAMED = re.compile(r"%\w|(?<![\w%])\d*[A-Za-z][\w.+#%-]*[A-Za-z0-9+#]")
"""A name-like word: a ``%`` specifier, or letters and digits that hold a Latin letter, whole
("2FA", not its "FA", which many words contain)."""


_HYPHEN_FORMS = str.maketrans({"\u2010": "-", "\u2011": "-", "\u00ad": None})
"""Unicode hyphens as the ASCII one, and no soft hyphens (PDF text keeps them inside words)."""


_LATIN = frozenset(string.ascii_lowercase)
_WORD_CHARS = _LATIN | frozenset(string.digits)
"""What a word of text is made of when names are looked for in it (`_found`)."""


_ANSWER_LANGUAGE_NAMES = frozenset({"english", "russian"})
"""The languages answers are written in: a question asking for one ("… in English?") names
no topic."""


def asked(turn: str) -> str:
    """The question of a user turn, without the sections listed after it (`turn_parts`)."""
    return turn_parts(turn)[0].strip()


def _system(messages: Sequence[ChatMessage]) -> str:
    """The system prompt of a conversation: its system messages."""
    return "\n\n".join(m.content for m in messages if m.role == "system")


def _notes(messages: Sequence[ChatMessage]) -> list[str]:
    """The loop's own notes in a conversation (the language note among them)."""
    return [m.content for m in messages if is_service_note(m)]


def named_terms(question: str, *, proper_names: bool = True) -> list[str]:
    """The names a question is about, which an answer's text must contain. In a Russian
    question (`question_language`) every Latin-script word of three letters or more
    (PostgreSQL, rpmbuild, snap) or in capitals (RPM); in an English one the words written
    as names or identifiers: a capital inside the sentence (Redis, Kubernetes; only with
    `proper_names`), capitals (TCP), digits, ``_``, ``%``, ``.``."""
    question = asked(question).translate(_HYPHEN_FORMS)
    lang = question_language(question)
    out = []
    for i, m in enumerate(_NAMED.finditer(question)):
        w = m.group(0).rstrip(".")
        if lang == RU:
            keep = len(w) >= 3 or (w.isupper() and len(w) >= 2)
        else:
            first = i == 0 or question[: m.start()].rstrip().endswith((".", "?", "!", ":"))
            keep = (
                (proper_names and w[0].isupper() and not first and len(w) >= 2)
                or (w.isupper() and len(w) >= 2)
                or any(c.isdigit() or c in "_%." for c in w)
            )
        if keep and w.lower() not in out and w.lower() not in _ANSWER_LANGUAGE_NAMES:
            out.append(w.lower())
    return out


def _plain(text: str) -> str:
    """`text` as names are looked for in it: lower case, every hyphen the ASCII one."""
    return text.translate(_HYPHEN_FORMS).lower()


def _word(term: str) -> str:
    """A pattern matching `term` as a whole word of text (`_found`)."""
    word = re.escape(term)
    ending = ""
    if term[-1] in _LATIN:
        if term.endswith("y"):
            word = f"(?:{word}|{re.escape(term[:-1])}ies)"
        ending = "(?:e?s|[0-9]+)?"
    before = "(?<![a-z0-9])" if term[0] in _WORD_CHARS else ""
    after = "(?![a-z0-9])" if term[-1] in _WORD_CHARS else ""
    return before + word + ending + after


def _found(term: str, plain: str, joined: str) -> bool:
    """Whether `term` occurs as a whole word in the text read (`plain`, and `joined`: the same
    without hyphens): as written, or with its hyphens dropped or added ("Wi-Fi" in "WiFi",
    "email" in "e-mail"; not "A-B" in "table"). Only Latin letters and digits make up a word:
    a name inside another is not found ("Git" in "digit", "Excel" in "excellent", "AWS" in
    "laws"), one beside any other character is ("Kafka's", "Kafka-based", and the Cyrillic
    ending Russian text gives a Latin name: "Kafka-кластер", "SAPом"). A term ending in a
    letter is found with an English plural ending too ("APIs", "boxes", "proxies") or a
    version number ("python3"). The terms are Latin-script names (`named_terms`), so the
    inflection of Russian words is not at stake: no Cyrillic word is a term."""
    if re.search(_word(term), plain):
        return True
    return re.search(_word(term.replace("-", "")), joined) is not None


def missing_terms(question: str, texts: Sequence[str]) -> list[str]:
    """The question's named terms that occur in none of `texts` (`_found`: in any case, with
    or without hyphens). Over Russian text an English question's capitalised words are no
    names to look for: they are translated there ("Two-Factor Authentication"), while
    identifiers and capitals stay."""
    read = "\n".join(texts)
    cross = question_language(asked(question)) == EN and text_language(read) == RU
    plain = _plain(read)
    joined = plain.replace("-", "")
    terms = named_terms(question, proper_names=not cross)
    return [t for t in terms if not _found(t, plain, joined)]


def not_found(lang: str) -> str:
    """The answer when the documents hold nothing for the question."""
    return NOT_FOUND_EN if lang == EN else NOT_FOUND


class SentenceScorer:
    """BM25 of a sentence for the question's words, over a pool of sentences: a word most
    sentences share (the product's name) weighs little, a repeated rare one much.
    `scored_as`: the text a sentence is scored as, when not its own (`headed_sentences`)."""

    def __init__(
        self, question: str, pool: Sequence[str], scored_as: Mapping[str, str] | None = None
    ) -> None:
        self._as = dict(scored_as or {})
        self._bm25 = Bm25(search_terms(question), [search_terms(self._as.get(s, s)) for s in pool])

    def __call__(self, sentence: str) -> float:
        return self._bm25(search_terms(self._as.get(sentence, sentence)))


_MD_HEADING = re.compile(r"#{1,6}(?:\s+|$)")
_RULE = re.compile(r"(?:[-=*_][ \t]*){3,}")
"""A setext heading's underline or a thematic break: no text of its own."""
_LIST_ITEM = re.compile(r"(?:[-*+•]|\d{1,3}[.)])\s+")
"""The marker opening a list item: the item is a unit of its own, its marker kept."""
_NUMBERED = re.compile(r"(?:\d{1,3}|[A-ZА-ЯЁ](?=\.\d))(?:\.\d{1,3})*\.?\s+\S")
"""A section's number opening a line ("6. Плановые работы", "4.4.1 Targets", "A.1 Shared")."""
_HEADING_START = re.compile(r"[\"'«“(\[]?[A-ZА-ЯЁ][a-zа-яё]|" + _NUMBERED.pattern)
"""How a heading opens: a capitalised word or a section's number (a line of code or data,
"BIN = /usr/bin", "DEBUILD_OPTS=…", is no heading)."""
_BODY_START = re.compile(r"[\"'«“(\[]?[A-ZА-ЯЁ][a-zа-яё]|[-*+•]\s")
"""A line opening body text after a heading: a capitalised word (not a name in capitals,
which a wrapped line can start with), or a bullet."""
_SENTENCE_CLOSED = re.compile(r"[.!?…:;,][\"'»”)\]]*(?:\s*(?:\d{1,3}|[⁰¹²³⁴⁵⁶⁷⁸⁹]+))?$")
"""How a line ends that is no heading (a footnote's number may follow: PDF text)."""
_SENTENCE_ENDED = re.compile(r"[.!?…:][\"'»”)\]]*(?:\s*(?:\d{1,3}|[⁰¹²³⁴⁵⁶⁷⁸⁹]+))?$")
"""How a line ends after which a heading may stand."""
MAX_HEADING_WORDS = 12
"""A heading without a Markdown mark is at most this many words long."""
_VALUE = re.compile(r"\d")
"""A digit in a line without a section's number: a value ("port 8080", "01:00"), body text."""
_RUNNING = re.compile(r"(?:^\S+\s+\d{1,3}|\s\d{1,4}\s*/\s*\d{1,4})$")
"""A chapter's number ("Chapter 1", "Глава 2") or a page's ("Guide 3 / 57") ending a line:
a heading or a page header, not a value."""


def _heading_like(raw: str) -> bool:
    """Whether a line may be a heading by its own look: short, opening with a capital or a
    number, not ending as a sentence does, and not wrapped (PDF text keeps the space before
    a line it wraps). A line without a section's number that holds a digit (`_VALUE`, but
    not `_RUNNING`) states a value ("The default port is 8080"): body text, no heading."""
    line = raw.strip()
    return (
        not raw[-1:].isspace()
        and len(line.split()) <= MAX_HEADING_WORDS
        and _HEADING_START.match(line) is not None
        and _SENTENCE_CLOSED.search(line) is None
        and not line.endswith(("-", "\u2010", "\u00ad"))
        and (_NUMBERED.match(line) is not None or not _VALUE.search(_RUNNING.sub("", line)))
    )


def _number_shape(line: str) -> str | None:
    """The shape of the section's number opening `line` (`_NUMBERED`), its digits and letter
    made 0 ("1." and "2." are "0.", "4.4.1" is "0.0.0"), or None without one."""
    if _NUMBERED.match(line) is None:
        return None
    return re.sub(r"\d+|[A-ZА-ЯЁ]", "0", line.split(None, 1)[0])


def _list_items(lines: Sequence[str], kept: Sequence[int]) -> set[int]:
    """The numbered lines of `kept` that are items of a list, never headings: the line next
    to one (blank lines aside) opens with a number of the same shape ("1." beside "2.")."""
    shapes = [_number_shape(lines[i].strip()) for i in kept]
    beside = [None, *shapes, None]
    return {i for k, i in enumerate(kept) if shapes[k] and shapes[k] in (beside[k], beside[k + 2])}


def _units(text: str) -> list[tuple[str, bool]]:
    """The sentences and headings of `text`, in order, each with whether it is a heading.

    Sentences are split (`split_sentences`) within a paragraph, and within a list item,
    whose marker opens its first sentence ("6." is no sentence of its own). A blank line
    ends a paragraph unless the text after it goes on in lower case (a page break inside a
    sentence). A heading is a Markdown heading ("## Ports", its text), or a short line
    that does not end as a sentence does, standing alone: at the start of a paragraph or
    after a sentence ended or another heading, and before body text (`_BODY_START`) or
    another heading ("6. Плановые работы", a page header); a numbered one may end the
    text. No heading follows a line ending in ":" (what it introduces is body: steps,
    values), and a numbered line beside another of the same shape is a list's item
    (`_list_items`), quoted. A heading is never joined to the sentence after it."""
    lines = [line.rstrip("\r") for line in text.split("\n")]
    kept = [i for i, line in enumerate(lines) if line.strip() and not _RULE.fullmatch(line.strip())]
    md = {i for i in kept if _MD_HEADING.match(lines[i].strip())}
    items = _list_items(lines, kept)
    introduced = {i for k, i in enumerate(kept) if k and lines[kept[k - 1]].strip().endswith(":")}
    # Whether a line could head what follows it, from the last line back.
    heads: dict[int, bool] = {}
    following: int | None = None
    for i in reversed(kept):
        line = lines[i].strip()
        if i in md:
            heads[i] = True
        elif i in items or i in introduced or not _heading_like(lines[i]):
            heads[i] = False
        elif following is None:
            heads[i] = _NUMBERED.match(line) is not None
        else:
            heads[i] = heads[following] or bool(_BODY_START.match(lines[following].strip()))
        following = i
    out: list[tuple[str, bool]] = []
    run: list[str] = []

    def flush() -> None:
        joined = " ".join(run)
        run.clear()
        marker = _LIST_ITEM.match(joined)
        head = marker.group(0).strip() + " " if marker else ""
        found = split_sentences(joined[marker.end() :] if marker else joined)
        if found:
            out.extend([(head + found[0], False), *((s, False) for s in found[1:])])
        elif head:
            out.append((head.strip(), False))

    previous = -1
    prev_heading = False
    for i in kept:
        line = lines[i].strip()
        between = [lines[j].strip() for j in range(previous + 1, i)]
        after_break = previous < 0 or prev_heading or any(_RULE.fullmatch(b) for b in between)
        if not after_break and any(not b for b in between):
            # A blank line ends the paragraph unless its sentence goes on after it, or what
            # a colon introduced follows it (code, data: no sentence of its own).
            last = lines[previous].strip()
            if line[:1].islower():
                after_break = _SENTENCE_ENDED.search(last) is not None
            else:
                after_break = not last.endswith(":") or bool(
                    _BODY_START.match(line) or _LIST_ITEM.match(line) or i in md
                )
        opens = after_break or (bool(run) and _SENTENCE_ENDED.search(run[-1]) is not None)
        if heads[i] and (opens or i in md or _NUMBERED.match(line)):
            if run:
                flush()
            out.append((_MD_HEADING.sub("", line, count=1).rstrip("#").strip() or line, True))
            prev_heading = True
        else:
            if run and (after_break or _LIST_ITEM.match(line)):
                flush()
            run.append(line)
            prev_heading = False
        previous = i
    if run:
        flush()
    return out


def headed_sentences(text: str) -> list[tuple[str, str]]:
    """The sentences of `text` a quote is made of (`_units`), its headings left out unless it
    holds nothing else, each with the text it is scored as: the first sentence under a
    heading with the heading's words too (they say what it is about), quoted without them."""
    units = _units(text)
    if all(heading for _, heading in units):
        return [(s, s) for s, _ in units]
    out, above = [], ""
    for s, heading in units:
        if heading:
            above = s
        else:
            out.append((s, f"{above} {s}" if above else s))
            above = ""
    return out


def quotable_sentences(text: str) -> list[str]:
    """The sentences of `text` a quote is made of (`headed_sentences`)."""
    return [s for s, _ in headed_sentences(text)]


def _scored_as(pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Each sentence's text to score (the first place it occurs decides), where not its own."""
    return {s: words for s, words in reversed(pairs) if words != s}


def best_sentences(
    text: str,
    question: str,
    limit: int = MAX_QUOTED_SENTENCES,
    scorer: SentenceScorer | None = None,
) -> list[str]:
    """The sentences of `text` (`quotable_sentences`) that match `question` best, in
    document order (the first sentence when none shares a word with it). `scorer` weighs
    words over a wider pool."""
    pairs = headed_sentences(text)
    sentences = [s for s, _ in pairs]
    score = scorer or SentenceScorer(question, sentences, _scored_as(pairs))
    scores = [score(s) for s in sentences]
    ranked = sorted(range(len(sentences)), key=lambda i: (-scores[i], i))[:limit]
    return [sentences[i] for i in sorted(ranked) if scores[i] > 0] or sentences[:1]


def answer_language(question: str, system: str = "", notes: Sequence[str] = ()) -> str:
    """The language the loop's language note (among `notes`, its service notes: it carries the
    request's answer_language), else the system prompt, asks for; else the one the question is
    asked in (`question_language`; agent.md §8: Russian by default)."""
    if noted := noted_language(notes):
        return noted
    instructions = strip_delimited(system)
    if _ASKS_ENGLISH.search(instructions):
        return EN
    if _ASKS_RUSSIAN.search(instructions):
        return RU
    return question_language(asked(question))


@dataclass(frozen=True)
class Reading:
    """Text the responder quotes from, and where it comes from."""

    doc_id: str
    title: str
    text: str
    page_start: int
    page_end: int
    page_count: int = 0
    """Pages of a whole loaded document (its text carries no page boundaries)."""


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _where(r: Reading, t: dict[str, str]) -> str:
    if r.page_start:
        if r.page_end and r.page_end != r.page_start:
            return t["pages_range"].format(r.page_start, r.page_end)
        return t["pages_one"].format(r.page_start)
    return t["pages_count"].format(r.page_count) if r.page_count else ""


def _readings_from_tool(content: ToolContent) -> list[Reading]:
    """The text a read tool returned: one reading per delimited block when each block names
    its own pages (read_doc_pages: a block a page), so a quote cites the page it is on; else
    one reading of all the text over the result's pages."""
    texts = [b for b in content.texts if b.text.strip()]
    if not texts:
        return []
    r = content.result
    first = texts[0].attrs
    doc_id = str(r.get("doc_id") or r.get("document_id") or first.get("doc_id", ""))
    title = str(r.get("title") or "")
    pages = [parse_pages(b.attrs.get("pages", "")) for b in texts]
    if len(texts) > 1 and all(start for start, _ in pages):
        return [
            Reading(doc_id, title, b.text, start, end)
            for b, (start, end) in zip(texts, pages, strict=True)
        ]
    start, end = _int(r.get("page_start")), _int(r.get("page_end"))
    if not start:
        start, end = pages[0]
    return [Reading(doc_id, title, "\n\n".join(b.text for b in texts), start, end or start)]


def _readings_from_blocks(blocks: Sequence[DelimitedText]) -> list[Reading]:
    out = []
    for b in blocks:
        if b.text.strip():
            start, end = parse_pages(b.attrs.get("pages", ""))
            doc_id = b.attrs.get("doc_id", "")
            out.append(Reading(doc_id, "", b.text, start, end))
    return out


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _number(value: Any, lang: str, decimals: int = 0) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    text = f"{number:.4f}".rstrip("0")
    whole, _, frac = text.partition(".")
    frac = frac.ljust(decimals, "0")
    text = f"{whole}.{frac}" if frac else whole
    return text.replace(".", ",") if lang == RU else text


def _date(value: Any, lang: str) -> str:
    text = str(value or "")
    m = re.match(r"(\d{4})-(\d{2})-(\d{2})", text)
    if m is None:
        return text
    return f"{m.group(3)}.{m.group(2)}.{m.group(1)}" if lang == RU else m.group(0)


def _unwrapped(value: object) -> str:
    """A result's field as its reader shows it: the text itself, never the EXTERNAL markers
    ToolsProxy delimits an outside service's headline with (fill_placeholders unwraps those
    it moved out of the header; this covers one still wrapped in place)."""
    return unwrap_untrusted(str(value or ""))


def _link(title: str, url: str) -> str:
    label = _unwrapped(title).replace("[", "(").replace("]", ")")
    return f"[{label}]({url.replace(' ', '%20').replace(')', '%29')})" if url else label


@dataclass
class _Answer:
    """The parts of the answer as they are gathered."""

    summary: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    quoted: bool = False
    conclusion: int | None = None
    """Which summary paragraph is the conclusion (written first, marked as such)."""

    def conclude(self, text: str) -> None:
        if self.conclusion is None:
            self.conclusion = len(self.summary)
        self.summary.append(text)

    def source(self, line: str) -> None:
        if line not in self.sources:
            self.sources.append(line)

    @property
    def empty(self) -> bool:
        return not (self.summary or self.details)


@dataclass
class _Results:
    """The tool results of the conversation, by what they hold."""

    documents: list[Reading] = field(default_factory=list)
    hits: list[Reading] = field(default_factory=list)
    kb: list[Reading] | None = None
    searched: bool = False
    data: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)
    """Why each failed read of a section failed (its error message, else its code)."""


def _hit_readings(result: dict[str, Any], texts: Sequence[DelimitedText]) -> list[Reading]:
    hits = _dicts(result.get("hits"))
    if not hits and not result:  # the header was cut to the budget: the texts remain
        return _readings_from_blocks(texts)
    out = []
    for h in hits:
        text = str(h.get("text") or h.get("snippet") or "")
        if text.strip():
            doc_id = str(h.get("doc_id") or result.get("doc_id") or "")
            title = str(h.get("title") or result.get("title") or "")
            start, end = _int(h.get("page_start")), _int(h.get("page_end"))
            out.append(Reading(doc_id, title, text, start, end or start))
    return out


def _loaded_documents(result: dict[str, Any], texts: Sequence[DelimitedText]) -> list[Reading]:
    docs = _dicts(result.get("documents"))
    if not docs and not result:
        return _readings_from_blocks(texts)
    out = []
    for d in docs:
        text = str(d.get("content") or "")
        if text.strip():
            doc_id = str(d.get("document_id") or d.get("doc_id") or "")
            out.append(Reading(doc_id, str(d.get("title") or ""), text, 0, 0, _int(d.get("pages"))))
    return out


def _text_only(texts: Sequence[DelimitedText]) -> dict[str, Any]:
    """A data result whose header was cut to the budget (`render_result`): its texts remain,
    with the source their markers name."""
    blocks = [b for b in texts if b.text.strip()]
    if not blocks:
        return {}
    source = next((b.attrs["source"] for b in blocks if b.attrs.get("source")), "")
    return {"text": "\n".join(b.text for b in blocks), **({"source": source} if source else {})}


def gather(messages: Sequence[ChatMessage]) -> _Results:
    """Every tool result of the conversation, sorted by kind."""
    out = _Results()
    for m in messages:
        if m.role != "tool":
            continue
        content = parse_tool_content(m.content)
        if content is None:
            continue
        name = content.name or m.name
        if not content.ok:
            why = content.error_message or content.error_code
            if name in READ_TOOLS:
                out.unread.append(why)
            else:
                out.failures.append((name, why))
            continue
        result = fill_placeholders(content.result, content.texts)
        if name == LOAD_DOCUMENTS_FULL:
            out.documents += _loaded_documents(result, content.texts)
        elif name in (SEARCH_USER_DOCUMENTS, DOC_LOCAL_SEARCH):
            out.searched = True
            out.hits += _hit_readings(result, content.texts)
        elif name == SEARCH_GENERAL_KB:
            out.kb = (out.kb or []) + _hit_readings(result, content.texts)
        elif name in (FETCH_CBR_DATA, FETCH_FINANCE_NEWS):
            out.data.append((name, result or _text_only(content.texts)))
        else:
            out.documents += _readings_from_tool(content)
    return out


def _other_language(question: str, readings: Sequence[Reading]) -> bool:
    """Whether `question` is asked in another language than the text read is written in."""
    return question_language(question) != text_language("\n".join(r.text for r in readings))


class _Composer:
    """Writes the answer to one question in one language."""

    def __init__(self, question: str, lang: str) -> None:
        self.question = asked(question)
        """The question alone: the sections listed after it are no words of it."""
        self._turn = question
        """The question's whole turn, the sections listed with it included (`passages`)."""
        self.lang = lang
        self.t = _TEXT[lang]
        self.answer = _Answer()
        self._seen: set[str] = set()
        self._demo = False

    # --- document text ----------------------------------------------------------------

    def passages(
        self, readings: Sequence[Reading], *, kb: bool = False, also_read: Sequence[str] = ()
    ) -> None:
        """Quote the best sentences of the best few readings, conclusion first; `also_read`:
        more text the question's names may occur in (not quoted)."""
        scorer, scored = self._ranked(readings, self.question)
        if (
            scored
            and max(x[0] for x in scored) <= 0
            and self._turn != self.question
            and _other_language(self.question, readings)
        ):
            # No sentence shares a word with a question asked in the other language: the
            # summaries of the sections the search found for it, listed with it, say which
            # sentences it matched. In the text's own language no shared word means no answer.
            scorer, scored = self._ranked(readings, self._turn)
        if not scored:
            return
        chosen = sorted(scored, key=lambda x: (-x[0], x[1]))[:MAX_PASSAGES]
        top = chosen[0]
        # A question may name the document by its title ("… the Maintainers' Guide"), which
        # its pages rarely repeat: the titles of what was read count as read.
        absent = missing_terms(
            self.question,
            [*(r.text for r in readings), *(r.title for r in readings), *also_read],
        )
        if absent:
            # The question names something the text read never mentions: whatever sentence
            # scores best, it does not answer the question.
            names = ", ".join(f"«{t}»" if self.lang == RU else f"“{t}”" for t in absent[:3])
            self.answer.summary.append(self.t["missing_term"].format(names))
        elif top[0] > 0:
            # Passages sharing no word with the question are not worth quoting beside it.
            chosen = [c for c in chosen if c[0] > 0]
            self.answer.conclude(max(top[3], key=scorer))
        else:
            self.answer.summary.append(self.t["no_match"])
        if kb:
            self.answer.summary.append(self.t["kb_note"])
        for _, _, r, quotes in sorted(chosen, key=lambda x: x[1]):
            self._seen.update(quotes)
            where = _where(r, self.t)
            title = r.title or r.doc_id
            head = self.t["from_kb" if kb else "from_doc"].format(
                title, f" ({where})" if where else ""
            )
            self.answer.details.append(head + "\n\n" + "\n".join(f"> {s}" for s in quotes))
            name = f"«{r.title}» — {r.doc_id}" if r.title and r.title != r.doc_id else r.doc_id
            if self.lang == EN and r.title and r.title != r.doc_id:
                name = f"“{r.title}” — {r.doc_id}"
            prefix = self.t["kb_source"] if kb else ""
            self.answer.source(f"- {prefix}{name}{', ' + where if where else ''}")
        self.answer.quoted = True

    def nothing(self, key: str) -> None:
        self.answer.summary.append(self.t[key])

    def unread(self, why: str) -> None:
        """Say the documents could not be read (`why`: the last failed read's error), and
        what the answer rests on instead: the passages quoted, if any."""
        key = "unread_partly" if self.answer.quoted else "unread"
        self.answer.summary.append(self.t[key].format(why.rstrip(".")))

    # --- external data ----------------------------------------------------------------

    def _ranked(
        self, readings: Sequence[Reading], words: str
    ) -> tuple[SentenceScorer, list[tuple[float, int, Reading, list[str]]]]:
        """Each reading's best sentences not quoted yet, scored for `words`."""
        pairs = [x for r in readings for x in headed_sentences(r.text)]
        scorer = SentenceScorer(words, [s for s, _ in pairs], _scored_as(pairs))
        scored = []
        for i, r in enumerate(readings):
            quotes = [
                x for x in best_sentences(r.text, words, scorer=scorer) if x not in self._seen
            ]
            if quotes:
                scored.append((max(scorer(x) for x in quotes), i, r, quotes))
        return scorer, scored

    def cbr(self, result: dict[str, Any]) -> None:
        """Bank of Russia data: rates, rate dynamics, key rate or news, footnoted."""
        url = str(result.get("source_url") or "")
        demo = self._demo = _is_demo(result)
        footnote = self.t["footnote"].format(self.t["cbr_demo" if demo else "cbr"])
        mode = str(result.get("mode") or "")
        if mode == "currency":
            mode = "dynamic" if result.get("series") == "dynamic" else "on_date"
        handler: dict[str, Callable[[dict[str, Any]], list[str]]] = {
            "on_date": self._rates,
            "dynamic": self._dynamic,
            "key_rate": self._key_rate,
            "news": self._cbr_news,
        }
        if mode in handler:
            lines = handler[mode](result)
        else:  # the header was cut, or a mode this responder does not know
            text = str(result.get("text") or "")
            lines = [" ".join(text.split())] if text.strip() else []
        if not lines:  # nothing readable: say so, not that the documents lack an answer
            lines = [self.t["cbr_unread"]]
        self.answer.conclude(f"{lines[0]} {footnote}")
        if demo:
            self.answer.summary.append(self.t["demo"].format(url or "?"))
        self.answer.details.extend(lines[1:])
        source = str(result.get("source") or "Bank of Russia")
        labelled = any(w in source.lower() for w in _DEMO_WORDS)
        suffix = self.t["demo_suffix"] if demo and not labelled else ""
        self.answer.source(f"- {source}{suffix}{' — ' + url if url else ''}")

    def _wanted(self, codes: Sequence[str]) -> list[str]:
        named = {w.upper() for w in re.findall(r"\b[A-Za-z]{3}\b", self.question)}
        named |= set(named_currencies(self.question))
        wanted = [c for c in codes if c in named]
        if wanted:
            return wanted
        if len(codes) <= MAX_RATES:
            return list(codes)
        return [c for c in DEFAULT_CURRENCIES if c in codes] or list(codes[:MAX_RATES])

    def _rates(self, result: dict[str, Any]) -> list[str]:
        items = [i for i in _dicts(result.get("items")) if i.get("value") is not None]
        if not items:
            return [self.t["no_rates"]]
        by_code = {str(i.get("currency") or ""): i for i in items}
        wanted = self._wanted(list(by_code))
        on = _date(result.get("date") or result.get("published"), self.lang)
        lines = []
        for code in wanted[:MAX_LISTED]:
            item = by_code[code]
            lines.append(
                self.t["rate"].format(
                    code=code,
                    date=on,
                    value=_number(item.get("value"), self.lang, 2),
                    nominal=_int(item.get("nominal")) or 1,
                )
            )
        summary = " ".join(lines[:MAX_RATES])
        details = lines[MAX_RATES:]
        if result.get("published") and not self._demo:  # a stand-in's rates are not official
            details.append(self.t["rates_set"].format(_date(result["published"], self.lang)))
        return [summary, *details]

    def _dynamic(self, result: dict[str, Any]) -> list[str]:
        code = str(result.get("currency") or "")
        items = [i for i in _dicts(result.get("items")) if i.get("value") is not None]
        if not items:
            return [self.t["no_dynamic"].format(code)]
        first, last = items[0], items[-1]
        if result.get("set_before_range") is True:
            # No rate set within the asked range: the one in force over it, set before it.
            return [self.t["dynamic_in_force"].format(
                code=code, on=_date(last.get("date"), self.lang),
                first=_date(result.get("date_from"), self.lang),
                last=_date(result.get("date_to"), self.lang),
                value=_number(last.get("value"), self.lang, 2),
                nominal=_int(last.get("nominal")) or 1,
            )]  # fmt: skip
        summary = self.t["dynamic"].format(
            code=code,
            first=_date(first.get("date"), self.lang),
            last=_date(last.get("date"), self.lang),
            v1=_number(first.get("value"), self.lang, 2),
            v2=_number(last.get("value"), self.lang, 2),
            nominal=_int(last.get("nominal")) or 1,
        )
        facts, thinned = self._series(result, items, "rub", 2)
        listed = [
            self.t["dynamic_item"].format(
                _date(i.get("date"), self.lang), _number(i.get("value"), self.lang, 2)
            )
            for i in items[-MAX_LISTED:]
        ]
        return [f"{summary} {facts}", *thinned, "\n".join(listed)]

    def _series(
        self, result: dict[str, Any], items: list[dict[str, Any]], unit: str, decimals: int
    ) -> tuple[str, list[str]]:
        """How many values the period has, its lowest and highest (with their dates), and,
        when the result was thinned to the token budget (`items_omitted`), how many of them
        it lists."""
        omitted = max(_int(result.get("items_omitted")), 0)
        count = len(items) + omitted
        thinned = []
        if omitted:
            thinned.append(self.t["thinned"].format(kept=len(items), count=count, omitted=omitted))
        numbers = [(v, i) for i in items if (v := series_value(i)) is not None]
        if len(numbers) < 3:
            return self.t["values"].format(count), thinned
        low = min(numbers, key=lambda x: x[0])[1]
        high = max(numbers, key=lambda x: x[0])[1]
        facts = self.t["values_range"].format(
            count=count,
            low=self.t[unit].format(_number(low.get("value"), self.lang, decimals)),
            low_on=_date(low.get("date"), self.lang),
            high=self.t[unit].format(_number(high.get("value"), self.lang, decimals)),
            high_on=_date(high.get("date"), self.lang),
        )
        return facts, thinned

    def _key_rate(self, result: dict[str, Any]) -> list[str]:
        items = [i for i in _dicts(result.get("items")) if i.get("value") is not None]
        latest = result.get("latest") if isinstance(result.get("latest"), dict) else None
        latest = latest or (items[-1] if items else None)
        if not latest or latest.get("value") is None:
            return [self.t["no_key_rate"]]
        if result.get("set_before_range") is True:
            return [self.t["key_rate_in_force"].format(
                first=_date(result.get("date_from"), self.lang),
                last=_date(result.get("date_to"), self.lang),
                on=_date(latest.get("date"), self.lang),
                value=_number(latest.get("value"), self.lang),
            )]  # fmt: skip
        summary = self.t["key_rate"].format(
            _date(latest.get("date"), self.lang), _number(latest.get("value"), self.lang)
        )
        period: list[str] = []
        if len(items) > 1:  # a series over a range: its first and last values, how many
            first, last = items[0], items[-1]
            facts, thinned = self._series(result, items, "percent", 0)
            line = self.t["key_rate_period"].format(
                first=_date(first.get("date"), self.lang),
                last=_date(last.get("date"), self.lang),
                v1=_number(first.get("value"), self.lang),
                v2=_number(last.get("value"), self.lang),
            )
            period = [f"{line} {facts}", *thinned]
        changes: list[dict[str, Any]] = []
        for i in items:
            if not changes or changes[-1].get("value") != i.get("value"):
                changes.append(i)
        if len(changes) < 2:
            return [summary, *period]
        listed = [
            self.t["key_rate_item"].format(
                _date(c.get("date"), self.lang), _number(c.get("value"), self.lang)
            )
            for c in changes[-MAX_LISTED:]
        ]
        return [summary, *period, self.t["key_rate_changes"] + "\n" + "\n".join(listed)]

    def _cbr_news(self, result: dict[str, Any]) -> list[str]:
        items = _dicts(result.get("items"))
        if not items:
            return [self.t["no_news"]]
        listed = [
            f"- {_link(str(i.get('title') or ''), str(i.get('url') or ''))}"
            f"{' — ' + _date(i.get('date'), self.lang) if i.get('date') else ''}"
            for i in items[:MAX_LISTED]
        ]
        return [self.t["cbr_news"].format(len(items)), "\n".join(listed)]

    def news(self, result: dict[str, Any]) -> None:
        """Finance news: the latest headline first, then each with its link and date."""
        items = [i for i in _dicts(result.get("results")) if i.get("url")]
        source = str(result.get("source") or "Tavily")
        footnote = self.t["footnote"].format(source)
        if not items:
            self.answer.summary.append(f"{self.t['no_news']} {footnote}")
            return
        self.answer.conclude(
            f"{self.t['news'].format(len(items), _unwrapped(items[0].get('title')))} {footnote}"
        )
        listed = []
        for i in items[:MAX_LISTED]:
            line = f"- {_link(str(i.get('title') or ''), str(i['url']))}"
            if i.get("published_at"):
                line += f" — {_date(i['published_at'], self.lang)}"
            snippet = " ".join(_unwrapped(i.get("snippet")).split())
            if snippet:
                if len(snippet) > MAX_SNIPPET_CHARS:
                    snippet = snippet[: MAX_SNIPPET_CHARS - 1].rstrip() + "…"
                line += f"\n  {snippet}"
            listed.append(line)
        self.answer.details.append("\n".join(listed))
        self.answer.source(f"- {self.t['news_source']}")

    # --- the whole ----------------------------------------------------------------------

    def failed(self, name: str, message: str) -> None:
        self.answer.summary.append(self.t["failed"].format(name, message.rstrip(".")))

    def text(self) -> str:
        a, t = self.answer, self.t
        summary = list(a.summary)
        if a.conclusion is not None:
            summary[a.conclusion] = t["summary"].format(summary[a.conclusion])
        # The conclusion comes first; notes on it (knowledge base, demo data) follow.
        if a.conclusion:
            summary.insert(0, summary.pop(a.conclusion))
        parts = ["\n\n".join(summary)]
        if a.details:
            parts.append(t["details"] + "\n\n" + "\n\n".join(a.details))
        if a.sources:
            parts.append(t["sources"] + "\n\n" + "\n".join(a.sources))
        parts.append(t["marker_docs" if a.quoted else "marker"])
        return "\n\n".join(parts)


def _is_demo(result: dict[str, Any]) -> bool:
    """Whether Bank of Russia data came from a demo stand-in, not cbr.ru itself: the result
    says so (`demo`), its source names a stand-in, or its URL is not on cbr.ru."""
    if result.get("demo") is True:
        return True
    source = f"{result.get('source') or ''} {result.get('source_url') or ''}".lower()
    if any(w in source for w in _DEMO_WORDS):
        return True
    url = str(result.get("source_url") or "")
    host = (urlsplit(url).hostname or "") if url else ""
    return bool(host) and not (host == "cbr.ru" or host.endswith(".cbr.ru"))


def clarification_questions(system: str) -> list[str]:
    """The questions the caller's instructions carry, in order: the Orchestrator's list
    (`listed_clarifications`), else the lines ending with "?"."""
    instructions = strip_delimited(system)
    if listed := listed_clarifications(instructions):
        return listed
    out = []
    for line in instructions.splitlines():
        text = _BULLET.sub("", line).strip()
        if text.endswith("?") and len(text) > 1:
            out.append(text)
    return out


def compose(question: str, messages: Sequence[ChatMessage], system: str = "") -> str:
    """The extractive answer to `question` from the tool results in `messages` (Markdown)."""
    lang = answer_language(question, system, _notes(messages))
    results = gather(messages)
    c = _Composer(question, lang)
    c.passages(results.documents + results.hits)
    if results.searched and not results.hits and not results.documents:
        c.nothing("nothing_docs")
    if results.kb is not None:
        c.passages(results.kb, kb=True)
        if not results.kb:
            c.nothing("nothing_kb")
    for name, result in results.data:
        if name == FETCH_CBR_DATA:
            c.cbr(result)
        else:
            c.news(result)
    for name, message in results.failures:
        c.failed(name, message)
    context = _readings_from_blocks(delimited_blocks(system, CONTEXT_KIND))
    if c.answer.empty and context:
        c.passages(context)
    if results.unread and not _has_read(messages):
        c.unread(results.unread[-1])
    if c.answer.empty:
        tried = any(m.role == "assistant" and m.tool_calls for m in messages)
        questions = clarification_questions(system)
        if questions:
            c.answer.summary.append(
                c.t["clarify"] + "\n\n" + "\n".join(f"- {q}" for q in questions)
            )
        elif tried or RAG_RULES in system:
            return not_found(lang)
        else:
            thanks = re.search(r"спасибо|благодар|thank", c.question, re.IGNORECASE)
            c.answer.summary.append(c.t["thanks" if thanks else "hello"])
    return c.text()


def _judged(messages: Sequence[ChatMessage]) -> tuple[str, list[Reading], list[str]] | None:
    """What `ungrounded_terms` judges by: the question, the readings of the document text
    read (tool results, context chunks) and every text that counts as read (those readings'
    texts and titles, the sections listed after the question, the caller's tool turns).
    None when nothing was read or when rates or news were fetched."""
    results = gather(messages)
    if results.data:
        return None
    readings = [*results.documents, *results.hits, *(results.kb or [])]
    readings += _readings_from_blocks(delimited_blocks(_system(messages), CONTEXT_KIND))
    if not readings:
        return None
    turn = _question(messages)
    texts = [r.text for r in readings] + [r.title for r in readings]
    texts.append(turn_parts(turn)[1])  # the sections listed
    texts += [
        b.text
        for m in messages
        if m.role == "user"
        for b in delimited_blocks(m.content, CALLER_TOOL_KIND)
    ]
    return turn, readings, texts


def ungrounded_terms(messages: Sequence[ChatMessage]) -> list[str]:
    """The names the question in `messages` is about (`named_terms`) that nothing read in
    them mentions: the rule by which the extractive responder says the documents do not
    answer, for any responder's answer. Empty when every name occurs, when no document text
    was read (nothing to judge by), or when rates or news were fetched (the answer is that
    data, not the documents)."""
    judged = _judged(messages)
    return [] if judged is None else missing_terms(judged[0], judged[2])


def answer_without_model(messages: Sequence[ChatMessage]) -> str:
    """What the service answers in place of a model's answer it withholds: the documents do
    not answer, naming what `ungrounded_terms` found missing, and the closest passages of
    everything read (the Markdown of the extractive responder)."""
    judged = _judged(messages)
    turn, readings = (judged[0], judged[1]) if judged else (_question(messages), [])
    lang = answer_language(turn, _system(messages), _notes(messages))
    c = _Composer(turn, lang)
    c.passages(readings, also_read=judged[2] if judged else ())
    return not_found(lang) if c.answer.empty else c.text()


def _has_read(messages: Sequence[ChatMessage]) -> bool:
    """Whether a tool result holds document text read (not searched or fetched) already."""
    for m in messages:
        if m.role != "tool":
            continue
        c = parse_tool_content(m.content)
        if c is None or not c.ok or c.name in _NOT_READING:
            continue
        if c.name == LOAD_DOCUMENTS_FULL or any(b.text.strip() for b in c.texts):
            return True
    return False


def _question(messages: Sequence[ChatMessage]) -> str:
    for m in reversed(messages):
        if m.role != "user" or is_service_note(m):
            continue
        if is_wrapped(m.content, CALLER_TOOL_KIND):
            continue
        return m.content
    return ""


def _tried(anchor: Anchor, asked: list[dict[str, Any]]) -> bool:
    return any(
        a.get("doc_id") == anchor.doc_id
        and (
            (anchor.anchor_chunk_id and a.get("anchor_chunk_id") == anchor.anchor_chunk_id)
            or (anchor.section_id and a.get("section_id") == anchor.section_id)
        )
        for a in asked
    )


def held(completion: Completion, stop: Sequence[str], max_tokens: int | None) -> Completion:
    """An answer held to the request's generation params as a runtime holds its own: it ends
    before the first of the `stop` sequences, and at `max_tokens` tokens (finish_reason
    "length"; None: the caller set none, and a quoting answer is not cut to the service's
    share)."""
    cut = before_stop(completion.content, stop)
    text = completion.content if cut is None else cut
    tokenizer = default_tokenizer()
    if max_tokens is not None and tokenizer.count(text) > max_tokens:
        return replace(
            completion, content=tokenizer.truncate(text, max_tokens), finish_reason=LENGTH
        )
    return completion if cut is None else replace(completion, content=text)


class ExtractiveRuntime:
    """A ChatRuntime that reads with tools and answers by quotation; no model involved."""

    name = EXTRACTIVE
    extractive = True

    async def complete(self, request: ChatRequest, *, timeout_s: float) -> Completion:
        """The next move: a tool call, or the answer."""
        return self._answer(request)

    async def stream(self, request: ChatRequest, *, timeout_s: float) -> AsyncIterator[StreamEvent]:
        """`complete`, with the answer handed out word by word first."""
        completion = self._answer(request)
        for piece in _PIECE.findall(completion.content):
            yield StreamDelta(piece)
        yield completion

    def _answer(self, request: ChatRequest) -> Completion:
        tools = request.tools if request.params.tool_choice != "none" else ()
        completion = self.respond(request.messages, tools)
        if completion.tool_calls:
            return completion
        return held(completion, request.params.stop, request.params.max_tokens)

    def respond(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> Completion:
        """What a model would answer to `messages` with `tools` offered."""
        system = _system(messages)
        reads: list[dict[str, Any]] = []
        calls = 0
        for m in messages:
            if m.role == "assistant":
                for call in m.tool_calls:
                    calls += 1
                    if call.name not in READ_TOOLS:
                        continue
                    try:
                        args = json.loads(call.arguments or "{}")
                    except json.JSONDecodeError:
                        args = {}
                    reads.append(args if isinstance(args, dict) else {})
        if not _has_read(messages) and tools and len(reads) < MAX_SECTIONS_TRIED:
            read = self._next_read(system, {t.name for t in tools}, reads, calls)
            if read is not None:
                return Completion("", (read,), finish_reason="tool_calls", model=EXTRACTIVE)
        answer = compose(_question(messages), messages, system)
        return Completion(answer, model=EXTRACTIVE)

    @staticmethod
    def _next_read(
        system: str, names: set[str], asked: list[dict[str, Any]], calls: int
    ) -> ToolCall | None:
        anchors = listed_anchors(system) or [
            Anchor(b.attrs.get("doc_id", ""), b.attrs.get("section_id", ""),
                   b.attrs.get("chunk_id", ""))
            for b in delimited_blocks(system, CONTEXT_KIND)
        ]  # fmt: skip
        for anchor in anchors:
            if not anchor.doc_id or _tried(anchor, asked):
                continue
            call_id = f"extractive-{calls + 1}"
            if anchor.anchor_chunk_id and READ_CHUNK_WINDOW in names:
                args = {"doc_id": anchor.doc_id, "anchor_chunk_id": anchor.anchor_chunk_id}
                return ToolCall(call_id, READ_CHUNK_WINDOW, json.dumps(args, ensure_ascii=False))
            if anchor.section_id and READ_DOC_SECTION in names:
                args = {"doc_id": anchor.doc_id, "section_id": anchor.section_id}
                return ToolCall(call_id, READ_DOC_SECTION, json.dumps(args, ensure_ascii=False))
        return None
