"""Bounds of the server and downstream settings: a timeout past grpc's deadline range, a
drain or grace that never ends, a message limit no request fits, and ToolsProxy's message
limit below its own largest result are refused at load, naming the settings."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from services.common.channels import open_channel
from services.common.settings import (
    MAX_DRAIN_SECONDS,
    MAX_GRACE_SECONDS,
    MAX_TIMEOUT_SECONDS,
    MIN_MESSAGE_BYTES,
    DownstreamSettings,
    Env,
    SettingsError,
)
from services.common.shared_config import DEFAULT_FULL_TEXT_BYTES
from services.llm.config import LlmSettings
from services.orchestrator.config import OrchestratorSettings
from services.retrieval.config import RetrievalSettings
from services.toolsproxy.config import RESULT_ENVELOPE_BYTES, ToolsProxySettings

LOADERS: dict[str, Callable[[Env], Any]] = {
    "ORCH_": OrchestratorSettings.from_env,
    "LLM_SERVICE_": LlmSettings.from_env,
    "RETR_": RetrievalSettings.from_env,
    "MCP_PROXY_": ToolsProxySettings.from_env,
}


def _load(prefix: str, environ: dict[str, str]) -> Any:
    return LOADERS[prefix](Env(environ))


# -- timeouts: at most a day, far below grpc's overflow (~9.2e9 s) ----------------------------

DOWNSTREAM_TIMEOUTS = [
    ("ORCH_", "ORCH_RETRIEVAL_TIMEOUT_SECONDS", lambda s: s.retrieval.timeout_seconds),
    ("ORCH_", "ORCH_LLM_TIMEOUT_SECONDS", lambda s: s.llm.timeout_seconds),
    ("LLM_SERVICE_", "LLM_SERVICE_MCP_TIMEOUT_SECONDS", lambda s: s.tools_proxy.timeout_seconds),
    ("MCP_PROXY_", "MCP_PROXY_RETRIEVAL_TIMEOUT_SECONDS", lambda s: s.retrieval.timeout_seconds),
]


@pytest.mark.parametrize(("prefix", "name", "read"), DOWNSTREAM_TIMEOUTS)
def test_a_downstream_timeout_is_at_most_a_day(prefix: str, name: str, read) -> None:
    assert MAX_TIMEOUT_SECONDS == 86_400
    assert read(_load(prefix, {name: "86400"})) == MAX_TIMEOUT_SECONDS
    for past in ("86400.001", "1e10"):
        with pytest.raises(SettingsError, match=rf"^{name}=.* above the maximum 86400"):
            _load(prefix, {name: past})


@pytest.mark.parametrize(
    ("prefix", "name"),
    [
        ("LLM_SERVICE_", "LLM_SERVICE_WATCHDOG_SECONDS"),
        ("LLM_SERVICE_", "LLM_SERVICE_EXTERNAL_TOOL_TIMEOUT_S"),
        ("LLM_SERVICE_", "LLM_RUNTIME_TIMEOUT_S"),
        ("RETR_", "RETR_INDEX_TIMEOUT_S"),
        ("RETR_", "RETR_EMBEDDING_TIMEOUT_S"),
        ("RETR_", "RERANK_TIMEOUT_S"),
    ],
)
def test_the_other_call_timeouts_are_at_most_a_day_too(prefix: str, name: str, tmp_path) -> None:
    base = {"VISIOR_DATA_DIR": str(tmp_path)}
    _load(prefix, {**base, name: "86400"})
    with pytest.raises(SettingsError, match=rf"^{name}=.* above the maximum 86400"):
        _load(prefix, {**base, name: "86400.5"})


async def _reply(channel: grpc.aio.Channel) -> bytes:
    reply: bytes = await channel.unary_unary("/toy.T/T")(b"")
    return reply


async def test_a_call_with_the_longest_timeout_is_answered() -> None:
    """A day is a deadline grpc takes (from ~9.2e9 s on, every call fails at once with
    DEADLINE_EXCEEDED): the longest timeout reaches the server."""

    async def take(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return b"%d" % round(context.time_remaining())

    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(take)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("toy.T", {"T": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = open_channel(DownstreamSettings(f"127.0.0.1:{port}", MAX_TIMEOUT_SECONDS, 1), 1 << 20)
    try:
        # In a fresh context: no caller's deadline, which another test may have left set.
        reply = asyncio.create_task(_reply(channel), context=contextvars.Context())
        left = int(await reply)
    finally:
        await channel.close()
        await server.stop(0)
    # grpc-core's grpc-timeout encoding "may round up" (timeout_encoding.h): a day the clock
    # carried a hair past 86,400 s arrived as 86,500 s.
    assert MAX_TIMEOUT_SECONDS - 60 < left <= MAX_TIMEOUT_SECONDS + 100


# -- drain and grace: at most an hour ------------------------------------------------------


@pytest.mark.parametrize("prefix", sorted(LOADERS))
@pytest.mark.parametrize(
    ("what", "limit"), [("DRAIN_SECONDS", MAX_DRAIN_SECONDS), ("GRACE_SECONDS", MAX_GRACE_SECONDS)]
)
def test_drain_and_grace_are_at_most_an_hour(prefix: str, what: str, limit: float, tmp_path):
    assert limit == 3600
    base = {"VISIOR_DATA_DIR": str(tmp_path)}
    server = _load(prefix, {**base, prefix + what: "3600"}).server
    assert getattr(server, what.lower()) == limit
    for past in ("3600.001", "1e308"):
        with pytest.raises(SettingsError, match=rf"^{prefix}{what}=.* above the maximum 3600"):
            _load(prefix, {**base, prefix + what: past})


# -- message limits: every default message fits ------------------------------------------


@pytest.mark.parametrize("prefix", ["ORCH_", "LLM_SERVICE_"])
def test_a_message_limit_below_the_largest_default_message_is_refused(prefix: str) -> None:
    name = prefix + "MAX_MESSAGE_BYTES"
    assert _load(prefix, {name: str(MIN_MESSAGE_BYTES)}).server.max_message_bytes == (
        MIN_MESSAGE_BYTES
    )
    for small in (MIN_MESSAGE_BYTES - 1, 16384, 4096, 1024):
        with pytest.raises(SettingsError, match=rf"^{name}={small} is below the minimum"):
            _load(prefix, {name: str(small)})


def test_toolsproxys_message_limit_holds_its_largest_result() -> None:
    name = "MCP_PROXY_MAX_MESSAGE_BYTES"
    least = DEFAULT_FULL_TEXT_BYTES + RESULT_ENVELOPE_BYTES
    assert _load("MCP_PROXY_", {name: str(least)}).server.max_message_bytes == least
    with pytest.raises(
        SettingsError,
        match=rf"^{name}={least - 1} .*MCP_PROXY_MAX_FULL_TEXT_BYTES={DEFAULT_FULL_TEXT_BYTES}",
    ):
        _load("MCP_PROXY_", {name: str(least - 1)})
    with pytest.raises(SettingsError, match=rf"^{name}={MIN_MESSAGE_BYTES - 1} is below"):
        _load("MCP_PROXY_", {name: str(MIN_MESSAGE_BYTES - 1)})


def test_toolsproxys_message_limit_holds_the_larger_of_its_two_text_limits() -> None:
    environ = {"MCP_PROXY_MAX_FULL_TEXT_BYTES": "256", "MCP_PROXY_MAX_TEXT_BYTES": str(1 << 20)}
    least = (1 << 20) + RESULT_ENVELOPE_BYTES
    name = "MCP_PROXY_MAX_MESSAGE_BYTES"
    assert _load("MCP_PROXY_", {**environ, name: str(least)}).server.max_message_bytes == least
    with pytest.raises(SettingsError, match=rf"^{name}=.*MCP_PROXY_MAX_TEXT_BYTES={1 << 20}"):
        _load("MCP_PROXY_", {**environ, name: str(least - 1)})
    # At their lowest, the envelope still holds: the general minimum never binds here.
    low = {"MCP_PROXY_MAX_FULL_TEXT_BYTES": "256", "MCP_PROXY_MAX_TEXT_BYTES": "256"}
    least = 256 + RESULT_ENVELOPE_BYTES
    assert least > MIN_MESSAGE_BYTES
    assert _load("MCP_PROXY_", {**low, name: str(least)}).server.max_message_bytes == least
    with pytest.raises(SettingsError, match=rf"^{name}={least - 1} cannot hold"):
        _load("MCP_PROXY_", {**low, name: str(least - 1)})


def test_the_largest_settings_fit_toolsproxys_default_message_limit() -> None:
    """The defaults are consistent: the largest whole read fits the default limit."""
    settings = _load("MCP_PROXY_", {"MCP_PROXY_MAX_FULL_TEXT_BYTES": str(3 << 20)})
    assert settings.limits.max_full_text_bytes + RESULT_ENVELOPE_BYTES <= (
        settings.server.max_message_bytes
    )
