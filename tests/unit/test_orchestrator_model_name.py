"""The model name has one rule (generate_contract.is_model_name) for a Generate's `model` and
the Orchestrator's default_model; a model the LLM service refuses reaches a Respond's caller
as the deployment's failure (502), never as the Orchestrator's own bad request (500)."""

from __future__ import annotations

import grpc
import pytest
from prometheus_client import CollectorRegistry
from visior.llm.v1 import llm_pb2, llm_pb2_grpc

from services.common import errors
from services.common.generate_contract import MAX_MODEL_CHARS, User
from services.common.interceptors import ServerInterceptor
from services.common.metrics import RpcMetrics
from services.common.settings import Env, SettingsError
from services.orchestrator.clients import GrpcGenerator
from services.orchestrator.config import OrchestratorSettings
from services.orchestrator.model import LlmRequest
from services.orchestrator.runtime_config import ConfigHolder, ConfigUpdate, RuntimeConfig


@pytest.mark.parametrize("name", ["qwen 2.5", "qwen\t2.5", " qwen", "m" * (MAX_MODEL_CHARS + 1)])
def test_a_default_model_the_llm_service_would_refuse_is_refused_where_it_is_set(name):
    holder = ConfigHolder(RuntimeConfig(), 3)
    with pytest.raises(errors.InvalidArgumentError) as info:
        holder.update(ConfigUpdate(default_model=name))
    assert info.value.metadata == {"field": "default_model"}
    if name.strip() == name:  # the environment's values are read trimmed
        with pytest.raises(SettingsError, match="ORCH_DEFAULT_MODEL"):
            OrchestratorSettings.from_env(Env({"ORCH_DEFAULT_MODEL": name}))


def test_a_model_name_as_runtimes_spell_them_is_taken():
    holder = ConfigHolder(RuntimeConfig(), 3)
    for name in ("org/Qwen2.5-1.5B-Instruct:q4", "m" * MAX_MODEL_CHARS, ""):
        assert holder.update(ConfigUpdate(default_model=name)).default_model == name


class RefusesTheModel(llm_pb2_grpc.LlmServiceServicer):
    async def Generate(self, request, context):
        raise errors.invalid("model", f"the model runtime serves no model {request.model!r}")


async def test_a_model_the_llm_service_refuses_is_a_502_naming_it():
    server = grpc.aio.server(
        interceptors=[ServerInterceptor("visior.llm", RpcMetrics(CollectorRegistry()))]
    )
    llm_pb2_grpc.add_LlmServiceServicer_to_server(RefusesTheModel(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        request = LlmRequest(
            "system", (), (), User("t1", "u1"), (), (0,), 0, 8192, "qwen-typo", "tr"
        )
        with pytest.raises(errors.UnavailableError) as info:
            await GrpcGenerator(channel, 60.0).generate(request)
        assert info.value.reason == "LLM_RUNTIME_ERROR"
        assert info.value.metadata == {"downstream": "llm", "model": "qwen-typo"}
        assert "ORCH_DEFAULT_MODEL" in info.value.message
    finally:
        await channel.close()
        await server.stop(0)


class Withholds(llm_pb2_grpc.LlmServiceServicer):
    async def Generate(self, request, context):
        response = llm_pb2.GenerateResponse(answer="Документы не отвечают.")
        response.meta.withheld_for.extend(["Kubernetes", "Helm"])
        return response


async def test_the_llm_services_withheld_names_reach_the_outcome():
    server = grpc.aio.server()
    llm_pb2_grpc.add_LlmServiceServicer_to_server(Withholds(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        request = LlmRequest("system", (), (), User("t1", "u1"), (), (0,), 0, 8192, "", "tr")
        outcome = await GrpcGenerator(channel, 60.0).generate(request)
        assert outcome.withheld_for == ("Kubernetes", "Helm")
    finally:
        await channel.close()
        await server.stop(0)
