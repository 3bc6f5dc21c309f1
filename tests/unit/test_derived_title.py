"""A title the parser takes from the document itself (PDF metadata, the lone top Markdown
heading, the first line) or a section's heading is held to a caller's title bound,
fields.MAX_TITLE_CHARS: cut at the last space within it, else at the bound."""

from __future__ import annotations

import pytest

from services.docstore.fields import MAX_TITLE_CHARS, check_fields
from services.docstore.parsing import MAX_FIRST_LINE_TITLE, derived_title, parse_document
from tests.pdf_bytes import assemble_pdf

WORDS = "word " * 300  # 1,500 characters, a space every five
PAST = MAX_TITLE_CHARS + 1


def tiny_pdf(title: str, text: str = "Body text") -> bytes:
    """A one-page PDF with a text layer and `title` (Latin-1) as its metadata Title."""
    content = f"BT /F1 12 Tf 20 100 Td ({text}) Tj ET".encode()
    page = (
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 200] "
        b"/Resources << /Font << /F1 5 0 R >> >> /Contents 4 0 R >>"
    )
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        page,
        b"<< /Length %d >>\nstream\n%b\nendstream" % (len(content), content),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Title (%b) >>" % title.encode("latin-1"),
    ]
    return assemble_pdf(objects, b"/Info 6 0 R")


def parse(content: bytes | str, fmt: str, title: str = ""):
    return parse_document(tenant_id="t", doc_id="doc-1", content=content, fmt=fmt, title=title)


def assert_word_cut(title: str, whole: str) -> None:
    """`title` is `whole` cut at a space within the bound."""
    assert len(title) <= MAX_TITLE_CHARS
    assert whole.startswith(title) and whole[len(title)] == " "
    assert title == title.strip()


@pytest.mark.parametrize(
    ("text", "title"),
    [
        ("w" * MAX_TITLE_CHARS, "w" * MAX_TITLE_CHARS),  # at the limit: whole
        ("w" * PAST, "w" * MAX_TITLE_CHARS),  # one word past it: cut at the bound
        ("w" * 100_000, "w" * MAX_TITLE_CHARS),
        ("w" * MAX_TITLE_CHARS + " tail", "w" * MAX_TITLE_CHARS),  # a space right at the bound
        ("a" * 1000 + " " + "b" * 100, "a" * 1000),  # the last space within the bound
        ("a" * 1000 + " \t " + "b" * 100, "a" * 1000),
        ("  Short title \n", "Short title"),
        ("", ""),
    ],
)
def test_derived_title_holds_the_bound(text, title):
    assert derived_title(text) == title


def test_derived_title_cuts_words_at_a_space():
    assert_word_cut(derived_title(WORDS), WORDS)
    assert derived_title(WORDS).endswith("word")


@pytest.mark.parametrize(
    ("heading", "title"),
    [
        ("w" * MAX_TITLE_CHARS, "w" * MAX_TITLE_CHARS),
        ("w" * PAST, "w" * MAX_TITLE_CHARS),
        ("w" * 100_000, "w" * MAX_TITLE_CHARS),
    ],
)
def test_a_markdown_heading_title_is_held_to_the_bound(heading, title):
    doc = parse(f"# {heading}\n\nSome body text.\n", "markdown")
    assert doc.title == title
    assert all(len(s.title) <= MAX_TITLE_CHARS for s in doc.sections)
    check_fields(title=doc.title)


def test_a_long_markdown_heading_is_cut_at_a_word():
    doc = parse(f"# {WORDS}\n\nSome body text.\n\n## {WORDS}\n\nMore text.\n", "markdown")
    whole = WORDS.strip()
    assert_word_cut(doc.title, whole)
    assert len(doc.sections) == 2
    assert_word_cut(doc.sections[0].title, whole)
    assert_word_cut(doc.sections[-1].title, whole)


@pytest.mark.parametrize(
    ("meta", "title"),
    [
        ("w" * MAX_TITLE_CHARS, "w" * MAX_TITLE_CHARS),
        ("w" * PAST, "w" * MAX_TITLE_CHARS),
        ("Short", "Short"),
    ],
)
def test_a_pdf_metadata_title_is_held_to_the_bound(meta, title):
    assert parse(tiny_pdf(meta), "pdf").title == title


def test_a_long_pdf_metadata_title_is_cut_at_a_word():
    assert_word_cut(parse(tiny_pdf(WORDS), "pdf").title, WORDS.strip())


def test_a_first_line_is_a_title_only_when_short():
    line = "t" * MAX_FIRST_LINE_TITLE
    assert parse(f"{line}\n\nBody.", "text").title == line
    assert parse(f"{line}t\n\nBody.", "text").title == "doc-1"  # a paragraph, not a title
    assert parse("w" * 100_000, "text").title == "doc-1"


def test_a_callers_title_is_kept_as_given():
    assert parse("# Heading\n\nBody.", "markdown", title="Mine").title == "Mine"


@pytest.mark.parametrize(
    ("given", "title"),
    [("   ", "Heading"), ("\n\t", "Heading"), ("  Two\nlines  ", "Two lines"), ("Mine", "Mine")],
)
def test_a_callers_title_is_one_line_and_a_blank_one_gives_way(given: str, title: str):
    """A blank title replaced the document's own with nothing to show; a title of lines
    broke every listing line it stood in."""
    assert parse("# Heading\n\nBody.", "markdown", title=given).title == title
