"""S3 answers from the whole documents without a search (agent.md §5.4): when the search that
finds the answer's pages fails, the answer stands and its documents are cited without pages."""

import logging

import pytest

from services.common import errors
from services.orchestrator.model import (
    LlmOutcome,
    RespondInput,
    RetrievalOutcome,
    SectionCandidate,
    ToolCallRecord,
    User,
)
from services.orchestrator.respond import MAX_SOURCES, Responder
from services.orchestrator.runtime_config import ConfigHolder, RuntimeConfig

ANSWER = "The notice period is 30 days (contract, p. 2)."
HIT = SectionCandidate("contract", "s-notice", "Notice", "", 0.7, 2, 2, "contract:c4")


class Retriever:
    """Searches answer from `outcomes` in turn: a RetrievalOutcome, or an exception raised."""

    def __init__(self, *outcomes, sizes_error=None):
        self.outcomes = list(outcomes)
        self.queries = []
        self.sizes_error = sizes_error

    async def search(self, request):
        self.queries.append(request.query)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def document_sizes(self, user, doc_ids):
        if self.sizes_error is not None:
            raise self.sizes_error
        return {d: (1000, 250, d) for d in doc_ids}


class Generator:
    def __init__(self, error=None):
        self.error = error
        self.calls = 0

    async def generate(self, request):
        self.calls += 1
        if self.error is not None:
            raise self.error
        return LlmOutcome(
            ANSWER,
            (ToolCallRecord("load_documents_full", {"document_ids": ["contract"]}, "read 1000"),),
            1,
            5,
        )


def responder(retriever, generator=None):
    return Responder(
        retriever, generator or Generator(), ConfigHolder(RuntimeConfig(), 3), model_routing=False
    )


def ask(doc_ids=("contract", "annex"), query="What is the notice period?"):
    return RespondInput(
        query=query, user=User("t1", "u1"), trace_id="tr-s3", selected_doc_ids=doc_ids
    )


DOWN = [
    errors.BackendUnavailableError("retrieval: index unavailable"),
    errors.UnavailableError("retrieval: connection refused"),
    errors.DeadlineExceededError("retrieval: deadline exceeded"),
    errors.InternalError("retrieval refused the request", reason="DOWNSTREAM_REJECTED"),
]


@pytest.mark.parametrize("error", DOWN, ids=lambda e: e.reason)
async def test_a_failed_page_search_keeps_the_answer_and_cites_the_documents_without_pages(
    error, caplog
):
    retriever = Retriever(error)
    with caplog.at_level(logging.WARNING, logger="visior.orchestrator"):
        out = await responder(retriever).respond(ask())
    assert (out.scenario, out.answer) == ("S3", ANSWER)
    assert [(s.doc_id, s.section_id, s.page_start, s.page_end) for s in out.sources] == [
        ("contract", "", 0, 0), ("annex", "", 0, 0),
    ]  # fmt: skip
    assert out.retrieval_latency_ms == 0 and [t.name for t in out.tools] == ["load_documents_full"]
    assert len(retriever.queries) == 1  # the question is not searched once the search is down
    (record,) = [
        r
        for r in caplog.records
        if r.name == "visior.orchestrator" and r.levelno == logging.WARNING
    ]
    assert record.trace_id == "tr-s3" and record.reason == error.reason


async def test_a_search_failing_after_one_that_found_nothing_keeps_its_latency():
    retriever = Retriever(RetrievalOutcome((), 4), errors.BackendUnavailableError("down"))
    out = await responder(retriever).respond(ask())
    assert retriever.queries == [ANSWER, "What is the notice period?"]
    assert [(s.doc_id, s.page_start) for s in out.sources] == [("contract", 0), ("annex", 0)]
    # The first search's 4 ms, and the selection's size lookup as the clock timed it (0 ms
    # alone, a few on a loaded machine).
    assert 4 <= out.retrieval_latency_ms < 50


async def test_a_search_that_answers_still_names_the_pages():
    out = await responder(Retriever(RetrievalOutcome((HIT,), 3))).respond(ask())
    assert [(s.doc_id, s.section_id, s.page_start, s.page_end) for s in out.sources] == [
        ("contract", "s-notice", 2, 2)
    ]


@pytest.mark.parametrize("selected", [MAX_SOURCES, MAX_SOURCES + 1])
async def test_the_documents_cited_without_pages_stay_within_max_sources(selected):
    doc_ids = tuple(f"d{i}" for i in range(selected))
    out = await responder(Retriever(errors.BackendUnavailableError("down"))).respond(ask(doc_ids))
    assert [s.doc_id for s in out.sources] == list(doc_ids[:MAX_SOURCES])


async def test_a_fault_that_is_not_a_service_error_is_not_hidden():
    with pytest.raises(RuntimeError):
        await responder(Retriever(RuntimeError("a bug"))).respond(ask())


async def test_errors_before_the_answer_still_fail_the_request():
    # The selection's sizes decide the scenario: without them there is no answer to keep.
    sizes_down = Retriever(sizes_error=errors.BackendUnavailableError("down"))
    with pytest.raises(errors.BackendUnavailableError):
        await responder(sizes_down).respond(ask())
    generator = Generator(errors.UnavailableError("llm down", reason="LLM_RUNTIME_ERROR"))
    retriever = Retriever(RetrievalOutcome((HIT,), 3))
    with pytest.raises(errors.UnavailableError):
        await responder(retriever, generator).respond(ask())
    assert retriever.queries == []  # no page search for an answer that never came


async def test_an_s1_search_failure_still_fails_the_request():
    # S1 answers from what the search finds: without it there is nothing to answer from.
    retriever = Retriever(errors.BackendUnavailableError("down"))
    with pytest.raises(errors.BackendUnavailableError):
        await responder(retriever).respond(ask(doc_ids=(), query="How do I set up LDAP?"))
