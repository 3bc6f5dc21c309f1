"""The Orchestrator and the LLM service take over gRPC every message as large as the body
Envoy lets through their JSON routes: their default message limit is that route's body limit,
so such a body reaches the validator (a 400 naming the field) rather than grpc's bare
RESOURCE_EXHAUSTED, which Envoy turns into a 429 without ErrorInfo."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from services.common.call_budgets import GENERATE, GENERATE_STREAM, RESPOND
from services.common.server import server_options
from services.common.settings import Env, ServerSettings, server_fields, server_var
from services.common.topology import SERVICE_BY_KEY, Ports
from services.devtools.envoy_config import ROUTE_MAX_REQUEST_BYTES
from services.llm.config import LlmSettings
from services.orchestrator.config import OrchestratorSettings
from services.toolsproxy.config import ToolsProxySettings

MiB = 1 << 20
SLACK = 64
"""How far below the route's body limit the message sent is."""


LOADERS: dict[str, Callable[[Env], OrchestratorSettings | LlmSettings | ToolsProxySettings]] = {
    "orchestrator": OrchestratorSettings.from_env,
    "llm": LlmSettings.from_env,
    "toolsproxy": ToolsProxySettings.from_env,
}


def _server(key: str, environ: dict[str, str] | None = None) -> ServerSettings:
    """The server settings service `key` starts with in `environ`."""
    return LOADERS[key](Env(environ or {})).server


ROUTE_LIMITS = {
    "orchestrator": ROUTE_MAX_REQUEST_BYTES[RESPOND],
    "llm": ROUTE_MAX_REQUEST_BYTES[GENERATE],
}


async def _send(settings: ServerSettings, size: int) -> int:
    """Send a `size`-byte message to an in-process server with `settings`' grpc options; the
    size it received."""

    async def take(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return len(request).to_bytes(8, "big")

    server = grpc.aio.server(options=server_options(settings))
    handler = grpc.unary_unary_rpc_method_handler(take)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("toy.Sink", {"Take": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = await channel.unary_unary("/toy.Sink/Take")(b"x" * size, timeout=60)
    finally:
        await server.stop(0)
    return int.from_bytes(reply, "big")


@pytest.mark.parametrize("key", ["orchestrator", "llm"])
def test_the_default_message_limit_is_the_routes_body_limit(key: str) -> None:
    assert ROUTE_LIMITS[key] > 4 * MiB
    assert _server(key).max_message_bytes == ROUTE_LIMITS[key]


def test_both_generate_routes_have_one_limit() -> None:
    assert ROUTE_MAX_REQUEST_BYTES[GENERATE_STREAM] == ROUTE_MAX_REQUEST_BYTES[GENERATE]


@pytest.mark.parametrize("key", ["orchestrator", "llm"])
async def test_the_server_takes_a_message_just_under_the_routes_body_limit(key: str) -> None:
    size = ROUTE_LIMITS[key] - SLACK
    assert await _send(_server(key), size) == size


async def test_one_byte_over_the_limit_is_resource_exhausted() -> None:
    settings = _server("orchestrator")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _send(settings, settings.max_message_bytes + 1)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.parametrize(
    ("key", "name"),
    [("orchestrator", "ORCH_MAX_MESSAGE_BYTES"), ("llm", "LLM_SERVICE_MAX_MESSAGE_BYTES")],
)
def test_the_setting_overrides_the_default(key: str, name: str) -> None:
    assert _server(key, {name: "2000000"}).max_message_bytes == 2_000_000


def test_toolsproxy_keeps_the_field_default() -> None:
    default = ServerSettings("toolsproxy").max_message_bytes
    assert default == 4 * MiB
    assert _server("toolsproxy").max_message_bytes == default


@pytest.mark.parametrize("key", sorted(LOADERS))
def test_the_documented_default_is_the_services_where_it_gives_one(key: str) -> None:
    """docs/configuration.md shows the field's default unless the setting's default_doc says
    otherwise: it does exactly where the service gives its own."""
    fields = server_fields(SERVICE_BY_KEY[key].env_prefix, Ports().grpc[key])
    var = fields.vars["max_message_bytes"]
    own = _server(key).max_message_bytes != ServerSettings(key).max_message_bytes
    assert bool(var.default_doc) == own


@pytest.mark.parametrize("key", ["orchestrator", "llm"])
def test_a_launcher_reads_the_service_setting_beside_the_service(key: str) -> None:
    """A launcher that knows only the key (the mesh, for ports and grace) and the service
    itself declare one setting: neither is refused as a second, different declaration."""
    name = server_var(key, "max_message_bytes")
    environ = {name: "5000000", server_var(key, "grace_seconds"): "7"}
    service, launcher = _server(key, environ), ServerSettings.for_service(key, Env(environ))
    assert (launcher.port, launcher.grace_seconds) == (service.port, service.grace_seconds)
    # Both read the one variable; only its default is the service's own.
    assert launcher.max_message_bytes == service.max_message_bytes == 5_000_000
    assert _server(key).max_message_bytes == ROUTE_LIMITS[key]
