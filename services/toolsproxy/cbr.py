"""fetch_cbr_data: the Bank of Russia DailyInfo SOAP service (rates, key rate, news) as a tool.

The bank answers SOAP 1.1 with ADO.NET DataSets: an ``xs:schema`` followed by a
``diffgr:diffgram`` that holds the rows (``ValuteData/ValuteCursOnDate``,
``ValuteData/ValuteCursDynamic``, ``KeyRate/KR``, ``NewsInfo/News``,
``ValuteData/EnumValutes``). ``CbrClient`` posts the envelopes, parses the rows, caches
answers, retries once on 5xx / connection errors and sits behind a circuit breaker;
``cbr_tool`` turns it into the ``fetch_cbr_data`` tool with validated arguments and a
normalised JSON result marked as external data: `external_data: true`, a `source`, and a
one-paragraph `text` that the tool executor delimits as untrusted external text. The bank's
other free text (news titles, currency names: `title`, `name`) the executor delimits the
same way (EXTERNAL_LABEL_FIELDS); the other fields carry only numbers, dates, codes and
links (an unsafe link is dropped), so nothing the bank wrote reaches the model outside the
EXTERNAL delimiters.

A range of days on which the bank set no rate (a weekend, the New Year holidays) answers
with the rate in force over it: the last one set before it, sought up to
IN_FORCE_LOOKBACK_DAYS back, with the day it was set (`set_before_range: true`).

With ``MCP_PROXY_CBR_DEMO=true`` (set by the mesh when it points the proxy at the local
stand-in, services/devtools/cbr_standin.py) every result is labelled as demo data: the
`source` says "DEMO stand-in, not real data", `demo` is true and `text` starts with
``DEMO_NOTICE``, so answers can say so. Production leaves it unset: the real URL, `demo` false.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import urlsplit
from xml.sax.saxutils import escape

import httpx

from services.common.breaker import (
    ANSWERED,
    NO_VERDICT,
    TIMEOUT,
    BreakerPolicy,
    CircuitBreaker,
    CircuitOpenError,
)
from services.common.context import upstream_timeout
from services.common.http import (
    TRANSIENT_STATUSES,
    check_public_api_url,
    fetch_capped,
    shown_link,
)
from services.common.logging import get_logger
from services.common.retry import AttemptFailed, RetryPolicy, run_with_retry, whole_seconds
from services.common.settings import SettingsError
from services.common.tool_contract import (
    BANK_TIMEZONE,
    CBR_MAX_RANGE_DAYS,
    FETCH_CBR_DATA,
    INVALID_ARGUMENT,
    KEY_RATE_DAYS,
    NOT_FOUND,
    UPSTREAM_UNAVAILABLE,
    bank_today,
    tool_arguments,
)
from services.toolsproxy.external_call import log_external_call
from services.toolsproxy.tools import Caller, Tool, ToolFailure
from services.toolsproxy.ttl_cache import TtlCache

log = logging.getLogger(__name__)
events = get_logger(__name__)

DEFAULT_URL = "https://www.cbr.ru/DailyInfoWebServ/DailyInfo.asmx"


def _is_the_bank(url: str) -> bool:
    """Whether `url` is on the Bank of Russia's own host (cbr.ru or a name under it)."""
    host = (urlsplit(url).hostname or "").rstrip(".").lower()
    return host == "cbr.ru" or host.endswith(".cbr.ru")


SOURCE = "Bank of Russia DailyInfo"
DEMO_SOURCE = "Bank of Russia DailyInfo (DEMO stand-in, not real data)"
DEMO_NOTICE = (
    "DEMO DATA from a local stand-in of the Bank of Russia service, not real rates or news."
)
"""Starts the `text` of every result in demo mode, so the model sees the label too."""
SITE = "https://www.cbr.ru"


SOAP_NS = "http://schemas.xmlsoap.org/soap/envelope/"
CBR_NS = "http://web.cbr.ru/"
DIFFGRAM_NS = "urn:schemas-microsoft-com:xml-diffgram-v1"
XS_NS = "http://www.w3.org/2001/XMLSchema"
MSPROP_NS = "urn:schemas-microsoft-com:xml-msprop"

EARLIEST_DATE = date(1992, 7, 1)
"""The first day of the bank's official rate series; earlier dates are refused."""

IN_FORCE_LOOKBACK_DAYS = 14
"""How far back before a range's start fetch_cbr_data seeks the rate in force over it, when
the range holds no day the bank set a rate on (a weekend, the New Year holidays): the bank
sets rates on working days, and each stays in force until the next one."""

MODES = ("currency", "key_rate", "news")
"""fetch_cbr_data's `mode` values (agent.md §3)."""
RENAMED_ARGUMENTS: Mapping[str, str] = {"operation": "mode", "currency": "code"}
"""Argument names fetch_cbr_data does not take, and the ones it takes instead (agent.md §3)."""

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_ISO_CODE = re.compile(r"^[A-Z]{3}$")
_BANK_CODE = re.compile(r"^R\d{5}[A-Z]?$")
_NUMERIC_CODE = re.compile(r"^\d{1,4}$")
_DOC_ID = re.compile(r"^[0-9A-Za-z_-]{1,32}$")

COMMON_CURRENCIES: Mapping[str, str] = {
    "USD": "R01235",
    "EUR": "R01239",
    "CNY": "R01375",
    "GBP": "R01035",
    "JPY": "R01820",
    "CHF": "R01775",
    "KZT": "R01335",
    "BYN": "R01090B",
    "TRY": "R01700J",
    "AED": "R01230",
    "INR": "R01270",
    "HKD": "R01200",
    "AMD": "R01060",
    "AZN": "R01020A",
    "UZS": "R01717",
    "KGS": "R01370",
    "AUD": "R01010",
    "CAD": "R01350",
    "UAH": "R01720",
}
"""ISO 4217 letter code -> the bank's internal code for the currencies asked about most;
any other is resolved through the bank's own EnumValutes list."""


# -- settings -----------------------------------------------------------------------------


@dataclass(frozen=True)
class CbrSettings:
    """How the proxy reaches the Bank of Russia DailyInfo service (MCP_PROXY_CBR_*)."""

    url: str = DEFAULT_URL
    """SOAP endpoint (MCP_PROXY_CBR_URL); https, or http only to a loopback host (tests)."""
    timeout_s: float = 10.0
    """Timeout of one HTTP request."""
    cache_ttl_s: float = 900.0
    """How long an answer is served from memory; 0 disables."""
    cache_max_entries: int = 512
    """Most answers kept in memory; oldest go first."""
    retry: RetryPolicy = RetryPolicy(attempts=2, first_delay_s=0.2)
    """Attempts after a 5xx or a connection error (a second one, 0.2 s after the first)."""
    breaker: BreakerPolicy = BreakerPolicy(failures=3, reset_s=30.0)
    """Failed calls in a row that open the circuit (1-5), and how long it stays open before
    one trial call."""
    max_range_days: int = CBR_MAX_RANGE_DAYS
    """Longest date_to - date_from in days."""
    max_items: int = 400
    """Most items in one result; the newest are kept."""
    max_response_bytes: int = 4 * 1024 * 1024
    """Largest SOAP answer read from the bank."""
    demo: bool = False
    """The URL is a local demo stand-in, not the bank (MCP_PROXY_CBR_DEMO): label results.
    Refused with the bank's own URL (cbr.ru)."""

    def __post_init__(self) -> None:
        check_public_api_url(self.url, "MCP_PROXY_CBR_URL")
        if self.demo and _is_the_bank(self.url):
            raise SettingsError(
                "MCP_PROXY_CBR_DEMO=true labels the answers as a demo stand-in's, but "
                f"MCP_PROXY_CBR_URL is the Bank of Russia's own ({self.url}): set it to the "
                "stand-in's URL, or leave MCP_PROXY_CBR_DEMO unset"
            )
        if not 1 <= self.breaker.failures <= 5:
            raise SettingsError("CbrSettings.breaker.failures must be between 1 and 5")


# -- errors -------------------------------------------------------------------------------


class CbrUnavailableError(ToolFailure):
    """The bank cannot be reached or answered badly; `retry_in_s` says when to try again."""

    def __init__(self, retry_in_s: int, reason: str = "") -> None:
        detail = f" ({reason})" if reason else ""
        super().__init__(
            UPSTREAM_UNAVAILABLE,
            f"the Bank of Russia service is unavailable right now{detail}; "
            f"try again in {retry_in_s} s",
        )
        self.retry_in_s = retry_in_s


class CbrRequestError(ToolFailure):
    """The bank refused the request itself (a soap:Client fault): not worth retrying."""

    breaker_verdict = ANSWERED
    """The bank answered; the request was wrong."""

    def __init__(self, message: str) -> None:
        super().__init__(
            INVALID_ARGUMENT, f"the Bank of Russia service refused the request: {message}"
        )


class _Retryable(AttemptFailed):
    """One attempt failed in a way a second attempt may fix (5xx, connection refused)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retry=True)


class _Fatal(Exception):
    """One attempt failed in a way a second attempt will not fix (timeout, bad answer)."""


class _TimedOut(_Fatal):
    """The bank did not answer within the timeout: an outage, unless this process itself
    stood still meanwhile (the breaker's TIMEOUT verdict)."""

    breaker_verdict = TIMEOUT


class _NoVerdict(Exception):
    """The attempt ran out of the caller's time, which was too short to judge the bank by."""

    breaker_verdict = NO_VERDICT


# -- argument validation ------------------------------------------------------------------


def parse_date(value: str, field_name: str) -> date:
    """`YYYY-MM-DD` -> date; anything else (or an impossible day) is INVALID_ARGUMENT."""
    if not _DATE.match(value):
        raise ToolFailure(
            INVALID_ARGUMENT, f"{field_name} must be a date as YYYY-MM-DD, got {value!r}"
        )
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise ToolFailure(
            INVALID_ARGUMENT, f"{field_name} {value!r} is not a calendar date"
        ) from None


def check_day(day: date, field_name: str, today: date) -> None:
    """A day the bank can have data for: from EARLIEST_DATE to tomorrow (Moscow time).

    Tomorrow is allowed because the bank sets the next day's rates in the afternoon.
    """
    if day < EARLIEST_DATE:
        raise ToolFailure(
            INVALID_ARGUMENT,
            f"{field_name} {day.isoformat()} is before {EARLIEST_DATE.isoformat()}, "
            "the start of the bank's data",
        )
    if day > today + timedelta(days=1):
        raise ToolFailure(
            INVALID_ARGUMENT,
            f"{field_name} {day.isoformat()} is in the future; the latest date with data is "
            f"{(today + timedelta(days=1)).isoformat()}",
        )


def check_range(date_from: date, date_to: date, today: date, max_days: int) -> None:
    """Both days valid, from <= to, and at most `max_days` apart."""
    check_day(date_from, "date_from", today)
    check_day(date_to, "date_to", today)
    if date_from > date_to:
        raise ToolFailure(
            INVALID_ARGUMENT,
            f"date_from {date_from.isoformat()} is after date_to {date_to.isoformat()}",
        )
    span = (date_to - date_from).days
    if span > max_days:
        raise ToolFailure(
            INVALID_ARGUMENT,
            f"the range is {span} days; at most {max_days} days per call "
            "(split the period into several calls)",
        )


def normalise_currency(value: str) -> str:
    """Upper-cased code if it looks like ISO 4217 letters (USD) or a bank code (R01235)."""
    code = value.strip().upper()
    if code == "RUB":
        raise ToolFailure(
            INVALID_ARGUMENT, "rates are quoted in roubles (RUB); ask for another currency"
        )
    if not (_ISO_CODE.match(code) or _BANK_CODE.match(code)):
        raise ToolFailure(
            INVALID_ARGUMENT,
            f"currency {value!r} must be an ISO 4217 letter code such as USD "
            "or the bank's internal code such as R01235",
        )
    return code


# -- parsed answers -----------------------------------------------------------------------


@dataclass(frozen=True)
class Currency:
    """A currency both ways: ISO letters and the bank's internal code."""

    iso: str
    code: str


@dataclass(frozen=True)
class DataSet:
    """Rows of one DataSet answer (child element name -> stripped text) and its properties."""

    rows: tuple[dict[str, str], ...]
    properties: dict[str, str] = field(default_factory=dict)
    """msprop:* attributes of the dataset's schema element, e.g. OnDate=20240116."""


def _number(text: str | None) -> float | None:
    if text is None or text == "":
        return None
    try:
        return float(text.replace(",", "."))
    except ValueError:
        return None


def _integer(text: str | None) -> int | None:
    value = _number(text)
    return None if value is None else int(value)


def _rate(row: Mapping[str, str]) -> tuple[int | None, float | None, float | None]:
    """(Vnom, Vcurs, VunitRate) of a rate row; the unit rate computed when the bank omits it."""
    nominal = _integer(row.get("Vnom"))
    value = _number(row.get("Vcurs"))
    unit = _number(row.get("VunitRate"))
    if unit is None and value is not None and nominal:
        unit = round(value / nominal, 8)
    return nominal, value, unit


def _day(text: str | None) -> str | None:
    """'2024-01-16T00:00:00+03:00' -> '2024-01-16' (the bank's dates are Moscow days)."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text).date().isoformat()
    except ValueError:
        return None


def _moment(text: str | None) -> datetime:
    """A DocDate as an aware datetime (the bank's Moscow time when it names no zone); an
    unreadable one sorts first."""
    try:
        moment = datetime.fromisoformat(text or "")
    except ValueError:
        return datetime.min.replace(tzinfo=UTC)
    return moment if moment.tzinfo else moment.replace(tzinfo=BANK_TIMEZONE)


_CURRENCY_NAME = re.compile(r"[^\W\d_]+(?:[ .,'()-]+[^\W\d_]+)*[.)]?")
"""A currency's name as the bank writes it: words of letters (any script) joined by spaces
and a little punctuation ("Доллар США", "Специальные права заимствования")."""
MAX_CURRENCY_NAME_CHARS = 80
MAX_CURRENCY_NAME_WORDS = 6
"""The bank's longest names have four words ("Специальные права заимствования (СДР)")."""


def _currency_name(value: str) -> str:
    """The bank's name of a currency, a plain field beside the delimited text: "" unless it
    has a currency name's shape (_CURRENCY_NAME, at most MAX_CURRENCY_NAME_CHARS and
    MAX_CURRENCY_NAME_WORDS), so what reaches the model outside the EXTERNAL delimiters is a
    few words at most, as a document's title is."""
    name = " ".join(value.split())
    ok = (
        len(name) <= MAX_CURRENCY_NAME_CHARS
        and len(name.split()) <= MAX_CURRENCY_NAME_WORDS
        and _CURRENCY_NAME.fullmatch(name)
    )
    return name if ok else ""


def _bank_url(value: str) -> str:
    """A news item's link: the bank's relative path made absolute on SITE; "" unless it is a
    link to show (common.http.shown_link: data, never fetched)."""
    return shown_link(SITE + value if value.startswith("/") else value) or ""


def _lookback_start(date_from: date, date_to: date, today: date) -> date | None:
    """Where to seek the rate in force at `date_from` when a range from it holds none: up to
    IN_FORCE_LOOKBACK_DAYS back (not before EARLIEST_DATE). None when nothing lies before, or
    when the range reaches past `today` (the bank's): tomorrow's rate may not be set yet, and
    the one in force today is not known to be in force then."""
    start = max(EARLIEST_DATE, date_from - timedelta(days=IN_FORCE_LOOKBACK_DAYS))
    return start if start < date_from and date_to <= today else None


def _soap_day(day: date) -> str:
    return f"{day.isoformat()}T00:00:00"


def _envelope(operation: str, params: tuple[tuple[str, str], ...]) -> bytes:
    body = "".join(f"<{name}>{escape(value)}</{name}>" for name, value in params)
    return (
        '<?xml version="1.0" encoding="utf-8"?>'
        '<soap:Envelope xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
        'xmlns:xsd="http://www.w3.org/2001/XMLSchema" '
        f'xmlns:soap="{SOAP_NS}">'
        f'<soap:Body><{operation} xmlns="{CBR_NS}">{body}</{operation}></soap:Body>'
        "</soap:Envelope>"
    ).encode()


def parse_fault(root: ET.Element) -> tuple[str, str] | None:
    """(faultcode, faultstring) of a SOAP 1.1 Fault, or None."""
    fault = root.find(f"{{{SOAP_NS}}}Body/{{{SOAP_NS}}}Fault")
    if fault is None:
        return None
    code = (fault.findtext("faultcode") or "").strip()
    text = (fault.findtext("faultstring") or "").strip()
    return code, text


def parse_dataset(root: ET.Element, operation: str, row_tag: str) -> DataSet:
    """The rows named `row_tag` of <Op>Response/<Op>Result's diffgram; ValueError if absent."""
    result = root.find(
        f"{{{SOAP_NS}}}Body/{{{CBR_NS}}}{operation}Response/{{{CBR_NS}}}{operation}Result"
    )
    if result is None:
        raise ValueError(f"no {operation}Result in the answer")
    properties: dict[str, str] = {}
    for element in result.iter(f"{{{XS_NS}}}element"):
        for key, value in element.attrib.items():
            if key.startswith(f"{{{MSPROP_NS}}}"):
                properties[key.split("}", 1)[1]] = value
        break  # the dataset element comes first; its msprop:* are the dataset's properties
    diffgram = result.find(f"{{{DIFFGRAM_NS}}}diffgram")
    if diffgram is None:
        raise ValueError(f"no diffgram in {operation}Result")
    rows: list[dict[str, str]] = []
    for dataset in diffgram:  # zero (no data) or one dataset element
        for row in dataset:
            if row.tag == row_tag:
                rows.append({child.tag: (child.text or "").strip() for child in row})
    return DataSet(tuple(rows), properties)


def _log_failed(operation: str, failed: _Retryable, attempt: int) -> None:
    log.info(
        "cbr attempt failed",
        extra={"operation": operation, "attempt": attempt, "reason": str(failed)},
    )


# -- the client ---------------------------------------------------------------------------


class CbrClient:
    """Async client of the DailyInfo SOAP service with a TTL cache, one retry and a breaker.

    `clock` (monotonic seconds) drives the cache and the breaker; `now` (an aware
    datetime) decides what "today" is in Moscow. Both are injected so tests step time.
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
        settings: CbrSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        breaker: CircuitBreaker | None = None,
    ) -> None:
        self._http = http
        self.settings = settings
        self._clock = clock
        self._now = now
        self.breaker = breaker or CircuitBreaker(
            "cbr",
            settings.breaker,
            clock=clock,
        )
        self._cache: TtlCache[tuple[str, tuple[tuple[str, str], ...]], DataSet] = TtlCache(
            settings.cache_ttl_s, settings.cache_max_entries, clock
        )
        self.upstream_calls = 0
        """HTTP requests sent (retries included); for metrics and tests."""

    def today(self) -> date:
        """Today on the bank's calendar (the Moscow date, tool_contract.bank_today)."""
        return bank_today(self._now())

    # -- operations ------------------------------------------------------------------

    async def rates_on_date(self, on: date) -> DataSet:
        """GetCursOnDate(On_date): every currency's rate set for `on` (rows ValuteCursOnDate)."""
        return await self._call("GetCursOnDate", (("On_date", _soap_day(on)),), "ValuteCursOnDate")

    async def rates_dynamic(self, date_from: date, date_to: date, bank_code: str) -> DataSet:
        """GetCursDynamic(FromDate, ToDate, ValutaCode): one currency's rates per day."""
        return await self._call(
            "GetCursDynamic",
            (
                ("FromDate", _soap_day(date_from)),
                ("ToDate", _soap_day(date_to)),
                ("ValutaCode", bank_code),
            ),
            "ValuteCursDynamic",
        )

    async def key_rate(self, date_from: date, date_to: date) -> DataSet:
        """KeyRate(fromDate, ToDate): the key rate per day (rows KR: DT, Rate)."""
        return await self._call(
            "KeyRate",
            (("fromDate", _soap_day(date_from)), ("ToDate", _soap_day(date_to))),
            "KR",
        )

    async def news(self, date_from: date, date_to: date) -> DataSet:
        """NewsInfo(fromDate, ToDate): the bank's news (rows News: Doc_id, DocDate, Title, Url)."""
        return await self._call(
            "NewsInfo",
            (("fromDate", _soap_day(date_from)), ("ToDate", _soap_day(date_to))),
            "News",
        )

    async def currencies(self) -> DataSet:
        """EnumValutes(Seld=false): the daily-quoted currencies with both kinds of code."""
        return await self._call("EnumValutes", (("Seld", "false"),), "EnumValutes")

    async def resolve_currency(self, value: str) -> Currency:
        """ISO letters or bank code -> Currency; the built-in table first, then EnumValutes."""
        code = normalise_currency(value)
        if _ISO_CODE.match(code) and code in COMMON_CURRENCIES:
            return Currency(code, COMMON_CURRENCIES[code])
        if _BANK_CODE.match(code):
            for iso, bank in COMMON_CURRENCIES.items():
                if bank == code:
                    return Currency(iso, bank)
        for row in (await self.currencies()).rows:
            iso, bank = row.get("VcharCode", "").upper(), row.get("Vcode", "").upper()
            if not (_ISO_CODE.match(iso) and _BANK_CODE.match(bank)):
                continue  # the codes go out as structured fields: codes, never free text
            if code in (iso, bank):
                return Currency(iso, bank)
        raise ToolFailure(
            INVALID_ARGUMENT,
            f"unknown currency {value!r}: the Bank of Russia does not quote it "
            "(use an ISO 4217 code such as USD or the bank's code such as R01235)",
        )

    # -- transport -------------------------------------------------------------------

    async def _call(
        self, operation: str, params: tuple[tuple[str, str], ...], row_tag: str
    ) -> DataSet:
        key = (operation, params)
        started = time.perf_counter()
        hit = self._cache.get(key)
        if hit is not None:
            self._event(operation, "ok", started, cache_hit=True, rows=len(hit.rows))
            return hit
        try:
            with self.breaker.trial():
                data = await self._attempts(operation, params, row_tag)
        except CircuitOpenError as exc:
            self._event(operation, "breaker_open", started)
            raise CbrUnavailableError(exc.retry_after_s) from None
        except CbrRequestError as exc:
            self._event(operation, "bad_request", started, reason=str(exc))
            raise
        except _NoVerdict as exc:
            self._event(operation, "deadline", started, reason=str(exc))
            raise CbrUnavailableError(1, str(exc)) from None
        except _Fatal as exc:
            self._event(operation, "unavailable", started, reason=str(exc))
            raise CbrUnavailableError(
                whole_seconds(self.settings.breaker.reset_s), str(exc)
            ) from None
        except asyncio.CancelledError:
            self._event(operation, "cancelled", started)
            raise
        except BaseException:
            self._event(operation, "error", started)
            raise
        self._event(operation, "ok", started, rows=len(data.rows))
        self._cache.put(key, data)
        return data

    def _event(self, operation: str, status: str, started: float, **fields: Any) -> None:
        """The call's ``external_call`` line (one per call to the bank, a cache hit included)."""
        log_external_call(events, "cbr", operation, status, started, self.breaker, **fields)

    async def _attempts(
        self, operation: str, params: tuple[tuple[str, str], ...], row_tag: str
    ) -> DataSet:
        """The rows, after the attempts `settings.retry` allows on a _Retryable failure; _Fatal
        when the last attempt failed that way too (every failed attempt is logged)."""
        envelope = _envelope(operation, params)
        try:
            data, _ = await run_with_retry(
                lambda: self._attempt(operation, envelope, row_tag),
                self.settings.retry,
                retry_on=_Retryable,
                on_retry=lambda failed, attempt, _: _log_failed(operation, failed, attempt),
                sleep=asyncio.sleep,
            )
        except _Retryable as failed:
            _log_failed(operation, failed, failed.attempts)
            raise _Fatal(str(failed)) from None
        return data

    async def _attempt(self, operation: str, envelope: bytes, row_tag: str) -> DataSet:
        headers = {
            "Content-Type": "text/xml; charset=utf-8",
            "SOAPAction": f'"{CBR_NS}{operation}"',
        }
        self.upstream_calls += 1
        timeout_s, says_nothing = upstream_timeout(self.settings.timeout_s)
        try:
            answer = await fetch_capped(
                self._http,
                "POST",
                self.settings.url,
                cap=self.settings.max_response_bytes,
                content=envelope,
                headers=headers,
                timeout=timeout_s,
            )
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError) as exc:
            raise _Retryable(f"cannot connect: {type(exc).__name__}") from None
        except httpx.TimeoutException:
            # A bank that hangs is not asked twice: the caller has waited long enough.
            if says_nothing:
                raise _NoVerdict(f"no answer within the caller's {timeout_s:.2g} s") from None
            raise _TimedOut(f"no answer within {timeout_s:.3g} s") from None
        except httpx.HTTPError as exc:
            raise _Fatal(f"transport error: {type(exc).__name__}") from None
        if answer.body is None:
            raise _Fatal("the answer is too large")
        status = answer.status
        root = self._xml(answer.body)
        fault = parse_fault(root) if root is not None else None
        if fault is not None:
            code, text = fault
            if code.rsplit(":", 1)[-1] == "Client":
                raise CbrRequestError(text or "soap:Client fault")
            raise _Retryable(f"SOAP fault {code}: {text[:200]}")
        if status in TRANSIENT_STATUSES:
            raise _Retryable(f"HTTP {status}")
        if status != 200:
            raise _Fatal(f"HTTP {status}")
        if root is None:
            raise _Fatal("the answer is not XML")
        try:
            return parse_dataset(root, operation, row_tag)
        except ValueError as exc:
            raise _Fatal(f"unexpected answer: {exc}") from None

    @staticmethod
    def _xml(body: bytes) -> ET.Element | None:
        # No DTDs: the bank never sends one, and entity expansion is a known XML attack.
        if b"<!DOCTYPE" in body or b"<!ENTITY" in body:
            return None
        try:
            return ET.fromstring(body)
        except ET.ParseError:
            return None


# -- the tool -----------------------------------------------------------------------------

_Item = TypeVar("_Item")

_DATE_FIELD = {"type": "string", "minLength": 1, "maxLength": 32, "pattern": r"^\d{4}-\d{2}-\d{2}$"}

_ALLOWED: dict[str, frozenset[str]] = {
    "currency": frozenset({"date", "date_from", "date_to", "code"}),
    "key_rate": frozenset({"date", "date_from", "date_to"}),
    "news": frozenset({"date", "date_from", "date_to"}),
}
_DEFAULT_SPAN = {"rates_dynamic": 30, "key_rate": KEY_RATE_DAYS, "news": 7}
"""Days back from date_to when date_from is not given."""


def _envelope_result(
    settings: CbrSettings, mode: str, soap_operation: str, **fields: Any
) -> dict[str, Any]:
    """The fields every result has; in demo mode labelled as not real data."""
    result: dict[str, Any] = {
        "mode": mode,
        "source": f"{DEMO_SOURCE if settings.demo else SOURCE}, {soap_operation}",
        "source_url": settings.url if settings.demo else DEFAULT_URL,
        "external_data": True,
        "demo": settings.demo,
        **fields,
    }
    if settings.demo:
        result["text"] = f"{DEMO_NOTICE}\n{result.get('text', '')}"
    return result


def _keep_newest(items: list[_Item], limit: int) -> tuple[list[_Item], bool]:
    """Items sorted oldest first; keep the newest `limit`."""
    if len(items) <= limit:
        return items, False
    return items[-limit:], True


def _dynamic_items(data: DataSet) -> list[dict[str, Any]]:
    """GetCursDynamic's rows as items {date, nominal, value, unit_rate}, oldest first."""
    items = []
    for row in data.rows:
        nominal, value, unit = _rate(row)
        items.append(
            {
                "date": _day(row.get("CursDate")),
                "nominal": nominal,
                "value": value,
                "unit_rate": unit,
            }
        )
    items.sort(key=lambda item: item["date"] or "")
    return items


def _key_rate_items(data: DataSet) -> list[dict[str, Any]]:
    """KeyRate's rows as items {date, value}, oldest first (the bank lists the newest first)."""
    items: list[dict[str, Any]] = [
        {"date": day, "value": _number(row.get("Rate"))}
        for row in data.rows
        if (day := _day(row.get("DT"))) is not None
    ]
    items.sort(key=lambda item: str(item["date"]))
    return items


def _on_or_before(items: list[dict[str, Any]], day: date) -> list[dict[str, Any]]:
    """The dated items (oldest first) of `day` or earlier."""
    return [i for i in items if i["date"] is not None and str(i["date"]) <= day.isoformat()]


_NONE_BEFORE = f", nor in the {IN_FORCE_LOOKBACK_DAYS} days before it"
"""What a "no rate" summary adds when the rate in force was sought before the range too."""


def _dynamic_text(
    iso: str,
    items: list[dict[str, Any]],
    date_from: date,
    date_to: date,
    set_before: bool,
    looked_back: bool,
) -> str:
    """The one-paragraph summary of a rate series: its two ends; the rate in force set
    before the range when the bank set none within it (`set_before`); or that it set none
    (within the range, and before it when `looked_back`)."""
    period = f"between {date_from.isoformat()} and {date_to.isoformat()}"
    if not items:
        return f"The Bank of Russia set no {iso} rate {period}" + (
            _NONE_BEFORE if looked_back else ""
        )
    first, last = items[0], items[-1]
    if set_before:
        return (
            f"The Bank of Russia set no new {iso} rate {period}; "
            f"the rate in force over that period is the one it set on {last['date']}: "
            f"{last['value']} RUB per {last['nominal']} {iso}"
        )
    if first["nominal"] == last["nominal"]:
        ends = (
            f"{first['value']} RUB on {first['date']}, {last['value']} RUB on "
            f"{last['date']} (per {last['nominal']} {iso})"
        )
    else:  # the bank changed the quoting unit within the range: each end its own
        ends = ", ".join(
            f"{i['value']} RUB per {i['nominal']} {iso} on {i['date']}" for i in (first, last)
        )
    return (
        f"{iso} rate of the Bank of Russia, {len(items)} values from "
        f"{first['date']} to {last['date']}: {ends}"
    )


class CbrTool:
    """The `fetch_cbr_data` tool over a CbrClient: validates, calls, normalises."""

    def __init__(self, client: CbrClient) -> None:
        self._client = client

    async def run(self, caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Run one `fetch_cbr_data` call; ToolFailure for anything the model can fix or retry."""
        mode = args["mode"]
        unknown = sorted(set(args) - {"mode"} - _ALLOWED[mode])
        if unknown:
            raise ToolFailure(
                INVALID_ARGUMENT,
                f"{', '.join(unknown)} does not apply to mode {mode}; it takes "
                f"{', '.join(sorted(_ALLOWED[mode]))}",
            )
        if "date" in args and ("date_from" in args or "date_to" in args):
            raise ToolFailure(INVALID_ARGUMENT, "give date or date_from/date_to, not both")
        if mode == "currency":
            if "date_from" in args or "date_to" in args:
                return await self._rates_dynamic(args)
            return await self._rates_on_date(args)
        if mode == "key_rate":
            return await self._key_rate(args)
        return await self._news(args)

    def _range(self, args: dict[str, Any], operation: str) -> tuple[date, date]:
        today = self._client.today()
        if "date" in args:
            day = parse_date(args["date"], "date")
            check_day(day, "date", today)
            return day, day
        date_to = parse_date(args["date_to"], "date_to") if "date_to" in args else today
        # Checked before the default start is counted back from it: from 0001-01-01 that
        # subtraction overflowed (INTERNAL) before check_range could refuse the date.
        check_day(date_to, "date_to", today)
        if "date_from" in args:
            date_from = parse_date(args["date_from"], "date_from")
        else:
            date_from = max(EARLIEST_DATE, date_to - timedelta(days=_DEFAULT_SPAN[operation]))
        check_range(date_from, date_to, today, self._client.settings.max_range_days)
        return date_from, date_to

    async def _rates_on_date(self, args: dict[str, Any]) -> dict[str, Any]:
        today = self._client.today()
        on = parse_date(args["date"], "date") if "date" in args else today
        check_day(on, "date", today)
        currency = None
        if "code" in args:
            currency = await self._client.resolve_currency(args["code"])
        data = await self._client.rates_on_date(on)
        items = []
        for row in data.rows:
            iso = row.get("VchCode", "").upper()
            if not _ISO_CODE.match(iso) or (currency is not None and iso != currency.iso):
                continue
            nominal, value, unit = _rate(row)
            numeric = row.get("Vcode", "")
            items.append(
                {
                    "currency": iso,
                    "numeric_code": numeric if _NUMERIC_CODE.match(numeric) else "",
                    "name": _currency_name(row.get("Vname", "")),
                    "nominal": nominal,
                    "value": value,
                    "unit_rate": unit,
                }
            )
        if currency is not None and not items:
            raise ToolFailure(
                NOT_FOUND, f"the Bank of Russia set no {currency.iso} rate for {on.isoformat()}"
            )
        on_date = data.properties.get("OnDate", "")
        published = on.isoformat()
        if re.fullmatch(r"\d{8}", on_date):
            published = f"{on_date[:4]}-{on_date[4:6]}-{on_date[6:]}"
        lines = [f"{i['nominal']} {i['currency']} = {i['value']} RUB" for i in items]
        return _envelope_result(
            self._client.settings,
            "currency",
            "GetCursOnDate",
            series="on_date",
            text=f"Official rates of the Bank of Russia for {on.isoformat()} "
            f"(set on {published}): " + "; ".join(lines),
            date=on.isoformat(),
            published=published,
            base_currency="RUB",
            items=items,
            count=len(items),
        )

    async def _in_force(
        self,
        fetch: Callable[[date, date], Awaitable[list[dict[str, Any]]]],
        date_from: date,
        date_to: date,
    ) -> tuple[list[dict[str, Any]], bool, bool]:
        """A dated series' items over the range (`fetch`), and whether they are the one set
        before it and whether it was sought there: a range in which the bank set none (a
        weekend, holidays) has the rate in force over it, the last set on or before its start
        within IN_FORCE_LOOKBACK_DAYS (`_lookback_start`), if there is one."""
        items = await fetch(date_from, date_to)
        start = None if items else _lookback_start(date_from, date_to, self._client.today())
        if start is None:
            return items, False, False
        earlier = _on_or_before(await fetch(start, date_from), date_from)[-1:]
        return earlier, bool(earlier), True

    async def _rates_dynamic(self, args: dict[str, Any]) -> dict[str, Any]:
        if "code" not in args:
            raise ToolFailure(
                INVALID_ARGUMENT, "rate dynamics (date_from/date_to) need code (e.g. USD)"
            )
        date_from, date_to = self._range(args, "rates_dynamic")
        currency = await self._client.resolve_currency(args["code"])

        async def rates(start: date, end: date) -> list[dict[str, Any]]:
            return _dynamic_items(await self._client.rates_dynamic(start, end, currency.code))

        items, set_before, looked_back = await self._in_force(rates, date_from, date_to)
        items, truncated = _keep_newest(items, self._client.settings.max_items)
        return _envelope_result(
            self._client.settings,
            "currency",
            "GetCursDynamic",
            series="dynamic",
            text=_dynamic_text(currency.iso, items, date_from, date_to, set_before, looked_back),
            currency=currency.iso,
            bank_code=currency.code,
            base_currency="RUB",
            date_from=date_from.isoformat(),
            date_to=date_to.isoformat(),
            published=items[-1]["date"] if items else None,
            set_before_range=set_before,
            items=items,
            count=len(items),
            truncated=truncated,
        )

    async def _key_rate(self, args: dict[str, Any]) -> dict[str, Any]:
        on = None
        if "date" in args:
            # The rate in force on a day: look back far enough to cross weekends and holidays.
            on, _ = self._range(args, "key_rate")
            date_from, date_to = max(EARLIEST_DATE, on - timedelta(days=KEY_RATE_DAYS)), on
        else:
            date_from, date_to = self._range(args, "key_rate")

        async def key_rates(start: date, end: date) -> list[dict[str, Any]]:
            return _key_rate_items(await self._client.key_rate(start, end))

        if on is not None:  # its own lookback already crosses weekends and holidays
            items, set_before, looked_back = await key_rates(date_from, date_to), False, False
        else:
            items, set_before, looked_back = await self._in_force(key_rates, date_from, date_to)
        latest = items[-1] if items else None
        if on is not None:
            items = items[-1:]
        items, truncated = _keep_newest(items, self._client.settings.max_items)
        period = f"between {date_from.isoformat()} and {date_to.isoformat()}"
        if latest is not None and set_before:
            text = (
                f"The Bank of Russia set no new key rate {period}; the key rate in force over "
                f"that period is {latest['value']}% per annum, as set on {latest['date']}"
            )
        elif latest is not None:
            text = (
                f"Key rate of the Bank of Russia: {latest['value']}% per annum on {latest['date']}"
            )
        else:
            text = f"The Bank of Russia published no key rate {period}" + (
                _NONE_BEFORE if looked_back else ""
            )
        return _envelope_result(
            self._client.settings,
            "key_rate",
            "KeyRate",
            text=text,
            date_from=date_from.isoformat(),
            date_to=date_to.isoformat(),
            unit="percent per annum",
            latest=latest,
            published=latest["date"] if latest else None,
            set_before_range=set_before,
            items=items,
            count=len(items),
            truncated=truncated,
        )

    async def _news(self, args: dict[str, Any]) -> dict[str, Any]:
        date_from, date_to = self._range(args, "news")
        data = await self._client.news(date_from, date_to)
        dated = []
        for row in data.rows:
            url = _bank_url(row.get("Url", ""))
            doc_id = row.get("Doc_id", "")
            # The title is the bank's free text: the executor delimits it as EXTERNAL data
            # (EXTERNAL_LABEL_FIELDS), as it does `text`.
            item = {
                "id": doc_id if _DOC_ID.match(doc_id) else "",
                "date": _day(row.get("DocDate")),
                "title": row.get("Title", ""),
                "url": url,
            }
            dated.append((_moment(row.get("DocDate")), item))
        # By the moment published, not the day: a day's news keep their order, and a cut
        # inside a day drops its earliest.
        dated.sort(key=lambda pair: pair[0])
        items, truncated = _keep_newest(
            [item for _, item in dated], self._client.settings.max_items
        )
        items.reverse()  # newest first, as a news list reads
        heading = (
            f"News of the Bank of Russia from {date_from.isoformat()} to {date_to.isoformat()}"
        )
        return _envelope_result(
            self._client.settings,
            "news",
            "NewsInfo",
            text="\n".join([heading, *(f"{i['date']}: {i['title']}" for i in items)]),
            date_from=date_from.isoformat(),
            date_to=date_to.isoformat(),
            published=items[0]["date"] if items else None,
            items=items,
            count=len(items),
            truncated=truncated,
        )


def cbr_schema(settings: CbrSettings) -> dict[str, Any]:
    """fetch_cbr_data's arguments (agent.md §3: `mode`, `date`, `code`; a range for dynamics)."""
    return tool_arguments(
        {
            "mode": {
                "type": "string",
                "enum": list(MODES),
                "description": "currency: official rates in roubles (on `date`, or one "
                "`code` from `date_from` to `date_to`); key_rate: the key rate (in force on "
                "`date`, or over a range); news: the bank's press releases.",
            },
            "date": {**_DATE_FIELD, "description": "One day, YYYY-MM-DD (default today)."},
            "date_from": {**_DATE_FIELD, "description": "First day of a range, YYYY-MM-DD."},
            "date_to": {**_DATE_FIELD, "description": "Last day of a range (default today)."},
            "code": {
                "type": "string",
                "minLength": 1,
                "maxLength": 16,
                "description": "Currency (mode currency): ISO 4217 letter code (USD) or the "
                "bank's code (R01235).",
            },
        },
        ["mode"],
        {
            "x-renamed": dict(RENAMED_ARGUMENTS),
            "x-max-range-days": settings.max_range_days,
            "x-max-items": settings.max_items,
        },
    )


def cbr_tool(client: CbrClient) -> Tool:
    """The `fetch_cbr_data` tool: rates on a date, rate dynamics, key rate, the bank's news."""
    settings = client.settings
    return Tool(
        FETCH_CBR_DATA,
        "Official data of the Bank of Russia (DailyInfo service): mode=currency (rates in "
        "roubles set for `date`, optionally one currency `code`; with `date_from`/`date_to` "
        "the dynamics of one `code`), key_rate (the key rate over a range, or in force on "
        "`date`), news (the bank's press releases). Dates are YYYY-MM-DD, at most tomorrow, "
        f"ranges at most {settings.max_range_days} days; code is an ISO 4217 code (USD) or "
        "the bank's code (R01235). The result is external data."
        + (
            " DEMO MODE: the service is a local stand-in and its data are not real; say so "
            "in the answer."
            if settings.demo
            else ""
        ),
        cbr_schema(settings),
        CbrTool(client).run,
        content="external",  # the executor delimits `text` as EXTERNAL, untrusted data
    )
