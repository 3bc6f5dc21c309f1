"""Token management (services/llm/budget.py): counting, fitting the context, the account."""

from __future__ import annotations

import pytest

from services.common import errors
from services.common.tokenizer import default_tokenizer
from services.llm.budget import (
    MESSAGE_OVERHEAD,
    REPLY_OVERHEAD,
    TOOL_CALL_OVERHEAD,
    TokenBudget,
    fit_prompt,
    message_tokens,
    prompt_tokens,
    tools_tokens,
)
from services.llm.model import ContextChunk, GenerateInput, Turn
from services.llm.prompt import build_prompt, render_chunk
from services.llm.toolcalls import READ_TOOL_SPECS
from services.model_runtime.chat import ChatMessage, ToolCall

TOK = default_tokenizer()


def test_every_message_counts_its_overhead_name_and_tool_calls():
    assert message_tokens(TOK, ChatMessage("user", "")) == MESSAGE_OVERHEAD
    assert message_tokens(TOK, ChatMessage("user", "hello world")) == MESSAGE_OVERHEAD + 2
    tool_call = ToolCall("c1", "read_doc_section", '{"doc_id": "d"}')
    turn = ChatMessage("assistant", "", (tool_call,))
    assert message_tokens(TOK, turn) == (
        MESSAGE_OVERHEAD + TOOL_CALL_OVERHEAD + TOK.count(tool_call.name)
        + TOK.count(tool_call.arguments)
    )  # fmt: skip
    answer = ChatMessage("tool", "x", tool_call_id="c1", name="read_doc_section")
    assert message_tokens(TOK, answer) > MESSAGE_OVERHEAD + 1
    msgs = [ChatMessage("system", "s"), ChatMessage("user", "u")]
    assert prompt_tokens(TOK, msgs) == 2 * MESSAGE_OVERHEAD + 2 + REPLY_OVERHEAD
    assert prompt_tokens(TOK, msgs, READ_TOOL_SPECS) == (
        prompt_tokens(TOK, msgs) + tools_tokens(TOK, READ_TOOL_SPECS)
    )
    assert tools_tokens(TOK, READ_TOOL_SPECS) > 50


REQ = GenerateInput(messages=(Turn("user", "How do I set up LDAP?"),))


def build(chunks):
    return build_prompt(REQ, chunks)


def fit(chunks, limit):
    return fit_prompt(
        build, chunks, tools=(), limit=limit, tokenizer=TOK,
        render_chunk=render_chunk,
    )  # fmt: skip


def test_a_prompt_that_does_not_fit_without_context_at_and_past_the_limit():
    bare = prompt_tokens(TOK, build(()))
    messages, kept = fit((), bare)
    assert kept == () and prompt_tokens(TOK, messages) == bare
    with pytest.raises(errors.LimitExceededError) as info:
        fit((), bare - 1)
    assert info.value.reason == "LLM_LIMIT_EXCEEDED"
    assert info.value.metadata == {"field": "messages", "limit": str(bare - 1),
                                   "limit_name": "max_prompt_tokens"}  # fmt: skip


CHUNKS = (
    ContextChunk("d", "low", "low " * 120, score=0.1),
    ContextChunk("d", "high", "high " * 120, score=0.9),
    ContextChunk("d", "mid", "mid " * 120, score=0.5),
)


def test_context_fits_whole_when_there_is_room():
    full = prompt_tokens(TOK, build(CHUNKS))
    messages, kept = fit(CHUNKS, full + 10)
    assert kept == CHUNKS and prompt_tokens(TOK, messages) <= full + 10


def test_lowest_score_goes_first_and_the_order_stays():
    two = prompt_tokens(TOK, build((CHUNKS[1], CHUNKS[2]))) + 8
    messages, kept = fit(CHUNKS, two)
    assert [c.section_id for c in kept] == ["high", "mid"]
    assert prompt_tokens(TOK, messages) <= two


def test_the_best_chunk_left_out_is_cut_to_the_room_left():
    one = prompt_tokens(TOK, build((CHUNKS[1],))) + 80
    messages, kept = fit(CHUNKS, one)
    assert [c.section_id for c in kept] == ["high", "mid"]
    assert kept[1].text.endswith("…") and len(kept[1].text) < len(CHUNKS[2].text)
    assert prompt_tokens(TOK, messages) <= one
    # With too little room for a useful piece, nothing is cut in.
    _, kept = fit(CHUNKS, prompt_tokens(TOK, build((CHUNKS[1],))) + 10)
    assert [c.section_id for c in kept] == ["high"]


def budget(**kw):
    base = {"max_prompt_tokens": 100, "max_completion_tokens": 20, "max_total_tokens": 150}
    return TokenBudget(TOK, **{**base, **kw})


def msgs_of(tokens: int) -> list[ChatMessage]:
    # One message of exactly `tokens` tokens in all, the reply opener included.
    content = "a" * 0 + " x" * (tokens - MESSAGE_OVERHEAD - REPLY_OVERHEAD)
    m = [ChatMessage("user", content)]
    assert prompt_tokens(TOK, m) == tokens
    return m


@pytest.mark.parametrize(
    ("kw", "limit", "name"),
    [
        ({}, 100, "max_prompt_tokens"),
        ({"max_total_tokens": 110}, 90, "max_total_tokens"),  # 110 - 20 for the answer
        ({"context_token_budget": 60}, 60, "context_token_budget"),
    ],
)
def test_first_prompt_at_and_past_each_limit(kw, limit, name):
    b = budget(**kw)
    assert b.prompt_limit == limit
    assert b.start(msgs_of(limit), ()) == limit
    with pytest.raises(errors.LimitExceededError) as info:
        budget(**kw).start(msgs_of(limit + 1), ())
    metadata = info.value.metadata
    assert (metadata["limit"], metadata["limit_name"]) == (str(limit), name)


def test_the_conversation_grows_with_tool_results_up_to_the_total():
    b = budget()
    b.start(msgs_of(100), ())
    assert b.room() == 30 and b.before_call() == 20
    result = ChatMessage("tool", " x" * 25, tool_call_id="c")
    assert b.add(result) == 30  # with the overhead and the call id
    assert b.room() == 0 and b.tool_result_tokens == b.conversation - 100
    assert b.before_call() == 20  # exactly at the limit
    b.add(ChatMessage("assistant", ""))
    with pytest.raises(errors.LimitExceededError) as info:
        b.before_call()
    assert info.value.reason == "LLM_LIMIT_EXCEEDED"
    assert info.value.metadata["limit_name"] == "max_total_tokens"


def test_totals_take_the_runtimes_prompt_count_else_the_conversation():
    b = budget()
    b.start(msgs_of(40), ())
    assert b.record_call(reported_prompt=0, completion=7) == 40
    assert b.record_call(reported_prompt=55, completion=9) == 55
    assert b.record_call(reported_prompt=30, completion=0) == 30
    assert (b.prompt_used, b.completion_used, b.calls) == (40 + 55 + 30, 7 + 9, 3)


@pytest.mark.parametrize(
    ("kw", "name"),
    [
        ({}, "max_prompt_tokens"),
        ({"max_total_tokens": 110}, "max_total_tokens"),
        ({"context_token_budget": 60}, "context_token_budget"),
    ],
)
def test_fit_prompt_names_the_limit_it_applied(kw, name):
    """fit_prompt named max_prompt_tokens whatever set its limit (a context_token_budget of
    100 was reported as max_prompt_tokens = 100)."""
    b = budget(**kw)
    assert b.prompt_limit_name() == name
    bare = prompt_tokens(TOK, build(()))
    with pytest.raises(errors.LimitExceededError) as info:
        fit_prompt(build, CHUNKS, tools=(), limit=bare - 1, tokenizer=TOK,
                   render_chunk=render_chunk, limit_name=b.prompt_limit_name())  # fmt: skip
    assert info.value.metadata["limit_name"] == name
    assert f"({name})" in info.value.message


def test_the_notes_room_holds_the_total_past_a_context_budget():
    b = budget(context_token_budget=60)
    b.start(msgs_of(50), ())
    assert b.room() == 10  # the caller's budget
    assert b.notes_room() == 150 - 20 - 50  # what the total leaves past the answer's share
    b2 = budget()
    b2.start(msgs_of(50), ())
    assert b2.notes_room() == b2.room() == 80
