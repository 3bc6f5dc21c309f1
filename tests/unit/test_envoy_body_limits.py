"""The body limits of Envoy's Respond and Generate routes hold every request their validators
take, as json.dumps writes it by default (ensure_ascii: a Cyrillic letter is six bytes), and
are the services' own constants; so do the services' default gRPC message limits."""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from google.protobuf import json_format
from visior.llm.v1 import llm_pb2
from visior.orchestrator.v1 import orchestrator_pb2

import services.devtools.envoy_config as envoy_config
import services.orchestrator.respond as respond
from services.common.document_limits import MAX_DOC_ID_CHARS
from services.common.generate_contract import MAX_MESSAGE_CHARS
from services.common.search_contract import MAX_FILTER_VALUES, MAX_QUERY_CHARS
from services.common.settings import Env
from services.common.topology import Ports
from services.llm import engine
from services.llm.config import LlmSettings
from services.llm.loop import LoopSettings
from services.llm.servicer import generate_input
from services.orchestrator.config import OrchestratorSettings
from services.orchestrator.servicer import respond_input

MiB = 1 << 20
RESPOND = "/internal/orchestrator/respond"
GENERATE = "/internal/llm/generate"
GENERATE_STREAM = "/internal/llm/generate:stream"


def _body_limits() -> dict[str, int]:
    """Each exact-path route's body limit in the rendered config: its own buffer limit, else
    the listener's; the transcoder of that listener must hold as much."""
    config = yaml.safe_load(envoy_config.render(Ports(), "visior.pb"))
    limits: dict[str, int] = {}
    for listener in config["static_resources"]["listeners"]:
        hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
        filters = {f["name"]: f["typed_config"] for f in hcm["http_filters"]}
        default = filters["envoy.filters.http.buffer"]["max_request_bytes"]
        transcoder = filters["envoy.filters.http.grpc_json_transcoder"]["max_request_body_size"]
        for route in hcm["route_config"]["virtual_hosts"][0]["routes"]:
            if "path" not in route["match"]:
                continue
            per_route = route.get("typed_per_filter_config", {}).get("envoy.filters.http.buffer")
            limit = per_route["buffer"]["max_request_bytes"] if per_route else default
            assert limit <= transcoder
            limits.setdefault(route["match"]["path"], limit)
    return limits


def _ids(prefix: str) -> list[str]:
    """MAX_FILTER_VALUES distinct ids of MAX_DOC_ID_CHARS Cyrillic characters."""
    return [f"{prefix}{i:03d}".ljust(MAX_DOC_ID_CHARS, "д") for i in range(MAX_FILTER_VALUES)]


def _respond_at_every_limit() -> dict[str, Any]:
    return {
        "query": "я" * MAX_QUERY_CHARS,
        "user": {"tenant_id": "tenant-1", "user_id": "user-1", "roles": ["analyst"]},
        "channel": "web",
        "locale": "ru-RU",
        "filters": {
            "product": "продукт",
            "tags": _ids("t"),
            "doc_ids": _ids("d"),
            "section_ids": _ids("s"),
        },
        "doc_ids": _ids("d"),
        "section_ids": _ids("s"),
        "max_results": 50,
        "history": [
            {"role": ("user", "assistant")[i % 2], "content": "ж" * MAX_MESSAGE_CHARS}
            for i in range(respond.MAX_HISTORY_TURNS)
        ],
    }


def _schema_of(utf8_bytes: int) -> dict[str, Any]:
    """A response schema of exactly `utf8_bytes` as the LLM service measures it."""
    schema: dict[str, Any] = {"type": "object", "description": ""}
    room = utf8_bytes - len(json.dumps(schema, ensure_ascii=False).encode())
    schema["description"] = "щ" * (room // 2) + "x" * (room % 2)
    assert len(json.dumps(schema, ensure_ascii=False).encode()) == utf8_bytes
    return schema


def _generate_at_every_limit() -> dict[str, Any]:
    return {
        "mode": "rag",
        "system_prompt": "Отвечай по документам. " * 20,
        "messages": [
            {"role": ("user", "assistant")[(i + 1) % 2], "content": "ж" * MAX_MESSAGE_CHARS}
            for i in range(engine.MAX_MESSAGES)
        ],
        "context_chunks": [
            {"doc_id": f"doc-{i}", "section_id": f"sec-{i}", "text": "ц" * 1000, "score": 0.5}
            for i in range(engine.MAX_CONTEXT_CHUNKS)
        ],
        "generation_params": {
            "max_tokens": 100,
            "stop": ["стоп"] * engine.MAX_STOP_SEQUENCES,
            "response_schema": _schema_of(engine.MAX_RESPONSE_SCHEMA_BYTES),
        },
        "user": {"tenant_id": "tenant-1", "user_id": "user-1"},
        "answer_language": "ru",
    }


def test_a_respond_at_every_validator_limit_fits_the_respond_route() -> None:
    body = json.dumps(_respond_at_every_limit())  # ensure_ascii, json.dumps' default
    limit = _body_limits()[RESPOND]
    assert len(body.encode()) > 3 * envoy_config.DEFAULT_MAX_REQUEST_BYTES
    assert len(body.encode()) <= limit == respond.RESPOND_MAX_REQUEST_BYTES
    message = json_format.Parse(body, orchestrator_pb2.RespondRequest())
    respond.validate(respond_input(message))  # the Orchestrator takes it
    assert message.ByteSize() <= OrchestratorSettings.from_env(Env({})).server.max_message_bytes
    # One byte past the route's limit is Envoy's 413: tests/e2e/test_bad_input.py sends it.


def test_a_generate_at_every_validator_limit_fits_both_generate_routes() -> None:
    body = json.dumps(_generate_at_every_limit())
    limits = _body_limits()
    assert limits[GENERATE] == limits[GENERATE_STREAM] == engine.GENERATE_MAX_REQUEST_BYTES
    assert 3 * envoy_config.DEFAULT_MAX_REQUEST_BYTES < len(body.encode()) <= limits[GENERATE]
    message = json_format.Parse(body, llm_pb2.GenerateRequest())
    # the LLM service takes it; generate:stream's body is the same GenerateRequest (its
    # binding's `body: "request"`)
    engine.validate(generate_input(message), LoopSettings())
    # Two bytes a Cyrillic letter in proto: more than grpc's default 4 MiB, within the
    # LLM service's own limit.
    limit = LlmSettings.from_env(Env({})).server.max_message_bytes
    assert 4 * MiB < message.ByteSize() <= limit


def test_raw_utf8_of_any_script_fits_at_every_limit() -> None:
    """Sent as raw UTF-8, even characters beyond the BMP (four bytes each) fit."""
    body = _respond_at_every_limit()
    body["query"] = "𠀀" * MAX_QUERY_CHARS
    for turn in body["history"]:
        turn["content"] = "𠀀" * MAX_MESSAGE_CHARS
    assert len(json.dumps(body, ensure_ascii=False).encode()) <= _body_limits()[RESPOND]


@pytest.fixture
def reloaded() -> Iterator[pytest.MonkeyPatch]:
    """A MonkeyPatch for the services' limits; envoy_config is reloaded on them, then on the
    real ones again."""
    with pytest.MonkeyPatch.context() as patch:
        yield patch
    importlib.reload(envoy_config)


def test_the_routes_take_the_services_limits(reloaded: pytest.MonkeyPatch) -> None:
    reloaded.setattr(respond, "RESPOND_MAX_REQUEST_BYTES", respond.RESPOND_MAX_REQUEST_BYTES + 7)
    reloaded.setattr(engine, "GENERATE_MAX_REQUEST_BYTES", engine.GENERATE_MAX_REQUEST_BYTES + 9)
    importlib.reload(envoy_config)
    limits = _body_limits()
    assert limits[RESPOND] == respond.RESPOND_MAX_REQUEST_BYTES
    assert limits[GENERATE] == limits[GENERATE_STREAM] == engine.GENERATE_MAX_REQUEST_BYTES
