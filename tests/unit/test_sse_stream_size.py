"""The runtime client's event-stream reading: line ends as SSE allows them, split anywhere
across chunks, and the 8 MiB cap counted in bytes, as for an unstreamed answer."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest

from services.common import errors
from services.common.retry import RetryPolicy
from services.model_runtime.chat import ChatMessage, ChatRequest, StreamDelta
from services.model_runtime.client import (
    MAX_RESPONSE_BYTES,
    OpenAiChatRuntime,
    RuntimeSettings,
    sse_lines,
)


async def _lines(*chunks: bytes) -> list[str]:
    async def source() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    return [line async for line in sse_lines(source())]


async def test_lines_end_at_crlf_lf_or_cr_wherever_the_chunks_split_them() -> None:
    lines = await _lines(b"data: a\r", b"\ndata: b\n\n", b"data: \xd0", b"\xb6\r\r\n", b"x")
    assert lines == ["data: a", "data: b", "", "data: ж", "", "x"]


@pytest.mark.parametrize("size", [1, 2, 3, 7])
async def test_the_same_body_gives_the_same_lines_in_chunks_of_any_size(size: int) -> None:
    body = "data: один\r\n\r\ndata: два\r\rdata: three\n\n: keep-alive\n".encode()
    whole = await _lines(body)
    assert await _lines(*(body[i : i + size] for i in range(0, len(body), size))) == whole
    assert whole == ["data: один", "", "data: два", "", "data: three", "", ": keep-alive"]


def _runtime(body: bytes) -> OpenAiChatRuntime:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    http = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    settings = RuntimeSettings(
        url="http://runtime.test",
        default_model="m",
        retry=RetryPolicy(attempts=1, first_delay_s=0.0),
    )
    return OpenAiChatRuntime(settings, http)


def _stream(content: str) -> bytes:
    """One content delta as raw UTF-8 (not \\u-escaped), then the final chunk and [DONE]."""
    delta = {"choices": [{"index": 0, "delta": {"content": content}}]}
    done = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    events = [json.dumps(delta, ensure_ascii=False), json.dumps(done), "[DONE]"]
    return "".join(f"data: {e}\n\n" for e in events).encode()


async def _read(body: bytes) -> list[object]:
    runtime = _runtime(body)
    request = ChatRequest([ChatMessage("user", "q")])
    return [event async for event in runtime.stream(request, timeout_s=30)]


async def test_a_stream_within_the_cap_in_bytes_is_read() -> None:
    content = "ж" * ((MAX_RESPONSE_BYTES - 1024) // 2)  # two bytes a character
    events = await _read(_stream(content))
    assert "".join(e.text for e in events if isinstance(e, StreamDelta)) == content


async def test_a_stream_past_the_cap_in_bytes_is_refused_though_its_characters_are_not() -> None:
    content = "ж" * (MAX_RESPONSE_BYTES // 2 + 1024)  # fewer characters than the cap's bytes
    assert len(content) < MAX_RESPONSE_BYTES < len(content.encode())
    with pytest.raises(errors.UnavailableError) as info:
        await _read(_stream(content))
    assert info.value.metadata["kind"] == "bad_response"
