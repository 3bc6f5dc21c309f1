"""What Retrieval, ToolsProxy and the Orchestrator must agree on about a search request.

The caller's identity and the reserved knowledge-base tenant, the request limits, filter
validation, query normalisation and the window-radius rule (docs/architecture.md §8, §2,
§15, §16). Each service checks a request with these before it calls the next one, so a
caller's mistake is refused where it is made and never comes back from a downstream service
as that service's own failure.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass

from services.common import errors
from services.common.document_limits import FILTER_VALUE_CHARS
from services.common.wording import fold_yo

KB_TENANT = "__knowledge_base__"
"""The reserved tenant that holds the shared knowledge base (docs/architecture.md §15, agent.md §6)."""

MAX_TENANT_ID_CHARS = 128
_TENANT_ID = re.compile(rf"[\w.:-]{{1,{MAX_TENANT_ID_CHARS}}}")
MAX_QUERY_CHARS = 4096
MAX_RESULTS_LIMIT = 50
MAX_FILTER_VALUES = 100
USER_SOURCE = "user"
KB_SOURCE = "knowledge_base"
SOURCES = (USER_SOURCE, KB_SOURCE)
"""The values of filters.source (empty: any)."""


KB_FACETS = ("topic", "jurisdiction")
"""What a knowledge-base article is tagged with besides its own tags (`kb_tag`)."""
KB_FACET_CHARS = 100
"""The longest facet value search_general_kb takes."""


def kb_tag(kind: str, value: str) -> str:
    """The tag a knowledge-base article carries for its "topic" or "jurisdiction" (`kind`),
    which search_general_kb filters on: ``kind:value``, the value trimmed and lowercased."""
    return f"{kind}:{value.strip().lower()}"


DEFAULT_WINDOW_RADIUS = 3

_ZERO_WIDTH_SPACES = {"\u200b", "\u2060", "\u180e"}


def missing_user_context(field_name: str, message: str) -> errors.InvalidArgumentError:
    """INVALID_ARGUMENT with reason MISSING_USER_CONTEXT: the caller's tenant or user is
    blank. Both ids are the caller's identity (docs/architecture.md §16)."""
    return errors.InvalidArgumentError(
        message, reason="MISSING_USER_CONTEXT", metadata={"field": field_name}
    )


def is_tenant_id(value: str) -> bool:
    """A tenant id every service accepts: 1-128 letters, digits, '.', '_', ':', '-'. The
    document store keeps documents under it, so one that could never be stored is refused
    wherever it is named, not answered with an empty result."""
    return _TENANT_ID.fullmatch(value) is not None


def check_tenant_id(tenant_id: str, field_name: str = "tenant_id") -> None:
    """INVALID_ARGUMENT naming `field_name` when `tenant_id` is blank or not :func:`is_tenant_id`.
    Where the tenant is the caller's identity, a blank one is checked first with
    :func:`missing_user_context`."""
    if not tenant_id.strip():
        raise errors.invalid(field_name, f"{field_name} is required")
    if not is_tenant_id(tenant_id):
        raise errors.invalid(
            field_name,
            f"{field_name} must be 1-{MAX_TENANT_ID_CHARS} letters, digits, '.', '_', ':', '-'",
        )


MAX_USER_ID_CHARS = 256
MAX_ROLES = 32
MAX_ROLE_CHARS = 128
_PRINTABLE = re.compile(r"[^\x00-\x1f\x7f-\x9f\u2028\u2029]*")
"""No control characters or line separators: the id is written into every log line of a
tool call and into ToolsProxy's rate-limit and cache keys."""


def check_label(name: str, value: str, limit: int) -> None:
    """LIMIT_EXCEEDED for a `value` of request field `name` past `limit` characters,
    INVALID_ARGUMENT for one holding a control character or a line separator: a label (a user
    id, a channel, a locale) is written into log lines as it was sent."""
    if len(value) > limit:
        raise errors.over_limit(
            f"{name} is {len(value)} characters; the limit is {limit}", limit, field=name
        )
    if not _PRINTABLE.fullmatch(value):
        raise errors.invalid(name, f"{name} has a control character")


def check_user(user_id: str, roles: tuple[str, ...] = (), prefix: str = "") -> None:
    """LIMIT_EXCEEDED / INVALID_ARGUMENT for a user id or roles no service keeps: longer than
    MAX_USER_ID_CHARS, more than MAX_ROLES roles or one over MAX_ROLE_CHARS, or a control
    character in any. `prefix` ("user.") names the user id as the request spells it; roles
    only ever come in a user context (`user.roles`)."""
    check_label(f"{prefix}user_id", user_id, MAX_USER_ID_CHARS)
    if len(roles) > MAX_ROLES:
        raise errors.too_many("user.roles", len(roles), MAX_ROLES)
    for role in roles:
        if len(role) > MAX_ROLE_CHARS:
            raise errors.value_too_long("user.roles", len(role), MAX_ROLE_CHARS)
        if not _PRINTABLE.fullmatch(role):
            raise errors.invalid("user.roles", "user.roles has a control character")


def refuse_reserved_tenant(tenant_id: str, field_name: str, instead: str) -> None:
    """INVALID_ARGUMENT when a caller names KB_TENANT as its own tenant: the knowledge base
    is asked for the way `instead` says (docs/architecture.md §15), never as a caller's own
    documents."""
    if tenant_id == KB_TENANT:
        raise errors.invalid(
            field_name, f"tenant {KB_TENANT!r} is reserved for the knowledge base; {instead}"
        )


def check_query(query: str) -> None:
    """A query every service can search: LimitExceededError past MAX_QUERY_CHARS, as sent or
    as :func:`normalise_query` makes it; InvalidArgumentError when it normalises to nothing
    (blank, or only controls, format marks, private-use characters).

    The length as sent is checked before anything reads the text, so a query of any size is
    refused at once. The normalised length is checked too: NFKC writes some characters as
    several (U+FDFA as 18), and the normalised text is what is searched and embedded. A query
    past the limit once normalised is refused, not cut: every service checks with this one
    function, so each accepts and refuses the same queries, and no caller is answered about
    only the first part of its question."""
    if len(query) > MAX_QUERY_CHARS:
        raise errors.over_limit(
            f"query is {len(query)} characters; the limit is {MAX_QUERY_CHARS}",
            MAX_QUERY_CHARS,
            field="query",
        )
    normalised = normalise_query(query)
    if not normalised:
        raise errors.invalid(
            "query", "query is required (not only spaces, control or invisible format characters)"
        )
    if len(normalised) > MAX_QUERY_CHARS:
        raise errors.over_limit(
            f"query is {len(normalised)} characters once normalised (Unicode NFKC);"
            f" the limit is {MAX_QUERY_CHARS}",
            MAX_QUERY_CHARS,
            field="query",
        )


def check_max_results(max_results: int | None) -> None:
    """max_results, when given, is between 1 and MAX_RESULTS_LIMIT."""
    if max_results is None:
        return
    if max_results < 1:
        raise errors.invalid("max_results", "max_results must be at least 1")
    if max_results > MAX_RESULTS_LIMIT:
        raise errors.over_limit(
            f"max_results is {max_results}; the limit is {MAX_RESULTS_LIMIT}",
            MAX_RESULTS_LIMIT,
            field="max_results",
        )


@dataclass(frozen=True)
class Filters:
    """Metadata filters of a search (retrieval-v1 §3), as Retrieval and the Orchestrator
    both take them."""

    product: str = ""
    version: str = ""
    tags: tuple[str, ...] = ()
    doc_ids: tuple[str, ...] = ()
    section_ids: tuple[str, ...] = ()
    source: str = ""
    """"user", "knowledge_base", or "" for any (SOURCES)."""


def validate_filters(f: Filters) -> None:
    """filters.source, the filter lists' limits and the longest value each filter may hold
    (FILTER_VALUE_CHARS); the orchestrator checks a Respond's filters with it before they
    reach Retrieval, and Retrieval checks every search's. A value longer than any a document
    can be stored with matches nothing, and is refused before it is searched or logged."""
    if f.source and f.source not in SOURCES:
        raise errors.invalid("filters.source", "filters.source must be 'user' or 'knowledge_base'")
    for name in ("tags", "doc_ids", "section_ids"):
        if len(getattr(f, name)) > MAX_FILTER_VALUES:
            raise errors.over_limit(
                f"filters.{name} has more than {MAX_FILTER_VALUES} values",
                MAX_FILTER_VALUES,
                field=f"filters.{name}",
            )
    for name, limit in FILTER_VALUE_CHARS.items():
        value = getattr(f, name)
        longest = max(map(len, value), default=0) if isinstance(value, tuple) else len(value)
        if longest > limit:
            raise errors.value_too_long(f"filters.{name}", longest, limit)


def normalise_query(text: str, *, lowercase: bool = False, fold: bool = False) -> str:
    """Unicode NFKC, control and format characters removed, whitespace collapsed and trimmed.

    NFKC turns full-width letters, ligatures and no-break spaces into their plain forms;
    soft hyphens, zero-width joiners, BOMs and bidi marks (category Cf), controls (Cc,
    tabs and newlines become spaces), surrogates and private-use characters go; zero-width
    spaces count as spaces. ``lowercase`` and ``fold`` (``ё`` → ``е``) are opt-in: see
    services.retrieval.query and its ``keyword_form``. A query that normalises to nothing
    is refused by every service as a missing query.
    """
    text = unicodedata.normalize("NFKC", text)
    words = text.split()
    if not _nothing_to_remove(words):
        words = _without_controls(text).split()
    result = " ".join(words)
    if lowercase:
        result = result.lower()
    if fold:
        result = fold_yo(result)
    return result


def _nothing_to_remove(words: list[str]) -> bool:
    """Whether the words of a text (split on whitespace) are printable: no control, format,
    surrogate or private-use character (nor a zero-width space, a format character) for
    :func:`_without_controls` to remove."""
    return "".join(words).isprintable()


def _without_controls(text: str) -> str:
    """Zero-width spaces and whitespace controls as spaces; other controls, format
    characters (Cf), surrogates and private-use characters removed."""
    out: list[str] = []
    for ch in text:
        if ch in _ZERO_WIDTH_SPACES:
            out.append(" ")
            continue
        category = unicodedata.category(ch)
        if category == "Cc":
            out.append(" " if ch.isspace() else "")
        elif category not in ("Cf", "Cs", "Co"):
            out.append(ch)
    return "".join(out)


def normalised_view(text: str) -> tuple[str, list[int] | None]:
    """`text` as :func:`normalise_query` reads it, whitespace left as it is, and where each
    character of that view starts in `text` (None when the view is `text` itself).

    For matching words of a stored text against a normalised query while pointing into
    the stored text (services/common/lexical.py). Characters that normalisation keeps are
    copied; one it may change is normalised together with the characters after it that may
    join it (combining marks, the second halves of composed letters), and with the letter
    before it when it joins that one. So a decomposed ``й`` (``и`` and U+0306) is one
    letter as in :func:`normalise_query`, and a ligature's letters all point at the ligature.
    """
    if unicodedata.is_normalized("NFKC", text) and _nothing_to_remove(text.split()):
        return text, None
    changing, joining = _normalisation_tables()
    pieces: list[str] = []
    starts: list[int] = []
    at = 0
    for m in changing.finditer(text):
        begin = m.start() - (m.start() > at and text[m.start()] in joining)
        pieces.append(text[at:begin])
        starts.extend(range(at, begin))
        cluster = begin
        for end in range(begin + 1, m.end() + 1):
            if end < m.end() and text[end] in joining:
                continue
            piece = _without_controls(unicodedata.normalize("NFKC", text[cluster:end]))
            pieces.append(piece)
            starts.extend([cluster] * len(piece))
            cluster = end
        at = m.end()
    pieces.append(text[at:])
    starts.extend(range(at, len(text)))
    return "".join(pieces), starts


@functools.cache
def _normalisation_tables() -> tuple[re.Pattern[str], frozenset[str]]:
    """Runs of the characters :func:`normalise_query` may change, and the characters that
    may join the one before them under NFKC.

    Joining: combining marks, the second character of a canonical decomposition (Hangul
    vowel and final jamo too), and characters whose NFKC form starts with one of those.
    Changing: the joining ones, those NFKC rewrites, and non-space characters that are not
    printable; every character from U+D800 up is taken as changing.
    """
    last = 0x1E000  # no canonical composition involves a later character
    joining = {chr(c) for c in (*range(0x1161, 0x1176), *range(0x11A8, 0x11C3))}
    decomposing: list[str] = []  # NFKC leaves every other character as it is
    for code in range(last):
        ch = chr(code)
        if unicodedata.combining(ch):
            joining.add(ch)
        parts = unicodedata.decomposition(ch).split()
        if parts:
            decomposing.append(ch)
            if len(parts) == 2 and not parts[0].startswith("<"):
                joining.add(chr(int(parts[1], 16)))
    joining.update(ch for ch in decomposing if unicodedata.normalize("NFKD", ch)[0] in joining)
    changed = joining.union(ch for ch in decomposing if unicodedata.normalize("NFKC", ch) != ch)
    changed.update(ch for ch in map(chr, range(0xD800)) if not (ch.isspace() or ch.isprintable()))
    ranges: list[list[int]] = []
    for code in sorted(map(ord, changed)):
        if code >= 0xD800:
            break
        if ranges and ranges[-1][1] == code - 1:
            ranges[-1][1] = code
        else:
            ranges.append([code, code])
    body = "".join(rf"\u{a:04x}-\u{b:04x}" for a, b in ranges)
    changing = re.compile(rf"[{body}\ud800-\uffff\U00010000-\U0010ffff]+")
    return changing, frozenset(joining)


def window_radius(radius: int | None, legacy_total: int | None) -> int:
    """Per-side radius R (docs/architecture.md §8): R when set, else the legacy total window N ->
    floor((N-1)/2), else the default.

    The Orchestrator's radius schedule and ToolsProxy's cap both come from this rule, so the
    largest window one asks for is never one the other refuses."""
    if radius is not None:
        return radius
    if legacy_total is not None:
        return (legacy_total - 1) // 2
    return DEFAULT_WINDOW_RADIUS
