"""fetch_finance_news: finance news from the Tavily Search API, cached, retried, behind a breaker.

Only Tavily's own endpoint (``POST {base_url}/search``) is ever called; the URLs in the
results are returned as data and never fetched. The API key travels only in the
``Authorization: Bearer`` header (as the official ``tavily-python`` client sends it) and is
never logged, put in an error message or shown in a repr.
"""

from __future__ import annotations

import asyncio
import copy
import email.utils
import json
import logging
import math
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx

from services.common.breaker import (
    ANSWERED,
    NO_VERDICT,
    OUTAGE,
    TIMEOUT,
    BreakerPolicy,
    CircuitBreaker,
    CircuitOpenError,
)
from services.common.context import upstream_timeout
from services.common.http import (
    TRANSIENT_STATUSES,
    check_public_api_url,
    fetch_capped,
    retry_after_seconds,
    shown_link,
)
from services.common.logging import get_logger
from services.common.retry import (
    AttemptFailed,
    Clock,
    RetryPolicy,
    Sleep,
    run_with_retry,
    whole_seconds,
)
from services.common.settings import SettingsError
from services.common.tool_contract import (
    FETCH_FINANCE_NEWS,
    INVALID_ARGUMENT,
    NEWS_MAX_RESULTS,
    NEWS_QUERY_MAX_CHARS,
    NEWS_SEARCH_DEPTH,
    RATE_LIMIT_EXCEEDED,
    UPSTREAM_UNAVAILABLE,
    tool_arguments,
)
from services.toolsproxy.external_call import log_external_call
from services.toolsproxy.tools import Caller, Tool, ToolFailure
from services.toolsproxy.ttl_cache import TtlCache

log = logging.getLogger(__name__)
events = get_logger(__name__)

_STATUS = {
    INVALID_ARGUMENT: "bad_request",
    UPSTREAM_UNAVAILABLE: "unavailable",
    RATE_LIMIT_EXCEEDED: "rate_limited",
}
"""external_call's status of a search that failed with each error code."""

DEFAULT_BASE_URL = "https://api.tavily.com"
MIN_RESULTS = 3
TIME_RANGES = ("day", "week", "month", "year")
SEARCH_DEPTHS = ("basic", "advanced")
"""Tavily's search_depth values; agent.md §5.3 asks for advanced, the default."""
MAX_RESPONSE_BYTES = 2 * 1024 * 1024
"""Largest answer body read (after its Content-Encoding is undone); a longer one is refused
as it streams, the rest never read."""


@dataclass(frozen=True)
class TavilySettings:
    """How the tools proxy reaches Tavily (MCP_PROXY_TAVILY_*); validated on construction."""

    api_key: str | None = field(default=None, repr=False)
    """Tavily API key; None leaves the tool listed but answering "not configured"."""
    base_url: str = DEFAULT_BASE_URL
    """Tavily API base URL; ``/search`` is appended. https, or http only to localhost (a
    local fake): the key never crosses the network in clear."""
    timeout_s: float = 9.0
    """Timeout of one HTTP attempt (connect, read, write, pool)."""
    retry: RetryPolicy = RetryPolicy(
        attempts=3, first_delay_s=0.5, factor=2.0, max_delay_s=4.0, deadline_s=20.0,
        max_retry_after_s=5.0,
    )  # fmt: skip
    """Attempts on 5xx, 429 or a refused connection: three in all, pausing 0.5 s, doubling up
    to 4 s; within 20 s for the whole search (its `deadline_s`, which also cuts the last
    attempt's timeout); a 429 asking to wait over 5 s fails at once."""
    cache_ttl_s: float = 300.0
    """How long a result is reused for the same (tenant, user, query, options); 0 disables."""
    cache_max_entries: int = 1024
    """Cached results kept at most; the oldest go first."""
    breaker: BreakerPolicy = BreakerPolicy(failures=5, reset_s=30.0)
    """Consecutive failed searches that open the circuit breaker, and how long it then
    refuses calls before one trial call."""
    max_snippet_chars: int = 1000
    """Longest snippet per result; longer ones are cut and end with an ellipsis."""

    def __post_init__(self) -> None:
        _check_api_key(self.api_key)
        check_public_api_url(self.base_url, "MCP_PROXY_TAVILY_URL")
        if self.timeout_s <= 0:
            raise SettingsError("Tavily timeout must be positive")

    @property
    def configured(self) -> bool:
        """True when an API key is set."""
        return bool(self.api_key)


def _check_api_key(key: str | None) -> None:
    """SettingsError, naming the variable and never the key, unless `key` can travel as a
    Bearer token: printable ASCII without spaces. A key with a newline around it would
    fail every request as "unreachable" (retried, feeding the breaker), and a non-ASCII one
    could not be encoded into the header at all."""
    if not key:
        return
    if key != key.strip():
        raise SettingsError("MCP_PROXY_TAVILY_API_KEY has white space around it; set the key alone")
    if not all("!" <= c <= "~" for c in key):
        raise SettingsError(
            "MCP_PROXY_TAVILY_API_KEY must be printable ASCII without spaces, as Tavily's keys are"
        )


class TavilyError(Exception):
    """A search failed; ``code`` is the tool error code, ``message`` safe to show the model."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _Attempt(AttemptFailed):
    """One failed attempt: the error to raise if it is the last, and whether to retry."""

    def __init__(
        self,
        error: TavilyError,
        *,
        retry: bool,
        outage: bool,
        delay: float | None = None,
        verdict: bool = True,
        timed_out: bool = False,
    ) -> None:
        super().__init__(error.message, retry=retry, delay=delay)
        self.error = error
        self.outage = outage  # counts against the breaker (Tavily down, not refusing us)
        self.verdict = verdict  # False: the caller's time ran out, too short to judge Tavily
        self.timed_out = timed_out  # no verdict if this process stood still meanwhile

    @property
    def breaker_verdict(self) -> str:
        if not self.verdict:
            return NO_VERDICT
        if self.timed_out:
            return TIMEOUT
        return OUTAGE if self.outage else ANSWERED


def _unavailable(detail: str) -> TavilyError:
    return TavilyError(
        UPSTREAM_UNAVAILABLE, f"Finance news search is unavailable right now ({detail})."
    )


def _not_configured() -> TavilyError:
    return TavilyError(
        UPSTREAM_UNAVAILABLE, "Finance news search is not configured on this server."
    )


def _checked(
    query: str, max_results: int, time_range: str | None, search_depth: str
) -> tuple[str, int]:
    """The query with its white space folded and the result count clamped to 3..5;
    TavilyError INVALID_ARGUMENT for an empty or too long query or an unknown option."""
    text = " ".join(query.split())
    if not text:
        raise TavilyError(INVALID_ARGUMENT, "query must not be empty")
    if len(text) > NEWS_QUERY_MAX_CHARS:
        raise TavilyError(
            INVALID_ARGUMENT, f"query must be at most {NEWS_QUERY_MAX_CHARS} characters"
        )
    if time_range is not None and time_range not in TIME_RANGES:
        raise TavilyError(INVALID_ARGUMENT, f"time_range must be one of {', '.join(TIME_RANGES)}")
    if search_depth not in SEARCH_DEPTHS:
        raise TavilyError(
            INVALID_ARGUMENT, f"search_depth must be one of {', '.join(SEARCH_DEPTHS)}"
        )
    return text, min(NEWS_MAX_RESULTS, max(MIN_RESULTS, int(max_results)))


class TavilyClient:
    """Searches Tavily for finance news: ``POST {base_url}/search``, topic finance, advanced,
    with publication dates asked for (``include_published_date``).

    Retries 5xx, 429 (honouring ``Retry-After``) and refused connections with exponential
    backoff, caches results per (tenant, user, query, options), and stops calling Tavily
    while its circuit breaker is open. Every failure is a ``TavilyError`` with a tool code.
    The clock (monotonic seconds) and sleep are injected so tests step time.
    """

    def __init__(
        self,
        settings: TavilySettings,
        http: httpx.AsyncClient,
        *,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        self._settings = settings
        self._http = http
        self._clock = clock
        self._sleep = sleep
        self._url = settings.base_url.rstrip("/") + "/search"
        self.breaker = breaker or CircuitBreaker(
            "tavily",
            settings.breaker,
            clock=clock,
        )
        self._cache: TtlCache[tuple[Any, ...], dict[str, Any]] = TtlCache(
            settings.cache_ttl_s, settings.cache_max_entries, clock
        )

    def __repr__(self) -> str:
        return f"TavilyClient(url={self._url!r}, configured={self._settings.configured})"

    @property
    def configured(self) -> bool:
        """True when an API key is set; without one every search is UPSTREAM_UNAVAILABLE."""
        return self._settings.configured

    async def search(
        self,
        query: str,
        *,
        tenant_id: str,
        user_id: str,
        max_results: int = NEWS_MAX_RESULTS,
        time_range: str | None = None,
        search_depth: str = NEWS_SEARCH_DEPTH,
    ) -> dict[str, Any]:
        """Finance news for ``query``: ``{source, query, search_depth, results[{title, url,
        snippet, published_at}], cached}``. ``max_results`` is clamped to 3..5.

        Raises TavilyError: INVALID_ARGUMENT (empty or too long query, unknown time_range or
        search_depth, Tavily's 400), RATE_LIMIT_EXCEEDED (Tavily's 429 after retries), UPSTREAM_UNAVAILABLE
        (not configured, key refused, unreachable, 5xx after retries, breaker open).
        """
        text, count = _checked(query, max_results, time_range, search_depth)
        if not self.configured:
            raise _not_configured()

        key = (tenant_id, user_id, text, count, time_range, search_depth)
        started = time.perf_counter()
        cached = self._cache.get(key)
        if cached is not None:
            self._log("ok", tenant_id, started, attempts=0, cache_hit=True)
            return {**copy.deepcopy(cached), "cached": True}

        body: dict[str, Any] = {
            "query": text,
            "topic": "finance",
            "search_depth": search_depth,
            "max_results": count,
            "include_answer": False,
            "include_raw_content": False,
            "include_images": False,
            # Tavily dates its results only when asked (by default for topic news alone).
            "include_published_date": True,
        }
        if time_range is not None:
            body["time_range"] = time_range
        result, attempts = await self._search_once(body, count, tenant_id, started)
        self._cache.put(key, result)
        self._log("ok", tenant_id, started, attempts=attempts, results=len(result["results"]))
        return {**copy.deepcopy(result), "cached": False}  # callers may mutate theirs

    async def _search_once(
        self, body: dict[str, Any], count: int, tenant_id: str, started: float
    ) -> tuple[dict[str, Any], int]:
        """One search through the breaker: the normalised result and the attempts it took."""
        try:
            with self.breaker.trial():
                payload, attempts = await self._post(body)
                result = normalise(body["query"], payload, count, self._settings.max_snippet_chars)
        except CircuitOpenError as exc:
            self._log("breaker_open", tenant_id, started, attempts=0)
            raise _unavailable(
                f"too many recent failures; try again in {exc.retry_after_s} s"
            ) from None
        except _Attempt as failed:
            self._log(
                "deadline"
                if failed.breaker_verdict == NO_VERDICT
                else _STATUS.get(failed.error.code, "error"),
                tenant_id,
                started,
                attempts=failed.attempts,
                code=failed.error.code,
                reason=str(failed),
            )
            raise failed.error from None
        except asyncio.CancelledError:
            self._log("cancelled", tenant_id, started, attempts=0)
            raise
        except BaseException:
            self._log("error", tenant_id, started, attempts=0)
            raise
        result["search_depth"] = body["search_depth"]
        return result, attempts

    # -- HTTP with retries --------------------------------------------------------------

    async def _post(self, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """The parsed 200 body and the attempts it took, or raises the last _Attempt."""
        s = self._settings
        headers = {
            "Authorization": f"Bearer {s.api_key}",
            "Content-Type": "application/json",
            "X-Client-Source": "visior-toolsproxy",
        }
        start = self._clock()
        budget_s = s.retry.deadline_s if s.retry.deadline_s is not None else math.inf

        async def attempt() -> dict[str, Any]:
            remaining = budget_s - (self._clock() - start)
            # Cut to end before the caller's deadline (services.common.context).
            timeout_s, says_nothing = upstream_timeout(max(0.001, min(s.timeout_s, remaining)))
            return await self._once(body, headers, timeout_s, says_nothing)

        return await run_with_retry(
            attempt,
            s.retry,
            retry_on=_Attempt,
            on_retry=_log_retry,
            clock=self._clock,
            sleep=self._sleep,
            started=start,
        )

    async def _once(
        self, body: dict[str, Any], headers: dict[str, str], timeout_s: float, says_nothing: bool
    ) -> dict[str, Any]:
        try:
            answer = await fetch_capped(
                self._http,
                "POST",
                self._url,
                cap=MAX_RESPONSE_BYTES,
                json=body,
                headers=headers,
                timeout=timeout_s,
            )
        except httpx.TimeoutException:
            # Not retried: one more full timeout would blow the caller's budget.
            raise _Attempt(
                _unavailable("Tavily did not answer in time"),
                retry=False,
                outage=True,
                verdict=not says_nothing,
                timed_out=True,
            ) from None
        except httpx.TransportError:
            raise _Attempt(
                _unavailable("Tavily cannot be reached"), retry=True, outage=True
            ) from None
        except httpx.RequestError:
            # Any other failure of the exchange, such as a body its Content-Encoding cannot
            # decode (httpx.DecodingError): Tavily answered, but nothing usable.
            raise _Attempt(
                _unavailable("Tavily sent an unexpected answer"), retry=False, outage=True
            ) from None
        status, content = answer.status, answer.body
        if status == 200:
            return self._parse(content)
        if status == 429:
            wait = retry_after_seconds(answer.headers.get("Retry-After"))
            limited = TavilyError(
                RATE_LIMIT_EXCEEDED,
                "Finance news search is rate limited by Tavily; try again later"
                + (f" (in {whole_seconds(wait)} s)." if wait is not None else "."),
            )
            # A wait over the policy's max_retry_after_s ends the run at once.
            raise _Attempt(limited, retry=True, outage=False, delay=wait)
        if status in TRANSIENT_STATUSES:
            raise _Attempt(_unavailable(f"Tavily answered {status}"), retry=True, outage=True)
        if status in (400, 422):
            detail = _detail(content)
            raise _Attempt(
                TavilyError(
                    INVALID_ARGUMENT,
                    "Tavily refused the search" + (f": {detail}" if detail else "."),
                ),
                retry=False,
                outage=False,
            )
        if status in (401, 403):
            raise _Attempt(
                TavilyError(
                    UPSTREAM_UNAVAILABLE,
                    "Finance news search is not configured correctly on this server "
                    "(the search provider refused its credentials).",
                ),
                retry=False,
                outage=False,
            )
        if status in (432, 433):
            raise _Attempt(
                _unavailable("the search plan's usage limit is reached"), retry=False, outage=False
            )
        raise _Attempt(_unavailable(f"Tavily answered {status}"), retry=False, outage=True)

    def _parse(self, content: bytes | None) -> dict[str, Any]:
        """The payload of a 200 body (None: over MAX_RESPONSE_BYTES) or raises an _Attempt."""
        bad = _Attempt(_unavailable("Tavily sent an unexpected answer"), retry=False, outage=True)
        if content is None:
            raise bad
        try:
            payload = json.loads(content)
        except ValueError:
            raise bad from None
        if not isinstance(payload, dict) or not isinstance(payload.get("results"), list):
            raise bad
        return payload

    def _log(self, status: str, tenant_id: str, started: float, **fields: Any) -> None:
        """The search's ``external_call`` line (one per search, a cache hit included). The
        query is the user's text: never logged; nor the key."""
        log_external_call(
            events, "tavily", "search", status, started, self.breaker,
            tool=FETCH_FINANCE_NEWS, tenant_id=tenant_id, **fields,
        )  # fmt: skip


def _log_retry(failed: _Attempt, attempt: int, delay: float) -> None:
    log.warning(
        "tavily search attempt failed; retrying",
        extra={
            "tool": FETCH_FINANCE_NEWS,
            "attempt": attempt,
            "delay_s": delay,
            "reason": str(failed),
        },
    )


def _detail(content: bytes | None) -> str:
    """Tavily's error text from ``{"detail": {"error": ...}}``, short and single-line."""
    try:
        body = json.loads(content or b"")
    except ValueError:
        return ""
    detail = body.get("detail") if isinstance(body, dict) else None
    text = detail.get("error") if isinstance(detail, dict) else detail
    return " ".join(str(text).split())[:200] if isinstance(text, str) else ""


# -- normalisation ------------------------------------------------------------------------


def _published(value: Any) -> str | None:
    """ISO 8601 from Tavily's RFC 1123 (``Mon, 10 Mar 2025 09:30:00 GMT``) or ISO dates."""
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip()
    try:
        return email.utils.parsedate_to_datetime(text).isoformat()
    except (TypeError, ValueError, IndexError):
        pass
    try:
        return datetime.fromisoformat(text).isoformat()
    except ValueError:
        return None  # not a date: Tavily's free text, never a field beside the delimited data


def normalise(
    query: str, payload: dict[str, Any], max_results: int, max_snippet_chars: int
) -> dict[str, Any]:
    """Tavily's response as ``{source, query, results[{title, url, snippet, published_at}]}``
    (agent.md §3's names; Tavily's own field is ``published_date``).

    Results without an http(s) URL (or with white space or control characters in it) are
    dropped; whitespace is collapsed; snippets are cut at ``max_snippet_chars``. What a web
    page wrote (``title``, ``snippet``) the tool executor delimits as EXTERNAL, untrusted
    data; ``published_at`` is an ISO date or None, never Tavily's free text.
    """
    results: list[dict[str, Any]] = []
    for item in payload.get("results", []):
        if len(results) >= max_results:
            break
        if not isinstance(item, dict):
            continue
        url = shown_link(item.get("url"))
        if url is None:
            continue
        title = " ".join(str(item.get("title") or "").split())[:300] or url
        snippet = " ".join(str(item.get("content") or "").split())
        if len(snippet) > max_snippet_chars:
            snippet = snippet[: max_snippet_chars - 1].rstrip() + "…"
        results.append(
            {
                "title": title,
                "url": url,
                "snippet": snippet,
                "published_at": _published(item.get("published_date")),
            }
        )
    return {"source": "Tavily", "query": query, "results": results}


# -- the tool -----------------------------------------------------------------------------


def days_to_time_range(days: int) -> str:
    """The narrowest Tavily time_range covering the last ``days`` days."""
    if days <= 1:
        return "day"
    if days <= 7:
        return "week"
    if days <= 31:
        return "month"
    return "year"


def tavily_schema() -> dict[str, Any]:
    """fetch_finance_news's arguments (agent.md §3: `query`, `max_results`, `search_depth`)."""
    return tool_arguments(
        {
            "query": {
                "type": "string",
                "minLength": 1,
                "maxLength": NEWS_QUERY_MAX_CHARS,
                "description": "What to search finance news for.",
            },
            "max_results": {
                "type": "integer",
                "minimum": MIN_RESULTS,
                "maximum": NEWS_MAX_RESULTS,
                "description": f"Results to return ({MIN_RESULTS}..{NEWS_MAX_RESULTS}, "
                f"default {NEWS_MAX_RESULTS}).",
            },
            "search_depth": {
                "type": "string",
                "enum": list(SEARCH_DEPTHS),
                "description": f"Tavily's search depth (default {NEWS_SEARCH_DEPTH}): basic "
                "is faster, advanced finds more relevant snippets.",
            },
            "time_range": {
                "type": "string",
                "enum": list(TIME_RANGES),
                "description": "Only news published within this range back from today.",
            },
            "days": {
                "type": "integer",
                "minimum": 1,
                "maximum": 365,
                "description": "Only recent news: rounded up to day, week, month or year.",
            },
        },
        ["query"],
    )


def tavily_tool(client: TavilyClient) -> Tool:
    """The ``fetch_finance_news`` tool over ``client``; tenant and user come from the caller."""
    schema = tavily_schema()

    async def run(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        if "days" in args and "time_range" in args:
            raise ToolFailure(INVALID_ARGUMENT, "give days or time_range, not both")
        time_range = args.get("time_range")
        if "days" in args:
            time_range = days_to_time_range(args["days"])
        try:
            return await client.search(
                args["query"],
                tenant_id=caller.tenant_id,
                user_id=caller.user_id,
                max_results=args.get("max_results", NEWS_MAX_RESULTS),
                time_range=time_range,
                search_depth=args.get("search_depth", NEWS_SEARCH_DEPTH),
            )
        except TavilyError as exc:
            raise ToolFailure(exc.code, exc.message) from None

    return Tool(
        FETCH_FINANCE_NEWS,
        "Search recent finance news on the web (Tavily). Returns titles, URLs, snippets and "
        "publication dates (published_at) as data; the URLs are not opened.",
        schema,
        run,
        content="external",  # web text: delimited as EXTERNAL, untrusted data
        doc_rate_keys=False,  # a web search: the tenant key
    )
