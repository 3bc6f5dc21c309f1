"""Running headers and footers of a PDF are dropped only where they run: among a page's first
and last two non-blank lines. A line that is a number alone ("389", a port; "1", a runlevel)
is never taken for one in the body, where every such line used to be dropped once the
page-number footer had made a bare number a running line."""

from __future__ import annotations

from services.docstore.parsing import parse_document
from tests.pdf_bytes import text_pdf

SERVICES = [("ldap", "389"), ("https", "8443"), ("smtp", "25"), ("ssh", "2222"), ("dns", "53")]


def port_pages(header: str = "") -> list[list[str]]:
    """A page a service: its port on a line of its own mid-page, a page-number footer."""
    return [
        [
            *([header] if header else []),
            f"The {name} listener must be reachable from the admin network.",
            f"Port of {name}:",
            port,
            f"Open it in the firewall before enabling {name}.",
            f"The {name} service logs to its own journal.",
            str(n),
        ]
        for n, (name, port) in enumerate(SERVICES, start=1)
    ]


def chunk_text(doc) -> str:
    return "\n".join(c.text for c in doc.chunks)


def test_numbers_on_lines_of_their_own_stay_and_page_numbers_go():
    doc = parse_document(tenant_id="t", doc_id="p", content=text_pdf(port_pages()), fmt="pdf")
    text = chunk_text(doc)
    for name, port in SERVICES:
        assert f"Port of {name}:\n\n{port} Open it in the firewall" in text
    for n in range(1, len(SERVICES) + 1):  # the footers: "...own journal." then the number
        assert f"journal. {n}" not in text and not text.rstrip().endswith(str(n))


def test_a_running_header_goes_at_the_edge_and_its_words_stay_in_the_body():
    pages = port_pages(header="Orion X operations manual")
    pages[2].insert(4, "Orion X operations manual")  # the same words mid-page
    outlined = text_pdf(pages, [(f"{name} service", i) for i, (name, _) in enumerate(SERVICES)])
    for content in (text_pdf(pages), outlined):
        doc = parse_document(tenant_id="t", doc_id="h", content=content, fmt="pdf")
        text = chunk_text(doc)
        assert text.count("Orion X operations manual") == 1
        assert "25 Orion X operations manual Open it in the firewall" in text
        assert all(
            f"{port} Open it in the firewall" in text for _, port in SERVICES if port != "25"
        )
