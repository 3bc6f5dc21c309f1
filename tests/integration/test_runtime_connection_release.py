"""A runtime call its caller ends with two cancellations at one instant (the tool loop's timer
and the gRPC deadline) still frees its connection: httpcore's release on a cancelled read ran
in a shielded scope that asyncio's second cancel reached through, and the connection stayed
taken for good (256 such calls wedged the LLM service)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from services.common import errors
from services.common.settings import Env
from services.model_runtime.chat import ChatMessage, ChatRequest
from services.model_runtime.client import OpenAiChatRuntime
from services.model_runtime.config import runtime_settings
from tests.fakes.openai_chat import FakeChatServer, Reply

REQUEST = ChatRequest([ChatMessage("user", "hi")])
DEADLINE_S = 1.0


@pytest.mark.parametrize("stream", [True, False])
async def test_a_call_cancelled_twice_at_once_frees_its_connection(stream: bool) -> None:
    with FakeChatServer(api_key="k") as fake:
        env = {"LLM_RUNTIME_URL": fake.url, "LLM_RUNTIME_API_KEY": "k", "DEFAULT_MODEL_NAME": "m"}
        one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(limits=one) as http:
            rt = OpenAiChatRuntime(runtime_settings(Env(env)), http)
            fake.script(Reply(content="Hello world, streamed slowly.", chunk_chars=4))
            fake.hang(seconds=3, after_chunks=3 if stream else None)

            async def caller() -> None:
                async with asyncio.timeout(DEADLINE_S):  # the loop's own timer
                    if stream:
                        events = rt.stream(REQUEST, timeout_s=DEADLINE_S)
                        try:
                            async for _ in events:
                                pass
                        finally:
                            await events.aclose()
                    else:
                        await rt.complete(REQUEST, timeout_s=DEADLINE_S)

            task = asyncio.create_task(caller())
            await asyncio.sleep(DEADLINE_S)
            task.cancel()  # the server cancelling the handler at the same deadline
            with pytest.raises((asyncio.CancelledError, TimeoutError, errors.ServiceError)):
                await task
            # The one connection is free again: the next call gets it (else SERVER_BUSY).
            fake.script(Reply(content="ok"))
            answer = await rt.complete(REQUEST, timeout_s=10)
            assert answer.content == "ok"
