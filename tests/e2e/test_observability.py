"""Observability of the real mesh: every service's /metrics, and one trace id through the logs.

The metrics test scrapes each service's Prometheus endpoint (the Mesh's Ports.metrics)
before and after real traffic through Envoy and checks the spec's metric names and types
(llm-service.md §10.4, retrieval.md §7.4, retrieval-v1.md) plus the go-grpc-prometheus
style RPC metrics. The log test follows one Respond (Retrieval, LLM, ToolsProxy) through
every service's log: every line written while it ran carries its trace id.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.common.metrics import LATENCY_BUCKETS_SECONDS
from services.common.tracing import otel_trace_id
from services.devtools.mesh import Mesh
from tests.e2e.conftest import (
    GRPC_SERVICE,
    LDAP_QUESTION,
    SAMPLES,
    SERVICE_KEYS,
    TENANT,
    MeshFactory,
    ingest,
    log_lines,
    wait_for,
)
from tests.fakes.otlp_collector import OtlpCollector, ReceivedSpan

pytestmark = pytest.mark.e2e

TIMEOUT = 60.0
USER = {"user_id": "e2e-observer", "tenant_id": TENANT}
RESPOND = {"query": LDAP_QUESTION, "user": USER}

SPEC_METRICS: dict[str, dict[str, str]] = {
    "orchestrator": {},  # orchestrator.md §6: logs only; agent.md §9 names none
    "llm": {  # llm-service.md §10.4
        "llm_requests_total": "counter",
        "llm_latency_ms": "histogram",
        "llm_tool_call_count": "counter",
        "llm_token_usage": "counter",
        "llm_mcp_errors_total": "counter",
    },
    "retrieval": {  # retrieval.md §7.4, then retrieval-v1.md
        "retrieval_requests_total": "counter",
        "retrieval_latency_ms": "histogram",
        "retrieval_mode_count": "counter",
        "retrieval_hybrid_usage_total": "counter",
        "retrieval_rerank_usage_total": "counter",
        "retrieval_empty_results_total": "counter",
        "retrieval_hits_total": "counter",
        "retrieval_errors_total": "counter",
        "backend_unavailable_total": "counter",
    },
    "toolsproxy": {},  # no spec names any; visior_tool_* are the proxy's own
}
RPC_METRICS = {
    "grpc_server_started_total": "counter",
    "grpc_server_handled_total": "counter",
    "grpc_server_handling_seconds": "histogram",
}
CLIENT_METRICS = {
    "grpc_client_started_total": "counter",
    "grpc_client_handled_total": "counter",
    "grpc_client_handling_seconds": "histogram",
}
# The calls each service makes for one Respond (retrieval calls nobody).
CLIENT_HOPS = {
    "orchestrator": [("retrieval", "Search"), ("llm", "Generate")],
    "llm": [("toolsproxy", "Execute")],
    "toolsproxy": [],
    "retrieval": [],
}
# The RPC each service serves for one Respond, and a request each refuses (HTTP 400).
RESPOND_METHODS = {
    "orchestrator": "Respond",
    "llm": "Generate",
    "retrieval": "Search",
    "toolsproxy": "Execute",
}
INVALID: dict[str, tuple[str, dict[str, Any]]] = {
    "orchestrator": ("/internal/orchestrator/respond", {"query": "", "user": USER}),
    "llm": ("/internal/llm/generate", {"messages": []}),
    "retrieval": ("/internal/retrieval/search", {"query": "", "tenant_id": TENANT}),
    "toolsproxy": ("/internal/mcp/execute", {"tool_name": "", "arguments": {}, "user": USER}),
}
CODE_NAMES = {c.value[0]: c.name for c in grpc.StatusCode}


def post(mesh: Mesh, key: str, path: str, body: Any, **kw: Any) -> httpx.Response:
    return httpx.post(f"{mesh.json_url(key)}{path}", json=body, timeout=TIMEOUT, **kw)


def respond(mesh: Mesh, body: dict[str, Any], **kw: Any) -> httpx.Response:
    return post(mesh, "orchestrator", "/internal/orchestrator/respond", body, **kw)


class Scrape:
    """One scrape of a /metrics endpoint: families by name, and sample lookups."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}

    def value(self, sample: str, **labels: str) -> float:
        """The sum of `sample` over series whose labels include `labels` (0 when none)."""
        total = 0.0
        for family in self.families.values():
            for s in family.samples:
                if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                    total += s.value
        return total

    def type_of(self, name: str) -> str | None:
        """The type of the metric `name` as exposed (counters keep their _total)."""
        family = self.families.get(name.removesuffix("_total"))
        if family is None:
            return None
        if family.type == "counter" and f"# TYPE {name.removesuffix('_total')}_total counter" in (
            self.text
        ):
            return "counter"
        return family.type


def scrape(mesh: Mesh, key: str) -> Scrape:
    url = f"http://127.0.0.1:{mesh.ports.metrics[key]}/metrics"
    with urllib.request.urlopen(url, timeout=TIMEOUT) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain"), r.headers["Content-Type"]
        return Scrape(r.read().decode())


def scrape_all(mesh: Mesh) -> dict[str, Scrape]:
    return {key: scrape(mesh, key) for key in SERVICE_KEYS}


def rpc_labels(key: str, method: str) -> dict[str, str]:
    return {"grpc_service": GRPC_SERVICE[key], "grpc_method": method, "grpc_type": "unary"}


def test_every_service_exposes_the_spec_and_rpc_metrics(mesh: Mesh) -> None:
    before = scrape_all(mesh)
    r = respond(mesh, RESPOND)
    assert r.status_code == 200, r.text
    refused: dict[str, str] = {}
    for key, (path, body) in INVALID.items():
        bad = post(mesh, key, path, body)
        assert bad.status_code == 400, bad.text
        refused[key] = CODE_NAMES[bad.json()["code"]]
    after = scrape_all(mesh)

    for key in SERVICE_KEYS:
        m, m0 = after[key], before[key]
        expected = {**SPEC_METRICS[key], **RPC_METRICS}
        if key != "retrieval":
            expected |= CLIENT_METRICS
        for name, kind in expected.items():
            assert m.type_of(name) == kind, f"{key}: {name} is {m.type_of(name)}, not {kind}"
        labels = rpc_labels(key, RESPOND_METHODS[key])
        handled = "grpc_server_handled_total"
        ok = m.value(handled, **labels, grpc_code="OK") - m0.value(
            handled, **labels, grpc_code="OK"
        )
        assert ok >= 1, f"{key}: no OK {labels['grpc_method']} counted"
        code = refused[key]
        assert code != "OK"
        grew = m.value(handled, **labels, grpc_code=code) - m0.value(
            handled, **labels, grpc_code=code
        )
        assert grew == 1, f"{key}: the refused {labels['grpc_method']} is not counted as {code}"
        # Latency in seconds: the documented buckets, and this request's time in them.
        family = m.families["grpc_server_handling_seconds"]
        bounds = sorted(
            {
                float(s.labels["le"])
                for s in family.samples
                if s.name.endswith("_bucket") and s.labels["grpc_method"] == labels["grpc_method"]
            }
        )
        assert bounds == [*LATENCY_BUCKETS_SECONDS, float("inf")], bounds
        count = "grpc_server_handling_seconds_count"
        assert m.value(count, **labels) - m0.value(count, **labels) >= 2
        seconds = m.value("grpc_server_handling_seconds_sum", **labels) - m0.value(
            "grpc_server_handling_seconds_sum", **labels
        )
        assert 0 < seconds < TIMEOUT, f"{key}: {seconds} is not a time in seconds"

        for callee, method in CLIENT_HOPS[key]:
            hop = rpc_labels(callee, method)
            calls = m.value("grpc_client_handled_total", **hop, grpc_code="OK") - m0.value(
                "grpc_client_handled_total", **hop, grpc_code="OK"
            )
            assert calls >= 1, f"{key}: its {method} calls to {callee} are not counted"
            timed = m.value("grpc_client_handling_seconds_count", **hop) - m0.value(
                "grpc_client_handling_seconds_count", **hop
            )
            assert timed == calls

    # The spec metrics moved where the Respond went.
    llm, llm0 = after["llm"], before["llm"]
    grew_by = {
        "llm_requests_total": llm.value("llm_requests_total", outcome="ok")
        - llm0.value("llm_requests_total", outcome="ok"),
        "llm_latency_ms": llm.value("llm_latency_ms_count") - llm0.value("llm_latency_ms_count"),
        "llm_tool_call_count": llm.value("llm_tool_call_count_total")
        - llm0.value("llm_tool_call_count_total"),
        "llm_token_usage": llm.value("llm_token_usage_total", kind="prompt")
        - llm0.value("llm_token_usage_total", kind="prompt"),
    }
    ret, ret0 = after["retrieval"], before["retrieval"]
    grew_by["retrieval_requests_total"] = ret.value(
        "retrieval_requests_total", outcome="ok"
    ) - ret0.value("retrieval_requests_total", outcome="ok")
    for name in ("retrieval_mode_count_total", "retrieval_hits_total"):
        grew_by[name] = ret.value(name) - ret0.value(name)
    grew_by["retrieval_latency_ms"] = ret.value("retrieval_latency_ms_count") - ret0.value(
        "retrieval_latency_ms_count"
    )
    assert all(v >= 1 for v in grew_by.values()), grew_by


# --- one trace id through every hop's log -----------------------------------------------


def _log_sizes(mesh: Mesh) -> dict[str, int]:
    return {k: mesh.log_path(k).stat().st_size for k in SERVICE_KEYS}


def _wait_quiet(mesh: Mesh, quiet: float = 0.3, timeout: float = 10.0) -> None:
    """Wait until no service has written a log line for `quiet` seconds."""
    deadline = time.monotonic() + timeout
    sizes = _log_sizes(mesh)
    still_since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = _log_sizes(mesh)
        if now != sizes:
            sizes, still_since = now, time.monotonic()
        elif time.monotonic() - still_since >= quiet:
            return


def _lines_since(mesh: Mesh, key: str, offset: int) -> list[str]:
    with mesh.log_path(key).open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace").splitlines()


def _entries(lines: Iterable[str]) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            entry = {"not_json": line}
        out.append(entry if isinstance(entry, dict) else {"not_json": line})
    return out


def _follow_one_respond(mesh: Mesh, trace: str, **kw: Any) -> dict[str, list[dict[str, Any]]]:
    """Send one Respond while nothing else runs; every log line written meanwhile, by service."""
    _wait_quiet(mesh)
    offsets = _log_sizes(mesh)
    r = respond(mesh, kw.pop("body", {**RESPOND, "trace_id": trace}), **kw)
    assert r.status_code == 200, r.text
    assert r.json()["telemetry"]["trace_id"] == trace

    def rpc_logged(key: str) -> bool:
        method = f"{GRPC_SERVICE[key]}/{RESPOND_METHODS[key]}"
        return any(
            e.get("method") == method for e in _entries(_lines_since(mesh, key, offsets[key]))
        )

    for key in SERVICE_KEYS:
        assert wait_for(lambda k=key: rpc_logged(k), timeout=10), f"{key} logged no rpc line"
    _wait_quiet(mesh)
    return {k: _entries(_lines_since(mesh, k, offsets[k])) for k in SERVICE_KEYS}


BACKGROUND_METHODS = ("visior.toolsproxy.v1.ToolsProxyService/ListTools",)
"""RPCs no request makes: the LLM service refreshes ToolsProxy's catalogue every minute on
its own (services/llm/tools_client.py), under its own trace, and one can fall inside the
window a test follows."""


def _assert_one_trace(logs: dict[str, list[dict[str, Any]]], trace: str) -> None:
    for key, entries in logs.items():
        assert entries, f"{key} logged nothing for {trace}"
        strays = [
            e
            for e in entries
            if e.get("trace_id") != trace and e.get("method") not in BACKGROUND_METHODS
        ]
        assert not strays, f"{key} lines without trace_id {trace}: {strays}"
        assert all(e["service"] == key for e in entries), entries
        method = f"{GRPC_SERVICE[key]}/{RESPOND_METHODS[key]}"
        rpc = [e for e in entries if e.get("method") == method]
        assert rpc and all(e["code"] == "OK" for e in rpc), rpc


def test_one_trace_id_in_every_log_line_of_every_hop(mesh: Mesh) -> None:
    trace = f"e2e-{uuid.uuid4().hex}"
    logs = _follow_one_respond(mesh, trace)
    _assert_one_trace(logs, trace)
    # The hops did their work under it: the scenario, the tool loop, the tool call.
    msgs = {k: {e.get("msg") for e in v} for k, v in logs.items()}
    assert "scenario_decision" in msgs["orchestrator"], msgs
    assert "tool_call" in msgs["toolsproxy"], msgs
    assert "generate" in msgs["llm"], msgs
    respond_lines = [e for e in logs["orchestrator"] if e.get("method", "").endswith("/Respond")]
    assert len(respond_lines) == 1, respond_lines


def test_a_w3c_traceparent_header_names_the_request_in_every_hop(mesh: Mesh) -> None:
    trace = uuid.uuid4().hex
    logs = _follow_one_respond(
        mesh,
        trace,
        body=RESPOND,
        headers={"traceparent": f"00-{trace}-00f067aa0ba902b7-01"},
    )
    _assert_one_trace(logs, trace)


# --- OpenTelemetry spans across the real processes (opt-in) -----------------------------


def _spans(mesh: Mesh, key: str) -> list[dict[str, Any]]:
    return [e for e in log_lines(mesh, key) if "context" in e and "kind" in e]


def test_opt_in_tracing_makes_one_trace_of_a_respond_across_every_hop(
    make_mesh: MeshFactory,
) -> None:
    m = make_mesh({"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "50"})
    guide = SAMPLES / "orion-x-admin-guide.md"
    ingest(m, TENANT, guide.name, guide.read_bytes())
    trace = f"e2e-{uuid.uuid4().hex}"
    caller_span = "00f067aa0ba902b7"
    otel_id = otel_trace_id(trace)
    r = respond(
        m,
        {**RESPOND, "trace_id": trace},
        headers={"traceparent": f"00-{otel_id:032x}-{caller_span}-01"},
    )
    assert r.status_code == 200, r.text

    def served(key: str) -> list[dict[str, Any]]:
        name = f"{GRPC_SERVICE[key]}/{RESPOND_METHODS[key]}"
        return [s for s in _spans(m, key) if s["name"] == name]

    for key in SERVICE_KEYS:
        assert wait_for(lambda k=key: bool(served(k)), timeout=15), f"{key}: no span exported"
    spans = {key: served(key) for key in SERVICE_KEYS}
    for key, found in spans.items():
        for span in found:
            assert span["context"]["trace_id"] == f"0x{otel_id:032x}", span
            assert span["kind"] == "SpanKind.SERVER"
            assert span["attributes"]["visior.trace_id"] == trace
            assert span["attributes"]["rpc.grpc.status_code"] == 0
            assert span["resource"]["attributes"]["service.name"] == f"visior-{key}"
    # The caller's span -> Respond -> its CLIENT spans of Search and Generate -> their
    # SERVER spans -> Generate's CLIENT spans of Execute -> toolsproxy's SERVER spans.
    [respond_span] = spans["orchestrator"]
    assert respond_span["parent_id"] == f"0x{caller_span}"
    respond_id = respond_span["context"]["span_id"]

    def clients(key: str, method: str) -> list[dict[str, Any]]:
        return [
            s
            for s in _spans(m, key)
            if s["kind"] == "SpanKind.CLIENT"
            and s["name"].endswith(f"/{method}")
            and s["context"]["trace_id"] == f"0x{otel_id:032x}"
        ]

    searches = clients("orchestrator", "Search")
    generates = clients("orchestrator", "Generate")
    assert searches and generates
    assert {s["parent_id"] for s in searches + generates} == {respond_id}
    outgoing = {s["context"]["span_id"] for s in searches + generates}
    assert {s["parent_id"] for s in spans["retrieval"] + spans["llm"]} <= outgoing
    generate_ids = {s["context"]["span_id"] for s in spans["llm"]}
    executes = clients("llm", "Execute")
    assert executes and {s["parent_id"] for s in executes} <= generate_ids
    execute_ids = {s["context"]["span_id"] for s in executes}
    assert spans["toolsproxy"] and {s["parent_id"] for s in spans["toolsproxy"]} <= execute_ids


@pytest.fixture
def collector() -> Iterator[OtlpCollector]:
    with OtlpCollector() as c:
        yield c


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_the_otlp_exporter_delivers_a_respond_trace_to_a_collector(
    collector: OtlpCollector, make_mesh: MeshFactory, protocol: str
) -> None:
    """The real OTLP exporters (opentelemetry-exporter-otlp-proto-grpc / -http) in all four
    servers, sending to a collector that speaks OTLP (tests/fakes/otlp_collector.py)."""
    m = make_mesh(
        {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": protocol,
            "OTEL_EXPORTER_OTLP_ENDPOINT": (
                collector.grpc_endpoint if protocol == "grpc" else collector.url
            ),
            "OTEL_BSP_SCHEDULE_DELAY": "50",
        },
        bank=True,
    )
    guide = SAMPLES / "orion-x-admin-guide.md"
    ingest(m, TENANT, guide.name, guide.read_bytes())
    trace = f"e2e-{uuid.uuid4().hex}"
    caller_span = "00f067aa0ba902b7"
    otel_id = f"{otel_trace_id(trace):032x}"
    r = respond(
        m,
        {**RESPOND, "trace_id": trace},
        headers={"traceparent": f"00-{otel_id}-{caller_span}-01"},
    )
    assert r.status_code == 200, r.text

    def served(key: str) -> list[ReceivedSpan]:
        name = f"{GRPC_SERVICE[key]}/{RESPOND_METHODS[key]}"
        return [
            s
            for s in collector.spans()
            if s.trace_id == otel_id and s.name == name and s.service == f"visior-{key}"
        ]

    for key in SERVICE_KEYS:
        assert wait_for(lambda k=key: bool(served(k)), timeout=15), f"{key}: nothing received"

    def missing_parents() -> set[str]:
        """Parents named by received spans but not received (yet): each process exports in
        its own batches, so one span may reach the collector before its parent."""
        got = [s for s in collector.spans() if s.trace_id == otel_id]
        ids = {s.span_id for s in got} | {caller_span}
        return {s.parent_span_id for s in got} - ids

    assert wait_for(lambda: not missing_parents(), timeout=15), missing_parents()
    spans = {key: served(key) for key in SERVICE_KEYS}
    transport = "grpc" if protocol == "grpc" else "http"
    for key, found in spans.items():
        for span in found:
            assert span.service == f"visior-{key}", span
            assert span.transport == transport, span
            assert span.kind == 2, span  # SPAN_KIND_SERVER
            assert span.attributes["visior.trace_id"] == trace, span
            assert span.attributes["rpc.grpc.status_code"] == 0, span
    # As the collector got it: the caller's span -> Respond -> its CLIENT spans of Search
    # and Generate (kind 3) -> their SERVER spans -> Generate's CLIENT spans of Execute ->
    # toolsproxy's SERVER spans.
    received = [s for s in collector.spans() if s.trace_id == otel_id]
    by_id = {s.span_id: s for s in received}
    [respond_span] = spans["orchestrator"]
    assert respond_span.parent_span_id == caller_span
    callers = {"retrieval": "orchestrator", "llm": "orchestrator", "toolsproxy": "llm"}
    for key, caller_service in callers.items():
        for span in spans[key]:
            client = by_id[span.parent_span_id]
            assert client.kind == 3 and client.name == span.name, client  # SPAN_KIND_CLIENT
            assert client.service == f"visior-{caller_service}", client
            assert client.attributes["rpc.grpc.status_code"] == 0, client
            grandparent = by_id[client.parent_span_id]
            assert grandparent.kind == 2 and grandparent.service == client.service, grandparent
            if caller_service == "orchestrator":
                assert grandparent.span_id == respond_span.span_id
    # A call to a third party (the bank, over HTTP) is a CLIENT span of toolsproxy's Execute.
    rate_trace = f"e2e-{uuid.uuid4().hex}"
    r = respond(m, {"query": "Какой курс доллара сегодня?", "user": USER, "trace_id": rate_trace})
    assert r.status_code == 200, r.text
    rate_id = f"{otel_trace_id(rate_trace):032x}"

    def bank_calls() -> list[ReceivedSpan]:
        return [
            s for s in collector.spans() if s.trace_id == rate_id and s.attributes.get("visior.peer") == "cbr"
        ]  # fmt: skip

    assert wait_for(lambda: bool(bank_calls()), timeout=15), "no span of the bank call"
    assert wait_for(
        lambda: any(s.name.endswith("/Execute") and s.service == "visior-toolsproxy" and s.kind == 2
                    for s in collector.spans() if s.trace_id == rate_id),
        timeout=15,
    )  # fmt: skip
    rate_spans = {s.span_id: s for s in collector.spans() if s.trace_id == rate_id}
    for call in bank_calls():
        assert call.kind == 3 and call.name == "POST" and call.service == "visior-toolsproxy"
        assert call.attributes["http.response.status_code"] == 200, call
        assert call.attributes["url.full"].endswith("/DailyInfoWebServ/DailyInfo.asmx"), call
        parent = rate_spans[call.parent_span_id]
        assert parent.kind == 2 and parent.name.endswith("ToolsProxyService/Execute"), parent
    # Each service's "rpc" log lines of the request name its SERVER spans.
    for key in SERVICE_KEYS:
        server_ids = {s.span_id for s in received if s.service == f"visior-{key}" and s.kind == 2}
        lines = [e for e in log_lines(m, key) if e["msg"] == "rpc" and e["trace_id"] == trace]
        assert lines and {e.get("span_id") for e in lines} <= server_ids, (key, lines)


def test_a_failed_json_call_answers_its_trace_id_in_a_header(mesh: Mesh) -> None:
    """A caller who sent no trace id can quote the failed call's: Envoy turns the gRPC
    trailer into a response header, and the service logged the call under it."""
    r = httpx.post(
        mesh.json_url("orchestrator") + "/internal/orchestrator/respond",
        json={**RESPOND, "doc_ids": ["no-such-doc-e2e"]},
        timeout=30,
    )
    assert r.status_code == 404, r.text
    trace = r.headers["x-trace-id"]
    assert len(trace) == 32
    logged = [e for e in log_lines(mesh, "orchestrator") if e.get("trace_id") == trace]
    assert any(e.get("code") == "NOT_FOUND" for e in logged), logged
