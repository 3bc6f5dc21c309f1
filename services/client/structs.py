"""Plain Python <-> betterproto `google.protobuf.Struct` / `Value`, built field by field.

betterproto 2.0.0b7's `Struct.from_dict` is broken: it stores the raw Python values in
`fields` instead of `Value`s, so `bytes()` either raises (strings, dicts) or, for numbers
and lists, writes bytes protobuf rejects as corrupt. So every `Value` is built explicitly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import betterproto
from betterproto.lib.google.protobuf import ListValue, NullValue, Struct, Value

from services.common.structs import json_number


def to_value(obj: Any) -> Value:
    """A `Value` for a JSON-like Python object (None, bool, int, float, str, list, tuple, dict)."""
    # bool before int: True is an int in Python, but a bool_value on the wire.
    if obj is None:
        return Value(null_value=NullValue(0))
    if isinstance(obj, bool):
        return Value(bool_value=obj)
    if isinstance(obj, int | float):
        return Value(number_value=float(obj))
    if isinstance(obj, str):
        return Value(string_value=obj)
    if isinstance(obj, Mapping):
        return Value(struct_value=to_struct(obj))
    if isinstance(obj, list | tuple):
        return Value(list_value=ListValue(values=[to_value(v) for v in obj]))
    raise TypeError(f"cannot put a {type(obj).__name__} into a google.protobuf.Value")


def to_struct(obj: Mapping[str, Any]) -> Struct:
    """A `Struct` for a dict with string keys and JSON-like values."""
    fields: dict[str, Value] = {}
    for key, value in obj.items():
        if not isinstance(key, str):
            raise TypeError(f"Struct keys must be str, not {type(key).__name__} ({key!r})")
        fields[key] = to_value(value)
    return Struct(fields=fields)


def from_value(value: Value | None) -> Any:
    """The Python object a `Value` holds; an unset Value (or None) reads as None.

    Struct numbers are doubles; an integral one comes back as `int` (as JSON shows it), so
    `{"page": 3}` round-trips as 3, not 3.0.
    """
    if value is None:
        return None
    kind, _ = betterproto.which_one_of(value, "kind")
    if kind == "bool_value":
        return value.bool_value
    if kind == "number_value":
        return json_number(value.number_value)
    if kind == "string_value":
        return value.string_value
    if kind == "struct_value":
        return from_struct(value.struct_value)
    if kind == "list_value":
        return [from_value(v) for v in value.list_value.values]
    return None  # null_value, or no kind set at all


def from_struct(struct: Struct | None) -> dict[str, Any]:
    """The dict a `Struct` holds (an unset Struct reads as {})."""
    if struct is None:
        return {}
    return {key: from_value(value) for key, value in struct.fields.items()}
