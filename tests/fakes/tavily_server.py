"""A real local HTTP server speaking the Tavily Search API (``POST /search``).

Follows Tavily's documented contract (docs.tavily.com, API reference "Search"; the
``tavily-python`` client's parsing):

- auth: ``Authorization: Bearer <key>`` (what the official client sends) or the legacy
  ``api_key`` body field; missing or wrong -> 401
  ``{"detail": {"error": "Unauthorized: missing or invalid API key."}}``;
- errors: ``{"detail": {"error": "<message>"}}`` with 400 (bad fields), 401, 429, 432, 5xx;
- request fields checked as the API does: ``query`` (required, non-empty string),
  ``topic`` (general | news | finance), ``search_depth`` (basic | advanced | fast |
  ultra-fast), ``max_results`` (0..20), ``time_range`` (day | week | month | year | d | w
  | m | y), ``days`` (> 0); unknown fields are ignored;
- response: ``{query, follow_up_questions, answer, images, results[{title, url, content,
  score, raw_content, published_date?}], response_time, request_id}``; ``published_date``
  (RFC 1123, as Tavily's news results carry it) only when the request's
  ``include_published_date`` (default false) is true, or for the news topic, which dates
  its results without being asked.

Results are deterministic functions of the request. Faults on demand: ``fail_next`` (5xx
with the API's error body), ``rate_limit_next`` (429 with ``Retry-After``), ``hang_next``
(no answer until the server stops), ``drop_next`` (close without answering),
``garbage_next`` (200 with a body of the wrong shape), ``raw_next`` (200 with the bytes and
headers given, optionally a longer Content-Length whose rest never comes). Every request is
recorded.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.fakes.threaded_http import QuietHTTPServer

TOPICS = ("general", "news", "finance")
DEPTHS = ("basic", "advanced", "fast", "ultra-fast")
TIME_RANGES = ("day", "week", "month", "year", "d", "w", "m", "y")
UNAUTHORIZED = "Unauthorized: missing or invalid API key."
RATE_LIMITED = (
    "Your request has been blocked due to excessive requests. Please reduce rate of requests."
)


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server saw it (headers with their original capitalisation)."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


def _error(message: str) -> dict[str, Any]:
    return {"detail": {"error": message}}


def make_results(
    query: str, topic: str, count: int, depth: str, dated: bool
) -> list[dict[str, Any]]:
    """The deterministic results the fake returns for a query; `dated`: with their
    published_date."""
    slug = "-".join(query.lower().split())[:60] or "q"
    results: list[dict[str, Any]] = []
    for i in range(count):
        item: dict[str, Any] = {
            "title": f"{query} — market report {i + 1}",
            "url": f"https://news.example.com/{topic}/{slug}/{i + 1}",
            "content": (
                f"Report {i + 1} on {query}: analysts discuss rates, inflation and markets."
                + (" [...] More detail from the advanced search." if depth == "advanced" else "")
            ),
            "score": round(0.9 - 0.1 * i, 4),
            "raw_content": None,
        }
        if dated:
            item["published_date"] = f"Mon, {10 + i:02d} Mar 2025 09:30:00 GMT"
        results.append(item)
    return results


class FakeTavilyServer:
    """Threaded HTTP server on 127.0.0.1, port 0; use as a context manager."""

    def __init__(self, *, api_key: str = "tvly-test-key") -> None:
        self.api_key = api_key
        self.requests: list[RecordedRequest] = []
        self.results_override: list[Any] | None = None
        """When set, returned verbatim (max_results ignored) instead of the generated results:
        for testing how clients cope with odd answers."""
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._faults: list[tuple[str, int, str | None]] = []
        self._raw: list[tuple[bytes, dict[str, str], int | None]] = []
        self._served = 0
        self._server = QuietHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    # -- lifecycle --------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321`` (the client appends ``/search``)."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeTavilyServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release.set()  # let hanging handlers finish
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeTavilyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults -----------------------------------------------------------------------

    def fail_next(self, times: int, status: int = 503, message: str | None = None) -> None:
        """Answer the next ``times`` requests with ``status`` and the API's error body."""
        text = message or ("Internal Server Error" if status >= 500 else "Bad Request")
        with self._lock:
            self._faults.extend([("fail", status, text)] * times)

    def rate_limit_next(self, times: int = 1, retry_after: str | None = "1") -> None:
        """Answer the next ``times`` requests 429, with ``Retry-After`` unless None."""
        with self._lock:
            self._faults.extend([("429", 429, retry_after)] * times)

    def hang_next(self, times: int = 1) -> None:
        """Do not answer the next ``times`` requests until the server stops."""
        with self._lock:
            self._faults.extend([("hang", 0, None)] * times)

    def drop_next(self, times: int = 1) -> None:
        """Close the next ``times`` connections without an answer."""
        with self._lock:
            self._faults.extend([("drop", 0, None)] * times)

    def garbage_next(self, times: int = 1) -> None:
        """Answer the next ``times`` requests 200 with a body that is not the API's shape."""
        with self._lock:
            self._faults.extend([("garbage", 0, None)] * times)

    def raw_next(
        self, body: bytes, headers: dict[str, str] | None = None, *, length: int | None = None
    ) -> None:
        """Answer the next request 200 with `body` as is and `headers`. With `length` over
        len(body), Content-Length says `length` and, once `body` is sent, the connection is
        held without another byte until the server stops."""
        with self._lock:
            self._raw.append((body, dict(headers or {}), length))
            self._faults.append(("raw", 200, None))

    def _next_raw(self) -> tuple[bytes, dict[str, str], int | None]:
        with self._lock:
            return self._raw.pop(0)

    def _next_fault(self) -> tuple[str, int, str | None] | None:
        with self._lock:
            return self._faults.pop(0) if self._faults else None

    # -- protocol ---------------------------------------------------------------------

    def _validate(self, body: Any) -> str | None:
        """The API's 400 message for a bad body, or None when the body is acceptable."""
        if not isinstance(body, dict):
            return "Invalid request body. Expected a JSON object."
        query = body.get("query")
        if not isinstance(query, str) or not query.strip():
            return "Query is missing or invalid."
        topic = body.get("topic", "general")
        if topic not in TOPICS:
            return "Invalid topic. Must be 'general', 'news' or 'finance'."
        depth = body.get("search_depth", "basic")
        if depth not in DEPTHS:
            return "Invalid search depth. Must be 'basic', 'advanced', 'fast' or 'ultra-fast'."
        max_results = body.get("max_results", 5)
        if type(max_results) is not int or not 0 <= max_results <= 20:
            return "max_results must be an integer between 0 and 20."
        time_range = body.get("time_range")
        if time_range is not None and time_range not in TIME_RANGES:
            return "Invalid time range. Must be 'day', 'week', 'month' or 'year'."
        days = body.get("days")
        if days is not None and (type(days) is not int or days <= 0):
            return "days must be a positive integer."
        return None

    def _answer(self, body: dict[str, Any]) -> dict[str, Any]:
        query: str = body["query"]
        topic = body.get("topic", "general")
        depth = body.get("search_depth", "basic")
        count: int = body.get("max_results", 5)
        if self.results_override is not None:
            results = [dict(r) if isinstance(r, dict) else r for r in self.results_override]
        else:
            dated = topic == "news" or body.get("include_published_date") is True
            results = make_results(query, topic, count, depth, dated)
        if body.get("include_raw_content"):
            for r in results:
                if isinstance(r, dict):
                    r["raw_content"] = f"Full text of {r.get('title', '')}."
        with self._lock:
            self._served += 1
            served = self._served
        answer = body.get("include_answer")
        return {
            "query": query,
            "follow_up_questions": None,
            "answer": f"A short answer about {query}." if answer else None,
            "images": [],
            "results": results,
            "response_time": 1.23,
            "request_id": f"00000000-0000-4000-8000-{served:012d}",
        }

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

            def _send(
                self, status: int, payload: Any, headers: dict[str, str] | None = None
            ) -> None:
                data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._send(405, {"detail": "Method Not Allowed"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length) if length else b""
                try:
                    body: Any = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                with fake._lock:
                    fake.requests.append(
                        RecordedRequest("POST", self.path, dict(self.headers.items()), body)
                    )
                if self.path != "/search":
                    self._send(404, {"detail": "Not Found"})
                    return
                fault = fake._next_fault()
                if fault is not None:
                    kind, status, extra = fault  # extra: Retry-After for 429, message for "fail"
                    if kind == "hang":
                        fake._release.wait()
                        self.close_connection = True
                        return
                    if kind == "drop":
                        self.close_connection = True
                        return
                    if kind == "raw":
                        data, headers, length = fake._next_raw()
                        self.send_response(200)
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Content-Length", str(length or len(data)))
                        for name, value in headers.items():
                            self.send_header(name, value)
                        self.end_headers()
                        self.wfile.write(data)
                        self.wfile.flush()
                        if length is not None and length > len(data):
                            fake._release.wait()
                            self.close_connection = True
                        return
                    if kind == "garbage":
                        self._send(200, {"unexpected": True, "results": "none"})
                        return
                    if kind == "429":
                        headers = {"Retry-After": extra} if extra is not None else {}
                        self._send(429, _error(RATE_LIMITED), headers)
                        return
                    self._send(status, _error(extra or "Internal Server Error"))
                    return
                auth = self.headers.get("Authorization", "")
                body_key = body.get("api_key") if isinstance(body, dict) else None
                if auth != f"Bearer {fake.api_key}" and body_key != fake.api_key:
                    self._send(401, _error(UNAUTHORIZED))
                    return
                problem = fake._validate(body)
                if problem is not None:
                    self._send(400, _error(problem))
                    return
                self._send(200, fake._answer(body))

        return Handler
