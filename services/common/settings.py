"""Reading settings from the environment: each variable declared once (`Var`), read by typed getters.

A `Var` names one setting's environment variable with its type, default and limits; `Fields`
binds Vars to the fields of a settings dataclass, whose field docstrings describe them.
docs/configuration.md is generated from these declarations (tools/config_docs.py).
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class SettingsError(ValueError):
    """A setting has a value the service cannot start with."""


class Env:
    """A view of environment variables: of the names a setting is read under, the first set wins
    (its one name, then any name read in its place; see `Var.also`)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._env = dict(os.environ if environ is None else environ)
        self.asked: list[tuple[str, ...]] = []
        """Every lookup, in order (tools/config_docs.py checks each name is declared)."""
        self.declared: dict[str, Var] = {}
        """The Vars read through `Var.read`, by name."""

    def raw(self, names: Sequence[str]) -> tuple[str, str] | None:
        self.asked.append(tuple(names))
        for name in names:
            value = self._env.get(name)
            if value is not None and value.strip() != "":
                return name, value.strip()
        return None

    def text(self, names: Sequence[str] | str, default: str) -> str:
        found = self.raw([names] if isinstance(names, str) else names)
        return default if found is None else found[1]

    def integer(
        self,
        names: Sequence[str] | str,
        default: int,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> int:
        return self._parsed(names, default, int, "an integer", minimum, maximum)

    def number(
        self,
        names: Sequence[str] | str,
        default: float,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
    ) -> float:
        return self._parsed(names, default, float, "a number", minimum, maximum)

    def _parsed(
        self,
        names: Sequence[str] | str,
        default: Any,
        parse: Callable[[str], Any],
        what: str,
        minimum: float | None,
        maximum: float | None,
    ) -> Any:
        found = self.raw([names] if isinstance(names, str) else names)
        if found is None:
            return default
        name, text = found
        try:
            value = parse(text)
        except ValueError:
            raise SettingsError(f"{name}={text!r} is not {what}") from None
        if not math.isfinite(value):  # nan passes every comparison; inf lifts every limit
            raise SettingsError(f"{name}={text!r} is not a finite number")
        if minimum is not None and value < minimum:
            raise SettingsError(f"{name}={value} is below the minimum {minimum}")
        if maximum is not None and value > maximum:
            raise SettingsError(f"{name}={value} is above the maximum {maximum}")
        return value

    def secret(self, names: Sequence[str]) -> str | None:
        """A secret from the first of `names` set, each also read as NAME_FILE (a file holding
        it, e.g. a mounted Kubernetes Secret); None when none is set."""
        for base in names:
            for name, is_file in ((base, False), (base + "_FILE", True)):
                found = self.raw([name])
                if found is None:
                    continue
                if not is_file:
                    return found[1]
                path = Path(found[1])
                try:
                    key = path.read_text(encoding="utf-8").strip()
                except (OSError, UnicodeDecodeError) as exc:
                    reason = getattr(exc, "strerror", None) or type(exc).__name__
                    raise SettingsError(f"{name}: cannot read {path}: {reason}") from None
                if not key:
                    raise SettingsError(f"{name}: {path} is empty")
                return key
        return None

    def flag(self, names: Sequence[str] | str, default: bool) -> bool:
        found = self.raw([names] if isinstance(names, str) else names)
        if found is None:
            return default
        name, text = found
        lowered = text.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise SettingsError(f"{name}={text!r} is not a boolean (true/false)")


_UNSET: Any = object()
DECLARED: dict[str, Var] = {}
"""Every Var declared so far, by name (one declaration per name)."""


@dataclass(frozen=True)
class Var:
    """One environment variable: name, type, default and limits, declared once.

    The description is the docstring of the settings field it fills (`owner`, set by
    `Fields`), or `doc` for a Var that fills no field of its own.
    """

    name: str
    kind: str
    """text, integer, number, flag or secret."""
    default: Any = None
    """None for integer/number: unset means None (the consumer's own default)."""
    minimum: float | None = None
    maximum: float | None = None
    also: tuple[str, ...] = ()
    """Names read when `name` is unset: a spec's own alternative (LOG_LEVEL, RAG_WINDOW_RADIUS,
    VECTOR_DB_URL), or the setting this one falls back to (Retrieval's runtime settings)."""
    choices: tuple[str, ...] = ()
    """Allowed text values (compared lower-cased when `lower`)."""
    lower: bool = False
    default_doc: str = ""
    """What the docs show as the default when it is computed at start."""
    range_doc: str = ""
    """What the docs show as type and range when the reader parses the value itself."""
    doc: str = field(default="", compare=False)
    owner: tuple[type, str] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        known = DECLARED.get(self.name)
        if known is not None and known != self:
            raise SettingsError(f"{self.name} is declared twice, differently")
        if known is None or self.owner is not None or self.doc:
            DECLARED[self.name] = self

    @property
    def names(self) -> list[str]:
        return [self.name, *self.also]

    def found(self, env: Env) -> tuple[str, str] | None:
        """(name, value) of the first of `names` set, for settings parsed by their reader."""
        env.declared[self.name] = self
        return env.raw(self.names)

    def read(self, env: Env, default: Any = _UNSET) -> Any:
        """The value from `env` (`default` overrides the declared one, e.g. a computed one)."""
        env.declared[self.name] = self
        value = self.default if default is _UNSET else default
        names = self.names
        if self.kind == "secret":
            return env.secret(names)
        if self.kind == "flag":
            return env.flag(names, bool(value))
        if self.kind == "text":
            text = env.text(names, value)
            if self.lower:
                text = text.lower()
            found = env.raw(names) if self.choices and text not in self.choices else None
            if found is not None:
                raise SettingsError(f"{found[0]}={text!r} must be one of {', '.join(self.choices)}")
            return text
        if value is None and env.raw(names) is None:
            return None
        if self.kind == "integer":
            lo, hi = self.minimum, self.maximum
            return env.integer(
                names,
                0 if value is None else value,
                minimum=None if lo is None else int(lo),
                maximum=None if hi is None else int(hi),
            )
        default = 0.0 if value is None else value
        return env.number(names, default, minimum=self.minimum, maximum=self.maximum)


def text(name: str, default: str = "", **more: Any) -> Var:
    return Var(name, "text", default, **more)


def integer(
    name: str, default: int | None, minimum: int | None = None, maximum: int | None = None,
    **more: Any,
) -> Var:  # fmt: skip
    return Var(name, "integer", default, minimum, maximum, **more)


def number(
    name: str, default: float | None, minimum: float | None = None,
    maximum: float | None = None, **more: Any,
) -> Var:  # fmt: skip
    return Var(name, "number", default, minimum, maximum, **more)


def flag(name: str, default: bool, **more: Any) -> Var:
    return Var(name, "flag", default, **more)


def secret(name: str, **more: Any) -> Var:
    """A secret: NAME, or NAME_FILE naming a file that holds it (e.g. a mounted Secret)."""
    return Var(name, "secret", None, **more)


class Fields(Generic[T]):
    """Vars bound to the fields of settings dataclass `cls`: one Var per field, read together."""

    def __init__(self, cls: type[T], **fields: Var) -> None:
        self.cls = cls
        self.vars = {f: replace(v, owner=(cls, f)) for f, v in fields.items()}

    def values(self, env: Env, **defaults: Any) -> dict[str, Any]:
        """Each field's value; `defaults` replace declared defaults computed at start."""
        return {f: v.read(env, defaults.get(f, _UNSET)) for f, v in self.vars.items()}

    def read(self, env: Env, computed: Mapping[str, Any] | None = None, /, **given: Any) -> T:
        """`cls` from the environment; `computed` replaces declared defaults computed at start,
        `given` are fields the caller reads (or computes) itself."""
        values = {
            f: v.read(env, (computed or {}).get(f, _UNSET))
            for f, v in self.vars.items()
            if f not in given
        }
        return self.cls(**values, **given)


def _module_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a parent package is missing
        return False


TRACE_EXPORTERS = ("console", "otlp")
_OTLP_MODULES = {
    "grpc": "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
    "http/protobuf": "opentelemetry.exporter.otlp.proto.http.trace_exporter",
}


@dataclass(frozen=True)
class TracingSettings:
    """Optional OpenTelemetry tracing (services/common/tracing.py), off by default.

    Standard OpenTelemetry variables: OTEL_TRACES_EXPORTER (comma list of console, otlp,
    none; unset = none = off: unlike the SDK's default of otlp, tracing is opt-in here),
    OTEL_SDK_DISABLED=true (off whatever else says), OTEL_SERVICE_NAME,
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL / OTEL_EXPORTER_OTLP_PROTOCOL (grpc or
    http/protobuf; default: the OTLP exporter package installed, grpc first). The exporter
    packages read their own OTEL_EXPORTER_OTLP_* (endpoint, headers, ...), and the SDK
    OTEL_TRACES_SAMPLER*. A setting naming a package that is not installed is a
    SettingsError at start.
    """

    exporters: tuple[str, ...] = ()
    """Span exporters; empty = tracing off."""
    otlp_protocol: str = ""
    """OTLP transport when `exporters` has otlp: grpc or http/protobuf."""
    service_name: str = ""
    """The resource's service.name; empty = visior-<service>."""

    @property
    def enabled(self) -> bool:
        return bool(self.exporters)

    @classmethod
    def from_env(cls, env: Env) -> TracingSettings:
        if OTEL_SDK_DISABLED.read(env):
            return cls()
        exporters = TRACING.vars["exporters"].read(env)
        names: list[str] = []
        for item in exporters.split(","):
            name = item.strip().lower()
            if name in ("", "none"):
                continue
            if name not in TRACE_EXPORTERS:
                raise SettingsError(
                    f"OTEL_TRACES_EXPORTER={exporters!r}: {name!r} is not one "
                    f"of none, {', '.join(TRACE_EXPORTERS)}"
                )
            if name not in names:
                names.append(name)
        if not names:
            return cls()
        if not _module_available("opentelemetry.sdk.trace"):
            raise SettingsError(
                "OTEL_TRACES_EXPORTER is set but opentelemetry-sdk is not installed "
                "(pip install opentelemetry-sdk, or unset OTEL_TRACES_EXPORTER)"
            )
        protocol = ""
        if "otlp" in names:
            protocol = cls._otlp_protocol(env)
        return cls(tuple(names), protocol, TRACING.vars["service_name"].read(env))

    @staticmethod
    def _otlp_protocol(env: Env) -> str:
        found = TRACING.vars["otlp_protocol"].found(env)
        if found is not None:
            if found[1] not in _OTLP_MODULES:
                raise SettingsError(f"{found[0]}={found[1]!r} is not grpc or http/protobuf")
            wanted = [found[1]]
        else:
            wanted = list(_OTLP_MODULES)
        for protocol in wanted:
            if _module_available(_OTLP_MODULES[protocol]):
                return protocol
        package = " or ".join(
            "opentelemetry-exporter-otlp-proto-" + p.removesuffix("/protobuf") for p in wanted
        )
        raise SettingsError(
            f"OTEL_TRACES_EXPORTER=otlp needs {package}, which is not installed "
            "(install it, or use OTEL_TRACES_EXPORTER=console)"
        )


TRACING = Fields(
    TracingSettings,
    exporters=text("OTEL_TRACES_EXPORTER", "", default_doc="none (tracing off)"),
    otlp_protocol=text(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        also=("OTEL_EXPORTER_OTLP_PROTOCOL",),
        choices=tuple(_OTLP_MODULES),
        default_doc="the OTLP exporter package installed, grpc first",
    ),
    service_name=text("OTEL_SERVICE_NAME", default_doc="visior-<service>"),
)
OTEL_SDK_DISABLED = flag(
    "OTEL_SDK_DISABLED", False, doc="true turns tracing off whatever OTEL_TRACES_EXPORTER says."
)


@dataclass(frozen=True)
class ServerSettings:
    """How a gRPC server listens; the same knobs for every service, under its prefix."""

    service: str
    """Service key (orchestrator, llm, retrieval, toolsproxy), used in logs and metrics."""
    host: str = "127.0.0.1"
    """Address to bind the gRPC server to."""
    port: int = 0
    """gRPC port; 0 picks a free one (tests)."""
    metrics_port: int = 0
    """Prometheus /metrics port; 0 disables the HTTP exporter."""
    log_level: str = "INFO"
    """Root log level."""
    max_message_bytes: int = 4 * 1024 * 1024
    """Largest gRPC message received or sent."""
    grace_seconds: float = 10.0
    """How long in-flight RPCs may finish after SIGTERM."""
    drain_seconds: float = 0.5
    """After SIGTERM, how long health says NOT_SERVING before new RPCs are refused."""
    keepalive_seconds: int = 30
    """Server keepalive ping interval."""
    max_concurrent_rpcs: int = 256
    """Concurrent RPCs before new ones get RESOURCE_EXHAUSTED."""
    tracing: TracingSettings = TracingSettings()
    """Optional OpenTelemetry tracing (OTEL_* variables); off by default."""

    @classmethod
    def from_env(
        cls,
        service: str,
        prefix: str,
        env: Env,
        default_port: int,
        *,
        default_max_message_bytes: int = 4 * 1024 * 1024,
    ) -> ServerSettings:
        """The server knobs under `prefix` (ORCH_, LLM_SERVICE_, RETR_, MCP_PROXY_)."""
        fields = server_fields(prefix, default_port)
        values = fields.values(env, max_message_bytes=default_max_message_bytes)
        values["log_level"] = values["log_level"].upper()
        return cls(service=service, tracing=TracingSettings.from_env(env), **values)


def server_fields(prefix: str, default_port: int) -> Fields[ServerSettings]:
    """The Vars of ServerSettings under one service's prefix."""
    return Fields(
        ServerSettings,
        host=text(prefix + "HOST", "127.0.0.1"),
        port=integer(prefix + "PORT", default_port, 0, 65535),
        metrics_port=integer(prefix + "METRICS_PORT", 0, 0, 65535),
        # LOG_LEVEL: the specs' mesh-wide name (llm-service.md §11, retrieval.md §8.1).
        log_level=text(prefix + "LOG_LEVEL", "INFO", also=("LOG_LEVEL",)),
        max_message_bytes=integer(
            prefix + "MAX_MESSAGE_BYTES", 4 * 1024 * 1024, 1024, 300 * 1024 * 1024,
            default_doc="4194304 (Retrieval: RETR_MAX_DOCUMENT_BYTES + 1 MiB)"
            if prefix == "RETR_" else "",
        ),
        grace_seconds=number(prefix + "GRACE_SECONDS", 10.0, 0.0),
        drain_seconds=number(prefix + "DRAIN_SECONDS", 0.5, 0.0),
        keepalive_seconds=integer(prefix + "KEEPALIVE_SECONDS", 30, 1),
        max_concurrent_rpcs=integer(prefix + "MAX_CONCURRENT_RPCS", 256, 1),
    )  # fmt: skip


@dataclass(frozen=True)
class DownstreamSettings:
    """How to reach one downstream gRPC service."""

    target: str
    """host:port of the downstream gRPC server."""
    timeout_seconds: float
    """Deadline of one call when the caller's own deadline is longer (or absent)."""
    retry_attempts: int = 3
    """Attempts in all on UNAVAILABLE (1 = no retry)."""


def grpc_target(value: str, name: str) -> str:
    """host:port from 'host:port', 'grpc://host:port' or 'http://host:port' (the specs use URLs)."""
    target = value
    for scheme in ("grpc://", "http://", "dns:///"):
        target = target.removeprefix(scheme)
    target = target.rstrip("/")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise SettingsError(f"{name}={value!r} is not host:port")
    return target


@dataclass(frozen=True)
class Downstream:
    """Where one downstream gRPC service is (a URL or host:port) and its call deadline."""

    url: Var
    timeout: Var
    default_target: str

    def read(self, env: Env, attempts: Var) -> DownstreamSettings:
        found = self.url.found(env)
        return DownstreamSettings(
            target=grpc_target(found[1], found[0]) if found else self.default_target,
            timeout_seconds=self.timeout.read(env),
            retry_attempts=attempts.read(env),
        )


def downstream(
    url: str, timeout: str, seconds: float, service: str, default_target: str, **url_doc: str
) -> Downstream:
    """The Vars of one downstream: `url` (doc in `url_doc`, or a generic one) and `timeout`."""
    return Downstream(
        text(
            url,
            default_doc=default_target,
            doc=url_doc.get("doc", f"{service}: host:port or a grpc:// / http:// URL."),
        ),
        number(
            timeout, seconds, 0.001,
            doc=f"Deadline of one {service} call when the caller's own deadline is longer "
            "or absent.",
        ),
        default_target,
    )  # fmt: skip


def retry_attempts(prefix: str) -> Var:
    """`<prefix>RETRY_ATTEMPTS`: one count for every downstream gRPC call of a service."""
    return integer(
        prefix + "RETRY_ATTEMPTS", 3, 1, 5,
        doc="Attempts in all of a downstream gRPC call on UNAVAILABLE (1 = no retry).",
    )  # fmt: skip
