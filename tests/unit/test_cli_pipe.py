"""`visior list … | head`: a reader that closes the pipe early ends the command quietly, as
SIGPIPE ends a C tool, not with a BrokenPipeError traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from services.devtools.envoy import REPO_ROOT

DOCUMENTS = 5000
"""Lines enough to fill a pipe's buffer (64 KiB) many times over."""


class _Listing(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        docs = [
            {"doc_id": f"doc-{i}", "title": f"Document {i}", "pages": 1, "chunks": 2}
            for i in range(DOCUMENTS)
        ]
        body = json.dumps({"documents": docs, "next_page_token": ""}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def listing_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Listing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _argv(url: str) -> list[str]:
    return [sys.executable, "-m", "services.cli", "list", "--tenant", "acme", "--url", url]


ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "gen/python"), str(REPO_ROOT)])}


def test_a_reader_that_stops_early_ends_the_listing_without_a_traceback(listing_url: str) -> None:
    proc = subprocess.Popen(
        _argv(listing_url), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # `head -1`
    rc = proc.wait(timeout=60)
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert first.startswith(b"doc-0\tDocument 0\t")
    assert err == ""
    assert rc == 128 + signal.SIGPIPE


def test_a_reader_that_reads_everything_gets_every_line(listing_url: str) -> None:
    out = subprocess.run(_argv(listing_url), capture_output=True, check=True, timeout=60, env=ENV)
    assert len(out.stdout.splitlines()) == DOCUMENTS and out.stderr == b""
