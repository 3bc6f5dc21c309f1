"""The gateway's input-safety verdict (x-visior-safety-input, orchestrator.md §6): the most
severe of every value sent decides, and a blocked input is refused without a search, a read
or a model call."""

from __future__ import annotations

import itertools
from dataclasses import replace
from types import SimpleNamespace

import pytest
from visior.orchestrator.v1 import orchestrator_pb2 as pb

from services.common import errors
from services.common.search_contract import Filters
from services.orchestrator.model import LlmOutcome, RespondInput, RetrievalOutcome, User
from services.orchestrator.respond import Responder
from services.orchestrator.runtime_config import ConfigHolder, RuntimeConfig
from services.orchestrator.servicer import SAFETY_HEADER, OrchestratorServicer, safety_verdict

SEVERITY = ("allowed", "flagged", "blocked")


class CountingRetriever:
    """Records every call: a blocked input must make none."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def search(self, request):
        self.calls.append("search")
        return RetrievalOutcome((), 1)

    async def document_sizes(self, user, doc_ids):
        self.calls.append("document_sizes")
        return {d: (100, 40, "Title") for d in doc_ids}


class CountingGenerator:
    def __init__(self) -> None:
        self.requests: list = []

    async def generate(self, request):
        self.requests.append(request)
        return LlmOutcome("answer", (), 0, 1)


def _responder(*, mock_mode: bool = False):
    retriever, generator = CountingRetriever(), CountingGenerator()
    holder = ConfigHolder(RuntimeConfig(mock_mode=mock_mode), 3)
    # The mock ports are the same counting fakes: mock_mode must not answer either.
    responder = Responder(retriever, generator, holder, model_routing=True,
                          mock=(retriever, generator))  # fmt: skip
    return responder, retriever, generator


# --- the header: the most severe value ----------------------------------------------------


@pytest.mark.parametrize("values", [p for n in (2, 3) for p in itertools.permutations(SEVERITY, n)])
def test_the_most_severe_of_several_safety_headers_decides(values):
    metadata = [(SAFETY_HEADER, v) for v in values]
    assert safety_verdict(metadata) == max(values, key=SEVERITY.index)


def test_a_client_prepending_allowed_does_not_override_the_gateways_verdict():
    metadata = [(SAFETY_HEADER, "allowed"), ("other", "x"), (SAFETY_HEADER, b"Blocked ")]
    assert safety_verdict(metadata) == "blocked"


@pytest.mark.parametrize(("value", "verdict"), [
    ("allowed, blocked", "blocked"),  # one header line, values joined as HTTP joins them
    ("flagged,allowed", "flagged"),
    ("allowed", "allowed"),
])  # fmt: skip
def test_comma_joined_values_count_each(value, verdict):
    assert safety_verdict([(SAFETY_HEADER, value)]) == verdict


@pytest.mark.parametrize("values", [("allowed", "maybe"), ("maybe", "blocked"),
                                    ("blocked", ""), ("allowed, maybe",)])  # fmt: skip
def test_an_unknown_value_among_several_is_invalid_argument_naming_the_header(values):
    with pytest.raises(errors.InvalidArgumentError) as info:
        safety_verdict([(SAFETY_HEADER, v) for v in values])
    assert info.value.reason == "INVALID_ARGUMENT"
    assert info.value.metadata["field"] == SAFETY_HEADER


def test_no_safety_header_is_allowed():
    assert safety_verdict([("other", "blocked")]) == "allowed"
    assert safety_verdict(None) == "allowed"


# --- a blocked input -----------------------------------------------------------------------


@pytest.mark.parametrize("mock_mode", [False, True])
@pytest.mark.parametrize(("kw", "language"), [
    ({"query": "Как настроить LDAP?"}, "ru"),
    ({"query": "How do I set up LDAP?"}, "en"),
    ({"query": "LDAP"}, "ru"),  # not clearly English: Russian
    ({"query": "How do I set up LDAP?", "selected_doc_ids": ("guide",)}, "en"),  # no S3 read
    ({"query": "курс доллара"}, "ru"),  # no rates fetched
    ({"query": "What is VAT?", "filters": Filters(source="knowledge_base")}, "en"),
    ({"query": "How do I set up LDAP?", "locale": "ru-RU"}, "ru"),  # answers follow the locale
])  # fmt: skip
async def test_a_blocked_input_is_refused_without_search_reads_or_model(kw, language, mock_mode):
    responder, retriever, generator = _responder(mock_mode=mock_mode)
    req = RespondInput(**{"user": User("t", "u"), "trace_id": "tr", **kw})
    out = await responder.respond(replace(req, safety_input="blocked"))
    assert retriever.calls == [] and generator.requests == []
    assert out.answer and out.sources == () and out.tools == ()
    assert (out.safety_input, out.safety_output) == ("blocked", "allowed")
    assert (out.scenario, out.intent, out.decided_by) == ("", "blocked", "safety")
    assert (out.tool_steps, out.retrieval_latency_ms, out.llm_latency_ms) == (0, 0, None)
    assert out.trace_id == "tr"
    cyrillic = any("а" <= c.lower() <= "я" for c in out.answer)
    assert cyrillic == (language == "ru"), out.answer


async def test_a_blocked_input_is_still_validated_first():
    responder, retriever, generator = _responder()
    req = RespondInput(query="x" * 5000, user=User("t", "u"), safety_input="blocked")
    with pytest.raises(errors.LimitExceededError):
        await responder.respond(req)
    assert retriever.calls == [] and generator.requests == []


async def test_a_flagged_input_is_answered_and_echoed():
    responder, retriever, generator = _responder()
    req = RespondInput(query="Как настроить LDAP?", user=User("t", "u"), safety_input="flagged")
    out = await responder.respond(req)
    assert retriever.calls and generator.requests
    assert out.safety_input == "flagged" and out.intent != "blocked"


async def test_the_servicer_refuses_when_any_safety_header_says_blocked():
    responder, retriever, generator = _responder()
    servicer = OrchestratorServicer(responder, ConfigHolder(RuntimeConfig(mock_mode=False), 3))
    context = SimpleNamespace(
        invocation_metadata=lambda: ((SAFETY_HEADER, "allowed"), (SAFETY_HEADER, "blocked"))
    )
    request = pb.RespondRequest(query="Как настроить LDAP?", user_id="u", tenant_id="demo")
    response = await servicer.Respond(request, context)  # type: ignore[arg-type]
    assert retriever.calls == [] and generator.requests == []
    assert response.safety.input == "blocked" and not response.sources and not response.tools
    assert (response.telemetry.scenario, response.telemetry.intent) == ("", "blocked")
    assert not response.telemetry.HasField("llm_latency_ms")
