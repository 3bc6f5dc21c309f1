"""services.common.currencies: how a question names a currency, for the orchestrator's routing
(its first one: extract_currency) and the extractive responder (all of them)."""

import pytest

from services.common.currencies import named_currencies
from services.orchestrator.scenarios import extract_currency


@pytest.mark.parametrize(
    ("question", "named"),
    [
        ("курс австралийского доллара", ["AUD"]),  # "доллара" inside the name is no USD
        ("Курс доллара и австралийского доллара", ["USD", "AUD"]),
        ("rate of the Australian dollar vs the US dollar", ["AUD", "USD"]),
        ("курс юаня, евро и фунта", ["CNY", "EUR", "GBP"]),
        ("USD/RUB и €", ["USD", "EUR"]),  # the rouble is never named: every rate is in it
        ("сколько стоит 5 $", ["USD"]),
        ("курс ЁЖИКА", []),
        ("", []),
    ],
)
def test_the_currencies_a_question_names_in_order(question, named):
    assert named_currencies(question) == named
    assert extract_currency(question) == (named[0] if named else "")
