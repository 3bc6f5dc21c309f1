"""The server's stop ends its calls still running with UNAVAILABLE DRAINING (services.common.draining).

On a server started with start_server (as every service's is), a call still running a
moment before the stop's grace runs out ends with UNAVAILABLE and ErrorInfo reason DRAINING,
unary or streamed, instead of grpc's bare cancel at the grace's end; a call that ends before
then is untouched.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from services.common.errors import DRAINING
from services.common.server import RunningServer, start_server
from services.common.settings import ServerSettings
from services.common.status import error_info

SERVICE = "test.Toy"
GRACE_S = 2.0
STOP_BOUND_S = 10.0
"""Far past the grace: a stop that takes this long is stuck."""
CHUNK = b"x" * (256 * 1024)
"""A stream's message: a few dozen fill the connection's flow-control window."""


class Toy:
    """Handlers that run until told (`release`), or until cancelled."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.sent = 0
        """Messages the stream handed to grpc."""

    async def wait(self, request: bytes, context: Any) -> bytes:
        self.started.set()
        await self.release.wait()
        return b"done"

    async def finish_anyway(self, request: bytes, context: Any) -> bytes:
        """A handler that, cancelled, answers all the same."""
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            return b"finished anyway"
        return b"done"

    async def stream(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        """One message, then waits."""
        yield b"first"
        self.started.set()
        await self.release.wait()

    async def flood(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        """Messages until the caller stops reading them (grpc's write then waits)."""
        self.started.set()
        while True:
            self.sent += 1
            yield CHUNK


async def serve(toy: Toy) -> RunningServer:
    def register(server: grpc.aio.Server) -> None:
        handlers = {
            "Wait": grpc.unary_unary_rpc_method_handler(toy.wait),
            "FinishAnyway": grpc.unary_unary_rpc_method_handler(toy.finish_anyway),
            "Stream": grpc.unary_stream_rpc_method_handler(toy.stream),
            "Flood": grpc.unary_stream_rpc_method_handler(toy.flood),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))

    settings = ServerSettings("toy", port=0, max_message_bytes=4 * 1024 * 1024)
    return await start_server(
        settings, register, (SERVICE,), CollectorRegistry(), domain="visior.toy"
    )


async def stopped(
    running: RunningServer, body: Callable[[grpc.aio.Channel], Awaitable[Any]]
) -> Any:
    """`body(channel)`'s result; the server stopped (at the latest) when it ends."""
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            return await body(channel)
    finally:
        await running.stop(0)


def assert_draining(error: grpc.aio.AioRpcError | None) -> None:
    assert error is not None
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    info = error_info(error)
    assert info is not None, error.details()
    assert info.reason == DRAINING
    assert info.domain == "visior.toy"


async def test_a_unary_call_running_when_the_server_stops_fails_draining() -> None:
    toy = Toy()
    running = await serve(toy)

    async def body(channel: grpc.aio.Channel) -> None:
        call = channel.unary_unary(f"/{SERVICE}/Wait")(b"")
        await asyncio.wait_for(toy.started.wait(), STOP_BOUND_S)
        stop = asyncio.ensure_future(running.stop(GRACE_S))
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await call
        await asyncio.wait_for(stop, STOP_BOUND_S)
        assert_draining(failed.value)

    await stopped(running, body)


async def test_a_call_that_ends_before_the_grace_runs_out_is_untouched() -> None:
    toy = Toy()
    running = await serve(toy)

    async def body(channel: grpc.aio.Channel) -> bytes:
        call = channel.unary_unary(f"/{SERVICE}/Wait")(b"")
        await asyncio.wait_for(toy.started.wait(), STOP_BOUND_S)
        stop = asyncio.ensure_future(running.stop(GRACE_S))
        await asyncio.sleep(0.1)
        toy.release.set()
        answer = await call
        await asyncio.wait_for(stop, STOP_BOUND_S)
        return bytes(answer)

    assert await stopped(running, body) == b"done"


async def test_a_handler_that_answers_when_cancelled_answers() -> None:
    """The stop cancels the handler where it waits; one that answers all the same is heard."""
    toy = Toy()
    running = await serve(toy)

    async def body(channel: grpc.aio.Channel) -> bytes:
        call = channel.unary_unary(f"/{SERVICE}/FinishAnyway")(b"")
        await asyncio.wait_for(toy.started.wait(), STOP_BOUND_S)
        stop = asyncio.ensure_future(running.stop(GRACE_S))
        answer = await call
        await asyncio.wait_for(stop, STOP_BOUND_S)
        return bytes(answer)

    assert await stopped(running, body) == b"finished anyway"


async def read_all(call: Any) -> tuple[list[bytes], grpc.aio.AioRpcError | None]:
    messages: list[bytes] = []
    try:
        while (message := await call.read()) is not grpc.aio.EOF:
            messages.append(message)
    except grpc.aio.AioRpcError as exc:
        return messages, exc
    return messages, None


async def test_a_stream_waiting_in_its_handler_when_the_server_stops_fails_draining() -> None:
    toy = Toy()
    running = await serve(toy)

    async def body(channel: grpc.aio.Channel) -> None:
        call = channel.unary_stream(f"/{SERVICE}/Stream")(b"")
        assert await call.read() == b"first"
        await asyncio.wait_for(toy.started.wait(), STOP_BOUND_S)
        stop = asyncio.ensure_future(running.stop(GRACE_S))
        messages, failed = await read_all(call)
        await asyncio.wait_for(stop, STOP_BOUND_S)
        assert messages == []
        assert_draining(failed)

    await stopped(running, body)


async def test_a_stream_whose_message_grpc_is_writing_fails_draining_at_the_next() -> None:
    """The caller reads nothing, so grpc's write of a message waits at the stop's moment:
    the stream ends with DRAINING when grpc asks for the next message, after the ones sent
    (a cancel there would land in grpc's write, which then sends no status at all)."""
    toy = Toy()
    running = await serve(toy)
    assert running.calls is not None
    calls = running.calls

    async def body(channel: grpc.aio.Channel) -> None:
        call = channel.unary_stream(f"/{SERVICE}/Flood")(b"")
        await asyncio.wait_for(toy.started.wait(), STOP_BOUND_S)
        stop = asyncio.ensure_future(running.stop(GRACE_S))
        while not calls.ending:  # noqa: ASYNC110 - the stop's moment, set by its timer
            await asyncio.sleep(0.05)
        messages, failed = await read_all(call)
        await asyncio.wait_for(stop, STOP_BOUND_S)
        assert messages and all(m == CHUNK for m in messages)
        assert len(messages) == toy.sent
        assert_draining(failed)

    await stopped(running, body)
