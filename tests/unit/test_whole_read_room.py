"""One rule for how much of the selected documents is read whole (S3): what one tool result of
the LLM service holds uncut (services/common/shared_config.py whole_read_chars). The
Orchestrator holds ORCH_MAX_CONTEXT_CHARS to it, the LLM service renders a whole read of that
size without cutting it, and with the local model's small context larger selections are
searched (S4) instead of read from their beginning."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.settings import Env
from services.common.shared_config import (
    MAX_CONTEXT_CHARS,
    WHOLE_READ_CALL_TOKENS,
    WHOLE_READ_DOCUMENT_TOKENS,
    whole_read_chars,
    whole_read_tokens,
)
from services.common.tokenizer import default_tokenizer
from services.devtools.mesh import local_model_env
from services.llm.budget import message_tokens
from services.llm.config import LlmSettings
from services.llm.toolcalls import render_result, result_message
from services.orchestrator.config import DEFAULT_WHOLE_READ_CHARS, OrchestratorSettings
from services.orchestrator.scenarios import decision_prompt, fits_whole, whole_limit
from services.toolsproxy.tools import shape_result

TOK = default_tokenizer()
SAMPLES = Path(__file__).resolve().parents[2] / "samples" / "docs"
DENSE = (SAMPLES / "orion-x-release-notes.md").read_text(encoding="utf-8")
"""The densest sample in cl100k tokens: Russian with versions and dates, 2.1 characters a
token."""
CALL_ID = "call_9fQ2xZ7kLmP4vR8tY1wB6nJ3"
"""An OpenAI-style call id, longer than the LLM service's own planned-call ids."""


def _whole_read(chars: int, documents: int) -> dict:
    """A load_documents_full result as ToolsProxy sends it (shaped: delimited, labelled):
    `chars` characters of DENSE in all, over `documents` documents with ordinary ids and
    titles."""
    size = chars // documents
    docs = []
    for i in range(documents):
        text = (DENSE * (size // len(DENSE) + 1))[:size]
        docs.append({"document_id": f"orion-x-release-notes-{i}",
                     "title": f"Orion X — заметки о выпуске, часть {i}", "pages": 3,
                     "chars": len(text), "content": text})  # fmt: skip
    raw = {"documents": docs, "total_chars": sum(d["chars"] for d in docs)}
    return shape_result(raw, 4 * chars + 1024, "untrusted_document").result


def _fed_room(tokens: int) -> int:
    """What the LLM service's loop gives a result's text of a `tokens` ceiling (its message's
    own tokens aside)."""
    return tokens - message_tokens(TOK, result_message(CALL_ID, "load_documents_full", ""))


def test_the_default_whole_read_fits_the_default_tool_result():
    assert DEFAULT_WHOLE_READ_CHARS == 55_440 >= MAX_CONTEXT_CHARS
    assert whole_read_chars(28_160, 10) == 52_920 >= MAX_CONTEXT_CHARS  # ten documents too
    assert whole_read_tokens(0, 10) == WHOLE_READ_CALL_TOKENS + 10 * WHOLE_READ_DOCUMENT_TOKENS


@pytest.mark.parametrize("documents", [1, 10])
@pytest.mark.parametrize("chars", [1, 2, 3, 1720, 49_999, 50_000])
def test_the_room_and_the_characters_are_inverse(chars, documents):
    assert whole_read_chars(whole_read_tokens(chars, documents), documents) >= chars
    assert whole_read_chars(whole_read_tokens(chars, documents) - 1, documents) < chars


def test_a_room_below_what_the_read_takes_beside_its_texts_holds_nothing():
    beside = WHOLE_READ_CALL_TOKENS + WHOLE_READ_DOCUMENT_TOKENS
    assert whole_read_chars(beside, 1) == whole_read_chars(1, 1) == 0
    assert whole_read_chars(beside + 1, 1) == 2


@pytest.mark.parametrize(
    ("chars", "documents"), [(1720, 1), (1720, 10), (20_000, 4), (MAX_CONTEXT_CHARS, 10)]
)
def test_a_whole_read_of_that_size_reaches_the_model_uncut(chars, documents):
    ceiling = whole_read_tokens(chars, documents)
    read = _whole_read(chars, documents)
    assert read["truncated"] is False
    # the planned call's turn: what the conversation holds before the result
    call = f'{{"document_ids": {[d["document_id"] for d in read["documents"]]}}}'
    room = _fed_room(ceiling) - TOK.count(call) - 16
    rendered = render_result("load_documents_full", read, TOK, room)
    assert not rendered.truncated
    # and not loose: the texts take more than 4 in 5 of what the rule leaves them
    texts = sum(TOK.count(t) for t in rendered.texts)
    assert texts > 0.8 * (ceiling - WHOLE_READ_CALL_TOKENS - WHOLE_READ_DOCUMENT_TOKENS * documents)


@pytest.mark.parametrize("n_ctx", [3712, 4096, 8192, 16384])
def test_with_the_local_model_the_orchestrator_reads_whole_what_one_result_holds(n_ctx):
    env = Env(local_model_env("http://127.0.0.1:1", "m", n_ctx, env={}))
    room = LlmSettings.from_env(env).loop.max_tool_result_tokens
    orchestrator = OrchestratorSettings.from_env(env)
    assert orchestrator.llm_tool_result_tokens == room
    held = whole_read_chars(room, 1)
    assert orchestrator.max_context_chars == held < MAX_CONTEXT_CHARS
    assert orchestrator.held == (
        f"ORCH_MAX_CONTEXT_CHARS=50000 is held to {held} (what one tool result of the LLM "
        "service holds of one document uncut: LLM_SERVICE_MAX_TOTAL_TOKENS less "
        "MAX_PROMPT_TOKENS and MAX_COMPLETION_TOKENS)",
    )


def test_at_n_ctx_8192_a_man_page_of_seven_pages_is_searched():
    """The answer harness's held-out S3 documents are 7 and 14 pages of 2,500 characters."""
    env = Env(local_model_env("http://127.0.0.1:1", "m", 8192, env={}))
    assert OrchestratorSettings.from_env(env).max_context_chars == 4240 < 7 * 2500


@pytest.mark.parametrize(
    ("documents", "chars", "fits"),
    [(1, 4240, True), (1, 4241, False), (2, 3960, True), (2, 3961, False),
     (10, 1720, True), (10, 1721, False)],
)  # fmt: skip
def test_a_selection_is_read_whole_when_one_result_holds_all_its_documents(documents, chars, fits):
    ids = [f"d{i}" for i in range(documents)]
    assert fits_whole(ids, chars, 50_000, 10, result_tokens=2560) is fits
    assert whole_limit(documents, 50_000, 2560) == whole_read_chars(2560, documents)
    # without a room (the mock, a caller's own Responder) the characters alone decide
    assert fits_whole(ids, chars, 50_000, 10) is True
    assert whole_limit(documents, 4000, None) == 4000


def test_the_routing_prompt_states_the_limit_of_the_documents_selected():
    prompt = decision_prompt(
        "Что там?", selected_doc_ids=("a", "b"), selected_chars=3961,
        max_context_chars=4240, result_tokens=2560,
    )  # fmt: skip
    assert "the limit for reading them whole is 3960 characters" in prompt
    assert 'Choose "selected_search"' in prompt
