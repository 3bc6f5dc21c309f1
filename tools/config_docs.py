"""Writes docs/configuration.md from the settings' declarations (services/common/settings.Var).

Each service's settings are loaded from a few example environments (defaults, and the
optional branches: a model runtime, tracing, the Qdrant server) with an `Env` that records
what is read. Every name read must be declared as a `Var`; each Var gives its type, limits and
default, and its description is the docstring of the settings field it fills (parsed with
ast), or its own `doc`. One row per environment name.

It also writes services/common/setting_names.py, every name declared, against which a
service checks its environment at start (settings.refuse_undeclared).

Usage: tools/config_docs.py [--out PATH] [--names-out PATH] [--check | --list]
"""

from __future__ import annotations

import argparse
import ast
import inspect
import itertools
import re
import sys
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from services.common.settings import DECLARED, NOT_SETTINGS, PREFIXES, Env, Var  # noqa: E402

SERVICES = ("orchestrator", "llm", "retrieval", "toolsproxy")
NAMES_MODULE = ROOT / "services" / "common" / "setting_names.py"
_RUNTIME = {"LLM_RUNTIME_URL": "http://127.0.0.1:9/v1", "DEFAULT_MODEL_NAME": "m"}
SCENARIOS: tuple[dict[str, str], ...] = (
    {},
    {**_RUNTIME, "RETR_LLM_SUMMARIES": "true", "ORCH_SCORE_THRESHOLD": "0.5"},
    {"OTEL_TRACES_EXPORTER": "console,otlp"},
    {"RETR_INDEX_BACKEND": "qdrant", "QDRANT_URL": "http://127.0.0.1:9"},
)
"""Example environments that together walk every branch of the settings readers."""


def loaders() -> dict[str, Callable[[Env], Any]]:
    from services.llm.config import LlmSettings
    from services.orchestrator.config import OrchestratorSettings
    from services.retrieval.config import RetrievalSettings
    from services.toolsproxy.config import ToolsProxySettings

    return {
        "orchestrator": OrchestratorSettings.from_env,
        "llm": LlmSettings.from_env,
        "retrieval": RetrievalSettings.from_env,
        "toolsproxy": ToolsProxySettings.from_env,
    }


@dataclass
class Reads:
    """What the services read: the Vars (with the services reading each) and any name read
    without a declaration."""

    vars: dict[str, tuple[Var, set[str]]]
    undeclared: dict[str, set[str]]


def collect() -> Reads:
    found: dict[str, tuple[Var, set[str]]] = {}
    asked: dict[str, set[str]] = {}
    for service, load in loaders().items():
        for scenario in SCENARIOS:
            env = Env(scenario)
            try:
                load(env)
            except Exception as exc:  # a scenario that stops early walks less: say so
                raise SystemExit(f"config_docs: {service} with {scenario}: {exc}") from exc
            for var in env.declared.values():
                # The declaration bound to a settings field carries the field's docstring.
                found.setdefault(var.name, (DECLARED.get(var.name, var), set()))[1].add(service)
            for names in env.asked:
                for name in names:
                    asked.setdefault(name, set()).add(service)
    known = {n for var, _ in found.values() for n in var.names}
    known |= {var.name + "_FILE" for var, _ in found.values() if var.kind == "secret"}
    undeclared = {n: s for n, s in asked.items() if n not in known}
    return Reads(found, undeclared)


@cache
def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string right after its annotated assignment)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = after.value.value
    return docs


def description(var: Var) -> str:
    text = var.doc
    if not text and var.owner is not None:
        cls, name = var.owner
        text = field_docs(cls).get(name, "")
    return re.sub(r"\s+", " ", text).strip()


def _num(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:g}" if isinstance(value, float) else str(value)


def type_range(var: Var) -> str:
    if var.range_doc:
        return var.range_doc
    if var.kind == "flag":
        return "true/false"
    if var.kind == "secret":
        return f"secret, or `{var.name}_FILE`: a file holding it"
    if var.kind == "text":
        return "one of " + ", ".join(var.choices) if var.choices else "text"
    lo, hi = _num(var.minimum), _num(var.maximum)
    span = f" {lo}..{hi}" if lo and hi else f" ≥ {lo}" if lo else f" ≤ {hi}" if hi else ""
    return var.kind + span


def default(var: Var) -> str:
    if var.default_doc:
        return var.default_doc
    if var.kind == "secret" or var.default is None:
        return "unset"
    if var.kind == "flag":
        return "true" if var.default else "false"
    if var.default == "":
        return "empty"
    return f"`{_num(var.default)}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def rows(reads: Reads) -> Iterable[tuple[str, str, str, str, str]]:
    """(name, type/range, default, description, services), one per environment name."""
    alternatives: dict[str, list[Var]] = {}
    for var, _ in reads.vars.values():
        for name in var.also:
            alternatives.setdefault(name, []).append(var)
    table: dict[str, tuple[str, str, str, str, str]] = {}
    for name, (var, services) in reads.vars.items():
        others = ", ".join(f"`{n}`" for n in var.also)
        also = f" When unset, {others} is read." if var.also else ""
        table[name] = (name, type_range(var), default(var), description(var) + also, _who(services))
    for name, owners in alternatives.items():
        services = set().union(*(reads.vars[v.name][1] for v in owners))
        primary = ", ".join(f"`{v.name}`" for v in owners)
        if name in table:  # a setting of its own that another falls back to
            row = table[name]
            verb = "are" if len(owners) > 1 else "is"
            text = f"{row[3]} Also read where {primary} {verb} unset."
            table[name] = (*row[:3], text, _who(services | set(row[4].split(", "))))
            continue
        text = f"Read in place of {primary} when that is unset (the same setting)."
        table[name] = (name, "as " + primary, "unset", text, _who(services))
    return [table[n] for n in sorted(table)]


def _who(services: set[str]) -> str:
    return ", ".join(s for s in SERVICES if s in services)


def render(reads: Reads) -> str:
    table = list(rows(reads))
    lines = [
        "# Configuration",
        "",
        "<!-- Generated by `make gen` (tools/config_docs.py) from the settings' declarations in",
        "services/*/config.py and services/common/settings.py and the settings fields they fill",
        "(defaults, docstrings); `make check-gen` fails when it is stale. Edit those, not this",
        "file. -->",
        "",
        "Every service reads its settings from environment variables at start and refuses to",
        "start on a value it cannot use (the error names the variable). Unset or blank means",
        "the default. Each setting has one name, the spec's where a spec names it. A few rows",
        "say where another name is read when that one is unset: the specs' own alternatives",
        "(`LOG_LEVEL`, `RAG_WINDOW_RADIUS`, `VECTOR_DB_URL`) and OpenTelemetry's general",
        "protocol variable. A name with one of the prefixes",
        ", ".join(f"`{p}`" for p in PREFIXES),
        "that no service declares stops the service at start; the error names the closest",
        f"declared name. {len(table)} variables.",
        "",
        "The URLs of upstreams (`LLM_RUNTIME_URL`, `MCP_PROXY_TAVILY_URL`, `MCP_PROXY_CBR_URL`,",
        "`RETR_EMBEDDING_URL`, `RERANK_MODEL_URL`) must be http(s) with a host and carry no",
        "credentials, query or fragment: keys go in their `*_API_KEY` settings, never in a URL",
        "that reaches logs.",
        "",
        "| variable | type / range | default | what it does | read by |",
        "|---|---|---|---|---|",
    ]
    for row in table:
        lines.append("| " + " | ".join(_cell(c) for c in (f"`{row[0]}`", *row[1:])) + " |")
    return "\n".join(lines) + "\n"


def all_names(reads: Reads) -> list[str]:
    """Every environment name the services read (a secret's NAME_FILE too), sorted."""
    names = {n for var, _ in reads.vars.values() for n in var.names}
    names |= {var.name + "_FILE" for var, _ in reads.vars.values() if var.kind == "secret"}
    return sorted(names)


def names_module(reads: Reads) -> str:
    """services/common/setting_names.py: every declared name, for settings.refuse_undeclared."""
    clash = sorted(set(all_names(reads)) & NOT_SETTINGS)
    if clash:
        raise SystemExit(f"config_docs: declared but listed in NOT_SETTINGS: {clash}")
    lines = [
        '"""Every environment name a Visior service declares, for the start-up check of',
        "services/common/settings.refuse_undeclared.",
        "",
        "Generated by `make gen` (tools/config_docs.py) from the settings' declarations;",
        '`make check-gen` fails when it is stale. Do not edit."""',
        "",
        "NAMES = frozenset(",
        "    {",
        *(f'        "{name}",' for name in all_names(reads)),
        "    }",
        ")",
    ]
    return "\n".join(lines) + "\n"


def print_names(reads: Reads) -> None:
    """Every environment name the services read (a secret's NAME_FILE too), then the settings
    read under more than one name."""
    names = all_names(reads)
    for name in names:
        print(name)
    several = sorted(var.names for var, _ in reads.vars.values() if var.also)
    print(f"{len(names)} names; {len(several)} settings read under more than one name:")
    for group in several:
        print("  " + " / ".join(group))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "configuration.md")
    parser.add_argument("--names-out", type=Path, default=NAMES_MODULE)
    parser.add_argument("--check", action="store_true", help="fail when --out is stale")
    parser.add_argument(
        "--list", action="store_true", help="print every name read and the lookups under 2+ names"
    )
    args = parser.parse_args(argv)
    reads = collect()
    if reads.undeclared:
        print(f"config_docs: read but not declared as a Var: {reads.undeclared}", file=sys.stderr)
        return 1
    if args.list:
        print_names(reads)
        return 0
    outputs = {args.out: render(reads), args.names_out: names_module(reads)}
    if args.check:
        stale = [
            path
            for path, text in outputs.items()
            if (path.read_text(encoding="utf-8") if path.exists() else "") != text
        ]
        for path in stale:
            print(f"stale: {path}", file=sys.stderr)
        return 1 if stale else 0
    for path, text in outputs.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
