"""CLIENT spans of outgoing HTTP calls (services/common/http_tracing.py), against a local
HTTP server, with an in-memory span exporter."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from services.common.context import trace_id_var
from services.common.http_tracing import traced_async_client, traced_client
from services.common.tracing import Tracing, create_tracing, parse_traceparent
from services.model_runtime.chat import ChatMessage, ChatRequest, Completion
from services.model_runtime.client import OpenAiChatRuntime, RuntimeSettings
from tests.fakes.openai_chat import FakeChatServer, text
from tests.fakes.threaded_http import ThreadedHttpFake

HEX_TRACE = "0af7651916cd43dd8448eb211c80319c"
KEY = "sk-test-runtime-0123456789abcdef"


class _Handler(BaseHTTPRequestHandler):
    fake: Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.fake.seen.append(dict(self.headers))
        path = self.path.split("?")[0]
        if path == "/stream":
            self.send_response(200)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for i in range(3):
                part = f"data: {i}\n\n".encode()
                self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                self.wfile.flush()
                time.sleep(0.05)
            self.wfile.write(b"0\r\n\r\n")
            return
        status = 503 if path == "/fail" else 200
        body = b"ok"
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Server(ThreadedHttpFake):
    def __init__(self) -> None:
        super().__init__(_Handler)
        self.seen: list[dict[str, str]] = []


@pytest.fixture
def server() -> Iterator[Server]:
    with Server() as s:
        yield s


@pytest.fixture
def traced() -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    return create_tracing("svc", exporter), exporter


def _clients(exporter: InMemorySpanExporter) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.kind == SpanKind.CLIENT]


async def test_a_call_in_an_rpc_is_its_child_and_sends_the_spans_traceparent(server, traced):
    tracing, exporter = traced
    token = trace_id_var.set(HEX_TRACE)
    served = tracing.start_server_span("pkg.Svc", "Do", HEX_TRACE, "")
    try:
        async with traced_async_client(tracing, peer="llm-runtime", propagate=True) as http:
            r = await http.get(f"{server.url}/ok")
    finally:
        served.end("OK", 0)
        trace_id_var.reset(token)
    assert r.status_code == 200 and r.text == "ok"
    [client] = _clients(exporter)
    [rpc] = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.SERVER]
    assert client.name == "GET"
    assert client.parent is not None and client.parent.span_id == rpc.context.span_id
    assert client.context.trace_id == int(HEX_TRACE, 16)
    host, port = server.url.removeprefix("http://").split(":")
    assert client.attributes["http.request.method"] == "GET"
    assert client.attributes["server.address"] == host
    assert client.attributes["server.port"] == int(port)
    assert client.attributes["url.full"] == f"{server.url}/ok"
    assert client.attributes["http.response.status_code"] == 200
    assert client.attributes["visior.peer"] == "llm-runtime"
    assert client.attributes["visior.trace_id"] == HEX_TRACE
    assert client.status.status_code == StatusCode.UNSET
    sent = parse_traceparent(server.seen[0]["traceparent"])
    assert sent is not None and sent[:2] == (client.context.trace_id, client.context.span_id)


async def test_third_parties_get_no_traceparent_and_no_query_or_credentials_in_the_span(
    server, traced
):
    tracing, exporter = traced
    url = server.url.replace("http://", "http://user:pw@") + "/ok?api_key=secret#frag"
    async with traced_async_client(tracing, peer="tavily", propagate=False) as http:
        await http.get(url)
    assert "traceparent" not in {k.lower() for k in server.seen[0]}
    [client] = _clients(exporter)
    assert client.attributes["url.full"] == f"{server.url}/ok"
    assert "secret" not in str(dict(client.attributes)) and "pw" not in str(dict(client.attributes))


async def test_an_error_status_marks_the_span(server, traced):
    tracing, exporter = traced
    async with traced_async_client(tracing, peer="cbr", propagate=False) as http:
        r = await http.get(f"{server.url}/fail")
    assert r.status_code == 503
    [client] = _clients(exporter)
    assert client.attributes["http.response.status_code"] == 503
    assert client.attributes["error.type"] == "503"
    assert client.status.status_code == StatusCode.ERROR


async def test_a_connection_failure_is_an_error_span_named_by_the_exception(traced):
    tracing, exporter = traced
    with Server() as gone:
        url = f"{gone.url}/ok"
    async with traced_async_client(tracing, peer="cbr", propagate=False) as http:
        with pytest.raises(httpx.ConnectError):
            await http.get(url)
    [client] = _clients(exporter)
    assert client.attributes["error.type"] == "ConnectError"
    assert "http.response.status_code" not in client.attributes
    assert client.status.status_code == StatusCode.ERROR


async def test_a_streamed_answer_is_timed_until_its_body_is_read(server, traced):
    tracing, exporter = traced
    async with traced_async_client(tracing, peer="llm-runtime", propagate=True) as http:
        async with http.stream("GET", f"{server.url}/stream") as r:
            assert r.status_code == 200
            assert not _clients(exporter)  # headers in, body still coming: not ended
            lines = [line async for line in r.aiter_lines() if line]
        assert lines == ["data: 0", "data: 1", "data: 2"]
    [client] = _clients(exporter)
    assert (client.end_time - client.start_time) / 1e9 >= 0.1  # the three 50 ms parts


def test_the_sync_client_makes_the_same_spans(server, traced):
    tracing, exporter = traced
    with traced_client(tracing, peer="embeddings", propagate=True, timeout=5) as http:
        assert http.get(f"{server.url}/ok").status_code == 200
        assert http.get(f"{server.url}/fail").status_code == 503
    ok, failed = sorted(_clients(exporter), key=lambda s: s.start_time)
    assert (
        ok.attributes["visior.peer"] == "embeddings" and ok.status.status_code == StatusCode.UNSET
    )
    assert failed.attributes["error.type"] == "503"
    assert "traceparent" in {k.lower() for k in server.seen[0]}


async def test_without_tracing_the_clients_are_plain(server):
    async with traced_async_client(None, peer="llm-runtime", propagate=True) as http:
        await http.get(f"{server.url}/ok")
    with traced_client(None, peer="embeddings", propagate=True) as sync:
        sync.get(f"{server.url}/ok")
    assert all("traceparent" not in {k.lower() for k in seen} for seen in server.seen)


# --- a body its reader leaves, or that fails midway; proxies ------------------------------


def _no_ended_span_warning(caplog: pytest.LogCaptureFixture) -> None:
    assert not [r for r in caplog.records if "ended span" in r.getMessage()]


def test_a_sync_reader_that_stops_early_is_no_error(server, traced, caplog):
    # An abandoned body iterator is closed with GeneratorExit: that is no verdict on the call.
    tracing, exporter = traced
    caplog.set_level(logging.WARNING)
    with traced_client(tracing, peer="embeddings", propagate=True) as http:
        with http.stream("GET", f"{server.url}/stream") as r:
            for _line in r.iter_lines():
                break
    [client] = _clients(exporter)
    assert client.attributes["http.response.status_code"] == 200
    assert "error.type" not in client.attributes
    assert client.status.status_code == StatusCode.UNSET
    _no_ended_span_warning(caplog)


async def test_the_runtimes_stream_that_stops_at_done_is_no_error(traced, caplog):
    # OpenAiChatRuntime leaves the SSE loop at [DONE], yields to its consumer (the handler
    # writing the message), and closes the response after: the span is a success, timed whole.
    tracing, exporter = traced
    caplog.set_level(logging.WARNING)
    with FakeChatServer(api_key=KEY) as fake:
        fake.script(text("one two three four five six seven eight"))
        async with traced_async_client(tracing, peer="llm-runtime", propagate=True) as http:
            runtime = OpenAiChatRuntime(
                RuntimeSettings(url=fake.url, default_model="m", api_key=KEY), http
            )
            events = []
            async for event in runtime.stream(
                ChatRequest([ChatMessage("user", "hi")]), timeout_s=5
            ):
                events.append(event)
                await asyncio.sleep(0.005)
    assert isinstance(events[-1], Completion)
    [client] = _clients(exporter)
    assert client.attributes["http.response.status_code"] == 200
    assert client.status.status_code == StatusCode.UNSET, dict(client.attributes)
    _no_ended_span_warning(caplog)


async def test_a_body_that_fails_midway_is_an_error_with_its_status(traced, caplog):
    tracing, exporter = traced
    caplog.set_level(logging.WARNING)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    release = threading.Event()

    def serve() -> None:  # 7 of the 100 bytes it announces, then nothing
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        release.wait(5)
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        async with traced_async_client(
            tracing, peer="llm-runtime", propagate=True, timeout=0.3
        ) as http:
            with pytest.raises(httpx.ReadTimeout):
                await http.get(f"http://127.0.0.1:{port}/x")
    finally:
        release.set()
        thread.join(5)
        listener.close()
    [client] = _clients(exporter)
    assert client.attributes["http.response.status_code"] == 200
    assert client.attributes["error.type"] == "ReadTimeout"
    assert client.status.status_code == StatusCode.ERROR
    _no_ended_span_warning(caplog)


@pytest.fixture
def proxy_env(server, monkeypatch):
    """HTTP_PROXY pointing at the local server (which answers any path)."""
    for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", server.url)
    return server


ONLY_BY_PROXY = "http://bank.example.invalid/ok"


@pytest.mark.parametrize("on", [False, True])
async def test_tracing_keeps_the_proxy_from_the_environment(proxy_env, traced, on):
    tracing, exporter = traced
    async with traced_async_client(tracing if on else None, peer="cbr", propagate=False) as http:
        r = await http.get(ONLY_BY_PROXY)
    assert r.status_code == 200 and len(proxy_env.seen) == 1
    if on:
        [client] = _clients(exporter)
        assert client.attributes["url.full"] == ONLY_BY_PROXY
        assert client.attributes["server.address"] == "bank.example.invalid"


def test_the_sync_client_keeps_the_proxy_too(proxy_env, traced):
    tracing, exporter = traced
    with traced_client(tracing, peer="embeddings", propagate=True) as http:
        assert http.get(ONLY_BY_PROXY).status_code == 200
    assert len(proxy_env.seen) == 1 and len(_clients(exporter)) == 1
