"""How a question names a currency: the orchestrator's routing (which rate a question asks
for) and the extractive responder (which of a result's rates to show) read it from here."""

from __future__ import annotations

import re

from services.common.wording import fold_case, whole_words

CURRENCIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("AUD", (r"австралийск\w* доллар\w*", r"australian dollars?", "aud")),
    ("CAD", (r"канадск\w* доллар\w*", r"canadian dollars?", "cad")),
    ("HKD", (r"гонконгск\w* доллар\w*", r"hong kong dollars?", "hkd")),
    ("BYN", (r"белорусск\w* рубл\w*", r"belarusian (?:ruble|rouble)s?", "byn")),
    ("TRY", (r"турецк\w* лир\w*", r"лир[аыуе]?", r"turkish lira", r"liras?")),
    (
        "USD",
        (
            r"американск\w* доллар\w*",
            r"доллар\w*(?: сша)?",
            r"бакс\w*",
            r"(?:us |u\.s\. |american )?dollars?",
            "usd",
        ),
    ),
    ("EUR", ("евро", r"euros?", "eur")),
    ("CNY", (r"юан\w*", r"жэньминьби", r"yuans?", "renminbi", "cny", "rmb")),
    ("GBP", (r"фунт\w*", r"стерлинг\w*", r"pounds?", "sterling", "gbp")),
    ("JPY", (r"[иий]ен[аыуе]?", "yen", "jpy")),
    ("CHF", (r"франк(?:а|и|у|ом|ов|ах)?", r"francs?", "chf")),
    ("KZT", ("тенге", "tenge", "kzt")),
    ("UAH", (r"гривн\w*", r"hryvnias?", "uah")),
    ("INR", (r"рупи[яийюе]\w*", r"rupees?", "inr")),
    ("AED", (r"дирхам\w*", r"dirhams?", "aed")),
    ("AMD", (r"армянск\w* драм\w*", r"armenian drams?")),
    ("AZN", (r"манат\w*", r"manats?", "azn")),
    ("UZS", (r"узбекск\w* сум\w*", "uzs")),
    ("KGS", (r"киргизск\w* сом\w*", r"кыргызск\w* сом\w*", "kgs")),
)
"""ISO 4217 code -> how a query names it. The rouble is absent on purpose: the bank quotes
every rate in roubles, so "курс рубля к евро" asks for EUR."""
CURRENCY_PATTERNS = tuple((code, whole_words(*names)) for code, names in CURRENCIES)
CURRENCY_SYMBOLS = {"$": "USD", "€": "EUR", "£": "GBP", "¥": "CNY"}


def named_currencies(text: str) -> list[str]:
    """The ISO 4217 codes of the non-rouble currencies `text` names (by name, code or
    symbol), each once, in the order it first names them. A name inside a longer one is
    not a naming of its own: "австралийского доллара" names AUD, not USD as well."""
    folded = fold_case(text)
    found = [
        (m.start(), -m.end(), code) for code, rx in CURRENCY_PATTERNS for m in rx.finditer(folded)
    ]
    found += [
        (m.start(), -m.end(), code)
        for symbol, code in CURRENCY_SYMBOLS.items()
        for m in re.finditer(re.escape(symbol), folded)
    ]
    named: dict[str, None] = {}
    taken_until = 0
    for start, neg_end, code in sorted(found):
        if start >= taken_until:
            named.setdefault(code)
            taken_until = -neg_end
    return list(named)
