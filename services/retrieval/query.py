"""Query processing (retrieval.md §5.1): normalisation, language detection, synonym expansion.

The normalisation itself (:func:`normalise_query`) is shared with the Orchestrator and
lives in services.common.search_contract.

Normalisation keeps case and ``ё`` for the text the dense embedder sees (e5 is cased, and
folding there buys nothing), and offers :func:`keyword_form` — lowercased, ``ё`` folded
to ``е`` — for keyword (BM25) matching. Folding only helps when the index side folds the
same way, so the keyword index must apply :func:`keyword_form` (or :func:`fold_yo`) to
passages too; Russian text is mostly written without ``ё`` while users type either.

Expansion produces whole-query variants (the original first) by swapping a matched term
for a synonym; the engine searches each variant and merges the lists with RRF. A
:class:`QueryExpander` (model-written variants, services/retrieval/llm_assist.py) takes the
synonyms' place when configured; the synonyms stay its fallback.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from services.common.lexical import stem
from services.common.search_contract import normalise_query
from services.common.stop_words import STOP_WORDS
from services.common.wording import fold_case

# Cyrillic share of the Cyrillic+Latin letters at or above which a query is Russian.
# Russian queries carry Latin product names ("Как настроить LDAP в Orion X?" is 70 %).
_RU_SHARE = 0.6
# ... and at or below which it is English.
_EN_SHARE = 0.1

_WORD = re.compile(r"\w+(?:[-'’]\w+)*", re.UNICODE)


def keyword_form(text: str) -> str:
    """The form used for keyword matching: normalised, lowercased, ``ё`` folded to ``е``."""
    return normalise_query(text, lowercase=True, fold=True)


def _script(ch: str) -> str:
    if not ch.isalpha():
        return ""
    if (
        "\u0400" <= ch <= "\u052f"
        or "\u1c80" <= ch <= "\u1c8f"
        or "\u2de0" <= ch <= "\u2dff"
        or "\ua640" <= ch <= "\ua69f"
    ):
        return "cyrillic"
    if ch.isascii() or unicodedata.name(ch, "").startswith("LATIN"):
        return "latin"
    return "other"


def _hint_language(hint: str | None) -> str:
    if not hint:
        return ""
    primary = hint.strip().lower().replace("_", "-").split("-", 1)[0]
    if primary in ("", "auto", "und", "unknown"):
        return ""
    return primary if primary.isalpha() and 2 <= len(primary) <= 3 else ""


def detect_language(text: str, hint: str | None = None) -> str:
    """``ru``, ``en``, ``mixed`` or ``other`` by the share of Cyrillic and Latin letters.

    A language hint from the request (``ru``, ``en-US``, ``de``) wins and is returned as
    its primary subtag; ``auto``/empty means detect. Russian when Cyrillic is at least
    60 % of the Cyrillic+Latin letters (Latin product names do not flip a Russian query),
    English at 10 % or less, otherwise ``mixed``; ``other`` when another script dominates
    or the text has no letters.
    """
    hinted = _hint_language(hint)
    if hinted:
        return hinted
    counts = {"cyrillic": 0, "latin": 0, "other": 0}
    for ch in text:
        script = _script(ch)
        if script:
            counts[script] += 1
    cyr, lat, oth = counts["cyrillic"], counts["latin"], counts["other"]
    if oth > cyr + lat:
        return "other"
    return _language_by_share(cyr, lat)


def _language_by_share(cyr: int, lat: int) -> str:
    """``ru``/``en``/``mixed`` by the Cyrillic share of the letters; ``other`` without any."""
    if cyr + lat == 0:
        return "other"
    share = cyr / (cyr + lat)
    if share >= _RU_SHARE:
        return "ru"
    if share <= _EN_SHARE:
        return "en"
    return "mixed"


# UTF-8 lead bytes of U+0400-U+04FF (Cyrillic) and the ASCII letters: counting bytes with
# bytes.translate is ~25x faster than a regular expression over the text (5 against 120 us
# for a 1,000-character chunk).
_CYRILLIC_LEAD_BYTES = bytes(range(0xD0, 0xD4))
_LATIN_BYTES = bytes(range(ord("A"), ord("Z") + 1)) + bytes(range(ord("a"), ord("z") + 1))


def passage_language(text: str) -> str:
    """``ru``, ``en`` or ``mixed`` for a passage by its share of Cyrillic letters (the
    thresholds of :func:`detect_language`), ``other`` with neither script.

    Counts Cyrillic (U+0400-U+04FF) and basic Latin letters on the UTF-8 bytes, so it costs
    a few microseconds for a chunk where :func:`detect_language`'s per-character loop costs
    a fraction of a millisecond; search runs it over every dense candidate it has not seen.
    """
    raw = text.encode("utf-8", "surrogatepass")
    cyr = len(raw) - len(raw.translate(None, _CYRILLIC_LEAD_BYTES))
    lat = len(raw) - len(raw.translate(None, _LATIN_BYTES))
    return _language_by_share(cyr, lat)


# --- synonyms -------------------------------------------------------------------------


def _stems(text: str) -> tuple[str, ...]:
    return tuple(stem(m.group(0)) for m in _WORD.finditer(text))


# Domain words of an enterprise software vendor's internal documents, both languages in
# one group so a Russian query can also find an English page and back.
BUILTIN_SYNONYMS: tuple[tuple[str, ...], ...] = (
    ("договор", "контракт", "соглашение", "contract", "agreement"),
    ("отпуск", "vacation", "leave"),
    ("настройка", "конфигурация", "configuration", "settings"),
    ("установка", "инсталляция", "installation", "setup"),
    ("обновление", "апгрейд", "update", "upgrade"),
    ("ошибка", "сбой", "error", "failure"),
    ("пользователь", "учётная запись", "user", "account"),
    ("пароль", "password"),
    ("аутентификация", "авторизация", "вход", "authentication", "login"),
    ("ldap", "active directory", "каталог пользователей"),
    ("единый вход", "sso", "single sign-on"),
    ("резервное копирование", "бэкап", "backup"),
    ("восстановление", "restore", "recovery"),
    ("лицензия", "license", "licence"),
    ("сервер", "server"),
    ("виртуальная машина", "вм", "virtual machine", "vm"),
    ("хранилище", "storage"),
    ("сеть", "network"),
    ("журнал", "лог", "log"),
    ("мониторинг", "monitoring"),
    ("зарплата", "оклад", "salary"),
    ("больничный", "sick leave"),
    ("командировка", "business trip"),
    ("увольнение", "dismissal", "termination"),
    ("счёт", "invoice"),
    ("возврат", "refund"),
)


@dataclass(frozen=True)
class SynonymTable:
    """Groups of interchangeable terms (words or phrases); matching ignores case, ``ё`` and endings."""

    groups: tuple[tuple[str, ...], ...]
    """Each group lists terms that mean the same; a term may be several words."""
    _index: dict[tuple[str, ...], list[int]] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        for gi, group in enumerate(self.groups):
            for term in group:
                stems = _stems(term)
                if stems and gi not in self._index.setdefault(stems, []):
                    self._index[stems].append(gi)

    @classmethod
    def from_groups(cls, groups: Iterable[Iterable[str]]) -> SynonymTable:
        """A table from groups of terms; blank terms and groups of fewer than two go."""
        cleaned: list[tuple[str, ...]] = []
        for group in groups:
            terms = tuple(dict.fromkeys(t for t in (normalise_query(x) for x in group) if t))
            if len(terms) >= 2:
                cleaned.append(terms)
        return cls(tuple(cleaned))

    @classmethod
    def builtin(cls) -> SynonymTable:
        """The small built-in bilingual table."""
        return cls.from_groups(BUILTIN_SYNONYMS)

    @classmethod
    def load(cls, path: str | Path) -> SynonymTable:
        """A table from a file: JSON or text.

        JSON: ``[["договор", "контракт"], ...]``, ``{"groups": [...]}`` or
        ``{"договор": ["контракт", ...]}`` (a key and its list form one group).
        Text: one group per line, terms separated by ``,``, ``;`` or ``|``; ``#`` starts a
        comment.
        """
        raw = Path(path).read_text(encoding="utf-8")
        if Path(path).suffix.lower() == ".json" or raw.lstrip().startswith(("[", "{")):
            try:
                data = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: not valid JSON: {exc}") from None
            if isinstance(data, dict) and "groups" in data:
                data = data["groups"]
            if isinstance(data, dict):
                groups = [[key, *values] for key, values in data.items()]
            else:
                groups = data
            if not isinstance(groups, list) or not all(
                isinstance(g, list) and all(isinstance(t, str) for t in g) for g in groups
            ):
                raise ValueError(f"{path}: expected a list of lists of strings")
            return cls.from_groups(groups)
        lines = (line.split("#", 1)[0] for line in raw.splitlines())
        return cls.from_groups(re.split(r"[,;|]", line) for line in lines if line.strip())

    def synonyms(self, term: str) -> list[str]:
        """Every other term of every group ``term`` belongs to, in table order."""
        out: list[str] = []
        stems = _stems(term)
        for gi in self._index.get(stems, []):
            out.extend(t for t in self.groups[gi] if _stems(t) != stems and t not in out)
        return out

    def matches(self, query: str) -> list[tuple[int, int, list[str]]]:
        """Non-overlapping term matches in ``query``: (start, end, synonyms), longest first."""
        words = list(_WORD.finditer(query))
        stems = [stem(w.group(0)) for w in words]
        longest = max((len(k) for k in self._index), default=0)
        found: list[tuple[int, int, list[str]]] = []
        i = 0
        while i < len(words):
            for size in range(min(longest, len(words) - i), 0, -1):
                key = tuple(stems[i : i + size])
                if key in self._index:
                    start, end = words[i].start(), words[i + size - 1].end()
                    found.append((start, end, self.synonyms(query[start:end])))
                    i += size
                    break
            else:
                i += 1
        return found


def load_synonyms(path: str | None) -> SynonymTable:
    """The table at ``path`` (RETR_SYNONYMS_PATH), or the built-in one when no path is set."""
    return SynonymTable.load(path) if path else SynonymTable.builtin()


def _term_language(term: str) -> str:
    return detect_language(term)


def expand_query(query: str, lang: str, synonyms: SynonymTable, max_variants: int) -> list[str]:
    """The query and up to ``max_variants - 1`` variants, each with one term swapped.

    The original always comes first. Variants go round-robin over the matched terms (the
    first synonym of every term before the second of any), synonyms in the query's
    language first (``lang`` ``ru``/``en``), then the other language. Duplicates (by
    :func:`keyword_form`) and synonyms already present in the query are skipped.
    ``max_variants`` below 1 is treated as 1.
    """
    variants = [query]
    seen = {keyword_form(query)}
    limit = max(1, max_variants)
    query_stems = _stems(query)

    def present(term: str) -> bool:
        stems = _stems(term)
        n = len(stems)
        return any(query_stems[i : i + n] == stems for i in range(len(query_stems) - n + 1))

    per_term: list[tuple[int, int, list[str]]] = []
    for start, end, found in synonyms.matches(query):
        # A synonym already in the query adds nothing ("учётная запись пользователя").
        options = [t for t in found if not present(t)]
        if lang in ("ru", "en"):
            options = sorted(options, key=lambda t: _term_language(t) != lang)  # stable
        per_term.append((start, end, options))
    depth = 0
    while len(variants) < limit and any(depth < len(opts) for _, _, opts in per_term):
        for start, end, options in per_term:
            if depth >= len(options) or len(variants) >= limit:
                continue
            variant = query[:start] + options[depth] + query[end:]
            key = keyword_form(variant)
            if key not in seen:
                seen.add(key)
                variants.append(variant)
        depth += 1
    return variants


class QueryExpander(Protocol):
    """Turns one query into search variants (the original first); async so a model can do it."""

    async def expand(
        self, query: str, lang: str, max_variants: int, *, scope: str = ""
    ) -> list[str]:
        """The query followed by at most ``max_variants - 1`` variants. `scope` (the caller's
        tenant) keeps what one scope's searches leave behind (a cache, a call in flight) from
        answering another's: a cache hit is faster, and its timing would tell."""
        ...


_ACRONYM = re.compile(r"(?<![\w-])[A-Z][A-Z0-9]{1,7}(?![\w-])")
_LOWER = re.compile(r"[a-zа-яё]")
_CYRILLIC_WORD = re.compile(r"[а-яё]{2,}")
EXACT_TERMS_MAX_WORDS = 24
"""The longest query (in words) whose Latin words are exact terms: a question (the gold sets'
longest has 18). A longer text, such as an answer S3 searches for its pages by, names its
products and tools everywhere; as exact terms they would outweigh its sentences."""
_ADDRESS = re.compile(r"(?:[a-z][a-z0-9+.-]*://|www\.)\S+|\S+@\S+", re.IGNORECASE)
_LATIN_WORD = re.compile(r"(?<![\w-])[A-Za-z][A-Za-z0-9_]{2,}(?!\w)")


def exact_terms(text: str) -> tuple[str, ...]:
    """The words of a query that BM25 should match as written, in order: the abbreviations
    written in capitals ("FTBFS", "RC", "HTTP2"), and in a query with Russian words its
    Latin-script words of three letters or more that are no stop words (the names and
    identifiers a Russian question borrows: "hardening", "dh_make", "Kubernetes").

    A dense embedding reads an abbreviation it has not learnt as noise, and a borrowed word
    in a Russian sentence as a small part of its meaning, while BM25 matches either exactly;
    the engine leans on BM25 for such queries (docs/architecture.md §6). A query written
    all in capitals has none: its capitals say nothing about any one word.
    """
    if not _LOWER.search(text):
        return ()
    text = _ADDRESS.sub(" ", text)  # a URL's or an address's pieces are no terms of it
    found = _ACRONYM.findall(text)
    if _CYRILLIC_WORD.search(text) and len(_WORD.findall(text)) <= EXACT_TERMS_MAX_WORDS:
        found += [w for w in _LATIN_WORD.findall(text) if _content(w)]
    return tuple(dict.fromkeys(found))


# --- a document named by its title ------------------------------------------------------

TITLE_RUN = 2
"""Content words in a row, all from one document title, that name the document."""
TITLE_KEEP = 2
"""Content words the rest of the query must keep for the named title to be set aside."""


def _content(word: str) -> bool:
    return len(word) >= 3 and fold_case(word) not in STOP_WORDS


class TitleIndex:
    """The content words of a tenant's document titles, each with the titles it occurs in:
    built once per listing of the titles (SectionCatalog.title_index), read by every search."""

    def __init__(self, titles: Iterable[str]) -> None:
        by_stem: dict[str, set[int]] = {}
        for t, title in enumerate(titles):
            title = normalise_query(title)  # as the queries it is matched against
            stems = {stem(m.group(0)) for m in _WORD.finditer(title) if _content(m.group(0))}
            if len(stems) >= TITLE_RUN:  # one content word does not name a document
                for s in stems:
                    by_stem.setdefault(s, set()).add(t)
        self._by_stem = {s: frozenset(ts) for s, ts in by_stem.items()}

    def __bool__(self) -> bool:
        return bool(self._by_stem)

    def names(self, word: str) -> bool:
        """Whether `word` is a content word of one of the documents' titles."""
        return stem(word) in self._by_stem

    def without_titles(self, text: str) -> str:
        """`text` without the words that name one of the documents by its title, for the
        keyword (BM25) query; `text` itself when it names none.

        "Which Latin saying does the maintainers' guide quote?" in a tenant holding "Debian
        New Maintainers' Guide": "maintainers' guide" says which document, not what in it,
        and BM25 would rank the pages that repeat the title (title page, contents, revision
        history) above the passage. A run of at least TITLE_RUN neighbouring content words
        (three letters or more, not in STOP_WORDS; other words may stand between them) that
        all occur in one title names that document; its words go when at least TITLE_KEEP
        content words remain (a query that is mostly a title asks about the document itself).
        The dense query keeps every word (docs/architecture.md §6).
        """
        if not self._by_stem:
            return text
        words = [(m.start(), m.end(), m.group(0)) for m in _WORD.finditer(text)]
        content = [w for w in words if _content(w[2])]
        if len(content) < TITLE_RUN + TITLE_KEEP:
            return text
        drop: list[tuple[int, int, str]] = []
        run: list[tuple[int, int, str]] = []
        shared: frozenset[int] = frozenset()  # the titles every word of the run occurs in
        for w in content:
            owners = self._by_stem.get(stem(w[2]), frozenset())
            if run and owners & shared:
                run.append(w)
                shared &= owners
                continue
            if len(run) >= TITLE_RUN:
                drop.extend(run)
            run, shared = ([w], owners) if owners else ([], frozenset())
        if len(run) >= TITLE_RUN:
            drop.extend(run)
        if not drop or len(content) - len(drop) < TITLE_KEEP:
            return text
        out, at = [], 0
        for start, end, _ in drop:
            out.append(text[at:start])
            at = end + (text[end : end + 1] in ("'", "’"))  # maintainers' guide
        out.append(text[at:])
        return " ".join("".join(out).split())
