"""Sentences, words by their stems, and BM25 over them: how the mesh reads text outside the
index.

The chunker cuts, and the LLM service's extractive responder quotes, at
:func:`split_sentences`; extractive summaries and the orchestrator's mock take
:func:`sentences` (paragraph by paragraph). ToolsProxy's doc_local_search, the extractive
responder and the mock rank text with :func:`search_terms` and :class:`Bm25`; Retrieval's
synonym table and title index match query words with :func:`stem`. (The index's own BM25
uses Qdrant's Snowball stemmers: services/retrieval/index/sparse.py.)
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence

from services.common.search_contract import normalised_view
from services.common.stop_words import STOP_WORDS
from services.common.wording import fold_case

_WORD = re.compile(r"\w+")
# A sentence ends at . ! ? … (and the quotes or brackets closing it) before whitespace and
# a capital, a digit or an opening quote; this keeps "e.g. foo" and "v1.2" in one piece.
# The gap between two sentences is group 1.
_SENTENCE_END = re.compile(r"[.!?…][\"'»”)\]]*(\s+)(?=[\"'«“(\[]?[A-ZА-ЯЁ0-9])")
_WS = re.compile(r"\s+")
_RU_ENDINGS = frozenset(
    """ями ами ого его ому ему ыми ими ией ий ый ой ей ая яя ое ее ие ия ии ию ом ем ам
    ям ах ях ов ев ую юю ых их а я о е у ю ы и ь й""".split()
)
_RU_ENDING_LENGTHS = sorted({len(e) for e in _RU_ENDINGS}, reverse=True)
"""The longest ending a word has is cut."""
_MIN_RU_STEM = 3
"""A Russian ending is cut only where this many letters stay."""
CYRILLIC = re.compile("[\u0400-\u04ff]")
"""A word with one of these letters is stemmed as Russian (here and in the index's BM25)."""


def sentence_ends(text: str) -> list[int]:
    """Where the sentences of `text` end: just after each stop (with the quotes or brackets
    closing it) that :func:`split_sentences` cuts at; the text's own end is not listed."""
    return [m.start(1) for m in _SENTENCE_END.finditer(text)]


def split_sentences(text: str) -> list[str]:
    """Sentences of one paragraph (whitespace collapsed)."""
    text = _WS.sub(" ", text).strip()
    out, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        out.append(text[start : m.start(1)])
        start = m.end(1)
    out.append(text[start:])
    return [s for s in out if s]


def sentences(text: str) -> list[str]:
    """Sentences of a text, paragraph by paragraph: a blank line ends a sentence too."""
    return [s for paragraph in text.split("\n\n") for s in split_sentences(paragraph)]


def stem(word: str) -> str:
    """A word's crude stem, so inflected forms match: договора, договоров → договор;
    policies → policy, files → file. Case- and ё-folded."""
    return _stem_folded(fold_case(word))


def _stem_folded(word: str) -> str:
    if CYRILLIC.search(word):
        for n in _RU_ENDING_LENGTHS:
            if len(word) - n >= _MIN_RU_STEM and word[-n:] in _RU_ENDINGS:
                return word[:-n]
        return word
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def _subject_words(text: str) -> Iterator[tuple[int, str]]:
    """Where each word of the text that can carry a subject starts, and its stem: words of
    two letters or more and every number, stop words (services/common/stop_words.py) left out.
    Words are read in the text's normalised form (search_contract.normalised_view, the
    queries' rule), so a ligature, a soft hyphen or a full-width letter does not hide one."""
    view, starts = normalised_view(text)
    for m in _WORD.finditer(view):
        word = fold_case(m.group(0))
        if (len(word) > 1 or word.isdigit()) and word not in STOP_WORDS:
            yield (m.start() if starts is None else starts[m.start()]), _stem_folded(word)


def search_terms(text: str) -> list[str]:
    """The stems of the text's words that can carry a subject (:func:`_subject_words`), in
    order."""
    return [term for _, term in _subject_words(text)]


def first_match(text: str, terms: Iterable[str]) -> int:
    """Where the first word of `text` that can carry a subject and whose stem is one of
    `terms` starts; -1 if none is."""
    wanted = set(terms)
    return next((start for start, term in _subject_words(text) if term in wanted), -1)


class Bm25:
    """Okapi BM25 of term lists for a query's terms, IDF and mean length taken from a pool."""

    def __init__(
        self,
        query: Iterable[str],
        pool: Sequence[Sequence[str]],
        k1: float = 1.2,
        b: float = 0.75,
    ) -> None:
        self.terms = tuple(dict.fromkeys(query))
        n = len(pool) or 1
        bags = [set(item) for item in pool]
        df = {t: sum(1 for bag in bags if t in bag) for t in self.terms}
        self.idf = {t: math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) for t in self.terms}
        self.avg = sum(len(item) for item in pool) / n or 1.0
        self.k1, self.b = k1, b

    def __call__(self, terms: Sequence[str]) -> float:
        """The score of one term list (0 when it holds none of the query's terms)."""
        tf = Counter(terms)
        norm = self.k1 * (1 - self.b + self.b * len(terms) / self.avg)
        return sum(
            self.idf[t] * tf[t] * (self.k1 + 1) / (tf[t] + norm) for t in self.terms if tf[t]
        )


def bm25_scores(query: Sequence[str], docs: Sequence[Sequence[str]]) -> list[float]:
    """BM25 of every term list in `docs` for the terms of `query`, over `docs` as the pool."""
    score = Bm25(query, docs)
    return [score(d) for d in docs]
