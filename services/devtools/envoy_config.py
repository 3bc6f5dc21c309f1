"""Renders the Envoy config: one JSON listener (sidecar) per service, transcoded to its gRPC server.

Run as `python -m services.devtools.envoy_config` to print the config for the default
ports; `tools/gen.sh` writes that to `envoy/envoy.yaml` (run Envoy from the repo root:
the descriptor path in it is relative). Why each piece is there is said next to it
below, since YAML written by pyyaml cannot carry comments; envoy/README.md has the
operator's view (routes, error body, limits, timeouts).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import yaml

from services.common.call_budgets import (
    CALL_BUDGETS,
    DEFAULT_TIMEOUT_S,
    GENERATE,
    GENERATE_STREAM,
    INGEST,
    RESPOND,
    STREAM_IDLE_TIMEOUT_S,
    CallBudget,
)
from services.common.document_limits import MAX_DOC_ID_CHARS
from services.common.shared_config import MAX_REQUEST_METADATA_BYTES, UTF8_MAX_BYTES
from services.common.topology import SERVICE_BY_KEY, SERVICES, Ports, ServiceSpec
from services.llm.engine import GENERATE_MAX_REQUEST_BYTES
from services.orchestrator.respond import RESPOND_MAX_REQUEST_BYTES
from services.retrieval.limits import DEFAULT_MAX_DOCUMENT_BYTES
from services.retrieval.listing import MAX_LISTED_IDS

MiB = 1 << 20

DEFAULT_MAX_REQUEST_BYTES = 1 * MiB
"""Largest JSON request body on every route but those of ROUTE_MAX_REQUEST_BYTES (HTTP 413
above it)."""
INGEST_ENVELOPE_BYTES = 1 * MiB
"""Room an ingestion body leaves for everything but the document (names, tags, metadata)."""
INGEST_MAX_REQUEST_BYTES = 4 * -(-DEFAULT_MAX_DOCUMENT_BYTES // 3) + INGEST_ENVELOPE_BYTES
"""Largest `POST /internal/retrieval/documents` body: Retrieval's largest document
(RETR_MAX_DOCUMENT_BYTES' default) in base64, 4 characters per 3 bytes, plus the envelope;
its proto message then fits Retrieval's gRPC limit (the document plus 1 MiB)."""
MAX_RESPONSE_BYTES = 32 * MiB
"""Largest unary response the transcoder will buffer and turn into JSON."""
HCM_STREAM_IDLE_TIMEOUT_S = 300.0
"""Envoy's default stream idle timeout of the HTTP connection manager (not set here)."""

HTTP_PREFIX: Mapping[str, str] = {
    "orchestrator": "/internal/orchestrator/",
    "llm": "/internal/llm/",
    "retrieval": "/internal/retrieval/",
    "toolsproxy": "/internal/mcp/",
}
"""The `/internal/...` path prefix each service's HTTP bindings live under."""

ENVOY_DEFAULT_HEADERS_KB = 60
"""Envoy's own request-line-and-headers limit, kept for everything but ListDocuments' ids."""
LISTED_ID_QUERY_BYTES = len("&doc_ids=") + MAX_DOC_ID_CHARS * UTF8_MAX_BYTES * len("%XX")
"""One doc_id of ListDocuments' query string at its longest: every character 4 UTF-8 bytes,
each percent-encoded."""
MAX_REQUEST_HEADERS_KB = (
    -(-MAX_LISTED_IDS * LISTED_ID_QUERY_BYTES // 1024) + ENVOY_DEFAULT_HEADERS_KB
)
"""The retrieval listener's request-line-and-headers limit: a GET ListDocuments with its
MAX_LISTED_IDS longest doc_ids of any script, plus Envoy's default for the rest."""
ENVOY_MAX_HEADERS = 100
"""Envoy's default most request headers (max_headers_count, not set here; 431 above it)."""
METADATA_SLACK_BYTES = 8 * 1024
"""What grpc counts of a request's metadata beyond the request line and headers Envoy
measured: 32 bytes an entry for ENVOY_MAX_HEADERS of the caller's and the dozen Envoy adds
(x-request-id, x-forwarded-proto, grpc-timeout, te, content-type, ...) with their names and
values. The URL is not among them: the server's :path is the gRPC method, the transcoder
moves the query string into the message, and each route removes x-envoy-original-path."""


LISTENER_HEADERS_KB: Mapping[str, int] = {"retrieval": MAX_REQUEST_HEADERS_KB}
"""The request-line-and-headers limit of the listeners that do not keep
ENVOY_DEFAULT_HEADERS_KB."""


def upstream_metadata_bytes(headers_kb: int) -> int:
    """The most metadata, as grpc counts it, that a request within `headers_kb` KiB of request
    line and headers brings the gRPC server."""
    return headers_kb * 1024 + METADATA_SLACK_BYTES


def listener_headers_kb(key: str) -> int:
    """The request-line-and-headers limit of service `key`'s listener. ValueError when a request
    within it could bring the server more metadata than the servers take
    (MAX_REQUEST_METADATA_BYTES): Envoy would pass it and grpc refuse it."""
    headers_kb = LISTENER_HEADERS_KB.get(key, ENVOY_DEFAULT_HEADERS_KB)
    if upstream_metadata_bytes(headers_kb) > MAX_REQUEST_METADATA_BYTES:
        raise ValueError(
            f"the {key} listener takes {headers_kb} KiB of request headers, more than the "
            f"servers' {MAX_REQUEST_METADATA_BYTES} bytes of metadata (MAX_REQUEST_METADATA_BYTES)"
        )
    return headers_kb


DEFAULT_ROUTE = "default"
"""Key of `timeouts` for the catch-all route of a service's prefix."""
STREAM_IDLE = "stream_idle"
"""Key of `timeouts` for the idle timeout of the streaming routes (default
STREAM_IDLE_TIMEOUT_S): a slower model stays silent longer between two deltas."""


@dataclass(frozen=True)
class RouteRule:
    """One route with its own timeout or body limit; everything else takes the prefix route."""

    path: str
    """Exact HTTP path (as in the proto's google.api.http binding)."""
    timeout_s: float
    """Overall route timeout; 0 means none (streams), then the idle timeout applies."""
    method: str | None = None
    """Only this HTTP method, when the same path serves several RPCs."""
    max_request_bytes: int | None = None
    """Body limit of this route when it differs from DEFAULT_MAX_REQUEST_BYTES."""


ROUTE_MAX_REQUEST_BYTES: Mapping[CallBudget, int] = {
    RESPOND: RESPOND_MAX_REQUEST_BYTES,
    GENERATE: GENERATE_MAX_REQUEST_BYTES,
    GENERATE_STREAM: GENERATE_MAX_REQUEST_BYTES,
    INGEST: INGEST_MAX_REQUEST_BYTES,
}
"""The body limit of each call budget's route that has its own; the others take
DEFAULT_MAX_REQUEST_BYTES. Respond's and Generate's are their services' (next to the validators
whose limits they hold), which are also those services' default gRPC message limits."""


def _rule(budget: CallBudget) -> RouteRule:
    """The route of one call budget (services.common.call_budgets), with its timeout and
    body limit."""
    return RouteRule(
        budget.http_path,
        budget.timeout_s,
        method=budget.http_method,
        max_request_bytes=ROUTE_MAX_REQUEST_BYTES.get(budget),
    )


# One rule per call budget, so a route's timeout is the budget the typed client gives the
# same RPC; every other `/internal/...` route gets DEFAULT_TIMEOUT_S. Order matters only
# between rules of one path (method-specific first, as CALL_BUDGETS lists them): Envoy
# takes the first route that matches, and the prefix route comes after all of these.
ROUTE_RULES: tuple[RouteRule, ...] = tuple(_rule(budget) for budget in CALL_BUDGETS)

ACCESS_LOG_METADATA = "visior.request"
"""Dynamic-metadata namespace where the Lua filter keeps the caller's own method and path."""

_LUA = f"""\
-- Runs first on every request, before the transcoder rewrites it into a gRPC call.
function envoy_on_request(handle)
  local headers = handle:headers()
  -- The caller's own verb and route for the access log: the transcoder turns them into
  -- POST /pkg.Service/Method, and the route removes the x-envoy-original-path it keeps.
  local meta = handle:streamInfo():dynamicMetadata()
  meta:set("{ACCESS_LOG_METADATA}", "method", headers:get(":method"))
  meta:set("{ACCESS_LOG_METADATA}", "path", headers:get(":path"))
  -- gRPC's own headers (grpc-timeout, grpc-encoding, ...) and binary metadata (*-bin, which
  -- must be base64) are parsed by the server's gRPC library, and a bad one fails the call
  -- with a bare INTERNAL. A JSON caller has no use for either; grpc-timeout is the route's
  -- own, added after this. So is a name with a character HTTP allows but a gRPC metadata
  -- key does not (+ | ~ ...: "Illegal header key"); names arrive lowercased. Pseudo-headers
  -- (:path, :method, ...) stay.
  local drop = {{}}
  for name, _ in pairs(headers) do
    if name:sub(1, 5) == "grpc-" or name:sub(-4) == "-bin"
        or (name:byte(1) ~= 58 and name:find("[^a-z0-9._%-]")) then
      drop[#drop + 1] = name
    end
  end
  for _, name in ipairs(drop) do
    headers:remove(name)
  end
end

-- The transcoder maps gRPC UNAVAILABLE to HTTP 503; the specs want 502 for a failed
-- downstream. Only the status changes: the google.rpc.Status JSON body stays.
function envoy_on_response(handle)
  if handle:headers():get(":status") == "503" then
    handle:headers():replace(":status", "502")
  end
end
"""

# Envoy's own replies (no route, body too large, upstream down, timeout, fault abort,
# transcoder rejections) get the same body as a transcoded google.rpc.Status, so a
# client parses one error shape. HTTP status -> (google.rpc.Code, ErrorInfo.reason).
_LOCAL_REPLY_CODES: tuple[tuple[int, int, int, str], ...] = (
    # (status Envoy produced, status sent, grpc code, reason)
    # The fault filter's x-envoy-fault-abort-grpc-request aborts a JSON request with a
    # local reply of HTTP 200; only a gRPC caller could read the status in it. Say so.
    (200, 400, 3, "GRPC_FAULT_ABORT_UNSUPPORTED"),
    (400, 400, 3, "INVALID_ARGUMENT"),
    (401, 401, 16, "UNAUTHENTICATED"),
    (403, 403, 7, "ACCESS_DENIED"),
    (404, 404, 5, "NOT_FOUND"),
    (408, 408, 4, "DEADLINE_EXCEEDED"),
    (413, 413, 3, "PAYLOAD_TOO_LARGE"),
    (429, 429, 8, "RATE_LIMIT_EXCEEDED"),
    (431, 431, 3, "HEADERS_TOO_LARGE"),
    (500, 500, 13, "INTERNAL"),
    (501, 501, 12, "UNIMPLEMENTED"),
    (502, 502, 14, "UPSTREAM_UNAVAILABLE"),
    # Envoy says 503 for connect failure, reset, overflow and fault aborts: for the
    # caller all are "the service behind this sidecar failed", which the specs call 502.
    (503, 502, 14, "UPSTREAM_UNAVAILABLE"),
    (504, 504, 4, "DEADLINE_EXCEEDED"),
)


def _type(name: str) -> str:
    return f"type.googleapis.com/{name}"


def _status_body(code: int, reason: str) -> dict[str, Any]:
    """A google.rpc.Status JSON (one ErrorInfo) filled from Envoy's command operators."""
    return {
        "code": code,
        "message": "%LOCAL_REPLY_BODY%",
        "details": [
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": reason,
                "domain": "envoy",
                "metadata": {
                    "response_code_details": "%RESPONSE_CODE_DETAILS%",
                    "response_flags": "%RESPONSE_FLAGS%",
                    "request_id": "%REQ(X-REQUEST-ID)%",
                },
            }
        ],
    }


GRPC_REFUSED_STATUS = 418
"""The direct response of _grpc_route, turned into 404 / UNIMPLEMENTED by _local_reply_config."""


def _status_is(status: int) -> dict[str, Any]:
    """A local-reply mapper filter matching the HTTP status Envoy produced."""
    return {
        "status_code_filter": {
            "comparison": {
                "op": "EQ",
                "value": {"default_value": status, "runtime_key": f"visior.local_reply.{status}"},
            }
        }
    }


def _local_reply_config() -> dict[str, Any]:
    mappers = [
        {
            "filter": _status_is(produced),
            **({"status_code": sent} if sent != produced else {}),
            "body_format_override": {"json_format": _status_body(code, reason)},
        }
        for produced, sent, code, reason in _LOCAL_REPLY_CODES
    ]
    # _grpc_route's refusal of a gRPC call. Envoy answers a gRPC request's local reply in
    # gRPC (trailers-only, grpc-message = the body) and maps 404 to UNIMPLEMENTED (no such
    # method here; not retried, unlike UNAVAILABLE). The route answers GRPC_REFUSED_STATUS,
    # which nothing else sends, so this mapper tells it apart without reading request
    # headers (the transcoder has rewritten those by now), and sends it on as a 404 with
    # the plain message: a JSON document in grpc-message helps nobody.
    grpc_refusal = {
        "filter": _status_is(GRPC_REFUSED_STATUS),
        "status_code": 404,
        "body_format_override": {"text_format": "%LOCAL_REPLY_BODY%"},
    }
    # Anything not listed still answers JSON in the same shape.
    return {
        "mappers": [grpc_refusal, *mappers],
        "body_format": {"json_format": _status_body(2, "UNKNOWN")},
    }


GRPC_TIMEOUT_MARGIN_S = 0.25
"""How much longer the server's deadline is than Envoy's route timeout."""


def _seconds(value: float) -> str:
    return f"{value:g}s"


def _grpc_timeout(value: float) -> str:
    # grpc-timeout is at most 8 digits plus a unit; milliseconds cover 27 hours.
    return f"{round(value * 1000)}m"


def _route(
    spec: ServiceSpec,
    *,
    prefix: str | None = None,
    rule: RouteRule | None = None,
    timeout_s: float,
    stream_idle_s: float = STREAM_IDLE_TIMEOUT_S,
    fault_injection: bool = False,
) -> dict[str, Any]:
    match: dict[str, Any] = {"prefix": prefix} if rule is None else {"path": rule.path}
    if rule is not None and rule.method:
        match["headers"] = [{"name": ":method", "string_match": {"exact": rule.method}}]
    action: dict[str, Any] = {"cluster": _cluster_name(spec), "timeout": _seconds(timeout_s)}
    if timeout_s == 0:
        action["idle_timeout"] = _seconds(stream_idle_s)
    elif timeout_s > HCM_STREAM_IDLE_TIMEOUT_S:
        # A unary answer sends nothing until it is done: past the connection manager's
        # stream idle timeout (Envoy's 300 s) a slow answer (a CPU model's) would be cut
        # off with 504 before its route timeout; the route's own idle timeout matches it.
        action["idle_timeout"] = _seconds(timeout_s)
    elif fault_injection:
        # An injected delay runs before the router, so the route timeout (which starts when
        # the router gets the request) would never see it. The stream's whole duration
        # does: a request delayed past its route's budget is a 504 DEADLINE_EXCEEDED, as if
        # the service itself were that slow. With max_stream_duration set Envoy ignores the
        # route `timeout` (its "new timeouts"), so this is the route's one budget here;
        # a slow server also gets 504, with details max_duration_timeout instead of UT.
        action["max_stream_duration"] = {"max_stream_duration": _seconds(timeout_s)}
    # No retry_policy: Envoy retries nothing unless told to, and these POSTs are not
    # idempotent. Callers retry UNAVAILABLE themselves (STYLE: retry only UNAVAILABLE).
    route: dict[str, Any] = {
        "name": f"{spec.key}:{rule.method or ''}{rule.path}" if rule else f"{spec.key}:{prefix}",
        "match": match,
        "route": action,
        # The transcoder keeps the JSON request's whole URL in this header, and gRPC would
        # carry it as metadata: a GET with a long query string (ListDocuments' doc_ids)
        # passed grpc's 8 KiB metadata soft limit and came back 429 RESOURCE_EXHAUSTED.
        # Nothing upstream reads it; the access log has the path.
        "request_headers_to_remove": ["x-envoy-original-path"],
    }
    if timeout_s > 0:
        # JSON callers send no gRPC deadline; give the server Envoy's own budget so its
        # `time_remaining()` and the deadlines it passes on are real (STYLE: Errors). A
        # little more than the route timeout, so Envoy's timer always fires first and the
        # caller gets Envoy's 504 JSON (with ErrorInfo), never a race with the server's.
        route["request_headers_to_add"] = [
            {
                "header": {
                    "key": "grpc-timeout",
                    "value": _grpc_timeout(timeout_s + GRPC_TIMEOUT_MARGIN_S),
                },
                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
            }
        ]
    if rule is not None and rule.max_request_bytes is not None:
        route["typed_per_filter_config"] = {
            "envoy.filters.http.buffer": {
                "@type": _type("envoy.extensions.filters.http.buffer.v3.BufferPerRoute"),
                "buffer": {"max_request_bytes": rule.max_request_bytes},
            }
        }
    return route


def _grpc_route(spec: ServiceSpec, grpc_port: int) -> dict[str, Any]:
    """Refuses gRPC on this JSON listener, before any other route.

    The transcoder passes a gRPC request (content-type application/grpc or
    application/grpc+...) through untouched. Routed on, a JSON body sent with that type
    came back as the server's stream reset, which a caller reads as UNAVAILABLE and
    retries as an outage; a gRPC-framed message came back UNIMPLEMENTED, naming nothing.
    Here both get UNIMPLEMENTED with a message naming the service's gRPC port. Other
    types are not looked at (the transcoder reads any non-gRPC body as JSON).
    """
    return {
        "name": f"{spec.key}:grpc-on-json-listener",
        "match": {
            "prefix": "/",
            "headers": [
                {
                    "name": "content-type",
                    # What Envoy itself takes for gRPC (case-sensitive, as Envoy reads it).
                    "string_match": {"safe_regex": {"regex": r"application/grpc(\+.*)?"}},
                }
            ],
        },
        # Refused on its headers: without this the buffer filter read the whole body first,
        # and one over its limit got 413 (gRPC UNKNOWN with a JSON document) instead.
        "typed_per_filter_config": {
            "envoy.filters.http.buffer": {
                "@type": _type("envoy.extensions.filters.http.buffer.v3.BufferPerRoute"),
                "disabled": True,
            }
        },
        "direct_response": {
            "status": GRPC_REFUSED_STATUS,
            "body": {
                "inline_string": (
                    "this listener takes JSON (content-type application/json); gRPC goes "
                    f"to the service's own port {grpc_port} ({', '.join(spec.grpc_services)})"
                )
            },
        },
    }


def _cluster_name(spec: ServiceSpec) -> str:
    return f"{spec.key}_grpc"


def _rules_for(spec: ServiceSpec, timeouts: Mapping[str, float]) -> list[RouteRule]:
    prefix = HTTP_PREFIX[spec.key]
    rules = [r for r in ROUTE_RULES if r.path == "/health" or r.path.startswith(prefix)]
    known = {r.path for r in rules}
    rules = [replace(r, timeout_s=timeouts[r.path]) if r.path in timeouts else r for r in rules]
    # An override for a path without its own rule gets one (tests shorten one route).
    extra = sorted(p for p in timeouts if p not in known and p.startswith(prefix))
    rules.extend(RouteRule(p, timeouts[p]) for p in extra)
    return rules


def route_timeout(
    path: str, method: str = "POST", timeouts: Mapping[str, float] | None = None
) -> float:
    """Envoy's overall timeout in seconds for a `method` request to `path` under `render`'s
    config with `timeouts`, as `_rules_for` builds the routes: the path's rule for that
    method (its override, else its own timeout); for a path with no rule at all, an override
    of it (a rule for every method); else the prefix route's (`"default"` override or
    DEFAULT_TIMEOUT_S). 0 means none (a stream)."""
    overrides = timeouts or {}
    rules = [r for r in ROUTE_RULES if r.path == path]
    rule = next((r for r in rules if r.method in (None, method.upper())), None)
    if rule is not None:
        return overrides.get(path, rule.timeout_s)
    if not rules and path in overrides:
        return overrides[path]
    return overrides.get(DEFAULT_ROUTE, DEFAULT_TIMEOUT_S)


def longest_route_timeout(key: str) -> float:
    """The longest overall route timeout of service `key`'s listener in seconds (streams, which
    have none, left out): how long a JSON call in flight may still take."""
    return max([DEFAULT_TIMEOUT_S] + [r.timeout_s for r in _rules_for(SERVICE_BY_KEY[key], {})])


def largest_request_bytes(key: str) -> int:
    """The largest request body service `key`'s listener takes (its routes' buffer limits)."""
    rules = _rules_for(SERVICE_BY_KEY[key], {})
    return max([DEFAULT_MAX_REQUEST_BYTES] + [r.max_request_bytes or 0 for r in rules])


ENVOY_IDLE_BYTES = 96 * MiB
"""What an idle sidecar holds, with room: 68 MB RSS measured (Envoy 1.40, one listener and the
descriptor set)."""
ENVOY_BYTES_PER_BODY_BYTE = 5
"""Peak sidecar memory per byte of a request body in flight, with room: the buffer filter's
copy, the transcoder's, the proto message and the frames to the server. Measured (Envoy 1.40,
the retrieval sidecar's config): a 45.8 MB ingestion body took it from 68 MB to 284 MB RSS, two
at once to 472 MB, four to 834 MB (4.1 to 4.7 bytes a body byte); a 12.6 MB Generate body of
escaped text took 32 MB."""
LARGEST_BODIES_HELD = 2
"""How many of its largest requests at once a sidecar holds before its heap limit makes it
refuse new requests (render's `max_heap_bytes`)."""
HEAP_STOP_ACCEPTING = 0.95
"""Share of `max_heap_bytes` in use at which Envoy answers new requests 503 "envoy overloaded"
(a 502 UPSTREAM_UNAVAILABLE to the caller, who retries it like any UNAVAILABLE)."""
HEAP_SHRINK = 0.9
"""Share of `max_heap_bytes` in use at which Envoy hands its free heap back to the system."""


def heap_floor_bytes(key: str) -> int:
    """The least heap limit for service `key`'s sidecar: idle, plus LARGEST_BODIES_HELD of its
    largest request bodies in flight, below HEAP_STOP_ACCEPTING."""
    held = LARGEST_BODIES_HELD * ENVOY_BYTES_PER_BODY_BYTE * largest_request_bytes(key)
    return math.ceil((ENVOY_IDLE_BYTES + held) / HEAP_STOP_ACCEPTING)


def _routes(
    spec: ServiceSpec,
    ports: Ports,
    rules: list[RouteRule],
    *,
    fault_injection: bool,
    timeouts: Mapping[str, float],
) -> list[dict[str, Any]]:
    routes = [_grpc_route(spec, ports.grpc[spec.key])]
    idle = timeouts.get(STREAM_IDLE, STREAM_IDLE_TIMEOUT_S)
    routes += [
        _route(
            spec, rule=r, timeout_s=r.timeout_s, stream_idle_s=idle, fault_injection=fault_injection
        )
        for r in rules
    ]
    routes.append(
        _route(
            spec,
            prefix=HTTP_PREFIX[spec.key],
            timeout_s=timeouts.get(DEFAULT_ROUTE, DEFAULT_TIMEOUT_S),
            fault_injection=fault_injection,
        )
    )
    # Nothing else is routed: an unknown path is a 404 (the transcoder answers first for
    # JSON requests; the router's "no route" covers the rest, gRPC included).
    return routes


def _fault_filter() -> dict[str, Any]:
    return {
        "name": "envoy.filters.http.fault",
        "typed_config": {
            "@type": _type("envoy.extensions.filters.http.fault.v3.HTTPFault"),
            "abort": {
                "header_abort": {},
                "percentage": {"numerator": 100, "denominator": "HUNDRED"},
            },
            "delay": {
                "header_delay": {},
                "percentage": {"numerator": 100, "denominator": "HUNDRED"},
            },
            "max_active_faults": 1000,
        },
    }


def _transcoder_filter(spec: ServiceSpec, descriptor_path: str, max_body: int) -> dict[str, Any]:
    return {
        "name": "envoy.filters.http.grpc_json_transcoder",
        "typed_config": {
            "@type": _type(
                "envoy.extensions.filters.http.grpc_json_transcoder.v3.GrpcJsonTranscoder"
            ),
            "proto_descriptor": descriptor_path,
            "services": list(spec.grpc_services),
            # Routes match the incoming /internal/... path, not the rewritten
            # /pkg.Service/Method one, so per-route timeouts and limits apply.
            "match_incoming_request_route": True,
            "auto_mapping": False,
            "convert_grpc_status": True,
            "print_options": {
                "add_whitespace": False,
                "preserve_proto_field_names": True,
                "always_print_primitive_fields": True,
                "always_print_enums_as_ints": False,
            },
            "request_validation_options": {
                # Unknown path or method: 404 here instead of passing a JSON request on.
                "reject_unknown_method": True,
                # A misspelt query parameter is a 400, not silently dropped.
                "reject_unknown_query_parameters": True,
            },
            # The transcoder holds a whole message; without these it would stop at
            # the connection buffer limit (1 MiB) below the routes' own body limits.
            "max_request_body_size": max_body,
            "max_response_body_size": MAX_RESPONSE_BYTES,
        },
    }


def _http_filters(
    spec: ServiceSpec, descriptor_path: str, rules: list[RouteRule], *, fault_injection: bool
) -> list[dict[str, Any]]:
    max_body = max([DEFAULT_MAX_REQUEST_BYTES] + [r.max_request_bytes or 0 for r in rules])
    http_filters: list[dict[str, Any]] = [
        # First, so it sees the caller's request before the transcoder rewrites it; encoding
        # runs the chain backwards, so it also sees the transcoder's output (503 from
        # UNAVAILABLE) and rewrites it to 502.
        {
            "name": "envoy.filters.http.lua",
            "typed_config": {
                "@type": _type("envoy.extensions.filters.http.lua.v3.Lua"),
                "default_source_code": {"inline_string": _LUA},
            },
        },
    ]
    if fault_injection:
        # Header-controlled faults, for fault tests only (off by default: any caller that
        # reaches the listener could abort or delay requests): x-envoy-fault-abort-request:
        # <http status>, x-envoy-fault-delay-request: <ms>. The abort is a local reply, so
        # it gets the JSON error body from local_reply_config (503 -> 502 like a real
        # outage). Before the buffer filter, so an abort does not wait for the body.
        http_filters.append(_fault_filter())
    http_filters += [
        # Reads the whole body and answers 413 past the limit, before any transcoding
        # work; the routes of ROUTE_MAX_REQUEST_BYTES raise the limit per route.
        {
            "name": "envoy.filters.http.buffer",
            "typed_config": {
                "@type": _type("envoy.extensions.filters.http.buffer.v3.Buffer"),
                "max_request_bytes": DEFAULT_MAX_REQUEST_BYTES,
            },
        },
        _transcoder_filter(spec, descriptor_path, max_body),
        {
            "name": "envoy.filters.http.router",
            "typed_config": {"@type": _type("envoy.extensions.filters.http.router.v3.Router")},
        },
    ]
    return http_filters


def _connection_manager(
    spec: ServiceSpec, routes: list[dict[str, Any]], http_filters: list[dict[str, Any]]
) -> dict[str, Any]:
    headers_kb = listener_headers_kb(spec.key)
    return {
        "@type": _type(
            "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
        ),
        "stat_prefix": spec.key,
        "codec_type": "AUTO",
        # Every request gets an x-request-id (echoed in the response); a caller's own id is
        # kept, not replaced.
        # Other headers (x-trace-id included) reach the server as gRPC metadata as-is, but
        # for grpc-*, *-bin and names that are not valid gRPC metadata keys (the Lua filter's
        # envoy_on_request); the servers take more than the listener lets through
        # (upstream_metadata_bytes).
        "generate_request_id": True,
        "preserve_external_request_id": True,
        "always_set_request_id_in_response": True,
        "normalize_path": True,
        # Request line and headers: Envoy's default 60 KiB would refuse (431) a ListDocuments
        # GET with its allowed 1,000 doc_ids of up to 128 characters (~140 KB of query string;
        # ~780 KB percent-encoded when the ids are Cyrillic). Other listeners keep the default.
        **(
            {"max_request_headers_kb": headers_kb} if headers_kb != ENVOY_DEFAULT_HEADERS_KB else {}
        ),
        "merge_slashes": True,
        "path_with_escaped_slashes_action": "REJECT_REQUEST",
        "common_http_protocol_options": {"idle_timeout": "300s"},
        "route_config": {
            "name": spec.key,
            "virtual_hosts": [{"name": spec.key, "domains": ["*"], "routes": routes}],
        },
        "local_reply_config": _local_reply_config(),
        "http_filters": http_filters,
    }


def _listener(
    spec: ServiceSpec,
    ports: Ports,
    descriptor_path: str,
    *,
    access_log: bool,
    fault_injection: bool,
    timeouts: Mapping[str, float],
) -> dict[str, Any]:
    rules = _rules_for(spec, timeouts)
    routes = _routes(spec, ports, rules, fault_injection=fault_injection, timeouts=timeouts)
    http_filters = _http_filters(spec, descriptor_path, rules, fault_injection=fault_injection)
    hcm = _connection_manager(spec, routes, http_filters)
    if access_log:
        hcm["access_log"] = [_access_log(spec)]
    return {
        "name": f"{spec.key}_http",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": ports.http[spec.key]}},
        # Flow-control watermark per connection, not a size cap: the buffer filter lifts
        # the limit per stream, so a 32 MiB ingestion body still goes through.
        "per_connection_buffer_limit_bytes": 1 * MiB,
        "filter_chains": [
            {
                "filters": [
                    {
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": hcm,
                    }
                ]
            }
        ],
    }


ACCESS_LOG_PATH_CHARS = 2048
"""Where the access log cuts a path (a ListDocuments query string runs to ~1.5 MB)."""


def _caller(key: str, header: str, max_chars: int | None = None) -> str:
    """An access-log command operator for the caller's own `key` (method or path) as the Lua
    filter kept it, cut at `max_chars`; the request's `header` for a request the filters never
    saw (refused by the connection manager itself: headers too large, a bad request line)."""
    kept = f"metadata.filter_metadata['{ACCESS_LOG_METADATA}']"
    expression = (
        f"'{ACCESS_LOG_METADATA}' in metadata.filter_metadata ? {kept}['{key}'] : "
        f"request.headers['{header}']"
    )
    return f"%CEL({expression})" + (f":{max_chars}%" if max_chars else "%")


def _access_log(spec: ServiceSpec) -> dict[str, Any]:
    return {
        "name": "envoy.access_loggers.stdout",
        "typed_config": {
            "@type": _type("envoy.extensions.access_loggers.stream.v3.StdoutAccessLog"),
            "log_format": {
                "json_format": {
                    "time": "%START_TIME%",
                    "service": spec.key,
                    "method": _caller("method", ":method"),
                    "path": _caller("path", ":path", ACCESS_LOG_PATH_CHARS),
                    "status": "%RESPONSE_CODE%",
                    "flags": "%RESPONSE_FLAGS%",
                    "details": "%RESPONSE_CODE_DETAILS%",
                    "duration_ms": "%DURATION%",
                    "bytes_in": "%BYTES_RECEIVED%",
                    "bytes_out": "%BYTES_SENT%",
                    "request_id": "%REQ(X-REQUEST-ID)%",
                    "trace_id": "%REQ(X-TRACE-ID)%",
                }
            },
        },
    }


def _cluster(spec: ServiceSpec, ports: Ports) -> dict[str, Any]:
    return {
        "name": _cluster_name(spec),
        "type": "STATIC",
        "connect_timeout": "1s",
        "lb_policy": "ROUND_ROBIN",
        "load_assignment": {
            "cluster_name": _cluster_name(spec),
            "endpoints": [
                {
                    "lb_endpoints": [
                        {
                            "endpoint": {
                                "address": {
                                    "socket_address": {
                                        "address": "127.0.0.1",
                                        "port_value": ports.grpc[spec.key],
                                    }
                                }
                            }
                        }
                    ]
                }
            ],
        },
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": _type("envoy.extensions.upstreams.http.v3.HttpProtocolOptions"),
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        # Envoy's defaults (1024) would turn a benchmark burst into 503 overflow.
        "circuit_breakers": {
            "thresholds": [
                {"priority": "DEFAULT", "max_requests": 10000, "max_pending_requests": 10000}
            ]
        },
    }


FIXED_HEAP = "envoy.resource_monitors.fixed_heap"


def _overload_manager(max_heap_bytes: int | None) -> dict[str, Any]:
    # A cap on open downstream connections (Envoy warns at start-up without one).
    monitors: list[dict[str, Any]] = [
        {
            "name": "envoy.resource_monitors.global_downstream_max_connections",
            "typed_config": {
                "@type": _type(
                    "envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig"
                ),
                "max_active_downstream_connections": 10000,
            },
        }
    ]
    if max_heap_bytes is None:
        return {"resource_monitors": monitors}
    # Each request in flight holds several copies of its body (ENVOY_BYTES_PER_BODY_BYTE):
    # without a bound, enough large ones at once would have the container OOM-killed, and
    # every call in flight with it. New requests are refused instead. The admin's /ready
    # stays LIVE (the compose healthcheck); a k8s readiness probe through the listener gets
    # the refusal, so the Pod leaves its Service until calls in flight have finished.
    monitors.append(
        {
            "name": FIXED_HEAP,
            "typed_config": {
                "@type": _type("envoy.extensions.resource_monitors.fixed_heap.v3.FixedHeapConfig"),
                "max_heap_size_bytes": max_heap_bytes,
            },
        }
    )
    actions = [
        {
            "name": f"envoy.overload_actions.{action}",
            "triggers": [{"name": FIXED_HEAP, "threshold": {"value": threshold}}],
        }
        for action, threshold in (
            ("shrink_heap", HEAP_SHRINK),
            ("stop_accepting_requests", HEAP_STOP_ACCEPTING),
        )
    ]
    # Read the heap every 0.25 s (Envoy's default is 1 s): a large body arrives faster.
    return {"refresh_interval": "0.25s", "resource_monitors": monitors, "actions": actions}


def render(
    ports: Ports,
    descriptor_path: str,
    *,
    access_log: bool = False,
    timeouts: Mapping[str, float] | None = None,
    fault_injection: bool = False,
    max_heap_bytes: int | None = None,
) -> str:
    """Envoy YAML for one mesh instance: a listener per service on `ports.http[key]`.

    `descriptor_path` is written as given (Envoy resolves a relative one against its
    working directory). `timeouts` overrides route timeouts in seconds by exact HTTP path
    (or `"default"` for a service's other routes, `"stream_idle"` for the streaming routes'
    idle timeout); a path without a rule gets one.
    `fault_injection` adds Envoy's fault filter driven by the callers' request headers
    (`x-envoy-fault-abort-request`, `x-envoy-fault-delay-request`): for fault tests only,
    never where callers are not trusted; the committed envoy/envoy.yaml, `visior run` and
    deploy/ leave it out.
    `max_heap_bytes` bounds Envoy's heap (a sidecar's, below its container's memory limit):
    past HEAP_SHRINK of it Envoy returns free memory to the system, past HEAP_STOP_ACCEPTING
    it answers new requests 503 until enough in-flight ones are done.
    """
    merged = dict(timeouts or {})
    config = {
        "admin": {
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": ports.envoy_admin}}
        },
        "static_resources": {
            "listeners": [
                _listener(
                    spec,
                    ports,
                    descriptor_path,
                    access_log=access_log,
                    fault_injection=fault_injection,
                    timeouts=merged,
                )
                for spec in SERVICES
            ],
            "clusters": [_cluster(spec, ports) for spec in SERVICES],
        },
        "overload_manager": _overload_manager(max_heap_bytes),
    }
    return yaml.safe_dump(config, sort_keys=False, default_flow_style=False, width=100)


def main() -> None:
    print(render(Ports(), "envoy/visior.pb"), end="")


if __name__ == "__main__":
    main()
