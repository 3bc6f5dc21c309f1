"""Bad input against the real mesh, over JSON through Envoy and over gRPC: never a 5xx.

Malformed bodies (not JSON, trailing garbage, an array, NaN literals, invalid UTF-8,
deep nesting), wrong types, unknown fields, huge numbers, oversized bodies and messages,
on every service's routes (Search, Ingest, Delete, Respond, config, Generate, the stream,
Execute). Each gets its documented answer: HTTP 400 with the google.rpc.Status JSON body
(domain `envoy` when the transcoder refuses, `visior.<service>` when a server's validation
does, naming the field), 413 past the body limit, INVALID_ARGUMENT or RESOURCE_EXHAUSTED on
gRPC. At the end every process is alive and no server logged an error.

What the transcoder is lenient about is pinned here too (documented in envoy/README.md
and docs/transcoding.md): unknown body fields are dropped (servers validate what they need), a
single value where a list is expected is a one-item list, numbers may be JSON strings,
`null` is "unset", bools accept "true"/"yes"/"1"-style strings, and the Content-Type
header is not looked at: any body that is not gRPC is read as JSON. A request whose
Content-Type says gRPC (application/grpc...) is refused: the JSON listener takes no gRPC.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import struct_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from visior.common.v1 import common_pb2
from visior.llm.v1 import llm_pb2
from visior.orchestrator.v1 import orchestrator_pb2
from visior.retrieval.v1 import retrieval_pb2
from visior.toolsproxy.v1 import toolsproxy_pb2

from services.common.settings import Env
from services.devtools.envoy_config import (
    DEFAULT_MAX_REQUEST_BYTES,
    INGEST_MAX_REQUEST_BYTES,
    ROUTE_MAX_REQUEST_BYTES,
)
from services.devtools.mesh import Mesh
from services.llm.config import LlmSettings
from services.orchestrator.config import OrchestratorSettings
from services.toolsproxy.config import ToolsProxySettings
from tests.e2e.conftest import GRPC_SERVICE, LDAP_DOC, SERVICE_KEYS, TENANT, assert_error, log_lines

pytestmark = pytest.mark.e2e

TIMEOUT = 60.0
SCRATCH_TENANT = "bad-input-e2e"
USER = {"user_id": "bad-input-user", "tenant_id": SCRATCH_TENANT}
"""A tenant of its own: tool calls here use no other test's rate-limit budget."""
MARK = "@@MARK@@"
"""Placeholder in a string field, replaced by raw bytes after JSON encoding."""


@dataclass(frozen=True)
class Route:
    """One JSON route: where it lives, a body it accepts, a string field to corrupt."""

    key: str
    path: str
    good: dict[str, Any]
    text_field: tuple[str, ...]
    """Path (keys / list indexes) of a string field of `good`."""
    required: str = ""
    """The field an empty body is refused for (as ErrorInfo metadata names it)."""
    empty_reason: str = "INVALID_ARGUMENT"
    mutates: bool = field(default=False)
    """Accepting the good body changes shared state: only bad bodies are sent."""


ROUTES: dict[str, Route] = {
    r.path.rsplit("/", 2)[-2] + "/" + r.path.rsplit("/", 1)[-1]: r
    for r in (
        Route("retrieval", "/internal/retrieval/search",
              {"query": "LDAP", "tenant_id": TENANT, "max_results": 3}, ("query",), "tenant_id"),
        Route("retrieval", "/internal/retrieval/documents",
              {"tenant_id": SCRATCH_TENANT, "file_name": "notes.md",
               "content": base64.b64encode(b"# Notes\n\nBad input e2e.").decode()},
              ("file_name",), "tenant_id"),
        Route("retrieval", "/internal/retrieval/documents:delete",
              {"tenant_id": SCRATCH_TENANT, "doc_id": "no-such-doc"}, ("doc_id",), "tenant_id"),
        Route("orchestrator", "/internal/orchestrator/respond",
              {"query": "Как настроить LDAP интеграцию?", "user": USER}, ("query",), "tenant_id",
              "MISSING_USER_CONTEXT"),
        Route("orchestrator", "/internal/orchestrator/config", {"default_model": ""},
              ("default_model",), mutates=True),
        Route("llm", "/internal/llm/generate",
              {"messages": [{"role": "user", "content": "LDAP?"}]},
              ("messages", 0, "content"), "messages"),
        Route("llm", "/internal/llm/generate:stream",
              {"messages": [{"role": "user", "content": "LDAP?"}]},
              ("messages", 0, "content"), "messages"),
        Route("toolsproxy", "/internal/mcp/execute",
              {"tool_name": "read_doc_metadata", "arguments": {"doc_id": "notes"}, "user": USER},
              ("tool_name",), "tool_name"),
    )
}  # fmt: skip
ROUTE_NAMES = sorted(ROUTES)
SAFE_ROUTES = [n for n in ROUTE_NAMES if not ROUTES[n].mutates]
DOMAIN = {k: f"visior.{k}" for k in SERVICE_KEYS}


def url(mesh: Mesh, route: Route, query: str = "") -> str:
    return mesh.json_url(route.key) + route.path + query


def post(
    mesh: Mesh, name: str, body: bytes | dict[str, Any], headers: dict[str, str] | None = None
) -> httpx.Response:
    route = ROUTES[name]
    content = body if isinstance(body, bytes) else json.dumps(body, ensure_ascii=False).encode()
    return httpx.post(
        url(mesh, route),
        content=content,
        headers={"content-type": "application/json", **(headers or {})},
        timeout=TIMEOUT,
    )


def with_value(body: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """A deep copy of `body` with the value at `path` set (missing objects on the way made)."""
    out = json.loads(json.dumps(body))
    target = out
    for key in path[:-1]:
        target = target.setdefault(key, {}) if isinstance(target, dict) else target[key]
    target[path[-1]] = value
    return out


def with_raw(route: Route, raw: bytes) -> bytes:
    """The route's good body as JSON bytes with its text field's value replaced by `raw`."""
    text = json.dumps(with_value(route.good, route.text_field, MARK)).encode()
    return text.replace(json.dumps(MARK).encode(), raw, 1)


def assert_envoy_400(r: httpx.Response) -> None:
    assert_error(r, 400, "INVALID_ARGUMENT", domain="envoy")


def assert_server_400(r: httpx.Response, key: str, reason: str, field_name: str) -> dict[str, Any]:
    info = assert_error(r, 400, reason, domain=DOMAIN[key])
    assert info["metadata"]["field"] == field_name, info
    return info


# --- the mesh stays healthy through all of it ---------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def no_errors_logged(mesh: Mesh) -> Iterator[None]:
    """Whatever this module sends, no server logs an error (an unhandled exception); the
    orchestrator's runtime config (shared by the session) is as it was."""
    before = {k: len(log_lines(mesh, k)) for k in SERVICE_KEYS}
    config = mesh.json_url("orchestrator") + "/internal/orchestrator/config"
    saved = httpx.get(config, timeout=TIMEOUT).json()
    yield
    now = httpx.get(config, timeout=TIMEOUT).json()
    httpx.post(config, json=saved, timeout=TIMEOUT)
    assert now == saved, "a bad request changed the runtime config"
    for key in SERVICE_KEYS:
        errors = [e for e in log_lines(mesh, key)[before[key] :] if e.get("level") == "error"]
        assert not errors, f"{key} logged errors: {errors[:3]}"
    assert all(mesh.alive().values()), mesh.alive()


# --- malformed bodies ---------------------------------------------------------------------

MALFORMED: dict[str, Any] = {
    "not_json": lambda r: b"hello",
    "truncated": lambda r: json.dumps(r.good).encode()[:-1],
    "trailing_garbage": lambda r: json.dumps(r.good).encode() + b" garbage",
    "two_objects": lambda r: json.dumps(r.good).encode() + b"{}",
    "array": lambda r: json.dumps([r.good]).encode(),
    "empty_array": lambda r: b"[]",
    "string": lambda r: b'"hello"',
    "number": lambda r: b"42",
    "null": lambda r: b"null",
    "nan_literal": lambda r: json.dumps(r.good).encode()[:-1] + b', "x": NaN}',
    "infinity_literal": lambda r: json.dumps(r.good).encode()[:-1] + b', "x": -Infinity}',
    "comment": lambda r: b"/* c */" + json.dumps(r.good).encode(),
    "bom": lambda r: b"\xef\xbb\xbf" + json.dumps(r.good).encode(),
    "invalid_utf8_outside_strings": lambda r: json.dumps(r.good).encode()[:-1] + b", \xff}",
    "invalid_utf8_in_a_key": lambda r: json.dumps(r.good).encode()[:-1] + b', "\xc3\x28": 1}',
    "invalid_utf8_in_a_string": lambda r: with_raw(r, b'"ab\xc3\x28cd"'),
    "overlong_utf8_in_a_string": lambda r: with_raw(r, b'"\xc0\xaf"'),
    "utf16_surrogate_bytes": lambda r: with_raw(r, b'"\xed\xa0\x80"'),
    "lone_surrogate_escape": lambda r: with_raw(r, b'"ab\\ud800cd"'),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
@pytest.mark.parametrize("name", ROUTE_NAMES)
def test_malformed_body_is_400_from_envoy(mesh: Mesh, name: str, case: str) -> None:
    r = post(mesh, name, MALFORMED[case](ROUTES[name]))
    if (name, case) == ("llm/generate:stream", "null"):
        # The stream's body is its `request` field: null leaves it unset.
        assert_server_400(r, "llm", "INVALID_ARGUMENT", "request")
    else:
        assert_envoy_400(r)


def test_lenient_json_syntax_is_read_as_json(mesh: Mesh) -> None:
    # Pinned: Envoy's JSON parser takes single quotes, raw control characters in strings
    # and unknown escapes (\x -> x). What it makes of them is validated like any value.
    route = ROUTES["retrieval/search"]
    for raw in (
        json.dumps(route.good).encode().replace(b'"', b"'"),
        with_raw(route, b'"LD\x01AP"'),
        with_raw(route, b'"LD\\xAP"'),
    ):
        r = post(mesh, "retrieval/search", raw)
        assert r.status_code == 200, (raw, r.text)


@pytest.mark.parametrize("name", SAFE_ROUTES)
def test_the_good_bodies_are_accepted(mesh: Mesh, name: str) -> None:
    # The baseline the malformed variants are made from: without it a 400 proves nothing.
    r = post(mesh, name, ROUTES[name].good)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("name", [n for n in ROUTE_NAMES if ROUTES[n].required])
def test_empty_body_is_the_servers_400_naming_the_field(mesh: Mesh, name: str) -> None:
    # An empty body is an empty message to the transcoder: every field unset.
    route = ROUTES[name]
    r = post(mesh, name, b"")
    assert_server_400(r, route.key, route.empty_reason, route.required)


def test_empty_config_update_changes_nothing(mesh: Mesh) -> None:
    before = httpx.get(url(mesh, ROUTES["orchestrator/config"]), timeout=TIMEOUT).json()
    r = post(mesh, "orchestrator/config", b"")
    assert r.status_code == 200, r.text
    assert r.json() == before


# --- Content-Type -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    # The last two look like gRPC but are not to Envoy: read as JSON like the rest.
    ["text/plain", "application/xml", "application/json; charset=latin-1", None,
     "application/grpc-web", "Application/GRPC"],
)  # fmt: skip
@pytest.mark.parametrize("name", ["retrieval/search", "mcp/execute", "llm/generate"])
def test_content_type_is_not_looked_at(mesh: Mesh, name: str, content_type: str | None) -> None:
    route = ROUTES[name]
    headers = {} if content_type is None else {"content-type": content_type}
    r = httpx.post(url(mesh, route), content=json.dumps(route.good).encode(), headers=headers,
                   timeout=TIMEOUT)  # fmt: skip
    assert r.status_code == 200, r.text


def test_a_form_body_is_400(mesh: Mesh) -> None:
    r = post(mesh, "retrieval/search", b"query=LDAP&tenant_id=demo",
             {"content-type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert_envoy_400(r)


GRPC_TYPES = ["application/grpc", "application/grpc+proto", "application/grpc+json"]
"""What Envoy takes for a gRPC request: refused in gRPC, as UNIMPLEMENTED."""


def assert_grpc_refused(mesh: Mesh, r: httpx.Response, key: str) -> None:
    """A gRPC trailers-only UNIMPLEMENTED naming the service's gRPC port; never passed on."""
    assert r.status_code == 200 and r.headers["content-type"] == "application/grpc", r.headers
    assert r.headers["grpc-status"] == str(grpc.StatusCode.UNIMPLEMENTED.value[0]), r.headers
    assert f"own port {mesh.ports.grpc[key]} " in r.headers["grpc-message"], r.headers


@pytest.mark.parametrize("content_type", GRPC_TYPES)
@pytest.mark.parametrize("name", ["retrieval/search", "mcp/execute", "llm/generate"])
def test_a_json_body_claiming_to_be_grpc_is_unimplemented_not_unavailable(
    mesh: Mesh, name: str, content_type: str
) -> None:
    # The transcoder passes application/grpc* through as gRPC. Routed on, JSON in it made
    # the server reset the stream, read by the caller as UNAVAILABLE (retried: an outage).
    r = post(mesh, name, json.dumps(ROUTES[name].good).encode(), {"content-type": content_type})
    assert_grpc_refused(mesh, r, ROUTES[name].key)


def test_a_grpc_message_on_a_json_path_is_unimplemented(mesh: Mesh) -> None:
    message = retrieval_pb2.SearchRequest(query="LDAP", tenant_id=TENANT).SerializeToString()
    frame = b"\x00" + struct.pack(">I", len(message)) + message
    r = post(
        mesh, "retrieval/search", frame, {"content-type": "application/grpc", "te": "trailers"}
    )
    assert_grpc_refused(mesh, r, "retrieval")


@pytest.mark.parametrize("size", [1024, DEFAULT_MAX_REQUEST_BYTES + 1])
def test_a_grpc_call_on_the_json_listener_is_refused_on_its_headers_whatever_its_size(
    mesh: Mesh, size: int
) -> None:
    """Past the JSON body limit too: the refusal does not read the body (the buffer filter
    is off for it), so no 413, which a gRPC caller would read as UNKNOWN."""
    options = [("grpc.max_send_message_length", 8 << 20)]
    with grpc.insecure_channel(f"127.0.0.1:{mesh.ports.http['retrieval']}", options) as channel:
        call = channel.unary_unary(
            f"/{GRPC_SERVICE['retrieval']}/Search",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        with pytest.raises(grpc.RpcError) as err:
            call(b"\x0a" + b"x" * size, timeout=10)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED, err.value
    assert f"own port {mesh.ports.grpc['retrieval']} " in (err.value.details() or ""), err.value


@pytest.mark.parametrize("key", SERVICE_KEYS)
def test_a_grpc_client_pointed_at_the_json_listener_is_told_where_to_go(
    mesh: Mesh, key: str
) -> None:
    """A real gRPC client (grpcio, HTTP/2) calling GetHealth on the sidecar's port instead
    of the service's: UNIMPLEMENTED at once, naming the port, not an outage."""
    with grpc.insecure_channel(f"127.0.0.1:{mesh.ports.http[key]}") as channel:
        call = channel.unary_unary(
            f"/{GRPC_SERVICE[key]}/GetHealth",
            request_serializer=lambda _: b"",  # every GetHealthRequest is empty
            response_deserializer=lambda b: b,
        )
        with pytest.raises(grpc.RpcError) as err:
            call(None, timeout=10)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED, err.value
    assert f"own port {mesh.ports.grpc[key]} " in (err.value.details() or ""), err.value


# --- wrong types --------------------------------------------------------------------------

WRONG_TYPES: list[tuple[str, tuple[Any, ...], Any]] = [
    ("retrieval/search", ("query",), 123),
    ("retrieval/search", ("query",), ["LDAP"]),
    ("retrieval/search", ("query",), {"text": "LDAP"}),
    ("retrieval/search", ("max_results",), "many"),
    ("retrieval/search", ("max_results",), 5.5),
    ("retrieval/search", ("max_results",), True),
    ("retrieval/search", ("max_results",), [5]),
    ("retrieval/search", ("filters",), "user"),
    ("retrieval/search", ("filters",), [1]),
    ("retrieval/search", ("filters",), {"doc_ids": {"a": 1}}),
    ("retrieval/search", ("filters",), {"tags": [1, 2]}),
    ("retrieval/search", ("params",), "fast"),
    ("retrieval/search", ("params",), {"enable_hybrid": "maybe"}),
    ("retrieval/search", ("params",), {"enable_hybrid": 1}),
    ("retrieval/search", ("params",), {"min_score": "high"}),
    ("retrieval/search", ("params",), {"max_docs": "ten"}),
    ("retrieval/documents", ("content",), "not base64!!"),
    ("retrieval/documents", ("content",), 5),
    ("retrieval/documents", ("tags",), {"a": 1}),
    ("retrieval/documents", ("metadata",), ["x"]),
    ("retrieval/documents", ("metadata",), {"k": 5}),
    ("retrieval/documents:delete", ("doc_id",), {"id": 1}),
    ("orchestrator/respond", ("user",), "u1"),
    ("orchestrator/respond", ("user",), 5),
    ("orchestrator/respond", ("history",), "hi"),
    ("orchestrator/respond", ("max_results",), {}),
    ("orchestrator/respond", ("doc_ids",), {"a": 1}),
    ("orchestrator/config", ("max_tool_steps",), "many"),
    ("orchestrator/config", ("mock_mode",), "maybe"),
    ("orchestrator/config", ("mock_mode",), 1),
    ("orchestrator/config", ("window_radius",), [1]),
    ("llm/generate", ("messages",), "hi"),
    ("llm/generate", ("messages", 0), "hi"),
    ("llm/generate", ("generation_params",), {"temperature": "hot"}),
    ("llm/generate", ("tool_policy",), {"max_tool_steps": []}),
    ("llm/generate", ("tool_policy",), {"planned_calls": [{"tool_name": "x", "arguments": [1]}]}),
    ("llm/generate:stream", ("messages",), 7),
    ("mcp/execute", ("arguments",), [1, 2]),
    ("mcp/execute", ("arguments",), "doc_id=x"),
    ("mcp/execute", ("tool_name",), {}),
    ("mcp/execute", ("user",), 5),
    ("mcp/execute", ("user",), {"tenant_id": ["demo"]}),
]


@pytest.mark.parametrize(
    ("name", "path", "value"), WRONG_TYPES, ids=[f"{n}-{'.'.join(map(str, p))}-{i}"
                                                 for i, (n, p, _) in enumerate(WRONG_TYPES)]
)  # fmt: skip
def test_wrong_type_is_400_from_envoy(
    mesh: Mesh, name: str, path: tuple[Any, ...], value: Any
) -> None:
    assert_envoy_400(post(mesh, name, with_value(ROUTES[name].good, path, value)))


def test_an_object_as_a_map_value_is_400_from_the_server(mesh: Mesh) -> None:
    # Envoy's transcoder turns {"k": {...}} for a map<string, string> into a corrupt
    # protobuf message. The server's decoder refuses it: this was HTTP 500 (UNKNOWN,
    # "Unexpected <class 'DecodeError'>") before undecodable requests became
    # INVALID_ARGUMENT (services/common/interceptors.py).
    body = with_value(ROUTES["retrieval/documents"].good, ("metadata",), {"k": {"nested": 1}})
    r = post(mesh, "retrieval/documents", body)
    assert_error(r, 400, "INVALID_ARGUMENT", domain="visior.retrieval")


def test_lenient_json_forms_are_read_as_the_transcoder_documents(mesh: Mesh) -> None:
    # Pinned: protobuf's JSON mapping takes numbers as strings and null as unset; the
    # transcoder also takes a single value for a list. None of these reaches a server
    # as anything it does not validate.
    search = ROUTES["retrieval/search"].good
    for body in (
        {**search, "max_results": "3"},
        {**search, "max_results": None},
        {**search, "max_results": 3.0},
        {**search, "filters": {"doc_ids": LDAP_DOC}},
        {**search, "params": {"enable_hybrid": "false"}},
    ):
        r = post(mesh, "retrieval/search", body)
        assert r.status_code == 200, (body, r.text)
    r = post(mesh, "retrieval/search", {**search, "max_results": "51"})
    assert_server_400(r, "retrieval", "LIMIT_EXCEEDED", "max_results")
    r = post(mesh, "llm/generate", {"messages": {"role": "user", "content": "LDAP?"}})
    assert r.status_code == 200, r.text


def test_bool_strings_keep_their_meaning(mesh: Mesh) -> None:
    config = url(mesh, ROUTES["orchestrator/config"])
    saved = httpx.get(config, timeout=TIMEOUT).json()["mock_mode"]
    try:
        for text, value in (("yes", True), ("false", False), ("1", True), ("n", False)):
            r = httpx.post(config, json={"mock_mode": text}, timeout=TIMEOUT)
            assert r.status_code == 200 and r.json()["mock_mode"] is value, (text, r.text)
    finally:
        httpx.post(config, json={"mock_mode": saved}, timeout=TIMEOUT)


# --- unknown fields -----------------------------------------------------------------------


@pytest.mark.parametrize("name", SAFE_ROUTES)
def test_unknown_body_fields_are_dropped(mesh: Mesh, name: str) -> None:
    # The transcoder drops unknown fields (no option rejects them): the request is served
    # as if they were absent.
    route = ROUTES[name]
    body = {**route.good, "bogus": {"nested": [1, 2]}, "tenant": "someone-else"}
    if "user" in body:
        body["user"] = {**body["user"], "extra": True}
    r = post(mesh, name, body)
    assert r.status_code == 200, r.text


MISSPELT: list[tuple[str, dict[str, Any], str, str]] = [
    ("retrieval/search", {"query": "LDAP", "tenant": TENANT}, "INVALID_ARGUMENT", "tenant_id"),
    ("retrieval/search", {"q": "LDAP", "tenant_id": TENANT}, "INVALID_ARGUMENT", "query"),
    ("retrieval/documents", {"tenantId ": SCRATCH_TENANT, "file_name": "a.md", "content": "eA=="},
     "INVALID_ARGUMENT", "tenant_id"),
    ("retrieval/documents:delete", {"tenant_id": SCRATCH_TENANT, "docid": "x"}, "INVALID_ARGUMENT",
     "doc_id"),
    ("orchestrator/respond", {"query": "LDAP?", "user": {"user_id": "u", "tenant": TENANT}},
     "MISSING_USER_CONTEXT", "tenant_id"),
    ("llm/generate", {"message": [{"role": "user", "content": "LDAP?"}]}, "INVALID_ARGUMENT",
     "messages"),
    ("mcp/execute", {"tool": "read_doc_metadata", "user": USER}, "INVALID_ARGUMENT", "tool_name"),
    ("mcp/execute", {"tool_name": "read_doc_metadata", "user": {"tenant": TENANT}},
     "MISSING_USER_CONTEXT", "user.tenant_id"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "body", "reason", "field_name"), MISSPELT)
def test_a_misspelt_required_field_is_400_naming_the_field(
    mesh: Mesh, name: str, body: dict[str, Any], reason: str, field_name: str
) -> None:
    assert_server_400(post(mesh, name, body), ROUTES[name].key, reason, field_name)


MALFORMED_TENANT: list[tuple[str, dict[str, Any], str]] = [
    ("retrieval/search", {"query": "LDAP", "tenant_id": "acme corp"}, "tenant_id"),
    ("retrieval/documents:delete", {"tenant_id": "acme corp", "doc_id": "x"}, "tenant_id"),
    ("orchestrator/respond", {"query": "LDAP?", "user": {"user_id": "u", "tenant_id": "acme/corp"}},
     "tenant_id"),
    ("mcp/execute", {"tool_name": "read_doc_metadata", "arguments": {"doc_id": "x"},
                     "user": {"user_id": "u", "tenant_id": "t" * 129}}, "user.tenant_id"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "body", "field_name"), MALFORMED_TENANT)
def test_a_tenant_id_no_document_could_be_stored_under_is_400(
    mesh: Mesh, name: str, body: dict[str, Any], field_name: str
) -> None:
    # Every service holds a tenant id to the rule ingest does: a 400, never an empty answer.
    assert_server_400(post(mesh, name, body), ROUTES[name].key, "INVALID_ARGUMENT", field_name)


@pytest.mark.parametrize(
    "name", ["llm/generate", "llm/generate:stream", "mcp/execute", "retrieval/documents",
             "retrieval/documents:delete"]
)  # fmt: skip
def test_unknown_query_parameter_is_400(mesh: Mesh, name: str) -> None:
    route = ROUTES[name]
    r = httpx.post(url(mesh, route, "?verbose=1"), json=route.good, timeout=TIMEOUT)
    assert_envoy_400(r)


def test_invalid_utf8_in_a_query_parameter_is_400(mesh: Mesh) -> None:
    # Envoy percent-decodes into the proto string; the server's decoder refuses the bytes.
    # This was a 500 ("Unexpected <class 'DecodeError'>") before the server turned an
    # undecodable request into INVALID_ARGUMENT.
    r = httpx.get(mesh.json_url("retrieval") + "/internal/retrieval/documents?tenant_id=%ff%fe",
                  timeout=TIMEOUT)  # fmt: skip
    assert_error(r, 400, "INVALID_ARGUMENT", domain="visior.retrieval")


# --- huge numbers -------------------------------------------------------------------------

INT32_MAX = 2**31 - 1


@pytest.mark.parametrize(
    ("name", "path", "value", "reason", "field_name"),
    [
        ("retrieval/search", ("max_results",), INT32_MAX, "LIMIT_EXCEEDED", "max_results"),
        ("retrieval/search", ("max_results",), -(2**31), "INVALID_ARGUMENT", "max_results"),
        ("retrieval/search", ("params",), {"max_chunks": INT32_MAX}, "LIMIT_EXCEEDED",
         "params.max_chunks"),
        ("retrieval/search", ("params",), {"context_token_limit": INT32_MAX}, "LIMIT_EXCEEDED",
         "params.context_token_limit"),
        ("retrieval/search", ("params",), {"min_score": "NaN"}, "INVALID_ARGUMENT",
         "params.min_score"),
        ("retrieval/search", ("params",), {"min_score": 1e308}, "INVALID_ARGUMENT",
         "params.min_score"),
        ("orchestrator/respond", ("max_results",), INT32_MAX, "LIMIT_EXCEEDED", "max_results"),
        ("orchestrator/respond", ("max_results",), -1, "INVALID_ARGUMENT", "max_results"),
        ("orchestrator/config", ("prompt_token_budget",), INT32_MAX, "INVALID_ARGUMENT",
         "prompt_token_budget"),
        ("orchestrator/config", ("window_radius",), INT32_MAX, "INVALID_ARGUMENT", "window_radius"),
        ("llm/generate", ("generation_params",), {"max_tokens": INT32_MAX}, "LLM_LIMIT_EXCEEDED",
         "generation_params.max_tokens"),
        ("llm/generate", ("generation_params",), {"temperature": "Infinity"}, "INVALID_ARGUMENT",
         "generation_params.temperature"),
        ("llm/generate", ("generation_params",), {"top_p": "NaN"}, "INVALID_ARGUMENT",
         "generation_params.top_p"),
    ],
)  # fmt: skip
def test_huge_numbers_are_the_servers_400_naming_the_field(
    mesh: Mesh, name: str, path: tuple[Any, ...], value: Any, reason: str, field_name: str
) -> None:
    r = post(mesh, name, with_value(ROUTES[name].good, path, value))
    assert_server_400(r, ROUTES[name].key, reason, field_name)


@pytest.mark.parametrize(
    ("name", "path", "literal"),
    [
        ("retrieval/search", ("max_results",), b"2147483648"),  # int32 overflow
        ("retrieval/search", ("max_results",), b"9223372036854775808"),  # int64 overflow
        ("retrieval/search", ("max_results",), b"18446744073709551617"),
        ("retrieval/search", ("max_results",), b"-2147483649"),
        ("retrieval/search", ("max_results",), b"1e20"),
        ("retrieval/search", ("max_results",), b"1" + b"0" * 400),
        ("orchestrator/respond", ("max_results",), b"9223372036854775808"),
        ("orchestrator/config", ("max_tool_steps",), b"2147483648"),
        ("llm/generate", ("generation_params", "max_tokens"), b"9223372036854775808"),
        ("llm/generate", ("generation_params", "temperature"), b"1e400"),
    ],
)
def test_numbers_past_the_field_type_are_400_from_envoy(
    mesh: Mesh, name: str, path: tuple[Any, ...], literal: bytes
) -> None:
    body = json.dumps(with_value(ROUTES[name].good, path, MARK)).encode()
    assert_envoy_400(post(mesh, name, body.replace(json.dumps(MARK).encode(), literal)))


@pytest.mark.parametrize(
    ("tool", "arguments", "code"),
    [
        ("read_chunk_window", {"doc_id": "notes", "anchor_chunk_id": "x", "radius": 1e300},
         "WINDOW_TOO_LARGE"),
        ("read_doc_pages", {"doc_id": "notes", "page_start": 2**63}, "INVALID_ARGUMENT"),
        ("read_doc_pages", {"doc_id": "notes", "page_start": -(2**63)}, "INVALID_ARGUMENT"),
        ("doc_local_search", {"doc_id": "notes", "query": "LDAP", "max_results": 1e308},
         "INVALID_ARGUMENT"),
        ("search_user_documents", {"query": "LDAP", "top_k": 10**30}, "INVALID_ARGUMENT"),
        ("search_user_documents", {"query": "LDAP", "score_threshold": "NaN"}, "INVALID_ARGUMENT"),
        ("fetch_finance_news", {"query": "rates", "days": 2**53 + 1}, "INVALID_ARGUMENT"),
        ("fetch_cbr_data", {"mode": "key_rate", "date": "99999-01-01"}, "INVALID_ARGUMENT"),
    ],
)  # fmt: skip
def test_huge_tool_arguments_are_tool_errors(
    mesh: Mesh, tool: str, arguments: dict[str, Any], code: str
) -> None:
    r = post(mesh, "mcp/execute", {"tool_name": tool, "arguments": arguments, "user": USER})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["status"], body["error"]["code"]) == ("error", code), body


# --- deep nesting -------------------------------------------------------------------------


def nested(depth: int, kind: str = "list") -> str:
    return "[" * depth + "]" * depth if kind == "list" else '{"a":' * depth + "1" + "}" * depth


DEEP_PLACES: list[tuple[str, str]] = [
    # (route, a JSON body with DEEP where the nesting goes)
    ("mcp/execute", '{"tool_name": "read_doc_metadata", "user": %s, "arguments": {"doc_id": DEEP}}'),
    ("llm/generate", '{"messages": [{"role": "user", "content": "x"}], "tool_policy": {'
                     '"planned_calls": [{"tool_name": "read_doc_metadata", "arguments": {"a": DEEP}}]}}'),
    ("retrieval/search", '{"tenant_id": "demo", "query": DEEP}'),
    ("orchestrator/respond", '{"user": %s, "query": DEEP}'),
    ("retrieval/documents", '{"tenant_id": "demo", "content": "eA==", "metadata": DEEP}'),
]  # fmt: skip


def deep_body(template: str, depth: int, kind: str) -> bytes:
    return (template.replace("%s", json.dumps(USER)).replace("DEEP", nested(depth, kind))).encode()


DEEP_IDS = ["execute-arguments", "generate-planned-call", "search-query", "respond-query",
            "ingest-metadata"]  # fmt: skip


@pytest.mark.parametrize("kind", ["list", "object"])
@pytest.mark.parametrize(("name", "template"), DEEP_PLACES, ids=DEEP_IDS)
def test_ten_thousand_levels_of_nesting_are_400(
    mesh: Mesh, name: str, template: str, kind: str
) -> None:
    assert_envoy_400(post(mesh, name, deep_body(template, 10_000, kind)))


@pytest.mark.parametrize("depth", [50, 60, 80])
@pytest.mark.parametrize(("name", "template"), DEEP_PLACES[:2], ids=DEEP_IDS[:2])
def test_nesting_the_transcoder_passes_but_protobuf_cannot_decode_is_400(
    mesh: Mesh, name: str, template: str, depth: int
) -> None:
    # Envoy accepts up to ~99 JSON levels in a Struct; each is 2-3 protobuf levels and the
    # server's decoder stops at 100. This was HTTP 500 (UNKNOWN "Unexpected <class
    # 'google.protobuf.message.DecodeError'>") before the fix in services/common/interceptors.
    r = post(mesh, name, deep_body(template, depth, "list"))
    assert_error(r, 400, "INVALID_ARGUMENT", domain=DOMAIN[ROUTES[name].key])


def test_nesting_a_tool_can_take_is_served(mesh: Mesh) -> None:
    # The other side of the line above: shallow nesting reaches the tool, which refuses a
    # list for doc_id as a tool error.
    r = post(mesh, "mcp/execute", deep_body(DEEP_PLACES[0][1], 10, "list"))
    assert r.status_code == 200 and r.json()["error"]["code"] == "INVALID_ARGUMENT", r.text


# --- oversized bodies ---------------------------------------------------------------------

# (route, the field padded to reach the size, what the server says about the body at the limit)
SIZED: list[tuple[str, tuple[Any, ...], str, str]] = [
    ("retrieval/search", ("query",), "LIMIT_EXCEEDED", "query"),
    ("retrieval/documents:delete", ("doc_id",), "INVALID_ARGUMENT", "doc_id"),
    ("orchestrator/respond", ("query",), "LIMIT_EXCEEDED", "query"),
    ("orchestrator/config", ("default_model",), "INVALID_ARGUMENT", "default_model"),
    ("llm/generate", ("messages", 0, "content"), "LLM_LIMIT_EXCEEDED", "messages[0].content"),
    ("llm/generate:stream", ("messages", 0, "content"), "LLM_LIMIT_EXCEEDED", "messages[0].content"),
    ("mcp/execute", ("tool_name",), "INVALID_ARGUMENT", "tool_name"),
]  # fmt: skip


BODY_LIMITS = {budget.http_path: limit for budget, limit in ROUTE_MAX_REQUEST_BYTES.items()}
"""The body limit of each route that has its own (Respond, Generate, ingestion), by path."""


def body_limit(route: Route) -> int:
    return BODY_LIMITS.get(route.path, DEFAULT_MAX_REQUEST_BYTES)


def sized_body(route: Route, path: tuple[Any, ...], size: int) -> bytes:
    """The route's good body, the field at `path` padded so the JSON is exactly `size` bytes."""
    empty = json.dumps(with_value(route.good, path, "")).encode()
    body = json.dumps(with_value(route.good, path, "x" * (size - len(empty)))).encode()
    assert len(body) == size
    return body


@pytest.mark.parametrize(("name", "path", "reason", "field_name"), SIZED)
def test_body_at_the_limit_reaches_the_server_and_one_byte_more_is_413(
    mesh: Mesh, name: str, path: tuple[Any, ...], reason: str, field_name: str
) -> None:
    route = ROUTES[name]
    limit = body_limit(route)
    at = post(mesh, name, sized_body(route, path, limit))
    assert_server_400(at, route.key, reason, field_name)
    past = post(mesh, name, sized_body(route, path, limit + 1))
    assert_error(past, 413, "PAYLOAD_TOO_LARGE", domain="envoy")


def test_ingestion_body_at_its_limit_reaches_the_server_and_one_byte_more_is_413(
    mesh: Mesh,
) -> None:
    # At the body limit: a document of ~32 MiB in base64, refused fast by the server for its tenant id.
    route = ROUTES["retrieval/documents"]
    content = base64.b64encode(b"x" * (3 * (INGEST_MAX_REQUEST_BYTES // 4 - 64))).decode()
    body = {"tenant_id": "no spaces allowed", "file_name": "big.md", "content": content}
    at = post(mesh, "retrieval/documents", sized_body(Route(route.key, route.path, body, ()),
                                                      ("title",), INGEST_MAX_REQUEST_BYTES))  # fmt: skip
    assert_server_400(at, "retrieval", "INVALID_ARGUMENT", "tenant_id")
    past = post(mesh, "retrieval/documents", sized_body(Route(route.key, route.path, body, ()),
                                                        ("title",), INGEST_MAX_REQUEST_BYTES + 1))  # fmt: skip
    assert_error(past, 413, "PAYLOAD_TOO_LARGE", domain="envoy")


# --- gRPC ---------------------------------------------------------------------------------

U = common_pb2.UserContext(user_id="bad-input-user", tenant_id=TENANT)
METHODS = {
    "retrieval": ("/visior.retrieval.v1.RetrievalService/Search", retrieval_pb2.SearchRequest),
    "orchestrator": ("/visior.orchestrator.v1.OrchestratorService/Respond",
                     orchestrator_pb2.RespondRequest),
    "llm": ("/visior.llm.v1.LlmService/Generate", llm_pb2.GenerateRequest),
    "toolsproxy": ("/visior.toolsproxy.v1.ToolsProxyService/Execute",
                   toolsproxy_pb2.ExecuteRequest),
}  # fmt: skip


def raw_call(mesh: Mesh, key: str, payload: bytes, method: str | None = None) -> grpc.RpcError:
    """Send `payload` as the request bytes; return the error the server answers with."""
    with grpc.insecure_channel(f"127.0.0.1:{mesh.ports.grpc[key]}") as channel:
        call = channel.unary_unary(method or METHODS[key][0])
        with pytest.raises(grpc.RpcError) as refused:
            call(payload, timeout=TIMEOUT)
    return refused.value


def error_info(err: grpc.RpcError) -> error_details_pb2.ErrorInfo:
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None and len(status.details) == 1, err
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    return info


def first_string_field(cls: Any) -> int:
    return next(f.number for f in cls.DESCRIPTOR.fields if f.type == f.TYPE_STRING)


def varint(n: int) -> bytes:
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out


GARBAGE = {
    "truncated_length": b"\x0a\xff\xff\xff\x0f",
    "bad_wire_type": b"\x0f\x01\x02",
    "field_zero": b"\x00\x01",
    "random": bytes(range(255, 0, -7)),
}


@pytest.mark.parametrize("case", sorted(GARBAGE))
@pytest.mark.parametrize("key", sorted(METHODS))
def test_undecodable_grpc_request_is_invalid_argument(mesh: Mesh, key: str, case: str) -> None:
    err = raw_call(mesh, key, GARBAGE[case])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    info = error_info(err)
    assert (info.reason, info.domain) == ("INVALID_ARGUMENT", DOMAIN[key])


@pytest.mark.parametrize("key", sorted(METHODS))
def test_invalid_utf8_in_a_grpc_string_field_is_invalid_argument(mesh: Mesh, key: str) -> None:
    number = first_string_field(METHODS[key][1])
    err = raw_call(mesh, key, varint(number << 3 | 2) + b"\x04a\xc3\x28b")
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    assert error_info(err).reason == "INVALID_ARGUMENT"


def deep_value(depth: int) -> struct_pb2.Value:
    value = struct_pb2.Value()
    cursor = value
    for _ in range(depth):
        cursor = cursor.list_value.values.add()
    cursor.string_value = "x"
    return value


@pytest.mark.parametrize("depth", [60, 2000])
def test_deep_struct_over_grpc_is_invalid_argument(mesh: Mesh, depth: int) -> None:
    req = toolsproxy_pb2.ExecuteRequest(tool_name="read_doc_metadata", user=U)
    req.arguments.fields["doc_id"].CopyFrom(deep_value(depth))
    err = raw_call(mesh, "toolsproxy", req.SerializeToString())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_numbers_in_grpc_structs_are_invalid_argument(mesh: Mesh, bad: float) -> None:
    # JSON cannot carry NaN, a Struct over gRPC can: this was INTERNAL.
    req = toolsproxy_pb2.ExecuteRequest(tool_name="search_user_documents", user=U)
    req.arguments.update({"query": "LDAP", "score_threshold": bad})
    err = raw_call(mesh, "toolsproxy", req.SerializeToString())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    assert error_info(err).metadata["field"] == "arguments"
    gen = llm_pb2.GenerateRequest(
        user=U, messages=[common_pb2.ChatMessage(role="user", content="x")]
    )
    gen.tool_policy.allowed_tools.append("search_user_documents")
    call = gen.tool_policy.planned_calls.add(tool_name="search_user_documents")
    call.arguments.update({"query": "LDAP", "score_threshold": bad})
    err = raw_call(mesh, "llm", gen.SerializeToString())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    assert error_info(err).metadata["field"] == "tool_policy.planned_calls[0].arguments"


def max_message_bytes(mesh: Mesh, key: str) -> int:
    env = Env(mesh.env())
    settings = {"orchestrator": OrchestratorSettings, "llm": LlmSettings,
                "toolsproxy": ToolsProxySettings}[key].from_env(env)  # fmt: skip
    return int(settings.server.max_message_bytes)


def sized_request(key: str, size: int) -> bytes:
    """A request of exactly `size` bytes: its first string field padded."""
    cls = METHODS[key][1]
    base = {"orchestrator": {"user": U}, "llm": {}, "toolsproxy": {"user": U}}[key]
    number = first_string_field(cls)
    name = next(f.name for f in cls.DESCRIPTOR.fields if f.number == number)
    for pad in range(size - 256, size):  # the length prefix grows with the pad: search
        msg = cls(**base, **{name: "x" * pad})
        if msg.ByteSize() == size:
            return msg.SerializeToString()  # type: ignore[no-any-return]
    raise AssertionError(f"no {cls.__name__} of exactly {size} bytes")


@pytest.mark.parametrize("key", ["orchestrator", "llm", "toolsproxy"])
def test_grpc_message_at_the_limit_is_read_and_one_byte_more_is_resource_exhausted(
    mesh: Mesh, key: str
) -> None:
    limit = max_message_bytes(mesh, key)
    at = raw_call(mesh, key, sized_request(key, limit))
    # Read and validated: the padded field is refused by the service, not the transport.
    assert at.code() == grpc.StatusCode.INVALID_ARGUMENT, at
    assert error_info(at).domain == DOMAIN[key]
    past = raw_call(mesh, key, sized_request(key, limit + 1))
    assert past.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, past


# --- and after all of it ------------------------------------------------------------------


def test_every_process_of_the_mesh_is_still_alive_and_serving(mesh: Mesh) -> None:
    assert set(mesh.alive()) == {*SERVICE_KEYS, "envoy"}
    assert all(mesh.alive().values()), mesh.alive()
    assert mesh.envoy.pid is not None
    for key in SERVICE_KEYS:
        r = httpx.get(mesh.json_url(key) + "/health", timeout=TIMEOUT)
        assert r.status_code == 200, (key, r.text)
    r = post(mesh, "retrieval/search", ROUTES["retrieval/search"].good)
    assert r.status_code == 200 and r.json()["hits"], r.text
