"""Property tests of the tool-argument parser and of the argument checks on both sides.

Two sides check a tool call's arguments: the LLM service parses what the model wrote
(`toolcalls.parse_arguments`, then `CallGate.review`) and ToolsProxy checks what arrives in
the request (each tool in `ToolExecutor.execute`); both check against the tool's schema
with `services.common.tool_args.check_arguments`. Whatever the input, each may only answer
with its documented refusal: a `ValueError` / `ArgumentError`, a `Rejected` tool_error, an
error `Outcome`. Valid
arguments pass, every limit a schema states holds exactly, errors name the field, and the
same input always gets the same answer.
"""

from __future__ import annotations

import asyncio
import json
import math
import string
from datetime import date
from typing import Any

import pytest
from google.protobuf import struct_pb2
from hypothesis import given
from hypothesis import strategies as st

from services.common.tool_args import ArgumentError, check_arguments
from services.common.tool_contract import (
    ACCESS_DENIED,
    ID_SCHEMA,
    INVALID_ARGUMENT,
    NOT_FOUND,
    RATE_LIMIT_EXCEEDED,
    UPSTREAM_UNAVAILABLE,
    WINDOW_TOO_LARGE,
)
from services.common.tool_contract import (
    INVALID_ARGUMENT as LLM_INVALID_ARGUMENT,
)
from services.docstore.parsing import ChunkingConfig, parse_document
from services.docstore.sqlite_store import SqliteDocumentStore
from services.llm.model import Anchor, ToolPolicy
from services.llm.toolcalls import (
    INVALID_JSON,
    MAX_ARGUMENTS_CHARS,
    MAX_ARGUMENTS_DEPTH,
    READ_TOOL_SPECS,
    REPEATED_CALL,
    SECTION_NOT_ALLOWED,
    TOOL_LIMIT_REACHED,
    TOOL_NOT_ALLOWED,
    UNKNOWN_TOOL,
    Approved,
    CallGate,
    Rejected,
    parse_arguments,
)
from services.model_runtime.chat import ToolCall, ToolSpec
from services.toolsproxy.cbr import CbrSettings, cbr_tool
from services.toolsproxy.ratelimit import RateLimiter, RateLimits
from services.toolsproxy.search_tools import SearchCall, SearchHitView, SearchTools
from services.toolsproxy.tavily import tavily_tool
from services.toolsproxy.tools import (
    Caller,
    DocumentTools,
    Tool,
    ToolExecutor,
    ToolFailure,
    ToolLimits,
)
from tests.unit.properties import CONTROL, FAST

# --- strategies ---------------------------------------------------------------------------

any_char = st.one_of(
    st.characters(exclude_categories=()),
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),  # unpaired surrogates
    st.sampled_from(CONTROL),
)
any_text = st.text(any_char, max_size=40)
# What a transport can carry: gRPC and the MCP endpoint's JSON parser refuse unpaired
# surrogates, so ToolsProxy never sees them.
wire_text = st.text(
    st.one_of(st.characters(exclude_categories=("Cs",)), st.sampled_from(CONTROL)), max_size=40
)
huge_int = st.integers(min_value=-(2**1100), max_value=2**1100)
any_number = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    huge_int,
    st.floats(allow_nan=True, allow_infinity=True),
)


def json_like(text: st.SearchStrategy[str], keys: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    scalars = st.one_of(st.none(), st.booleans(), any_number, text)
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
        max_leaves=8,
    )


def deep(n: int, kind: str) -> str:
    return "[" * n + "]" * n if kind == "list" else '{"a":' * n + "1" + "}" * n


argument_texts = st.one_of(
    any_text,
    json_like(any_text, any_text).map(lambda v: json.dumps(v)),
    json_like(any_text, any_text).map(lambda v: json.dumps(v, ensure_ascii=False)),
    st.builds(
        lambda n, kind: '{"doc_id": ' + deep(n, kind) + "}",
        st.integers(1, 3000),
        st.sampled_from(["list", "object"]),
    ),
    st.sampled_from(
        [
            '{"radius": NaN}',
            '{"radius": Infinity}',
            '{"radius": -Infinity}',
            '{"radius": 1e400}',
            '{"radius": ' + "9" * 400 + "}",
            '{"radius": ' + "9" * 5000 + "}",
            '{"doc_id": "\\ud800"}',
            '{"doc_id": "\\udc00x"}',
            '{"doc_id": "a"} trailing',
            "[1, 2]",
            "null",
            '"x"',
            "{",
            '{"a": 1,}',
            "\ufeff{}",
            "{}",
            "   ",
        ]
    ),
)


def valid_for(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values `schema` accepts (within the subset the tool schemas use)."""
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "pattern" in schema:
        return st.from_regex(schema["pattern"]).filter(
            lambda v: schema.get("minLength", 0) <= len(v) <= schema.get("maxLength", len(v))
        )
    kind = schema.get("type")
    if kind == "string":
        low, high = schema.get("minLength", 0), schema.get("maxLength", 50)
        alphabet = string.ascii_letters + string.digits + "-_:. абвгдё"
        return st.text(alphabet, min_size=low, max_size=min(high, low + 30))
    if kind == "integer":
        return st.integers(schema.get("minimum", -(2**31)), schema.get("maximum", 2**31))
    if kind == "number":
        return st.floats(schema.get("minimum", -1e9), schema.get("maximum", 1e9))
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        low = schema.get("minItems", 0)
        return st.lists(
            valid_for(schema["items"]),
            min_size=low,
            max_size=min(schema.get("maxItems", 5), low + 4),
        )
    if kind == "object":
        props = schema.get("properties", {})
        required = set(schema.get("required", ()))
        return st.fixed_dictionaries(
            {k: valid_for(v) for k, v in props.items() if k in required},
            optional={k: valid_for(v) for k, v in props.items() if k not in required},
        )
    raise AssertionError(f"no strategy for {schema}")


def arguments_for(schema: dict[str, Any], text: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    """Arguments a model or a caller might send: the schema's own names with any values,
    identity and unknown names, missing required ones, or not an object at all."""
    names = st.sampled_from([*schema.get("properties", {}), "tenant_id", "user_id", "bogus"])
    keys = st.one_of(names, names, text)
    values = json_like(text, keys)
    return st.one_of(valid_for(schema), st.dictionaries(keys, values, max_size=6), values)


# --- the tool catalogue ---------------------------------------------------------------------

TODAY = date(2026, 11, 22)
A = Caller("tenant-a", "u1", "trace-1")


class StubSearcher:
    async def search(self, call: SearchCall) -> list[SearchHitView]:
        return [SearchHitView("d1", "d1:s001", "d1:c00001", "T", "text", 0.5, 1, 1)]


class StubBank:
    """What CbrTool needs of a CbrClient; the bank itself is never reached."""

    settings = CbrSettings()

    def today(self) -> date:
        return TODAY

    async def _down(self, *args: Any) -> Any:
        raise ToolFailure(UPSTREAM_UNAVAILABLE, "stub bank")

    resolve_currency = rates_on_date = rates_dynamic = key_rate = news = _down


class StubTavily:
    async def search(self, query: str, **kw: Any) -> dict[str, Any]:
        return {"query": query, "results": []}


def _store() -> SqliteDocumentStore:
    store = SqliteDocumentStore(":memory:")
    text = "# Guide\n\n" + "\f".join(f"## S{i}\n\nsection {i} about topic{i}." for i in range(6))
    cfg = ChunkingConfig(chunk_tokens=8, overlap_tokens=0)
    store.put(parse_document(tenant_id="tenant-a", doc_id="guide", content=text, fmt="markdown",
                             config=cfg))  # fmt: skip
    return store


LIMITS = ToolLimits(max_window_radius=2, max_text_bytes=512, max_full_documents=3)


def _tools() -> dict[str, Tool]:
    # The real tools; the external ones over stubs of their clients (no network).
    tavily = tavily_tool(StubTavily())  # type: ignore[arg-type]
    cbr = cbr_tool(StubBank())  # type: ignore[arg-type]
    return {
        **DocumentTools(_store(), LIMITS).tools,
        **SearchTools(StubSearcher()).tools,
        cbr.name: cbr,
        tavily.name: tavily,
    }


TOOLS = _tools()
SCHEMAS = {name: t.schema for name, t in sorted(TOOLS.items())}
CODES = {ACCESS_DENIED, INVALID_ARGUMENT, NOT_FOUND, RATE_LIMIT_EXCEEDED, UPSTREAM_UNAVAILABLE,
         WINDOW_TOO_LARGE}  # fmt: skip


def executor() -> ToolExecutor:
    return ToolExecutor(
        TOOLS,
        limits=LIMITS,
        rate_limiter=RateLimiter(RateLimits(calls_per_minute=0, tokens_per_minute=0)),
    )


EXECUTOR = executor()
LOOP = asyncio.new_event_loop()  # one loop for every call: a new one per example is slow


def execute(name: str, arguments: Any, caller: Caller = A) -> Any:
    return LOOP.run_until_complete(EXECUTOR.execute(name, arguments, caller))


def struct_safe(value: dict[str, Any]) -> None:
    """What ToolsProxy's request can carry: a Struct that survives the round trip."""
    s = struct_pb2.Struct()
    s.update(value)
    struct_pb2.Struct.FromString(s.SerializeToString())


def _field_named(message: str, value: Any, schema: dict[str, Any]) -> bool:
    """Whether an error message names the argument (or the arguments object) at fault."""
    if not message.startswith("arguments"):
        return False
    rest = message[len("arguments") :]
    if not rest.startswith("."):
        return True  # about the object itself: its type, unknown fields
    # A field's own name may hold ".", "[" or a space (a field named "." is "arguments.."):
    # the message names one of the schema's or the value's fields as it begins.
    names = [*schema.get("properties", {}), *(value if isinstance(value, dict) else ())]
    return any(
        isinstance(n, str) and rest[1:].startswith(n) and rest[1 + len(n) :][:1] in " .["
        for n in names
    )


# --- the LLM side: parse_arguments ----------------------------------------------------------


@FAST
@given(argument_texts)
def test_parse_arguments_answers_an_object_or_value_error(text: str) -> None:
    try:
        value = parse_arguments(text)
    except ValueError as exc:
        assert str(exc)
        with pytest.raises(ValueError) as again:
            parse_arguments(text)
        assert str(again.value) == str(exc)  # the same refusal every time
        return
    assert isinstance(value, dict)
    struct_safe(value)  # anything accepted can be sent to ToolsProxy
    assert parse_arguments(text) == value


@FAST
@given(json_like(wire_text, wire_text).filter(lambda v: isinstance(v, dict)))
def test_parse_arguments_round_trips_what_json_can_carry(value: dict[str, Any]) -> None:
    text = json.dumps(value, ensure_ascii=False, allow_nan=True)
    if _within_double(value):  # no NaN, no Infinity, no integer beyond a double
        assert _same(parse_arguments(text), value)
    else:
        with pytest.raises(ValueError):
            parse_arguments(text)


def _within_double(v: Any) -> bool:
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return True
    if isinstance(v, int):
        return abs(v) <= 1.7976931348623157e308
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, list):
        return all(_within_double(x) for x in v)
    return all(_within_double(x) for x in v.values())


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_parse_arguments_length_limit_is_exact() -> None:
    frame = '{"doc_id": ""}'
    at = '{"doc_id": "' + "x" * (MAX_ARGUMENTS_CHARS - len(frame)) + '"}'
    assert len(at) == MAX_ARGUMENTS_CHARS
    assert parse_arguments(at)["doc_id"] == "x" * (MAX_ARGUMENTS_CHARS - len(frame))
    past = at[:-2] + 'x"}'
    with pytest.raises(ValueError, match=str(MAX_ARGUMENTS_CHARS)):
        parse_arguments(past)


def test_parse_arguments_depth_limit_is_exact() -> None:
    at = '{"doc_id": ' + deep(MAX_ARGUMENTS_DEPTH - 1, "list") + "}"
    assert parse_arguments(at)
    past = '{"doc_id": ' + deep(MAX_ARGUMENTS_DEPTH, "list") + "}"
    with pytest.raises(ValueError, match=f"more than {MAX_ARGUMENTS_DEPTH} levels"):
        parse_arguments(past)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"doc_id": ' + deep(2000, "list") + "}", "nested too deeply"),
        ('{"doc_id": ' + deep(1300, "object") + "}", "nested too deeply"),
        ('{"doc_id": ' + deep(50, "object") + "}", "nested more than"),
        ('{"radius": NaN}', "NaN"),
        ('{"radius": -Infinity}', "Infinity"),
        ('{"radius": 1e400}', "too large"),
        ('{"radius": ' + "9" * 400 + "}", "too large"),
        ('{"doc_id": "\\ud800"}', "surrogate"),
    ],
)
def test_parse_arguments_refuses_what_cannot_travel(text: str, says: str) -> None:
    # Each used to escape as RecursionError or reach the Struct / ToolsProxy and fail there
    # (OverflowError, UnicodeEncodeError, INTERNAL): the model gets a tool_error instead.
    with pytest.raises(ValueError, match=says):
        parse_arguments(text)


# --- check_arguments against every schema -------------------------------------------------

LLM_SCHEMAS = {
    **{f"fallback:{s.name}": s.parameters for s in READ_TOOL_SPECS},
    **SCHEMAS,
}


@FAST
@given(st.data())
def test_check_arguments_answers_a_value_or_argument_error(data: st.DataObject) -> None:
    schema = LLM_SCHEMAS[data.draw(st.sampled_from(sorted(LLM_SCHEMAS)))]
    value = data.draw(arguments_for(schema, any_text))
    try:
        out = check_arguments(schema, value)
    except ArgumentError as exc:
        assert exc.code in (INVALID_ARGUMENT, WINDOW_TOO_LARGE)
        assert _field_named(str(exc), value, schema), str(exc)
        with pytest.raises(ArgumentError) as again:
            check_arguments(schema, value)
        assert (again.value.code, str(again.value)) == (exc.code, str(exc))
        return
    assert isinstance(out, dict)
    assert set(schema.get("required", ())) <= set(out) <= set(schema["properties"])
    assert check_arguments(schema, out) == out  # accepted output is a fixed point


@FAST
@given(st.data())
def test_check_arguments_accepts_valid_arguments(data: st.DataObject) -> None:
    schema = LLM_SCHEMAS[data.draw(st.sampled_from(sorted(LLM_SCHEMAS)))]
    value = data.draw(valid_for(schema))
    assert check_arguments(schema, value) == value
    # As it arrives through google.protobuf.Struct: every number a double.
    as_doubles = json.loads(json.dumps(value), parse_int=float)
    assert check_arguments(schema, as_doubles) == value


def _limit_cases() -> list[tuple[str, str, dict[str, Any], Any, Any]]:
    """(tool, property, its schema, a value at the limit, the value one past it); a list's
    items are held to their own schema's length limits, one item at a time."""
    cases = []
    for tool, schema in sorted(LLM_SCHEMAS.items()):
        for prop, sub in schema["properties"].items():
            item = sub.get("items", {})
            if "pattern" in sub:
                continue  # its pattern binds the length more tightly than the limits
            if "maxLength" in sub:
                cases.append(
                    (tool, prop, sub, "x" * sub["maxLength"], "x" * (sub["maxLength"] + 1))
                )
            if sub.get("minLength", 0) >= 1:
                cases.append(
                    (tool, prop, sub, "x" * sub["minLength"], "x" * (sub["minLength"] - 1))
                )
            if sub.get("type") == "integer" and "maximum" in sub:
                cases.append((tool, prop, sub, sub["maximum"], sub["maximum"] + 1))
            if sub.get("type") == "integer" and "minimum" in sub:
                cases.append((tool, prop, sub, sub["minimum"], sub["minimum"] - 1))
            if sub.get("type") == "number" and "maximum" in sub:
                cases.append((tool, prop, sub, sub["maximum"],
                              math.nextafter(sub["maximum"], math.inf)))  # fmt: skip
            if sub.get("type") == "number" and "minimum" in sub:
                cases.append((tool, prop, sub, sub["minimum"],
                              math.nextafter(sub["minimum"], -math.inf)))  # fmt: skip
            if "maxItems" in sub:
                ok = valid_item(item)
                cases.append(
                    (tool, prop, sub, [ok] * sub["maxItems"], [ok] * (sub["maxItems"] + 1))
                )
            if sub.get("minItems", 0) >= 1:
                ok = valid_item(item)
                cases.append(
                    (tool, prop, sub, [ok] * sub["minItems"], [ok] * (sub["minItems"] - 1))
                )
            if "pattern" in item:
                continue
            if "maxLength" in item:
                high = item["maxLength"]
                cases.append((tool, prop, sub, _list_of(sub, "x" * high),
                              _list_of(sub, "x" * (high + 1))))  # fmt: skip
            if item.get("minLength", 0) >= 1:
                low = item["minLength"]
                cases.append((tool, prop, sub, _list_of(sub, "x" * low),
                              _list_of(sub, "x" * (low - 1))))  # fmt: skip
    return cases


def _list_of(schema: dict[str, Any], value: Any) -> list[Any]:
    """A list `schema` takes but for `value`, its last item."""
    ok = valid_item(schema["items"])
    return [ok] * (max(schema.get("minItems", 1), 1) - 1) + [value]


def valid_item(schema: dict[str, Any]) -> Any:
    return "x" * max(1, schema.get("minLength", 1)) if schema.get("type") == "string" else 1


LIMIT_CASES = _limit_cases()


def _args_with(tool: str, prop: str, value: Any) -> dict[str, Any]:
    schema = LLM_SCHEMAS[tool]
    base = {k: _minimal(schema["properties"][k]) for k in schema.get("required", ())}
    return {**base, prop: value}


def _minimal(schema: dict[str, Any]) -> Any:
    if "enum" in schema:
        return schema["enum"][0]
    return {
        "string": "x" * max(1, schema.get("minLength", 1)),
        "integer": schema.get("minimum", 1),
    }[schema["type"]]


@pytest.mark.parametrize(
    ("tool", "prop", "sub", "at", "past"), LIMIT_CASES, ids=[f"{c[0]}.{c[1]}" for c in LIMIT_CASES]
)
def test_check_arguments_limits_are_exact(
    tool: str, prop: str, sub: dict[str, Any], at: Any, past: Any
) -> None:
    schema = LLM_SCHEMAS[tool]
    assert check_arguments(schema, _args_with(tool, prop, at))[prop] == at
    with pytest.raises(ArgumentError, match=rf"^arguments\.{prop}\b") as refused:
        check_arguments(schema, _args_with(tool, prop, past))
    over_max = isinstance(past, int | float) and past > at
    expected = sub.get("x-maximum-code", INVALID_ARGUMENT) if over_max else INVALID_ARGUMENT
    assert refused.value.code == expected


def test_window_past_the_radius_is_window_too_large() -> None:
    # The one limit with its own code (docs/architecture.md §16); pinned so the table above cannot go empty.
    assert any(c[0] == "read_chunk_window" and c[1] == "radius" for c in LIMIT_CASES)
    with pytest.raises(ArgumentError) as refused:
        check_arguments(
            SCHEMAS["read_chunk_window"], {"doc_id": "d", "anchor_chunk_id": "c", "radius": 3}
        )
    assert refused.value.code == WINDOW_TOO_LARGE


@pytest.mark.parametrize(
    ("tool", "prop"),
    [("search_user_documents", "document_ids"), ("load_documents_full", "document_ids")],
)
def test_id_lists_hold_their_items_to_the_id_limits(tool: str, prop: str) -> None:
    # Pinned so the item cases of the table above cannot go empty: ID_SCHEMA's bounds.
    cases = [(at, past) for t, p, _, at, past in LIMIT_CASES if (t, p) == (tool, prop)]
    high, low = ID_SCHEMA["maxLength"], ID_SCHEMA["minLength"]
    assert (["x" * high], ["x" * (high + 1)]) in cases
    assert (["x" * low], ["x" * (low - 1)]) in cases


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_check_arguments_refuses_non_finite_numbers(bad: float) -> None:
    schema = SCHEMAS["search_user_documents"]
    with pytest.raises(ArgumentError, match=r"^arguments\.score_threshold must be number"):
        check_arguments(schema, {"query": "q", "score_threshold": bad})


# --- the LLM side: the gate -----------------------------------------------------------------

OFFERED = tuple(ToolSpec(n, t.description, t.schema) for n, t in sorted(TOOLS.items()))
REVIEW_CODES = {UNKNOWN_TOOL, TOOL_NOT_ALLOWED, INVALID_JSON, LLM_INVALID_ARGUMENT,
                SECTION_NOT_ALLOWED, REPEATED_CALL, TOOL_LIMIT_REACHED}  # fmt: skip
ids = st.sampled_from(["guide", "guide:s001", "guide:c00001", "other", ""])
policies = st.builds(
    ToolPolicy,
    allowed_tools=st.lists(st.sampled_from([s.name for s in OFFERED]), max_size=12).map(tuple),
    anchors=st.lists(st.builds(Anchor, ids, ids, ids), max_size=3).map(tuple),
    radius_schedule=st.lists(st.integers(0, 10), min_size=1, max_size=4).map(tuple),
)
tool_names = st.one_of(st.sampled_from([s.name for s in OFFERED]), any_text)


@FAST
@given(policies, tool_names, argument_texts)
def test_gate_review_answers_approved_or_rejected(policy: ToolPolicy, name: str, text: str) -> None:
    gate = CallGate(OFFERED, policy)
    verdict = gate.review(ToolCall("c1", name, text))
    assert verdict == CallGate(OFFERED, policy).review(ToolCall("c1", name, text))
    if isinstance(verdict, Rejected):
        assert verdict.code in REVIEW_CODES and verdict.message
        return
    assert isinstance(verdict, Approved)
    struct_safe(verdict.arguments)  # the runner can build ToolsProxy's request from it
    executed = {s.name: s.parameters for s in OFFERED}[verdict.name]
    check_arguments(executed, verdict.arguments)  # and the proxy's schema accepts it


# --- ToolsProxy: every tool, through the executor -------------------------------------------

proxy_calls = st.sampled_from(sorted(TOOLS)).flatmap(
    lambda name: st.tuples(st.just(name), arguments_for(SCHEMAS[name], wire_text))
)


@FAST
@given(proxy_calls)
def test_every_tool_answers_any_arguments_with_an_outcome(call: tuple[str, Any]) -> None:
    name, arguments = call
    outcome = execute(name, arguments)
    if outcome.status == "ok":
        assert outcome.result is not None and outcome.result["truncated"] in (True, False)
        json.dumps(outcome.result, allow_nan=False)  # the result is plain JSON
        return
    assert outcome.status == "error", outcome
    assert outcome.error_code in CODES, outcome
    assert outcome.error_message, outcome
    again = execute(name, arguments)
    assert (again.status, again.error_code) == (outcome.status, outcome.error_code)


@FAST
@given(st.data())
def test_every_tool_takes_arguments_its_schema_accepts(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(TOOLS)))
    # Valid by the schema means no INVALID_ARGUMENT from the schema; the tool's own rules
    # (a range the wrong way round, an unknown document) may still refuse with their code.
    args = data.draw(valid_for(SCHEMAS[name]))
    outcome = execute(name, args)
    if outcome.status == "error":
        assert outcome.error_code in CODES
        assert not outcome.error_message.startswith("arguments"), outcome


@pytest.mark.parametrize("name", sorted(TOOLS))
@pytest.mark.parametrize("identity", ["tenant_id", "user_id"])
def test_identity_arguments_are_refused_by_every_tool(name: str, identity: str) -> None:
    outcome = execute(name, {identity: "tenant-b"})
    assert (outcome.status, outcome.error_code) == ("error", INVALID_ARGUMENT)
    assert identity in outcome.error_message


def test_the_catalogue_under_test_is_the_whole_catalogue() -> None:
    # A new tool must join these properties: the list here is the proxy's own (app.py).
    assert set(TOOLS) == {
        "read_chunk_window", "read_doc_section", "read_doc_pages", "read_doc_metadata",
        "doc_local_search", "load_documents_full", "search_user_documents",
        "search_general_kb", "fetch_cbr_data", "fetch_finance_news",
    }  # fmt: skip
