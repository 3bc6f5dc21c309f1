import itertools
from pathlib import Path

import pypdfium2 as pdfium
import pytest

from services.common.tokenizer import count_tokens
from services.docstore.chunking import ChunkingConfig, Paragraph, chunk_paragraphs
from services.docstore.errors import KnowledgeBaseError, ParseError, UnsupportedFormatError
from services.docstore.kb_csv import read_knowledge_base_csv
from services.docstore.parsing import guess_format, parse_document

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
OPS_PDF = SAMPLES / "docs" / "orion-x-operations-manual.pdf"
SPEC_PDF = SAMPLES / "docs" / "shared-mime-info-spec.pdf"
KB_CSV = SAMPLES / "knowledge_base" / "train_data.csv"


def parse(content, fmt, doc_id="d", **kw):
    return parse_document(tenant_id="t", doc_id=doc_id, content=content, fmt=fmt, **kw)


def pdf_page_texts(path):
    pdf = pdfium.PdfDocument(path)
    try:
        return [pdf[i].get_textpage().get_text_range() for i in range(len(pdf))]
    finally:
        pdf.close()


def squash(text):
    return "".join(text.split())


# --- formats ---------------------------------------------------------------------------------


def test_guess_format():
    assert guess_format("a.PDF", "") == "pdf"
    assert guess_format("a.md", "") == "markdown"
    assert guess_format("", "text/plain; charset=utf-8") == "text"
    assert guess_format("kb/train_data.csv", "") == "csv"
    assert guess_format("x", "application/pdf") == "pdf"
    assert guess_format("a.bin", "") == "unknown"


@pytest.mark.parametrize(
    ("file_name", "content_type", "fmt"),
    [
        ("notes.md", "text/plain", "markdown"),  # the suffix decides
        ("notes.txt", "text/markdown", "text"),
        ("scan.pdf", "text/plain", "pdf"),
        ("notes.md", "application/octet-stream", "markdown"),  # what browsers send
        ("notes", "text/markdown; charset=utf-8", "markdown"),  # no suffix: the MIME type
        ("notes", "application/octet-stream", "unknown"),
        ("notes.bin", "text/csv", "csv"),
        ("", "", "text"),
    ],
)
def test_the_suffix_picks_the_parser_and_the_mime_type_only_without_one(
    file_name: str, content_type: str, fmt: str
):
    assert guess_format(file_name, content_type) == fmt


def test_markdown_heading_paths_pages_and_bom():
    md = "# Guide\n\nIntro.\n\n## Setup\n\n### LDAP\n\nUse ldaps.\n\f\nPage two.\n\n## Backup\n\nDaily."
    d = parse(("\ufeff" + md).encode(), "markdown", doc_id="guide")
    assert d.title == "Guide"
    assert [s.title for s in d.sections] == ["Guide", "Setup › LDAP", "Backup"]
    assert [s.section_id for s in d.sections] == [
        "guide:s001-guide",
        "guide:s003-ldap",
        "guide:s004-backup",
    ]
    ldap = d.sections[1]
    assert (ldap.page_start, ldap.page_end, d.pages) == (1, 2, 2)
    assert d.chunks[0].text == "Intro."  # the BOM is gone
    assert d.metadata == {"format": "markdown"}


def test_caller_metadata_does_not_override_the_parsed_format():
    d = parse(b"# T\n\nalpha.", "markdown", metadata={"format": "pdf", "topic": "x"})
    assert d.metadata == {"format": "markdown", "topic": "x"}


def test_markdown_ignores_headings_in_code_fences():
    md = "# A\n\ntext\n\n```\n# not a heading\n```\n\n## B\n\nmore"
    d = parse(md.encode(), "markdown")
    assert [s.title for s in d.sections] == ["A", "B"]
    assert "# not a heading" in d.chunks[0].text


def test_plain_text_numbered_headings_and_form_feeds():
    text = (
        "Service manual\n\n1. Introduction\nThis manual covers setup.\n\n"
        "1. Install the agent first.\n\n"  # a numbered list item, not a heading (sequence)
        "2. Installation\nRun the installer.\n\f2.1 Requirements\nFour cores.\n\n"
        "Глава 3. Обслуживание\nПроверяйте журналы."
    )
    d = parse(text.encode(), "text")
    assert d.title == "Service manual" and d.pages == 2
    assert [s.title for s in d.sections] == [
        "Service manual",
        "1. Introduction",
        "2. Installation",
        "2. Installation › 2.1 Requirements",
        "Глава 3. Обслуживание",
    ]
    req = d.sections[3]
    assert (req.page_start, req.page_end) == (2, 2)
    assert "1. Install the agent first." in d.chunks[1].text


@pytest.mark.parametrize(
    ("content", "fmt", "error"),
    [
        (b"\xff\xfe\x00garbage\xff", "text", ParseError),
        (b"caf\xe9 latin-1", "markdown", ParseError),
        (b"%PDF-1.7\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF", "pdf", ParseError),
        (b"not a pdf at all", "pdf", ParseError),
        (OPS_PDF.read_bytes()[:20_000], "pdf", ParseError),  # truncated
        (b"a,b\n1,2", "csv", UnsupportedFormatError),
        (b"x", "docx", UnsupportedFormatError),
    ],
)
def test_bad_input_is_a_clean_error(content, fmt, error):
    with pytest.raises(error):
        parse(content, fmt)


# --- PDF ---------------------------------------------------------------------------------------


def test_ops_pdf_outline_sections_and_pages():
    d = parse(OPS_PDF.read_bytes(), "pdf", doc_id="ops")
    assert d.title == "Orion X: регламент эксплуатации"
    assert d.pages == 4 and len(d.page_texts) == 4
    titles = [s.title for s in d.sections]
    assert titles[0] == d.title  # the text before the first bookmark
    assert titles[1:4] == [
        "1. Общие положения",
        "1. Общие положения › 1.1. Термины",
        "1. Общие положения › 1.2. Роли и ответственность",
    ]
    assert titles[-1] == "6. Плановые работы › 6.2. Откат изменений"
    assert len(d.sections) == 20  # the intro + 19 bookmarks
    by_title = {s.title.split(" › ")[-1]: s for s in d.sections}
    assert (
        by_title["2.1. Пороговые значения"].page_start,
        by_title["6. Плановые работы"].page_start,
    ) == (2, 4)
    # Each section's text is its own: the heading is not in it, the next heading neither.
    esc = by_title["3.2. Эскалация"]
    body = d.chunks[esc.first_chunk_ord].text
    assert body.startswith("Если инцидент P1 не локализован") and "3.3." not in body
    # Every chunk's text is on the pages it claims (whitespace aside).
    pages = [squash(t) for t in pdf_page_texts(OPS_PDF)]
    for c in d.chunks:
        span = "".join(pages[c.page_start - 1 : c.page_end])
        first, last = squash(c.text)[:20], squash(c.text)[-20:]
        assert first in span and last in span, c.chunk_id
        if c.page_end == c.page_start:
            assert first in pages[c.page_start - 1] and last in pages[c.page_start - 1]
    # Section 3.3 runs over the page break: its chunk says so.
    spanning = [c for c in d.chunks if c.page_end > c.page_start]
    assert spanning and spanning[0].section_id == by_title["3.3. Разбор инцидента"].section_id


def test_third_party_pdf_outline():
    d = parse(SPEC_PDF.read_bytes(), "pdf", doc_id="smi")
    assert d.pages == 17 and d.title == "Shared MIME-info Database"
    titles = [s.title for s in d.sections]
    assert "2. Unified system › 2.4. The glob files" in titles
    globs = d.sections[titles.index("2. Unified system › 2.4. The glob files")]
    assert (globs.page_start, globs.page_end) == (7, 8)
    text = d.chunks[globs.first_chunk_ord].text
    assert text.startswith("The globs2 file is a simple list of lines")
    # The running header (the title atop every page) is dropped: only real mentions are left.
    assert sum(c.text.count("Shared MIME-info Database") for c in d.chunks) <= 3


def test_pdf_without_outline_uses_numbered_headings_or_page_groups(tmp_path):
    pdf = pdfium.PdfDocument(OPS_PDF.read_bytes())  # same pages, outline dropped
    plain = pdfium.PdfDocument.new()
    plain.import_pages(pdf)
    out = tmp_path / "plain.pdf"
    plain.save(out)
    d = parse(out.read_bytes(), "pdf")
    titles = [s.title for s in d.sections]
    assert "3. Обработка инцидентов › 3.2. Эскалация" in titles
    groups = parse(out.read_bytes(), "pdf", config=ChunkingConfig(pdf_pages_per_section=3))
    assert groups.sections[0].title != "pp. 1–3"  # headings win over page groups
    blank = pdfium.PdfDocument.new()
    blank.new_page(200, 200)
    blank.save(tmp_path / "blank.pdf")
    with pytest.raises(ParseError, match="no text layer"):
        parse((tmp_path / "blank.pdf").read_bytes(), "pdf")


# --- chunking ----------------------------------------------------------------------------------


def test_chunks_stay_within_the_token_limit_and_overlap():
    cfg = ChunkingConfig(chunk_tokens=64, overlap_tokens=16)
    d = parse(OPS_PDF.read_bytes(), "pdf", config=cfg)
    assert all(0 < c.tokens <= 64 and c.tokens == count_tokens(c.text) for c in d.chunks)
    assert [c.ord for c in d.chunks] == list(range(len(d.chunks)))
    overlapping = 0
    for a, b in itertools.pairwise(d.chunks):
        if a.section_id == b.section_id:
            head = b.text.split(" ")[:3]
            overlapping += " ".join(head) in a.text
    assert overlapping >= len(d.chunks) // 3
    # No chunk crosses a section: each section's chunks are a contiguous run of its own.
    for s in d.sections:
        own = [c for c in d.chunks if c.section_id == s.section_id]
        assert [c.ord for c in own] == list(range(s.first_chunk_ord, s.last_chunk_ord + 1))


def test_long_sentences_and_giant_words_are_cut():
    cfg = ChunkingConfig(chunk_tokens=16, overlap_tokens=0)
    words = " ".join(f"word{i}" for i in range(60))
    out = chunk_paragraphs([Paragraph(words, 1), Paragraph("x" * 400, 2)], cfg)
    assert all(c.tokens <= 16 for c in out)
    assert " ".join(c.text for c in out[:-1]).startswith(words[:50])
    assert out[-1].page_start == 2 and set("".join(c.text for c in out if c.page_start == 2)) == {
        "x"
    }


def test_overlap_repeats_the_previous_sentences():
    sentences = [f"Sentence number {i} is here." for i in range(20)]
    cfg = ChunkingConfig(chunk_tokens=40, overlap_tokens=12)
    out = chunk_paragraphs([Paragraph(" ".join(sentences), 3)], cfg)
    assert len(out) > 2
    for a, b in itertools.pairwise(out):
        assert b.text.split(". ")[0] + "." in a.text  # b starts with a's last sentence
    flat = ChunkingConfig(chunk_tokens=40, overlap_tokens=0)
    no_overlap = chunk_paragraphs([Paragraph(" ".join(sentences), 3)], flat)
    assert " ".join(c.text for c in no_overlap) == " ".join(sentences)


def test_chunks_keep_every_character_of_the_text_quotes_and_brackets_included():
    text = 'He said "Stop." Then 3 went. (See the list.) [Or this!] Say «Да!» Потом. End.'
    for size in (8, 16, 400):
        out = chunk_paragraphs(
            [Paragraph(text, 1)], ChunkingConfig(chunk_tokens=size, overlap_tokens=0)
        )
        assert " ".join(c.text for c in out) == text


def test_config_is_validated():
    with pytest.raises(ValueError, match="overlap_tokens"):
        ChunkingConfig(chunk_tokens=32, overlap_tokens=20)
    with pytest.raises(ValueError, match="chunk_tokens"):
        ChunkingConfig(chunk_tokens=2)


# --- ids and generations -----------------------------------------------------------------------


def test_ids_and_generation_are_deterministic():
    content = OPS_PDF.read_bytes()
    a, b = parse(content, "pdf", doc_id="ops"), parse(content, "pdf", doc_id="ops")
    assert a == b and a.generation == b.generation and len(a.generation) == 16
    assert a.chunks[0].chunk_id == "ops:c00000"
    assert a.sections[2].section_id == "ops:s002-1-1-термины"
    assert all(c.doc_id == "ops" for c in a.chunks)


def test_generation_changes_with_content_options_and_config_only():
    md = b"# T\n\nalpha beta."
    base = parse(md, "markdown").generation
    assert parse(md, "markdown", metadata={}).generation == base
    assert parse(md.decode(), "markdown").generation == base  # str and bytes alike
    changed = [
        parse(b"# T\n\nalpha gamma.", "markdown"),
        parse(md, "text"),
        parse(md, "markdown", title="Other"),
        parse(md, "markdown", tags=("x",)),
        parse(md, "markdown", metadata={"topic": "y"}),
        parse(md, "markdown", config=ChunkingConfig(chunk_tokens=128)),
    ]
    gens = {d.generation for d in changed}
    assert base not in gens and len(gens) == len(changed)


# --- summaries ---------------------------------------------------------------------------------


class UpperSummarizer:
    name = "upper-test"

    def summarize(self, title, text, max_chars):
        return (title + ": " + text).upper()[:max_chars]


def test_summaries_are_extractive_and_replaceable():
    d = parse(OPS_PDF.read_bytes(), "pdf")
    esc = next(s for s in d.sections if s.title.endswith("3.2. Эскалация"))
    assert esc.summary.startswith("Если инцидент P1 не локализован за 1 час")
    assert 0 < len(esc.summary) <= 400
    injected = parse(OPS_PDF.read_bytes(), "pdf", summarizer=UpperSummarizer())
    assert injected.sections[1].summary.startswith("1. ОБЩИЕ ПОЛОЖЕНИЯ: РЕГЛАМЕНТ")
    assert injected.generation != d.generation


# --- knowledge-base CSV ------------------------------------------------------------------------


def test_knowledge_base_csv_sample():
    docs = read_knowledge_base_csv(KB_CSV.read_bytes(), "kb").strict()
    assert [d.doc_id for d in docs] == [
        "kb-vat-rate-2025",
        "kb-usn-vat-2025",
        "kb-key-rate",
        "kb-business-trip-per-diem",
        "kb-eu-vat-reverse-charge",
    ]
    vat = docs[0]
    assert vat.source == "knowledge_base" and vat.tenant_id == "kb"
    assert vat.title == "Ставки НДС в 2025 году" and vat.tags == (
        "НДС",
        "налоги",
        "topic:tax",
        "jurisdiction:ru",
    )
    assert {k: vat.metadata[k] for k in ("topic", "jurisdiction", "updated_at")} == {
        "topic": "tax",
        "jurisdiction": "RU",
        "updated_at": "2025-01-15",
    }
    assert [s.title for s in vat.sections] == ["Ставки НДС", "Нулевая ставка"]
    assert docs[3].metadata["updated_at"] == "2025-03-03"  # DD.MM.YYYY normalised
    assert docs == read_knowledge_base_csv(KB_CSV.read_bytes(), "kb").strict()


def test_knowledge_base_csv_missing_columns_are_named():
    with pytest.raises(KnowledgeBaseError) as err:
        read_knowledge_base_csv(b"title;text;topic\nA;b;c\n", "kb").strict()
    assert err.value.missing_columns == ("content", "jurisdiction", "updated_at")
    assert "content, jurisdiction, updated_at" in str(err.value)


def test_knowledge_base_csv_bad_rows_are_reported_by_line():
    csv_text = (
        "\ufefftitle,content,topic,jurisdiction,updated_at\n"
        'Good,"two\nlines",tax,RU,2025-01-01\n'  # lines 2-3
        "No date,text,tax,RU,yesterday\n"  # line 4
        ",text,tax,RU,2025-01-01\n"  # line 5: empty title
        "Good,again,tax,RU,2025-01-02\n"  # line 6: same doc_id as line 2
        "Short,row\n"  # line 7
    )
    parsed = read_knowledge_base_csv(csv_text.encode(), "kb")
    assert [d.doc_id for d in parsed.documents] == ["kb-good"]
    assert [p.line for p in parsed.problems] == [4, 5, 6, 7]
    assert "yesterday" in parsed.problems[0].message
    assert "title" in parsed.problems[1].message
    assert "line 2" in parsed.problems[2].message
    with pytest.raises(KnowledgeBaseError, match="line 4") as err:
        read_knowledge_base_csv(csv_text.encode(), "kb").strict()
    assert len(err.value.problems) == 4


def test_numbered_headings_faq_style_and_cross_references_in_text():
    text = (
        "1. Общие вопросы\n\nТекст.\n\n"
        "1.1. Что такое пакет и зачем он нужен, если можно собрать программу самому?\n\nОтвет.\n\n"
        "1.2. aptitude\n\nКоманда.\n\n"
        "Глава 13, Помощь проекту Debian.\n\nЭто ссылка из текста, не заголовок.\n\n"
        "1.3. Что такое виртуальный пакет?\n\nОтвет.\n"
    )
    doc = parse_document(tenant_id="t", doc_id="faq", content=text.encode(), fmt="text")
    titles = [s.title.split(" › ")[-1] for s in doc.sections]
    assert "1.1. Что такое пакет и зачем он нужен, если можно собрать программу самому?" in titles
    assert "1.2. aptitude" in titles
    assert "1.3. Что такое виртуальный пакет?" in titles
    assert not any(t.startswith("Глава 13") for t in titles)
    # A bare number with a lowercase word is a list item, not a heading.
    doc = parse_document(
        tenant_id="t", doc_id="l", content=b"1. Intro\n\ntext\n\n2 apples\n\nmore", fmt="text"
    )
    assert [s.title for s in doc.sections][-1].endswith("1. Intro")
