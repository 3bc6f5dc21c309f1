"""A local stand-in of the Bank of Russia DailyInfo SOAP 1.1 service, for demos and tests.

This machine has no internet, so ``visior run`` / ``visior demo`` start ``BankStandIn`` in a
thread on ``127.0.0.1`` and point the ToolsProxy at it (``MCP_PROXY_CBR_URL``) with
``MCP_PROXY_CBR_DEMO=true``, which makes every ``fetch_cbr_data`` result say that the data are
a DEMO stand-in. Production leaves both unset: the real ``https://www.cbr.ru`` endpoint.

The server speaks the protocol like the bank's ASP.NET (.asmx) endpoint does: the
``SOAPAction`` header names the operation, the body's first element is the operation in
``http://web.cbr.ru/``, dates are ``xs:dateTime``. It answers ``GetCursOnDate``,
``GetCursDynamic``, ``KeyRate``, ``NewsInfo`` and ``EnumValutes`` with the bank's documented
DataSet shape: an ``xs:schema`` (with ``msprop:OnDate`` for the rates of a day) and a
``diffgr:diffgram`` holding ``ValuteData/ValuteCursOnDate`` (Vname, Vnom, Vcurs, Vcode,
VchCode, VunitRate), ``ValuteData/ValuteCursDynamic`` (CursDate, Vcode, Vnom, Vcurs,
VunitRate), ``KeyRate/KR`` (DT, Rate), ``NewsInfo/News`` (Doc_id, DocDate, Title, Url) and
``ValuteData/EnumValutes``. Malformed requests get a ``soap:Client`` Fault with HTTP 500, as
ASP.NET does.

The data are DEMO values, deterministic and never real: every rate is a fixed base times a
small wiggle by date (``rate_for``), on the days the bank sets rates (Tuesday to Saturday,
``is_rate_day``; none the day after a non-working ``holidays`` day); the key rate follows a
fixed schedule (``key_rate_on``), one row per working day (``is_working_day``); the news items
are dated relative to today and titled ``[ДЕМО]``. Every request is recorded
(``requests``); the fault hooks used by the tests live in ``tests/fakes/cbr_server.py``.
"""

from __future__ import annotations

import socket
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from xml.sax.saxutils import escape

SOAP_NS = "http://schemas.xmlsoap.org/soap/envelope/"
CBR_NS = "http://web.cbr.ru/"
PATH = "/DailyInfoWebServ/DailyInfo.asmx"
"""The path the bank serves DailyInfo on, and so does the stand-in."""

MOSCOW = timezone(timedelta(hours=3), "MSK")
"""The bank's calendar: Moscow time, UTC+3."""

DEMO_BANNER = "DEMO stand-in of the Bank of Russia DailyInfo service: not real data"


@dataclass(frozen=True)
class StandInCurrency:
    """A currency the stand-in quotes."""

    code: str
    """The bank's internal code, e.g. R01235."""
    iso: str
    """ISO 4217 letters, e.g. USD."""
    numeric: int
    """ISO 4217 number, e.g. 840."""
    name: str
    """Russian name, as the bank writes it for `nominal` units."""
    eng_name: str
    """English name."""
    nominal: int
    """Units the rate is quoted for (1, 10 or 100)."""
    base: float
    """Roubles per `nominal` units, before the daily wiggle (a demo value)."""


CURRENCIES: tuple[StandInCurrency, ...] = (
    StandInCurrency("R01235", "USD", 840, "Доллар США", "US Dollar", 1, 90.0),
    StandInCurrency("R01239", "EUR", 978, "Евро", "Euro", 1, 98.0),
    StandInCurrency("R01375", "CNY", 156, "Китайский юань", "China Yuan", 1, 12.5),
    StandInCurrency("R01820", "JPY", 392, "Японских иен", "Japanese Yen", 100, 60.0),
    StandInCurrency("R01060", "AMD", 51, "Армянских драмов", "Armenia Dram", 100, 22.5),
    # Not in the client's built-in table: resolving it needs EnumValutes.
    StandInCurrency("R01565", "PLN", 985, "Польский злотый", "Polish Zloty", 1, 22.0),
)
"""The small set the unit tests pin their expectations on."""

DEMO_CURRENCIES: tuple[StandInCurrency, ...] = (
    *CURRENCIES,
    StandInCurrency("R01035", "GBP", 826, "Фунт стерлингов", "British Pound Sterling", 1, 114.0),
    StandInCurrency("R01775", "CHF", 756, "Швейцарский франк", "Swiss Franc", 1, 101.0),
    StandInCurrency("R01335", "KZT", 398, "Казахстанских тенге", "Kazakhstan Tenge", 100, 17.5),
    StandInCurrency("R01090B", "BYN", 933, "Белорусский рубль", "Belarussian Ruble", 1, 28.0),
    StandInCurrency("R01700J", "TRY", 949, "Турецких лир", "Turkish Lira", 10, 22.0),
    StandInCurrency("R01230", "AED", 784, "Дирхам ОАЭ", "UAE Dirham", 1, 24.5),
    StandInCurrency("R01270", "INR", 356, "Индийских рупий", "Indian Rupee", 100, 105.0),
    StandInCurrency("R01200", "HKD", 344, "Гонконгский доллар", "Hong Kong Dollar", 1, 11.5),
    StandInCurrency("R01010", "AUD", 36, "Австралийский доллар", "Australian Dollar", 1, 58.0),
    StandInCurrency("R01350", "CAD", 124, "Канадский доллар", "Canadian Dollar", 1, 65.0),
    StandInCurrency("R01020A", "AZN", 944, "Азербайджанский манат", "Azerbaijan Manat", 1, 53.0),
    StandInCurrency("R01370", "KGS", 417, "Киргизских сомов", "Kyrgyzstan Som", 10, 10.3),
    StandInCurrency("R01717", "UZS", 860, "Узбекских сумов", "Uzbekistan Sum", 10000, 71.0),
    StandInCurrency("R01720", "UAH", 980, "Украинских гривен", "Ukrainian Hryvnia", 10, 21.5),
)
"""What ``visior run`` / ``visior demo`` quote (demo values): every currency a question can
name (services/common/currencies.CURRENCIES)."""

KEY_RATE_CHANGES: tuple[tuple[date, float], ...] = (
    (date(2023, 12, 18), 16.00),
    (date(2024, 7, 29), 18.00),
    (date(2024, 10, 28), 21.00),
    (date(2025, 6, 9), 20.00),
    (date(2025, 7, 28), 18.00),
)
"""(first day in force, percent per annum): the schedule the unit tests pin."""

DEMO_KEY_RATE_CHANGES: tuple[tuple[date, float], ...] = (
    *KEY_RATE_CHANGES,
    (date(2025, 9, 15), 17.00),
    (date(2025, 10, 27), 16.50),
)
"""The demo schedule: the tests' one plus later steps, so recent dates have a history."""


@dataclass(frozen=True)
class StandInNews:
    """One item of the bank's news feed."""

    doc_id: int
    when: datetime
    """Moscow wall-clock time, naive."""
    title: str
    url: str
    """Relative to https://www.cbr.ru, or absolute."""


DEFAULT_NEWS: tuple[StandInNews, ...] = (
    StandInNews(
        40001,
        datetime(2025, 7, 25, 13, 30),
        "Банк России снизил ключевую ставку до 18,00%",
        "/press/pr/?file=25072025_133000key.htm",
    ),
    StandInNews(
        40002,
        datetime(2025, 7, 28, 10, 0),
        "О развитии платёжной системы",
        "/press/event/?id=40002",
    ),
    StandInNews(
        40003,
        datetime(2025, 7, 30, 16, 45),
        "Обзор финансовой стабильности",
        "https://www.cbr.ru/finstab/review/",
    ),
)
"""Fixed news the unit tests pin."""


def demo_news(today: date) -> tuple[StandInNews, ...]:
    """A few clearly labelled demo news items dated relative to `today` (newest last)."""
    items = (
        (6, 13, 30, "Демонстрационная новость: совет директоров обсудил ключевую ставку"),
        (3, 10, 0, "Демонстрационная новость: официальные курсы валют установлены"),
        (1, 16, 45, "Демонстрационная новость: обзор финансовой стабильности"),
    )
    news = []
    for i, (days_back, hour, minute, title) in enumerate(items):
        day = today - timedelta(days=days_back)
        news.append(
            StandInNews(
                90001 + i,
                datetime(day.year, day.month, day.day, hour, minute),
                f"[ДЕМО] {title}",
                f"/press/event/?id={90001 + i}",
            )
        )
    return tuple(news)


def is_working_day(day: date, holidays: frozenset[date] = frozenset()) -> bool:
    """Monday to Friday, unless one of the non-working `holidays` (the New Year's, say)."""
    return day.weekday() < 5 and day not in holidays


def is_rate_day(day: date, holidays: frozenset[date] = frozenset()) -> bool:
    """Rates are dated the day after the working day that sets them: Tuesday to Saturday
    in an ordinary week (the bank's rates of Saturday hold Sun/Mon), none after a holiday."""
    return is_working_day(day - timedelta(days=1), holidays)


def rate_for(currency: StandInCurrency, day: date) -> float:
    """The stand-in's rate of `currency` (roubles per nominal) set on `day`."""
    return round(currency.base * (1 + (day.toordinal() % 10) / 1000), 4)


def rate_day_on(day: date, holidays: frozenset[date] = frozenset()) -> date:
    """The day whose rates are in force on `day`."""
    while not is_rate_day(day, holidays):
        day -= timedelta(days=1)
    return day


def key_rate_on(
    day: date, changes: tuple[tuple[date, float], ...] = KEY_RATE_CHANGES
) -> float | None:
    """The key rate in force on `day` in the schedule `changes`, None before it starts."""
    rate = None
    for start, value in changes:
        if start <= day:
            rate = value
    return rate


def _dt(day: date) -> str:
    return f"{day.isoformat()}T00:00:00+03:00"


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server saw it."""

    path: str
    soap_action: str
    content_type: str
    operation: str
    """The body's operation element, "" if it could not be read."""
    params: dict[str, str]


class SoapFault(Exception):
    """Answer with a SOAP Fault (HTTP 500)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def fault_envelope(code: str, message: str) -> bytes:
    """A SOAP 1.1 Fault envelope as ASP.NET writes it."""
    return (
        '<?xml version="1.0" encoding="utf-8"?>'
        f'<soap:Envelope xmlns:soap="{SOAP_NS}" '
        'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
        'xmlns:xsd="http://www.w3.org/2001/XMLSchema"><soap:Body><soap:Fault>'
        f"<faultcode>{escape(code)}</faultcode><faultstring>{escape(message)}</faultstring>"
        "<detail /></soap:Fault></soap:Body></soap:Envelope>"
    ).encode()


def _dataset(
    operation: str,
    dataset: str,
    row_tag: str,
    columns: list[tuple[str, str]],
    rows: list[dict[str, str]],
    on_date: str | None = None,
) -> bytes:
    """<Op>Response/<Op>Result holding an xs:schema and a diffgram, as ADO.NET serialises."""
    prop = f' msprop:OnDate="{on_date}"' if on_date else ""
    schema_cols = "".join(
        f'<xs:element name="{name}" type="xs:{kind}" minOccurs="0" />' for name, kind in columns
    )
    schema = (
        f'<xs:schema id="{dataset}" xmlns="" xmlns:xs="http://www.w3.org/2001/XMLSchema" '
        'xmlns:msdata="urn:schemas-microsoft-com:xml-msdata" '
        'xmlns:msprop="urn:schemas-microsoft-com:xml-msprop">'
        f'<xs:element name="{dataset}" msdata:IsDataSet="true" '
        f'msdata:UseCurrentLocale="true"{prop}><xs:complexType>'
        '<xs:choice minOccurs="0" maxOccurs="unbounded">'
        f'<xs:element name="{row_tag}"><xs:complexType><xs:sequence>{schema_cols}'
        "</xs:sequence></xs:complexType></xs:element></xs:choice></xs:complexType>"
        "</xs:element></xs:schema>"
    )
    body_rows = "".join(
        f'<{row_tag} diffgr:id="{row_tag}{i + 1}" msdata:rowOrder="{i}">'
        + "".join(f"<{k}>{escape(v)}</{k}>" for k, v in row.items())
        + f"</{row_tag}>"
        for i, row in enumerate(rows)
    )
    data = f'<{dataset} xmlns="">{body_rows}</{dataset}>' if rows else ""
    return (
        '<?xml version="1.0" encoding="utf-8"?>'
        f'<soap:Envelope xmlns:soap="{SOAP_NS}" '
        'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
        'xmlns:xsd="http://www.w3.org/2001/XMLSchema"><soap:Body>'
        f'<{operation}Response xmlns="{CBR_NS}"><{operation}Result>{schema}'
        '<diffgr:diffgram xmlns:msdata="urn:schemas-microsoft-com:xml-msdata" '
        f'xmlns:diffgr="urn:schemas-microsoft-com:xml-diffgram-v1">{data}</diffgr:diffgram>'
        f"</{operation}Result></{operation}Response></soap:Body></soap:Envelope>"
    ).encode()


def _xsd_date(params: dict[str, str], name: str) -> date:
    if name not in params:
        raise SoapFault(
            "soap:Client",
            f"Server was unable to read request. ---> Parameter '{name}' is missing.",
        )
    text = params[name]
    try:
        return datetime.fromisoformat(text).date()
    except ValueError:
        raise SoapFault(
            "soap:Client",
            "Server was unable to read request. ---> There is an error in XML document (1, 1). "
            f"---> The string '{text}' is not a valid AllXsd value.",
        ) from None


def _days(start: date, end: date) -> list[date]:
    return [start + timedelta(days=i) for i in range((end - start).days + 1)]


class BankStandIn:
    """The DailyInfo SOAP service on a threaded HTTP server; use as a context manager.

    ``BankStandIn(port=0).start()`` serves on ``127.0.0.1`` (a free port when 0) from a
    daemon thread until ``stop()``; ``url`` is what ``MCP_PROXY_CBR_URL`` should say.
    Without arguments it serves the demo data (``DEMO_CURRENCIES``, ``DEMO_KEY_RATE_CHANGES``,
    ``demo_news`` of today in Moscow); `now` (an aware datetime) decides what today is.
    """

    OPERATIONS = ("GetCursOnDate", "GetCursDynamic", "KeyRate", "NewsInfo", "EnumValutes")

    def __init__(
        self,
        port: int = 0,
        *,
        host: str = "127.0.0.1",
        currencies: tuple[StandInCurrency, ...] = DEMO_CURRENCIES,
        key_rate_changes: tuple[tuple[date, float], ...] = DEMO_KEY_RATE_CHANGES,
        news: tuple[StandInNews, ...] | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        holidays: frozenset[date] = frozenset(),
    ) -> None:
        self.currencies = currencies
        self.key_rate_changes = key_rate_changes
        self.holidays = holidays
        """Non-working weekdays: no key rate row on them, no rates dated the day after."""
        self.news = news
        """Fixed news, or None for ``demo_news`` of the current day."""
        self._now = now
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._faults: list[tuple[str, Any]] = []
        self._server = ThreadingHTTPServer((host, port), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.02},
            name="bank-standin",
            daemon=True,
        )
        self._running = False
        self._connections: set[socket.socket] = set()

    # -- lifecycle --------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The port the server is bound to."""
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """The service URL, e.g. ``http://127.0.0.1:54321/DailyInfoWebServ/DailyInfo.asmx``."""
        return f"http://127.0.0.1:{self.port}{PATH}"

    def start(self) -> BankStandIn:
        """Serve from a daemon thread; returns at once, ready for requests."""
        self._thread.start()
        self._running = True
        return self

    def stop(self) -> None:
        """Stop answering and close the port: the bank becomes unreachable."""
        if not self._running:
            self._server.server_close()
            return
        self._running = False
        self._release.set()  # let hanging handlers finish
        self._server.shutdown()
        self._server.server_close()
        with self._lock:  # kept-alive connections too: a stopped bank answers nothing
            for conn in self._connections:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self._thread.join(timeout=5)

    def __enter__(self) -> BankStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def operations(self) -> list[str]:
        """The operation of every recorded request, in order."""
        with self._lock:
            return [r.operation for r in self.requests]

    def today(self) -> date:
        """Today in Moscow, the bank's calendar."""
        return self._now().astimezone(MOSCOW).date()

    def current_news(self) -> tuple[StandInNews, ...]:
        """The news feed now: the fixed items, or the demo items of today."""
        return self.news if self.news is not None else demo_news(self.today())

    def _next_fault(self) -> tuple[str, Any] | None:
        """The next injected fault (see tests/fakes/cbr_server.py), None to answer normally."""
        with self._lock:
            return self._faults.pop(0) if self._faults else None

    # -- operations -------------------------------------------------------------------

    def answer(self, operation: str, params: dict[str, str]) -> bytes:
        """The SOAP answer to one well-formed call; SoapFault for a bad parameter."""
        answers = {
            "GetCursOnDate": self._curs_on_date,
            "GetCursDynamic": self._curs_dynamic,
            "KeyRate": self._key_rate,
            "NewsInfo": self._news_info,
        }
        return answers.get(operation, self._enum_valutes)(operation, params)

    def _curs_on_date(self, operation: str, params: dict[str, str]) -> bytes:
        on = _xsd_date(params, "On_date")
        day = rate_day_on(on, self.holidays)
        rows = [
            {
                "Vname": c.name + " " * 20,  # the bank pads names with spaces
                "Vnom": str(c.nominal),
                "Vcurs": f"{rate_for(c, day):.4f}",
                "Vcode": str(c.numeric),
                "VchCode": c.iso,
                "VunitRate": repr(round(rate_for(c, day) / c.nominal, 8)),
            }
            for c in self.currencies
        ]
        cols = [
            ("Vname", "string"),
            ("Vnom", "decimal"),
            ("Vcurs", "decimal"),
            ("Vcode", "int"),
            ("VchCode", "string"),
            ("VunitRate", "double"),
        ]
        return _dataset(
            operation,
            "ValuteData",
            "ValuteCursOnDate",
            cols,
            rows,
            on_date=day.strftime("%Y%m%d"),
        )

    def _curs_dynamic(self, operation: str, params: dict[str, str]) -> bytes:
        start, end = _xsd_date(params, "FromDate"), _xsd_date(params, "ToDate")
        if "ValutaCode" not in params:
            raise SoapFault(
                "soap:Server",
                "Server was unable to process request. ---> Value cannot be null.",
            )
        code = params["ValutaCode"].strip()
        currency = next((c for c in self.currencies if c.code == code), None)
        rows = []
        if currency is not None:
            for day in _days(start, end):
                if is_rate_day(day, self.holidays):
                    value = rate_for(currency, day)
                    rows.append(
                        {
                            "CursDate": _dt(day),
                            "Vcode": currency.code,
                            "Vnom": str(currency.nominal),
                            "Vcurs": f"{value:.4f}",
                            "VunitRate": repr(round(value / currency.nominal, 8)),
                        }
                    )
        cols = [
            ("CursDate", "dateTime"),
            ("Vcode", "string"),
            ("Vnom", "decimal"),
            ("Vcurs", "decimal"),
            ("VunitRate", "double"),
        ]
        return _dataset(operation, "ValuteData", "ValuteCursDynamic", cols, rows)

    def _key_rate(self, operation: str, params: dict[str, str]) -> bytes:
        start, end = _xsd_date(params, "fromDate"), _xsd_date(params, "ToDate")
        rows = []
        for day in reversed(_days(start, end)):  # the bank lists the newest first
            rate = key_rate_on(day, self.key_rate_changes)
            if is_working_day(day, self.holidays) and rate is not None:
                rows.append({"DT": _dt(day), "Rate": f"{rate:.2f}"})
        return _dataset(operation, "KeyRate", "KR", [("DT", "dateTime"), ("Rate", "decimal")], rows)

    def _news_info(self, operation: str, params: dict[str, str]) -> bytes:
        start, end = _xsd_date(params, "fromDate"), _xsd_date(params, "ToDate")
        rows = [
            {
                "Doc_id": str(n.doc_id),
                "DocDate": n.when.isoformat() + "+03:00",
                "Title": n.title,
                "Url": n.url,
            }
            for n in sorted(self.current_news(), key=lambda n: n.when, reverse=True)
            if start <= n.when.date() <= end
        ]
        cols = [
            ("Doc_id", "int"),
            ("DocDate", "dateTime"),
            ("Title", "string"),
            ("Url", "string"),
        ]
        return _dataset(operation, "NewsInfo", "News", cols, rows)

    def _enum_valutes(self, operation: str, params: dict[str, str]) -> bytes:
        """EnumValutes(Seld): the daily-quoted currencies (Seld=false) with all their codes."""
        seld = params.get("Seld", "false").strip().lower()
        if seld not in ("true", "false", "1", "0"):
            raise SoapFault(
                "soap:Client",
                "Server was unable to read request. ---> There is an error in XML document "
                f"(1, 1). ---> The string '{seld}' is not a valid Boolean value.",
            )
        rows = (
            []
            if seld in ("true", "1")
            else [
                {
                    "Vcode": c.code.ljust(10),  # the bank pads codes with spaces
                    "Vname": c.name,
                    "VEngname": c.eng_name,
                    "Vnom": str(c.nominal),
                    "VcommonCode": c.code.ljust(10),
                    "VnumCode": str(c.numeric),
                    "VcharCode": c.iso,
                }
                for c in self.currencies
            ]
        )
        cols = [
            ("Vcode", "string"),
            ("Vname", "string"),
            ("VEngname", "string"),
            ("Vnom", "decimal"),
            ("VcommonCode", "string"),
            ("VnumCode", "int"),
            ("VcharCode", "string"),
        ]
        return _dataset(operation, "ValuteData", "EnumValutes", cols, rows)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        """The request handler bound to this server: parses the envelope, answers or faults."""

        class Handler(_DailyInfoHandler):
            bank = self

        return Handler


def _parse_call(raw: bytes) -> tuple[ET.Element | None, str, dict[str, str]]:
    """The envelope's root (None when it does not parse), its DailyInfo operation and
    parameters ("" and {} when the body holds no DailyInfo call)."""
    try:
        root = ET.fromstring(raw)
    except ET.ParseError:
        return None, "", {}
    body = root.find(f"{{{SOAP_NS}}}Body")
    call = body[0] if body is not None and len(body) else None
    if call is None or not call.tag.startswith(f"{{{CBR_NS}}}"):
        return root, "", {}
    params = {child.tag.split("}", 1)[-1]: (child.text or "").strip() for child in call}
    return root, call.tag.split("}", 1)[1], params


def _check_call(root: ET.Element | None, action: str, operation: str) -> None:
    """SoapFault, as the bank words it, for an envelope or SOAPAction it would not run."""
    if root is None:
        raise SoapFault(
            "soap:Client",
            "Server was unable to read request. ---> There is an error in "
            "XML document (1, 1). ---> Root element is missing.",
        )
    prefix = CBR_NS
    if not action.startswith(prefix) or action[len(prefix) :] not in BankStandIn.OPERATIONS:
        raise SoapFault(
            "soap:Client",
            f"Server did not recognize the value of HTTP Header SOAPAction: {action}.",
        )
    if root.tag != f"{{{SOAP_NS}}}Envelope" or operation != action[len(prefix) :]:
        raise SoapFault(
            "soap:Client",
            "Server was unable to read request. ---> The body does not hold "
            f"the element {action[len(prefix) :]} in {CBR_NS}.",
        )


class _DailyInfoHandler(BaseHTTPRequestHandler):
    """One HTTP connection to a `BankStandIn` (`bank` is set on a subclass per server)."""

    protocol_version = "HTTP/1.1"
    bank: BankStandIn

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def setup(self) -> None:
        super().setup()
        with self.bank._lock:
            self.bank._connections.add(self.connection)

    def finish(self) -> None:
        with self.bank._lock:
            self.bank._connections.discard(self.connection)
        super().finish()

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _xml(self, status: int, body: bytes) -> None:
        self._send(status, body, "text/xml; charset=utf-8")

    def do_GET(self) -> None:
        page = f"<html><body>DailyInfo: {escape(DEMO_BANNER)}</body></html>"
        self._send(200, page.encode(), "text/html; charset=utf-8")

    def do_POST(self) -> None:
        bank = self.bank
        length = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(length) if length else b""
        action = (self.headers.get("SOAPAction") or "").strip().strip('"')
        content_type = self.headers.get("Content-Type", "")
        root, operation, params = _parse_call(raw)
        with bank._lock:
            bank.requests.append(
                RecordedRequest(self.path, action, content_type, operation, params)
            )
        if self.path.split("?")[0].lower() != PATH.lower():
            self._send(404, b"<html><body>Not Found</body></html>", "text/html")
            return
        fault = bank._next_fault()
        if fault is not None:
            self._serve_fault(*fault)
            return
        if not content_type.lower().startswith("text/xml"):
            self._send(415, b"Unsupported Media Type", "text/plain")
            return
        try:
            _check_call(root, action, operation)
            self._xml(200, bank.answer(operation, params))
        except SoapFault as exc:
            self._xml(500, fault_envelope(exc.code, exc.message))

    def _serve_fault(self, kind: str, arg: Any) -> None:
        """Misbehave as the injected fault says (see tests/fakes/cbr_server.py)."""
        if kind == "hang":
            self.bank._release.wait()
            self.close_connection = True
            return
        if kind == "drop":
            self.close_connection = True
            return
        if kind == "garbage":
            self._send(200, b"<html><body>maintenance<br></body></html>", "text/html")
            return
        if kind == "fail":
            self._send(
                arg,
                b"<html><body><h1>Service Unavailable</h1></body></html>",
                "text/html; charset=us-ascii",
            )
            return
        self._xml(500, fault_envelope(*arg))
