"""A local OpenAI-compatible /v1/embeddings server for tests: real HTTP, deterministic vectors, fault switches."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

import numpy as np

from tests.fakes.threaded_http import ThreadedHttpFake

_WORD = re.compile(r"\w+", re.UNICODE)

MALFORMED_MODES = ("not_json", "missing_data", "wrong_count", "ragged", "no_embedding")
"""Values of `FakeEmbeddingsServer.malformed`: kinds of broken 200 answers."""


def fake_vector(text: str, dim: int) -> np.ndarray:
    """The fake's embedding of `text`: a signed hashed bag of lower-cased words, unit length.

    Texts sharing words score higher than texts that do not; an empty text maps to e0.
    """
    vector = np.zeros(dim, dtype=np.float64)
    for word in _WORD.findall(text.lower()):
        digest = hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest()
        number = int.from_bytes(digest, "little")
        vector[number % dim] += 1.0 if (number >> 32) & 1 else -1.0
    norm = float(np.linalg.norm(vector))
    if norm == 0.0:
        vector[0] = 1.0
        norm = 1.0
    return (vector / norm).astype(np.float32)


@dataclass(frozen=True)
class RecordedRequest:
    """One request the fake received."""

    method: str
    path: str
    headers: dict[str, str]
    """Header names lower-cased."""
    body: Any
    """The parsed JSON body, or the raw text when it was not JSON."""


class FakeEmbeddingsServer(ThreadedHttpFake):
    """An OpenAI-compatible embeddings server on 127.0.0.1:<free port>, in a background thread.

    Speaks `POST /v1/embeddings` as OpenAI documents it (string or list `input`, `model`,
    `encoding_format` float/base64; `data[].embedding/index`, `usage`; errors as
    `{"error": {"message", "type", "param", "code"}}`) plus `GET /v1/models`.

    Switches, settable at any time:
      fail_next        answer the next N embedding requests with `fail_status` (503)
      hang_next        hold the next N requests for `hang_s` seconds before answering
      malformed        answer 200 with a broken body of this kind (see MALFORMED_MODES)
      scale            multiply every vector (OpenAI's are unit length; >1 tests normalising)
    `requests` records every request received, in order.
    """

    def __init__(
        self, *, dim: int = 32, model: str = "fake-embedding-model", api_key: str | None = None
    ) -> None:
        self.dim = dim
        self.model = model
        self.api_key = api_key
        self.fail_next = 0
        self.fail_status = 503
        self.hang_next = 0
        self.hang_s = 5.0
        self.malformed: str | None = None
        self.scale = 1.0
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        super().__init__(_Handler)

    @property
    def embedding_requests(self) -> list[RecordedRequest]:
        """The POST /v1/embeddings requests received so far."""
        with self._lock:
            return [r for r in self.requests if r.path == "/v1/embeddings"]

    # -- used by the handler ------------------------------------------------------------

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def _take(self, switch: str) -> bool:
        """Consume one unit of a countdown switch (fail_next, hang_next)."""
        with self._lock:
            left = getattr(self, switch)
            if left > 0:
                setattr(self, switch, left - 1)
                return True
            return False


def _error(message: str, type_: str, code: str | None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class _Handler(BaseHTTPRequestHandler):
    fake: FakeEmbeddingsServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, payload: Any, *, raw: bytes | None = None) -> None:
        body = raw if raw is not None else json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _headers(self) -> dict[str, str]:
        return {k.lower(): v for k, v in self.headers.items()}

    def do_GET(self) -> None:
        self.fake._record(RecordedRequest("GET", self.path, self._headers(), None))
        if self.path == "/v1/models":
            self._send(
                200, {"object": "list", "data": [{"id": self.fake.model, "object": "model"}]}
            )
        else:
            self._send(404, _error(f"Unknown path {self.path}", "invalid_request_error", None))

    def do_POST(self) -> None:
        fake = self.fake
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            body = raw.decode("utf-8", "replace")
        fake._record(RecordedRequest("POST", self.path, self._headers(), body))

        if fake._take("hang_next"):
            # Wait past the client's timeout; stop() releases it early.
            fake._stopping.wait(fake.hang_s)
        if self.path != "/v1/embeddings":
            self._send(404, _error(f"Unknown path {self.path}", "invalid_request_error", None))
            return
        if (
            fake.api_key is not None
            and self.headers.get("Authorization") != f"Bearer {fake.api_key}"
        ):
            self._send(
                401,
                _error("Incorrect API key provided.", "invalid_request_error", "invalid_api_key"),
            )
            return
        if fake._take("fail_next"):
            self._send(
                fake.fail_status,
                _error("The server is overloaded, please retry.", "server_error", "overloaded"),
            )
            return
        if not isinstance(body, dict):
            self._send(
                400, _error("We could not parse the JSON body.", "invalid_request_error", None)
            )
            return
        if body.get("model") != fake.model:
            self._send(
                404,
                _error(
                    f"The model `{body.get('model')}` does not exist.",
                    "invalid_request_error",
                    "model_not_found",
                    "model",
                ),
            )
            return
        texts = body.get("input")
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            self._send(
                400,
                _error(
                    "'input' must be a non-empty string or array of strings.",
                    "invalid_request_error",
                    None,
                    "input",
                ),
            )
            return
        if fake.malformed is not None:
            self._send_malformed(fake.malformed, texts)
            return

        b64 = body.get("encoding_format") == "base64"
        data = []
        for i, text in enumerate(texts):
            vector = fake_vector(text, fake.dim) * np.float32(fake.scale)
            embedding: Any = (
                base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
                if b64
                else [float(x) for x in vector]
            )
            data.append({"object": "embedding", "index": i, "embedding": embedding})
        tokens = sum(len(_WORD.findall(t)) for t in texts)
        self._send(
            200,
            {
                "object": "list",
                "data": data,
                "model": fake.model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )

    def _send_malformed(self, mode: str, texts: list[str]) -> None:
        def item(i: int, width: int) -> dict:
            return {"object": "embedding", "index": i, "embedding": [0.5] * width}

        if mode == "not_json":
            self._send(200, None, raw=b"<html>502 Bad Gateway</html>")
        elif mode == "missing_data":
            self._send(200, {"object": "list", "model": self.fake.model})
        elif mode == "wrong_count":
            self._send(200, {"object": "list", "data": [item(0, self.fake.dim)] * (len(texts) + 1)})
        elif mode == "ragged":
            # Rows of unequal width (needs at least two texts to show).
            data = [item(i, self.fake.dim - (i % 2)) for i in range(len(texts))]
            self._send(200, {"object": "list", "data": data})
        elif mode == "no_embedding":
            self._send(200, {"object": "list", "data": [{"index": i} for i in range(len(texts))]})
        else:
            raise ValueError(f"unknown malformed mode {mode!r}")
