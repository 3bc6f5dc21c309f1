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
    MAX_TOOL_RESULT_TOKENS,
    WHOLE_READ_ENVELOPE_TOKENS,
    whole_read_chars,
    whole_read_tokens,
)
from services.common.tokenizer import default_tokenizer
from services.devtools.mesh import local_model_env
from services.llm.config import LlmSettings
from services.llm.toolcalls import render_result
from services.orchestrator.config import OrchestratorSettings

TOK = default_tokenizer()
SAMPLES = Path(__file__).resolve().parents[2] / "samples" / "docs"
DENSE = (SAMPLES / "orion-x-release-notes.md").read_text(encoding="utf-8")
"""The densest sample in cl100k tokens: Russian with versions and dates, 2.1 characters a
token."""


def _whole_read(chars: int, documents: int) -> dict:
    """A load_documents_full result as ToolsProxy writes it: `chars` characters of DENSE in
    all, over `documents` documents with ordinary ids and titles."""
    size = chars // documents
    docs = []
    for i in range(documents):
        text = (DENSE * (size // len(DENSE) + 1))[:size]
        docs.append({"document_id": f"orion-x-release-notes-{i}",
                     "title": f"Orion X — заметки о выпуске, часть {i}", "pages": 3,
                     "chars": len(text), "content": text})  # fmt: skip
    return {"documents": docs, "total_chars": sum(d["chars"] for d in docs)}


def test_the_default_whole_read_is_the_largest_tool_result():
    assert whole_read_tokens(MAX_CONTEXT_CHARS) == MAX_TOOL_RESULT_TOKENS == 26_000
    assert whole_read_chars(MAX_TOOL_RESULT_TOKENS) == MAX_CONTEXT_CHARS


@pytest.mark.parametrize("chars", [1, 2, 3, 3120, 49_999, 50_000])
def test_the_room_and_the_characters_are_inverse(chars):
    assert whole_read_chars(whole_read_tokens(chars)) >= chars
    assert whole_read_chars(whole_read_tokens(chars) - 1) < chars


def test_a_room_below_the_envelope_holds_nothing():
    assert whole_read_tokens(0) == WHOLE_READ_ENVELOPE_TOKENS
    assert whole_read_chars(WHOLE_READ_ENVELOPE_TOKENS) == whole_read_chars(1) == 0
    assert whole_read_chars(WHOLE_READ_ENVELOPE_TOKENS + 1) == 2


@pytest.mark.parametrize(
    ("chars", "documents"), [(3120, 1), (3120, 10), (20_000, 4), (MAX_CONTEXT_CHARS, 10)]
)
def test_a_whole_read_of_that_size_reaches_the_model_uncut(chars, documents):
    room = whole_read_tokens(chars)
    rendered = render_result("load_documents_full", _whole_read(chars, documents), TOK, room)
    assert not rendered.truncated
    # and not loose: the texts take more than 4 in 5 of what the rule leaves them
    texts = sum(TOK.count(d["content"]) for d in _whole_read(chars, documents)["documents"])
    assert texts > 0.8 * (room - WHOLE_READ_ENVELOPE_TOKENS)


@pytest.mark.parametrize("n_ctx", [3712, 4096, 8192, 16384])
def test_with_the_local_model_the_orchestrator_reads_whole_what_one_result_holds(n_ctx):
    env = Env(local_model_env("http://127.0.0.1:1", "m", n_ctx, env={}))
    room = LlmSettings.from_env(env).loop.max_tool_result_tokens
    orchestrator = OrchestratorSettings.from_env(env)
    assert orchestrator.max_context_chars == whole_read_chars(room) < MAX_CONTEXT_CHARS
    assert orchestrator.held == (
        f"ORCH_MAX_CONTEXT_CHARS=50000 is held to {whole_read_chars(room)} (what one LLM tool "
        "result holds uncut: at most 26,000 tokens, and what LLM_SERVICE_MAX_TOTAL_TOKENS "
        "leaves past MAX_PROMPT_TOKENS and MAX_COMPLETION_TOKENS)",
    )


def test_at_n_ctx_8192_a_man_page_of_seven_pages_is_searched():
    """The answer harness's held-out S3 documents are 7 and 14 pages of 2,500 characters."""
    env = Env(local_model_env("http://127.0.0.1:1", "m", 8192, env={}))
    assert OrchestratorSettings.from_env(env).max_context_chars == 3120 < 7 * 2500
