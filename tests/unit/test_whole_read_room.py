"""One rule for how much of the selected documents is read whole (S3): what one tool result of
the LLM service holds uncut, weighed in the tokens Retrieval counted of each document's whole
text (services/common/shared_config.py whole_read_tokens, scenarios.fits_whole). A selection
the rule admits reaches the model uncut whatever its script; with the local model's small
context a larger one is searched (S4) instead of read from its beginning."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from services.common.settings import Env
from services.common.shared_config import (
    MAX_CONTEXT_CHARS,
    WHOLE_READ_CALL_TOKENS,
    entry_tokens,
    estimated_tokens,
    ordinary_entries,
    whole_read_tokens,
)
from services.common.tokenizer import default_tokenizer
from services.devtools.mesh import local_model_env
from services.docstore.chunking import whole_text_tokens
from services.docstore.parsing import parse_document
from services.llm.budget import message_tokens
from services.llm.config import LlmSettings
from services.llm.toolcalls import render_result, result_message
from services.orchestrator.config import OrchestratorSettings
from services.orchestrator.scenarios import Selection, decision_prompt
from services.toolsproxy.tools import shape_result

TOK = default_tokenizer()
SAMPLES = Path(__file__).resolve().parents[2] / "samples" / "docs"
RELEASE_NOTES = (SAMPLES / "orion-x-release-notes.md").read_text(encoding="utf-8")
"""Russian with versions and dates: 2.1 characters a cl100k token."""
RARE_WORDS = "Ёжик в тумане: щёлкнул, вздёрнул, разъярённый, подъезд, объявление, вьюга. "
"""Russian prose of rare word forms: 1.5 characters a token, below the estimate's 2."""
ENGLISH = (
    "The coredump_filter file controls which memory segments are written to the core dump "
    "file when a core dump is performed for the process with the corresponding process ID. "
)
"""English prose: 5 characters a token."""
HERE_STRINGS = 'cat <<<"$CONFIG" | grep -v "^#" > /etc/orion/node.conf\n'
"""Shell here-strings: ToolsProxy neutralises `<<<` (one token) into `‹‹‹` (six)."""
CALL_ID = "call_9fQ2xZ7kLmP4vR8tY1wB6nJ3"
"""An OpenAI-style call id, longer than the LLM service's own planned-call ids."""
LOCAL_ROOM = 2560
"""One tool result's room with the local model at n_ctx 8192: 7,168 - 4,096 - 512."""


def _texts(sample: str, chars: int, documents: int) -> list[str]:
    size = chars // documents
    return [(sample * (size // len(sample) + 1))[:size] for _ in range(documents)]


def _ordinary(documents: int) -> list[tuple[str, str]]:
    return [
        (f"orion-x-release-notes-{i}", f"Orion X — заметки о выпуске, часть {i}")
        for i in range(documents)
    ]


LONG_TITLE = ("Руководство администратора Orion X: установка, обновление и восстановление "
              "кластера, " * 12)[:1024]  # fmt: skip
"""A title at its limit (services/docstore/fields.py, 1,024 characters): ≈ 390 tokens."""
LONG_ID = ("orion-x-administration-guide-" * 5)[:128]
"""An id at its limit (128 characters)."""


def _entries(labels: list[tuple[str, str]]) -> int:
    return sum(entry_tokens(TOK.count, doc_id, title) for doc_id, title in labels)


def _whole_read(texts: list[str], labels: list[tuple[str, str]] | None = None) -> dict:
    """A load_documents_full result as ToolsProxy sends it (shaped: delimited, labelled), of
    documents with these (id, title) `labels` (ordinary ones by default)."""
    labels = labels or _ordinary(len(texts))
    docs = [
        {"document_id": doc_id, "title": title, "pages": 9999, "chars": len(text),
         "content": text}
        for (doc_id, title), text in zip(labels, texts, strict=True)
    ]  # fmt: skip
    raw = {"documents": docs, "total_chars": sum(d["chars"] for d in docs)}
    return shape_result(raw, 4 * raw["total_chars"] + 1024, "untrusted_document").result


def _rendered(texts: list[str], ceiling: int, labels: list[tuple[str, str]] | None = None):
    """The whole read as the LLM service's loop renders it when one tool result may take
    `ceiling` tokens of the conversation, the planned call's turn included."""
    read = _whole_read(texts, labels)
    assert read["truncated"] is False  # ToolsProxy sends it whole
    call = json.dumps({"document_ids": [d["document_id"] for d in read["documents"]]})
    room = (
        ceiling
        - message_tokens(TOK, result_message(CALL_ID, "load_documents_full", ""))
        - TOK.count(call)
        - 16
    )
    return render_result("load_documents_full", read, TOK, room)


def test_what_a_whole_read_takes_beside_its_texts():
    assert whole_read_tokens(0, ordinary_entries(10)) == WHOLE_READ_CALL_TOKENS + 10 * 140
    assert whole_read_tokens(1000, 140) == 1000 + 300 + 140
    assert estimated_tokens(0) == 0 and estimated_tokens(1) == estimated_tokens(2) == 1
    # an entry: 72, its id three times, its title (as JSON) once
    assert entry_tokens(TOK.count, "a", "") == 72 + 3 * 1 + TOK.count('""')
    assert _entries(_ordinary(1)) <= 140  # ordinary ids and titles: within the estimate
    assert _entries([(LONG_ID, LONG_TITLE)]) > 3 * 140
    # the default room (28,160 tokens) holds 50,000 characters over ten documents at the estimate
    read = whole_read_tokens(estimated_tokens(MAX_CONTEXT_CHARS), ordinary_entries(10))
    assert read == 26_700 <= 28_160


@pytest.mark.parametrize("labels", ["ordinary", "long"])
@pytest.mark.parametrize("sample", [RELEASE_NOTES, RARE_WORDS, ENGLISH, HERE_STRINGS])
@pytest.mark.parametrize(("chars", "documents"), [(1720, 1), (1720, 10), (20_000, 4)])
def test_a_whole_read_its_count_admits_reaches_the_model_uncut(sample, chars, documents, labels):
    texts = _texts(sample, chars, documents)
    named = _ordinary(documents)
    if labels == "long":
        named = [(f"{LONG_ID[:-3]}-{i:02d}", LONG_TITLE) for i in range(documents)]
    counted = sum(whole_text_tokens([t]) for t in texts)  # as Retrieval counts at ingest
    ceiling = whole_read_tokens(counted, _entries(named))  # as the Orchestrator weighs it
    rendered = _rendered(texts, ceiling, named)
    assert not rendered.truncated
    # and not loose: the texts take more than 4 in 5 of what the rule leaves them
    used = sum(TOK.count(t) for t in rendered.texts)
    assert used > 0.8 * (ceiling - whole_read_tokens(0, _entries(named)))


def test_long_titles_the_flat_allowance_admits_are_cut_and_counted_they_are_searched():
    texts = _texts(ENGLISH, 9000, 2)  # 1,875 tokens: within the flat allowance's 1,980
    named = [(f"{LONG_ID[:-3]}-{i:02d}", LONG_TITLE) for i in range(2)]
    tokens = sum(whole_text_tokens([t]) for t in texts)
    flat = Selection(("a", "b"), 9000, tokens, result_tokens=LOCAL_ROOM)
    assert flat.fits_whole and _rendered(texts, LOCAL_ROOM, named).truncated
    assert not replace(flat, entry_tokens=_entries(named)).fits_whole


@pytest.mark.parametrize("documents", [1, 2])
def test_dense_text_the_character_estimate_admits_is_cut_and_its_count_searches_it(documents):
    """Prose of rare words takes a token a 1.5 characters: the estimate (2) admits a selection
    one tool result cannot hold; weighed by Retrieval's count it is searched. (Over ten short
    documents, what the rule allows each beside its text absorbs the difference.)"""
    limit = (LOCAL_ROOM - whole_read_tokens(0, ordinary_entries(documents))) * 2  # estimated
    texts = _texts(RARE_WORDS, limit, documents)
    chars, tokens = sum(map(len, texts)), sum(TOK.count(t) for t in texts)
    ids = [f"d{i}" for i in range(documents)]
    assert Selection(
        tuple(ids), chars, result_tokens=LOCAL_ROOM
    ).fits_whole  # estimated: admitted ...
    assert _rendered(texts, LOCAL_ROOM).truncated  # ... and cut
    assert not Selection(tuple(ids), chars, tokens, result_tokens=LOCAL_ROOM).fits_whole


def test_english_the_estimate_would_search_is_read_whole_by_its_count():
    texts = _texts(ENGLISH, 9000, 1)
    chars, tokens = len(texts[0]), TOK.count(texts[0])
    assert not Selection(("d",), chars, result_tokens=LOCAL_ROOM).fits_whole  # estimated
    assert Selection(("d",), chars, tokens, result_tokens=LOCAL_ROOM).fits_whole
    assert not _rendered(texts, LOCAL_ROOM).truncated


@pytest.mark.parametrize(
    ("documents", "tokens", "fits"),
    [(1, 2120, True), (1, 2121, False), (2, 1980, True), (2, 1981, False),
     (10, 860, True), (10, 861, False)],
)  # fmt: skip
def test_a_selection_is_read_whole_when_one_result_holds_all_its_tokens(documents, tokens, fits):
    ids = [f"d{i}" for i in range(documents)]
    assert Selection(tuple(ids), 100, tokens, result_tokens=LOCAL_ROOM).fits_whole is fits
    # the characters still hold it (agent.md §10's max_context_chars), and the document count
    assert not Selection(
        tuple(ids), 101, 1, max_context_chars=100, result_tokens=LOCAL_ROOM
    ).fits_whole
    assert not Selection(
        tuple(ids), 100, 1, max_documents=documents - 1, result_tokens=LOCAL_ROOM
    ).fits_whole
    # without a room (the mock, a caller's own Responder) the characters alone decide
    assert Selection(tuple(ids), 100, 10**6, max_context_chars=100).fits_whole
    # entries counted (ids, titles) take their own share instead of 140 a document
    counted = Selection(tuple(ids), 100, 1760, entry_tokens=500, result_tokens=LOCAL_ROOM)
    assert counted.fits_whole and not replace(counted, tokens=1761).fits_whole


@pytest.mark.parametrize("n_ctx", [3712, 4096, 8192, 16384])
def test_the_orchestrator_weighs_selections_against_the_llm_services_room(n_ctx):
    env = Env(local_model_env("http://127.0.0.1:1", "m", n_ctx, env={}))
    room = LlmSettings.from_env(env).loop.max_tool_result_tokens
    orchestrator = OrchestratorSettings.from_env(env)
    assert orchestrator.llm_tool_result_tokens == room
    assert orchestrator.max_context_chars == MAX_CONTEXT_CHARS and orchestrator.held == ()


@pytest.mark.parametrize(
    ("sample", "fits"),
    [("orion-x-admin-guide.md", True), ("shared-mime-info-spec.pdf", False)],
)
def test_at_n_ctx_8192_a_short_guide_is_read_whole_and_a_specification_searched(sample, fits):
    """The sizes Retrieval lists for two samples: 1,967 characters of Russian (828 tokens),
    33,734 of English (7,864 tokens)."""
    env = Env(local_model_env("http://127.0.0.1:1", "m", 8192, env={}))
    room = OrchestratorSettings.from_env(env).llm_tool_result_tokens
    path = SAMPLES / sample
    fmt = "pdf" if path.suffix == ".pdf" else "markdown"
    doc = parse_document(tenant_id="t", doc_id="d", content=path.read_bytes(), fmt=fmt)
    assert Selection(("d",), doc.chars, doc.tokens, result_tokens=room).fits_whole is fits


def test_the_routing_prompt_states_both_limits_of_the_documents_selected():
    prompt = decision_prompt(
        "Что там?", Selection(("a", "b"), 3000, 1981, result_tokens=LOCAL_ROOM)
    )
    assert "total size: 3000 characters, 1981 tokens" in prompt
    assert "the limit for reading them whole is 50000 characters and 1980 tokens." in prompt
    assert 'Choose "selected_search"' in prompt
