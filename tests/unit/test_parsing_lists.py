"""No text is lost to a heading with nothing under it: a heading with no text of its own
whose next section is not its child keeps its line as its section's text, so numbered steps
read as headings ("1. Stop the service", "2. Copy the data") stay searchable, and an empty
section ("2. Definitions") leaves the headings after it headings. Before, such items and
headings vanished from every chunk and section title."""

from __future__ import annotations

from services.docstore.parsing import parse_document
from tests.pdf_bytes import text_pdf


def parse(text: str, fmt: str = "text"):
    return parse_document(tenant_id="t", doc_id="d", content=text.encode(), fmt=fmt)


def held(doc) -> str:
    return "\n".join([*(c.text for c in doc.chunks), *(s.title for s in doc.sections)])


STEPS = ["Stop the ingest service", "Copy the data directory to the NAS", "Start it again"]


def test_numbered_steps_read_as_headings_keep_their_lines():
    text = "Backup procedure\n\nTo back up the server:\n"
    text += "".join(f"{n}. {step}\n" for n, step in enumerate(STEPS, start=1))
    text += "\nThe backup takes ten minutes.\n"
    doc = parse(text)
    assert [s.title for s in doc.sections][1:] == [f"{n}. {s}" for n, s in enumerate(STEPS, 1)]
    assert [c.text for c in doc.chunks] == [
        "Backup procedure\n\nTo back up the server:",
        "1. Stop the ingest service",
        "2. Copy the data directory to the NAS",
        "The backup takes ten minutes.",  # under "3. Start it again", its title
    ]


def test_an_empty_numbered_section_leaves_the_headings_after_it_headings():
    text = (
        "Administrator guide\n\n1. Introduction\nThis guide explains.\n\n2. Definitions\n"
        "3. Installation\nRun the installer as root.\n\n4. Configuration\nEdit /etc/app.conf.\n"
    )
    doc = parse(text)
    assert [s.title for s in doc.sections] == [
        "Administrator guide", "1. Introduction", "2. Definitions", "3. Installation",
        "4. Configuration",
    ]  # fmt: skip
    assert [c.text for c in doc.chunks][2:] == [
        "2. Definitions", "Run the installer as root.", "Edit /etc/app.conf.",
    ]  # fmt: skip
    doc = parse("1. Setup\n1.1 Scope\n1.2 Requirements\nFour cores.\n1.3 Steps\nRun it.\n")
    assert [s.title for s in doc.sections] == [
        "1. Setup › 1.1 Scope", "1. Setup › 1.2 Requirements", "1. Setup › 1.3 Steps",
    ]  # fmt: skip


def test_steps_over_a_page_break_keep_their_pages():
    doc = parse("Steps\n\n1. Stop the service\f2. Copy the data\n3. Start it\n")
    assert [(c.text, c.page_start) for c in doc.chunks] == [
        ("Steps", 1), ("1. Stop the service", 1), ("2. Copy the data", 2), ("3. Start it", 2),
    ]  # fmt: skip


def test_a_numbered_heading_over_its_subsections_is_still_a_heading():
    doc = parse("1. Setup\n1.1 LDAP\nUse ldaps.\n1.2 Backup\nDaily.\n2. Restore\nWith tar.\n")
    assert [s.title for s in doc.sections] == [
        "1. Setup › 1.1 LDAP",
        "1. Setup › 1.2 Backup",
        "2. Restore",
    ]


def test_a_pdf_without_bookmarks_keeps_its_steps():
    pages = [
        ["1. Backup", "To back up the server:", *(f"{n}. {s}" for n, s in enumerate(STEPS, 1))],
        ["2. Restore", "Restores need the operator role."],
    ]
    doc = parse_document(tenant_id="t", doc_id="p", content=text_pdf(pages), fmt="pdf")
    assert all(step in held(doc) for step in STEPS)
    assert "Restores need the operator role." in held(doc)


def test_markdown_sibling_headings_without_text_keep_their_lines():
    md = (
        "# Guide\n\n## Contacts\n\n### Support: +7 495 123-45-67\n\n"
        "### Sales: sales@orion.example\n\nWorking hours 9-18.\n\n## Escalation\n"
    )
    doc = parse(md, "markdown")
    assert [(s.title, doc.chunks[s.first_chunk_ord].text) for s in doc.sections] == [
        ("Contacts › Support: +7 495 123-45-67", "Support: +7 495 123-45-67"),
        ("Contacts › Sales: sales@orion.example", "Working hours 9-18."),
        ("Escalation", "Escalation"),  # the last heading, with nothing after it
    ]


def test_a_bookmark_with_no_text_of_its_own_keeps_its_title():
    pages = [["Contacts"], ["Support line"], ["Sales", "Working hours 9-18."]]
    outline = [("Contacts", 0), ("Support line", 1), ("Sales", 2)]
    doc = parse_document(tenant_id="t", doc_id="p", content=text_pdf(pages, outline), fmt="pdf")
    titles = [s.title for s in doc.sections]
    assert titles == ["Contacts", "Support line", "Sales"]
    assert [c.text for c in doc.chunks] == ["Contacts", "Support line", "Working hours 9-18."]
    assert [c.page_start for c in doc.chunks] == [1, 2, 3]
