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

Calls in flight at once: each is admitted with a `reserve`, the tokens it is expected to
charge (the executor gives about what a full result of prose holds, or 0 for a call that
returns no text), never more than the key's token limit. While it runs, a key's token
count is its charged tokens plus the reservations of its calls in flight; a call that
reserves tokens is admitted while that count is below the limit, a call that reserves
none while the charged tokens alone are. `Reservation.charge` replaces the reservation
with the real count; `Reservation.release` (the call ended, failed or was cancelled)
drops what is left of it. So calls running at once are refused only once the tokens used
and expected reach the limit, and a call that runs alone is admitted and charged exactly
as above. A reservation is an estimate, not a bound: calls in flight that charge more
than they reserved take the key past its limit by that much, as the one crossing call
does. A call refused only for the reservations in flight is told to retry after
IN_FLIGHT_WAIT_S; otherwise after the charged tokens fall below the limit.
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
    """Calls per `tenant_id:doc_id` in the window (MCP_PROXY_RATE_LIMIT_CALLS_PER_MIN); 0
    switches this limit off."""
    tokens_per_minute: int = 100_000
    """Result tokens per `tenant_id:doc_id` in the window (MCP_PROXY_RATE_LIMIT_TOKENS_PER_MIN);
    0 switches this limit off."""
    tenant_calls_per_minute: int = 120
    """Calls per tenant of tools that read no named document: searches (whatever document ids
    they filter on) and external data; and, apart from those, calls that named a document
    the tenant does not have (MCP_PROXY_RATE_LIMIT_TENANT_CALLS_PER_MIN); 0 switches this
    limit off."""
    tenant_tokens_per_minute: int = 200_000
    """Result tokens per tenant of tools that read no named document: searches and external
    data (MCP_PROXY_RATE_LIMIT_TENANT_TOKENS_PER_MIN); 0 switches this limit off."""
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
    while it runs, what is left of its reservation."""

    __slots__ = ("at", "live", "reserved", "tokens")

    def __init__(self, at: float, reserved: int = 0) -> None:
        self.at = at
        self.tokens = 0
        self.reserved = reserved
        """Tokens the running call still holds on the key (its reservation less what it
        charged); 0 once it is released."""
        self.live = True
        """False once the entry has left its window (its tokens no longer count)."""


class _Window:
    """The calls of one key inside the window, oldest first, with the tokens they charged and
    those the calls in flight still hold."""

    __slots__ = ("charged", "entries", "reserved")

    def __init__(self) -> None:
        self.entries: deque[_Entry] = deque()
        self.charged = 0
        self.reserved = 0

    def prune(self, now: float, window: float) -> None:
        while self.entries and self.entries[0].at + window <= now:
            gone = self.entries.popleft()
            gone.live = False
            self.charged -= gone.tokens
            self.reserved -= gone.reserved

    def calls_wait(self, limit: int, now: float, window: float) -> float:
        """Seconds until one more call fits under `limit` calls (0 when it fits now)."""
        if not limit or len(self.entries) < limit:
            return 0.0
        # The oldest len-limit+1 calls must leave the window first.
        return self.entries[len(self.entries) - limit].at + window - now

    def tokens_wait(self, limit: int, now: float, window: float, *, reserves: bool) -> float:
        """Seconds until a call fits under `limit` tokens (0 when it fits now).

        A call that `reserves` tokens fits while the charged tokens plus the reservations in
        flight are below the limit; one that reserves none, while the charged tokens are.
        When only the reservations take the key to its limit, IN_FLIGHT_WAIT_S: they end
        soon, and most charge less than they reserved."""
        if not limit or self.charged + (self.reserved if reserves else 0) < limit:
            return 0.0
        if self.charged < limit:
            return IN_FLIGHT_WAIT_S
        left = self.charged
        for entry in self.entries:
            left -= entry.tokens
            if left < limit:
                return entry.at + window - now
        return 0.0  # unreachable: with every entry gone the sum is 0 < limit


class Reservation:
    """The calls one tool call was admitted as; `charge` adds its result tokens to them and
    `release` drops what is left of its reservation once the call has ended (always call
    it)."""

    def __init__(
        self, entries: dict[RateKey, tuple[_Entry, _Window]], lock: threading.Lock
    ) -> None:
        self._entries = entries
        self._lock = lock

    @property
    def keys(self) -> tuple[RateKey, ...]:
        """The keys the call was counted against."""
        return tuple(self._entries)

    @property
    def reserved(self) -> dict[RateKey, int]:
        """The tokens the call still holds on each of its keys."""
        with self._lock:
            return {key: entry.reserved for key, (entry, _) in self._entries.items()}

    def charge(self, tokens: int, doc_id: str | None = None) -> None:
        """Add `tokens` to the key of `doc_id` when the call named it, else to all its keys;
        they replace as much of the call's reservation on that key."""
        if tokens <= 0:
            return
        targets = [k for k in self._entries if k[1] == doc_id] if doc_id is not None else []
        with self._lock:
            for key in targets or list(self._entries):
                entry, window = self._entries[key]
                from_reserve = min(entry.reserved, tokens)
                entry.reserved -= from_reserve
                entry.tokens += tokens
                if entry.live:
                    window.reserved -= from_reserve
                    window.charged += tokens

    def release(self) -> None:
        """The call has ended (served, failed or cancelled): drop what is left of its
        reservation. Idempotent."""
        with self._lock:
            for entry, window in self._entries.values():
                if entry.live:
                    window.reserved -= entry.reserved
                entry.reserved = 0


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

    def acquire(self, tenant_id: str, doc_ids: Sequence[str] = (), reserve: int = 0) -> Reservation:
        """Admit one call naming `doc_ids` (none: the tenant's key) or raise RateLimitExceeded.

        All keys are checked before any is counted, so a refused call counts nowhere. A call
        naming documents is also checked, not counted, against the tenant's
        UNKNOWN_DOCUMENTS key. `reserve` is the tokens the call is expected to charge to each
        key: it holds them, cut to the key's token limit, until its `Reservation` charges or
        releases them; a call that reserves none is refused for charged tokens only.
        """
        keys: list[RateKey] = [(tenant_id, d) for d in dict.fromkeys(doc_ids)] or [
            (tenant_id, None)
        ]
        checked = [*keys, (tenant_id, UNKNOWN_DOCUMENTS)] if doc_ids else keys
        window_s = self.limits.window_seconds
        reserves = reserve > 0
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
                    (
                        "tokens",
                        tokens,
                        window.tokens_wait(tokens, now, window_s, reserves=reserves),
                    ),
                ):
                    if wait > 0:
                        retry = whole_seconds(wait)
                        if worst is None or retry > worst.retry_after_s:
                            worst = RateLimitExceeded(key, what, limit, retry)
            if worst is not None:
                raise worst
            entries: dict[RateKey, tuple[_Entry, _Window]] = {}
            for key in keys:
                held = _reservation(reserve, self._limits_of(key)[1])
                entry = _Entry(now, held)
                window = self._windows.setdefault(key, _Window())
                window.entries.append(entry)
                window.reserved += held
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


def _reservation(reserve: int, limit: int) -> int:
    """What a call reserving `reserve` tokens holds on a key of token limit `limit`: never
    more than the limit (one call cannot hold a key past full), nothing when the limit is
    off (no count to hold a place in)."""
    return max(0, min(reserve, limit)) if limit else 0
