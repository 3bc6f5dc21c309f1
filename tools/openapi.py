"""Writes the OpenAPI 3.1 description of the mesh's JSON routes from the protos' google.api.http rules.

The routes, bodies and query parameters come from the same descriptor set Envoy's
grpc_json_transcoder reads (`proto/` compiled with imports; source info added for the
comments), mapped the way the transcoder prints and parses JSON with the repo's
options (services/devtools/envoy_config.py): proto field names (`preserve_proto_field_names`;
lowerCamelCase is accepted on input too), every field without presence printed
(`always_print_primitive_fields`), enums as names, 64-bit integers as strings, bytes as
base64, well-known types in their JSON forms. Request schemas add what the servers
check (field_behavior REQUIRED, and the validators' limits in `REQUEST_RULES` below,
whose numbers are imported from the services). Errors are the google.rpc.Status body
that both the transcoder and Envoy's local replies produce.

Usage: python tools/openapi.py [--descriptor-set FILE] [--out FILE]
(`tools/gen.sh` writes openapi/visior.openapi.yaml; `tools/check_gen.sh` checks drift.)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO / "gen" / "python", REPO):  # after PYTHONPATH, so gen.sh's choice wins
    if str(_p) not in sys.path:
        sys.path.append(str(_p))

import yaml  # noqa: E402
from google.api import annotations_pb2, field_behavior_pb2  # noqa: E402
from google.protobuf import descriptor_pb2  # noqa: E402

from services.common import search_contract as contract  # noqa: E402
from services.common.context import _TRACE_ID  # noqa: E402
from services.common.document_limits import (  # noqa: E402
    FILTER_VALUE_CHARS,
    MAX_DOC_ID_CHARS,
)
from services.common.generate_contract import MAX_MODEL_CHARS  # noqa: E402
from services.common.search_contract import DEFAULT_WINDOW_RADIUS  # noqa: E402
from services.common.topology import SERVICES, Ports  # noqa: E402
from services.devtools import envoy_config  # noqa: E402
from services.docstore import fields as doc_fields  # noqa: E402
from services.docstore.parsing import SUFFIX_FORMATS  # noqa: E402
from services.llm import engine as llm_engine  # noqa: E402
from services.llm.loop import LoopSettings  # noqa: E402
from services.orchestrator import respond as orch_respond  # noqa: E402
from services.orchestrator import runtime_config as orch_config  # noqa: E402
from services.retrieval import search as retr_search  # noqa: E402
from services.retrieval.engine import RANKINGS  # noqa: E402
from services.retrieval.fusion import FUSIONS  # noqa: E402
from services.toolsproxy import servicer as tools_servicer  # noqa: E402
from services.toolsproxy.cbr import CbrSettings, cbr_schema  # noqa: E402
from services.toolsproxy.tavily import tavily_schema  # noqa: E402

OPENAPI_VERSION = "3.1.0"
TOOL_ARGUMENTS_PREFIX = "visior.toolsproxy.tools.arguments."
"""Components holding a tool's argument schema (ToolsProxy's own, as ListTools states it)."""
FDP = descriptor_pb2.FieldDescriptorProto
COMPONENT_PREFIX = "#/components/schemas/"

# -- what the servers check beyond the protos ------------------------------------------------

_NON_SPACE = r"[^\s\x1c-\x1f\x85]"
NOT_BLANK = {"minLength": 1, "pattern": _NON_SPACE}
MODEL_NAME = {"maxLength": MAX_MODEL_CHARS, "pattern": r"^[^\s\x00-\x1f\x7f]*$"}
"""generate_contract.is_model_name, empty allowed (the default model)."""
"""A required string: the servers strip it (Python's whitespace, which has \\x1c-\\x1f and
\\x85 beyond ECMA's \\s) and refuse what is left empty."""
EMPTY = {"maxLength": 0}
TRACE_ID = {
    "maxLength": 128,
    "pattern": "^(" + _TRACE_ID.pattern.removeprefix("^").removesuffix("$") + ")?$",
}
"""trace_id: empty (one is generated) or the characters services/common/context.py allows."""


def any_script(ascii_class: str) -> str:
    """One character of the bracket expression `[ascii_class]` (ASCII) or any non-ASCII one.

    The servers' ids take letters and digits of every script (Python's `\\w`), which an
    ECMA-262 pattern without the `u` flag cannot name (no `\\p{L}`): the schema lets every
    non-ASCII character through and the server refuses what it does not take. A character
    past U+FFFF is two UTF-16 units to such a pattern, so lengths are bounded with
    minLength / maxLength (characters), never with a quantifier.
    """
    return rf"(?:[{ascii_class}]|[^\x00-\x7F])"


_END = r"$(?!\n)"
"""The end of the string, as the servers' `fullmatch` reads it: Python's `$` (jsonschema uses
`re`) also matches before a final newline, ECMA's never does."""
TENANT_ID = {
    "minLength": 1,
    "maxLength": contract.MAX_TENANT_ID_CHARS,
    "pattern": f"^{any_script('A-Za-z0-9_.:-')}+{_END}",
    "description": f"1-{contract.MAX_TENANT_ID_CHARS} letters (any script), digits, "
    "'.', '_', ':', '-'",
}
"""A tenant id as services/common/search_contract.py is_tenant_id takes it."""
DOC_ID = {
    "maxLength": MAX_DOC_ID_CHARS,
    "pattern": f"^({any_script('A-Za-z0-9')}{any_script('A-Za-z0-9_.-')}*)?{_END}",
    "description": f"(Empty: derived from file_name.) 1-{MAX_DOC_ID_CHARS} letters (any "
    "script), digits, '.', '_', '-', starting with a letter or digit.",
}
"""An IngestDocument doc_id as services/retrieval/ingestion.py takes it (empty: made from
the file name)."""
_ALNUM = any_script("A-Za-z0-9")
FILE_STEM = rf"(^|[/\\])([^/\\.]*{_ALNUM}[^/\\.]*|[^/\\]*{_ALNUM}[^/\\]*\.[^/\\.]*)$"
"""A file name whose stem (last component after a "/" or "\\", last extension off) has a letter
or digit: the doc_id made from it keeps them (docstore/parsing.py slugify: Latin and
Cyrillic ones)."""


def _ext(*names: str) -> str:
    """A case-insensitive file extension pattern (ECMA regexes have no inline flags)."""
    alts = ("".join(f"[{c.lower()}{c.upper()}]" for c in name) for name in names)
    return r"\.(" + "|".join(alts) + ")$"


KNOWN_EXTENSION = _ext(*(suffix[1:] for suffix in SUFFIX_FORMATS))
CSV_EXTENSION = _ext(*(suffix[1:] for suffix, fmt in SUFFIX_FORMATS.items() if fmt == "csv"))
CSV_TYPES = ("text/csv", "application/csv")


def _opt(*values: str) -> dict[str, Any]:
    """A string that is empty (the server's default) or one of `values`."""
    return {"enum": ["", *values]}


# Per field ("<message full name>.<field>"): JSON Schema keywords merged into the field's
# request schema; "items" / "values" go to a repeated field's items / a map's values (for a
# message field they are combined with its $ref through allOf). Per message (no field):
# keywords added to the object itself. Every number comes from the service that checks it.
_DEFAULT_MAX_COMPLETION = LoopSettings().max_completion_tokens
REQUEST_RULES: dict[str, dict[str, Any]] = {
    # Orchestrator (services/orchestrator/respond.py, runtime_config.py)
    "visior.orchestrator.v1.RespondRequest": {
        # Described as either form alone; the server also takes both when they agree.
        "anyOf": [
            {
                "required": ["user"],
                "properties": {
                    "user": {
                        "required": ["tenant_id", "user_id"],
                        "properties": {"tenant_id": NOT_BLANK, "user_id": NOT_BLANK},
                    },
                    "tenant_id": EMPTY,
                    "user_id": EMPTY,
                },
            },
            {
                "required": ["tenant_id", "user_id"],
                "properties": {
                    "user": {"properties": {"tenant_id": EMPTY, "user_id": EMPTY}},
                    "tenant_id": NOT_BLANK,
                    "user_id": NOT_BLANK,
                },
            },
        ],
        "description": "The caller is `user` or the top-level `user_id` + `tenant_id` "
        "(both non-blank; when both forms are given they must agree).",
    },
    "visior.orchestrator.v1.RespondRequest.query": {
        **NOT_BLANK,
        "maxLength": contract.MAX_QUERY_CHARS,
    },
    "visior.orchestrator.v1.RespondRequest.max_results": {
        "minimum": 1,
        "maximum": contract.MAX_RESULTS_LIMIT,
    },
    "visior.orchestrator.v1.RespondRequest.history": {
        "maxItems": orch_respond.MAX_HISTORY_TURNS,
        "items": {"properties": {"role": {"enum": ["user", "assistant"]}}},
    },
    "visior.orchestrator.v1.RespondRequest.doc_ids": {
        "maxItems": contract.MAX_FILTER_VALUES,
        "description": f"(With filters.doc_ids: at most {contract.MAX_FILTER_VALUES} "
        "distinct ids in all.)",
    },
    "visior.orchestrator.v1.RespondRequest.section_ids": {
        "maxItems": contract.MAX_FILTER_VALUES,
        "description": f"(With filters.section_ids: at most {contract.MAX_FILTER_VALUES} "
        "distinct ids in all.)",
    },
    "visior.orchestrator.v1.RespondRequest.trace_id": TRACE_ID,
    "visior.orchestrator.v1.UpdateConfigRequest.default_model": MODEL_NAME,
    **{
        f"visior.orchestrator.v1.UpdateConfigRequest.{name}": {"minimum": lo, "maximum": hi}
        for name, (lo, hi) in orch_config.LIMITS.items()
    },
    "visior.orchestrator.v1.UpdateConfigRequest.window_radius": {
        "minimum": 0,
        "maximum": DEFAULT_WINDOW_RADIUS,
        "description": "(The maximum here is the default of MCP_PROXY_MAX_WINDOW_RADIUS.)",
    },
    "visior.orchestrator.v1.UpdateConfigRequest.window_max": {"minimum": 0},
    "visior.orchestrator.v1.UpdateConfigRequest": {
        "not": {"required": ["window_radius", "window_max"]},
        "description": "Fields left out keep their value. `window_radius` (or the legacy "
        "`window_max`, not both) is capped by the tools proxy's MCP_PROXY_MAX_WINDOW_RADIUS.",
    },
    # LLM (services/llm/engine.py)
    "visior.llm.v1.GenerateRequest.mode": _opt(*llm_engine.MODES),
    "visior.llm.v1.GenerateRequest.messages": {
        "minItems": 1,
        "maxItems": llm_engine.MAX_MESSAGES,
        "contains": {
            "required": ["role", "content"],
            "properties": {"role": {"const": "user"}, "content": NOT_BLANK},
        },
    },
    "visior.llm.v1.GenerateRequest.context_chunks": {"maxItems": llm_engine.MAX_CONTEXT_CHUNKS},
    "visior.llm.v1.GenerateRequest.trace_id": TRACE_ID,
    "visior.llm.v1.GenerateRequest.model": MODEL_NAME,
    "visior.llm.v1.GenerateRequest": {
        "if": {
            "required": ["tool_policy"],
            "properties": {
                "tool_policy": {
                    "required": ["allowed_tools"],
                    "properties": {"allowed_tools": {"minItems": 1}},
                }
            },
        },
        "then": {
            "required": ["user"],
            "properties": {
                "user": {
                    "required": ["tenant_id", "user_id"],
                    "properties": {"tenant_id": NOT_BLANK, "user_id": NOT_BLANK},
                }
            },
        },
        "description": "`user.tenant_id` and `user.user_id` are required when "
        "`tool_policy.allowed_tools` is "
        "not empty; every `planned_calls` tool must be in `allowed_tools`.",
    },
    "visior.llm.v1.GenerationParams.max_tokens": {
        "minimum": 1,
        "maximum": _DEFAULT_MAX_COMPLETION,
        "description": "(The maximum here is the default of MAX_COMPLETION_TOKENS.)",
    },
    "visior.llm.v1.GenerationParams.temperature": {"minimum": 0, "maximum": 2},
    "visior.llm.v1.GenerationParams.top_p": {"minimum": 0, "maximum": 1},
    "visior.llm.v1.GenerationParams.presence_penalty": {"minimum": -2, "maximum": 2},
    "visior.llm.v1.GenerationParams.frequency_penalty": {"minimum": -2, "maximum": 2},
    "visior.llm.v1.GenerationParams.stop": {"maxItems": llm_engine.MAX_STOP_SEQUENCES},
    "visior.llm.v1.ToolPolicy.max_tool_steps": {"minimum": 0},
    "visior.llm.v1.ToolPolicy.context_token_budget": {
        "minimum": 1,
        "description": "(A budget the prompt does not fit in is LLM_LIMIT_EXCEEDED.)",
    },
    "visior.llm.v1.ToolPolicy.window_radius_schedule": {"items": {"minimum": 0}},
    "visior.common.v1.ChatMessage": {"required": ["role"]},
    "visior.common.v1.ChatMessage.role": {"enum": list(llm_engine.ROLES)},
    "visior.common.v1.ChatMessage.content": {"maxLength": llm_engine.MAX_MESSAGE_CHARS},
    # Retrieval (services/retrieval/search.py, engine.py, ingestion.py)
    "visior.retrieval.v1.SearchRequest.query": {
        **NOT_BLANK,
        "maxLength": contract.MAX_QUERY_CHARS,
    },
    "visior.retrieval.v1.SearchRequest.tenant_id": {
        **NOT_BLANK,
        "not": {"const": contract.KB_TENANT},
    },
    "visior.retrieval.v1.SearchRequest.max_results": {
        "minimum": 1,
        "maximum": contract.MAX_RESULTS_LIMIT,
    },
    "visior.retrieval.v1.SearchRequest.trace_id": TRACE_ID,
    "visior.retrieval.v1.SearchParams.retrieval_mode": _opt(*retr_search.MODES),
    "visior.retrieval.v1.SearchParams.ranking": _opt(*RANKINGS),
    "visior.retrieval.v1.SearchParams.fusion": _opt(*FUSIONS),
    **{
        f"visior.retrieval.v1.SearchParams.{name}": {"minimum": 1, "maximum": limit}
        for name, limit in retr_search.PARAM_LIMITS.items()
    },
    "visior.retrieval.v1.SearchParams.context_token_limit": {
        "minimum": 1,
        "maximum": retr_search.MAX_CONTEXT_TOKEN_LIMIT,
    },
    "visior.retrieval.v1.SearchParams.topk_per_doc": {
        "minimum": 0,
        "maximum": retr_search.MAX_TOPK_PER_DOC,
    },
    "visior.retrieval.v1.SearchParams.min_score": {"minimum": 0, "maximum": 1},
    "visior.retrieval.v1.SearchFilters.source": _opt(*contract.SOURCES),
    **{
        f"visior.retrieval.v1.SearchFilters.{name}": {"maxItems": contract.MAX_FILTER_VALUES}
        for name in ("tags", "doc_ids", "section_ids")
    },
    **{
        f"visior.retrieval.v1.SearchFilters.{name}": (
            {"maxItems": contract.MAX_FILTER_VALUES, "items": {"maxLength": chars}}
            if name in ("tags", "doc_ids")
            else {"maxLength": chars}
        )
        for name, chars in FILTER_VALUE_CHARS.items()
    },
    "visior.retrieval.v1.IngestDocumentRequest.tenant_id": TENANT_ID,
    "visior.retrieval.v1.IngestDocumentRequest": {
        "allOf": [
            {
                "anyOf": [
                    {"required": ["doc_id"], "properties": {"doc_id": {"minLength": 1}}},
                    {
                        "required": ["file_name"],
                        "properties": {"file_name": {"pattern": FILE_STEM}},
                    },
                ]
            },
            {
                # services/docstore/parsing.py guess_format: the extension, else the type.
                "anyOf": [
                    {
                        "required": ["content_type"],
                        "properties": {"content_type": {"minLength": 1}},
                    },
                    {
                        "required": ["file_name"],
                        "properties": {"file_name": {"pattern": KNOWN_EXTENSION}},
                    },
                    {"properties": {"content_type": EMPTY, "file_name": EMPTY}},
                ]
            },
        ],
        "if": {
            "anyOf": [
                {
                    "required": ["content_type"],
                    "properties": {"content_type": {"enum": list(CSV_TYPES)}},
                },
                {
                    "properties": {"content_type": EMPTY, "file_name": {"pattern": CSV_EXTENSION}},
                    "required": ["file_name"],
                },
            ]
        },
        "then": {
            "required": ["tenant_id"],
            "properties": {"tenant_id": {"const": contract.KB_TENANT}},
        },
        "description": "`doc_id`, or a `file_name` it can be made from, is required; the format "
        "comes from `content_type`, else from the file name's extension (.md, .markdown, .txt, "
        ".text, .pdf; .csv is the knowledge base's, written only to the reserved tenant).",
    },
    "visior.retrieval.v1.IngestDocumentRequest.doc_id": DOC_ID,
    "visior.retrieval.v1.IngestDocumentRequest.content": {
        "minLength": 1,
        "description": "the raw file, base64; at most RETR_MAX_DOCUMENT_BYTES decoded "
        f"(default 32 MiB) and {envoy_config.INGEST_MAX_REQUEST_BYTES} bytes of JSON",
    },
    "visior.retrieval.v1.IngestDocumentRequest.content_type": _opt(
        "text/markdown", "text/x-markdown", "text/plain", "application/pdf", *CSV_TYPES
    ),
    "visior.retrieval.v1.IngestDocumentRequest.tags": {"maxItems": doc_fields.MAX_TAGS},
    "visior.retrieval.v1.IngestDocumentRequest.metadata": {
        "maxProperties": doc_fields.MAX_METADATA,
        "propertyNames": {"maxLength": 128},
        "values": {"maxLength": doc_fields.MAX_METADATA_VALUE},
    },
    "visior.retrieval.v1.IngestDocumentRequest.trace_id": TRACE_ID,
    "visior.retrieval.v1.DeleteDocumentRequest.tenant_id": NOT_BLANK,
    "visior.retrieval.v1.DeleteDocumentRequest.doc_id": NOT_BLANK,
    "visior.retrieval.v1.DeleteDocumentRequest.trace_id": TRACE_ID,
    "visior.retrieval.v1.ListDocumentsRequest.tenant_id": NOT_BLANK,
    "visior.retrieval.v1.ListDocumentsRequest.trace_id": TRACE_ID,
    # ToolsProxy (services/toolsproxy/servicer.py)
    "visior.toolsproxy.v1.ExecuteRequest.tool_name": {
        **NOT_BLANK,
        "maxLength": tools_servicer.MAX_TOOL_NAME,
        "description": "a tool of GET /internal/mcp/tools; an unknown name is a result with "
        'status "error", not an HTTP error',
    },
    "visior.toolsproxy.v1.ExecuteRequest.user": {
        "required": ["tenant_id", "user_id"],
        "properties": {"tenant_id": NOT_BLANK, "user_id": NOT_BLANK},
    },
    "visior.toolsproxy.v1.ExecuteRequest.trace_id": TRACE_ID,
}

# -- the proto3 JSON mapping ------------------------------------------------------------------

_INT32 = {"type": "integer", "format": "int32", "minimum": -(2**31), "maximum": 2**31 - 1}
_UINT32 = {"type": "integer", "format": "uint32", "minimum": 0, "maximum": 2**32 - 1}
_INT64 = {"type": "string", "format": "int64", "pattern": r"^-?[0-9]+$"}
_UINT64 = {"type": "string", "format": "uint64", "pattern": r"^[0-9]+$"}
SCALARS: Mapping[int, Mapping[str, Any]] = {
    FDP.TYPE_DOUBLE: {"type": "number", "format": "double"},
    FDP.TYPE_FLOAT: {"type": "number", "format": "float"},
    FDP.TYPE_INT32: _INT32,
    FDP.TYPE_SINT32: _INT32,
    FDP.TYPE_SFIXED32: _INT32,
    FDP.TYPE_UINT32: _UINT32,
    FDP.TYPE_FIXED32: _UINT32,
    FDP.TYPE_INT64: _INT64,
    FDP.TYPE_SINT64: _INT64,
    FDP.TYPE_SFIXED64: _INT64,
    FDP.TYPE_UINT64: _UINT64,
    FDP.TYPE_FIXED64: _UINT64,
    FDP.TYPE_BOOL: {"type": "boolean"},
    FDP.TYPE_STRING: {"type": "string"},
    FDP.TYPE_BYTES: {"type": "string", "format": "byte", "contentEncoding": "base64"},
}
"""Scalar fields as the transcoder prints them (64-bit integers are JSON strings)."""

_WRAPPERS = {
    "DoubleValue": FDP.TYPE_DOUBLE,
    "FloatValue": FDP.TYPE_FLOAT,
    "Int64Value": FDP.TYPE_INT64,
    "UInt64Value": FDP.TYPE_UINT64,
    "Int32Value": FDP.TYPE_INT32,
    "UInt32Value": FDP.TYPE_UINT32,
    "BoolValue": FDP.TYPE_BOOL,
    "StringValue": FDP.TYPE_STRING,
    "BytesValue": FDP.TYPE_BYTES,
}
WELL_KNOWN: dict[str, dict[str, Any]] = {
    "google.protobuf.Struct": {"type": "object", "description": "any JSON object"},
    "google.protobuf.Value": {"description": "any JSON value"},
    "google.protobuf.ListValue": {"type": "array", "description": "any JSON array"},
    "google.protobuf.NullValue": {"type": "null"},
    "google.protobuf.Empty": {"type": "object", "maxProperties": 0},
    "google.protobuf.Timestamp": {"type": "string", "format": "date-time"},
    "google.protobuf.Duration": {"type": "string", "pattern": r"^-?[0-9]+(\.[0-9]{1,9})?s$"},
    "google.protobuf.FieldMask": {"type": "string"},
    "google.protobuf.Any": {
        "type": "object",
        "required": ["@type"],
        "properties": {"@type": {"type": "string"}},
    },
    **{f"google.protobuf.{name}": dict(SCALARS[t]) for name, t in _WRAPPERS.items()},
}
"""Well-known types in their proto3 JSON forms (inline, never a component)."""


@dataclass(frozen=True)
class Route:
    """One google.api.http rule: an RPC bound to an HTTP method and path."""

    service: str
    """Fully qualified gRPC service."""
    method: str
    """RPC name."""
    verb: str
    """HTTP method, lower case."""
    path: str
    """HTTP path template."""
    body: str
    """The rule's `body`: "*", a field name, or "" (no body)."""
    input_type: str
    output_type: str
    server_streaming: bool
    listener: str
    """The mesh service (Envoy listener) that serves it."""


class Protos:
    """Messages, enums, services and comments of a FileDescriptorSet, by full name."""

    def __init__(self, fds: descriptor_pb2.FileDescriptorSet) -> None:
        self.messages: dict[str, descriptor_pb2.DescriptorProto] = {}
        self.enums: dict[str, descriptor_pb2.EnumDescriptorProto] = {}
        self.comments: dict[str, str] = {}
        self.routes: list[Route] = []
        listener = {g: s.key for s in SERVICES for g in s.grpc_services}
        for f in fds.file:
            locs = {tuple(loc.path): loc.leading_comments for loc in f.source_code_info.location}
            pkg = f.package
            for i, m in enumerate(f.message_type):
                self._add_message(f"{pkg}.{m.name}", m, (4, i), locs)
            for i, e in enumerate(f.enum_type):
                self._add_enum(f"{pkg}.{e.name}", e, (5, i), locs)
            for si, svc in enumerate(f.service):
                full = f"{pkg}.{svc.name}"
                self._comment(full, locs, (6, si))
                for mi, rpc in enumerate(svc.method):
                    self._comment(f"{full}.{rpc.name}", locs, (6, si, 2, mi))
                    rule = rpc.options.Extensions[annotations_pb2.http]
                    kind = rule.WhichOneof("pattern")
                    if kind is None or kind == "custom":
                        continue
                    if full not in listener:
                        raise SystemExit(f"{full} has HTTP rules but no Envoy listener")
                    self.routes.append(
                        Route(
                            service=full,
                            method=rpc.name,
                            verb=kind,
                            path=getattr(rule, kind),
                            body=rule.body,
                            input_type=rpc.input_type.lstrip("."),
                            output_type=rpc.output_type.lstrip("."),
                            server_streaming=rpc.server_streaming,
                            listener=listener[full],
                        )
                    )

    def _comment(self, name: str, locs: Mapping[tuple[int, ...], str], path: tuple) -> None:
        text = " ".join(line.strip() for line in locs.get(path, "").strip().splitlines())
        if text:
            self.comments[name] = text

    def _add_message(
        self,
        name: str,
        m: descriptor_pb2.DescriptorProto,
        path: tuple[int, ...],
        locs: Mapping[tuple[int, ...], str],
    ) -> None:
        self.messages[name] = m
        self._comment(name, locs, path)
        for j, fld in enumerate(m.field):
            self._comment(f"{name}.{fld.name}", locs, (*path, 2, j))
        for k, nested in enumerate(m.nested_type):
            self._add_message(f"{name}.{nested.name}", nested, (*path, 3, k), locs)
        for k, e in enumerate(m.enum_type):
            self._add_enum(f"{name}.{e.name}", e, (*path, 4, k), locs)

    def _add_enum(
        self,
        name: str,
        e: descriptor_pb2.EnumDescriptorProto,
        path: tuple[int, ...],
        locs: Mapping[tuple[int, ...], str],
    ) -> None:
        self.enums[name] = e
        self._comment(name, locs, path)


def _required_by_proto(fld: descriptor_pb2.FieldDescriptorProto) -> bool:
    behaviors = fld.options.Extensions[field_behavior_pb2.field_behavior]
    return field_behavior_pb2.REQUIRED in behaviors


def _has_presence(fld: descriptor_pb2.FieldDescriptorProto) -> bool:
    """Fields the transcoder omits when unset (all others it always prints)."""
    if fld.label == FDP.LABEL_REPEATED:
        return False
    return fld.type in (FDP.TYPE_MESSAGE, FDP.TYPE_GROUP) or fld.HasField("oneof_index")


class SchemaBuilder:
    """Builds the components for requests (what servers accept) and responses (what they print)."""

    def __init__(self, protos: Protos) -> None:
        self.p = protos
        self.components: dict[str, dict[str, Any]] = {}
        self._names: dict[tuple[str, bool], str] = {}
        # Messages reachable from both a request and a response get two components.
        self._request_side = self._reachable({r.input_type for r in protos.routes})
        self._response_side = self._reachable({r.output_type for r in protos.routes})

    def _reachable(self, roots: set[str]) -> set[str]:
        seen: set[str] = set()
        todo = list(roots)
        while todo:
            name = todo.pop()
            if name in seen or name in WELL_KNOWN or name not in self.p.messages:
                continue
            seen.add(name)
            for fld in self.p.messages[name].field:
                if fld.type == FDP.TYPE_MESSAGE:
                    todo.append(fld.type_name.lstrip("."))
        return seen

    def name(self, message: str, request: bool) -> str:
        both = message in self._request_side and message in self._response_side
        return f"{message}{'.Input' if request else '.Output'}" if both else message

    def ref(self, message: str, request: bool) -> dict[str, Any]:
        if message in WELL_KNOWN:
            return dict(WELL_KNOWN[message])
        key = (message, request)
        if key not in self._names:
            name = self.name(message, request)
            self._names[key] = name
            self.components[name] = {}  # placeholder: recursion stops here
            self.components[name] = self.message_schema(message, request)
        return {"$ref": COMPONENT_PREFIX + self._names[key]}

    def message_schema(self, message: str, request: bool) -> dict[str, Any]:
        m = self.p.messages[message]
        if m.options.map_entry:
            raise ValueError(f"{message} is a map entry")
        props: dict[str, Any] = {}
        required: list[str] = []
        for fld in m.field:
            props[fld.name] = self.field_schema(message, fld, request)
            if request and _required_by_proto(fld):
                required.append(fld.name)
            if not request and not _has_presence(fld):
                required.append(fld.name)
        schema: dict[str, Any] = {"type": "object"}
        desc = self.p.comments.get(message)
        if desc:
            schema["description"] = desc
        schema["properties"] = props
        if required:
            schema["required"] = required
        oneofs = [o.name for o in m.oneof_decl]
        if not request:
            # The transcoder prints exactly the message's fields.
            schema["additionalProperties"] = False
            real = sorted(
                {f.oneof_index for f in m.field if f.HasField("oneof_index")}
                - {f.oneof_index for f in m.field if f.proto3_optional}
            )
            for idx in real:
                members = [
                    f.name for f in m.field if f.HasField("oneof_index") and f.oneof_index == idx
                ]
                schema.setdefault("allOf", []).append(
                    {"oneOf": [{"required": [n]} for n in members]}
                )
                schema.setdefault("x-oneof", {})[oneofs[idx]] = members
        if request:
            # Unknown fields are dropped, but the transcoder refuses an empty field name.
            schema["propertyNames"] = {"minLength": 1}
            rule = REQUEST_RULES.get(message, {})
            for key, value in rule.items():
                if key == "description":
                    schema["description"] = f"{schema.get('description', '')} {value}".strip()
                elif key == "required":
                    schema["required"] = sorted({*schema.get("required", []), *value})
                else:
                    schema[key] = value
        return schema

    def field_schema(
        self, message: str, fld: descriptor_pb2.FieldDescriptorProto, request: bool
    ) -> dict[str, Any]:
        rule = dict(REQUEST_RULES.get(f"{message}.{fld.name}", {})) if request else {}
        items_rule = rule.pop("items", None)
        values_rule = rule.pop("values", None)
        extra_desc = rule.pop("description", None)
        map_entry = self._map_entry(fld)
        if map_entry is not None:
            value_fld = map_entry.field[1]
            values = self._single(value_fld, request)
            if values_rule:
                values = _merge(values, values_rule)
            schema: dict[str, Any] = {"type": "object", "additionalProperties": values}
            schema = _merge(schema, rule)
        elif fld.label == FDP.LABEL_REPEATED:
            items = self._single(fld, request)
            if items_rule:
                items = _merge(items, items_rule)
            schema = _merge({"type": "array", "items": items}, rule)
        else:
            schema = _merge(self._single(fld, request), rule)
        desc = " ".join(d for d in (self.p.comments.get(f"{message}.{fld.name}"), extra_desc) if d)
        if desc:
            schema = (
                {"description": desc, **schema}
                if "$ref" not in schema
                else {**schema, "description": desc}
            )
        return schema

    def _map_entry(
        self, fld: descriptor_pb2.FieldDescriptorProto
    ) -> descriptor_pb2.DescriptorProto | None:
        if fld.label != FDP.LABEL_REPEATED or fld.type != FDP.TYPE_MESSAGE:
            return None
        entry = self.p.messages.get(fld.type_name.lstrip("."))
        return entry if entry is not None and entry.options.map_entry else None

    def _single(self, fld: descriptor_pb2.FieldDescriptorProto, request: bool) -> dict[str, Any]:
        if fld.type in SCALARS:
            return dict(SCALARS[fld.type])
        if fld.type == FDP.TYPE_ENUM:
            return self._enum(fld.type_name.lstrip("."))
        if fld.type in (FDP.TYPE_MESSAGE, FDP.TYPE_GROUP):
            return self.ref(fld.type_name.lstrip("."), request)
        raise ValueError(f"unsupported field type {fld.type} of {fld.name}")

    def _enum(self, name: str) -> dict[str, Any]:
        if name in WELL_KNOWN:
            return dict(WELL_KNOWN[name])
        e = self.p.enums[name]
        schema: dict[str, Any] = {"type": "string", "enum": [v.name for v in e.value]}
        desc = self.p.comments.get(name)
        if desc:
            schema["description"] = desc + " (numbers are accepted on input)"
        return schema


def _merge(schema: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """`schema` narrowed by `extra`; a $ref is kept whole and combined through allOf."""
    if not extra:
        return schema
    if "$ref" in schema:
        return {"allOf": [schema, dict(extra)]}
    return {**schema, **extra}


# -- errors -----------------------------------------------------------------------------------

STATUS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "google.rpc.Status as JSON, from a server (transcoded) or from Envoy itself "
    '(local reply, ErrorInfo domain "envoy"). `details` holds one google.rpc.ErrorInfo whose '
    "`reason` is the spec's error code (INVALID_ARGUMENT, LIMIT_EXCEEDED, "
    "MISSING_USER_CONTEXT, LLM_LIMIT_EXCEEDED, backend_unavailable, UPSTREAM_UNAVAILABLE, "
    "PAYLOAD_TOO_LARGE, NOT_FOUND, DEADLINE_EXCEEDED, ...); it is empty when a server "
    'aborted without details. See envoy/README.md, "Error body".',
    "required": ["code", "message", "details"],
    "properties": {
        "code": {"type": "integer", "description": "google.rpc.Code, never 0 (OK)"},
        "message": {"type": "string"},
        "details": {"type": "array", "items": {"$ref": COMPONENT_PREFIX + "google.rpc.ErrorInfo"}},
    },
}
ERROR_INFO_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["@type"],
    "properties": {
        "@type": {"type": "string", "examples": ["type.googleapis.com/google.rpc.ErrorInfo"]},
        "reason": {"type": "string", "description": "the spec's error code"},
        "domain": {"type": "string", "description": "visior.<service> or envoy"},
        "metadata": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": "e.g. field, limit, downstream; Envoy's replies add "
            "response_code_details, response_flags, request_id",
        },
    },
}
ERROR_RESPONSES: dict[str, str] = {
    "400": "Bad input or an exceeded limit (INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE), "
    "malformed JSON, an unknown query parameter",
    "404": "Unknown path or method (NOT_FOUND), or the named thing does not exist",
    "413": "Body over the route's limit (PAYLOAD_TOO_LARGE)",
    "429": "A rate limit (RESOURCE_EXHAUSTED)",
    "500": "A bug (INTERNAL); the message only says to look up the trace id in the logs",
    "502": "A downstream failed or is down (UNAVAILABLE: backend_unavailable, "
    "UPSTREAM_UNAVAILABLE, LLM_RUNTIME_ERROR, ...), or this service is down",
    "504": "The route timeout passed (DEADLINE_EXCEEDED)",
}


# -- the document -----------------------------------------------------------------------------


def _limits(route: Route) -> tuple[int, float]:
    rules = [
        r
        for r in envoy_config.ROUTE_RULES
        if r.path == route.path and (r.method is None or r.method.lower() == route.verb)
    ]
    body = next((r.max_request_bytes for r in rules if r.max_request_bytes), None)
    timeout = envoy_config.route_timeout(route.path, route.verb)
    return body or envoy_config.DEFAULT_MAX_REQUEST_BYTES, timeout


def _query_parameters(builder: SchemaBuilder, message: str, prefix: str = "") -> Iterator[dict]:
    """Every scalar (or repeated scalar) field as a query parameter; nested ones dotted."""
    for fld in builder.p.messages[message].field:
        name = f"{prefix}{fld.name}"
        if fld.type == FDP.TYPE_MESSAGE and fld.type_name.lstrip(".") not in WELL_KNOWN:
            if builder._map_entry(fld) is None and fld.label != FDP.LABEL_REPEATED:
                yield from _query_parameters(builder, fld.type_name.lstrip("."), name + ".")
            continue
        schema = builder.field_schema(message, fld, request=True)
        desc = schema.pop("description", None)
        param: dict[str, Any] = {
            "name": name,
            "in": "query",
            "required": _required_by_proto(fld),
            "schema": schema,
        }
        if desc:
            param["description"] = desc
        if fld.label == FDP.LABEL_REPEATED:
            param["style"] = "form"
            param["explode"] = True
        yield param


def _operation(builder: SchemaBuilder, routes: list[Route]) -> dict[str, Any]:
    route = routes[0]
    max_body, timeout = _limits(route)
    summary = builder.p.comments.get(f"{route.service}.{route.method}", route.method)
    op: dict[str, Any] = {
        # /health is one path on every sidecar: one operation for the four GetHealth RPCs.
        "operationId": (
            f"{route.service.rsplit('.', 1)[-1]}.{route.method}"
            if len(routes) == 1
            else route.method
        ),
        "summary": summary.split(". ")[0].rstrip("."),
        "description": summary + _served_by(routes) + _limits_text(max_body, timeout),
        "tags": [r.listener for r in routes],
        "x-grpc-methods": [f"{r.service}/{r.method}" for r in routes],
        "x-visior-listeners": [r.listener for r in routes],
    }
    params: list[dict[str, Any]] = []
    if not route.body:
        params = list(_query_parameters(builder, route.input_type))
    elif route.body == "*":
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": builder.ref(route.input_type, True)}},
        }
    else:
        msg = builder.p.messages[route.input_type]
        fld = next(f for f in msg.field if f.name == route.body)
        op["requestBody"] = {
            "required": _required_by_proto(fld),
            "content": {
                "application/json": {"schema": builder.field_schema(route.input_type, fld, True)}
            },
        }
        params = [
            p
            for p in _query_parameters(builder, route.input_type)
            if p["name"].split(".")[0] != route.body
        ]
    if params:
        op["parameters"] = params
    out = builder.ref(route.output_type, request=False)
    if route.server_streaming:
        out = {
            "type": "array",
            "items": out,
            "description": "The stream's messages as one JSON array, written as they arrive.",
        }
    responses: dict[str, Any] = {
        "200": {"description": "OK", "content": {"application/json": {"schema": out}}}
    }
    for status in ERROR_RESPONSES:
        responses[status] = {"$ref": f"#/components/responses/Error{status}"}
    op["responses"] = responses
    return op


def _served_by(routes: list[Route]) -> str:
    if len(routes) == 1:
        return ""
    return f" Served by every sidecar ({', '.join(r.listener for r in routes)})."


def _limits_text(max_body: int, timeout: float) -> str:
    wait = f"{timeout:g} s" if timeout else "none (60 s idle)"
    return f" Envoy: route timeout {wait}, body limit {max_body} bytes."


def build(fds: descriptor_pb2.FileDescriptorSet, ports: Ports | None = None) -> dict[str, Any]:
    """The OpenAPI document for every HTTP rule of the services Envoy transcodes."""
    ports = ports or Ports()
    protos = Protos(fds)
    builder = SchemaBuilder(protos)
    server_of = {
        s.key: {"url": f"http://127.0.0.1:{ports.http[s.key]}", "description": f"{s.key} sidecar"}
        for s in SERVICES
    }
    grouped: dict[tuple[str, str], list[Route]] = {}
    order = [s.key for s in SERVICES]
    for r in sorted(protos.routes, key=lambda r: order.index(r.listener)):
        grouped.setdefault((r.path, r.verb), []).append(r)
    paths: dict[str, dict[str, Any]] = {}
    for (path, verb), routes in sorted(grouped.items()):
        servers = [server_of[r.listener] for r in routes]
        item = paths.setdefault(path, {})
        if "servers" in item and item["servers"] != servers:
            raise SystemExit(f"{path}: its methods are served by different sidecars")
        item["servers"] = servers
        item[verb] = _operation(builder, routes)
    for path, item in paths.items():
        paths[path] = {"servers": item.pop("servers"), **dict(sorted(item.items()))}
    components = dict(sorted(builder.components.items()))
    components["google.rpc.Status"] = STATUS_SCHEMA
    components["google.rpc.ErrorInfo"] = ERROR_INFO_SCHEMA
    # The external tools' arguments as agent.md §3 names them, with the default limits.
    components[TOOL_ARGUMENTS_PREFIX + "fetch_cbr_data"] = cbr_schema(CbrSettings())
    components[TOOL_ARGUMENTS_PREFIX + "fetch_finance_news"] = tavily_schema()
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "Visior mesh JSON routes",
            "version": "v1",
            "description": "Generated by tools/openapi.py from the protos' google.api.http rules "
            "(do not edit; run `make gen`). Each service has its own Envoy sidecar: a path's "
            "`servers` name the listener(s) that serve it (default ports of `make run`). JSON "
            "uses proto field names (lowerCamelCase is accepted on input), prints every field "
            "without presence (zero values included), 64-bit integers as strings and bytes as "
            "base64. Unknown request fields are dropped by Envoy; unknown query parameters are "
            "a 400. Every error is a google.rpc.Status (see components).",
        },
        "servers": [server_of[s.key] for s in SERVICES],
        "tags": [{"name": s.key, "description": ", ".join(s.grpc_services)} for s in SERVICES],
        "paths": paths,
        "components": {
            "schemas": components,
            "responses": {
                f"Error{status}": {
                    "description": text,
                    "content": {
                        "application/json": {
                            "schema": {"$ref": COMPONENT_PREFIX + "google.rpc.Status"}
                        }
                    },
                }
                for status, text in ERROR_RESPONSES.items()
            },
        },
    }


def compile_protos(out: Path) -> Path:
    """proto/ as a descriptor set with imports and comments (what Envoy gets, plus comments)."""
    protos = sorted(str(p.relative_to(REPO / "proto")) for p in (REPO / "proto").rglob("*.proto"))
    target = out / "visior-with-source.pb"
    subprocess.run(
        [
            sys.executable, "-m", "grpc_tools.protoc", "-Iproto", "-Ithird_party",
            "--include_imports", "--include_source_info", f"--descriptor_set_out={target}",
            *protos,
        ],
        cwd=REPO, check=True,
    )  # fmt: skip
    return target


class _Dumper(yaml.SafeDumper):
    """Writes repeated objects out in full: no YAML anchors and aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(fds: descriptor_pb2.FileDescriptorSet) -> str:
    header = "# Generated by tools/openapi.py from proto/ (make gen). Do not edit.\n"
    body = yaml.dump(
        build(fds),
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        width=100,
        default_flow_style=False,
    )
    return header + body


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--descriptor-set", type=Path, help="default: compile proto/ now")
    ap.add_argument("--out", type=Path, help="default: stdout")
    args = ap.parse_args(argv)
    fds = descriptor_pb2.FileDescriptorSet()
    if args.descriptor_set:
        fds.ParseFromString(args.descriptor_set.read_bytes())
    else:
        with tempfile.TemporaryDirectory() as tmp:
            fds.ParseFromString(compile_protos(Path(tmp)).read_bytes())
    text = render(fds)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
