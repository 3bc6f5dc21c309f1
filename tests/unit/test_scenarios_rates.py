"""The rules' rate routes (agent.md §4, §5.3): which questions reach fetch_cbr_data, with
which currency, and which are asked back instead of being answered for the wrong one."""

from datetime import date

import pytest

from services.common.currencies import foreign_currency_names, named_currencies
from services.orchestrator.scenarios import Decision, rule_decision

TODAY = date(2026, 11, 28)


def decide(query: str) -> Decision:
    return rule_decision(query, today=TODAY)


# -- an ISO code the tables have no words for ------------------------------------------------


@pytest.mark.parametrize(
    ("query", "code", "day"),
    [
        ("курс PLN на 02.10.2026", "PLN", "2026-10-02"),
        ("курс SGD", "SGD", ""),
        ("PLN rate", "PLN", ""),
        ("USD", "USD", ""),  # one of the most traded alone is a rate question
        ("100 PLN в рублях", "PLN", ""),  # another beside an amount
        ("SGD/RUB", "SGD", ""),
        ("sgd/rub", "SGD", ""),  # a pair counts in any case
        ("EUR-RUB", "EUR", ""),
        ("Курс XDR на вчера", "XDR", "2026-11-27"),
    ],
)
def test_an_iso_code_goes_to_the_bank(query, code, day):
    d = decide(query)
    assert (d.scenario, d.intent, d.currency, d.date) == ("S2", "currency_rates", code, day)


@pytest.mark.parametrize(
    ("query", "intent"),
    [
        ("курс pln", "documents"),  # lower case and no pair: not read as a code
        ("курс SQL для начинающих", "documents"),  # capitals, but no ISO 4217 code
        ("курс ALL", "documents"),  # ALL is a code, and more often the word
        ("VAT rate", "knowledge_base"),
        ("сумма в PLN по договору", "documents"),
        ("сумма в PLN", "documents"),  # a code with a subject of its own is no rate question
        # capitals that are a code but, with no rate word or amount beside them, mostly not
        ("What is the error rate of the AMD GPU?", "documents"),
        ("What internal rate of return (IRR) does the project have?", "documents"),
        ("Сколько стоит курс по PHP?", "documents"),
        ("AMD 7800X3D", "documents"),
    ],
)
def test_capitals_that_are_no_rate_question(query, intent):
    assert decide(query).intent == intent


# -- a currency qualified by its country -----------------------------------------------------


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ("курс сингапурского доллара", "SGD"),
        ("Singapore dollar rate", "SGD"),
        ("New Zealand dollar exchange rate", "NZD"),
        ("курс новозеландского доллара на вчера", "NZD"),
        ("Egyptian pound rate", "EGP"),
        ("курс египетского фунта", "EGP"),
        ("курс туркменского маната", "TMT"),
        ("курс индонезийской рупии", "IDR"),
        # the country that is the table's own keeps the table's code
        ("курс американского доллара", "USD"),
        ("курс британского фунта", "GBP"),
        ("Swiss franc rate", "CHF"),
        ("курс азербайджанского маната", "AZN"),
        ("Indian rupee rate", "INR"),
        ("курс канадского доллара", "CAD"),
        # an adjective that names no country leaves the currency as it is
        ("коммерческого доллара курс", "USD"),
    ],
)
def test_a_qualified_currency_is_that_countrys(query, code):
    d = decide(query)
    assert (d.intent, d.currency) == ("currency_rates", code)


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("курс ямайского доллара", "ямайского доллара"),
        ("Курс Ливанского фунта на вчера", "Ливанского фунта"),
        ("курс доллара и ямайского доллара", "ямайского доллара"),  # not USD for both
        ("ямайских долларов в рублях", "ямайских долларов"),
    ],
)
def test_a_currency_of_an_unknown_country_is_asked_back_in_russian(query, name):
    d = decide(query)
    assert (d.scenario, d.intent, d.currency) == ("S5", "clarify", "")
    assert f"«{name}»" in d.clarifications[0]
    assert "ISO 4217" in d.clarifications[1]


def test_a_currency_of_an_unknown_country_is_asked_back_in_english():
    d = decide("Lebanese pound rate")
    assert (d.scenario, d.intent, d.language) == ("S5", "clarify", "en")
    assert "“Lebanese pound”" in d.clarifications[0]


def test_an_unknown_country_outside_a_rate_question_is_not_asked_back():
    d = decide("Найди договор в ямайских долларах")
    assert (d.scenario, d.intent) == ("S1", "documents")


@pytest.mark.parametrize(
    ("text", "named", "foreign"),
    [
        ("курс сингапурского доллара", ["SGD"], []),
        ("курс ямайского доллара", [], ["ямайского доллара"]),
        ("USD и Jamaican dollar", ["USD"], ["Jamaican dollar"]),
        ("PLN/RUB", ["PLN"], []),
        ("all rates", [], []),
        ("RUB", [], []),  # the rouble is never named: every rate is in it
    ],
)
def test_what_the_currency_names_read(text, named, foreign):
    assert named_currencies(text) == named
    assert foreign_currency_names(text) == foreign


# -- phrasings of a rate question ------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ("EUR to RUB", "EUR"),
        ("USD RUB", "USD"),
        ("dollar to rub", "USD"),
        ("100 долларов в рублях", "USD"),
        ("1 000,50 евро в рублях", "EUR"),
        ("сколько рублей за доллар", "USD"),
        ("How much does a dollar cost?", "USD"),
        ("евро в 2023 году", "EUR"),
        ("евро с 1 по 10 марта 2024", "EUR"),
    ],
)
def test_rate_phrasings(query, code):
    d = decide(query)
    assert (d.scenario, d.intent, d.currency) == ("S2", "currency_rates", code)


@pytest.mark.parametrize(
    "query",
    [
        "100 долларов за лицензию",
        "Сколько стоит лицензия в долларах?",
        "Выручка в долларах за 2024 год",
        "How much does the license cost in dollars?",
    ],
)
def test_a_price_in_a_currency_is_no_rate_question(query):
    assert decide(query).intent == "documents"


# -- the key rate ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "query",
    [
        "ЦБ повысил ставку?",
        "какая ставка у ЦБ",
        "Что решил ЦБ по ставке?",
        "Банк России снизил ставку",
        "What rate did the Bank of Russia set?",
        "What is the central bank's rate?",
        "central bank rate",
    ],
)
def test_the_bank_and_a_rate_is_the_key_rate(query):
    d = decide(query)
    assert (d.scenario, d.intent, d.currency) == ("S2", "key_rate", ""), query


@pytest.mark.parametrize(
    ("query", "intent"),
    [
        ("central bank rate for USD", "currency_rates"),  # a currency: its exchange rate
        ("Bank of Russia exchange rate", "currency_rates"),
        ("курс ЦБ на сегодня", "currency_rates"),
        ("ставки по вкладам в банках России", "documents"),
        ("Какая ставка НДС на услуги?", "knowledge_base"),
        ("What rate does the contract use?", "documents"),
        ("По какой ставке ЦБ в договоре займа?", "documents"),
    ],
)
def test_a_rate_that_is_not_the_key_rate(query, intent):
    assert decide(query).intent == intent


@pytest.mark.parametrize(
    ("query", "intent"),
    [
        ("Средние ставки в банках России по вкладам", "documents"),  # the banks, not the Bank
        ("Ставка центрального банка Казахстана", "documents"),  # another country's bank
        ("What inflation rate does the central bank forecast?", "documents"),
        ("Mortgage rates after the Bank of Russia decision", "documents"),
        ("ЦБ и ставка НДС по услугам", "knowledge_base"),
        ("Какая ставка центрального банка?", "key_rate"),
        ("What is the central bank's rate?", "key_rate"),
        ("ставка Банка России", "key_rate"),
    ],
)
def test_a_bank_and_a_rate_is_the_key_rate_only_for_the_bank_of_russia(query, intent):
    assert decide(query).intent == intent
