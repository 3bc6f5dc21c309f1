"""Edges of a PDF's outline and metadata (services/docstore/pdf.py) and of the worker that reads
PDFs (pdf_worker.py). A bookmark whose destination is the page top over a heading far down the
page is placed at its heading, not at the destination; bookmarks on one page never go back up
it. Invalid UTF-16 in the /Title or a bookmark's title is repaired or dropped, not a refusal
of the whole PDF; and an unexpected error in one PDF's read is that PDF's ParseError, the
worker reading the next one."""

from __future__ import annotations

import io
import pickle

import pytest

from services.docstore import pdf_worker
from services.docstore.errors import ParseError
from services.docstore.parsing import parse_document
from services.docstore.pdf import PdfTextLimitError, read_pdf
from services.docstore.pdf_worker import PdfWorker
from tests.pdf_bytes import LINE_GAP, text_pdf

BODY = [
    f"Line {i} of the overview explains how the cluster is deployed and maintained."
    for i in range(12)
]
SECTIONS = {
    "Overview": BODY,
    "Security": ["Passwords rotate every ninety days. Keys live in the vault."],
    "Backups": ["Backups run nightly at two."],
}


def line_top(index: int) -> int:
    """A destination's top just above the page's line `index` (0-based)."""
    return 760 - LINE_GAP * index + LINE_GAP // 2


def section_pdf() -> bytes:
    """Three sections on page 1, each bookmark to the page top; the last two headings lie
    more than 400 characters below it. An appendix on page 2."""
    page = [line for title, body in SECTIONS.items() for line in (title, *body)]
    outline = [(title, 0, 792) for title in SECTIONS]
    return text_pdf([page, ["Appendix", "Nothing more."]], [*outline, ("Appendix", 1, 792)])


def section_texts(content: bytes) -> dict[str, str]:
    doc = parse_document(tenant_id="t", doc_id="d", content=content, fmt="pdf")
    return {
        s.title: " ".join(c.text for c in doc.chunks if c.section_id == s.section_id)
        for s in doc.sections
    }


def test_bookmarks_to_the_page_top_are_placed_at_their_headings_far_below() -> None:
    content = section_pdf()
    text = read_pdf(content)
    page = text.pages[0]
    assert page.index("Security") > 400  # past the window around the destination
    for entry in text.outline:
        assert text.pages[entry.page - 1][entry.offset :].startswith(entry.title), entry
    texts = section_texts(content)
    for title, body in SECTIONS.items():
        assert texts[title], title
        for line in body:
            assert line in texts[title], (title, line)
        for other, lines in SECTIONS.items():
            if other != title:
                assert not any(line in texts[title] for line in lines), (title, other)
    assert texts["Appendix"] == "Nothing more."


def test_a_heading_after_its_destination_wins_over_a_mention_before_it() -> None:
    # "Security" is mentioned on line 1, more than 400 characters above the bookmark's
    # destination (line 10); its heading is more than 400 characters below it.
    body = BODY + BODY
    lines = ["Overview", "Security is covered further down.", *body, "Security", "Keys."]
    content = text_pdf([lines], [("Overview", 0, 792), ("Security", 0, line_top(10))])
    text = read_pdf(content)
    page = text.pages[0]
    destination = len("\n".join(page.split("\n")[:10])) + 1
    assert destination - page.index("Security is") > 400
    assert page.index("Security\nKeys.") - destination > 400
    assert text.outline[1].offset == page.index("Security\nKeys.")


def test_a_heading_near_its_destination_still_wins_over_a_later_mention() -> None:
    lines = ["Overview", *BODY[:4], "Security", "Keys.", *BODY[4:12], "See Security above."]
    content = text_pdf([lines], [("Overview", 0, 792), ("Security", 0, line_top(5))])
    page, security = read_pdf(content).pages[0], read_pdf(content).outline[1]
    assert security.offset == page.index("Security\nKeys.")


def test_a_title_met_only_inside_a_sentence_leaves_the_bookmark_at_its_destination() -> None:
    # "Backup" points at the heading "Saving your data"; the title's words occur only
    # inside a sentence above it: that mention is no heading, and never above the bookmark.
    lines = ["Overview", "This guide also says where the backup copies are kept.", *BODY[:10],
             "Saving your data", "Copies run nightly at two."]  # fmt: skip
    content = text_pdf([lines], [("Overview", 0, 792), ("Backup", 0, line_top(12))])
    text = read_pdf(content)
    assert text.pages[0][text.outline[1].offset :].startswith("Saving your data")
    texts = section_texts(content)
    assert "backup copies are kept" in texts["Overview"]
    assert texts["Backup"].startswith("Saving your data")


@pytest.mark.parametrize(
    ("before", "cut"),
    [
        ("Before upgrading, check the cluster backup status and logs.", "ter backup"),
        ("Before upgrading, check the backup status and logs.", "the backup"),
    ],
)
def test_a_mention_inside_a_line_is_never_taken_for_the_heading(before: str, cut: str) -> None:
    """A bookmark to the page top over its heading's own line: the page's first sentence,
    the previous section's end, mentions the title. Neither "ter " of "cluster" nor "the"
    is a section number, and no mention inside a line is the heading: the sentence stays
    whole in the previous section and the section starts at its heading's line."""
    pages = [["Installation", "Install the package and reboot."],
             [before, "Backup", "Backups run nightly at two."]]  # fmt: skip
    texts = section_texts(text_pdf(pages, [("Installation", 0), ("Backup", 1)]))
    assert before in texts["Installation"] and cut not in texts["Backup"]
    assert texts["Backup"].strip() == "Backups run nightly at two."


@pytest.mark.parametrize(
    "heading", ["Backup", "2.1 Backup", "3) Backup", "A. Backup", "a. Backup", "iv) Backup",
                "IV Backup", "    Backup", "Backup:"],
)  # fmt: skip
def test_a_heading_line_in_any_numbering_style_is_found_and_dropped(heading: str) -> None:
    pages = [["Installation", "Install the package and reboot."],
             ["The backup status is checked first.", heading, "Backups run nightly at two."]]  # fmt: skip
    texts = section_texts(text_pdf(pages, [("Installation", 0), ("Backup", 1)]))
    assert "The backup status is checked first." in texts["Installation"]
    assert texts["Backup"].strip() == "Backups run nightly at two."


def test_a_title_met_only_inside_a_line_leaves_the_section_at_its_destination() -> None:
    """No line holds the title: the section starts at the bookmark's destination (the page
    top here) and keeps every word, the mention's too."""
    pages = [["Intro text on page one."], ["Restore the cluster backup nightly."]]
    texts = section_texts(text_pdf(pages, [("Intro", 0), ("Backup", 1)]))
    assert texts["Intro"].strip() == "Intro text on page one."
    assert texts["Backup"].strip() == "Restore the cluster backup nightly."


def test_bookmarks_on_a_page_never_go_back_up_it() -> None:
    # Listed out of reading order, and one whose title is not on the page at all.
    lines = ["Security", *BODY, "Backups", "Nightly.", "Overview", "Done."]
    outline = [("Backups", 0, 792), ("Security", 0, 792), ("Nowhere", 0, 792), ("Overview", 0, 792)]
    text = read_pdf(text_pdf([lines], outline))
    offsets = [entry.offset for entry in text.outline]
    assert offsets == sorted(offsets)
    page = text.pages[0]
    assert offsets[0] == page.index("Backups")
    assert offsets[1] == offsets[2] == offsets[0]  # Security lies above: not before Backups
    assert offsets[3] == page.index("Overview")


PAGE = ["Installation guide", "Install the package with apt. It takes a minute."]


@pytest.mark.parametrize(
    ("info", "title"),
    [
        (b"<< /Title <FEFFD800> >>", ""),  # a lone surrogate and nothing else: no title
        (b"<< /Title <FEFF0041D8000042> >>", "A\ufffdB"),  # repaired
        (b"<< /Title (Guide) /Author <FEFFDC00> >>", "Guide"),  # other entries are not read
    ],
)
def test_invalid_utf16_in_the_title_is_repaired_or_dropped(info: bytes, title: str) -> None:
    text = read_pdf(text_pdf([PAGE], info=info))
    assert text.title == title
    assert text.pages[0] == "\n".join(PAGE)


def test_a_bookmark_with_invalid_utf16_is_repaired_or_skipped() -> None:
    outline = [(b"<FEFFDC00>", 0, 792), (b"<FEFF0041DC000042>", 0, 792), ("Installation", 0, 792)]
    text = read_pdf(text_pdf([PAGE], outline))
    assert [entry.title for entry in text.outline] == ["A\ufffdB", "Installation"]
    assert text.pages[0] == "\n".join(PAGE)


def test_the_worker_reads_pdfs_with_invalid_utf16_titles() -> None:
    bad = [
        text_pdf([PAGE], info=b"<< /Title <FEFFD800> >>"),
        text_pdf([PAGE], [(b"<FEFFDC00>", 0, 792)]),
    ]
    worker = PdfWorker()
    try:
        for content in bad:
            doc = parse_document(
                tenant_id="t", doc_id="d", content=content, fmt="pdf", pdf_reader=worker
            )
            assert doc.title == "Installation guide"  # derived as for a PDF without one
            assert "Install the package with apt." in " ".join(c.text for c in doc.chunks)
    finally:
        worker.close()


def _request(content: bytes, max_text_bytes: int = 1 << 20) -> bytes:
    return pdf_worker._REQUEST.pack(len(content), max_text_bytes) + content


def _answers(stream: io.BytesIO) -> list[tuple[object, ...]]:
    stream.seek(0)
    out = []
    while header := stream.read(pdf_worker._ANSWER.size):
        (size,) = pdf_worker._ANSWER.unpack(header)
        out.append(pickle.loads(stream.read(size)))
    return out


def test_an_unexpected_error_refuses_that_pdf_and_the_worker_reads_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    good = text_pdf([PAGE])

    def read(content: bytes, *, max_text_bytes: int):
        if content == b"%PDF boom":
            raise UnicodeDecodeError("utf-16-le", b"\x00\xdc", 0, 2, "illegal encoding")
        return read_pdf(content, max_text_bytes=max_text_bytes)

    monkeypatch.setattr(pdf_worker, "read_pdf", read)
    answers = io.BytesIO()
    pdf_worker.serve(io.BytesIO(_request(b"%PDF boom") + _request(good)), answers)
    failed, read_next = _answers(answers)
    with pytest.raises(ParseError, match=r"cannot read the PDF: .*UnicodeDecodeError"):
        pdf_worker._result(failed, 1 << 30)
    assert pdf_worker._result(read_next, 1 << 30) == read_pdf(good)


@pytest.mark.parametrize(
    ("error", "refusal"),
    [
        (MemoryError(), pdf_worker.PdfMemoryLimitError),
        (PdfTextLimitError("too much text", limit=10), PdfTextLimitError),
        (ParseError("not a PDF file"), ParseError),
    ],
)
def test_the_mapped_errors_keep_their_own_refusals(
    monkeypatch: pytest.MonkeyPatch, error: Exception, refusal: type[Exception]
) -> None:
    def read(content: bytes, *, max_text_bytes: int):
        raise error

    monkeypatch.setattr(pdf_worker, "read_pdf", read)
    with pytest.raises(refusal) as caught:
        pdf_worker._result(pdf_worker._answer(b"%PDF", 10), 1 << 30)
    assert "the reader failed" not in str(caught.value)
