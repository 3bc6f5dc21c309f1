"""Query processing: normalisation, language detection, synonym tables and expansion."""

import itertools
import json
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.search_contract import _without_controls, normalise_query, normalised_view
from services.common.wording import fold_yo
from services.retrieval.query import (
    SynonymTable,
    detect_language,
    expand_query,
    keyword_form,
    load_synonyms,
)


def test_normalise_nfkc_controls_and_whitespace():
    raw = "  ＬＤＡＰ\u00a0на\u00adстройка\t\nи\u200bвход\x07 \ufeffok  "
    # full-width -> ASCII, NBSP -> space, soft hyphen removed, tab/newline and zero-width
    # space -> one space, BEL and BOM removed, ends trimmed.
    assert normalise_query(raw) == "LDAP настройка и вход ok"


# Whitespace of every kind, controls, format characters, private use, unassigned, and letters.
_AWKWARD = "a б1\t\n\r\x00\x07\x1c\x85\u00a0\u00ad\u1680\u180e\u200b\u200d\u2028\u2060\u3000\ufeff\ue000\U000f0000\u0378\ufb01"


@given(st.one_of(st.text(), st.text(st.sampled_from(_AWKWARD))))
def test_normalise_takes_its_short_way_only_where_the_text_has_nothing_to_remove(text):
    expected = " ".join(_without_controls(unicodedata.normalize("NFKC", text)).split())
    assert normalise_query(text) == expected


# Letters that decompose or combine (Cyrillic, Latin, Hangul jamo, half-width kana, Oriya
# vowel signs), ligatures, full-width forms, controls and format characters.
_COMPOSING = (
    "aeиеEÉй\u0301\u0306\u0308\u0327\u1100\u1161\u11a8\uff76\uff9e\u0b47\u0b3e\u0f73"
    " \t\u00ad\u200b\u200d\ufb01\uff21\u2460\u00bd\x07"
)


@given(st.one_of(st.text(), st.text(st.sampled_from(_COMPOSING))))
def test_the_view_of_a_stored_text_is_the_queries_normal_form(text):
    view, starts = normalised_view(text)
    assert " ".join(view.split()) == normalise_query(text)
    if starts is None:
        assert view == text
        return
    assert len(starts) == len(view)
    assert starts == sorted(starts)
    # The characters that start at one place are that stretch of the text, normalised.
    bounds = [*sorted(set(starts)), len(text)]
    for begin, end in itertools.pairwise(bounds):
        got = "".join(ch for ch, s in zip(view, starts, strict=True) if s == begin)
        expected = _without_controls(unicodedata.normalize("NFKC", text[begin:end]))
        assert " ".join(got.split()) == " ".join(expected.split())


def test_normalise_keeps_case_and_yo_unless_asked():
    assert normalise_query("Ёлка LDAP") == "Ёлка LDAP"
    assert normalise_query("Ёлка LDAP", lowercase=True, fold=True) == "елка ldap"
    assert keyword_form(" Учётная  ЗАПИСЬ ") == "учетная запись"
    assert fold_yo("ёЁ") == "еЕ"


def test_normalise_of_only_junk_is_empty():
    assert normalise_query("\x00\u200d \u200e\t") == ""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Как настроить LDAP интеграцию в Orion X?", "ru"),  # 70 % Cyrillic
        ("How do I configure LDAP?", "en"),
        ("vacation policy отпуск", "mixed"),
        ("как получить компенсацию vacation", "ru"),  # 22 Cyrillic of 30 letters
        ("Wie konfiguriere ich den Drucker?", "en"),  # Latin script: treated as en
        ("休暇の申請方法", "other"),
        ("12345 ?!", "other"),
        ("", "other"),
    ],
)
def test_detect_language_by_script_share(text, expected):
    assert detect_language(text) == expected


def test_detect_language_boundaries():
    # 6 Cyrillic : 4 Latin = 60 % -> ru; 5 : 5 -> mixed; 1 : 9 -> en; 2 : 8 -> mixed.
    assert detect_language("абвгде abcd") == "ru"
    assert detect_language("абвгд abcde") == "mixed"
    assert detect_language("а abcdefghi") == "en"
    assert detect_language("аб abcdefgh") == "mixed"


def test_language_hint_wins():
    assert detect_language("How do I configure LDAP?", "ru") == "ru"
    assert detect_language("Как дела", "en-US") == "en"
    assert detect_language("Как дела", "DE") == "de"
    assert detect_language("Как дела", "auto") == "ru"
    assert detect_language("Как дела", "") == "ru"


def test_builtin_table_matches_inflected_and_folded_forms():
    table = SynonymTable.builtin()
    assert "контракт" in table.synonyms("договора")
    assert "contract" in table.synonyms("договоров")
    assert "отпуск" in table.synonyms("vacations")
    spans = table.matches("сброс пароля учетной записи")
    assert [("сброс пароля учетной записи"[s:e]) for s, e, _ in spans] == [
        "пароля",
        "учетной записи",
    ]


def test_expand_original_first_round_robin_and_language_order():
    table = SynonymTable.from_groups(
        [["договор", "contract", "контракт"], ["аренда", "lease", "наём"]]
    )
    variants = expand_query("условия договора аренды", "ru", table, 5)
    assert variants == [
        "условия договора аренды",
        "условия контракт аренды",
        "условия договора наём",
        "условия contract аренды",
        "условия договора lease",
    ]
    en_first = expand_query("условия договора аренды", "en", table, 2)
    assert en_first == ["условия договора аренды", "условия contract аренды"]


def test_expand_limits_and_no_match():
    table = SynonymTable.builtin()
    assert expand_query("погода в Москве", "ru", table, 5) == ["погода в Москве"]
    assert expand_query("договор", "ru", table, 1) == ["договор"]
    assert expand_query("договор", "ru", table, 0) == ["договор"]
    assert len(expand_query("договор", "ru", table, 3)) == 3


def test_expand_prefers_longest_phrase_and_skips_synonyms_already_present():
    table = SynonymTable.builtin()
    variants = expand_query("sick leave policy", "en", table, 5)
    assert variants == ["sick leave policy", "больничный policy"]
    # "пользователь" and "учётная запись" are one group: no "пользователь пользователя".
    variants = expand_query("учетная запись пользователя", "ru", table, 10)
    assert all("пользователь пользователя" not in v for v in variants)
    assert len(variants) == len({keyword_form(v) for v in variants})


def test_load_json_list_dict_and_text(tmp_path):
    as_list = tmp_path / "a.json"
    as_list.write_text(json.dumps([["ВПН", "vpn", "туннель"]]), encoding="utf-8")
    as_dict = tmp_path / "b.json"
    as_dict.write_text(json.dumps({"впн": ["vpn"]}), encoding="utf-8")
    wrapped = tmp_path / "c.json"
    wrapped.write_text(json.dumps({"groups": [["впн", "vpn"]]}), encoding="utf-8")
    text = tmp_path / "d.txt"
    text.write_text("# comment\nвпн, vpn | туннель\n\nодин\nsolo;\n", encoding="utf-8")
    for path in (as_list, as_dict, wrapped, text):
        table = SynonymTable.load(path)
        assert "vpn" in table.synonyms("впн"), path
    # one-term lines are not groups
    assert SynonymTable.load(text).groups == (("впн", "vpn", "туннель"),)
    assert load_synonyms(None) == SynonymTable.builtin()
    assert load_synonyms(str(text)).groups == (("впн", "vpn", "туннель"),)


def test_load_rejects_bad_json(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"groups": [1, 2]}', encoding="utf-8")
    with pytest.raises(ValueError):
        SynonymTable.load(bad)
    broken = tmp_path / "broken.json"
    broken.write_text("[[", encoding="utf-8")
    with pytest.raises(ValueError):
        SynonymTable.load(broken)
