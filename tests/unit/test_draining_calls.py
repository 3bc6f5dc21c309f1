"""services.common.draining without a server: when the calls end, and how each one ends."""

from __future__ import annotations

import asyncio

import pytest

from services.common import draining, errors
from services.common.draining import RunningCalls, end_delay


@pytest.mark.parametrize(
    ("grace", "delay"), [(10.0, 9.0), (2.0, 1.0), (1.0, 0.5), (0.5, 0.25), (0.0, 0.0)]
)
def test_calls_end_a_margin_before_the_grace_at_most_half_of_it(grace: float, delay: float) -> None:
    assert end_delay(grace) == delay


async def test_a_waiting_call_is_cancelled_and_ends_draining() -> None:
    calls = RunningCalls("toy")
    opened = asyncio.Event()
    ended: list[bool] = []

    async def handler() -> None:
        call = calls.open()
        opened.set()
        try:
            await asyncio.Event().wait()
        finally:
            ended.append(calls.close(call))

    task = asyncio.ensure_future(handler())
    await opened.wait()
    calls.end_before(0.0)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ended == [True]
    assert calls.ending
    error = calls.stopping_error()
    assert (error.code, error.reason) == (errors.UNAVAILABLE, errors.DRAINING)
    assert "toy service is stopping" in error.message


async def test_a_call_that_ends_in_its_own_way_is_told_not_cancelled() -> None:
    calls = RunningCalls()
    told: asyncio.Queue[errors.UnavailableError] = asyncio.Queue()
    result: list[bool] = []

    async def handler() -> str:
        call = calls.open()
        try:
            draining.when_ending(told.put_nowait)
            error = await told.get()
            assert error.reason == errors.DRAINING
            return "ended itself"
        finally:
            result.append(calls.close(call))

    task = asyncio.ensure_future(handler())
    await asyncio.sleep(0)
    calls.end_before(0.0)
    assert await task == "ended itself"
    assert result == [False]  # not cancelled: nothing to take back


async def test_a_call_opened_after_the_moment_ends_at_once() -> None:
    calls = RunningCalls()
    calls.end_before(0.0)
    await asyncio.sleep(0.01)
    assert calls.ending

    async def handler() -> None:
        call = calls.open()
        try:
            await asyncio.Event().wait()
        finally:
            calls.close(call)

    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(handler(), 5)


async def test_a_stream_handing_a_message_over_ends_when_asked_for_the_next() -> None:
    calls = RunningCalls()
    call = calls.open()
    call.handing_over = True
    calls.end_before(0.0)
    await asyncio.sleep(0.01)  # the moment: no cancel lands in grpc's write
    with pytest.raises(errors.UnavailableError) as stopped:
        call.resume()
    assert stopped.value.reason == errors.DRAINING
    assert calls.close(call) is False


def test_when_ending_outside_a_served_call_does_nothing() -> None:
    draining.when_ending(lambda error: pytest.fail("called"))


async def test_a_call_closed_before_its_end_runs_is_left_alone() -> None:
    """Opened after the moment, a call's end is due at the loop's next turn: a call closed by
    then (its answer on its way) is not cancelled, which would cut grpc's sending of it."""
    calls = RunningCalls()
    calls.end_before(0.0)
    await asyncio.sleep(0.01)

    async def handler() -> str:
        call = calls.open()
        assert calls.close(call) is False
        await asyncio.sleep(0.01)  # the end due for it runs meanwhile
        return "answered"

    assert await handler() == "answered"
