"""Each RPC's budget has one home (services.common.call_budgets): the typed client sends it as
grpc-timeout when no timeout is given, and Envoy's JSON route for the same RPC has it as its
timeout."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import yaml
from google.api import annotations_pb2
from grpclib.const import Cardinality, Handler
from grpclib.server import Stream
from grpclib.testing import ChannelFor
from visior.llm.v1 import llm_pb2
from visior.orchestrator.v1 import orchestrator_pb2
from visior.retrieval.v1 import retrieval_pb2
from visior.toolsproxy.v1 import toolsproxy_pb2
from visior_sdk.visior.llm.v1 import GenerateStreamRequest, LlmServiceBase
from visior_sdk.visior.orchestrator.v1 import OrchestratorServiceBase
from visior_sdk.visior.retrieval.v1 import (
    IngestDocumentRequest,
    IngestionServiceBase,
    RetrievalServiceBase,
)
from visior_sdk.visior.toolsproxy.v1 import ToolsProxyServiceBase

from services.client import client as client_module
from services.client.client import VisiorClient
from services.common import call_budgets
from services.common.call_budgets import CALL_BUDGETS, DEFAULT_TIMEOUT_S, grpc_method_timeout
from services.common.topology import Ports
from services.devtools import envoy_config

TARGET_KEY = {
    "visior.orchestrator.v1.OrchestratorService": "orchestrator",
    "visior.llm.v1.LlmService": "llm",
    "visior.retrieval.v1.RetrievalService": "retrieval",
    "visior.retrieval.v1.IngestionService": "ingestion",
    "visior.toolsproxy.v1.ToolsProxyService": "toolsproxy",
}
"""The VisiorClient target whose stub calls each gRPC service."""
TARGETS = {"orchestrator": 1, "llm": 2, "retrieval": 3, "toolsproxy": 4}
RESPOND = "/visior.orchestrator.v1.OrchestratorService/Respond"
INGEST = "/visior.retrieval.v1.IngestionService/IngestDocument"
SEARCH = "/visior.retrieval.v1.RetrievalService/Search"
GENERATE_STREAM = "/visior.llm.v1.LlmService/GenerateStream"
GET_HEALTH = "/visior.retrieval.v1.RetrievalService/GetHealth"


class Recorder:
    """Every RPC of the mesh, answering an empty reply and keeping the grpc-timeout it got
    (the seconds left when the request arrived; None without one)."""

    def __init__(self) -> None:
        self.timeouts: dict[str, float | None] = {}
        self.handlers: dict[str, Handler] = {}
        for base in (
            OrchestratorServiceBase,
            LlmServiceBase,
            RetrievalServiceBase,
            IngestionServiceBase,
            ToolsProxyServiceBase,
        ):
            for name, handler in base().__mapping__().items():
                self.handlers[name] = handler._replace(func=self._answer(name, handler))

    def __mapping__(self) -> dict[str, Handler]:
        return self.handlers

    def _answer(self, name: str, handler: Handler) -> Callable[[Stream], Any]:
        async def answer(stream: Stream) -> None:
            deadline = stream.deadline
            self.timeouts[name] = None if deadline is None else deadline.time_remaining()
            await stream.recv_message()
            if handler.cardinality is Cardinality.UNARY_UNARY:
                await stream.send_message(handler.reply_type())

        return answer


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
async def connect(
    recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Callable[..., VisiorClient]]:
    """A VisiorClient factory whose channels all reach `recorder` in memory."""
    async with ChannelFor([recorder]) as channel:
        monkeypatch.setattr(client_module, "Channel", lambda *args, **kwargs: channel)

        def make(**kwargs: Any) -> VisiorClient:
            visior = VisiorClient(TARGETS, **kwargs)
            visior.open()  # not closed: ChannelFor closes the one channel itself
            return visior

        yield make


async def _call(visior: VisiorClient, recorder: Recorder, method: str) -> None:
    """One call of `method` (full name) through its stub, with an empty request."""
    handler = recorder.handlers[method]
    stub = visior._stub(TARGET_KEY[method.split("/")[1]])
    request = handler.request_type()
    if handler.cardinality is Cardinality.UNARY_STREAM:
        async for _ in stub._unary_stream(method, request, handler.reply_type):
            pass
    else:
        await stub._unary_unary(method, request, handler.reply_type)


def _sent(recorder: Recorder, method: str) -> float:
    timeout = recorder.timeouts[method]
    assert timeout is not None, f"{method} was sent without grpc-timeout"
    return timeout


def _about(seconds: float) -> Any:
    # grpclib sends grpc-timeout above 10 s in whole seconds, rounded down.
    return pytest.approx(seconds, abs=1.5)


async def test_without_a_timeout_each_call_gets_its_routes_budget(connect, recorder) -> None:
    visior = connect()
    await visior.respond("How many days of leave?", "demo", "u1")
    await visior.ingestion.ingest_document(IngestDocumentRequest(tenant_id="demo"))
    await visior.search("leave", "demo")
    await visior.health("retrieval")
    assert _sent(recorder, RESPOND) == _about(120.0)
    assert _sent(recorder, INGEST) == _about(300.0)
    assert _sent(recorder, SEARCH) == _about(DEFAULT_TIMEOUT_S)
    assert _sent(recorder, GET_HEALTH) == _about(5.0)


async def test_the_stream_has_no_deadline_unless_given_one(connect, recorder) -> None:
    async for _ in connect().llm.generate_stream(GenerateStreamRequest()):
        pass
    assert recorder.timeouts[GENERATE_STREAM] is None
    async for _ in connect().llm.generate_stream(GenerateStreamRequest(), timeout=7.0):
        pass
    assert _sent(recorder, GENERATE_STREAM) == _about(7.0)


async def test_a_clients_own_timeout_applies_to_every_call(connect, recorder) -> None:
    visior = connect(timeout=10.0)
    await visior.respond("How many days of leave?", "demo", "u1")
    await visior.ingestion.ingest_document(IngestDocumentRequest(tenant_id="demo"))
    await visior.search("leave", "demo")
    async for _ in visior.llm.generate_stream(GenerateStreamRequest()):
        pass
    for method in (RESPOND, INGEST, SEARCH, GENERATE_STREAM):
        assert _sent(recorder, method) == _about(10.0), method


async def test_a_calls_own_timeout_wins(connect, recorder) -> None:
    await connect(timeout=10.0).respond("q", "demo", "u1", timeout=3.0)
    assert _sent(recorder, RESPOND) == _about(3.0)
    await connect().search("leave", "demo", timeout=50.0)
    assert _sent(recorder, SEARCH) == _about(50.0)


def _http_bindings() -> dict[str, tuple[str, str]]:
    """(HTTP method, path) of every RPC's google.api.http binding, by full gRPC method."""
    bindings = {}
    for module in (orchestrator_pb2, llm_pb2, retrieval_pb2, toolsproxy_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                rule = method.GetOptions().Extensions[annotations_pb2.http]
                verb = rule.WhichOneof("pattern")
                bindings[f"/{service.full_name}/{method.name}"] = (verb, getattr(rule, verb))
    return bindings


async def test_every_rpc_has_the_same_budget_over_grpc_and_over_json(connect, recorder) -> None:
    bindings = _http_bindings()
    assert set(bindings) == set(recorder.handlers)  # the client's stubs cover every RPC
    visior = connect()
    for method, (verb, path) in bindings.items():
        await _call(visior, recorder, method)
        route = envoy_config.route_timeout(path, verb)
        sent = recorder.timeouts[method]
        if route == 0:  # a stream: Envoy and the client have only their idle timeouts
            assert sent is None, method
        else:
            assert sent == _about(route), (method, verb, path)


def test_a_streams_idle_limit_is_its_json_routes_by_default() -> None:
    config = yaml.safe_load(envoy_config.render(Ports(), "visior.pb"))
    idle = {
        route["match"]["path"]: route["route"].get("idle_timeout")
        for listener in config["static_resources"]["listeners"]
        for host in listener["filter_chains"][0]["filters"][0]["typed_config"]["route_config"][
            "virtual_hosts"
        ]
        for route in host["routes"]
        if "path" in route["match"]
    }
    client_idle = VisiorClient(TARGETS).stream_idle_timeout
    assert idle[call_budgets.GENERATE_STREAM.http_path] == f"{client_idle:g}s"
    assert VisiorClient(TARGETS, stream_idle_timeout=5.0).stream_idle_timeout == 5.0


@pytest.mark.parametrize("idle", [0.0, -1.0, float("nan")])
def test_a_stream_idle_limit_must_be_positive(idle: float) -> None:
    with pytest.raises(ValueError, match="stream_idle_timeout"):
        VisiorClient(TARGETS, stream_idle_timeout=idle)


def test_every_budget_names_real_rpcs_and_their_binding() -> None:
    bindings = _http_bindings()
    for budget in CALL_BUDGETS:
        for method in budget.grpc_methods:
            verb, path = bindings[method]
            assert path == budget.http_path, method
            assert budget.http_method in (None, verb.upper()), method
            assert grpc_method_timeout(method) == budget.timeout_s
        rules = [r for r in envoy_config.ROUTE_RULES if r.path == budget.http_path]
        assert [(r.method, r.timeout_s) for r in rules] == [(budget.http_method, budget.timeout_s)]
