"""How the server interceptor ends calls grpc ends under it, and its concurrency cap: a stream
the caller cancels is CANCELLED (and its handler closed at once), a call whose deadline passes
is DEADLINE_EXCEEDED, and a call past `max_concurrent_rpcs` is RESOURCE_EXHAUSTED with an
ErrorInfo, counted, while health still answers."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from services.common.context import current_trace_id
from services.common.server import RunningServer, start_server
from services.common.settings import ServerSettings
from services.common.status import error_info
from tests.unit.json_logs import json_lines

SERVICE = "toy.v1.Toy"
WAIT_BOUND_SECONDS = 10.0
"""How long a test waits for the server to record a call: a bound on a hang, not a timing."""


@dataclass
class Toy:
    """Handlers that run until the test or grpc ends them."""

    started: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    on_close: Callable[[], None] = lambda: None
    """Runs as Flood's handler cleans up."""

    async def wait(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self.started.put_nowait("wait")
        await self.release.wait()
        return b"done"

    async def flood(
        self, request: bytes, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """More than the transport holds: the handler is soon held at a write, not an await."""
        self.started.put_nowait("flood")
        try:
            while True:
                yield b"x" * 100_000
        finally:
            self.on_close()

    async def trickle(
        self, request: bytes, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        self.started.put_nowait("trickle")
        yield b"first"
        await self.release.wait()

    async def boom(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        raise RuntimeError("a bug with internals: /etc/secret")

    async def get_health(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return b"ok"

    def register(self, server: grpc.aio.Server) -> None:
        handlers = {
            "GetHealth": grpc.unary_unary_rpc_method_handler(self.get_health),
            "Boom": grpc.unary_unary_rpc_method_handler(self.boom),
            "Wait": grpc.unary_unary_rpc_method_handler(self.wait),
            "Flood": grpc.unary_stream_rpc_method_handler(self.flood),
            "Trickle": grpc.unary_stream_rpc_method_handler(self.trickle),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


class RpcLines(logging.Handler):
    """The codes of the interceptor's "rpc" lines, by method, as they are logged (after the
    call is counted)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.codes: dict[str, asyncio.Queue[str]] = defaultdict(asyncio.Queue)

    def emit(self, record: logging.LogRecord) -> None:
        self.codes[getattr(record, "method", "")].put_nowait(getattr(record, "code", ""))


@dataclass
class Served:
    toy: Toy
    running: RunningServer
    channel: grpc.aio.Channel
    registry: CollectorRegistry
    lines: RpcLines

    def unary(self, name: str = "Wait") -> grpc.aio.UnaryUnaryMultiCallable:
        return self.channel.unary_unary(f"/{SERVICE}/{name}")

    def stream(self, name: str) -> grpc.aio.UnaryStreamMultiCallable:
        return self.channel.unary_stream(f"/{SERVICE}/{name}")

    def handled(self, method: str, kind: str) -> dict[str, float]:
        """grpc_server_handled_total of `method` by code."""
        counts = {}
        for metric in self.registry.collect():
            for sample in metric.samples:
                labels = sample.labels
                if (
                    sample.name == "grpc_server_handled_total"
                    and labels["grpc_method"] == method
                    and labels["grpc_type"] == kind
                ):
                    counts[labels["grpc_code"]] = sample.value
        return counts

    async def finished(self, method: str) -> str:
        """The code of the next call of `method` the server finishes (logs and counts)."""
        lines = self.lines.codes[f"{SERVICE}/{method}"]
        return await asyncio.wait_for(lines.get(), WAIT_BOUND_SECONDS)


async def _serve(max_concurrent_rpcs: int = 256) -> AsyncIterator[Served]:
    toy, registry = Toy(), CollectorRegistry()
    settings = ServerSettings("toy", port=0, max_concurrent_rpcs=max_concurrent_rpcs)
    running = await start_server(settings, toy.register, (SERVICE,), registry, domain="visior.toy")
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
    logger, lines = logging.getLogger("visior.rpc"), RpcLines()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(lines)
    try:
        yield Served(toy, running, channel, registry, lines)
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)
        toy.release.set()
        await channel.close()
        await running.stop(0)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    async for s in _serve():
        yield s


@pytest.fixture
async def capped() -> AsyncIterator[Served]:
    async for s in _serve(max_concurrent_rpcs=2):
        yield s


async def _started(toy: Toy, name: str) -> None:
    assert await asyncio.wait_for(toy.started.get(), WAIT_BOUND_SECONDS) == name


# --- calls grpc ends under the handler ------------------------------------------------------


async def test_a_stream_the_caller_cancels_is_cancelled_and_its_handler_closed_at_once(
    served: Served,
) -> None:
    at_close: list[tuple[str, dict[str, float]]] = []
    served.toy.on_close = lambda: at_close.append(
        (current_trace_id(), served.handled("Flood", "server_stream"))
    )
    call = served.stream("Flood")(b"", metadata=(("x-trace-id", "flood-1"),))
    await call.read()
    await _started(served.toy, "flood")
    call.cancel()
    assert await served.finished("Flood") == "CANCELLED"
    assert served.handled("Flood", "server_stream") == {"CANCELLED": 1.0}
    # The handler's cleanup ran within the call (its trace id bound, not yet counted), not
    # whenever the event loop's finalizer or the garbage collector got to its generator.
    assert at_close == [("flood-1", {})]


async def test_a_unary_call_the_caller_cancels_is_cancelled(served: Served) -> None:
    call = served.unary()(b"")  # no deadline: time_remaining() is None, not 0
    await _started(served.toy, "wait")
    call.cancel()
    assert await served.finished("Wait") == "CANCELLED"
    assert served.handled("Wait", "unary") == {"CANCELLED": 1.0}


async def test_a_unary_call_whose_deadline_passes_is_deadline_exceeded(served: Served) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await served.unary()(b"", timeout=0.2)  # the handler waits for ever
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert await served.finished("Wait") == "DEADLINE_EXCEEDED"
    assert served.handled("Wait", "unary") == {"DEADLINE_EXCEEDED": 1.0}


async def test_a_stream_whose_deadline_passes_is_deadline_exceeded(served: Served) -> None:
    call = served.stream("Trickle")(b"", timeout=0.2)
    assert await call.read() == b"first"
    assert await call.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert await served.finished("Trickle") == "DEADLINE_EXCEEDED"
    assert served.handled("Trickle", "server_stream") == {"DEADLINE_EXCEEDED": 1.0}


@pytest.mark.parametrize("sent", ["boom-trace-1", ""])
async def test_a_bug_is_internal_naming_the_trace_id_the_log_has_it_under(
    served: Served, sent: str
) -> None:
    """The caller's trace id, or the one the server made up: the caller can find the log
    line either way, and sees none of the bug's own message."""
    metadata = (("x-trace-id", sent),) if sent else ()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await served.unary("Boom")(b"", metadata=metadata)
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    message = caught.value.details() or ""
    named = message.rsplit("trace_id ", 1)[-1]
    assert "secret" not in message and error_info(caught.value).reason == "INTERNAL"
    assert named == sent if sent else len(named) >= 16


# --- the concurrency cap ----------------------------------------------------------------------


async def _refusal(call: Callable[[], Awaitable[object]]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call()
    return caught.value


async def test_past_the_cap_an_app_call_is_refused_with_error_info_and_counted_health_answers(
    capped: Served,
) -> None:
    busy = [asyncio.ensure_future(capped.unary()(b"", timeout=30)) for _ in range(2)]
    for _ in busy:
        await _started(capped.toy, "wait")

    refused = await _refusal(lambda: capped.unary()(b"", timeout=10))
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    info = error_info(refused)
    assert info is not None and info.reason == "SERVER_BUSY" and info.domain == "visior.toy"
    assert dict(info.metadata) == {"limit": "2", "limit_name": "max_concurrent_rpcs"}
    assert capped.handled("Wait", "unary") == {"RESOURCE_EXHAUSTED": 1.0}
    stream = capped.stream("Trickle")(b"", timeout=10)
    assert (await _refusal(stream.read)).code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    # The liveness probe is not an application call.
    health = health_pb2_grpc.HealthStub(capped.channel)
    answer = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    answer = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=10)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    # Nor is the service's own GetHealth, which the sidecar's readiness probe asks (GET
    # /health): it answers, and takes no place from the calls.
    for _ in range(3):
        assert await capped.unary("GetHealth")(b"", timeout=10) == b"ok"

    # Finished and refused calls give their places back.
    capped.toy.release.set()
    assert await asyncio.gather(*busy) == [b"done", b"done"]
    assert await capped.unary()(b"", timeout=10) == b"done"
    assert capped.handled("Wait", "unary") == {"RESOURCE_EXHAUSTED": 1.0, "OK": 3.0}


async def test_a_stream_holds_its_place_until_it_ends(capped: Served) -> None:
    streams = [capped.stream("Trickle")(b"", timeout=30) for _ in range(2)]
    for stream in streams:
        assert await stream.read() == b"first"
    refused = await _refusal(lambda: capped.unary()(b"", timeout=10))
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    streams[0].cancel()
    assert await capped.finished("Trickle") == "CANCELLED"  # its place is free again
    capped.toy.release.set()
    assert await capped.unary()(b"", timeout=10) == b"done"


# --- Envoy's request id in the log -----------------------------------------------------------


@pytest.mark.parametrize(
    ("sent", "logged"),
    [("5f0c6e1a-0b6d-4c59-9f0e-2a7b6f3d9c11", "5f0c6e1a-0b6d-4c59-9f0e-2a7b6f3d9c11"),
     ("r" * 128, "r" * 128), ("r" * 129, None), ("", None)],
)  # fmt: skip
async def test_the_rpc_line_carries_envoys_request_id_to_join_its_access_log(
    served: Served, sent: str, logged: str | None
) -> None:
    """Envoy logs x-request-id; a JSON caller's trace id is in the body, which it never
    reads. A short printable id is logged as request_id; a longer one is not."""
    metadata = (("x-request-id", sent),) if sent else ()
    with json_lines() as lines:
        with pytest.raises(grpc.aio.AioRpcError):
            await served.unary("Boom")(b"", metadata=metadata)
        await served.finished("Boom")
    (rpc,) = [line for line in lines.events("rpc") if line.get("method", "").endswith("Boom")]
    assert rpc.get("request_id") == logged
