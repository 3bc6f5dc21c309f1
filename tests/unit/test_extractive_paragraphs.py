"""The extractive responder quotes the document's sentences: split within paragraphs, headings
never glued to the sentence after them (docs/architecture.md §11)."""

from __future__ import annotations

from services.llm import extractive
from services.llm.extractive import best_sentences
from tests.unit.test_extractive import answer_to

# The text load_documents_full returns for samples/docs/orion-x-operations-manual.pdf around
# its section 6 (PDFium's lines: a wrapped line keeps its trailing space).
ORION = (
    "Неуспешная проверка считается инцидентом приоритета P2.\n\n6. Плановые работы\n"
    "Плановые работы с возможным влиянием на пользователей \nвыполняются только в окно "
    "обслуживания: по субботам с 01:00 до 05:00."
)


def loaded(text: str, question: str) -> str:
    """The answer to `question` from one load_documents_full result holding `text`."""
    result = {"documents": [{"document_id": "manual", "title": "Manual", "content": text,
                             "pages": 3}]}  # fmt: skip
    return answer_to(question, "load_documents_full", result)


def test_a_numbered_heading_is_not_glued_to_the_next_sentence():
    assert best_sentences(ORION, "Когда проводятся плановые работы?", 1) == [
        "Плановые работы с возможным влиянием на пользователей выполняются только в окно "
        "обслуживания: по субботам с 01:00 до 05:00."
    ]
    answer = loaded(ORION, "Когда проводятся плановые работы?")
    assert answer.startswith(
        "**Кратко:** Плановые работы с возможным влиянием на пользователей выполняются"
    )
    assert "> 6." not in answer and "Плановые работы Плановые" not in answer


def test_an_unnumbered_heading_line_stands_alone():
    text = (
        "The service starts at boot.\n"
        "Network ports\n"
        "The service listens on port 8080 and\nports below 1024 need root.\n"
        "Logging\n"
        "Logs go to the journal."
    )
    assert best_sentences(text, "Which port does the service listen on?", 1) == [
        "The service listens on port 8080 and ports below 1024 need root."
    ]
    assert extractive.quotable_sentences(text) == [
        "The service starts at boot.",
        "The service listens on port 8080 and ports below 1024 need root.",
        "Logs go to the journal.",
    ]


def test_a_markdown_heading_is_not_quoted():
    text = "# Guide\n\n## Ports and the firewall\nThe service listens on port 8080.\n"
    assert best_sentences(text, "What ports does the firewall open?", 1) == [
        "The service listens on port 8080."
    ]
    answer = loaded(text, "Which port does the service listen on?")
    assert answer.startswith("**In short:** The service listens on port 8080.")
    assert "##" not in answer


def test_a_numbered_item_that_is_a_sentence_is_quoted_whole():
    text = (
        "Build the package in three steps.\n"
        "1. Install the build dependencies with apt-get build-dep.\n"
        "2. Run debuild in the source tree.\n"
        "3. Check the result with lintian."
    )
    assert best_sentences(text, "How do I run debuild?", 1) == [
        "2. Run debuild in the source tree."
    ]
    assert extractive.quotable_sentences(text) == [
        "Build the package in three steps.",
        "1. Install the build dependencies with apt-get build-dep.",
        "2. Run debuild in the source tree.",
        "3. Check the result with lintian.",
    ]


def test_a_sentence_broken_by_a_blank_line_stays_whole():
    """A page break inside a sentence (a chunk across two pages): the text after the blank
    line goes on in lower case."""
    text = "Отчёт о разборе публикуется во\n\nвнутренней базе знаний. Разбор идёт 5 дней."
    assert extractive.quotable_sentences(text) == [
        "Отчёт о разборе публикуется во внутренней базе знаний.",
        "Разбор идёт 5 дней.",
    ]


def test_wrapped_lines_before_a_name_are_no_headings():
    # A line ending in a space was wrapped (PDF text); one starting a sentence is no heading
    # unless the sentence before it ended.
    text = (
        "Access is granted through groups of the \nLDAP directory only.\n"
        "Use the admin console and then the\nLDAP page to grant it."
    )
    assert extractive.quotable_sentences(text) == [
        "Access is granted through groups of the LDAP directory only.",
        "Use the admin console and then the LDAP page to grant it.",
    ]


def test_text_of_headings_only_is_still_quoted():
    assert best_sentences("## Ports\n\n## Network ports\n", "network", 1) == ["Network ports"]


def test_sentences_inside_one_line_are_still_split():
    text = "Alpha beta. LDAP settings live here. Gamma. Configure LDAP groups too."
    assert extractive.quotable_sentences(text) == [
        "Alpha beta.", "LDAP settings live here.", "Gamma.", "Configure LDAP groups too."
    ]  # fmt: skip


def test_code_a_colon_introduces_stays_with_its_sentence():
    """A line of code or data is no heading, and the code a colon introduces, even after a
    blank line, stays with the sentence that introduces it (as in core(5))."""
    text = (
        "The lintian command can be customized in the ~/.devscripts file:\n"
        "DEBUILD_LINTIAN_OPTS=”-i -I”\n"
        "6.4 pbuilder package\n"
        "For a clean room build, pbuilder is useful.\n\n"
        "To extract the dump, do this:\n\n$ coredumpctl dump 2955 -o core\n\n"
        "See coredumpctl(1)."
    )
    assert extractive.quotable_sentences(text) == [
        "The lintian command can be customized in the ~/.devscripts file: "
        "DEBUILD_LINTIAN_OPTS=”-i -I”",
        "For a clean room build, pbuilder is useful.",
        "To extract the dump, do this: $ coredumpctl dump 2955 -o core",
        "See coredumpctl(1).",
    ]


def test_a_heading_counts_for_the_sentence_under_it_unquoted():
    """The heading's words say what the first sentence under it is about (fanotify(7):
    "## ВЕРСИИ" above the sentence giving the version), though the quote leaves it out."""
    text = (
        "Fanotify работает только в Linux.\n\n## ВЕРСИИ\n\n"
        "The fanotify API was introduced in Linux 2.6.36."
    )
    question = "В какой версии Linux появился интерфейс fanotify?"
    assert best_sentences(text, question, 1) == ["The fanotify API was introduced in Linux 2.6.36."]
    unheaded = text.replace("## ВЕРСИИ", "")
    assert best_sentences(unheaded, question, 1) == ["Fanotify работает только в Linux."]


def test_numbered_steps_without_periods_are_quoted():
    """Steps a colon introduces are a list, not headings, though no step ends in a period."""
    text = (
        "To set up LDAP integration:\n"
        "1. Open Settings, then Auth\n"
        "2. Choose LDAP and press Add server\n"
        "3. Enter the server address ldap.example.com and port 636"
    )
    assert extractive.quotable_sentences(text) == text.split("\n")
    answer = loaded(text, "How do I set up LDAP integration?")
    assert "> 2. Choose LDAP and press Add server" in answer
    assert "> 3. Enter the server address ldap.example.com and port 636" in answer


def test_russian_numbered_steps_are_quoted():
    text = (
        "Порядок подачи заявления:\n\n"
        "1. Откройте портал сотрудника\n"
        "2. Выберите раздел «Отпуск»\n"
        "3. Подайте заявление за две недели\n"
    )
    assert extractive.quotable_sentences(text) == [
        "Порядок подачи заявления:",
        "1. Откройте портал сотрудника",
        "2. Выберите раздел «Отпуск»",
        "3. Подайте заявление за две недели",
    ]
    answer = loaded(text, "Как подать заявление на отпуск?")
    assert "> 3. Подайте заявление за две недели" in answer


def test_a_numbered_list_without_a_colon_is_quoted():
    """Lines numbered alike next to each other (blank lines aside) are a list's items."""
    for gap in ("\n", "\n\n"):
        text = gap.join(
            [
                "Build the package in three steps.",
                "1. Install the build dependencies",
                "2. Run debuild in the source tree",
                "3. Check the result with lintian",
            ]
        )
        assert extractive.quotable_sentences(text) == text.split(gap)
        assert best_sentences(text, "How do I run debuild?", 1) == [
            "2. Run debuild in the source tree"
        ]


def test_a_short_line_with_a_value_is_body_text():
    text = "The default port is 8080\nChange it in config.yaml before the first start."
    assert extractive.quotable_sentences(text) == [
        "The default port is 8080 Change it in config.yaml before the first start."
    ]
    answer = loaded(text, "Which port does the service listen on?")
    assert answer.startswith("**In short:** The default port is 8080")


def test_chapter_and_page_numbers_still_make_headings():
    """A number ending a chapter's title line or a page header is no value (PDF text)."""
    text = (
        "Debian New Maintainers’ Guide 1 / 57\n"
        "Chapter 1\n"
        "Getting started The Right Way\n"
        "This document tries to describe building of a Debian package."
    )
    assert extractive.quotable_sentences(text) == [
        "This document tries to describe building of a Debian package."
    ]


def test_a_line_a_colon_introduces_is_body_text():
    text = (
        "The service reads two sources:\nConfig files and the environment\n\nNothing else is read."
    )
    assert extractive.quotable_sentences(text) == [
        "The service reads two sources: Config files and the environment",
        "Nothing else is read.",
    ]
