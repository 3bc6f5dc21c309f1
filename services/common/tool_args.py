"""Tool arguments checked against the tool's JSON schema (the schema is the contract).

One checker for both sides of a tool call: the LLM service reviews what the model wrote,
ToolsProxy what arrives in its request. Validation is `jsonschema`'s (draft 2020-12) with
two differences from the standard, both for values that crossed the wire:

- an integer may arrive as an integral float (protobuf's Struct carries every number as a
  double): `2.0` is an integer and comes back as `2`;
- a number must be finite (NaN would pass every minimum and maximum; JSON has no Infinity).

Two extension keywords of the tool schemas:

- `x-renamed` on an object maps argument names the tool does not take to the ones it takes
  instead (fetch_cbr_data's `operation` -> `mode`), so the refusal names the field to use;
- `x-maximum-code` on a number names the error code of going past its `maximum`
  (read_chunk_window's radius answers WINDOW_TOO_LARGE, not INVALID_ARGUMENT).

A string (a value or a field name) that is not valid Unicode, one holding a lone surrogate
such as JSON's "\\ud800" that cannot be encoded as UTF-8, is refused before the schema is
looked at: nothing downstream (a database, the wire) can carry it, nor could a message
quoting it.

A refusal is one `ArgumentError` whose message starts with the argument's path
(`arguments.doc_id is required`, `arguments.ids[0] must be string`); of several faults the
shallowest is named, the same one for the same input every time.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

from jsonschema import Draft202012Validator, ValidationError, validators

from services.common.tool_contract import INVALID_ARGUMENT


class ArgumentError(ValueError):
    """Arguments do not match the tool's schema; the message names the argument.

    `code` is INVALID_ARGUMENT unless the schema names another for the broken rule.
    """

    def __init__(self, message: str, code: str = INVALID_ARGUMENT) -> None:
        super().__init__(message)
        self.code = code


def _is_integer(_checker: Any, value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _is_number(_checker: Any, value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def _renamed(
    validator: Any, renamed: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if not (isinstance(instance, dict) and isinstance(renamed, Mapping)):
        return
    for old in sorted(set(instance) & set(renamed) - set(schema.get("properties", {}))):
        yield ValidationError(f"{old} is not accepted", instance=old, validator_value=renamed)


_Validator = validators.extend(
    Draft202012Validator,
    validators={"x-renamed": _renamed},
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine_many(
        {"integer": _is_integer, "number": _is_number}
    ),
)

_RANK = {"type": 0, "x-renamed": 1, "required": 2, "additionalProperties": 3}
"""Which fault of one value is named first (others follow in keyword order)."""


_RULES = {
    "const": "must be {limit!r}",
    "minimum": "must be >= {limit} (it is {shown})",
    "maximum": "must be <= {limit} (it is {shown})",
    "exclusiveMinimum": "must be > {limit} (it is {shown})",
    "exclusiveMaximum": "must be < {limit} (it is {shown})",
    "minLength": "must be at least {limit} characters",
    "maxLength": "must be at most {limit} characters (it has {size})",
    "minItems": "must have at least {limit} item(s)",
    "maxItems": "must have at most {limit} item(s) (it has {size})",
    "pattern": "must match the pattern {limit} (got {shown})",
}
"""The message of each bound a value broke, after its path."""


def _path(root: str, parts: Any) -> str:
    return root + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _message(error: ValidationError, path: str) -> str:
    kw, limit, value = str(error.validator), error.validator_value, error.instance
    if kw == "type":
        return f"{path} must be {' or '.join([limit] if isinstance(limit, str) else limit)}"
    if kw == "x-renamed":
        return f"{path}.{value} is not accepted: use {path}.{limit[value]}"
    if kw == "required":
        missing = next(n for n in limit if n not in value)
        return f"{path}.{missing} is required"
    if kw == "additionalProperties":
        unknown = sorted(set(value) - set(error.schema.get("properties", {})))
        return f"{path} has unknown field(s): {', '.join(unknown)}"
    if kw == "enum":
        return f"{path} must be one of {', '.join(map(str, limit))}"
    if kw == "minLength" and limit == 1:
        return f"{path} must not be empty (at least 1 character)"
    if kw in _RULES:
        size = len(value) if isinstance(value, str | list | dict) else 0
        return f"{path} " + _RULES[kw].format(limit=limit, shown=_shown(value), size=size)
    return f"{path}: {error.message}"


def _first_type(schema: Mapping[str, Any], value: Any) -> str | None:
    kinds = schema.get("type")
    names = [kinds] if isinstance(kinds, str) else list(kinds or ())
    return next((k for k in names if _Validator.TYPE_CHECKER.is_type(value, k)), None)


def _normalised(schema: Any, value: Any) -> Any:
    """`value` (already valid) with integral floats where the schema wants an integer as ints."""
    if not isinstance(schema, Mapping):
        return value
    if isinstance(value, float) and _first_type(schema, value) == "integer":
        return int(value)
    if isinstance(value, list):
        return [_normalised(schema.get("items"), v) for v in value]
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        return {k: _normalised(props[k] if k in props else extra, v) for k, v in value.items()}
    return value


def _is_unicode(text: str) -> bool:
    """True unless `text` holds a lone surrogate (the one thing UTF-8 cannot encode)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _not_unicode(value: Any, path: str) -> str | None:
    """The refusal of the shallowest string in `value` that is not valid Unicode, or None."""
    level: list[tuple[str, Any]] = [(path, value)]
    while level:
        deeper: list[tuple[str, Any]] = []
        for where, v in level:
            if isinstance(v, str):
                if not _is_unicode(v):
                    return f"{where} is not valid Unicode (a lone surrogate cannot be UTF-8)"
            elif isinstance(v, dict):
                for key, item in v.items():
                    if isinstance(key, str) and not _is_unicode(key):
                        # repr escapes the surrogate, so the message itself stays encodable.
                        return f"{where} has a field name that is not valid Unicode: {key!r}"
                    deeper.append((_path(where, [key]), item))
            elif isinstance(v, list | tuple):
                deeper.extend((_path(where, [i]), item) for i, item in enumerate(v))
        level = deeper
    return None


def check_arguments(schema: Mapping[str, Any], value: Any, path: str = "arguments") -> Any:
    """`value` checked against `schema`; integers written as 2.0 come back as 2.

    Raises ArgumentError naming the argument at fault (`path` is the name of the whole).
    """
    broken = _not_unicode(value, path)
    if broken is not None:
        raise ArgumentError(broken)
    faults = list(_Validator(schema).iter_errors(value))
    if not faults:
        return _normalised(schema, value)
    first = min(
        faults,
        key=lambda e: (
            len(e.absolute_path),
            _RANK.get(str(e.validator), len(_RANK)),
            [str(p) for p in e.absolute_path],
        ),
    )
    code = INVALID_ARGUMENT
    if first.validator == "maximum":
        code = str(first.schema.get("x-maximum-code", INVALID_ARGUMENT))
    raise ArgumentError(_message(first, _path(path, first.absolute_path)), code)
