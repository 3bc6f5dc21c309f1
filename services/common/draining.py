"""A server's calls in flight, ended with UNAVAILABLE DRAINING a moment before its stop's grace
runs out.

grpc's `server.stop(grace)` cancels every call still running when the grace runs out: its
caller gets UNAVAILABLE "Cancelling all calls" with no ErrorInfo (through Envoy a 502 whose
body is not the mesh's error), which by the mesh's rule says no handler ran (an UNAVAILABLE
without ErrorInfo came from the transport: services/client/errors.py), although one did.
So the server's ServerInterceptor keeps every call of the server's own services in its
`RunningCalls` while its handler runs, and `end_before(grace)`, called as the stop begins
(services.common.server), ends each one still running END_MARGIN_S before the grace runs out
(at most half the grace) with UNAVAILABLE reason DRAINING: its handler is cancelled where it
waits, and the ServerInterceptor answers the error with its ErrorInfo, as any handler's
error. A call that finishes before then is untouched.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import grpc

from services.common import errors

END_MARGIN_S = 1.0
"""How long before the stop's grace runs out a call still running ends (at most half the
grace): time for its error to go out before grpc cancels the call."""

EndCallback = Callable[[errors.UnavailableError], None]
"""A handler's own way to end (`when_ending`): called with the error to end with."""


def end_delay(grace: float) -> float:
    """How long after the stop begins the calls still running end: END_MARGIN_S before a grace
    of `grace` s runs out, at most half of it before."""
    return max(0.0, grace - min(END_MARGIN_S, grace / 2))


class RunningCall:
    """One handler call in flight, from its interceptor's `open` to its `close`."""

    __slots__ = (
        "_closed",
        "_error",
        "_on_end",
        "_owner",
        "_pending",
        "_task",
        "cancelled",
        "ended",
        "handing_over",
    )

    def __init__(self, task: asyncio.Task[Any] | None, owner: RunningCalls) -> None:
        self._task = task
        self._owner = owner
        self._error: errors.UnavailableError | None = None
        self._on_end: EndCallback | None = None
        self._pending = False
        self._closed = False
        self.ended = False
        """The stop's moment has come for this call."""
        self.cancelled = False
        """Its handler was cancelled for it: what the call raised becomes the DRAINING error."""
        self.handing_over = False
        """A stream's message is with grpc (the handler is suspended at its yield): a cancel
        now would land in grpc's write, and grpc would end the call with no status at all."""

    def end(self) -> None:
        """The stop's moment: the handler's own way (`when_ending`), else its task cancelled
        where it waits, else (a stream handing a message over) at `resume`. Once closed,
        nothing: a cancel would land in grpc's sending of the answer."""
        if self.ended or self._closed:
            return
        self.ended = True
        if self._on_end is not None:
            self._on_end(self.error)
        elif self.handing_over:
            self._pending = True
        elif self._task is not None and not self._task.done():
            self.cancelled = True
            self._task.cancel()

    def on_end(self, callback: EndCallback) -> None:
        """End in the handler's own way: `callback` in place of the cancel (`when_ending`)."""
        if self.ended:
            callback(self.error)
        else:
            self._on_end = callback

    def resume(self) -> None:
        """grpc took a stream's message and asks for the next: the DRAINING error when the
        stop's moment came meanwhile."""
        self.handing_over = False
        if self._pending:
            raise self.error

    def close(self) -> bool:
        """The call is over: whether its handler was cancelled for the stop (the cancel is
        taken back from its task, which goes on to send the error)."""
        self._closed = True
        if self.cancelled and self._task is not None:
            self._task.uncancel()
        return self.cancelled

    @property
    def error(self) -> errors.UnavailableError:
        """UNAVAILABLE DRAINING: what the call ends with (made when first asked for)."""
        if self._error is None:
            self._error = self._owner.stopping_error()
        return self._error


_running: ContextVar[RunningCall | None] = ContextVar("visior_running_call", default=None)
"""The call the current task serves."""


def when_ending(callback: EndCallback) -> None:
    """The call being served ends in its own way: at the stop's moment its handler is not
    cancelled, `callback` is called with the DRAINING error, and the handler raises it when it
    will (the LLM's GenerateStream, whose last event then carries the error). Outside a served
    call (a servicer called directly), nothing."""
    call = _running.get()
    if call is not None:
        call.on_end(callback)


class RunningCalls:
    """The calls a server is running: its ServerInterceptor wraps each handler of the server's
    own services in `kept_unary` / `kept_stream`, inside the interceptor's own wrapper, so the
    DRAINING error a call stopped here raises becomes the caller's status with its ErrorInfo,
    counted and logged as any handler's error (health and reflection are not kept: the stop
    ends health's Watch streams itself). Its stop (services.common.server.RunningServer.stop)
    calls `end_before`."""

    def __init__(self, service: str = "") -> None:
        self._calls: set[RunningCall] = set()
        self._message = (
            f"the {service} service is stopping; ask again"
            if service
            else "the server is stopping; ask again"
        )
        self.ending = False
        """The stop's moment has come: calls still running were ended, and any opened from
        now on end at once."""

    def stopping_error(self) -> errors.UnavailableError:
        """UNAVAILABLE DRAINING: what a call still running at the stop's moment ends with."""
        return errors.UnavailableError(self._message, reason=errors.DRAINING)

    def open(self) -> RunningCall:
        """Keep the current task's call until `close`."""
        call = RunningCall(asyncio.current_task(), self)
        self._calls.add(call)
        _running.set(call)
        if self.ending:
            asyncio.get_running_loop().call_soon(call.end)
        return call

    def close(self, call: RunningCall) -> bool:
        """Forget `call`: whether its handler was cancelled for the stop (RunningCall.close)."""
        self._calls.discard(call)
        _running.set(None)
        return call.close()

    def end_before(self, grace: float) -> asyncio.TimerHandle:
        """The server stops, giving its calls `grace` s: each still running END_MARGIN_S
        before that (at most half the grace) ends with UNAVAILABLE DRAINING. Returns the
        timer, to be cancelled once every call has finished."""
        return asyncio.get_running_loop().call_later(end_delay(grace), self._end_all)

    def _end_all(self) -> None:
        self.ending = True
        for call in list(self._calls):
            call.end()

    def kept_unary(self, behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        """`behavior`, a unary handler, kept here while it runs: ended by the stop, it raises
        the DRAINING error (`_ended_by_stop`)."""
        calls = self

        async def kept(request: Any, context: grpc.aio.ServicerContext) -> Any:
            call = calls.open()
            try:
                answer = await behavior(request, context)
            except BaseException as exc:
                if calls.close(call) and _ended_by_stop(exc, context):
                    raise call.error from exc
                raise
            calls.close(call)  # answered, even if the stop's cancel came: it is heard
            return answer

        return kept

    def kept_stream(
        self, behavior: Callable[..., AsyncIterator[Any]]
    ) -> Callable[..., AsyncIterator[Any]]:
        """`behavior`, a server-streaming handler, kept here while it runs; the stop ends it
        only between two messages, never while grpc writes one."""
        calls = self

        async def kept(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            call = calls.open()
            stream = behavior(request, context)
            try:
                async for item in stream:
                    # At the yield, grpc writes the item: the stop's cancel must not land
                    # there (grpc would end the call with no status at all), so the stream
                    # ends when grpc asks for the next item.
                    call.handing_over = True
                    yield item
                    call.resume()
            except BaseException as exc:
                if calls.close(call) and _ended_by_stop(exc, context):
                    raise call.error from exc
                raise
            else:
                calls.close(call)
            finally:
                # Closed now, not whenever the collector finds it (the caller went away:
                # grpc closes this generator at its yield), so its cleanup runs at once.
                aclose = getattr(stream, "aclose", None)
                if aclose is not None:
                    await aclose()

        return kept


def _ended_by_stop(exc: BaseException, context: grpc.aio.ServicerContext) -> bool:
    """Whether `exc`, raised by a handler the stop cancelled, is to reach its caller as the
    DRAINING error: whatever the cancel made it raise, the caller learns the server is
    stopping. Not when grpc closed the stream (GeneratorExit: the caller went away), nor once
    a status has gone out."""
    return not isinstance(exc, GeneratorExit) and not context.done()
