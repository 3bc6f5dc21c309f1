"""No text is lost to a heading with nothing under it. Numbered lines in a row ("1. Stop the
service", "2. Copy the data") are a list, read as text, not as headings; and a heading with
no text of its own whose next section is not its child keeps its line as its section's text.
Before, such items and headings vanished from every chunk and section title."""

from __future__ import annotations

from services.docstore.parsing import parse_document
from tests.unit.test_parsing_pdf_furniture import make_pdf


def parse(text: str, fmt: str = "text"):
    return parse_document(tenant_id="t", doc_id="d", content=text.encode(), fmt=fmt)


def held(doc) -> str:
    return "\n".join([*(c.text for c in doc.chunks), *(s.title for s in doc.sections)])


STEPS = ["Stop the ingest service", "Copy the data directory to the NAS", "Start it again"]


def test_a_numbered_list_is_text_of_its_section():
    text = "Backup procedure\n\nTo back up the server:\n"
    text += "".join(f"{n}. {step}\n" for n, step in enumerate(STEPS, start=1))
    text += "\nThe backup takes ten minutes.\n"
    doc = parse(text)
    assert [s.title for s in doc.sections] == ["Backup procedure"]
    assert doc.chunks[0].text == (
        "Backup procedure\n\nTo back up the server:\n\n"
        "1. Stop the ingest service 2. Copy the data directory to the NAS 3. Start it again"
        "\n\nThe backup takes ten minutes."
    )


def test_after_a_list_the_numbering_goes_on_from_before_it():
    text = (
        "1. Introduction\nThis manual covers backups.\n\nTo back up the server:\n\n"
        "2. Stop the ingest service\n\n3. Copy the data directory to the NAS\n\n4. Start it again"
        "\n\n2. Installation\nRun the installer.\n\f2.1 Requirements\nFour cores.\n"
    )
    doc = parse(text)
    assert [s.title for s in doc.sections] == [
        "1. Introduction",
        "2. Installation",
        "2. Installation › 2.1 Requirements",
    ]
    intro = doc.chunks[0].text
    # Items apart from each other are paragraphs of their own, as text reads them.
    assert intro.endswith(
        "To back up the server:\n\n2. Stop the ingest service\n\n"
        "3. Copy the data directory to the NAS\n\n4. Start it again"
    )
    assert doc.sections[2].page_start == 2


def test_a_list_running_over_a_page_break_keeps_each_item_on_its_page():
    doc = parse("Steps\n\n1. Stop the service\f2. Copy the data\n3. Start it\n")
    assert [s.title for s in doc.sections] == ["Steps"]
    assert doc.chunks[0].text == "Steps\n\n1. Stop the service\n\n2. Copy the data 3. Start it"
    assert (doc.chunks[0].page_start, doc.chunks[0].page_end) == (1, 2)


def test_a_numbered_heading_over_its_subsections_is_still_a_heading():
    doc = parse("1. Setup\n1.1 LDAP\nUse ldaps.\n1.2 Backup\nDaily.\n2. Restore\nWith tar.\n")
    assert [s.title for s in doc.sections] == [
        "1. Setup › 1.1 LDAP",
        "1. Setup › 1.2 Backup",
        "2. Restore",
    ]


def test_a_pdf_without_bookmarks_keeps_its_list_items():
    pages = [
        ["1. Backup", "To back up the server:", *(f"{n}. {s}" for n, s in enumerate(STEPS, 1))],
        ["2. Restore", "Restores need the operator role."],
    ]
    doc = parse_document(tenant_id="t", doc_id="p", content=make_pdf(pages), fmt="pdf")
    assert [s.title for s in doc.sections] == ["1. Backup", "2. Restore"]
    assert all(step in held(doc) for step in STEPS)


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
    doc = parse_document(tenant_id="t", doc_id="p", content=make_pdf(pages, outline), fmt="pdf")
    titles = [s.title for s in doc.sections]
    assert titles == ["Contacts", "Support line", "Sales"]
    assert [c.text for c in doc.chunks] == ["Contacts", "Support line", "Working hours 9-18."]
    assert [c.page_start for c in doc.chunks] == [1, 2, 3]


def test_a_table_of_contents_is_a_list_and_the_chapters_after_it_headings():
    toc = "Contents\n1. Introduction\n2. Installation\n3. Usage\n\n"
    body = "1. Introduction\nWhat it is.\n\n2. Installation\nRun it.\n\n3. Usage\nCall it.\n"
    doc = parse(toc + body)
    assert [s.title for s in doc.sections] == [
        "Contents",
        "1. Introduction",
        "2. Installation",
        "3. Usage",
    ]
    assert doc.chunks[0].text == "Contents\n\n1. Introduction 2. Installation 3. Usage"
