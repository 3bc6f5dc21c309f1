"""S1/S4 sources: the listed sections the answer read come first, with the pages read; the
other listed sections follow, MAX_SOURCES in all; with nothing read, the listed sections."""

from datetime import date

import pytest

from services.common.generate_contract import ToolCallRecord, failed_call_summary
from services.orchestrator.mock import MockGenerator, MockRetriever
from services.orchestrator.model import (
    LlmOutcome,
    RespondInput,
    RetrievalOutcome,
    SectionCandidate,
    User,
)
from services.orchestrator.respond import MAX_SOURCES, Responder, read_sources
from services.orchestrator.runtime_config import ConfigHolder, RuntimeConfig

SECTIONS = tuple(
    SectionCandidate(f"doc-{i}", f"s{i}", f"Title {i}", f"summary {i} of the policy",
                     0.9 - i * 0.05, 10 * i + 1, 10 * i + 2, f"doc-{i}:c0")
    for i in range(10)
)  # fmt: skip
LONG = SectionCandidate("guide", "s-long", "Long", "", 0.6, 20, 40, "guide:c77")


def section_read(i, pages=None):
    """read_doc_section of SECTIONS[i], as the LLM service records it."""
    where = f" (pp. {pages[0]}–{pages[1]})" if pages else ""
    return ToolCallRecord(
        "read_doc_section", {"doc_id": f"doc-{i}", "section_id": f"s{i}"},
        f"read 900 characters of doc-{i}{where}",
    )  # fmt: skip


def window_read(section, first, last, radius=1):
    """read_chunk_window on the section's anchor, as the policy executes it (no section_id)."""
    return ToolCallRecord(
        "read_chunk_window",
        {"doc_id": section.doc_id, "anchor_chunk_id": section.anchor_chunk_id, "radius": radius},
        f"read 1200 characters of {section.doc_id} (pp. {first}–{last})",
    )


def cited(sources):
    return [(s.doc_id, s.section_id, s.page_start, s.page_end) for s in sources]


def listed(*indexes):
    return [(f"doc-{i}", f"s{i}", 10 * i + 1, 10 * i + 2) for i in indexes]


class Retriever:
    def __init__(self, sections):
        self.sections = sections

    async def search(self, request):
        return RetrievalOutcome(self.sections, 2)

    async def document_sizes(self, user, doc_ids):
        return {d: (500_000, 0, d) for d in doc_ids}  # over the whole-read limit: S4


class Generator:
    def __init__(self, *tools):
        self.tools = tools
        self.requests = []

    async def generate(self, request):
        self.requests.append(request)
        return LlmOutcome(
            "Per doc-7 pp. 71-72, the limit is 5 days.", self.tools, len(self.tools), 1
        )


async def respond(sections, *tools, **kw):
    generator = Generator(*tools)
    responder = Responder(Retriever(sections), generator, ConfigHolder(RuntimeConfig(), 3),
                          model_routing=False, today=lambda: date(2026, 11, 28))  # fmt: skip
    out = await responder.respond(
        RespondInput(query="Какой срок согласования отпуска по политике?", user=User("t1", "u1"),
                     **kw)
    )  # fmt: skip
    return out, generator


async def test_the_section_the_model_read_is_the_first_source_with_the_pages_read():
    out, generator = await respond(SECTIONS, section_read(7, (71, 72)))
    assert len(generator.requests[-1].context) == 10  # all ten were listed
    assert cited(out.sources) == [("doc-7", "s7", 71, 72), *listed(0, 1, 2, 3)]
    assert out.sources[0].score == SECTIONS[7].score


async def test_s4_cites_what_it_read_in_the_selection_the_same_way():
    out, _ = await respond(SECTIONS, section_read(7, (71, 72)), selected_doc_ids=("doc-7",))
    assert out.scenario == "S4"
    assert cited(out.sources)[0] == ("doc-7", "s7", 71, 72)


async def test_nothing_read_cites_the_listed_sections():
    out, _ = await respond(SECTIONS)
    assert cited(out.sources) == listed(0, 1, 2, 3, 4)


@pytest.mark.parametrize(
    "summary",
    [
        failed_call_summary("NOT_FOUND", "section 's7' not found in 'doc-7'"),
        failed_call_summary("RATE_LIMIT_EXCEEDED", "too many reads"),
    ],
)
async def test_a_read_that_failed_read_nothing(summary):
    failed = ToolCallRecord("read_doc_section", {"doc_id": "doc-7", "section_id": "s7"}, summary)
    out, _ = await respond(SECTIONS, failed)
    assert cited(out.sources) == listed(0, 1, 2, 3, 4)


def test_the_extractive_read_of_the_first_anchor_keeps_the_first_source():
    # The LLM service's responder without a model reads the first listed anchor with
    # read_chunk_window; its window lies inside the section here.
    sources = read_sources(SECTIONS, (window_read(SECTIONS[0], 1, 2),))
    assert cited(sources) == listed(0, 1, 2, 3, 4)


def test_a_window_names_the_pages_of_the_section_it_read():
    assert cited(read_sources((LONG,), (window_read(LONG, 27, 28),))) == [
        ("guide", "s-long", 27, 28)
    ]
    # A window reaching into the sections beside it: the section's own pages among those read.
    assert cited(read_sources((LONG,), (window_read(LONG, 18, 21),))) == [
        ("guide", "s-long", 20, 21)
    ]
    assert cited(read_sources((LONG,), (window_read(LONG, 39, 44),))) == [
        ("guide", "s-long", 39, 40)
    ]


def test_wider_reads_of_one_section_are_one_source_over_every_page_read():
    reads = (
        window_read(LONG, 27, 28, 1),
        window_read(LONG, 26, 29, 2),
        window_read(LONG, 25, 30, 3),
    )
    assert cited(read_sources((LONG, *SECTIONS[:2]), reads)) == [
        ("guide", "s-long", 25, 30), *listed(0, 1),
    ]  # fmt: skip


def test_a_read_naming_no_pages_cites_the_section_pages():
    assert cited(read_sources(SECTIONS, (section_read(3),))) == [*listed(3, 0, 1, 2, 4)]
    pageless = SectionCandidate("memo", "s1", "Memo", "", 0.5, 0, 0, "memo:c1")
    # Pages Retrieval does not know, named by the read: the pages read.
    assert cited(read_sources((pageless,), (window_read(pageless, 3, 4),))) == [
        ("memo", "s1", 3, 4)
    ]


def test_reads_are_cited_in_the_order_listed():
    reads = (section_read(8, (81, 82)), section_read(2, (21, 21)))
    assert cited(read_sources(SECTIONS, reads)) == [
        ("doc-2", "s2", 21, 21), ("doc-8", "s8", 81, 82), *listed(0, 1, 3),
    ]  # fmt: skip


@pytest.mark.parametrize("count", [MAX_SOURCES, MAX_SOURCES + 1])
def test_the_sources_stay_within_max_sources_however_much_was_read(count):
    reads = tuple(section_read(i, (10 * i + 1, 10 * i + 1)) for i in range(9, 9 - count, -1))
    sources = read_sources(SECTIONS, reads)
    assert len(sources) == MAX_SOURCES
    # The first MAX_SOURCES read, as listed; past MAX_SOURCES the lowest listed is left out.
    first = 9 - count + 1
    assert [s.section_id for s in sources] == [f"s{i}" for i in range(first, first + MAX_SOURCES)]


def test_only_reads_of_listed_sections_count():
    reads = (
        # another document's chunk id, a section of an unlisted document, a tool that reads
        # no listed section
        ToolCallRecord("read_chunk_window", {"doc_id": "doc-9", "anchor_chunk_id": "doc-7:c0",
                                             "radius": 1}, "read 10 characters of doc-9 (pp. 5–5)"),
        ToolCallRecord("read_doc_section", {"doc_id": "other", "section_id": "s7"},
                       "read 10 characters of other (pp. 71–72)"),
        ToolCallRecord("read_doc_pages", {"doc_id": "doc-7", "page_start": 71},
                       "read 10 characters of doc-7 (pp. 71–71)"),
    )  # fmt: skip
    assert cited(read_sources(SECTIONS, reads)) == listed(0, 1, 2, 3, 4)


def test_fewer_listed_sections_than_max_sources_cite_no_more():
    assert cited(read_sources(SECTIONS[:2], (section_read(1, (11, 12)),))) == listed(1, 0)
    assert read_sources((), (section_read(1, (11, 12)),)) == ()


async def test_mock_mode_cites_the_page_its_answer_quotes():
    holder = ConfigHolder(RuntimeConfig(), 3)
    responder = Responder(MockRetriever(), MockGenerator(), holder, model_routing=False)
    out = await responder.respond(
        RespondInput(query="How do I set up LDAP integration?", user=User("t", "u"))
    )
    (tool,) = out.tools
    assert tool.result_summary.endswith("of doc_1 (pp. 2–6)")  # the window reaches sec_intro
    # sec_ldap is pages 6-7; the window read its page 6, which the answer quotes.
    assert cited(out.sources)[0] == ("doc_1", "sec_ldap", 6, 6)
    assert "administrator guide, pp. 6" in out.answer
