"""JSON mode sends tool results as user turns: consecutive user turns are joined into one,
so chat templates that want user and assistant turns to alternate (Mistral, Llama 2, Gemma)
take the request."""

from __future__ import annotations

from services.model_runtime.chat import ChatMessage, ChatRequest, ToolCall, ToolSpec
from services.model_runtime.client import WireForm, build_request

CALLS = (ToolCall("c1", "read", '{"id": 1}'), ToolCall("c2", "read", '{"id": 2}'))


def roles(messages: list[ChatMessage]) -> list[str]:
    body = build_request(
        ChatRequest(messages, (ToolSpec("read", "Read."),)), WireForm(json_mode=True)
    )
    return [m["role"] for m in body["messages"]]


def test_two_results_and_the_note_after_them_are_one_user_turn() -> None:
    messages = [
        ChatMessage("system", "Answer from the documents."),
        ChatMessage("user", "How is LDAP set up?"),
        ChatMessage("assistant", tool_calls=CALLS),
        ChatMessage("tool", "text one", tool_call_id="c1", name="read"),
        ChatMessage("tool", "text two", tool_call_id="c2", name="read"),
        ChatMessage("user", "Answer in English."),
    ]
    body = build_request(
        ChatRequest(messages, (ToolSpec("read", "Read."),)), WireForm(json_mode=True)
    )
    sent = body["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    last = sent[-1]["content"]
    assert last.index("text one") < last.index("text two") < last.index("Answer in English.")
    assert last.count("\n\n") >= 2  # each part kept apart


def test_alternating_turns_are_left_as_they_are() -> None:
    messages = [
        ChatMessage("user", "Hello"),
        ChatMessage("assistant", "Hi"),
        ChatMessage("user", "How is LDAP set up?"),
        ChatMessage("assistant", tool_calls=CALLS[:1]),
        ChatMessage("tool", "text one", tool_call_id="c1", name="read"),
    ]
    assert roles(messages) == ["system", "user", "assistant", "user", "assistant", "user"]
