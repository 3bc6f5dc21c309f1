"""tests/fakes/threaded_http.py: a fake's server stays quiet when a client goes away (the
timeouts and hang faults tests provoke) and still prints any other handler error."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

import httpx
import pytest

from tests.fakes.threaded_http import ThreadedHttpFake


class _Failing(BaseHTTPRequestHandler):
    fake: Fake

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        raise self.fake.error


class Fake(ThreadedHttpFake):
    def __init__(self, error: Exception) -> None:
        super().__init__(_Failing)
        self.error = error


@pytest.mark.parametrize(
    ("error", "printed"),
    [(BrokenPipeError(32, "Broken pipe"), False), (ConnectionResetError(104, "reset"), False),
     (ValueError("a bug in the fake"), True)],
)  # fmt: skip
def test_a_gone_client_is_not_an_error_but_a_bug_is(capfd, error, printed) -> None:
    with Fake(error) as fake, pytest.raises(httpx.TransportError):
        httpx.get(fake.url + "/x", timeout=5.0)
    err = capfd.readouterr().err
    assert ("Traceback" in err and "a bug in the fake" in err) is printed
    assert ("Traceback" in err) is printed
