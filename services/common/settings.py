"""Reading settings from the environment: typed getters with fallbacks across the specs' names."""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


class SettingsError(ValueError):
    """A setting has a value the service cannot start with."""


class Env:
    """A view of environment variables; the first name present wins, so spec and legacy names coexist."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._env = dict(os.environ if environ is None else environ)

    def raw(self, names: Sequence[str]) -> tuple[str, str] | None:
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
        found = self.raw([names] if isinstance(names, str) else names)
        if found is None:
            return default
        name, text = found
        try:
            value = int(text)
        except ValueError:
            raise SettingsError(f"{name}={text!r} is not an integer") from None
        if minimum is not None and value < minimum:
            raise SettingsError(f"{name}={value} is below the minimum {minimum}")
        if maximum is not None and value > maximum:
            raise SettingsError(f"{name}={value} is above the maximum {maximum}")
        return value

    def number(
        self, names: Sequence[str] | str, default: float, *, minimum: float | None = None
    ) -> float:
        found = self.raw([names] if isinstance(names, str) else names)
        if found is None:
            return default
        name, text = found
        try:
            value = float(text)
        except ValueError:
            raise SettingsError(f"{name}={text!r} is not a number") from None
        if not math.isfinite(value):  # nan passes every comparison; inf lifts every limit
            raise SettingsError(f"{name}={text!r} is not a finite number")
        if minimum is not None and value < minimum:
            raise SettingsError(f"{name}={value} is below the minimum {minimum}")
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
        if env.flag("OTEL_SDK_DISABLED", False):
            return cls()
        found = env.raw(["OTEL_TRACES_EXPORTER"])
        names: list[str] = []
        for item in (found[1] if found else "").split(","):
            name = item.strip().lower()
            if name in ("", "none"):
                continue
            if name not in TRACE_EXPORTERS:
                raise SettingsError(
                    f"OTEL_TRACES_EXPORTER={found[1] if found else ''!r}: {name!r} is not one "
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
        return cls(tuple(names), protocol, env.text("OTEL_SERVICE_NAME", ""))

    @staticmethod
    def _otlp_protocol(env: Env) -> str:
        found = env.raw(["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"])
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
        def names(suffix: str) -> list[str]:
            return [prefix + suffix, "VISIOR_" + suffix]

        return cls(
            service=service,
            host=env.text(prefix + "HOST", "127.0.0.1"),
            port=env.integer(prefix + "PORT", default_port, minimum=0, maximum=65535),
            metrics_port=env.integer(prefix + "METRICS_PORT", 0, minimum=0, maximum=65535),
            log_level=env.text([prefix + "LOG_LEVEL", "LOG_LEVEL"], "INFO").upper(),
            max_message_bytes=env.integer(
                names("MAX_MESSAGE_BYTES"),
                default_max_message_bytes,
                minimum=1024,
                maximum=300 * 1024 * 1024,
            ),
            grace_seconds=env.number(names("GRACE_SECONDS"), 10.0, minimum=0.0),
            drain_seconds=env.number(names("DRAIN_SECONDS"), 0.5, minimum=0.0),
            keepalive_seconds=env.integer(names("KEEPALIVE_SECONDS"), 30, minimum=1),
            max_concurrent_rpcs=env.integer(names("MAX_CONCURRENT_RPCS"), 256, minimum=1),
            tracing=TracingSettings.from_env(env),
        )


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


def downstream(
    env: Env,
    names: Sequence[str],
    default_target: str,
    timeout_names: Sequence[str],
    timeout: float,
) -> DownstreamSettings:
    """A DownstreamSettings from the first of `names` (a URL or host:port) and a timeout."""
    found = env.raw(names)
    target = grpc_target(found[1], found[0]) if found else default_target
    return DownstreamSettings(
        target=target,
        timeout_seconds=env.number(timeout_names, timeout, minimum=0.001),
        retry_attempts=env.integer(["VISIOR_RETRY_ATTEMPTS"], 3, minimum=1, maximum=5),
    )
