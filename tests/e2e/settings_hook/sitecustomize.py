"""Test-only: settings that are constants in the services, changed inside a mesh's processes.

The breakers, retries, outside-call timeouts and caches of the model runtime client, the
Bank of Russia and Tavily clients and the vector index are not read from the environment
(docs/configuration.md lists what is). The fault tests need them short, so `short_settings`
puts this directory on the services' PYTHONPATH: Python imports this module at start-up,
and it replaces fields of the settings the config modules return, as a unit test would by
constructing the settings dataclass itself. E2E_SETTINGS_OVERRIDES holds the fields as JSON
(a nested object for a field that is itself a dataclass, e.g. a `retry` or `breaker`
policy), by group: runtime, cbr, tavily (services/llm/config.py, services/toolsproxy/config.py),
index, engine (services/retrieval/config.py).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from dataclasses import is_dataclass, replace
from typing import Any

_OVERRIDES: dict[str, dict[str, Any]] = json.loads(os.environ.get("E2E_SETTINGS_OVERRIDES", "{}"))


def _replaced(value: Any, fields: dict[str, Any]) -> Any:
    """`value` with `fields` replaced; a dict for a dataclass field (a retry policy) replaces
    fields of that one in turn."""
    changes = {
        name: _replaced(getattr(value, name), new)
        if isinstance(new, dict) and is_dataclass(getattr(value, name))
        else new
        for name, new in fields.items()
    }
    return replace(value, **changes)


def _wrap(module: Any, name: str, group: str) -> None:
    fields = _OVERRIDES.get(group)
    if not fields:
        return
    read = getattr(module, name)

    def overridden(*args: Any, **kwargs: Any) -> Any:
        value = read(*args, **kwargs)
        return value if value is None else _replaced(value, fields)

    setattr(module, name, overridden)


GROUPS = {
    "runtime": ("services.llm", "runtime_settings"),
    "cbr": ("services.toolsproxy", "cbr_settings"),
    "tavily": ("services.toolsproxy", "tavily_settings"),
    "index": ("services.retrieval", "index_settings"),
    "engine": ("services.retrieval", "engine_settings"),
}
"""Each group: the service (`python -m` package) and its config module's reader."""


def _install() -> None:
    argv = getattr(sys, "orig_argv", [])
    service = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""
    for group, (package, reader) in GROUPS.items():
        if group in _OVERRIDES and service == package:
            _wrap(importlib.import_module(package + ".config"), reader, group)


_install()
