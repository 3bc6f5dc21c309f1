"""Small helpers for the HTTP clients of external services (model runtime, Tavily, ...)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import re
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import SplitResult, urlsplit

import httpx

from services.common.settings import MAX_PORT, SettingsError

T = TypeVar("T")

TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
"""HTTP answers another attempt may fix: rate limited, or the upstream (or a gateway before
it) failing for now. Any other 5xx (501 Not Implemented, 505, ...) fails the same way again."""


def check_base_url(url: str, name: str) -> SplitResult:
    """`url`, the setting `name`, split; SettingsError unless it is an upstream's base URL:
    http(s) with a host, a port (when given) in 1..MAX_PORT, and no credentials, query or
    fragment (a key there would reach logs and traces, which is also why that error, checked
    first, leaves the URL out)."""
    parts = urlsplit(url)
    if parts.username or parts.password or parts.query or parts.fragment:
        raise SettingsError(f"{name} must not carry credentials, query or fragment")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SettingsError(f"{name}={url!r} is not an http(s) URL")
    _check_port(parts, url, name)
    return parts


def check_public_api_url(url: str, name: str) -> SplitResult:
    """`check_base_url` for a public API's URL (the Bank of Russia, Tavily): https, or http
    only to this machine (a local stand-in or fake), so a key or a query never crosses the
    network in clear."""
    parts = check_base_url(url, name)
    if parts.scheme != "https" and not is_loopback_host(parts.hostname):
        raise SettingsError(f"{name}={url!r} must be an https URL (http only to localhost)")
    return parts


def _check_port(parts: SplitResult, url: str, name: str) -> None:
    """SettingsError unless the port of `url` (split into `parts`) is absent or in
    1..MAX_PORT in ASCII digits: urlsplit reads it only when asked, and httpx refuses one it
    cannot read only at the first request, with InvalidURL rather than an HTTP error."""
    try:
        port = parts.port
    except ValueError:
        port = -1
    if port is not None and not 1 <= port <= MAX_PORT:
        raise SettingsError(f"{name}={url!r}: the port is not a number in 1..{MAX_PORT}")


def is_loopback_host(host: str | None) -> bool:
    """`host` names this machine: ``localhost`` or a loopback address (127.0.0.0/8, ::1),
    as a URL's hostname or a bind address gives it."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


def endpoint_url(url: str, path: str, *, full_suffix: str = "") -> str:
    """The URL a request to an upstream's API `path` (``/v1/embeddings``, ``/rerank``) goes to,
    from its configured `url`: the server's base (``http://tei:8080``, ``https://h/api``), that
    base plus ``/v1`` when `path` starts with ``/v1/``, or the full endpoint (base + `path`).

    Surrounding whitespace and trailing slashes do not matter, and only the URL's path is read
    (``http://v1`` and ``http://embeddings`` are hosts). From the end of that path, `path` less
    its leading ``/v1`` (``/chat/completions``) is dropped, then ``/v1`` when `path` starts with
    it, and `path` is appended. A path ending with `full_suffix`, when given, is the endpoint as
    configured (a rerank API's ``/rerank`` keeps ``…/v2/rerank``)."""
    parts = urlsplit(url.strip())
    route = parts.path.rstrip("/")
    if not (full_suffix and route.endswith(full_suffix)):
        route = route.removesuffix(path.removeprefix("/v1")).rstrip("/")
        if path.startswith("/v1/"):
            route = route.removesuffix("/v1").rstrip("/")
        route += path
    return parts._replace(path=route).geturl()


def retry_after_seconds(value: str | None) -> float | None:
    """Retry-After as seconds (delta-seconds form); None when absent or an HTTP date, so the
    caller falls back to its own backoff."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def quiet_http_client_logs() -> None:
    """httpx logs every request at INFO ("HTTP Request: POST …"): one record per model call,
    on the event loop, saying less than the services' own lines (the LLM service's runtime
    call outcome and latency are in its DEBUG "llm runtime call" record and its INFO
    "generate" summary). Unless LOG_LEVEL is DEBUG, or someone set httpx's level, they
    are kept to warnings."""
    logger = logging.getLogger("httpx")
    if logger.level == logging.NOTSET and not logging.getLogger().isEnabledFor(logging.DEBUG):
        logger.setLevel(logging.WARNING)


async def read_capped(response: httpx.Response, cap: int) -> bytes | None:
    """A streamed response's decoded body, or None as soon as it runs past `cap` bytes: the
    rest is never read. A compressed body is inflated here, never more than one byte past
    `cap` (httpx would inflate each received chunk whole: 64 KB of gzip holds 64 MB).
    Raises httpx.DecodingError for a body that does not inflate, or an encoding other than
    gzip, deflate or identity (all that httpx asks for)."""
    try:
        read = response.content  # a response already read whole (an in-process transport)
    except httpx.ResponseNotRead:
        pass
    else:
        return read if len(read) <= cap else None
    inflate = _inflater(response.headers.get("content-encoding", ""))
    body = bytearray()
    async for chunk in response.aiter_raw():
        body += inflate(chunk, cap + 1 - len(body))
        if len(body) > cap:
            return None
    body += inflate(b"", cap + 1 - len(body))
    return None if len(body) > cap else bytes(body)


Inflate = Callable[[bytes, int], bytes]
"""Takes the next raw bytes ("" at the end) and the most decoded bytes to give back."""


def _inflater(header: str) -> Inflate:
    encodings = [e.strip().lower() for e in header.split(",") if e.strip()]
    encodings = [e for e in encodings if e != "identity"]
    if not encodings:
        return lambda data, room: data
    if encodings == ["gzip"]:
        return _ZlibInflater(zlib.MAX_WBITS | 16)
    if encodings == ["deflate"]:
        return _ZlibInflater(zlib.MAX_WBITS, raw_fallback=True)
    raise httpx.DecodingError(f"unsupported Content-Encoding {header!r}")


class _ZlibInflater:
    """gzip or deflate (zlib-wrapped, or raw as some servers send it: tried when the wrapped
    form fails before giving any output), giving back at most `room` bytes a call and
    keeping the input it did not inflate yet."""

    def __init__(self, wbits: int, *, raw_fallback: bool = False) -> None:
        self._zlib = zlib.decompressobj(wbits)
        self._tail = b""
        self._seen: bytes | None = b"" if raw_fallback else None  # input before any output

    def __call__(self, data: bytes, room: int) -> bytes:
        data, self._tail = self._tail + data, b""
        if not data or room <= 0:
            self._tail = data
            return b""
        if self._seen is not None:
            self._seen += data
        try:
            out = self._zlib.decompress(data, room)
        except zlib.error:
            if self._seen is None:
                raise httpx.DecodingError("the body does not inflate") from None
            data, self._seen = self._seen, None
            self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)
            return self(data, room)
        if out:
            self._seen = None
        self._tail = self._zlib.unconsumed_tail
        return out


MAX_LINK_CHARS = 2048
"""The longest link an outside service's answer may give (a longer one is dropped)."""
_NOT_IN_A_LINK = re.compile(r"[\s\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]")
"""Characters no URL holds (white space, controls, invisible format characters): a "link"
with them is prose, which must not reach the model outside the EXTERNAL delimiters."""


def shown_link(value: Any) -> str | None:
    """`value` as a link an outside service's answer gives (a web result's, a bank news
    item's): an http(s) URL with a host, at most MAX_LINK_CHARS, none of _NOT_IN_A_LINK's
    characters; else None. Such links are shown as data, never fetched."""
    if not isinstance(value, str):
        return None
    url = value.strip()
    if len(url) > MAX_LINK_CHARS or _NOT_IN_A_LINK.search(url):
        return None
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    return url if parts.scheme in ("http", "https") and parts.hostname else None


async def settled(
    work: Awaitable[T], *, orphan: Callable[[T], Awaitable[object]] | None = None
) -> T:
    """`work` (an httpx send or read) in a task of its own, so that however many times the
    caller is cancelled (its own timer and its caller's deadline at one instant), the work is
    cancelled once, and finishes its cleanup before the caller's cancellation goes on.

    httpcore releases a connection when a read is cancelled, inside a cancel-shielded scope;
    asyncio's own second `cancel()` reaches through that scope, and the connection was left
    taken in the pool for good (256 such calls wedged the LLM service). `orphan` disposes of
    a result the work produced after the caller had gone (a response: closed)."""
    task: asyncio.Future[T] = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.cancel()
        while not task.done():
            try:
                await asyncio.shield(task)  # further cancellations land here, not in the work
            except (asyncio.CancelledError, Exception):
                continue  # the work's own end is what it was cancelled into: not ours to raise
        if orphan is not None and not task.cancelled() and task.exception() is None:
            await asyncio.shield(asyncio.ensure_future(orphan(task.result())))
        raise


@dataclass(frozen=True)
class Fetched:
    """An upstream's whole answer: its status, its headers and its decoded body (None: longer
    than the cap, the rest never read)."""

    status: int
    headers: httpx.Headers
    body: bytes | None


async def fetch_capped(
    http: httpx.AsyncClient, method: str, url: str, *, cap: int, **request: Any
) -> Fetched:
    """One exchange with an upstream's API: `request` (``content``/``json``, ``headers``,
    ``timeout``) sent as `method` to `url`, redirects not followed, and the body read up to
    `cap` bytes (`read_capped`). The send and the read each run `settled`, so a caller
    cancelled twice at one instant (its own timer and its caller's deadline) leaves its
    connection free; the response is closed however the read ends. Raises what httpx raises
    (timeouts, transport errors, httpx.DecodingError)."""
    sent = http.build_request(method, url, **request)
    response = await settled(
        http.send(sent, stream=True, follow_redirects=False), orphan=httpx.Response.aclose
    )
    try:
        body = await settled(read_capped(response, cap))
    finally:
        await response.aclose()
    return Fetched(response.status_code, response.headers, body)
