"""The loop's notes (services/llm/loop.py, services/llm/prompt.py): the answer language and
the request for the final answer ride on the conversation within LLM_SERVICE_MAX_TOTAL_TOKENS,
leave the answer its least share (MIN_ANSWER_TOKENS), and each is a turn of its own."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from services.common import errors
from services.llm.budget import prompt_tokens
from services.llm.loop import MIN_ANSWER_TOKENS
from services.llm.model import GenerateInput, PlannedCall, Turn
from services.llm.prompt import (
    FINAL_ANSWER_NOTE,
    LANGUAGE_NOTES,
    QUESTION_NOTES,
)
from services.model_runtime.chat import ChatMessage, GenerationParams
from tests.unit.test_loop import (
    POLICY,
    TOK,
    FakeTools,
    ScriptedRuntime,
    asks,
    call,
    loop,
    req,
    says,
    window,
)

LONG_QUESTION = (
    "Подскажите, пожалуйста, как в Orion X настроить интеграцию с корпоративным каталогом LDAP "
    "так, чтобы пользователи из нескольких подразделений автоматически получали нужные роли, "
    "группы синхронизировались по расписанию раз в час, а учётные записи уволенных сотрудников "
    "блокировались без ручного вмешательства и без потери истории их действий в журнале аудита?"
)
BIG = "В Orion X LDAP настраивается в разделе Настройки → Каталог. " * 2000
READ = call("read_chunk_window", {"doc_id": "guide", "anchor_chunk_id": "guide:c1"})


def least_answer(share: int) -> int:
    return min(MIN_ANSWER_TOKENS, max(1, share // 2))


def sent_tokens(sent: dict[str, Any]) -> int:
    return prompt_tokens(TOK, sent["messages"], sent["tools"])


# --- the total budget and the answer's least share ----------------------------------------


@pytest.mark.parametrize("language", ["ru", ""])
@pytest.mark.parametrize("max_tokens", [None, 64, 300, 1])
@pytest.mark.parametrize("steps", [1, 3])
async def test_every_call_fits_the_total_and_leaves_the_answer_its_least_share(
    language, max_tokens, steps
):
    """A tool result takes every token it may (max_tool_result_tokens is no cap here): the
    notes still fit the total, and the answer keeps its least share (it was cut to 1 token
    and the call went past the total)."""
    total = 4096 + 512 + 1200
    rt = ScriptedRuntime([asks(READ), says("ok")])
    lp = loop(rt, FakeTools(default=window(text=BIG)), max_total_tokens=total,
              max_tool_result_tokens=100_000, max_tool_steps=steps)  # fmt: skip
    r = req(messages=(Turn("user", LONG_QUESTION),), answer_language=language,
            params=GenerationParams(max_tokens=max_tokens))  # fmt: skip
    out = await lp.run(r)
    assert out.answer == "ok"
    assert out.tools_called[0].result_summary.endswith("truncated to the token budget")
    share = 512 if max_tokens is None else max_tokens
    for sent in rt.calls:
        assert sent_tokens(sent) + sent["params"].max_tokens <= total
        assert least_answer(share) <= sent["params"].max_tokens <= share
    last = rt.calls[-1]
    assert (last["messages"][-1].content == FINAL_ANSWER_NOTE) == (steps == 1 and not language)


async def _probe(r: GenerateInput, **settings: Any) -> tuple[int, int]:
    """The first prompt without the language note and what the note adds to it, as sent."""
    rt = ScriptedRuntime([says("ok")])
    await loop(rt, FakeTools(), **settings).run(r)
    sent = rt.calls[0]
    conversation = prompt_tokens(TOK, sent["messages"][:-1], sent["tools"])
    return conversation, sent_tokens(sent) - conversation


@pytest.mark.parametrize("past", [0, 1])
async def test_the_note_takes_the_answers_share_down_to_its_least(past):
    """The note that repeats the question takes all it may of the answer's share at the
    limit; one token past it, the note names the language alone and the answer keeps its
    share."""
    question = "ё" * 500  # a restated note of about 530 tokens
    r = req(messages=(Turn("user", question),), answer_language="ru")
    conversation, note = await _probe(r, max_total_tokens=100_000)
    assert note > 500
    total = conversation + note + MIN_ANSWER_TOKENS - past
    rt = ScriptedRuntime([says("ok")])
    await loop(rt, FakeTools(), max_total_tokens=total).run(r)
    sent = rt.calls[0]
    closing = sent["messages"][-1].content
    if past:
        assert closing == LANGUAGE_NOTES["ru"]
        assert sent["params"].max_tokens == 512
    else:
        assert closing == f"{QUESTION_NOTES['ru']}{question}"
        assert sent["params"].max_tokens == MIN_ANSWER_TOKENS
    assert sent_tokens(sent) + sent["params"].max_tokens <= total


@pytest.mark.parametrize("past", [0, 1])
async def test_a_call_that_cannot_keep_the_answers_least_share_is_refused(past):
    """The answer's share is 16 (least 8); the language note alone takes more than the other 8:
    at the limit the answer gets its least, one token past it the request is refused
    rather than sent for fewer tokens of answer."""
    r = req(messages=(Turn("user", "Q" * 501),), answer_language="ru",
            params=GenerationParams(max_tokens=16))  # fmt: skip
    conversation, note = await _probe(r, max_total_tokens=100_000)
    assert note > 8
    total = conversation + 16 + note - 8 - past
    rt = ScriptedRuntime([says("ok")])
    run = loop(rt, FakeTools(), max_total_tokens=total).run(r)
    if past:
        with pytest.raises(errors.LimitExceededError) as info:
            await run
        assert info.value.reason == "LLM_LIMIT_EXCEEDED"
        assert info.value.metadata["limit_name"] == "max_total_tokens"
        assert info.value.metadata["limit"] == str(total)
        assert rt.calls == []  # never sent
    else:
        await run
        assert rt.calls[0]["params"].max_tokens == 8
        assert sent_tokens(rt.calls[0]) + 8 == total


async def test_a_planned_read_that_takes_the_last_step_leaves_room_for_both_notes():
    """The final-answer note and the language note ride on the call after a planned read
    that took every token it could: the call still fits, with the answer's least share."""
    policy = replace(POLICY, max_tool_steps=1,
                     planned_calls=(PlannedCall("read_doc_section",
                                                {"doc_id": "faq", "section_id": "f1"}),))  # fmt: skip
    rt = ScriptedRuntime([says("ok")])
    total = 2600
    r = req(policy=policy, answer_language="en", params=GenerationParams(max_tokens=40))
    await loop(rt, FakeTools([window(text=BIG)]), max_total_tokens=total).run(r)
    sent = rt.calls[0]
    # The final-answer note follows the tool turn, and the language note closes the call.
    assert sent["messages"][-3].role == "tool"
    assert sent["messages"][-2].content == FINAL_ANSWER_NOTE
    assert sent["messages"][-1].content == f"{QUESTION_NOTES['en']}How do I set up LDAP?"
    assert sent_tokens(sent) + sent["params"].max_tokens <= total
    assert sent["params"].max_tokens >= least_answer(40)


# --- the notes as turns of their own -------------------------------------------------------


async def test_the_language_note_is_a_turn_of_its_own():
    """Each note is a user turn of its own after the conversation: joined to the question's
    turn, the bundled 1.5B model answered "28" where a Russian sentence was asked for."""
    rt = ScriptedRuntime([says("ok")])
    policy = replace(POLICY, allowed_tools=())
    await loop(rt, FakeTools()).run(req(answer_language="ru", policy=policy))
    sent = rt.calls[0]["messages"]
    assert sent[-2] == ChatMessage("user", "How do I set up LDAP?")
    assert sent[-1] == ChatMessage("user", QUESTION_NOTES["ru"] + "How do I set up LDAP?")


@pytest.mark.parametrize("language", ["ru", ""])
async def test_the_prompt_estimate_counts_the_notes_as_sent(language):
    """With no count from the runtime, the prompt tokens reported are what each call sent,
    the notes included."""
    rt = ScriptedRuntime([asks(READ), says("ok")])
    r = req(answer_language=language)
    out = await loop(rt, FakeTools(default=window()), max_tool_steps=1).run(r)
    assert out.prompt_tokens == sum(sent_tokens(c) for c in rt.calls)
    notes = [m.content for m in rt.calls[-1]["messages"][-2:]]
    assert FINAL_ANSWER_NOTE in notes
