"""Reading protobuf messages: google.protobuf.Struct <-> dict, keeping integers integers
(Struct stores every number as a double), and proto3 `optional` fields."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format, struct_pb2
from google.protobuf.message import Message

from services.common import errors


def optional(message: Message, name: str) -> Any:
    """A proto3 `optional` field's value, or None when the caller left it unset (so that an
    explicit zero or false stays apart from "not given")."""
    return getattr(message, name) if message.HasField(name) else None


MAX_EXACT_INT = 2**53
"""Doubles hold every integer below this exactly; from it on, a whole double stays a float."""


def json_number(number: float) -> int | float:
    """A Struct's number as JSON shows it: a whole double below MAX_EXACT_INT as an int; any
    other (a fraction, a larger one, NaN, an infinity) as it is."""
    return int(number) if number.is_integer() and abs(number) < MAX_EXACT_INT else number


def _ints(value: Any) -> Any:
    if isinstance(value, float):
        return json_number(value)
    if isinstance(value, dict):  # sorted: a Struct's map order changes from process to process
        return {k: _ints(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value


def struct_to_dict(message: struct_pb2.Struct | struct_pb2.Value) -> Any:
    """A Struct as a dict (a Value as its JSON value), whole-number doubles as ints."""
    return _ints(json_format.MessageToDict(message))


def request_struct(message: struct_pb2.Struct, field_name: str) -> Any:
    """`struct_to_dict` of a Struct a caller sent: a NaN or infinite number (gRPC can carry
    them, JSON cannot) is the caller's INVALID_ARGUMENT naming `field_name`."""
    try:
        return struct_to_dict(message)
    except ValueError:
        raise errors.InvalidArgumentError(
            f"{field_name} holds a number JSON cannot represent (NaN or Infinity)",
            metadata={"field": field_name},
        ) from None
