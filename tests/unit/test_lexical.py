"""services.common.lexical: the one stemming rule and BM25 that rank text outside the index."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.lexical import (
    _RU_ENDINGS,
    Bm25,
    bm25_scores,
    first_match,
    search_terms,
    sentences,
    split_sentences,
    stem,
)


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        ("договора", "договор"),
        ("договоров", "договор"),
        ("Договор", "договор"),
        ("настройки", "настройк"),
        ("настройка", "настройк"),
        ("настроение", "настроен"),  # not the same stem as "настройка"
        ("ёлками", "елк"),  # ё folded, the longest ending first
        ("мы", "мы"),  # a Russian ending is cut only where three letters stay
        ("дома", "дом"),  # ... and three do
        ("policies", "policy"),
        ("Files", "file"),
        ("class", "class"),
        ("gas", "gas"),  # three letters: no plural cut
        ("8080", "8080"),
    ],
)
def test_stem(word, expected):
    assert stem(word) == expected


@given(st.text(st.sampled_from("абвгдежзийклмнопрстуфхцчшщъыьэюя"), max_size=9))
def test_stem_cuts_the_longest_russian_ending_that_leaves_three_letters(word):
    cut = [e for e in _RU_ENDINGS if word.endswith(e) and len(word) - len(e) >= 3]
    assert stem(word) == (word[: -max(map(len, cut))] if cut else word)


def test_search_terms_keep_subject_words_and_numbers_in_order():
    assert search_terms("How do I rotate the LOGS on port 8080, v2?") == [
        "rotate", "log", "port", "8080", "v2"
    ]  # fmt: skip
    assert search_terms("Сколько дней отпуска в 2025 году?") == ["дне", "отпуск", "2025", "год"]
    assert search_terms("a 5 b") == ["5"]  # one letter: no; one digit: yes
    assert search_terms("what is it? ...") == []  # stop words only


def test_first_match_finds_whole_words_by_stem():
    text = "Reconfigure nothing. The policy covers files."
    assert first_match(text, ["policy"]) == text.index("policy")
    assert first_match(text, search_terms("policies")) == text.index("policy")
    assert first_match(text, ["file", "policy"]) == text.index("policy")  # the first in the text
    assert first_match(text, ["configure"]) == -1  # not inside a longer word
    assert first_match(text, []) == -1


def test_first_match_passes_over_stop_words():
    # "какую" stems to "как", which is also a stop word: the match is "какую", not "Как".
    text = "Как правило, какую команду выполнить?"
    assert first_match(text, search_terms("какую команду")) == text.index("какую")
    assert first_match("It is which", search_terms("which it is")) == -1


@pytest.mark.parametrize(
    "stored",
    [
        "Con\ufb01guration",  # the "fi" ligature of a PDF
        "con\u00adfigu\u00adration",  # soft hyphens
        "config\u200duration",  # a zero-width joiner
        "ｃｏｎｆｉｇｕｒａｔｉｏｎ",  # full-width letters
    ],
)
def test_stored_words_are_read_in_the_queries_normal_form(stored):
    text = f"See the {stored} of LDAP."
    assert search_terms(text) == search_terms("See the configuration of LDAP.")
    # The offset points into the stored text, at the word as it is stored there.
    assert first_match(text, search_terms("configuration")) == text.index(stored)
    assert first_match(text, ["ldap"]) == text.index("LDAP")


def test_a_decomposed_letter_is_one_letter_and_offsets_stay_in_the_text():
    # и + combining breve is "й" (PDFs often store it so); the words after it keep their place.
    text = "Настро\u0438\u0306ка сервера ＬＤＡＰ"
    assert search_terms(text) == search_terms("Настройка сервера LDAP")
    assert first_match(text, search_terms("настройки")) == 0
    assert first_match(text, search_terms("серверов")) == text.index("сервера")
    assert first_match(text, ["ldap"]) == text.index("ＬＤＡＰ")


def test_bm25_prefers_rare_terms_and_repeated_terms():
    docs = [["common", "rare"], ["common", "common"], ["common", "other"]]
    s = bm25_scores(["rare", "common"], docs)
    assert s[0] > s[1] > s[2] > 0
    assert bm25_scores(["x"], []) == []
    assert bm25_scores([], [["a"]]) == [0.0]


def test_bm25_weighs_words_over_its_pool_not_the_scored_list():
    pool = [["product", "port"], ["product", "install"], ["product", "remove"]]
    score = Bm25(["product", "port"], pool)
    assert score(["port"]) > score(["product"]) > 0  # "product" is in every list of the pool
    assert score(["port", "port"]) > score(["port"])  # repeated, but saturating
    assert score(["port", "port"]) < 2 * score(["port"])
    assert score(["nothing"]) == 0
    assert Bm25(["port", "port"], pool)(["port"]) == Bm25(["port"], pool)(["port"])  # once


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("One. Two! Three? Four… Five", ["One.", "Two!", "Three?", "Four…", "Five"]),
        ("Use e.g. the flag. Then v1.2 works.", ["Use e.g. the flag.", "Then v1.2 works."]),
        ("То есть т. е. так. «Новое» предложение.", ["То есть т. е. так.", "«Новое» предложение."]),
        ('He said "Stop." Then 3 went.', ['He said "Stop."', "Then 3 went."]),  # quote kept
        ("(See the list.) [Or this!] Next.", ["(See the list.)", "[Or this!]", "Next."]),
        ("Say «Да!» Потом.", ["Say «Да!»", "Потом."]),
        ("  spaced\n  out.  ", ["spaced out."]),
        ("", []),
    ],
)
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


def test_sentences_end_at_a_blank_line_too():
    text = "## Port\n\nThe service listens\non port 8080. Use e.g. port 8081 too.\n\n\nLast line"
    assert sentences(text) == [
        "## Port", "The service listens on port 8080.", "Use e.g. port 8081 too.", "Last line"
    ]  # fmt: skip
