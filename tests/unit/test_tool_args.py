"""The shared tool-argument checker (services/common/tool_args.py): one message per rule."""

from __future__ import annotations

import math
from typing import Any

import pytest

from services.common.tool_args import (
    ArgumentError,
    check_arguments,
)
from services.common.tool_contract import (
    INVALID_ARGUMENT,
)

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "doc_id": {"type": "string", "minLength": 1, "maxLength": 5},
        "name": {"type": "string", "minLength": 2},
        "radius": {"type": "integer", "minimum": 0, "maximum": 2, "x-maximum-code": "TOO_WIDE"},
        "score": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        "mode": {"type": "string", "enum": ["a", "b"]},
        "kind": {"const": "k"},
        "day": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
        "ids": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2},
        "note": {"type": ["string", "null"]},
    },
    "required": ["doc_id"],
    "additionalProperties": False,
    "x-renamed": {"operation": "mode"},
}


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [
        ([], "arguments must be object", INVALID_ARGUMENT),
        ({}, "arguments.doc_id is required", INVALID_ARGUMENT),
        ({"doc_id": 7}, "arguments.doc_id must be string", INVALID_ARGUMENT),
        ({"doc_id": ""}, "arguments.doc_id must not be empty (at least 1 character)", INVALID_ARGUMENT),
        ({"doc_id": "123456"}, "arguments.doc_id must be at most 5 characters (it has 6)",
         INVALID_ARGUMENT),
        ({"doc_id": "d", "name": "x"}, "arguments.name must be at least 2 characters",
         INVALID_ARGUMENT),
        ({"doc_id": "d", "radius": 3}, "arguments.radius must be <= 2 (it is 3)", "TOO_WIDE"),
        ({"doc_id": "d", "radius": -1}, "arguments.radius must be >= 0 (it is -1)",
         INVALID_ARGUMENT),
        ({"doc_id": "d", "radius": 1.5}, "arguments.radius must be integer", INVALID_ARGUMENT),
        ({"doc_id": "d", "radius": True}, "arguments.radius must be integer", INVALID_ARGUMENT),
        ({"doc_id": "d", "score": 0}, "arguments.score must be > 0 (it is 0)", INVALID_ARGUMENT),
        ({"doc_id": "d", "score": 1}, "arguments.score must be < 1 (it is 1)", INVALID_ARGUMENT),
        ({"doc_id": "d", "score": math.nan}, "arguments.score must be number", INVALID_ARGUMENT),
        ({"doc_id": "d", "score": math.inf}, "arguments.score must be number", INVALID_ARGUMENT),
        ({"doc_id": "d", "mode": "c"}, "arguments.mode must be one of a, b", INVALID_ARGUMENT),
        ({"doc_id": "d", "kind": "x"}, "arguments.kind must be 'k'", INVALID_ARGUMENT),
        ({"doc_id": "d", "day": "2025-7-1"},
         r"arguments.day must match the pattern ^\d{4}-\d{2}-\d{2}$ (got '2025-7-1')",
         INVALID_ARGUMENT),
        ({"doc_id": "d", "ids": []}, "arguments.ids must have at least 1 item(s)",
         INVALID_ARGUMENT),
        ({"doc_id": "d", "ids": [1, 2, 3]}, "arguments.ids must have at most 2 item(s) (it has 3)",
         INVALID_ARGUMENT),
        ({"doc_id": "d", "ids": [1, "x"]}, "arguments.ids[1] must be integer", INVALID_ARGUMENT),
        ({"doc_id": "d", "note": 1}, "arguments.note must be string or null", INVALID_ARGUMENT),
        ({"doc_id": "d", "tenant_id": "t", "x": 1}, "arguments has unknown field(s): tenant_id, x",
         INVALID_ARGUMENT),
        # The renamed argument is named before the missing and unknown ones it also makes.
        ({"operation": "a"}, "arguments.operation is not accepted: use arguments.mode",
         INVALID_ARGUMENT),
    ],
)  # fmt: skip
def test_each_rule_names_the_argument_and_the_fault(args: Any, message: str, code: str) -> None:
    with pytest.raises(ArgumentError) as info:
        check_arguments(SCHEMA, args)
    assert (str(info.value), info.value.code) == (message, code)


def test_limits_hold_exactly() -> None:
    assert check_arguments(SCHEMA, {"doc_id": "12345", "radius": 2, "ids": [1, 2]})["radius"] == 2
    assert check_arguments(SCHEMA, {"doc_id": "d", "radius": 0, "name": "xy"})["radius"] == 0


def test_integral_floats_come_back_as_ints_where_an_integer_is_wanted() -> None:
    out = check_arguments(SCHEMA, {"doc_id": "d", "radius": 2.0, "ids": [1.0], "score": 0.5})
    assert out == {"doc_id": "d", "radius": 2, "ids": [1], "score": 0.5}
    assert isinstance(out["radius"], int) and isinstance(out["ids"][0], int)
    extra = {"type": "object", "additionalProperties": {"type": "integer"}}
    assert check_arguments(extra, {"n": 3.0}) == {"n": 3}
    assert isinstance(check_arguments(extra, {"n": 3.0})["n"], int)


def test_the_path_names_the_whole() -> None:
    with pytest.raises(ArgumentError, match=r"^args\.doc_id is required$"):
        check_arguments(SCHEMA, {}, path="args")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"doc_id": "d\ud800"},
         "arguments.doc_id is not valid Unicode (a lone surrogate cannot be UTF-8)"),
        ({"doc_id": "d", "note": "\udfff"},
         "arguments.note is not valid Unicode (a lone surrogate cannot be UTF-8)"),
        ({"doc_id": "d", "ids": [1, "x\udc00"]},
         "arguments.ids[1] is not valid Unicode (a lone surrogate cannot be UTF-8)"),
        ({"doc_id": "d", "x\ud800": 1},
         "arguments has a field name that is not valid Unicode: 'x\\ud800'"),
        # Named before the schema's faults (too long, unknown field, ...) and the shallowest
        # first, the same for the same input every time.
        ({"doc_id": "\ud800" * 9, "ids": ["\ud800"]},
         "arguments.doc_id is not valid Unicode (a lone surrogate cannot be UTF-8)"),
        ("\ud800", "arguments is not valid Unicode (a lone surrogate cannot be UTF-8)"),
    ],
)  # fmt: skip
def test_a_string_that_is_not_valid_unicode_is_refused_naming_it(args: Any, message: str) -> None:
    with pytest.raises(ArgumentError) as info:
        check_arguments(SCHEMA, args)
    assert (str(info.value), info.value.code) == (message, INVALID_ARGUMENT)
    str(info.value).encode("utf-8")  # the refusal can itself be sent


def test_valid_unicode_beyond_the_basic_plane_passes() -> None:
    # A surrogate pair in JSON ("\ud83d\ude00") decodes to one valid character.
    assert check_arguments(SCHEMA, {"doc_id": "\U0001f600", "note": "ж€"})["doc_id"] == "😀"
