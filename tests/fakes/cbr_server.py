"""The Bank of Russia DailyInfo SOAP 1.1 server the unit tests drive, with fault injection.

The server itself is ``services.devtools.cbr_standin.BankStandIn`` (the stand-in that
``visior run`` / ``visior demo`` start); ``FakeCbrServer`` pins it to the tests' data
(``CURRENCIES``, ``KEY_RATE_CHANGES``, ``DEFAULT_NEWS``, a free port) and adds faults on
demand: ``fail_next`` (5xx with an IIS-style HTML body), ``fault_next`` (a SOAP Fault),
``hang_next`` (no answer until the server stops), ``drop_next`` (close the connection),
``garbage_next`` (200 with a body that is not SOAP). ``stop()`` makes the server
unreachable. Every request is recorded.
"""

from __future__ import annotations

from datetime import date

from services.devtools.cbr_standin import (
    CBR_NS,
    CURRENCIES,
    DEFAULT_NEWS,
    KEY_RATE_CHANGES,
    PATH,
    SOAP_NS,
    BankStandIn,
    RecordedRequest,
    SoapFault,
    fault_envelope,
    is_rate_day,
    is_working_day,
    key_rate_on,
    rate_day_on,
    rate_for,
)
from services.devtools.cbr_standin import StandInCurrency as FakeCurrency
from services.devtools.cbr_standin import StandInNews as FakeNews

__all__ = [
    "CBR_NS",
    "CURRENCIES",
    "DEFAULT_NEWS",
    "KEY_RATE_CHANGES",
    "PATH",
    "SOAP_NS",
    "FakeCbrServer",
    "FakeCurrency",
    "FakeNews",
    "RecordedRequest",
    "SoapFault",
    "fault_envelope",
    "is_rate_day",
    "is_working_day",
    "key_rate_on",
    "rate_day_on",
    "rate_for",
]


class FakeCbrServer(BankStandIn):
    """The stand-in on the tests' fixed data and a free port, with faults on demand."""

    def __init__(
        self, *, news: tuple[FakeNews, ...] = DEFAULT_NEWS, holidays: frozenset[date] = frozenset()
    ) -> None:
        super().__init__(
            0,
            currencies=CURRENCIES,
            key_rate_changes=KEY_RATE_CHANGES,
            news=news,
            holidays=holidays,
        )

    def start(self) -> FakeCbrServer:
        """Serve from a daemon thread."""
        super().start()
        return self

    def __enter__(self) -> FakeCbrServer:
        return self.start()

    def fail_next(self, times: int, status: int = 503) -> None:
        """Answer the next ``times`` requests with HTTP ``status`` and an HTML body."""
        with self._lock:
            self._faults.extend([("fail", status)] * times)

    def fault_next(
        self,
        times: int = 1,
        code: str = "soap:Server",
        message: str = "Server was unable to process request. ---> Internal error.",
    ) -> None:
        """Answer the next ``times`` requests with a SOAP Fault (HTTP 500)."""
        with self._lock:
            self._faults.extend([("fault", (code, message))] * times)

    def hang_next(self, times: int = 1) -> None:
        """Do not answer the next ``times`` requests until the server stops."""
        with self._lock:
            self._faults.extend([("hang", None)] * times)

    def garbage_next(self, times: int = 1) -> None:
        """Answer the next ``times`` requests 200 with a body that is not a SOAP envelope."""
        with self._lock:
            self._faults.extend([("garbage", None)] * times)

    def drop_next(self, times: int = 1) -> None:
        """Close the next ``times`` connections without an answer."""
        with self._lock:
            self._faults.extend([("drop", None)] * times)

    def clear_faults(self) -> None:
        """Forget the faults not yet served: the bank has recovered."""
        with self._lock:
            self._faults.clear()
