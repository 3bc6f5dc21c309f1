"""The days and periods a rate question names (agent.md §5.3, §7.1): how the rules read them,
what a day without a year means, which dates are asked back, and the model's date."""

import json
from datetime import date

import pytest

from services.orchestrator.scenarios import (
    Decision,
    extract_date,
    extract_period,
    parse_model_decision,
    rule_decision,
)

TODAY = date(2026, 11, 28)  # a Saturday


def decide(query: str) -> Decision:
    return rule_decision(query, today=TODAY)


# -- a day without a year: the latest such day up to tomorrow --------------------------------


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("курс доллара на 31 декабря", "2025-12-31"),
        ("USD rate on Dec 15", "2025-12-15"),
        ("курс евро на 15.01", "2026-01-15"),
        ("курс евро на 15.01.", "2026-01-15"),
        ("курс доллара на 28 ноября", "2026-11-28"),  # today
        ("курс доллара на 29 ноября", "2026-11-29"),  # tomorrow: the bank has it
        ("курс доллара на 30 ноября", "2025-11-30"),  # after tomorrow: last year's
        ("курс доллара на 29.11", "2026-11-29"),
        ("курс доллара на 30.11", "2025-11-30"),
        ("курс евро на 29 февраля", "2024-02-29"),  # the last leap year's
        ("курс евро на 29.02", "2024-02-29"),
    ],
)
def test_a_day_without_a_year_is_the_latest_one_the_bank_can_have(query, expected):
    assert extract_date(query, today=TODAY) == expected
    assert decide(query).date == expected


def test_a_day_without_a_year_on_new_years_eve():
    assert extract_date("курс на 1 января", today=date(2026, 12, 31)) == "2027-01-01"
    assert extract_date("курс на 2 января", today=date(2026, 12, 31)) == "2026-01-02"


@pytest.mark.parametrize(
    "query",
    ["курс евро 95.50", "курс доллара 90.13", "ключевая ставка 21.00", "курс евро 1.5"],
)
def test_a_decimal_is_not_a_day(query):
    d = decide(query)
    assert (d.date, d.date_from, d.intent != "clarify") == ("", "", True)


# -- slashes: day first in Russian, month first in English -----------------------------------


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("USD rate on 01/15/2026", "2026-01-15"),
        ("USD rate on 01/02/2026", "2026-01-02"),
        ("курс доллара на 01/02/2026", "2026-02-01"),
        ("курс доллара на 15/01/2026", "2026-01-15"),
        ("USD rate on 13/01/2026", "2026-01-13"),  # only day-first is possible
    ],
)
def test_slash_dates(query, expected):
    assert decide(query).date == expected


# -- a date that names no day is asked back --------------------------------------------------


@pytest.mark.parametrize(
    ("query", "written"),
    [
        ("курс доллара на 29.02.2025", "29.02.2025"),
        ("курс евро на 30.02", "30.02"),
        ("курс евро на 31 июня", "31 июня"),
        ("курс евро на 32 января 2025", "32 января 2025"),
        ("Ключевая ставка на 31.04.2025", "31.04.2025"),
        ("курс доллара на 2025-02-30", "2025-02-30"),
        ("курс доллара на 01.02.2025 и 30.02.2025", "30.02.2025"),  # any of them
    ],
)
def test_a_date_with_no_such_day_is_asked_back_in_russian(query, written):
    d = decide(query)
    assert (d.scenario, d.intent, d.date) == ("S5", "clarify", "")
    assert f"«{written}»" in d.clarifications[0]
    assert extract_date(query, today=TODAY) == ""


@pytest.mark.parametrize(
    ("query", "written"),
    [("USD rate on 13/14/2026", "13/14/2026"), ("USD rate on 02/30/2026", "02/30/2026")],
)
def test_a_date_with_no_such_day_is_asked_back_in_english(query, written):
    d = decide(query)
    assert (d.scenario, d.intent, d.language) == ("S5", "clarify", "en")
    assert f"“{written}”" in d.clarifications[0]


def test_a_leap_day_is_a_day():
    assert decide("курс доллара на 29.02.2024").date == "2024-02-29"


def test_an_impossible_date_outside_a_rate_question_is_searched():
    d = decide("Найди договор от 31.02.2024")
    assert (d.scenario, d.intent) == ("S1", "documents")


# -- periods ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "first", "last"),
    [
        ("курс доллара с 1 марта по 1 апреля 2024", "2024-03-01", "2024-04-01"),
        ("USD rate from March 1 to March 10, 2024", "2024-03-01", "2024-03-10"),
        ("курс доллара с 1 по 10 марта 2024", "2024-03-01", "2024-03-10"),
        ("курс доллара с 1-го по 10-е марта 2024", "2024-03-01", "2024-03-10"),
        ("курс доллара 1–10 марта 2024", "2024-03-01", "2024-03-10"),
        ("USD rate March 1-10, 2024", "2024-03-01", "2024-03-10"),
        ("USD rate from March 1 to 10, 2024", "2024-03-01", "2024-03-10"),
        ("USD rate between 2024-03-01 and 2024-03-10", "2024-03-01", "2024-03-10"),
        ("курс доллара с 01.03.2024 по 10.03.2024", "2024-03-01", "2024-03-10"),
        ("курс доллара с 1 марта 2024 по 10 марта", "2024-03-01", "2024-03-10"),
        # without a year: the end is the latest such day, the start before it
        ("курс доллара с 1 по 10 марта", "2026-03-01", "2026-03-10"),
        ("курс доллара с 1 декабря по 15 января", "2025-12-01", "2026-01-15"),
        ("курс доллара с 1 по 29 ноября", "2026-11-01", "2026-11-29"),
        # a whole year; the current one up to today
        ("курс доллара в 2023 году", "2023-01-01", "2023-12-31"),
        ("USD rate in 2023", "2023-01-01", "2023-12-31"),
        ("курс евро за 2026 год", "2026-01-01", "2026-11-28"),
        ("Ключевая ставка в 2023 году", "2023-01-01", "2023-12-31"),
    ],
)
def test_a_period_is_planned_as_date_from_and_date_to(query, first, last):
    d = decide(query)
    assert d.intent in ("currency_rates", "key_rate")
    assert (d.date, d.date_from, d.date_to) == ("", first, last)
    assert extract_period(query, today=TODAY) == (first, last)
    assert extract_date(query, today=TODAY) == ""


@pytest.mark.parametrize(
    ("query", "written"),
    [
        ("курс доллара с 10 по 1 марта 2024", "с 10 по 1 марта 2024"),
        ("курс доллара с 10.03.2024 по 01.03.2024", "с 10.03.2024 по 01.03.2024"),
        ("USD rate from 2024-03-10 to 2024-03-01", "from 2024-03-10 to 2024-03-01"),
    ],
)
def test_a_period_that_ends_before_it_starts_is_asked_back(query, written):
    d = decide(query)
    assert (d.scenario, d.intent, d.date_from) == ("S5", "clarify", "")
    assert written in d.clarifications[0]
    assert "раньше" in d.clarifications[0] or "before" in d.clarifications[0]


def test_a_period_with_an_impossible_end_is_asked_back():
    d = decide("курс доллара с 30 февраля по 5 марта 2025")
    assert (d.intent, d.date_from) == ("clarify", "")
    assert "«с 30 февраля по 5 марта 2025»" in d.clarifications[0]


@pytest.mark.parametrize(
    ("query", "day"),
    [
        ("курс доллара на 01.03.2024 - 15 руб", "2024-03-01"),  # a dash, then an amount
        ("курс доллара на 1 марта 2024 и 10 марта 2024", "2024-03-01"),  # two days
        ("курс доллара с 1 по 10", ""),  # no month: no period
    ],
)
def test_what_is_not_a_period(query, day):
    d = decide(query)
    assert (d.date, d.date_from, d.date_to) == (day, "", "")


@pytest.mark.parametrize(
    ("query", "first", "last"),
    [
        ("курс доллара 2023", "2023-01-01", "2023-12-31"),  # ending the question
        ("USD rate 2025?", "2025-01-01", "2025-12-31"),
        ("курс доллара 2023 год", "2023-01-01", "2023-12-31"),
        ("курс доллара 2024 г. по месяцам", "2024-01-01", "2024-12-31"),
        ("курс евро 2026", "2026-01-01", "2026-11-28"),  # up to today
        ("курс доллара 2025-2025", "2025-01-01", "2025-12-31"),
    ],
)
def test_a_year_with_its_word_or_ending_the_question_is_a_period(query, first, last):
    d = decide(query)
    assert (d.intent, d.date, d.date_from, d.date_to) == ("currency_rates", "", first, last)


@pytest.mark.parametrize(
    ("query", "written"),
    [
        ("курс доллара 2023–2024", "2023–2024"),
        ("курс доллара за 2023-2024 годы", "2023-2024 годы"),
        ("курс доллара с 2023 по 2024", "с 2023 по 2024"),
        ("USD rate from 2022 to 2024", "from 2022 to 2024"),
    ],
)
def test_years_from_one_to_another_are_asked_back_past_one_call_s_range(query, written):
    d = decide(query)
    assert (d.intent, d.date_from) == ("clarify", "")
    assert written in d.clarifications[0] and "366" in d.clarifications[0]


def test_years_that_end_before_they_start_are_asked_back():
    d = decide("курс доллара с 2024 по 2023")
    assert d.intent == "clarify" and "«с 2024 по 2023»" in d.clarifications[0]


@pytest.mark.parametrize(
    ("query", "code"),
    [("2000 долларов в рублях", "USD"), ("сколько рублей 1999-2010 евро?", "EUR"),
     ("курс доллара 2023 и евро", "USD")],
)  # fmt: skip
def test_a_number_like_a_year_is_no_period_without_its_word_or_the_end(query, code):
    d = decide(query)
    assert (d.intent, d.currency, d.date, d.date_from) == ("currency_rates", code, "", "")


def test_a_version_ending_a_question_is_no_day_outside_a_rate_question():
    """«Orion 2.10» names a version: after a rate question it is a documents question of its
    own, not the rate on 2 October."""
    earlier = [("user", "курс доллара на вчера"), ("assistant", "…")]
    for query in ("Orion 2.10", "Что нового в Orion X 2.10?"):
        d = rule_decision(query, history=earlier, today=TODAY)
        assert (d.scenario, d.intent) == ("S1", "documents"), query


def test_a_bare_year_still_to_come_is_not_read():
    d = decide("курс доллара 2030")
    assert (d.intent, d.date_from, d.date_to) == ("currency_rates", "", "")


@pytest.mark.parametrize(
    ("query", "day"),
    [("курс доллара 15.01", "2026-01-15"), ("евро 28.11?", "2026-11-28"),
     ("курс юаня 01.03.", "2026-03-01")],
)  # fmt: skip
def test_dd_mm_ending_the_question_is_a_day(query, day):
    d = decide(query)
    assert (d.intent, d.date) == ("currency_rates", day)


@pytest.mark.parametrize(
    ("query", "first", "last"),
    [
        ("курс доллара в марте 2024", "2024-03-01", "2024-03-31"),
        ("USD rate in February 2024", "2024-02-01", "2024-02-29"),
        ("курс евро за февраль", "2026-02-01", "2026-02-28"),  # the latest February
        ("курс доллара в декабре", "2025-12-01", "2025-12-31"),  # this one has not begun
        ("курс евро в ноябре", "2026-11-01", "2026-11-28"),  # the current month: up to today
        ("курс доллара в мае", "2026-05-01", "2026-05-31"),  # «мае», the month's own case
        ("ключевая ставка в январе 2025 года", "2025-01-01", "2025-01-31"),
    ],
)
def test_a_named_month_is_a_period(query, first, last):
    d = decide(query)
    assert (d.date, d.date_from, d.date_to) == ("", first, last)


@pytest.mark.parametrize(
    ("query", "first"),
    [
        ("динамика курса доллара за неделю", "2026-11-21"),
        ("курс доллара за последние 10 дней", "2026-11-18"),
        ("курс евро за последний месяц", "2026-10-29"),
        ("USD rate over the past 3 months", "2026-08-30"),
        ("key rate for the last year", "2025-11-28"),
        ("ключевая ставка за 366 дней", "2025-11-27"),  # CBR_MAX_RANGE_DAYS: at the limit
    ],
)
def test_the_days_up_to_today_are_a_period(query, first):
    d = decide(query)
    assert (d.date, d.date_from, d.date_to) == ("", first, "2026-11-28")


@pytest.mark.parametrize(
    ("query", "written"),
    [("ключевая ставка за 367 дней", "за 367 дней"), ("курс доллара за 2 года", "за 2 года")],
)
def test_days_up_to_today_past_one_call_s_range_are_asked_back(query, written):
    d = decide(query)
    assert d.intent == "clarify" and written in d.clarifications[0]
    assert "366" in d.clarifications[0]


# -- the model's date ------------------------------------------------------------------------


def model(date_: str = "", intent: str = "currency_rates", currency: str = "USD") -> str:
    return json.dumps(
        {"scenario": "S2", "intent": intent, "clarifications": [], "currency": currency,
         "date": date_, "news_query": ""}
    )  # fmt: skip


def parse(text: str, query: str) -> Decision | None:
    return parse_model_decision(text, query=query, today=TODAY)


@pytest.mark.parametrize(
    ("model_date", "expected"),
    [
        ("2025-12-31", "2025-12-31"),  # the model's year, right
        ("2024-12-31", "2024-12-31"),  # the model's year: it sees the conversation
        ("", "2025-12-31"),
        ("2026-12-31", "2025-12-31"),  # after tomorrow: the bank has none, the rules' year
        ("2025-12-30", "2025-12-31"),  # another day than the query's: the query's
    ],
)
def test_the_models_year_for_a_day_the_query_writes_without_one(model_date, expected):
    d = parse(model(model_date), "курс доллара на 31 декабря")
    assert d is not None and d.date == expected


def test_the_models_date_for_tomorrow_is_kept():
    d = parse(model("2026-11-29"), "курс доллара на 29 ноября")
    assert d is not None and d.date == "2026-11-29"


def test_a_day_the_query_writes_with_its_year_wins():
    d = parse(model("2023-01-15"), "курс доллара на 15.01.2024")
    assert d is not None and d.date == "2024-01-15"


def test_a_period_the_query_writes_wins_over_the_models_day():
    d = parse(model("2024-03-01"), "курс доллара с 1 по 10 марта 2024")
    assert d is not None
    assert (d.date, d.date_from, d.date_to) == ("", "2024-03-01", "2024-03-10")


def test_an_impossible_date_needs_the_models_date():
    assert parse(model(""), "курс доллара на 29.02.2025") is None
    assert parse(model("", intent="key_rate", currency=""), "ставка на 31.04.2025") is None
    d = parse(model("2025-02-28"), "курс доллара на 29.02.2025")
    assert d is not None and d.date == "2025-02-28"


def test_an_unknown_country_needs_the_models_currency():
    assert parse(model(currency=""), "курс ямайского доллара") is None
    d = parse(model(currency="JMD"), "курс ямайского доллара")
    assert d is not None and (d.intent, d.currency) == ("currency_rates", "JMD")


def test_an_impossible_date_in_a_document_question_is_the_models_to_route():
    d = parse(json.dumps({"scenario": "S1", "intent": "documents"}), "Найди договор от 31.02.2024")
    assert d is not None and d.intent == "documents"


@pytest.mark.parametrize(
    "query",
    [
        "Какая выручка была в марте 2024?",
        "What were the sales in March 2024?",
        "What was the revenue last year?",
        "Продажи за неделю",
        "Сколько заказов за последние 7 дней?",
        "Who joined in March?",
    ],
)
def test_a_month_or_span_in_a_question_of_its_own_is_part_of_its_subject(query):
    """A month or a span of days is no rate question by itself: a question that names one
    beside its subject is searched, not asked back."""
    assert decide(query).intent == "documents"
    earlier = [("user", "Какой курс доллара?"), ("assistant", "…")]
    assert rule_decision(query, history=earlier, today=TODAY).intent == "documents"


@pytest.mark.parametrize(
    ("query", "code"),
    [("Convert 1.11 EUR to RUB", "EUR"), ("How much is 10.12 USD in RUB?", "USD")],
)
def test_an_amount_is_not_a_day(query, code):
    """dd.mm without a year is a day only after a preposition («на 15.01»): 1.11 EUR is an
    amount."""
    d = decide(query)
    assert (d.intent, d.currency, d.date, d.date_from) == ("currency_rates", code, "", "")
