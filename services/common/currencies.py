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
    (
        "CNY",
        (
            r"(?:китайск\w* )?юан\w*",
            r"жэньминьби",
            r"(?:chinese )?yuans?",
            "renminbi",
            "cny",
            "rmb",
        ),
    ),
    (
        "GBP",
        (
            r"(?:британск\w* |английск\w* )?фунт\w*",
            r"стерлинг\w*",
            r"(?:british |english )?pounds?",
            "sterling",
            "gbp",
        ),
    ),
    ("JPY", (r"(?:японск\w* )?[иий]ен[аыуе]?", r"(?:japanese )?yen", "jpy")),
    ("CHF", (r"(?:швейцарск\w* )?франк(?:а|и|у|ом|ов|ах)?", r"(?:swiss )?francs?", "chf")),
    ("KZT", ("тенге", "tenge", "kzt")),
    ("UAH", (r"гривн\w*", r"hryvnias?", "uah")),
    ("INR", (r"(?:индийск\w* )?рупи[яийюе]\w*", r"(?:indian )?rupees?", "inr")),
    ("AED", (r"(?:эмиратск\w* )?дирхам\w*", r"(?:emirati |uae )?dirhams?", "aed")),
    ("AMD", (r"армянск\w* драм\w*", r"armenian drams?")),
    ("AZN", (r"(?:азербайджанск\w* )?манат\w*", r"(?:azerbaijani? |azeri )?manats?", "azn")),
    ("UZS", (r"узбекск\w* сум\w*", "uzs")),
    ("KGS", (r"киргизск\w* сом\w*", r"кыргызск\w* сом\w*", "kgs")),
)
"""ISO 4217 code -> how a query names it. The rouble is absent on purpose: the bank quotes
every rate in roubles, so "курс рубля к евро" asks for EUR. A country's adjective that is
the currency's own («швейцарского франка», "Indian rupee") is part of its name, so that
`foreign_currency_names` can tell another country's currency of the same name apart."""
CURRENCY_PATTERNS = tuple((code, whole_words(*names)) for code, names in CURRENCIES)
QUALIFIED_CURRENCIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("SGD", (r"сингапурск\w* доллар\w*", r"singapore(?:an)? dollars?")),
    ("NZD", (r"новозеландск\w* доллар\w*", r"new zealand dollars?")),
    ("EGP", (r"египетск\w* фунт\w*", r"egyptian pounds?")),
    ("TMT", (r"туркменск\w* манат\w*", r"turkmen(?:istan)? manats?")),
    ("IDR", (r"индонезийск\w* рупи\w*", r"indonesian rupiahs?")),
)
"""Currencies the Bank of Russia quotes that share their word with one of CURRENCIES (a
dollar, a pound, a manat, a rupee) and are named only with their country: "сингапурский
доллар" is SGD, not USD. Kept apart from CURRENCIES, whose every currency the demo bank
quotes (services/devtools/cbr_standin.py): these, like any ISO code a question writes, the
bank's own list resolves (ToolsProxy), and a bank that lacks one says so."""
_QUALIFIED_PATTERNS = tuple((code, whole_words(*names)) for code, names in QUALIFIED_CURRENCIES)
CURRENCY_SYMBOLS = {"$": "USD", "€": "EUR", "£": "GBP", "¥": "CNY"}

ISO_4217_CODES = frozenset(
    # in use
    "AED AFN ALL AMD ANG AOA ARS AUD AWG AZN BAM BBD BDT BGN BHD BIF BMD BND BOB BOV BRL BSD "
    "BTN BWP BYN BZD CAD CDF CHE CHF CHW CLF CLP CNY COP COU CRC CUC CUP CVE CZK DJF DKK DOP "
    "DZD EGP ERN ETB EUR FJD FKP GBP GEL GHS GIP GMD GNF GTQ GYD HKD HNL HTG HUF IDR ILS INR "
    "IQD IRR ISK JMD JOD JPY KES KGS KHR KMF KPW KRW KWD KYD KZT LAK LBP LKR LRD LSL LYD MAD "
    "MDL MGA MKD MMK MNT MOP MRU MUR MVR MWK MXN MXV MYR MZN NAD NGN NIO NOK NPR NZD OMR PAB "
    "PEN PGK PHP PKR PLN PYG QAR RON RSD RUB RWF SAR SBD SCR SDG SEK SGD SHP SLE SLL SOS SRD "
    "SSP STN SVC SYP SZL THB TJS TMT TND TOP TRY TTD TWD TZS UAH UGX USD USN UYI UYU UYW UZS "
    "VED VES VND VUV WST XAF XAG XAU XBA XBB XBC XBD XCD XCG XDR XOF XPD XPF XPT XSU XTS XUA "
    "XXX YER ZAR ZMW ZWG ZWL "
    # withdrawn: a question may ask for a day before the euro or a redenomination
    "ATS AZM BEF BYR DEM EEK ESP FIM FRF GRD HRK IEP ITL LTL LUF LVL NLG PTE ROL SKK TMM XEU".split()
)
"""ISO 4217 letter codes: a question that writes one («курс PLN», "SGD/RUB") names that
currency, whether or not CURRENCIES has words for it. Which of them the bank quotes is
ToolsProxy's to say (it resolves a code through the bank's own list)."""
_WORD_CODES = frozenset({"ALL", "BOB", "CUP", "MAD", "MOP", "PEN", "SOS", "TOP", "XXX"})
"""Codes that are also English words: written in capitals they are more often the word."""
_UPPER_CODE = re.compile(r"(?<![A-Za-z0-9])[A-Z]{3}(?![A-Za-z0-9])")
_BARE_CODES = frozenset({"USD", "EUR", "GBP", "CNY", "JPY", "CHF"})
"""Codes that in capitals are the currency wherever they stand («сколько стоит USD?»): the
world's most traded, rarely anything else."""
_CODE_BEFORE = re.compile(r"(?:курс\w*|котировк\w*|rates?|exchange|[\d$€£¥])[\s(]*$", re.IGNORECASE)
_CODE_AFTER = re.compile(
    r"^[\s)]*(?:курс\w*|котировк\w*|rates?|exchange|to\b|в рубл)", re.IGNORECASE
)
"""Beside any other code, a rate word or an amount makes it a currency («курс PLN», "SGD
rate", «100 PLN», "PLN to"): alone, capitals such as AMD, PHP or IRR are more often a
company, a language or an abbreviation."""


def _is_code(text: str, m: re.Match[str]) -> bool:
    """Whether the capitals `m` matched in `text` name a currency: one of _BARE_CODES, or
    another code beside a rate word or an amount."""
    code = m[0]
    if code not in ISO_4217_CODES or code in _WORD_CODES:
        return False
    if code in _BARE_CODES:
        return True
    before, after = text[max(0, m.start() - 24) : m.start()], text[m.end() : m.end() + 24]
    return bool(_CODE_BEFORE.search(before) or _CODE_AFTER.search(after))


_PAIR_CODES = "|".join(sorted(c.lower() for c in ISO_4217_CODES - _WORD_CODES))
CURRENCY_PAIR = re.compile(
    rf"(?<![\w/])(?P<base>{_PAIR_CODES})"
    rf"(?:\s*/\s*(?P<quote>{_PAIR_CODES})|(?:\s*-\s*|\s+|\s+(?:to|in|в|к)\s+)(?P<rub>rub))(?![\w/])"
)
"""A pair of codes over `fold_case` text, in any case: USD/RUB, sgd/rub, EUR/USD, and with
the rouble also EUR-RUB, "USD RUB", "EUR to RUB"."""

_COMMON_NOUNS_RU = (
    r"доллар\w*|фунт\w*|франк(?:а|и|у|ом|ов|ах)?|манат\w*|рупи[яийюе]\w*|лир[аыуе]?|дирхам\w*"
)
_COMMON_NOUNS_EN = r"dollars?|pounds?|francs?|manats?|rupees?|liras?|lire|dirhams?"
FOREIGN_NAMES = whole_words(
    rf"(?!\w*ческ)[а-я]+[сц]к(?:ий|ого|ому|им|ом|ая|ой|ую|ие|их|ими|ое) (?:{_COMMON_NOUNS_RU})",
    r"(?:new zealand|singapore|taiwan|brunei|fiji|belize|cayman(?: islands)?|hong kong|"
    r"trinidad and tobago|zimbabwe|solomon islands|gibraltar|falkland(?: islands)?|"
    r"saint helena|cfa|cfp|french|turkmen|turkmenistan|azerbaijan|"
    r"(?!(?:than|mean|clean|plan|loan)(?!\w))[a-z]{2,}(?:an|ese|ish|i)) "
    rf"(?:{_COMMON_NOUNS_EN})",
)
"""A currency word that many countries use (dollar, pound, franc, manat, rupee, lira,
dirham) qualified by a country («ямайского доллара», "Lebanese pound"). Where CURRENCIES
or QUALIFIED_CURRENCIES name that country's currency, the name wins; otherwise it is a
currency these tables have no code for, which the bare word must not be taken for (not
USD, GBP or AZN)."""


def _spans(text: str) -> list[tuple[int, int, int, str]]:
    """(start, rank, -end, code) of each naming in `text`; rank 1 and code "" for a foreign
    name (`FOREIGN_NAMES`), which gives way to a naming that starts where it starts."""
    folded = fold_case(text)
    found = [
        (m.start(), 0, -m.end(), code)
        for code, rx in (*CURRENCY_PATTERNS, *_QUALIFIED_PATTERNS)
        for m in rx.finditer(folded)
    ]
    found += [
        (m.start(), 0, -m.end(), code)
        for symbol, code in CURRENCY_SYMBOLS.items()
        for m in re.finditer(re.escape(symbol), folded)
    ]
    found += [
        (m.start(), 0, -m.end(), m[0]) for m in _UPPER_CODE.finditer(text) if _is_code(text, m)
    ]
    for m in CURRENCY_PAIR.finditer(folded):
        for side in ("base", "quote"):
            if m[side]:
                found.append((m.start(side), 0, -m.end(side), m[side].upper()))
    found += [(m.start(), 1, -m.end(), "") for m in FOREIGN_NAMES.finditer(folded)]
    return sorted(found)


def _namings(text: str) -> list[tuple[int, int, str]]:
    """(start, end, code) of each naming that no earlier or longer one covers."""
    kept = []
    taken_until = 0
    for start, _, neg_end, code in _spans(text):
        if start >= taken_until:
            kept.append((start, -neg_end, code))
            taken_until = -neg_end
    return kept


def named_currencies(text: str) -> list[str]:
    """The ISO 4217 codes of the non-rouble currencies `text` names (by name, code or
    symbol), each once, in the order it first names them. A name inside a longer one is
    not a naming of its own: "австралийского доллара" names AUD, not USD as well,
    "сингапурского доллара" SGD, and "ямайского доллара" no code (`foreign_currency_names`).
    A code counts when written in capitals («курс PLN») or in a pair (sgd/rub): "all rates"
    names no ALL."""
    named: dict[str, None] = {}
    for _, _, code in _namings(text):
        if code and code != "RUB":
            named.setdefault(code)
    return list(named)


def foreign_currency_names(text: str) -> list[str]:
    """The names in `text` of currencies the tables have no code for, qualified by their
    country («ямайского доллара», "Lebanese pound"), as written, in order."""
    folded = fold_case(text)
    source = text if len(text) == len(folded) else folded
    return [source[start:end] for start, end, code in _namings(text) if not code]


def without_currencies(text: str) -> str:
    """`text` with every naming of a currency blanked out (what `named_currencies` and
    `foreign_currency_names` read), the rest as written."""
    chars = list(text)
    for start, end, _ in _namings(text):
        chars[start:end] = " " * (end - start)
    return "".join(chars)
