"""A runtime whose chat template wants user and assistant turns to alternate (Mistral's,
Llama 2's) refuses adjacent user turns with 400: the client sends them joined, and keeps
doing so for that model (services/model_runtime/client.py `_send_turns`)."""

from __future__ import annotations

import json
from itertools import pairwise
from typing import Any

import httpx
import pytest

from services.common import errors
from services.model_runtime.chat import ChatMessage, ChatRequest, Completion, StreamDelta
from services.model_runtime.client import (
    OpenAiChatRuntime,
    RuntimeSettings,
    joined_user_turns,
)

MODEL = "mistral-7b-instruct"
NOTED = [
    ChatMessage("system", "Answer briefly."),
    ChatMessage("user", "Как настроить LDAP?"),
    ChatMessage("user", "Answer in Russian."),  # a note of the loop: a user turn of its own
]
ALTERNATING = [ChatMessage("user", "Как настроить LDAP?")]


class StrictTemplate:
    """An OpenAI-compatible runtime that refuses two adjacent turns of one role, as vLLM
    does with such a template."""

    def __init__(self, refuse_all: bool = False) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.refuse_all = refuse_all

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        roles = [m["role"] for m in body["messages"] if m["role"] != "system"]
        if self.refuse_all or any(a == b for a, b in pairwise(roles)):
            message = "Conversation roles must alternate user/assistant/user/assistant/..."
            return httpx.Response(400, json={"error": {"message": message}})
        if body.get("stream"):
            chunk = {"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]}
            sse = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"
            return httpx.Response(200, text=sse, headers={"content-type": "text/event-stream"})
        answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                               "finish_reason": "stop"}],
                  "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}}  # fmt: skip
        return httpx.Response(200, json=answer)


def runtime(server: StrictTemplate, http: httpx.AsyncClient) -> OpenAiChatRuntime:
    return OpenAiChatRuntime(RuntimeSettings(url="http://rt", default_model=MODEL), http)


async def test_adjacent_user_turns_are_joined_after_the_refusal_and_from_then_on():
    server = StrictTemplate()
    async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as http:
        rt = runtime(server, http)
        done = await rt.complete(ChatRequest(NOTED), timeout_s=5)
        assert isinstance(done, Completion) and done.content == "ok"
        assert len(server.bodies) == 2  # refused, then sent joined
        assert [m["content"] for m in server.bodies[1]["messages"]] == [
            "Answer briefly.", "Как настроить LDAP?\n\nAnswer in Russian."
        ]  # fmt: skip
        await rt.complete(ChatRequest(NOTED), timeout_s=5)
        assert len(server.bodies) == 3  # this model's calls go joined at once
        assert len(server.bodies[2]["messages"]) == 2


async def test_a_stream_is_joined_too():
    server = StrictTemplate()
    async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as http:
        events = [e async for e in runtime(server, http).stream(ChatRequest(NOTED), timeout_s=5)]
    assert [e.text for e in events if isinstance(e, StreamDelta)] == ["ok"]
    assert len(server.bodies) == 2 and len(server.bodies[1]["messages"]) == 2


async def test_a_refusal_of_alternating_turns_stays_the_runtimes_error():
    server = StrictTemplate(refuse_all=True)
    async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as http:
        with pytest.raises(errors.UnavailableError) as info:
            await runtime(server, http).complete(ChatRequest(ALTERNATING), timeout_s=5)
    assert info.value.metadata["status"] == "400" and len(server.bodies) == 1


async def test_a_refusal_of_joined_turns_is_not_sent_a_third_time_nor_remembered():
    """A 400 of another cause (a prompt too long) is refused joined too: the model is not
    taken for one with a strict template, and its next call goes as it is first."""
    server = StrictTemplate(refuse_all=True)
    async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as http:
        rt = runtime(server, http)
        with pytest.raises(errors.UnavailableError):
            await rt.complete(ChatRequest(NOTED), timeout_s=5)
        assert len(server.bodies) == 2
        with pytest.raises(errors.UnavailableError):
            await rt.complete(ChatRequest(NOTED), timeout_s=5)
    assert len(server.bodies[2]["messages"]) == 3  # not joined: nothing was remembered


def test_only_adjacent_user_turns_of_text_are_joined():
    body = json.dumps({"model": "m", "messages": [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"}, {"role": "user", "content": "d"},
        {"role": "user", "content": "e"},
    ]}).encode()  # fmt: skip
    joined = json.loads(joined_user_turns(body) or b"{}")
    assert [m["content"] for m in joined["messages"]] == ["a", "b", "c\n\nd\n\ne"]
    assert (
        joined_user_turns(json.dumps({"messages": [{"role": "user", "content": "a"}]}).encode())
        is None
    )
