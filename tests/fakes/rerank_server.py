"""A real local HTTP rerank server speaking TEI's ``/rerank`` and Cohere/Jina's ``/v1/rerank``.

Scores are deterministic word overlap (the share of the query's words found in a text),
in [0, 1] like TEI's sigmoid scores and Cohere's relevance scores. Faults on demand:
``fail_next`` (5xx with the API's error body), ``hang_next`` (no answer until released),
``garbage_next`` (200 with a body that is not the API's shape), ``drop_next`` (close the
connection without answering). Every request is recorded.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.fakes.threaded_http import QuietHTTPServer

_WORD = re.compile(r"\w+", re.UNICODE)


def overlap_score(query: str, text: str) -> float:
    """Share of the query's distinct lowercase words present in ``text``."""
    q = set(_WORD.findall(query.lower()))
    if not q:
        return 0.0
    return len(q & set(_WORD.findall(text.lower()))) / len(q)


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server saw it."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


class FakeRerankServer:
    """Threaded HTTP server on 127.0.0.1, port 0; use as a context manager."""

    def __init__(self, *, api_key: str | None = None, max_batch_size: int = 32) -> None:
        self.api_key = api_key
        self.max_batch_size = max_batch_size
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._faults: list[tuple[str, int]] = []
        self._server = QuietHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    # -- lifecycle --------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321``."""
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}"

    def start(self) -> FakeRerankServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release.set()  # let hanging handlers finish
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeRerankServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults -----------------------------------------------------------------------

    def fail_next(self, times: int, status: int = 503) -> None:
        """Answer the next ``times`` requests with ``status`` and the API's error body."""
        with self._lock:
            self._faults.extend([("fail", status)] * times)

    def hang_next(self, times: int = 1) -> None:
        """Do not answer the next ``times`` requests until the server stops."""
        with self._lock:
            self._faults.extend([("hang", 0)] * times)

    def garbage_next(self, times: int = 1) -> None:
        """Answer the next ``times`` requests 200 with a body of the wrong shape."""
        with self._lock:
            self._faults.extend([("garbage", 0)] * times)

    def drop_next(self, times: int = 1) -> None:
        """Close the next ``times`` connections without an answer."""
        with self._lock:
            self._faults.extend([("drop", 0)] * times)

    def _next_fault(self) -> tuple[str, int] | None:
        with self._lock:
            return self._faults.pop(0) if self._faults else None

    # -- protocol ---------------------------------------------------------------------

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

            def _send(self, status: int, payload: Any) -> None:
                data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

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
                tei = self.path == "/rerank"
                if not tei and self.path not in ("/v1/rerank", "/v2/rerank"):
                    self._send(404, {"error": "Not Found", "error_type": "NotFound"})
                    return
                fault = fake._next_fault()
                if fault is not None:
                    kind, status = fault
                    if kind == "hang":
                        fake._release.wait()
                        self.close_connection = True
                        return
                    if kind == "drop":
                        self.close_connection = True
                        return
                    if kind == "garbage":
                        self._send(200, {"unexpected": True} if tei else [{"score": "high"}])
                        return
                    if tei:  # TEI: {"error", "error_type"}; 503 is its queue-full answer
                        self._send(
                            status, {"error": "Model is overloaded", "error_type": "overloaded"}
                        )
                    else:  # Cohere: {"message"}
                        self._send(status, {"message": "service unavailable"})
                    return
                if fake.api_key is not None:
                    if self.headers.get("Authorization") != f"Bearer {fake.api_key}":
                        if tei:
                            self._send(401, {"error": "Unauthorized", "error_type": "Unauthorized"})
                        else:
                            self._send(401, {"message": "invalid api token"})
                        return
                if tei:
                    self._tei(body)
                else:
                    self._cohere(body)

            def _tei(self, body: Any) -> None:
                if not isinstance(body, dict) or not isinstance(body.get("query"), str):
                    self._send(
                        422,
                        {
                            "error": "Failed to deserialize the JSON body",
                            "error_type": "Validation",
                        },
                    )
                    return
                texts = body.get("texts")
                if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
                    self._send(422, {"error": "`texts` must be a list", "error_type": "Validation"})
                    return
                if not texts:
                    self._send(
                        422, {"error": "`texts` cannot be empty", "error_type": "Validation"}
                    )
                    return
                if len(texts) > fake.max_batch_size:
                    self._send(
                        422,
                        {
                            "error": f"batch size {len(texts)} > maximum allowed batch size "
                            f"{fake.max_batch_size}",
                            "error_type": "Validation",
                        },
                    )
                    return
                scored: list[dict[str, Any]] = [
                    {"index": i, "score": overlap_score(body["query"], t)}
                    for i, t in enumerate(texts)
                ]
                if body.get("return_text"):
                    for item in scored:
                        item["text"] = texts[item["index"]]
                scored.sort(key=lambda r: (-r["score"], r["index"]))
                self._send(200, scored)

            def _cohere(self, body: Any) -> None:
                if not isinstance(body, dict):
                    self._send(400, {"message": "invalid request: body must be an object"})
                    return
                if not body.get("model"):
                    self._send(400, {"message": "invalid request: model must be specified"})
                    return
                query, docs = body.get("query"), body.get("documents")
                if not isinstance(query, str) or not query:
                    self._send(400, {"message": "invalid request: query cannot be empty"})
                    return
                if not isinstance(docs, list) or not docs:
                    self._send(400, {"message": "invalid request: documents cannot be empty"})
                    return
                texts = [d.get("text", "") if isinstance(d, dict) else str(d) for d in docs]
                top_n = body.get("top_n") or len(texts)
                if not isinstance(top_n, int) or top_n < 1:
                    self._send(400, {"message": "invalid request: top_n must be positive"})
                    return
                results: list[dict[str, Any]] = [
                    {"index": i, "relevance_score": overlap_score(query, t)}
                    for i, t in enumerate(texts)
                ]
                results.sort(key=lambda r: (-r["relevance_score"], r["index"]))
                results = results[:top_n]
                if body.get("return_documents"):
                    for item in results:
                        item["document"] = {"text": texts[item["index"]]}
                self._send(
                    200,
                    {
                        "id": str(uuid.uuid4()),
                        "results": results,
                        "meta": {
                            "api_version": {"version": "2"},
                            "billed_units": {"search_units": 1},
                        },
                    },
                )

        return Handler
