"""A small JSON-schema checker for tool arguments (the subset the tool schemas use).

Supported: type, minimum, maximum, minLength, maxLength, enum, minItems, maxItems, items,
properties, required, additionalProperties: false. Two extensions: `x-maximum-code` on a
number names the error code of going past its `maximum` (read_chunk_window's radius states
its limit in the schema and past it answers WINDOW_TOO_LARGE, not INVALID_ARGUMENT);
`x-renamed` on an object maps argument names it does not take to the ones it takes instead
(fetch_cbr_data's `operation` -> `mode`), so the refusal names the field to use.
"""

from __future__ import annotations

import math
from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


INVALID_ARGUMENT = "INVALID_ARGUMENT"


class SchemaError(ValueError):
    """Arguments do not match the tool's schema; the message names the field.

    `code` is INVALID_ARGUMENT unless the schema names another for the broken rule.
    """

    def __init__(self, message: str, code: str = INVALID_ARGUMENT) -> None:
        super().__init__(message)
        self.code = code


def _is_type(value: Any, name: str) -> bool:
    if name == "integer" and isinstance(value, float) and value.is_integer():
        return True  # JSON numbers arrive as floats through google.protobuf.Struct
    if isinstance(value, bool) and name in ("integer", "number"):
        return False
    if name == "number" and isinstance(value, float) and not math.isfinite(value):
        return False  # NaN would pass every minimum and maximum
    return isinstance(value, _TYPES[name])


def check(schema: dict[str, Any], value: Any, path: str = "arguments") -> Any:
    """Validate `value` against `schema`; returns the value with integers normalised to int."""
    kind = schema.get("type")
    if kind and not _is_type(value, kind):
        raise SchemaError(f"{path} must be {kind}")
    if kind == "integer":
        value = int(value)
    if kind in ("integer", "number"):
        if "minimum" in schema and value < schema["minimum"]:
            raise SchemaError(f"{path} must be >= {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            raise SchemaError(
                f"{path} is {value}; the maximum allowed is {schema['maximum']}",
                schema.get("x-maximum-code", INVALID_ARGUMENT),
            )
    if kind == "string":
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            raise SchemaError(f"{path} must be at most {schema['maxLength']} characters")
        if schema.get("minLength", 0) > len(value):
            raise SchemaError(f"{path} must not be empty")
        if "enum" in schema and value not in schema["enum"]:
            raise SchemaError(f"{path} must be one of {', '.join(schema['enum'])}")
    if kind == "array":
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise SchemaError(
                f"{path} has {len(value)} items; at most {schema['maxItems']} allowed"
            )
        if schema.get("minItems", 0) > len(value):
            raise SchemaError(f"{path} must have at least {schema['minItems']} item(s)")
        items = schema.get("items")
        if items:
            value = [check(items, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if kind == "object":
        props: dict[str, Any] = schema.get("properties", {})
        renamed: dict[str, str] = schema.get("x-renamed", {})
        old = sorted(set(value) & set(renamed) - set(props))
        if old:
            raise SchemaError(f"{path}.{old[0]} is not accepted: use {path}.{renamed[old[0]]}")
        for name in schema.get("required", []):
            if name not in value:
                raise SchemaError(f"{path}.{name} is required")
        if schema.get("additionalProperties") is False:
            extra = sorted(set(value) - set(props))
            if extra:
                raise SchemaError(f"{path} has unknown field(s): {', '.join(extra)}")
        value = {
            k: check(props[k], v, f"{path}.{k}") if k in props else v for k, v in value.items()
        }
    return value
