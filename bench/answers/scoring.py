"""Scoring of one answer: page among sources, key facts, "not in the documents", language."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_DASHES = dict.fromkeys(map(ord, "\u2010\u2011\u2012\u2013\u2014\u2212"), "-")
_QUOTES = dict.fromkeys(map(ord, "\u2018\u2019\u201a\u201b\u2032"), "'") | dict.fromkeys(
    map(ord, "\u201c\u201d\u201e\u201f\u00ab\u00bb\u2033"), '"'
)
_INVISIBLE = dict.fromkeys(map(ord, "\u00ad\u200b\u200c\u200d\u2060\ufeff\ufffe"), None)
_WS = re.compile(r"\s+")


def normalize(text: str) -> str:
    """Casefolded, NFKC, ё as е, one kind of dash and quote, no soft hyphens, single spaces.

    Markdown emphasis and code marks (`*`, `_` around words, backticks) are dropped, so
    "`dpkg-buildpackage -us -uc`" and "**dpkg-buildpackage** -us -uc" match the same fact.
    """
    t = unicodedata.normalize("NFKC", text).translate(_INVISIBLE)
    t = t.translate(_DASHES).translate(_QUOTES).casefold().replace("ё", "е")
    t = t.replace("`", "").replace("**", "")
    return _WS.sub(" ", t).strip()


def _fact_pattern(alternative: str) -> re.Pattern[str]:
    """The alternative as a literal; a word character at either end must not touch another.

    A trailing ``*`` makes it a prefix (a Russian stem: "подавля*" matches "подавляются").
    """
    alt = normalize(alternative)
    prefix = alt.endswith("*")
    alt = alt.rstrip("*").rstrip()
    head = r"(?<![\w])" if alt[:1].isalnum() or alt[:1] == "_" else ""
    tail = r"(?![\w])" if (alt[-1:].isalnum() or alt[-1:] == "_") and not prefix else ""
    return re.compile(head + re.escape(alt).replace(r"\ ", r"\s*") + tail)


def fact_present(alternatives: Sequence[str], answer: str) -> bool:
    """True when any alternative occurs in the answer (case-insensitive, whole words at ends)."""
    text = normalize(answer)
    return any(_fact_pattern(a).search(text) for a in alternatives if a.strip(" *"))


def facts_found(facts: Sequence[Sequence[str]], answer: str) -> int:
    """How many of the key facts (each a list of alternatives) the answer contains."""
    return sum(1 for f in facts if fact_present(f, answer))


def page_in_sources(
    sources: Iterable[Mapping[str, Any]], locations: Iterable[tuple[str, int]]
) -> bool:
    """True when a source names a gold document and its page range holds the gold page.

    `locations` are (doc_id, page) pairs: the gold page and its alternatives (the same answer
    in the other edition). A source's `page_end` below its `page_start` (or absent) counts as
    the single page `page_start`.
    """
    wanted = list(locations)
    for s in sources:
        start = int(s.get("page_start") or 0)
        end = max(int(s.get("page_end") or 0), start)
        for doc_id, page in wanted:
            if s.get("doc_id") == doc_id and start <= page <= end:
                return True
    return False


_NOT_FOUND = [
    re.compile(p)
    for p in (
        # English
        r"\b(documents?|passages?|sources?|context|text)( provided| found| available)?"
        r" (do|does|did)( not|n't) (answer|contain|mention|cover|say|describe|include)",
        r"\bnot (found|mentioned|covered|described|present|available|answered|addressed)"
        r" in the (provided |available |given |selected )?(documents?|passages?|sources?|context)",
        r"\bno (relevant )?(information|answer|mention|details?) (about|on|of|for|regarding|in)\b",
        r"\bnothing (was |is )?found\b",
        r"\b(could|can)( not|not|n't) (find|locate)\b",
        r"\bnot in the (provided |available |given |selected )?(documents?|passages?|sources?)",
        r"\b(do|does) not answer this\b",
        # Russian
        r"не нашл(ось|ось|ись|ась|ось)",
        r"не наш[её]л\w*|не найден\w*|не удалось найти",
        r"нет (никакой )?(информации|сведений|ответа|данных|упоминани)",
        r"(документ|фрагмент|источник|текст)\w* (прямо |явно )?(не|нет) ?"
        r"(содерж|упомина|отвеча|описыва|говор|привод|указ|сказано|ответа)",
        r"в (доступных |предоставленных |найденных |выбранных )?"
        r"(документ|фрагмент|источник)\w* (ничего )?(не|нет)\b",
        r"ответа (на (этот|ваш) вопрос )?(в (документ|фрагмент)\w* )?нет\b",
    )
]


def says_not_in_documents(answer: str) -> bool:
    """True when the answer says the documents do not hold the answer (Russian or English)."""
    text = normalize(answer)
    return any(p.search(text) for p in _NOT_FOUND)


_CODE_BLOCK = re.compile(r"```.*?(```|$)", re.S)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_URL = re.compile(r"\bhttps?://\S+|\b[\w.+-]+@[\w-]+\.[\w.]+")
_CYR = re.compile(r"[а-яё]", re.I)
_LAT = re.compile(r"[a-z]", re.I)


def cyrillic_ratio(text: str) -> float:
    """Share of Cyrillic among the letters, outside code blocks, code spans, URLs and emails."""
    t = _URL.sub(" ", _CODE_SPAN.sub(" ", _CODE_BLOCK.sub(" ", text)))
    cyr = len(_CYR.findall(t))
    lat = len(_LAT.findall(t))
    return cyr / (cyr + lat) if cyr + lat else 0.0


RU_THRESHOLD = 0.3
"""A text is Russian when at least this share of its letters is Cyrillic.

Russian answers quote commands, file names and untranslated English passages, so a Russian
answer's share is well below 1; an English answer's share is ~0 (a quoted Russian title at most).
"""


def detect_language(text: str) -> str:
    """ "ru" or "en" by the Cyrillic share of the letters (see `RU_THRESHOLD`); "" with no letters."""
    t = _URL.sub(" ", _CODE_SPAN.sub(" ", _CODE_BLOCK.sub(" ", text)))
    if not (_CYR.search(t) or _LAT.search(t)):
        return ""
    return "ru" if cyrillic_ratio(text) >= RU_THRESHOLD else "en"
