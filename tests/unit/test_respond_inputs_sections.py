"""doc_ids with section_ids: one rule in every scenario. Each section id must be a section of
a selected document (doc_ids, filters.doc_ids) or the request is INVALID_ARGUMENT naming
section_ids; sections inside the selection are searched (S4), never dropped by a whole read
(S3)."""

from __future__ import annotations

import json
from datetime import date

import pytest

from services.common import errors
from services.common.document_limits import section_document
from services.common.search_contract import Filters
from services.docstore.parsing import parse_document
from services.orchestrator.model import (
    LlmOutcome,
    RespondInput,
    RetrievalOutcome,
    SectionCandidate,
    User,
)
from services.orchestrator.respond import Responder
from services.orchestrator.runtime_config import ConfigHolder, RuntimeConfig
from services.orchestrator.scenarios import (
    NO_SELECTION,
    Selection,
    decision_schema,
    parse_model_decision,
    rule_decision,
)

SMALL_SECTION = "small:s001-ldap"
BIG_SECTION = "big:s004-backup"
OTHER_SECTION = "other:s000-intro"
SIZES = {"small": (1_000, 400, "Small"), "big": (400_000, 100_000, "Big"), "other": (900, 300, "O")}


class Retriever:
    def __init__(self) -> None:
        self.calls: list = []

    async def search(self, request):
        self.calls.append(("search", request.filters, request.expand_query))
        wanted = request.filters.section_ids or (SMALL_SECTION,)
        return RetrievalOutcome(
            tuple(
                SectionCandidate(s.partition(":")[0], s, "T", "summary", 0.9, 1, 2, f"{s}:c0")
                for s in wanted
            ),
            1,
        )

    async def document_sizes(self, user, doc_ids):
        self.calls.append(("document_sizes", doc_ids))
        return {d: SIZES[d] for d in doc_ids if d in SIZES}


class Generator:
    def __init__(self, routing_answer: str | None = None) -> None:
        self.requests: list = []
        self.routing_answer = routing_answer

    async def generate(self, request):
        self.requests.append(request)
        if request.system_prompt.startswith("You route"):
            if self.routing_answer is None:
                return LlmOutcome("", (), 0, 1, extractive=True)
            return LlmOutcome(self.routing_answer, (), 0, 1)
        return LlmOutcome("answer", (), 0, 1)


def _make(*, mock_mode: bool = False, routing_answer: str | None = None):
    retriever, generator = Retriever(), Generator(routing_answer)
    responder = Responder(
        retriever, generator, ConfigHolder(RuntimeConfig(mock_mode=mock_mode), 3),
        model_routing=routing_answer is not None,
    )  # fmt: skip
    return responder, retriever, generator


def _req(**kw) -> RespondInput:
    return RespondInput(**{"query": "Как настроить LDAP?", "user": User("t", "u"), **kw})


# --- which document a section id names -----------------------------------------------------


@pytest.mark.parametrize(("section_id", "doc_id"), [
    ("small:s001-ldap", "small"),
    ("отчёт-2024.md:s000-intro", "отчёт-2024.md"),
    ("a:b:c", "a"),  # a doc_id holds no ':': the first one ends it
    ("sec_ldap", ""),  # not the ingestion's form: no document named
    ("", ""),
])  # fmt: skip
def test_a_section_id_names_its_document_before_the_first_colon(section_id, doc_id):
    assert section_document(section_id) == doc_id


def test_every_section_ingestion_makes_names_its_document() -> None:
    text = "# Установка\n\nТекст.\n\n# LDAP: вход\n\nЕщё текст.\n"
    doc = parse_document(tenant_id="t", doc_id="отчёт-2024.md", content=text, fmt="markdown")
    assert len(doc.sections) >= 2
    assert {section_document(s.section_id) for s in doc.sections} == {"отчёт-2024.md"}


# --- a section outside the selection: one refusal everywhere -------------------------------


@pytest.mark.parametrize(("kw", "where"), [
    ({"selected_doc_ids": ("small",), "filters": Filters(doc_ids=("small",))}, "S3"),
    ({"selected_doc_ids": ("big",), "filters": Filters(doc_ids=("big",))}, "S4"),
    ({"filters": Filters(doc_ids=("small",))}, "S1"),
])  # fmt: skip
@pytest.mark.parametrize("sections", [
    (OTHER_SECTION,),
    (SMALL_SECTION, BIG_SECTION, OTHER_SECTION),
    ("sec_ldap",),  # names no document
])  # fmt: skip
async def test_a_section_outside_the_selected_documents_is_invalid_argument(kw, where, sections):
    responder, retriever, generator = _make()
    inside = set(kw["filters"].doc_ids)
    stray = next(s for s in sections if section_document(s) not in inside)
    filters = Filters(doc_ids=kw["filters"].doc_ids, section_ids=sections)
    with pytest.raises(errors.InvalidArgumentError) as info:
        await responder.respond(_req(**{**kw, "filters": filters}))
    assert info.value.reason == "INVALID_ARGUMENT", where
    assert info.value.metadata["field"] == "section_ids"
    assert repr(stray) in info.value.message
    assert retriever.calls == [] and generator.requests == []


async def test_section_ids_without_doc_ids_are_not_checked():
    responder, retriever, _ = _make()
    await responder.respond(_req(filters=Filters(section_ids=(OTHER_SECTION, "sec_x"))))
    assert retriever.calls[0][1].section_ids == (OTHER_SECTION, "sec_x")


# --- sections inside the selection: searched in every scenario ------------------------------


@pytest.mark.parametrize("doc", ["small", "big"])
async def test_selected_sections_are_searched_whatever_the_selection_size(doc):
    section = SMALL_SECTION if doc == "small" else BIG_SECTION
    responder, retriever, generator = _make()
    out = await responder.respond(
        _req(selected_doc_ids=(doc,), filters=Filters(doc_ids=(doc,), section_ids=(section,)))
    )
    assert (out.scenario, out.intent) == ("S4", "selected_search")
    searches = [c for c in retriever.calls if c[0] == "search"]
    assert searches[0][1].doc_ids == (doc,) and searches[0][1].section_ids == (section,)
    (answering,) = generator.requests
    assert not answering.planned_calls  # no whole-document read
    assert [s.section_id for s in answering.context] == [section]
    assert [s.section_id for s in out.sources] == [section]


class WholeDocumentRetriever(Retriever):
    """A search without section ids finds its first document's intro."""

    async def search(self, request):
        found = await super().search(request)
        if request.filters.section_ids:
            return found
        doc = request.filters.doc_ids[0]
        intro = SectionCandidate(doc, f"{doc}:s000-intro", "T", "s", 0.5, 1, 1, f"{doc}:c0")
        return RetrievalOutcome((intro,), 1)


async def test_a_selected_document_without_a_named_section_is_searched_whole_beside():
    retriever = WholeDocumentRetriever()
    responder = Responder(
        retriever, Generator(), ConfigHolder(RuntimeConfig(mock_mode=False), 3),
        model_routing=False,
    )  # fmt: skip
    out = await responder.respond(
        _req(selected_doc_ids=("small", "other"),
             filters=Filters(doc_ids=("small", "other"), section_ids=(SMALL_SECTION,)))
    )  # fmt: skip
    assert (out.scenario, out.intent) == ("S4", "selected_search")
    searches = [(c[1].doc_ids, c[1].section_ids) for c in retriever.calls if c[0] == "search"]
    assert sorted(searches) == [(("other",), ()), (("small",), (SMALL_SECTION,))]
    assert [s.section_id for s in out.sources] == [SMALL_SECTION, OTHER_SECTION]


async def test_a_small_selection_without_sections_is_still_read_whole():
    responder, _, generator = _make()
    out = await responder.respond(_req(selected_doc_ids=("small",),
                                       filters=Filters(doc_ids=("small",))))  # fmt: skip
    assert (out.scenario, out.intent) == ("S3", "selected_full")
    assert generator.requests[0].planned_calls[0].tool_name == "load_documents_full"


async def test_the_model_cannot_route_selected_sections_to_a_whole_read():
    model = json.dumps({"scenario": "S3", "intent": "selected_full"})
    responder, _, generator = _make(routing_answer=model)
    out = await responder.respond(_req(selected_doc_ids=("small",),
                                       filters=Filters(doc_ids=("small",),
                                                       section_ids=(SMALL_SECTION,))))  # fmt: skip
    assert (out.scenario, out.intent) == ("S4", "selected_search")
    routing = generator.requests[0]
    assert routing.system_prompt.startswith("You route")
    assert '"selected_full"' not in json.dumps(routing.response_schema)


async def test_sections_of_a_filtered_document_pass_in_s1():
    responder, retriever, _ = _make()
    out = await responder.respond(
        _req(filters=Filters(doc_ids=("small", "other"), section_ids=(OTHER_SECTION,)))
    )
    assert out.scenario == "S1"
    assert retriever.calls[0][1].section_ids == (OTHER_SECTION,)


def test_a_selection_naming_sections_is_never_read_whole():
    small = Selection(("small",), chars=1000, tokens=400)
    named = Selection(("small",), chars=1000, tokens=400, section_ids=(SMALL_SECTION,))
    assert small.fits_whole and not named.fits_whole
    assert "section" in named.facts()
    intents = {o["properties"]["intent"]["const"] for o in decision_schema(named)["anyOf"]}
    assert intents == {"selected_search", "clarify"}
    today = date(2026, 1, 1)
    assert rule_decision("LDAP", selection=named, today=today).intent == "selected_search"
    full = '{"scenario": "S3", "intent": "selected_full"}'
    assert parse_model_decision(full, query="LDAP", selection=named, today=today) is None
    assert NO_SELECTION.section_ids == ()


# --- mock_mode: its sample corpus's section ids carry no document id ------------------------


async def test_mock_mode_knows_its_sample_sections():
    responder, retriever, generator = _make(mock_mode=True)
    out = await responder.respond(
        _req(query="How do I set up LDAP?", selected_doc_ids=("doc_1",),
             filters=Filters(doc_ids=("doc_1",), section_ids=("sec_ldap",)))
    )  # fmt: skip
    assert (out.scenario, out.intent) == ("S4", "selected_search")
    assert {s.section_id for s in out.sources} == {"sec_ldap"}
    with pytest.raises(errors.InvalidArgumentError) as info:
        await responder.respond(
            _req(selected_doc_ids=("doc_1",),
                 filters=Filters(doc_ids=("doc_1",), section_ids=("sec_terms",)))  # doc_2's
        )  # fmt: skip
    assert info.value.metadata["field"] == "section_ids"
    assert retriever.calls == [] and generator.requests == []  # the real ports: never asked
