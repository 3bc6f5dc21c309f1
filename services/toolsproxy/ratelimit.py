"""Per-tenant, per-document rate limits on tool calls: calls and result tokens in a sliding window.

Keys are `tenant_id:doc_id` for a call that reads named documents (one key per document),
and `tenant_id:*` for a call that reads none (a search, whose document ids only filter it;
external data); calls that named what the tenant does not have are counted once more on the
tenant's UNKNOWN_DOCUMENTS key. Each key keeps a log of its calls in the last `window_seconds` (one entry
per call: when, and the tokens its result carried), so both limits are exact and the wait
until a call fits again is known.

Tokens are charged after the call, once its result is known: a call is admitted while the
key is below both limits, and the call that crosses the token limit is served in full; the
next one waits. A limit of 0 switches that limit off.

Calls in flight at once: each is admitted with `bound`, the most tokens it can charge (the
executor gives its text byte budget: a cl100k token is at least one UTF-8 byte), and a
key's token count is its charged tokens plus the bounds of its calls in flight.
`Reservation.charge` replaces the bound with the real count; `Reservation.release` (the
call ended, failed or was cancelled) drops what is left of it. So the calls admitted on a
key carry at most the limit plus the one call that crosses it, however many run at once,
and a call that runs alone is admitted and charged exactly as above. A call refused only
for the bounds in flight is told to retry after IN_FLIGHT_WAIT_S; otherwise the retry-after
assumes every call in flight charges its whole bound (it may be longer than needed, never
shorter).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.common.retry import whole_seconds

_SWEEP_EVERY = 1024
"""Acquisitions between sweeps that drop keys with nothing left in their window."""


IN_FLIGHT_WAIT_S = 1.0
"""The retry-after of a call refused only for the calls in flight on its key."""


@dataclass(frozen=True)
class RateLimits:
    """Rate limits of tool calls (MCP_PROXY_RATE_LIMIT_*); 0 switches a limit off."""

    calls_per_minute: int = 60
    """Calls per `tenant_id:doc_id` in the window (MCP_PROXY_RATE_LIMIT_CALLS_PER_MIN)."""
    tokens_per_minute: int = 100_000
    """Result tokens per `tenant_id:doc_id` in the window (MCP_PROXY_RATE_LIMIT_TOKENS_PER_MIN)."""
    tenant_calls_per_minute: int = 120
    """Calls per tenant of tools that read no named document: searches (whatever document ids
    they filter on) and external data; and, apart from those, calls that named a document
    the tenant does not have (MCP_PROXY_RATE_LIMIT_TENANT_CALLS_PER_MIN)."""
    tenant_tokens_per_minute: int = 200_000
    """Result tokens per tenant of tools that read no named document: searches and external
    data (MCP_PROXY_RATE_LIMIT_TENANT_TOKENS_PER_MIN)."""
    window_seconds: float = 60.0
    """Length of the sliding window; the limits above are per this window."""


RateKey = tuple[str, str | None]
"""(tenant_id, doc_id); doc_id None is the tenant's key for calls that read no named document."""

UNKNOWN_DOCUMENTS = "\x00unknown documents"
"""The doc_id of a tenant's key for calls that named what it does not have (a document, or a
section, chunk or page of one: NOT_FOUND): each is counted there after the fact
(`RateLimiter.record_unknown`), under the tenant limits, and a call naming documents is
refused while that key is at its limit. Made-up ids would otherwise each get a key of their
own and never meet a limit."""


class RateLimitExceeded(Exception):
    """A key is at its limit; `retry_after_s` whole seconds until the next call fits."""

    def __init__(self, key: RateKey, what: str, limit: int, retry_after_s: int) -> None:
        scope = (
            "tenant"
            if key[1] is None
            else "tenant's calls naming unknown documents"
            if key[1] == UNKNOWN_DOCUMENTS
            else f"document {key[1]!r}"
        )
        super().__init__(
            f"rate limit of {limit} {what} per minute for this {scope} reached;"
            f" retry after {retry_after_s} s"
        )
        self.key = key
        self.what = what
        self.limit = limit
        self.retry_after_s = retry_after_s


class _Entry:
    """One admitted call: when, the tokens its result carried (filled in after the call) and,
    while it runs, the most it can still charge."""

    __slots__ = ("at", "live", "pending", "tokens")

    def __init__(self, at: float, pending: int = 0) -> None:
        self.at = at
        self.tokens = 0
        self.pending = pending
        """Tokens the running call may still charge (its bound less what it charged); 0 once
        it is released."""
        self.live = True
        """False once the entry has left its window (its tokens no longer count)."""


class _Window:
    """The calls of one key inside the window, oldest first, with their token sum (charged
    tokens plus what the calls in flight may still charge)."""

    __slots__ = ("entries", "tokens")

    def __init__(self) -> None:
        self.entries: deque[_Entry] = deque()
        self.tokens = 0

    def prune(self, now: float, window: float) -> None:
        while self.entries and self.entries[0].at + window <= now:
            gone = self.entries.popleft()
            gone.live = False
            self.tokens -= gone.tokens + gone.pending

    def calls_wait(self, limit: int, now: float, window: float) -> float:
        """Seconds until one more call fits under `limit` calls (0 when it fits now)."""
        if not limit or len(self.entries) < limit:
            return 0.0
        # The oldest len-limit+1 calls must leave the window first.
        return self.entries[len(self.entries) - limit].at + window - now

    def tokens_wait(self, limit: int, now: float, window: float) -> float:
        """Seconds until the tokens in the window drop below `limit` (0 when they are); when
        only the bounds of calls in flight take it there, IN_FLIGHT_WAIT_S (they end soon,
        and most charge far less than their bound)."""
        if not limit or self.tokens < limit:
            return 0.0
        if self.tokens - sum(e.pending for e in self.entries) < limit:
            return IN_FLIGHT_WAIT_S
        left = self.tokens
        for entry in self.entries:
            left -= entry.tokens + entry.pending
            if left < limit:
                return entry.at + window - now
        return 0.0  # unreachable: with every entry gone the sum is 0 < limit


class Reservation:
    """The calls one tool call was admitted as; `charge` adds its result tokens to them and
    `release` drops what is left of its bound once the call has ended (always call it)."""

    def __init__(
        self, entries: dict[RateKey, tuple[_Entry, _Window]], lock: threading.Lock
    ) -> None:
        self._entries = entries
        self._lock = lock

    @property
    def keys(self) -> tuple[RateKey, ...]:
        """The keys the call was counted against."""
        return tuple(self._entries)

    def charge(self, tokens: int, doc_id: str | None = None) -> None:
        """Add `tokens` to the key of `doc_id` when the call named it, else to all its keys;
        they replace as much of the call's bound on that key."""
        if tokens <= 0:
            return
        targets = [k for k in self._entries if k[1] == doc_id] if doc_id is not None else []
        with self._lock:
            for key in targets or list(self._entries):
                entry, window = self._entries[key]
                from_bound = min(entry.pending, tokens)
                entry.pending -= from_bound
                entry.tokens += tokens
                if entry.live:
                    window.tokens += tokens - from_bound

    def release(self) -> None:
        """The call has ended (served, failed or cancelled): drop what is left of its bound.
        Idempotent."""
        with self._lock:
            for entry, window in self._entries.values():
                if entry.live:
                    window.tokens -= entry.pending
                entry.pending = 0


class RateLimiter:
    """Sliding-window limits by calls and by tokens per `tenant_id:doc_id` (and per tenant).

    Thread-safe. `clock` is a monotonic clock in seconds, injectable for tests.
    """

    def __init__(
        self, limits: RateLimits | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limits = limits or RateLimits()
        self._clock = clock
        self._lock = threading.Lock()
        self._windows: dict[RateKey, _Window] = {}
        self._since_sweep = 0

    def _limits_of(self, key: RateKey) -> tuple[int, int]:
        if key[1] is None or key[1] == UNKNOWN_DOCUMENTS:
            return self.limits.tenant_calls_per_minute, self.limits.tenant_tokens_per_minute
        return self.limits.calls_per_minute, self.limits.tokens_per_minute

    def acquire(self, tenant_id: str, doc_ids: Sequence[str] = (), bound: int = 0) -> Reservation:
        """Admit one call naming `doc_ids` (none: the tenant's key) or raise RateLimitExceeded.

        All keys are checked before any is counted, so a refused call counts nowhere. A call
        naming documents is also checked, not counted, against the tenant's
        UNKNOWN_DOCUMENTS key. `bound` is the most tokens the call can charge to any one key:
        it counts on each key until the call's `Reservation` charges or releases it.
        """
        keys: list[RateKey] = [(tenant_id, d) for d in dict.fromkeys(doc_ids)] or [
            (tenant_id, None)
        ]
        checked = [*keys, (tenant_id, UNKNOWN_DOCUMENTS)] if doc_ids else keys
        window_s = self.limits.window_seconds
        with self._lock:
            now = self._clock()
            self._sweep(now)
            worst: RateLimitExceeded | None = None
            for key in checked:
                window = self._windows.get(key)
                if window is None:
                    continue
                window.prune(now, window_s)
                calls, tokens = self._limits_of(key)
                for what, limit, wait in (
                    ("calls", calls, window.calls_wait(calls, now, window_s)),
                    ("tokens", tokens, window.tokens_wait(tokens, now, window_s)),
                ):
                    if wait > 0:
                        retry = whole_seconds(wait)
                        if worst is None or retry > worst.retry_after_s:
                            worst = RateLimitExceeded(key, what, limit, retry)
            if worst is not None:
                raise worst
            entries: dict[RateKey, tuple[_Entry, _Window]] = {}
            pending = max(0, bound)
            for key in keys:
                entry = _Entry(now, pending)
                window = self._windows.setdefault(key, _Window())
                window.entries.append(entry)
                window.tokens += pending
                entries[key] = (entry, window)
            return Reservation(entries, self._lock)

    def record_unknown(self, tenant_id: str) -> None:
        """A call of the tenant named a document it does not have: count it on the tenant's
        UNKNOWN_DOCUMENTS key."""
        with self._lock:
            now = self._clock()
            window = self._windows.setdefault((tenant_id, UNKNOWN_DOCUMENTS), _Window())
            window.prune(now, self.limits.window_seconds)
            window.entries.append(_Entry(now))

    def _sweep(self, now: float) -> None:
        """Every so often, forget keys with no call left in the window (bounded memory)."""
        self._since_sweep += 1
        if self._since_sweep < _SWEEP_EVERY:
            return
        self._since_sweep = 0
        for key in list(self._windows):
            window = self._windows[key]
            window.prune(now, self.limits.window_seconds)
            if not window.entries:
                del self._windows[key]  # a late charge to it finds its entries no longer live

    def tracked_keys(self) -> int:
        """How many keys the limiter holds (the tests check that idle keys are let go)."""
        with self._lock:
            return len(self._windows)
