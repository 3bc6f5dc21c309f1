"""openapi/visior.openapi.yaml: valid OpenAPI 3.1, one operation per HTTP rule Envoy transcodes,
response schemas that match what the transcoder prints, request schemas that say what the
servers check. (Drift against `make gen` is tests/unit/test_generated_code.py's job.)
"""

from __future__ import annotations

import importlib.util
import json
import sys
from types import ModuleType
from typing import Any

import jsonschema
import pytest
import schemathesis
import yaml
from google.api import annotations_pb2, field_behavior_pb2
from google.protobuf import descriptor_pb2, descriptor_pool, json_format
from google.protobuf.descriptor import FieldDescriptor
from google.rpc import error_details_pb2
from schemathesis.specs.openapi.definitions import OPENAPI_31
from visior.llm.v1 import llm_pb2
from visior.orchestrator.v1 import orchestrator_pb2
from visior.retrieval.v1 import retrieval_pb2
from visior.toolsproxy.v1 import toolsproxy_pb2

from services.common.topology import SERVICES
from services.devtools.envoy import REPO_ROOT as ROOT

OPENAPI_PATH = ROOT / "openapi" / "visior.openapi.yaml"
DESCRIPTOR_SET = ROOT / "envoy" / "visior.pb"
PREFIX = "#/components/schemas/"


def _load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("visior_openapi_tool", ROOT / "tools/openapi.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


openapi_tool = _load_tool()


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return yaml.safe_load(OPENAPI_PATH.read_text())


@pytest.fixture(scope="module")
def fds() -> descriptor_pb2.FileDescriptorSet:
    out = descriptor_pb2.FileDescriptorSet()
    out.ParseFromString(DESCRIPTOR_SET.read_bytes())
    return out


def http_rules(fds: descriptor_pb2.FileDescriptorSet) -> list[tuple[str, str, str]]:
    """(verb, path, "pkg.Service/Method") of every google.api.http rule Envoy sees."""
    transcoded = {g for s in SERVICES for g in s.grpc_services}
    rules = []
    for f in fds.file:
        for svc in f.service:
            full = f"{f.package}.{svc.name}"
            for m in svc.method:
                rule = m.options.Extensions[annotations_pb2.http]
                kind = rule.WhichOneof("pattern")
                if kind is None:
                    continue
                assert full in transcoded, f"{full} has HTTP rules but no sidecar"
                rules.append((kind, getattr(rule, kind), f"{full}/{m.name}"))
    return rules


def _local_refs(value: Any) -> Any:
    """`value` with component references pointing at `$defs`, for plain jsonschema."""
    return json.loads(json.dumps(value).replace(PREFIX, "#/$defs/"))


def resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of `schema` that jsonschema can resolve: the components under $defs."""
    return {**_local_refs(schema), "$defs": _local_refs(doc["components"]["schemas"])}


def validator(doc: dict[str, Any], schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(
        resolve(doc, schema), format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )


def operation(doc: dict[str, Any], verb: str, path: str) -> dict[str, Any]:
    return doc["paths"][path][verb]


def request_schema(doc: dict[str, Any], verb: str, path: str) -> dict[str, Any]:
    return operation(doc, verb, path)["requestBody"]["content"]["application/json"]["schema"]


def response_schema(doc: dict[str, Any], verb: str, path: str) -> dict[str, Any]:
    return operation(doc, verb, path)["responses"]["200"]["content"]["application/json"]["schema"]


# --- a valid document ---------------------------------------------------------------------


def test_the_document_is_valid_openapi_3_1(doc: dict[str, Any]) -> None:
    assert doc["openapi"] == "3.1.0"
    jsonschema.Draft202012Validator(OPENAPI_31).validate(doc)


def test_every_component_is_a_valid_json_schema(doc: dict[str, Any]) -> None:
    # One schema holding every component: check_schema walks each of them.
    jsonschema.Draft202012Validator.check_schema(resolve(doc, {}))
    broken = resolve(doc, {})
    broken["$defs"]["visior.retrieval.v1.SearchRequest"]["required"] = "query"
    with pytest.raises(jsonschema.SchemaError):
        jsonschema.Draft202012Validator.check_schema(broken)


def test_every_reference_resolves(doc: dict[str, Any]) -> None:
    text = OPENAPI_PATH.read_text()
    refs = {line.split(PREFIX, 1)[1].rstrip("'\"") for line in text.splitlines() if PREFIX in line}
    assert refs, "no $ref at all"
    assert refs <= set(doc["components"]["schemas"]), refs - set(doc["components"]["schemas"])


def test_schemathesis_loads_every_operation(doc: dict[str, Any]) -> None:
    schema = schemathesis.openapi.from_path(OPENAPI_PATH)
    ops = [result.ok() for result in schema.get_all_operations()]
    described = {
        (verb.upper(), path)
        for path, item in doc["paths"].items()
        for verb in item
        if verb != "servers"
    }
    assert {(op.method.upper(), op.path) for op in ops} == described


# --- one operation per HTTP rule ---------------------------------------------------------------


def test_every_http_rule_of_the_descriptor_is_described(
    doc: dict[str, Any], fds: descriptor_pb2.FileDescriptorSet
) -> None:
    rules = http_rules(fds)
    assert len(rules) >= 15
    described: dict[tuple[str, str], list[str]] = {
        (verb, path): op["x-grpc-methods"]
        for path, item in doc["paths"].items()
        for verb, op in item.items()
        if verb != "servers"
    }
    for verb, path, rpc in rules:
        assert rpc in described.get((verb, path), []), f"{verb} {path} ({rpc}) is not described"
    # ... and nothing else.
    assert sorted(m for ms in described.values() for m in ms) == sorted(r[2] for r in rules)


def test_each_path_names_the_sidecars_that_serve_it(doc: dict[str, Any]) -> None:
    http_prefix = {"orchestrator": "/internal/orchestrator/", "llm": "/internal/llm/"}
    http_prefix |= {"retrieval": "/internal/retrieval/", "toolsproxy": "/internal/mcp/"}
    for path, item in doc["paths"].items():
        for verb, op in item.items():
            if verb == "servers":
                continue
            keys = op["x-visior-listeners"]
            assert len(item["servers"]) == len(keys)
            if path == "/health":
                assert keys == [s.key for s in SERVICES]
            else:
                assert len(keys) == 1 and path.startswith(http_prefix[keys[0]]), (path, keys)


def test_a_new_http_rule_is_described(fds: descriptor_pb2.FileDescriptorSet) -> None:
    changed = descriptor_pb2.FileDescriptorSet()
    changed.CopyFrom(fds)
    svc = next(f for f in changed.file if f.package == "visior.retrieval.v1").service[0]
    extra = svc.method.add()
    extra.CopyFrom(svc.method[0])
    extra.name = "SearchAgain"
    extra.options.Extensions[annotations_pb2.http].post = "/internal/retrieval/search-again"
    built = openapi_tool.build(changed)
    op = built["paths"]["/internal/retrieval/search-again"]["post"]
    assert op["x-grpc-methods"] == ["visior.retrieval.v1.RetrievalService/SearchAgain"]


# --- responses: what the transcoder prints ------------------------------------------------------


def _filled(msg: Any, depth: int = 0) -> Any:
    """`msg` with every field set (one of each oneof: the last), nested to depth 3."""
    for fd in msg.DESCRIPTOR.fields:
        repeated = fd.is_repeated
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            getattr(msg, fd.name)["k"] = "v"
        elif fd.message_type is not None:
            full = fd.message_type.full_name
            if full == "google.protobuf.Any":  # the only Any: a Status's ErrorInfo
                info = error_details_pb2.ErrorInfo(reason="R", domain="d", metadata={"k": "v"})
                (getattr(msg, fd.name).add() if repeated else getattr(msg, fd.name)).Pack(info)
            elif full in ("google.protobuf.Struct", "google.protobuf.Value"):
                target = getattr(msg, fd.name).add() if repeated else getattr(msg, fd.name)
                json_format.ParseDict({"a": [1, "x", None, {"b": True}]}, target) if full.endswith(
                    "Struct"
                ) else json_format.ParseDict([1, "x"], target)
            elif depth < 3:
                target = getattr(msg, fd.name).add() if repeated else getattr(msg, fd.name)
                _filled(target, depth + 1)
        else:
            value = {
                FieldDescriptor.CPPTYPE_STRING: "s",
                FieldDescriptor.CPPTYPE_BOOL: True,
                FieldDescriptor.CPPTYPE_DOUBLE: 0.5,
                FieldDescriptor.CPPTYPE_FLOAT: 0.5,
            }.get(fd.cpp_type, 7)
            if fd.type == FieldDescriptor.TYPE_BYTES:
                value = b"\x00\xff"
            if repeated:
                getattr(msg, fd.name).append(value)
            else:
                setattr(msg, fd.name, value)
    return msg


def printed(msg: Any) -> Any:
    """The JSON the transcoder prints with the repo's print options."""
    return json_format.MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


RESPONSES = [
    ("post", "/internal/orchestrator/respond", orchestrator_pb2.RespondResponse),
    ("get", "/internal/orchestrator/config", orchestrator_pb2.GetConfigResponse),
    ("post", "/internal/orchestrator/config", orchestrator_pb2.UpdateConfigResponse),
    ("get", "/health", orchestrator_pb2.GetHealthResponse),
    ("post", "/internal/llm/generate", llm_pb2.GenerateResponse),
    ("post", "/internal/retrieval/search", retrieval_pb2.SearchResponse),
    ("post", "/internal/retrieval/documents", retrieval_pb2.IngestDocumentResponse),
    ("post", "/internal/retrieval/documents:delete", retrieval_pb2.DeleteDocumentResponse),
    ("get", "/internal/retrieval/documents", retrieval_pb2.ListDocumentsResponse),
    ("post", "/internal/mcp/execute", toolsproxy_pb2.ExecuteResponse),
    ("get", "/internal/mcp/tools", toolsproxy_pb2.ListToolsResponse),
]


@pytest.mark.parametrize(
    ("verb", "path", "message"), RESPONSES, ids=[r[1] + ":" + r[0] for r in RESPONSES]
)
def test_printed_responses_match_their_schema(
    doc: dict[str, Any], verb: str, path: str, message: Any
) -> None:
    v = validator(doc, response_schema(doc, verb, path))
    v.validate(printed(message()))  # zero values: every field without presence printed
    v.validate(printed(_filled(message())))
    bad = printed(message())
    bad["not_a_field"] = 1
    assert not v.is_valid(bad)  # responses carry exactly the message's fields
    required = v.schema.get("required") or v.schema["$defs"][v.schema["$ref"].split("/")[-1]].get(
        "required", []
    )
    if required:
        missing = printed(message())
        del missing[required[0]]
        assert not v.is_valid(missing)


def test_the_stream_is_an_array_of_events_with_one_field_each(doc: dict[str, Any]) -> None:
    v = validator(doc, response_schema(doc, "post", "/internal/llm/generate:stream"))
    events = [
        llm_pb2.GenerateStreamResponse(delta="Hel"),
        llm_pb2.GenerateStreamResponse(tool_call={"name": "read_doc_pages"}),
        llm_pb2.GenerateStreamResponse(final=_filled(llm_pb2.GenerateResponse())),
        _filled(llm_pb2.GenerateStreamResponse()),  # the last of the oneof: error
    ]
    assert events[-1].WhichOneof("event") == "error"
    v.validate([printed(e) for e in events])
    assert not v.is_valid([{"error": {"code": 14}}])  # a Status has message and details
    assert not v.is_valid([{"delta": "a", "final": printed(llm_pb2.GenerateResponse())}])
    assert not v.is_valid(printed(events[0]))  # not an array


def test_the_error_body_is_the_documented_status(doc: dict[str, Any]) -> None:
    schema = doc["components"]["responses"]["Error400"]["content"]["application/json"]["schema"]
    v = validator(doc, schema)
    v.validate(
        {
            "code": 3,
            "message": "max_results is 51; the limit is 50",
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "LIMIT_EXCEEDED",
                    "domain": "visior.retrieval",
                    "metadata": {"field": "max_results", "limit": "50"},
                }
            ],
        }
    )
    v.validate({"code": 14, "message": "down", "details": []})
    assert not v.is_valid({"code": 3, "message": "no details"})
    for path, item in doc["paths"].items():
        for verb, op in item.items():
            if verb != "servers":
                assert {"400", "413", "502", "504"} <= set(op["responses"]), (verb, path)


# --- requests: what the servers check ------------------------------------------------------------


def test_field_behavior_required_fields_are_required(
    doc: dict[str, Any], fds: descriptor_pb2.FileDescriptorSet
) -> None:
    schemas = doc["components"]["schemas"]
    found = 0
    for f in fds.file:
        for m in f.message_type:
            name = f"{f.package}.{m.name}"
            for fld in m.field:
                if (
                    field_behavior_pb2.REQUIRED
                    in fld.options.Extensions[field_behavior_pb2.field_behavior]
                ):
                    if name in schemas:
                        assert fld.name in schemas[name].get("required", []), (name, fld.name)
                        found += 1
    list_docs = operation(doc, "get", "/internal/retrieval/documents")["parameters"]
    assert {p["name"]: p["required"] for p in list_docs} == {
        "tenant_id": True, "trace_id": False, "page_size": False, "page_token": False,
        "doc_ids": False,
    }  # fmt: skip
    assert found >= 8


def test_every_request_rule_names_a_real_message_or_field(
    fds: descriptor_pb2.FileDescriptorSet,
) -> None:
    pool = descriptor_pool.DescriptorPool()
    for f in fds.file:
        pool.Add(f)
    for key in openapi_tool.REQUEST_RULES:
        try:
            pool.FindMessageTypeByName(key)
        except KeyError:
            message, _, field = key.rpartition(".")
            assert field in pool.FindMessageTypeByName(message).fields_by_name, key


def _valid(doc: dict[str, Any], path: str, body: Any) -> bool:
    return validator(doc, request_schema(doc, "post", path)).is_valid(body)


def test_search_limits_at_and_past_the_limit(doc: dict[str, Any]) -> None:
    path = "/internal/retrieval/search"
    base = {"query": "LDAP", "tenant_id": "demo"}
    assert _valid(doc, path, base)
    assert _valid(doc, path, {**base, "max_results": 50})
    assert not _valid(doc, path, {**base, "max_results": 51})
    assert not _valid(doc, path, {**base, "max_results": 0})
    assert _valid(doc, path, {**base, "query": "q" * 4096})
    assert not _valid(doc, path, {**base, "query": "q" * 4097})
    assert not _valid(doc, path, {**base, "query": "   "})
    assert not _valid(doc, path, {"query": "LDAP"})
    assert not _valid(doc, path, {**base, "tenant_id": "__knowledge_base__"})
    assert _valid(doc, path, {**base, "params": {"retrieval_mode": "doc_first"}})
    assert not _valid(doc, path, {**base, "params": {"retrieval_mode": "fastest"}})
    assert not _valid(doc, path, {**base, "params": {"max_docs": 101}})
    assert not _valid(doc, path, {**base, "max_results": 2**31})  # past int32
    assert not _valid(doc, path, {**base, "trace_id": "has space"})


def test_respond_needs_a_user_in_one_of_two_forms(doc: dict[str, Any]) -> None:
    path = "/internal/orchestrator/respond"
    assert not _valid(doc, path, {"query": "q", "user": {"user_id": "u", "tenant_id": " "}})
    assert not _valid(doc, path, {"query": "q", "user_id": "u", "tenant_id": ""})
    assert _valid(doc, path, {"query": "q", "user": {"user_id": "u", "tenant_id": "t"}})
    assert _valid(doc, path, {"query": "q", "user_id": "u", "tenant_id": "t"})
    assert not _valid(doc, path, {"query": "q", "user": {"tenant_id": "t"}})
    assert not _valid(doc, path, {"query": "q"})
    history = [{"role": "user", "content": "x"}] * 20
    assert _valid(doc, path, {"query": "q", "user_id": "u", "tenant_id": "t", "history": history})
    assert not _valid(
        doc,
        path,
        {"query": "q", "user_id": "u", "tenant_id": "t", "history": [*history, history[0]]},
    )
    system = [{"role": "system", "content": "x"}]
    assert not _valid(
        doc, path, {"query": "q", "user_id": "u", "tenant_id": "t", "history": system}
    )


def test_generate_needs_a_user_message(doc: dict[str, Any]) -> None:
    path = "/internal/llm/generate"
    assert _valid(doc, path, {"messages": [{"role": "user", "content": "hi"}]})
    assert not _valid(doc, path, {"messages": [{"role": "assistant", "content": "hi"}]})
    assert not _valid(doc, path, {"messages": []})
    assert not _valid(doc, path, {"messages": [{"role": "robot", "content": "hi"}]})
    assert not _valid(
        doc,
        path,
        {"messages": [{"role": "user", "content": "hi"}], "generation_params": {"top_p": 1.5}},
    )
    tools = {
        "messages": [{"role": "user", "content": "hi"}],
        "tool_policy": {"allowed_tools": ["x"]},
    }
    assert not _valid(doc, path, tools)  # tools run for a tenant
    assert not _valid(doc, path, {**tools, "user": {"tenant_id": " ", "user_id": "u"}})
    assert not _valid(doc, path, {**tools, "user": {"tenant_id": "t"}})  # and for a user
    assert not _valid(doc, path, {**tools, "user": {"tenant_id": "t", "user_id": " "}})
    assert _valid(doc, path, {**tools, "user": {"tenant_id": "t", "user_id": "u"}})
    stream = request_schema(doc, "post", "/internal/llm/generate:stream")
    assert validator(doc, stream).is_valid({"messages": [{"role": "user", "content": "hi"}]})


def test_execute_needs_a_tool_a_tenant_and_a_user(doc: dict[str, Any]) -> None:
    path = "/internal/mcp/execute"
    user = {"tenant_id": "t", "user_id": "u"}
    assert _valid(doc, path, {"tool_name": "read_doc_metadata", "user": user})
    assert _valid(doc, path, {"tool_name": "t" * 64, "user": user})
    assert not _valid(doc, path, {"tool_name": "t" * 65, "user": user})
    assert not _valid(doc, path, {"tool_name": "read_doc_metadata", "user": {"user_id": "u"}})
    assert not _valid(doc, path, {"tool_name": "read_doc_metadata", "user": {"tenant_id": "t"}})
    blank = {"tenant_id": "t", "user_id": " "}
    assert not _valid(doc, path, {"tool_name": "read_doc_metadata", "user": blank})
    assert not _valid(doc, path, {"tool_name": "read_doc_metadata"})


def test_ingestion_content_is_base64_bytes(doc: dict[str, Any]) -> None:
    schema = doc["components"]["schemas"]["visior.retrieval.v1.IngestDocumentRequest"]
    assert schema["properties"]["content"]["contentEncoding"] == "base64"
    assert set(schema["required"]) == {"tenant_id", "content"}
    path = "/internal/retrieval/documents"
    body = {"tenant_id": "t", "content": "aGk=", "doc_id": "d"}
    assert _valid(doc, path, {**body, "tags": ["x"] * 32})
    assert not _valid(doc, path, {**body, "tags": ["x"] * 33})
    # A doc_id, or a file name one can be made from.
    assert _valid(doc, path, {"tenant_id": "t", "content": "aGk=", "file_name": "notes.md"})
    assert not _valid(doc, path, {"tenant_id": "t", "content": "aGk="})
    for name in ("!!.md", "docs/!!.md", "a.b/.md"):
        assert not _valid(doc, path, {"tenant_id": "t", "content": "aGk=", "file_name": name})
    assert _valid(doc, path, {"tenant_id": "t", "content": "aGk=", "file_name": "a/b.c.md"})
    assert not _valid(doc, path, {**body, "doc_id": "-starts-with-a-dash"})
    # The format: the content type, else the extension; CSV only for the knowledge base.
    assert _valid(doc, path, {**body, "file_name": "x.PDF"})
    assert _valid(doc, path, {**body, "file_name": "x.png", "content_type": "text/plain"})
    assert not _valid(doc, path, {**body, "file_name": "x.png"})
    assert not _valid(doc, path, {**body, "content_type": "image/png"})
    assert not _valid(doc, path, {**body, "file_name": "kb.csv"})
    assert not _valid(doc, path, {**body, "content_type": "text/csv"})
    assert _valid(doc, path, {**body, "file_name": "kb.csv", "tenant_id": "__knowledge_base__"})
    assert _valid(doc, path, {**body, "file_name": "kb.csv", "content_type": "text/markdown"})


def test_what_the_transcoder_or_the_servers_refuse_is_not_valid(doc: dict[str, Any]) -> None:
    path = "/internal/retrieval/search"
    base = {"query": "LDAP", "tenant_id": "demo"}
    assert _valid(doc, path, {**base, "unknown_field": 1})  # dropped by Envoy
    assert not _valid(doc, path, {**base, "": 1})  # "Proto fields must have a name."
    # Python's str.strip() (the servers) strips \x1c-\x1f and \x85; ECMA's \s does not.
    for blank in ("\x1f", "\x85", " \t\u3000"):
        assert not _valid(doc, path, {**base, "query": blank}), repr(blank)


def test_the_external_tools_arguments_are_the_ones_agent_md_names(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    cbr = schemas["visior.toolsproxy.tools.arguments.fetch_cbr_data"]
    assert set(cbr["properties"]) == {"mode", "date", "code", "date_from", "date_to"}
    assert cbr["properties"]["mode"]["enum"] == ["currency", "key_rate", "news"]
    assert cbr["required"] == ["mode"] and cbr["additionalProperties"] is False
    news = schemas["visior.toolsproxy.tools.arguments.fetch_finance_news"]
    assert {"query", "max_results", "search_depth"} <= set(news["properties"])
    assert news["properties"]["search_depth"]["enum"] == ["basic", "advanced"]
