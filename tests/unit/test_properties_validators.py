"""Property tests of every service's request validation: proto in, domain check, error out.

Each service turns its request into the domain's input (the servicer's converter) and
validates it: Retrieval `Search` and `IngestDocument`, the Orchestrator's `Respond` and
`UpdateConfig`, the LLM's `Generate`, the ToolsProxy's `Execute`. For any request a
client can put on the wire (random values of every field, generated from the message
descriptors, so a new field joins in by itself) the only possible refusal is
`InvalidArgumentError` (`LimitExceededError` included), it names a field of the request,
and the same request always gets the same answer. Valid requests pass; every limit is
checked at the limit and one past it, with the documented reason.
"""

from __future__ import annotations

import asyncio
import math
import string
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from google.protobuf import struct_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import given, settings
from hypothesis import strategies as st
from visior.common.v1 import common_pb2
from visior.llm.v1 import llm_pb2
from visior.orchestrator.v1 import orchestrator_pb2
from visior.retrieval.v1 import retrieval_pb2
from visior.toolsproxy.v1 import toolsproxy_pb2

from services.common import document_limits, errors
from services.common import search_contract as contract
from services.docstore import fields
from services.llm import engine as llm_engine
from services.llm.loop import LoopSettings
from services.llm.servicer import generate_input
from services.orchestrator import respond as orch_respond
from services.orchestrator.runtime_config import LIMITS as CONFIG_LIMITS
from services.orchestrator.runtime_config import ConfigHolder, RuntimeConfig
from services.orchestrator.servicer import config_update, respond_input, safety_verdict
from services.retrieval import search as retr_search
from services.retrieval.ingestion import Ingestor
from services.retrieval.servicer import IngestionServicer, search_query
from services.toolsproxy.servicer import MAX_TOOL_NAME, ToolsProxyServicer
from services.toolsproxy.tools import Outcome
from tests.unit.properties import CONTROL, FAST

# --- any request a client can send ------------------------------------------------------

# Protobuf strings are UTF-8: unpaired surrogates cannot be sent (the client library and
# the server's decoder refuse them), so the text here is every other code point.
wire_text = st.one_of(
    st.text(st.one_of(st.characters(exclude_categories=("Cs",)), st.sampled_from(CONTROL)),
            max_size=20),
    st.sampled_from(["", " ", "\t\n", "demo", "user", "assistant", "rag", "chat",
                     "knowledge_base", "__knowledge_base__", "doc_first", "trace-1"]),
    st.integers(0, 5000).map(lambda n: "я" * n),
)  # fmt: skip
int32 = st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(-3, 300))
doubles = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 5e-324, 1.7976931348623157e308]),
    st.floats(allow_nan=True, allow_infinity=True, width=64),
)
struct_values = st.recursive(
    st.one_of(st.none(), st.booleans(), doubles, wire_text),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(wire_text, inner, max_size=3),
    max_leaves=6,
)

_SCALARS: dict[int, st.SearchStrategy[Any]] = {
    FieldDescriptor.TYPE_STRING: wire_text,
    FieldDescriptor.TYPE_INT32: int32,
    FieldDescriptor.TYPE_INT64: st.integers(-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: st.integers(0, 2**32 - 1),
    FieldDescriptor.TYPE_DOUBLE: doubles,
    FieldDescriptor.TYPE_FLOAT: st.floats(allow_nan=True, allow_infinity=True, width=32),
    FieldDescriptor.TYPE_BOOL: st.booleans(),
    FieldDescriptor.TYPE_BYTES: st.binary(max_size=64),
}


def _value(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if field.type == FieldDescriptor.TYPE_ENUM:
        return st.sampled_from([v.number for v in field.enum_type.values])
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return message_of(field.message_type, depth + 1)
    return _SCALARS[field.type]


@st.composite
def _message(draw: st.DrawFn, descriptor: Descriptor, depth: int) -> dict[str, Any]:
    """Field name -> value for a random subset of the message's fields."""
    out: dict[str, Any] = {}
    for field in descriptor.fields:
        if not draw(st.booleans()):
            continue
        msg = field.message_type
        if msg is not None and msg.GetOptions().map_entry:
            out[field.name] = draw(
                st.dictionaries(wire_text, _value(msg.fields_by_name["value"], depth), max_size=3)
            )
        elif field.is_repeated:
            if depth >= 3 and msg is not None:
                continue
            size = draw(
                st.one_of(st.integers(0, 3), st.sampled_from([20, 21, 50, 51, 64, 65, 101]))
            )
            one = _value(field, depth)
            if size > 3:  # the same item repeated: long lists without drawing each
                out[field.name] = [draw(one)] * size
            else:
                out[field.name] = [draw(one) for _ in range(size)]
        elif msg is not None:
            if depth < 3:
                out[field.name] = draw(_value(field, depth))
        else:
            out[field.name] = draw(_value(field, depth))
    return out


def message_of(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Any]:
    if descriptor.full_name == "google.protobuf.Struct":
        # Top-level numbers often: they reach the tool schemas (NaN, Infinity included).
        return st.dictionaries(wire_text, st.one_of(doubles, struct_values), max_size=3).map(
            _struct
        )
    return _message(descriptor, depth)


def _struct(data: dict[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(data)
    return s


def build(cls: type[Message], fields: dict[str, Any]) -> Any:
    """A message of `cls` from field values as `message_of` draws them."""
    msg = cls()
    for name, value in fields.items():
        field = cls.DESCRIPTOR.fields_by_name[name]
        target = getattr(msg, name)
        sub = field.message_type
        if sub is not None and sub.GetOptions().map_entry:
            vclass = sub.fields_by_name["value"]
            for k, v in value.items():
                if vclass.message_type is None:
                    target[k] = v
                else:
                    target[k].CopyFrom(_sub(vclass, v))
        elif field.is_repeated:
            if sub is None:
                target.extend(value)
            else:
                target.extend(_sub(field, v) for v in value)
        elif sub is not None:
            target.CopyFrom(_sub(field, value))
        else:
            setattr(msg, name, value)
    return msg


def _sub(field: FieldDescriptor, value: Any) -> Any:
    if isinstance(value, Message):
        return value
    return build(field.message_type._concrete_class, value)  # type: ignore[attr-defined]


def requests(cls: type[Message]) -> st.SearchStrategy[Any]:
    return message_of(cls.DESCRIPTOR).map(lambda fields: build(cls, fields))


# --- the validators, as each service runs them -------------------------------------------


def validate_search(req: retrieval_pb2.SearchRequest) -> None:
    retr_search.validate(search_query(req), retr_search.SearchDefaults())


MAX_DOCUMENT_BYTES = 1000


class _Stop(Exception):
    pass


class _Capture:
    """Stands in for the Ingestor behind the servicer: keeps the domain input it gets."""

    item: Any = None

    async def ingest(self, item: Any, *, time_left_s: float | None = None) -> Any:
        self.item = item
        raise _Stop


INGESTOR = Ingestor(
    store=None, index=None, embedder=None, sections=None, journal=None,  # type: ignore[arg-type]
    max_document_bytes=MAX_DOCUMENT_BYTES,
)  # fmt: skip
LOOP = asyncio.new_event_loop()


def validate_ingest(req: retrieval_pb2.IngestDocumentRequest) -> None:
    capture = _Capture()
    with pytest.raises(_Stop):
        context = SimpleNamespace(time_remaining=lambda: None)  # no deadline
        LOOP.run_until_complete(IngestionServicer(capture).IngestDocument(req, context))  # type: ignore[arg-type]
    INGESTOR._validate(capture.item)


def validate_respond(req: orchestrator_pb2.RespondRequest) -> None:
    orch_respond.validate(respond_input(req))


def validate_config(req: orchestrator_pb2.UpdateConfigRequest) -> None:
    ConfigHolder(RuntimeConfig(), max_window_radius=3).update(config_update(req))


BUDGETS = LoopSettings()


def validate_generate(req: llm_pb2.GenerateRequest) -> None:
    llm_engine.validate(generate_input(req), BUDGETS)


class _Executor:
    async def execute(self, name: str, arguments: Any, caller: Any) -> Outcome:
        return Outcome("ok", result={})

    def catalogue(self) -> list[Any]:
        return []


def validate_execute(req: toolsproxy_pb2.ExecuteRequest) -> None:
    servicer = ToolsProxyServicer(_Executor())  # type: ignore[arg-type]
    LOOP.run_until_complete(servicer.Execute(req, None))  # type: ignore[arg-type]


VALIDATORS: dict[str, tuple[type[Message], Callable[[Any], None]]] = {
    "search": (retrieval_pb2.SearchRequest, validate_search),
    "ingest": (retrieval_pb2.IngestDocumentRequest, validate_ingest),
    "respond": (orchestrator_pb2.RespondRequest, validate_respond),
    "config": (orchestrator_pb2.UpdateConfigRequest, validate_config),
    "generate": (llm_pb2.GenerateRequest, validate_generate),
    "execute": (toolsproxy_pb2.ExecuteRequest, validate_execute),
}


Refusal = tuple[str, str, str, dict[str, str]]
"""(error class, ErrorInfo reason, message, ErrorInfo metadata)."""


def outcome(check: Callable[[Any], None], req: Any) -> Refusal | None:
    """None when accepted; else the refusal, which must be the documented kind."""
    try:
        check(req)
    except errors.ServiceError as exc:
        assert isinstance(exc, errors.InvalidArgumentError), repr(exc)
        assert exc.code == errors.INVALID_ARGUMENT and exc.message
        return (type(exc).__name__, exc.reason, exc.message, dict(exc.metadata))
    return None


def names_a_field(cls: type[Message], field: str) -> bool:
    """`field` (as ErrorInfo metadata says it: "params.max_docs", "messages[3].role")
    starts with a field of the request."""
    head = field.split(".", 1)[0].split("[", 1)[0]
    return head in cls.DESCRIPTOR.fields_by_name


# --- properties --------------------------------------------------------------------------


def mutated(name: str) -> st.SearchStrategy[Any]:
    """A valid request with random values merged into some of its fields: mostly valid,
    so the checks behind the first ones (tool arguments, limits of nested fields) are hit."""
    cls = VALIDATORS[name][0]
    return st.tuples(VALID[name], requests(cls)).map(lambda pair: _merged(cls, *pair))


def _merged(cls: type[Message], valid: Any, noise: Any) -> Any:
    out = cls()
    out.CopyFrom(valid)
    out.MergeFrom(noise)
    return out


@settings(FAST, max_examples=300)
@given(st.data())
def test_any_request_is_accepted_or_refused_as_invalid_argument_naming_a_field(
    data: st.DataObject,
) -> None:
    name = data.draw(st.sampled_from(sorted(VALIDATORS)))
    cls, check = VALIDATORS[name]
    req = data.draw(st.one_of(requests(cls), mutated(name)))
    first = outcome(check, req)
    again = outcome(check, cls.FromString(req.SerializeToString()))  # as the server decodes it
    assert first == again, (first, again)  # deterministic
    if first is not None:
        assert names_a_field(cls, first[3].get("field", "")), (name, first)


U = common_pb2.UserContext(user_id="u1", tenant_id="demo")
ids = st.text(string.ascii_letters + string.digits + "-_.", min_size=1, max_size=40).filter(
    lambda s: s[0].isalnum()
)
# A query with something to search: normalise_query drops controls, format marks,
# separators and private-use characters (Co), so a query of those alone is refused.
queries = st.text(
    st.characters(exclude_categories=("Cs", "Cc", "Cf", "Co", "Zs", "Zl", "Zp")),
    min_size=1,
    max_size=60,
)


@st.composite
def valid_search(draw: st.DrawFn) -> retrieval_pb2.SearchRequest:
    req = retrieval_pb2.SearchRequest(query=draw(queries), tenant_id=draw(ids))
    if draw(st.booleans()):
        req.max_results = draw(st.integers(1, contract.MAX_RESULTS_LIMIT))
    p = req.params
    for name, limit in retr_search.PARAM_LIMITS.items():
        if draw(st.booleans()):
            setattr(p, name, draw(st.integers(1, limit)))
    if draw(st.booleans()):
        p.context_token_limit = draw(st.integers(1, retr_search.MAX_CONTEXT_TOKEN_LIMIT))
    if draw(st.booleans()):
        p.topk_per_doc = draw(st.integers(0, retr_search.MAX_TOPK_PER_DOC))
    if draw(st.booleans()):
        p.min_score = draw(st.floats(0.0, 1.0))
    p.retrieval_mode = draw(st.sampled_from(("", *retr_search.MODES)))
    req.filters.source = draw(st.sampled_from(["", "user", "knowledge_base"]))
    req.filters.doc_ids.extend(draw(st.lists(ids, max_size=contract.MAX_FILTER_VALUES)))
    return req


@st.composite
def valid_respond(draw: st.DrawFn) -> orchestrator_pb2.RespondRequest:
    req = orchestrator_pb2.RespondRequest(query=draw(queries))
    if draw(st.booleans()):
        req.user.CopyFrom(common_pb2.UserContext(user_id=draw(ids), tenant_id=draw(ids)))
    else:
        req.user_id, req.tenant_id = draw(ids), draw(ids)
    if draw(st.booleans()):
        req.max_results = draw(st.integers(1, contract.MAX_RESULTS_LIMIT))
    turns = draw(st.lists(st.sampled_from(["user", "assistant"]),
                          max_size=orch_respond.MAX_HISTORY_TURNS))  # fmt: skip
    for role in turns:
        req.history.add(role=role, content=draw(queries))
    return req


@st.composite
def valid_generate(draw: st.DrawFn) -> llm_pb2.GenerateRequest:
    req = llm_pb2.GenerateRequest(mode=draw(st.sampled_from(["", "rag", "chat"])))
    for role in draw(st.lists(st.sampled_from(llm_engine.ROLES), max_size=5)):
        req.messages.add(role=role, content=draw(queries))
    req.messages.add(role="user", content=draw(queries))
    p = req.generation_params
    if draw(st.booleans()):
        p.max_tokens = draw(st.integers(1, BUDGETS.max_completion_tokens))
    if draw(st.booleans()):
        p.temperature = draw(st.floats(0.0, 2.0))
    if draw(st.booleans()):
        p.top_p = draw(st.floats(0.0, 1.0))
    p.stop.extend(draw(st.lists(queries, max_size=llm_engine.MAX_STOP_SEQUENCES)))
    return req


@st.composite
def valid_config(draw: st.DrawFn) -> orchestrator_pb2.UpdateConfigRequest:
    req = orchestrator_pb2.UpdateConfigRequest()
    for name, (lo, hi) in CONFIG_LIMITS.items():
        if draw(st.booleans()):
            setattr(req, name, draw(st.integers(lo, hi)))
    if draw(st.booleans()):
        req.window_radius = draw(st.integers(0, 3))
    return req


@st.composite
def valid_ingest(draw: st.DrawFn) -> retrieval_pb2.IngestDocumentRequest:
    return retrieval_pb2.IngestDocumentRequest(
        tenant_id=draw(ids),
        doc_id=draw(ids),
        file_name="notes.md",
        content=draw(st.binary(min_size=1, max_size=MAX_DOCUMENT_BYTES)),
        tags=draw(st.lists(ids, max_size=fields.MAX_TAGS)),
        metadata=draw(st.dictionaries(ids, queries, max_size=fields.MAX_METADATA)),
    )


@st.composite
def valid_execute(draw: st.DrawFn) -> toolsproxy_pb2.ExecuteRequest:
    req = toolsproxy_pb2.ExecuteRequest(tool_name=draw(ids), user=U)
    req.arguments.update(draw(st.dictionaries(ids, st.one_of(ids, st.integers(-5, 5)))))
    return req


VALID = {
    "search": valid_search(),
    "ingest": valid_ingest(),
    "respond": valid_respond(),
    "config": valid_config(),
    "generate": valid_generate(),
    "execute": valid_execute(),
}


@FAST
@given(st.data())
def test_valid_requests_are_accepted(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(VALID)))
    req = data.draw(VALID[name])
    assert outcome(VALIDATORS[name][1], req) is None


def test_every_validator_has_a_valid_request_strategy() -> None:
    assert set(VALID) == set(VALIDATORS)


# --- limits: at the limit accepted, one past it refused naming the field -------------------


def _search(**kw: Any) -> retrieval_pb2.SearchRequest:
    req = retrieval_pb2.SearchRequest(query="LDAP", tenant_id="demo")
    for key, value in kw.items():
        if key.startswith("params."):
            setattr(req.params, key[7:], value)
        elif key.startswith("filters."):
            getattr(req.filters, key[8:]).extend(value)
        else:
            setattr(req, key, value)
    return req


def _ingest(**kw: Any) -> retrieval_pb2.IngestDocumentRequest:
    fields: dict[str, Any] = {"tenant_id": "demo", "doc_id": "d1", "content": b"# T\n\nx"}
    return retrieval_pb2.IngestDocumentRequest(**{**fields, **kw})


def _respond(**kw: Any) -> orchestrator_pb2.RespondRequest:
    history = kw.pop("history", 0)
    req = orchestrator_pb2.RespondRequest(**{"query": "LDAP?", "user": U, **kw})
    for _ in range(history):
        req.history.add(role="user", content="hi")
    return req


def _generate(**kw: Any) -> llm_pb2.GenerateRequest:
    req = llm_pb2.GenerateRequest()
    messages = kw.pop("messages", 1)
    content = kw.pop("content", "LDAP?")
    for _ in range(messages):
        req.messages.add(role="user", content=content)
    for _ in range(kw.pop("context_chunks", 0)):
        req.context_chunks.add(doc_id="d", text="t")
    req.generation_params.stop.extend(["x"] * kw.pop("stop", 0))
    for key, value in kw.items():
        setattr(req.generation_params, key, value)
    return req


def _stops(*stops: str) -> llm_pb2.GenerateRequest:
    req = _generate()
    req.generation_params.stop.extend(stops)
    return req


def _model(name: str) -> llm_pb2.GenerateRequest:
    req = _generate()
    req.model = name
    return req


def _radii(*schedule: int) -> llm_pb2.GenerateRequest:
    req = _generate()
    req.tool_policy.window_radius_schedule.extend(schedule)
    return req


def _ids(n: int, prefix: str = "v") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def _respond_ids(
    name: str, top: Sequence[str], filtered: Sequence[str] = ()
) -> orchestrator_pb2.RespondRequest:
    """A Respond with `top` as its top-level `name` (doc_ids, section_ids) and `filtered` as
    filters.`name`."""
    return _respond(**{name: top}, filters=retrieval_pb2.SearchFilters(**{name: filtered}))


def _execute(tool_name: str, user: common_pb2.UserContext = U) -> toolsproxy_pb2.ExecuteRequest:
    return toolsproxy_pb2.ExecuteRequest(tool_name=tool_name, user=user)


def _user(tenant_id: str) -> common_pb2.UserContext:
    return common_pb2.UserContext(user_id="u1", tenant_id=tenant_id)


def _person(user_id: str, roles: Sequence[str] = ()) -> common_pb2.UserContext:
    return common_pb2.UserContext(user_id=user_id, tenant_id="t1", roles=list(roles))


def _with_tools(
    req: llm_pb2.GenerateRequest, user: common_pb2.UserContext
) -> llm_pb2.GenerateRequest:
    req.tool_policy.allowed_tools.append("read_doc_metadata")
    req.user.CopyFrom(user)
    return req


def _config(**kw: Any) -> orchestrator_pb2.UpdateConfigRequest:
    return orchestrator_pb2.UpdateConfigRequest(**kw)


LIMIT = "LIMIT_EXCEEDED"
INVALID = "INVALID_ARGUMENT"
LLM_LIMIT = "LLM_LIMIT_EXCEEDED"
up = math.nextafter
R = retr_search
# (validator, request at the limit, request one past it, reason, field named)
LIMITS: list[tuple[str, Any, Any, str, str]] = [
    ("search", _search(max_results=contract.MAX_RESULTS_LIMIT), _search(max_results=contract.MAX_RESULTS_LIMIT + 1), LIMIT, "max_results"),
    ("search", _search(max_results=1), _search(max_results=0), INVALID, "max_results"),
    ("search", _search(query="q" * contract.MAX_QUERY_CHARS), _search(query="q" * (contract.MAX_QUERY_CHARS + 1)), LIMIT, "query"),
    *[
        ("search", _search(**{f"params.{n}": lim}), _search(**{f"params.{n}": lim + 1}), LIMIT, f"params.{n}")
        for n, lim in R.PARAM_LIMITS.items()
    ],
    *[("search", _search(**{f"params.{n}": 1}), _search(**{f"params.{n}": 0}), LIMIT, f"params.{n}") for n in R.PARAM_LIMITS],
    ("search", _search(**{"params.context_token_limit": R.MAX_CONTEXT_TOKEN_LIMIT}),
     _search(**{"params.context_token_limit": R.MAX_CONTEXT_TOKEN_LIMIT + 1}), LIMIT, "params.context_token_limit"),
    ("search", _search(**{"params.topk_per_doc": R.MAX_TOPK_PER_DOC}),
     _search(**{"params.topk_per_doc": R.MAX_TOPK_PER_DOC + 1}), LIMIT, "params.topk_per_doc"),
    ("search", _search(**{"params.topk_per_doc": 0}), _search(**{"params.topk_per_doc": -1}), LIMIT, "params.topk_per_doc"),
    ("search", _search(**{"params.min_score": 1.0}), _search(**{"params.min_score": up(1.0, 2.0)}), INVALID, "params.min_score"),
    ("search", _search(**{"params.min_score": 0.0}), _search(**{"params.min_score": -5e-324}), INVALID, "params.min_score"),
    ("search", _search(**{"params.min_score": 0.5}), _search(**{"params.min_score": math.nan}), INVALID, "params.min_score"),
    *[
        ("search", _search(**{f"filters.{n}": ["v"] * contract.MAX_FILTER_VALUES}),
         _search(**{f"filters.{n}": ["v"] * (contract.MAX_FILTER_VALUES + 1)}), LIMIT, f"filters.{n}")
        for n in ("tags", "doc_ids", "section_ids")
    ],
    ("ingest", _ingest(content=b"x" * MAX_DOCUMENT_BYTES), _ingest(content=b"x" * (MAX_DOCUMENT_BYTES + 1)), LIMIT, "content"),
    ("ingest", _ingest(content=b"x"), _ingest(content=b""), INVALID, "content"),
    ("ingest", _ingest(tags=["t"] * fields.MAX_TAGS), _ingest(tags=["t"] * (fields.MAX_TAGS + 1)), LIMIT, "tags"),
    ("ingest", _ingest(metadata={f"k{i}": "v" for i in range(fields.MAX_METADATA)}),
     _ingest(metadata={f"k{i}": "v" for i in range(fields.MAX_METADATA + 1)}), LIMIT, "metadata"),
    ("ingest", _ingest(metadata={"k": "v" * fields.MAX_METADATA_VALUE}), _ingest(metadata={"k": "v" * (fields.MAX_METADATA_VALUE + 1)}), LIMIT, "metadata"),
    ("ingest", _ingest(metadata={"k" * 128: "v"}), _ingest(metadata={"k" * 129: "v"}), LIMIT, "metadata"),
    ("ingest", _ingest(tags=["a", "t" * document_limits.MAX_TAG_CHARS]), _ingest(tags=["a", "t" * (document_limits.MAX_TAG_CHARS + 1)]), LIMIT, "tags"),
    ("ingest", _ingest(title="t" * fields.MAX_TITLE_CHARS), _ingest(title="t" * (fields.MAX_TITLE_CHARS + 1)), LIMIT, "title"),
    *[
        ("ingest", _ingest(**{n: "v" * document_limits.MAX_PRODUCT_CHARS}), _ingest(**{n: "v" * (document_limits.MAX_PRODUCT_CHARS + 1)}), LIMIT, n)
        for n in ("product", "version")
    ],
    ("ingest", _ingest(tenant_id="t" * 128), _ingest(tenant_id="t" * 129), INVALID, "tenant_id"),
    ("search", _search(tenant_id="t" * 128), _search(tenant_id="t" * 129), INVALID, "tenant_id"),
    ("respond", _respond(user=_user("t" * 128)), _respond(user=_user("t" * 129)), INVALID, "tenant_id"),
    ("generate", _with_tools(_generate(), _user("t" * 128)), _with_tools(_generate(), _user("t" * 129)), INVALID, "user.tenant_id"),
    ("execute", _execute("read_doc_metadata", _user("t" * 128)), _execute("read_doc_metadata", _user("t" * 129)), INVALID, "user.tenant_id"),
    ("respond", _respond(user=_person("u" * contract.MAX_USER_ID_CHARS)), _respond(user=_person("u" * (contract.MAX_USER_ID_CHARS + 1))), LIMIT, "user_id"),
    ("respond", _respond(user=_person("u", ["r"] * contract.MAX_ROLES)), _respond(user=_person("u", ["r"] * (contract.MAX_ROLES + 1))), LIMIT, "user.roles"),
    ("respond", _respond(user=_person("u", ["r" * contract.MAX_ROLE_CHARS])), _respond(user=_person("u", ["r" * (contract.MAX_ROLE_CHARS + 1)])), LIMIT, "user.roles"),
    ("respond", _respond(user=_person("Иван Петров")), _respond(user=_person("u\nforged log line")), INVALID, "user_id"),
    ("generate", _with_tools(_generate(), _person("u" * contract.MAX_USER_ID_CHARS)), _with_tools(_generate(), _person("u" * (contract.MAX_USER_ID_CHARS + 1))), LIMIT, "user.user_id"),
    ("execute", _execute("read_doc_metadata", _person("u" * contract.MAX_USER_ID_CHARS)), _execute("read_doc_metadata", _person("u" * (contract.MAX_USER_ID_CHARS + 1))), LIMIT, "user.user_id"),
    ("execute", _execute("read_doc_metadata", _person("u", ["r"] * contract.MAX_ROLES)), _execute("read_doc_metadata", _person("u", ["r"] * (contract.MAX_ROLES + 1))), LIMIT, "user.roles"),
    ("ingest", _ingest(doc_id="d" * 128), _ingest(doc_id="d" * 129), INVALID, "doc_id"),
    ("respond", _respond(query="q" * contract.MAX_QUERY_CHARS), _respond(query="q" * (contract.MAX_QUERY_CHARS + 1)), LIMIT, "query"),
    ("respond", _respond(max_results=contract.MAX_RESULTS_LIMIT), _respond(max_results=contract.MAX_RESULTS_LIMIT + 1), LIMIT, "max_results"),
    ("respond", _respond(max_results=1), _respond(max_results=0), INVALID, "max_results"),
    ("respond", _respond(history=orch_respond.MAX_HISTORY_TURNS), _respond(history=orch_respond.MAX_HISTORY_TURNS + 1), LIMIT, "history"),
    *[
        ("respond", _respond(filters=retrieval_pb2.SearchFilters(**{n: [f"v{i}" for i in range(contract.MAX_FILTER_VALUES)]})),
         _respond(filters=retrieval_pb2.SearchFilters(**{n: [f"v{i}" for i in range(contract.MAX_FILTER_VALUES + 1)]})), LIMIT, f"filters.{n}")
        for n in ("tags", "doc_ids", "section_ids")
    ],
    # The top-level doc_ids / section_ids join filters.<name>: MAX_FILTER_VALUES distinct ids
    # in all, and the refusal names the field the caller sent past it.
    *[
        row
        for n in ("doc_ids", "section_ids")
        for row in (
            ("respond", _respond_ids(n, _ids(contract.MAX_FILTER_VALUES)),
             _respond_ids(n, _ids(contract.MAX_FILTER_VALUES + 1)), LIMIT, n),
            ("respond", _respond_ids(n, _ids(60, "t"), _ids(40, "f")),
             _respond_ids(n, _ids(60, "t"), _ids(41, "f")), LIMIT, n),
            # Duplicates are removed first: 500 copies of one id count once.
            ("respond", _respond_ids(n, ["x"] * 500 + _ids(contract.MAX_FILTER_VALUES - 1)),
             _respond_ids(n, ["x"] * 500 + _ids(contract.MAX_FILTER_VALUES)), LIMIT, n),
            # The same ids in both lists count once; filters.<name> alone past the limit is its own.
            ("respond", _respond_ids(n, _ids(contract.MAX_FILTER_VALUES), _ids(contract.MAX_FILTER_VALUES)),
             _respond_ids(n, _ids(contract.MAX_FILTER_VALUES), _ids(contract.MAX_FILTER_VALUES + 1)), LIMIT, f"filters.{n}"),
        )
    ],
    ("respond", _respond(filters=retrieval_pb2.SearchFilters(source="knowledge_base")),
     _respond(filters=retrieval_pb2.SearchFilters(source="kb")), INVALID, "filters.source"),
    ("config", _config(prompt_token_budget=131_072), _config(prompt_token_budget=131_073), INVALID, "prompt_token_budget"),
    ("config", _config(prompt_token_budget=1), _config(prompt_token_budget=0), INVALID, "prompt_token_budget"),
    ("config", _config(context_token_budget=1_048_576), _config(context_token_budget=1_048_577), INVALID, "context_token_budget"),
    ("config", _config(max_tool_steps=20), _config(max_tool_steps=21), INVALID, "max_tool_steps"),
    ("config", _config(max_tool_steps=0), _config(max_tool_steps=-1), INVALID, "max_tool_steps"),
    ("config", _config(window_radius=3), _config(window_radius=4), INVALID, "window_radius"),
    ("config", _config(window_radius=0), _config(window_radius=-1), INVALID, "window_radius"),
    ("config", _config(default_model="m" * 200), _config(default_model="m" * 201), INVALID, "default_model"),
    ("generate", _generate(messages=llm_engine.MAX_MESSAGES), _generate(messages=llm_engine.MAX_MESSAGES + 1), LLM_LIMIT, "messages"),
    ("generate", _generate(content="c" * llm_engine.MAX_MESSAGE_CHARS), _generate(content="c" * (llm_engine.MAX_MESSAGE_CHARS + 1)), LLM_LIMIT, "messages[0].content"),
    ("generate", _generate(context_chunks=llm_engine.MAX_CONTEXT_CHUNKS), _generate(context_chunks=llm_engine.MAX_CONTEXT_CHUNKS + 1), LLM_LIMIT, "context_chunks"),
    ("generate", _generate(stop=llm_engine.MAX_STOP_SEQUENCES), _generate(stop=llm_engine.MAX_STOP_SEQUENCES + 1), INVALID, "generation_params.stop"),
    ("generate", _stops("s" * llm_engine.MAX_STOP_CHARS), _stops("s" * (llm_engine.MAX_STOP_CHARS + 1)), INVALID, "generation_params.stop"),
    ("generate", _stops("s"), _stops("s", ""), INVALID, "generation_params.stop"),
    ("generate", _model("m" * llm_engine.MAX_MODEL_CHARS), _model("m" * (llm_engine.MAX_MODEL_CHARS + 1)), LLM_LIMIT, "model"),
    ("generate", _model("org/Qwen2.5-1.5B:q4"), _model("qwen 2.5"), INVALID, "model"),
    ("generate", _model("qwen2.5"), _model("qwen2.5\n"), INVALID, "model"),
    ("generate", _generate(max_tokens=BUDGETS.max_completion_tokens), _generate(max_tokens=BUDGETS.max_completion_tokens + 1), LLM_LIMIT, "generation_params.max_tokens"),
    ("generate", _generate(max_tokens=1), _generate(max_tokens=0), LLM_LIMIT, "generation_params.max_tokens"),
    ("generate", _generate(temperature=2.0), _generate(temperature=up(2.0, 3.0)), INVALID, "generation_params.temperature"),
    ("generate", _generate(temperature=0.0), _generate(temperature=math.nan), INVALID, "generation_params.temperature"),
    ("generate", _generate(temperature=0.0), _generate(temperature=up(0.0, -1.0)), INVALID, "generation_params.temperature"),
    ("generate", _generate(top_p=1.0), _generate(top_p=math.inf), INVALID, "generation_params.top_p"),
    ("generate", _generate(top_p=1.0), _generate(top_p=up(1.0, 2.0)), INVALID, "generation_params.top_p"),
    ("generate", _generate(top_p=0.0), _generate(top_p=up(0.0, -1.0)), INVALID, "generation_params.top_p"),
    ("generate", _generate(presence_penalty=-2.0), _generate(presence_penalty=up(-2.0, -3.0)), INVALID, "generation_params.presence_penalty"),
    ("generate", _generate(presence_penalty=2.0), _generate(presence_penalty=up(2.0, 3.0)), INVALID, "generation_params.presence_penalty"),
    ("generate", _generate(frequency_penalty=2.0), _generate(frequency_penalty=up(2.0, 3.0)), INVALID, "generation_params.frequency_penalty"),
    ("generate", _generate(frequency_penalty=-2.0), _generate(frequency_penalty=up(-2.0, -3.0)), INVALID, "generation_params.frequency_penalty"),
    ("generate", _radii(0), _radii(-1), INVALID, "tool_policy.window_radius_schedule"),
    ("generate", _radii(1, 0), _radii(1, -1), INVALID, "tool_policy.window_radius_schedule"),
    ("execute", _execute("t" * MAX_TOOL_NAME), _execute("t" * (MAX_TOOL_NAME + 1)), INVALID, "tool_name"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "at", "past", "reason", "field"),
    LIMITS,
    ids=[f"{c[0]}-{c[4]}-{i}" for i, c in enumerate(LIMITS)],
)
def test_limits_are_exact(name: str, at: Any, past: Any, reason: str, field: str) -> None:
    check = VALIDATORS[name][1]
    assert outcome(check, at) is None
    refused = outcome(check, past)
    assert refused is not None, "one past the limit was accepted"
    assert refused[1] == reason, refused
    metadata = refused[3]
    assert metadata["field"] == field, refused
    if reason != INVALID:  # a limit says what it is: a number
        assert float(metadata["limit"]) >= 0, refused


@pytest.mark.parametrize("name", ["doc_ids", "section_ids"])
def test_respond_ids_past_the_limit_say_which_lists(name: str) -> None:
    """Past MAX_FILTER_VALUES only with filters.<name>, the top-level <name> is named and the
    message says it is counted with filters.<name>; alone, it is named alone."""
    together = outcome(validate_respond, _respond_ids(name, _ids(60, "t"), _ids(41, "f")))
    alone = outcome(validate_respond, _respond_ids(name, _ids(contract.MAX_FILTER_VALUES + 1)))
    assert together is not None and alone is not None
    limit = contract.MAX_FILTER_VALUES
    assert together[2].startswith(f"{name} with filters.{name} has more than {limit}"), together
    assert alone[2].startswith(f"{name} has more than {limit}"), alone
    assert together[3] == alone[3] == {"field": name, "limit": str(limit)}


# --- the errors a caller can cause besides limits -------------------------------------------


@pytest.mark.parametrize(
    ("name", "req", "reason", "field"),
    [
        ("search", retrieval_pb2.SearchRequest(query="q"), INVALID, "tenant_id"),
        ("search", retrieval_pb2.SearchRequest(query=" \t", tenant_id="demo"), INVALID, "query"),
        ("search", retrieval_pb2.SearchRequest(query="q", tenant_id=contract.KB_TENANT), INVALID, "tenant_id"),
        ("search", _search(**{"params.retrieval_mode": "nope"}), INVALID, "params.retrieval_mode"),
        ("ingest", _ingest(tenant_id="a b"), INVALID, "tenant_id"),
        ("search", _search(tenant_id="a b"), INVALID, "tenant_id"),
        ("respond", _respond(user=_user("acme/corp")), INVALID, "tenant_id"),
        ("respond", orchestrator_pb2.RespondRequest(query="q", user_id="u", tenant_id="a b"), INVALID, "tenant_id"),
        ("generate", _with_tools(_generate(), _user("a b")), INVALID, "user.tenant_id"),
        ("execute", _execute("read_doc_metadata", _user("a b")), INVALID, "user.tenant_id"),
        ("ingest", _ingest(doc_id="../x"), INVALID, "doc_id"),
        ("ingest", retrieval_pb2.IngestDocumentRequest(tenant_id="demo", file_name="...", content=b"x"), INVALID, "file_name"),
        ("respond", orchestrator_pb2.RespondRequest(query="q"), "MISSING_USER_CONTEXT", "tenant_id"),
        ("respond", orchestrator_pb2.RespondRequest(query="q", tenant_id="demo"), "MISSING_USER_CONTEXT", "user_id"),
        ("respond", orchestrator_pb2.RespondRequest(query="q", user=U, tenant_id="other"), INVALID, "user"),
        ("respond", _respond(query="  "), INVALID, "query"),
        ("config", _config(window_radius=1, window_max=3), INVALID, "window_max"),
        ("config", _config(default_model=" m"), INVALID, "default_model"),
        ("generate", llm_pb2.GenerateRequest(), INVALID, "messages"),
        ("generate", llm_pb2.GenerateRequest(mode="x", messages=[common_pb2.ChatMessage(role="user", content="q")]), INVALID, "mode"),
        ("generate", llm_pb2.GenerateRequest(messages=[common_pb2.ChatMessage(role="robot", content="q")]), INVALID, "messages[0].role"),
        ("generate", llm_pb2.GenerateRequest(messages=[common_pb2.ChatMessage(role="system", content="q")]), INVALID, "messages"),
        ("execute", toolsproxy_pb2.ExecuteRequest(tool_name=" ", user=U), INVALID, "tool_name"),
        ("execute", toolsproxy_pb2.ExecuteRequest(tool_name="t"), "MISSING_USER_CONTEXT", "user.tenant_id"),
    ],
)  # fmt: skip
def test_bad_requests_name_the_field(name: str, req: Any, reason: str, field: str) -> None:
    refused = outcome(VALIDATORS[name][1], req)
    assert refused is not None and refused[1] == reason, refused
    assert refused[3]["field"] == field


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_struct_numbers_are_invalid_argument(bad: float) -> None:
    # A Struct can carry NaN over gRPC, JSON cannot: this used to be INTERNAL
    # (json_format refuses to turn it into a dict) instead of the caller's error.
    req = _execute("read_doc_metadata")
    req.arguments.update({"doc_id": "d", "x": bad})
    refused = outcome(validate_execute, req)
    assert refused is not None and refused[1] == INVALID, refused
    assert refused[3]["field"] == "arguments"
    gen = _generate()
    gen.tool_policy.planned_calls.add(tool_name="read_doc_metadata").arguments.update({"n": bad})
    refused = outcome(validate_generate, gen)
    assert refused is not None, "planned call arguments with NaN accepted"
    assert refused[3]["field"] == "tool_policy.planned_calls[0].arguments"


SAFETY_VERDICT_TEXTS = st.sampled_from(["allowed", "flagged", "blocked"]).flatmap(
    lambda v: st.sampled_from([v, v.upper(), f" {v.title()}\t"])
)
"""A verdict the gateway may send, in any case and with surrounding blanks."""


@FAST
@given(st.lists(st.tuples(st.sampled_from(["x-visior-safety-input", "other"]),
                          st.one_of(SAFETY_VERDICT_TEXTS, wire_text)), max_size=3))  # fmt: skip
def test_safety_header_is_its_verdict_or_invalid_argument(pairs: list[tuple[str, str]]) -> None:
    """Every x-visior-safety-input counts, each comma-separated value of it too: known
    verdicts (any case, blanks around) give the most severe of them, any other value is
    INVALID_ARGUMENT naming the header; none is "allowed"."""
    severity = ("allowed", "flagged", "blocked")
    said = [
        v.strip().lower()
        for key, value in pairs
        if key == "x-visior-safety-input"
        for v in value.split(",")
    ]
    if any(v not in severity for v in said):
        with pytest.raises(errors.InvalidArgumentError) as info:
            safety_verdict(pairs)
        assert info.value.metadata["field"] == "x-visior-safety-input"
    else:
        assert safety_verdict(pairs) == max(said, key=severity.index, default="allowed")


def test_a_max_tokens_past_the_llm_services_answer_limit_names_that_limit() -> None:
    """It is MAX_COMPLETION_TOKENS, the LLM service's own limit: its name lets the
    Orchestrator learn a lower one than its environment says (respond._learned_llm_limit)."""
    check = VALIDATORS["generate"][1]
    refused = outcome(check, _generate(max_tokens=BUDGETS.max_completion_tokens + 1))
    assert refused is not None
    assert refused[3]["limit_name"] == "max_completion_tokens"
    assert refused[3]["limit"] == str(BUDGETS.max_completion_tokens)
