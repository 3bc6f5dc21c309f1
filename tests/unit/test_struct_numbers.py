"""A Struct's number as JSON shows it, the same in every reader: the services' Struct
conversion (common/structs), the LLM service's tool results (llm/tools_client) and the
typed client SDK (client/structs)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
from betterproto.lib.google.protobuf import Value as SdkValue
from google.protobuf import struct_pb2

from services.client.structs import from_value
from services.common.structs import MAX_EXACT_INT, json_number, struct_to_dict
from services.llm.tools_client import _value as tool_result_value


def _common(number: float) -> Any:
    return struct_to_dict(struct_pb2.Value(number_value=number))


def _tool_result(number: float) -> Any:
    return tool_result_value(struct_pb2.Value(number_value=number))


def _sdk(number: float) -> Any:
    return from_value(SdkValue(number_value=number))


READERS: list[Callable[[float], Any]] = [json_number, _common, _tool_result, _sdk]


@pytest.mark.parametrize("read", READERS, ids=["rule", "common", "llm", "sdk"])
@pytest.mark.parametrize(
    ("number", "expected"),
    [
        (3.0, 3),
        (-3.0, -3),
        (float(MAX_EXACT_INT - 1), MAX_EXACT_INT - 1),  # the largest exact whole double
        (float(MAX_EXACT_INT), float(MAX_EXACT_INT)),  # at the limit: stays a float
        (-float(MAX_EXACT_INT), -float(MAX_EXACT_INT)),
        (2.0**60, 2.0**60),
        (0.5, 0.5),
    ],
)
def test_a_whole_number_below_the_limit_is_an_int_and_any_other_a_float(
    read: Callable[[float], Any], number: float, expected: int | float
) -> None:
    got = read(number)
    assert got == expected and type(got) is type(expected)


def test_nan_and_infinity_pass_through_the_rule_and_the_sdk() -> None:
    assert math.isnan(json_number(math.nan)) and math.isnan(_sdk(math.nan))
    assert json_number(math.inf) == math.inf == _sdk(math.inf)
