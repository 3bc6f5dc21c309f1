"""The capped body reader of the external HTTP clients (common/http.read_capped): a body is
read up to its cap and refused one byte past it, and a compressed body is inflated under the
cap, so a small gzip body that expands to megabytes never does so in memory."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib
from collections.abc import AsyncIterator

import httpx
import pytest

from services.common import errors
from services.common.http import fetch_capped, read_capped
from services.model_runtime.chat import LLM_RUNTIME_ERROR, ChatMessage, ChatRequest
from services.model_runtime.client import OpenAiChatRuntime, RuntimeSettings

TEXT = ("Ключевая ставка Банка России, key rate, 16.00 %. " * 400).encode()


async def body_of(
    raw: bytes, cap: int, encoding: str | None = None, piece: int = 65_536
) -> bytes | None:
    """read_capped over a response whose raw body `raw` arrives in `piece`-byte parts."""

    async def parts() -> AsyncIterator[bytes]:
        for i in range(0, len(raw), piece):
            yield raw[i : i + piece]

    headers = {"content-encoding": encoding} if encoding else {}

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=headers, content=parts())

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        async with client.stream("GET", "http://upstream.test/") as response:
            return await read_capped(response, cap)


@pytest.mark.parametrize(
    ("encoding", "encode"),
    [
        (None, lambda b: b),
        ("identity", lambda b: b),
        ("gzip", gzip.compress),
        ("GZIP", gzip.compress),
        ("deflate", zlib.compress),
        ("deflate", lambda b: zlib.compress(b)[2:-4]),  # raw deflate, as some servers send
    ],
)
@pytest.mark.parametrize("piece", [1, 7, 4096, 1 << 20])
async def test_a_body_at_its_cap_is_read_and_one_byte_past_it_is_not(encoding, encode, piece):
    raw = encode(TEXT)
    assert await body_of(raw, len(TEXT), encoding, piece) == TEXT
    assert await body_of(raw, len(TEXT) - 1, encoding, piece) is None


async def test_a_gzip_bomb_is_refused_without_being_inflated_in_memory():
    """512 KB of gzip holding 512 MiB of zeros, with a 1 MiB cap: httpx alone inflates each
    received chunk whole (67 MB for the first)."""
    bomb = gzip.compress(b"\0" * (512 << 20), 9)
    assert len(bomb) < 600_000
    tracemalloc.start()
    try:
        assert await body_of(bomb, 1 << 20, "gzip") is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20


@pytest.mark.parametrize("encoding", ["br", "zstd", "gzip, gzip", "compress"])
async def test_an_encoding_httpx_does_not_ask_for_is_a_decoding_error(encoding):
    with pytest.raises(httpx.DecodingError, match="unsupported Content-Encoding"):
        await body_of(gzip.compress(TEXT), 1 << 20, encoding)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_a_body_that_does_not_inflate_is_a_decoding_error(encoding):
    with pytest.raises(httpx.DecodingError):
        await body_of(b"this is not compressed at all" * 10, 1 << 20, encoding)


async def test_the_runtime_client_takes_a_body_that_does_not_decode_as_a_bad_answer():
    async def parts() -> AsyncIterator[bytes]:
        yield b'{"choices": []}'

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-encoding": "br"}, content=parts())

    settings = RuntimeSettings(url="http://runtime.test/v1", default_model="m")
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        runtime = OpenAiChatRuntime(settings, http)
        with pytest.raises(errors.UnavailableError, match="does not decode") as info:
            await runtime.complete(ChatRequest((ChatMessage("user", "hi"),)), timeout_s=5.0)
    assert info.value.reason == LLM_RUNTIME_ERROR


async def test_fetch_capped_reads_up_to_the_cap_and_no_further() -> None:
    """One exchange of the bank, Tavily and rerank clients: the status, the headers and the
    body at the cap; one byte past it, no body."""
    body = b"x" * 1000

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(201, content=body, headers={"X-Seen": request.content.decode()})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        at = await fetch_capped(http, "POST", "http://upstream.test/", cap=1000, content=b"q")
        past = await fetch_capped(http, "POST", "http://upstream.test/", cap=999, content=b"q")
    assert (at.status, at.headers["X-Seen"], at.body) == (201, "q", body)
    assert (past.status, past.body) == (201, None)
