"""parsing: no word of a document is lost to how it is read. An outline heading comes off a
section's text only as whole words; a line at a page's edge goes as a page number only when
it is one (digits, a lowercase roman numeral); CR-only and CR LF Markdown reads as LF does,
with setext headings; and a doc_id derived from a file name keeps its letters of any
script."""

from __future__ import annotations

import random

import pytest

from services.common.document_limits import MAX_DOC_ID_CHARS, is_doc_id
from services.docstore.errors import ParseError
from services.docstore.parsing import decode_text, derived_doc_id, parse_document, slugify
from tests.pdf_bytes import text_pdf


def parse(content: bytes | str, fmt: str = "markdown"):
    data = content if isinstance(content, bytes) else content.encode()
    return parse_document(tenant_id="t", doc_id="d", content=data, fmt=fmt)


def texts(doc) -> list[str]:
    return [c.text for c in doc.chunks]


def titles(doc) -> list[str]:
    return [s.title for s in doc.sections]


# --- an outline heading comes off its section's text only as whole words ----------------------


def test_an_outline_heading_that_is_a_words_prefix_leaves_the_word_whole():
    pages = [
        ["Backups run nightly at two and are kept for thirty days.", "Restores take an hour."],
        ["Monitoring alerts page the on-call engineer.", "Dashboards live in Grafana."],
    ]
    doc = parse(text_pdf(pages, outline=[("Backup", 0), ("Monitor", 1)]), "pdf")
    assert titles(doc) == ["Backup", "Monitor"]
    assert texts(doc) == [
        "Backups run nightly at two and are kept for thirty days. Restores take an hour.",
        "Monitoring alerts page the on-call engineer. Dashboards live in Grafana.",
    ]


def test_an_outline_heading_printed_above_its_text_still_comes_off():
    pages = [["Backup", "Backups run nightly."], ["2.1 Monitor:", "Alerts page the on-call."]]
    doc = parse(text_pdf(pages, outline=[("Backup", 0), ("Monitor:", 1)]), "pdf")
    assert texts(doc) == ["Backups run nightly.", "Alerts page the on-call."]


# --- a page-edge line is dropped only when it is a page number --------------------------------


def test_a_page_edge_word_of_roman_letters_is_text_and_a_lowercase_numeral_a_page_number():
    pages = [
        ["Manage the cluster from the web console or from the", "CLI"],
        ["xii", "The agent restarts itself after an update.", "XL"],
        ["Mix the logs of both nodes.", "civil"],
        ["iv", "Restores take an hour.", "17"],
    ]
    words = " ".join(texts(parse(text_pdf(pages), "pdf"))).split()
    assert {"CLI", "XL", "Mix", "civil"} <= set(words)
    assert not {"xii", "iv", "17"} & set(words)


# --- line endings and setext headings ---------------------------------------------------------


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"], ids=["lf", "crlf", "cr"])
def test_markdown_reads_alike_whatever_ends_its_lines(newline: str):
    lines = [
        "# Guide",
        "",
        "Backups run",
        "nightly.",
        "",
        "## Restore",
        "",
        "Restores take an hour.",
    ]
    doc = parse(newline.join(lines) + newline)
    assert (doc.title, titles(doc)) == ("Guide", ["Guide", "Restore"])
    assert texts(doc) == ["Backups run nightly.", "Restores take an hour."]
    assert "\r" not in "".join(doc.page_texts)


def test_decode_text_makes_every_line_ending_a_lf():
    assert decode_text(b"a\r\nb\rc\n\r\nd\r") == "a\nb\nc\n\nd\n"
    assert decode_text("\ufeffa\rb") == "a\nb"
    assert decode_text("a\r\nb".encode("utf-16")) == "a\nb"
    with pytest.raises(ParseError):
        decode_text(b"a\rb\x00")


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16", "utf-16-le", "utf-16-be"])
def test_a_nul_is_binary_in_every_encoding(encoding: str):
    """One rule whatever the file's encoding: UTF-16 with its BOM was taken with the NUL."""
    content = "ab\x00cd".encode(encoding)
    if encoding.endswith(("-le", "-be")):
        content = "\ufeff".encode(encoding) + content
    with pytest.raises(ParseError, match="NUL"):
        decode_text(content)
    with pytest.raises(ParseError, match="NUL"):
        decode_text("ab\x00cd")


def test_setext_headings_are_headings():
    doc = parse(
        "Guide\n=====\n\nBackups run nightly.\n\nRestore\n-------\n\nRestores take an hour.\n"
    )
    assert (doc.title, titles(doc)) == ("Guide", ["Guide", "Restore"])
    assert texts(doc) == ["Backups run nightly.", "Restores take an hour."]


def test_a_dash_line_after_a_paragraph_line_heads_it_and_after_a_blank_breaks():
    doc = parse("# Notes\n\nFirst part.\n\n---\n\nSecond part.\nLimits\n---\nAt most ten.\n")
    assert titles(doc) == ["Notes", "Limits"]
    assert texts(doc) == ["First part.\n\nSecond part.", "At most ten."]


@pytest.mark.parametrize(
    "markdown",
    [
        "# Notes\n\n- an item\n---\nText.\n",  # after a list item: a break
        "# Notes\n\n> quoted\n---\nText.\n",  # after a block quote: a break
        "# Notes\n\n```\ncode\n---\n```\nText.\n",  # in a code fence: code
        "# Notes\n\nOne\n= =\nText.\n",  # spaces inside: no underline
        "# Notes\n\n***\nText.\n\n_ _ _\n",
    ],
)
def test_what_is_no_setext_heading(markdown: str):
    doc = parse(markdown)
    assert titles(doc) == ["Notes"]
    assert "Text." in texts(doc)[-1]


def test_front_matter_is_text_and_its_closing_line_underlines_nothing():
    doc = parse("---\ntitle: Guide\nlang: en\n---\n\n# Guide\n\nBackups run nightly.\n")
    assert doc.title == "Guide"
    assert texts(doc) == ["title: Guide lang: en", "Backups run nightly."]


# --- doc_ids derived from file names ---------------------------------------------------------


@pytest.mark.parametrize(
    ("file_name", "doc_id"),
    [
        ("Übersicht.md", "übersicht"),
        ("Ελληνικά.md", "ελληνικά"),
        ("中文.md", "中文"),
        ("docs/Регламент отпусков.md", "регламент-отпусков"),
        ("a/Read Me.md", "read-me"),
        ("C:\\Users\\ivan\\Documents\\Отчёт.md", "отчёт"),  # Windows folders
        ("share\\docs/Read Me.md", "read-me"),
        ("ＦＵＬＬ＿ｗｉｄｔｈ².pdf", "full-width2"),  # NFKC
        ("Straße & Café (v2).txt", "straße-café-v2"),
        ("--__--.md", ""),
        ("हिन्दी.md", "हिन्दी"),  # vowel signs and the virama stay with their letters
        ("ก้าว.md", "ก้าว"),
        ("\u0301abc.md", "abc"),  # a mark with no letter before it is no letter
    ],
)
def test_a_derived_doc_id_keeps_letters_and_digits_of_any_script(file_name: str, doc_id: str):
    assert derived_doc_id(file_name) == doc_id
    assert doc_id == "" or is_doc_id(doc_id)


def test_every_derived_doc_id_is_a_doc_id():
    rng = random.Random(3)
    alphabet = "aZ9_-. ÜßİıǅĲ²½Ⅻ日本語Ελλάδαабв\u0301\u0307\u200b\u00a0🙂ｆ٣हिन्दीก้"
    for _ in range(2_000):
        name = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 150)))
        doc_id = derived_doc_id(name + ".md")
        assert doc_id == "" or (is_doc_id(doc_id) and len(doc_id) <= MAX_DOC_ID_CHARS), name


def test_a_doc_id_takes_combining_marks_after_its_first_character():
    assert is_doc_id("a\u0301") and is_doc_id("हिन्दी") and is_doc_id("a" * 127 + "\u0301")
    assert not is_doc_id("\u0301a") and not is_doc_id("a" * 128 + "\u0301")


def test_a_slug_is_held_to_its_limit_and_falls_back_when_empty():
    assert slugify("Ελληνικά κείμενα " * 10, limit=12) == "ελληνικά-κεί"
    assert slugify("!!!") == "x"
    assert slugify("— —", fallback="intro") == "intro"
