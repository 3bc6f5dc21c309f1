"""The lifecycle the HTTP fakes share: a handler class bound to the fake, served on a free
loopback port in a daemon thread, stopped with the hanging requests released."""

from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class QuietHTTPServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer that does not print a traceback when the client went away
    (a timeout or a hang fault a test provokes); any other handler error is printed."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class ThreadedHttpFake:
    """Base of a fake whose handler (`handler_base`, reading the fake as `self.fake`) runs
    in a ThreadingHTTPServer; `_stopping` is set on stop so hanging handlers can return."""

    def __init__(self, handler_base: type[BaseHTTPRequestHandler]) -> None:
        self.handler_base = handler_base
        self._stopping = threading.Event()
        self._httpd: QuietHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:41234."""
        assert self._httpd is not None, "server not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> Self:
        """Bind a free port and serve in a daemon thread."""
        handler = type("Handler", (self.handler_base,), {"fake": self})
        self._httpd = QuietHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Release hanging requests, stop serving and close the socket."""
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
