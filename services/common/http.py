"""Small helpers for the HTTP clients of external services (model runtime, Tavily, ...)."""

from __future__ import annotations

import ipaddress
import logging
import math
from urllib.parse import SplitResult, urlsplit

import httpx

from services.common.settings import SettingsError

TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
"""HTTP answers another attempt may fix: rate limited, or the upstream (or a gateway before
it) failing for now. Any other 5xx (501 Not Implemented, 505, ...) fails the same way again."""


def check_base_url(url: str, name: str) -> SplitResult:
    """`url`, the setting `name`, split; SettingsError unless it is an upstream's base URL:
    http(s) with a host, and no credentials, query or fragment (a key there would reach logs
    and traces, which is also why that error, checked first, leaves the URL out)."""
    parts = urlsplit(url)
    if parts.username or parts.password or parts.query or parts.fragment:
        raise SettingsError(f"{name} must not carry credentials, query or fragment")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SettingsError(f"{name}={url!r} is not an http(s) URL")
    return parts


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
    """A streamed response's (decoded) body, or None as soon as it runs past `cap` bytes:
    the rest is never read."""
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body.extend(chunk)
        if len(body) > cap:
            return None
    return bytes(body)
