"""Load benchmark: the mesh's max sustainable RPS through Envoy, then 80 % of it held open-loop.

Starts the whole mesh in this process tree (services.devtools.mesh.Mesh: the four servers and
Envoy, on free ports), a zero-latency OpenAI-compatible runtime for Respond
(tests/fakes/openai_chat.py `FakeChatServer` in its own process, answering as
bench/respond_overhead.py's fake model: 3 read_chunk_window calls, then a fixed answer),
ingests samples/docs into tenant `bench`, and for each target sends JSON through the
service's Envoy listener with h2load (nghttp2, C; HTTP/2 without TLS, one connection):

  search   POST /internal/retrieval/search      RetrievalService/Search
  respond  POST /internal/orchestrator/respond  OrchestratorService/Respond (S1, 3 tool steps)

per target:

  1. probe  one request; its answer is checked (hits; scenario, tool steps, answer, sources)
  2. ramp   closed loop at concurrency 1, 2, 4, ... (h2load -m c): throughput, p50/p99,
            errors per step, until errors, p99 above the bound, or two steps without a 5 %
            gain. Max sustainable RPS = the highest throughput of a step with 0 errors and
            p99 <= the bound (default 10 x the first step's p50).
  3. hold   open loop at 80 % of it for --duration s (h2load --rps, a fixed rate: requests
            start on schedule whether or not earlier ones have answered), then: requests,
            errors, p50/p95/p99 from the scheduled start, achieved RPS, the generator's
            schedule lag and CPU, CPU seconds and %, RSS at start / peak / end of Envoy, the
            four servers and the fake runtime; every service's own handled-RPC counters are
            checked against the client's count (exact calls per request, no non-OK code).

Exit status: 0 when every hold had 0 errors and passed the server-side checks, 1 otherwise,
2 when a hold had no errors but did not keep its rate, or h2load is missing (bench/README.md,
"Load").

    python bench/load.py [--duration 60] [--targets search,respond] [--profile e5|fast] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
for _p in (str(REPO_ROOT), str(BENCH_DIR)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from llm_overhead import environment_info, fetch, free_ports, loadavg, serve_stats  # noqa: E402
from respond_overhead import ANSWER, QUESTIONS, STEPS, TENANT, ingest, make_model  # noqa: E402
from tool_limits import NO_TOOL_RATE_LIMITS  # noqa: E402
from transport import machine_cpu_s, percentile, tool_version, write_record  # noqa: E402

ME = str(Path(__file__).resolve())
DOCS_DIR = REPO_ROOT / "samples" / "docs"
QUESTION = QUESTIONS[0][0]  # "Как настроить LDAP интеграцию?": S1 by the rules, anchors found
MAX_STREAMS = 1000
"""h2load's stream limit in the open loop: far above what a held rate keeps in flight (the
servers refuse past 256 concurrent RPCs each); the run checks it was never reached."""
RPS_TICK_S = 0.01
"""h2load's rate timer fires every max(10 ms, 1/rate) and sends the requests then due (rounded),
so against a perfect schedule a request may start up to one tick late by design."""
LAG_SLACK_MS = 5.0
"""The open loop is on schedule when the p99 of (actual start - scheduled start) is at most one
tick plus this."""
HELD_FRACTION = 0.95
"""A hold kept its rate when the achieved RPS is at least this fraction of the offered rate."""
MESH = ("envoy", "orchestrator", "llm", "retrieval", "toolsproxy")
MiB = 1024 * 1024


# ---------------------------------------------------------------------------------------
# What is loaded


@dataclass(frozen=True)
class Target:
    """One JSON route under load and what one request must cost the mesh, RPC by RPC."""

    name: str
    service: str
    """The mesh service whose Envoy listener takes the request."""
    path: str
    body: dict[str, Any]
    rpcs: tuple[tuple[str, str, int], ...]
    """(service, method, calls per request): checked exactly against the servers' own
    grpc_server_handled_total{grpc_code="OK"} over the hold."""
    runtime_calls: int
    """Chat-completion calls per request, counted by the fake runtime."""

    def check(self, answer: dict[str, Any]) -> str | None:
        """What is wrong with one answer (None: a real answer)."""
        if self.name == "search":
            return None if answer.get("hits") else f"no hits: {str(answer)[:300]}"
        t = answer.get("telemetry", {})
        got = (t.get("scenario"), int(t.get("tool_steps", 0)), answer.get("answer"))
        if got != ("S1", STEPS, ANSWER) or not answer.get("sources"):
            return f"expected S1, {STEPS} tool steps, the fake's answer, sources: {got}"
        return None


TARGETS = {
    "search": Target(
        "search",
        "retrieval",
        "/internal/retrieval/search",
        {"query": QUESTION, "tenant_id": TENANT, "max_results": 10},
        (("retrieval", "Search", 1),),
        0,
    ),
    "respond": Target(
        "respond",
        "orchestrator",
        "/internal/orchestrator/respond",
        {"query": QUESTION, "user": {"tenant_id": TENANT, "user_id": "bench-user"}},
        (
            ("orchestrator", "Respond", 1),
            ("retrieval", "Search", 1),
            ("llm", "Generate", 1),
            ("toolsproxy", "Execute", STEPS),
        ),
        STEPS + 1,
    ),
}


# ---------------------------------------------------------------------------------------
# The zero-latency runtime (its own process): FakeChatServer answering at once


def serve_fake(stats_port: int) -> None:
    """FakeChatServer with respond_overhead's model; GET /calls on `stats_port` counts chats."""
    from tests.fakes.openai_chat import CHAT_PATH, FakeChatServer

    fake = FakeChatServer().respond_with(make_model(None))
    # The fake keeps every request for tests; a load run makes hundreds of thousands.
    fake.requests = deque(maxlen=16)  # type: ignore[assignment]
    lock = threading.Lock()
    calls = [0]
    serve = fake._serve

    def counted(method: str, path: str, headers: dict[str, str], raw: bytes) -> Any:
        out = serve(method, path, headers, raw)
        if method == "POST" and path == CHAT_PATH:
            with lock:
                calls[0] += 1
        return out

    fake._serve = counted  # type: ignore[method-assign]
    fake.start()
    serve_stats(stats_port, lambda _path: {"calls": calls[0]})
    print(f"FAKE_URL {fake.url}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    fake.stop()


# ---------------------------------------------------------------------------------------
# The load generator: h2load, HTTP/2 prior knowledge (h2c), one connection


@dataclass
class Run:
    """One h2load run: per-request rows of its log and its own counters."""

    starts_us: list[int]
    """Start of each request, microseconds since the epoch (h2load's clock)."""
    latencies_us: list[int]
    statuses: list[int]
    """HTTP status per request; -1 for a failed stream."""
    started: int
    done: int
    failed: int
    errored: int
    timeout: int
    wall_s: float
    client_cpu_s: float
    summary: str
    """h2load's own "requests:" and "status codes:" lines."""

    @property
    def errors(self) -> int:
        # h2load's "failed" counts non-2xx answers and failed streams (its "errored" and
        # "timeout" are subsets of it); the log has one row per finished request.
        bad = sum(1 for s in self.statuses if not 200 <= s < 300)
        return max(bad, self.failed)

    @property
    def bad_statuses(self) -> dict[str, int]:
        """Non-2xx HTTP statuses by count ("-1": a failed stream), for the report."""
        out: dict[str, int] = {}
        for s in self.statuses:
            if not 200 <= s < 300:
                out[str(s)] = out.get(str(s), 0) + 1
        return out

    @property
    def ok_latencies_ms(self) -> list[float]:
        pairs = zip(self.latencies_us, self.statuses, strict=True)
        return sorted(lat / 1000 for lat, s in pairs if 200 <= s < 300)

    @property
    def span_s(self) -> float:
        """First request's start to last response's end."""
        if not self.starts_us:
            return 0.0
        ends = (s + lat for s, lat in zip(self.starts_us, self.latencies_us, strict=True))
        return (max(ends) - min(self.starts_us)) / 1e6


_H2LOAD_REQUESTS = re.compile(
    r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
    r"(\d+) errored, (\d+) timeout"
)


class H2load:
    """JSON POSTs to one URL through h2load over h2c: `closed` loops and `open` fixed rates.

    HTTP/2 on one connection lets the open loop keep any number of requests in flight (an
    HTTP/1.1 connection carries one at a time, so a late answer would delay the next
    request: coordinated omission), and lets `--rps` send on one timer instead of many
    connections ticking in step. Latency is measured by h2load from each request's start.
    """

    def __init__(self, url: str, body: dict[str, Any], workdir: Path) -> None:
        self.url = url
        self.body = workdir / "body.json"
        self.body.write_text(json.dumps(body, ensure_ascii=False))
        self.log = workdir / "h2load.log"

    @staticmethod
    def version() -> str:
        return tool_version(["h2load", "--version"])

    def closed(self, concurrency: int, seconds: float, warmup: float) -> Run:
        """`concurrency` streams, each sending its next request when its answer is in."""
        extra = ["-m", str(concurrency), "-D", f"{round(seconds * 1000)}ms"]
        if warmup > 0:
            extra += ["--warm-up-time", f"{round(warmup * 1000)}ms"]
        return self._run(extra, timeout=seconds + warmup + 120)

    def open(self, rate: float, count: int) -> Run:
        """`count` requests started at `rate` per second, whatever is in flight; all awaited."""
        extra = ["-m", str(MAX_STREAMS), "--rps", f"{rate:.3f}", "-n", str(count)]
        return self._run(extra, timeout=count / rate + 180)

    def _run(self, extra: list[str], timeout: float) -> Run:
        self.log.unlink(missing_ok=True)  # h2load appends
        cmd = ["h2load", "-t1", "-c1", *extra, "-d", str(self.body)]
        cmd += ["-H", "content-type: application/json", f"--log-file={self.log}", self.url]
        cpu0 = _children_cpu_s()
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        wall = time.perf_counter() - t0
        cpu = _children_cpu_s() - cpu0
        m = _H2LOAD_REQUESTS.search(out.stdout)
        if out.returncode != 0 or m is None:
            raise RuntimeError(
                f"h2load failed ({out.returncode}): {cmd}\n{out.stdout}\n{out.stderr}"
            )
        _total, started, done, _ok, failed, errored, timeouts = (int(g) for g in m.groups())
        starts, lats, statuses = [], [], []
        if self.log.exists():
            for line in self.log.read_text().splitlines():
                start, status, lat = line.split("\t")[:3]
                starts.append(int(start))
                statuses.append(int(status))
                lats.append(int(lat))
        summary = "; ".join(
            ln.strip() for ln in out.stdout.splitlines() if ln.startswith(("requests:", "status"))
        )
        return Run(
            starts, lats, statuses, started, done, failed, errored, timeouts, wall, cpu, summary
        )


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def schedule_lag_ms(starts_us: list[int], rate: float) -> list[float]:
    """How late each request started against a fixed schedule of `rate` per second.

    The schedule's origin is the one that puts no request early: t0 = min(start_i - i/rate)
    over the requests in start order, so lag_i = start_i - i/rate - t0 >= 0."""
    starts = sorted(starts_us)
    if not starts:
        return []
    step = 1e6 / rate
    t0 = min(s - i * step for i, s in enumerate(starts))
    return sorted((s - i * step - t0) / 1000 for i, s in enumerate(starts))


def max_in_flight(starts_us: list[int], latencies_us: list[int]) -> int:
    events = [(s, 1) for s in starts_us]
    events += [(s + lat, -1) for s, lat in zip(starts_us, latencies_us, strict=True)]
    events.sort(key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
    peak = n = 0
    for _t, d in events:
        n += d
        peak = max(peak, n)
    return peak


def pct(values: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99/max (nearest rank) of ascending `values`, rounded to 0.01."""
    if not values:
        return {"p50": math.nan, "p95": math.nan, "p99": math.nan, "max": math.nan}
    out = {f"p{p}": round(percentile(values, p), 2) for p in (50, 95, 99)}  # type: ignore[arg-type]
    out["max"] = round(values[-1], 2)
    return out


# ---------------------------------------------------------------------------------------
# The processes: CPU and RSS (psutil), and the servers' own RPC counters


class Watch:
    """CPU seconds of each process over a window and its RSS at start, peak (sampled every
    `interval` s in a thread) and end."""

    def __init__(self, pids: dict[str, int], interval: float = 0.2) -> None:
        import psutil

        self.procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.interval = interval
        self.cpu0: dict[str, float] = {}
        self.cpu1: dict[str, float] = {}
        self.rss0: dict[str, int] = {}
        self.rss1: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.wall_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _cpu(self) -> dict[str, float]:
        out = {}
        for name, p in self.procs.items():
            t = p.cpu_times()
            out[name] = t.user + t.system
        return out

    def _rss(self) -> dict[str, int]:
        return {name: p.memory_info().rss for name, p in self.procs.items()}

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            for name, rss in self._rss().items():
                self.peak[name] = max(self.peak.get(name, 0), rss)

    def __enter__(self) -> Watch:
        self.rss0 = self._rss()
        self.peak = dict(self.rss0)
        self.cpu0 = self._cpu()
        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self._t0
        self.cpu1 = self._cpu()
        self._stop.set()
        self._thread.join()
        self.rss1 = self._rss()
        for name, rss in self.rss1.items():
            self.peak[name] = max(self.peak[name], rss)

    def cpu_s(self, name: str) -> float:
        return self.cpu1[name] - self.cpu0[name]

    def report(self) -> dict[str, dict[str, float]]:
        return {
            name: {
                "cpu_s": round(self.cpu_s(name), 2),
                "cpu_pct": round(100 * self.cpu_s(name) / self.wall_s, 1),
                "rss_start_mb": round(self.rss0[name] / MiB, 1),
                "rss_peak_mb": round(self.peak[name] / MiB, 1),
                "rss_end_mb": round(self.rss1[name] / MiB, 1),
            }
            for name in self.procs
        }


_HANDLED = re.compile(r"^grpc_server_handled_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$")


def handled(mesh: Any) -> dict[tuple[str, str, str], float]:
    """grpc_server_handled_total of every service: {(service, method, code): count}."""
    out: dict[tuple[str, str, str], float] = {}
    for key, port in mesh.ports.metrics.items():
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        for line in text.splitlines():
            m = _HANDLED.match(line)
            if m:
                labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group("labels")))
                k = (key, labels.get("grpc_method", "?"), labels.get("grpc_code", "?"))
                out[k] = out.get(k, 0.0) + float(m.group("value"))
    return out


def server_checks(
    target: Target,
    done: int,
    before: dict[tuple[str, str, str], float],
    after: dict[tuple[str, str, str], float],
    runtime_calls: int | None,
) -> tuple[dict[str, Any], list[str]]:
    """The servers' counts over the hold against the client's: (counts, problems)."""
    delta = {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}
    problems = [
        f"{svc} {method}: {int(n)} x {code}"
        for (svc, method, code), n in sorted(delta.items())
        if code != "OK"
    ]
    counts: dict[str, Any] = {}
    for svc, method, per in target.rpcs:
        n = int(delta.get((svc, method, "OK"), 0))
        counts[f"{svc}:{method}"] = n
        if n != per * done:
            problems.append(f"{svc} {method}: {n} OK, expected {per} x {done} requests")
    if target.runtime_calls:
        counts["runtime:chat"] = runtime_calls
        if runtime_calls != target.runtime_calls * done:
            problems.append(
                f"runtime: {runtime_calls} chat calls, expected {target.runtime_calls} x {done}"
            )
    return counts, problems


# ---------------------------------------------------------------------------------------
# Ramp (closed loop) and hold (open loop)


@dataclass
class Step:
    """One closed-loop ramp step."""

    concurrency: int
    requests: int
    rps: float
    latency_ms: dict[str, float]
    errors: int
    cut: int
    """Requests in flight when the step's time was up (not counted, not errors)."""
    mesh_cores: float
    h2load: str
    ok: bool = False
    note: str = ""


def ramp(
    gen: H2load, pids: dict[str, int], args: argparse.Namespace
) -> tuple[list[Step], Step | None, float]:
    """Closed-loop steps up the concurrency list: (steps, best ok step, p99 bound in ms)."""
    import psutil

    procs = [psutil.Process(pids[k]) for k in MESH]

    def mesh_cpu() -> float:
        return sum(sum(p.cpu_times()[:2]) for p in procs)

    steps: list[Step] = []
    best: Step | None = None
    bound = args.p99_bound_ms or 0.0
    stale = 0
    for c in args.concurrency:
        cpu0 = mesh_cpu()
        run = gen.closed(c, args.step_duration, args.step_warmup)
        cores = (mesh_cpu() - cpu0) / run.wall_s
        lat = pct(run.ok_latencies_ms)
        step = Step(
            c,
            run.done,
            round(run.done / args.step_duration, 1),
            lat,
            run.errors,
            max(0, run.started - run.done),
            round(cores, 2),
            run.summary,
        )
        first = not bound
        if first:  # the first step sets the bound (10 x one lone request's p50), not judged by it
            bound = round(args.p99_factor * lat["p50"], 1)
        step.ok = step.errors == 0 and (first or lat["p99"] <= bound)
        if step.errors:
            bad = ", ".join(f"{n} x {s}" for s, n in sorted(run.bad_statuses.items()))
            step.note = f"{step.errors} errors (HTTP status: {bad or '-'})"
        elif not step.ok:
            step.note = f"p99 above {bound:g} ms"
        elif best is not None and step.rps < best.rps * (1 + args.plateau_gain):
            stale += 1
            step.note = f"< {100 * args.plateau_gain:g} % gain ({stale})"
        else:
            stale = 0
        steps.append(step)
        print(
            f"    c={c:<4} {step.rps:8.1f} RPS  p50 {lat['p50']:8.2f}  p99 {lat['p99']:8.2f} ms  "
            f"errors {step.errors}  mesh {cores:.2f} cores  {step.note}",
            flush=True,
        )
        time.sleep(0.5)  # the requests cut off at the step's end are cancelled meanwhile
        if not step.ok:
            break
        if best is None or step.rps > best.rps:
            best = step
        if stale >= 2:
            break
    return steps, best, bound


def hold(
    gen: H2load,
    target: Target,
    rate: float,
    mesh: Any,
    pids: dict[str, int],
    fake_stats: int | None,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """`rate` requests per second for args.duration s, open loop; figures and checks."""
    if args.hold_warmup > 0:
        gen.open(rate, max(1, round(rate * args.hold_warmup)))
        time.sleep(0.5)
    count = max(1, round(rate * args.duration))

    def runtime_calls() -> int:
        return int(fetch(fake_stats, "/calls")["calls"]) if fake_stats else 0

    before, fake0 = handled(mesh), runtime_calls()
    busy0, steal0 = machine_cpu_s()
    me = _self_cpu_s()
    with Watch(pids) as watch:
        run = gen.open(rate, count)
    busy1, steal1 = machine_cpu_s()
    me = _self_cpu_s() - me
    time.sleep(0.5)  # counters of the last nested calls
    after, fake1 = handled(mesh), runtime_calls()
    counts, problems = server_checks(target, run.done, before, after, fake1 - fake0)
    if run.done != count:
        problems.append(f"h2load: {run.done} of {count} requests done")

    ours = sum(watch.cpu_s(k) for k in pids) + run.client_cpu_s + me
    lag = schedule_lag_ms(run.starts_us, rate)
    span = run.span_s
    ok = run.ok_latencies_ms
    third = max(1, len(run.starts_us) // 3)
    order = sorted(range(len(run.starts_us)), key=run.starts_us.__getitem__)
    first = sorted(run.latencies_us[i] / 1000 for i in order[:third])
    last = sorted(run.latencies_us[i] / 1000 for i in order[-third:])
    mesh_cpu = sum(watch.cpu_s(k) for k in MESH)
    return {
        "target": target.name,
        "offered_rps": round(rate, 2),
        "duration_s": args.duration,
        "requests": run.done,
        "errors": run.errors,
        "error_statuses": run.bad_statuses,
        "h2load": {
            "started": run.started,
            "failed": run.failed,
            "errored": run.errored,
            "timeout": run.timeout,
            "summary": run.summary,
        },
        "achieved_rps": round(run.done / span, 2) if span else 0.0,
        "span_s": round(span, 2),
        "latency_ms": pct(ok),
        "latency_p50_first_last_third_ms": [pct(first)["p50"], pct(last)["p50"]],
        "generator": {
            "schedule_lag_ms": pct(lag),
            "tick_ms": round(1000 * max(RPS_TICK_S, 1 / rate), 2),
            "max_in_flight": max_in_flight(run.starts_us, run.latencies_us),
            "stream_limit": MAX_STREAMS,
            "cpu_s": round(run.client_cpu_s, 2),
            "cpu_pct": round(100 * run.client_cpu_s / watch.wall_s, 1),
        },
        "processes": watch.report(),
        "mesh_cpu_s": round(mesh_cpu, 2),
        "mesh_cpu_ms_per_request": round(1000 * mesh_cpu / run.done, 2) if run.done else None,
        "other_cores": round(max(0.0, (busy1 - busy0) - ours) / watch.wall_s, 2),
        "steal_cores": round((steal1 - steal0) / watch.wall_s, 2),
        "server_counts": counts,
        "problems": problems,
    }


def _self_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def held(h: dict[str, Any]) -> list[str]:
    """Why a hold with no errors does not count as having held its rate (empty: it did)."""
    why = []
    if h["achieved_rps"] < HELD_FRACTION * h["offered_rps"]:
        why.append(
            f"achieved {h['achieved_rps']:.1f} < {100 * HELD_FRACTION:g} % of "
            f"{h['offered_rps']:.1f} RPS offered"
        )
    lag, tick = h["generator"]["schedule_lag_ms"]["p99"], h["generator"]["tick_ms"]
    if lag > tick + LAG_SLACK_MS:
        why.append(
            f"the generator started p99 {lag:.1f} ms late (bound: one {tick:g} ms tick + "
            f"{LAG_SLACK_MS:g} ms)"
        )
    if h["generator"]["max_in_flight"] >= MAX_STREAMS:
        why.append(f"h2load's stream limit ({MAX_STREAMS}) was reached: requests queued in it")
    return why


# ---------------------------------------------------------------------------------------
# Output


def format_ramp(name: str, steps: list[Step], best: Step | None, bound: float) -> str:
    head = f"  {'c':>4} {'reqs':>7} {'RPS':>8} {'p50':>8} {'p95':>8} {'p99 ms':>8} {'err':>4} "
    head += f"{'mesh cores':>10}"
    lines = [f"{name}: ramp, closed loop (p99 bound {bound:g} ms)", head]
    for s in steps:
        mark = " <- max" if s is best else ""
        lines.append(
            f"  {s.concurrency:>4} {s.requests:>7} {s.rps:>8.1f} {s.latency_ms['p50']:>8.2f} "
            f"{s.latency_ms['p95']:>8.2f} {s.latency_ms['p99']:>8.2f} {s.errors:>4} "
            f"{s.mesh_cores:>10.2f}  {s.note}{mark}"
        )
    return "\n".join(lines)


def format_holds(holds: list[dict[str, Any]]) -> str:
    head = (
        f"{'target':<8} {'offered':>8} {'reqs':>7} {'err':>4} {'RPS':>8} {'p50':>8} {'p95':>8} "
        f"{'p99 ms':>8} {'max':>8}  {'lag p99':>7} {'gen cpu':>7} {'cpu/req':>8} {'other':>5}"
    )
    lines = [head, "-" * len(head)]
    for h in holds:
        lat, g = h["latency_ms"], h["generator"]
        lines.append(
            f"{h['target']:<8} {h['offered_rps']:>8.1f} {h['requests']:>7} {h['errors']:>4} "
            f"{h['achieved_rps']:>8.1f} {lat['p50']:>8.2f} {lat['p95']:>8.2f} {lat['p99']:>8.2f} "
            f"{lat['max']:>8.2f}  {g['schedule_lag_ms']['p99']:>7.2f} {g['cpu_pct']:>6.1f}% "
            f"{h['mesh_cpu_ms_per_request'] or 0:>8.2f} {h['other_cores']:>5.2f}"
        )
    lines.append("")
    head = (
        f"{'target':<8} {'process':<13} {'cpu s':>7} {'cpu %':>6}  "
        f"{'RSS start':>9} {'peak':>7} {'end MB':>7}"
    )
    lines += [head, "-" * len(head)]
    for h in holds:
        for name, p in h["processes"].items():
            lines.append(
                f"{h['target']:<8} {name:<13} {p['cpu_s']:>7.2f} {p['cpu_pct']:>6.1f}  "
                f"{p['rss_start_mb']:>9.1f} {p['rss_peak_mb']:>7.1f} {p['rss_end_mb']:>7.1f}"
            )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# The run


@contextlib.contextmanager
def running(args: argparse.Namespace, tmp: Path) -> Iterator[tuple[Any, int | None, dict]]:
    """The fake runtime (when Respond is loaded) and the mesh; stopped on exit."""
    from services.common.topology import Ports
    from services.devtools.mesh import Mesh

    env = {
        "RETR_EMBEDDING_PROFILE": args.profile,
        # One fixed question per target (h2load sends one body): with the query-embedding
        # cache on, every search after the first would skip the embedding a new question pays.
        "RETR_QUERY_CACHE_SIZE": "0",
        **NO_TOOL_RATE_LIMITS,  # bench/tool_limits.py
        **dict(kv.split("=", 1) for kv in args.server_env),
    }
    fake = None
    fake_stats: int | None = None
    pids: dict[str, int] = {}
    mesh = None
    try:
        if "respond" in args.targets:
            fake_stats = free_ports(1)[0]
            fake = subprocess.Popen(
                [sys.executable, ME, "--serve-fake", "--stats-port", str(fake_stats)],
                cwd=str(REPO_ROOT), env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=(tmp / "fake.log").open("ab"),
            )  # fmt: skip
            assert fake.stdout is not None
            line = fake.stdout.readline().decode().strip()
            if not line.startswith("FAKE_URL "):
                raise RuntimeError(f"fake runtime did not start:\n{(tmp / 'fake.log').read_text()}")
            env |= {
                "LLM_RUNTIME_URL": line.split()[1],
                "DEFAULT_MODEL_NAME": "fake",
                "ORCH_MODEL_ROUTING": "false",  # the scenario rules decide (S1), no routing call
            }
            pids["runtime-fake"] = fake.pid
        mesh = Mesh(Ports.free(), tmp / "data", tmp / "run", env=env,
                    envoy_concurrency=args.envoy_concurrency,
                    access_log=args.access_log)  # fmt: skip
        mesh.start()
        pids = {k: mesh.pids()[k] for k in MESH} | pids
        yield mesh, fake_stats, pids
        dead = [k for k, alive in mesh.alive().items() if not alive]
        if dead or (fake is not None and fake.poll() is not None):
            raise RuntimeError(f"process(es) died during the benchmark: {dead or 'runtime fake'}")
    finally:
        if mesh is not None:
            mesh.stop()
        if fake is not None and fake.poll() is None:
            fake.send_signal(signal.SIGTERM)
            try:
                fake.wait(10)
            except subprocess.TimeoutExpired:
                fake.kill()
                fake.wait()


def probe(mesh: Any, target: Target) -> None:
    """One request through Envoy; raises unless it comes back as a real answer."""
    import httpx

    r = httpx.post(mesh.json_url(target.service) + target.path, json=target.body, timeout=60)
    if r.status_code != 200:
        raise RuntimeError(f"{target.name} probe: HTTP {r.status_code} {r.text[:500]}")
    problem = target.check(r.json())
    if problem:
        raise RuntimeError(f"{target.name} probe: {problem}")


def run_target(
    target: Target,
    mesh: Any,
    fake_stats: int | None,
    pids: dict[str, int],
    args: argparse.Namespace,
    tmp: Path,
) -> dict[str, Any]:
    probe(mesh, target)
    gen = H2load(mesh.json_url(target.service) + target.path, target.body, tmp)
    print(f"  {target.name}: POST {target.path} through Envoy, answer checked; ramp", flush=True)
    steps, best, bound = ramp(gen, pids, args)
    out: dict[str, Any] = {
        "target": target.name,
        "ramp": [asdict(s) for s in steps],
        "p99_bound_ms": bound,
        "ramp_table": format_ramp(target.name, steps, best, bound).splitlines(),
    }
    if best is None:
        out["max_sustainable_rps"] = None
        return out
    rate = args.hold_fraction * best.rps
    out["max_sustainable_rps"] = best.rps
    print(
        f"  {target.name}: max sustainable {best.rps:.1f} RPS (c={best.concurrency}); holding "
        f"{rate:.1f} RPS open loop for {args.duration:g} s",
        flush=True,
    )
    out["hold"] = hold(gen, target, rate, mesh, pids, fake_stats, args)
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    stamp = dt.datetime.now().strftime("%Y-%m-%d-%H%M%S")
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--duration", type=float, default=60, help="seconds of the hold (60)")
    ap.add_argument("--targets", type=lambda s: s.split(","), default=list(TARGETS),
                    help="search,respond (both)")  # fmt: skip
    ap.add_argument(
        "--profile", choices=("e5", "fast"), default=None,
        help="retrieval's embedding profile: e5 (the default, what `make run` serves; "
        "fast with --quick) or fast (USE, as the tests)",
    )  # fmt: skip
    ap.add_argument(
        "--quick", action="store_true",
        help="a check that everything works, not figures: 2 s steps, 5 s hold, fast profile",
    )  # fmt: skip
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                    default=[1, 2, 4, 8, 16, 32, 64], help="ramp steps (1,2,4,...,64)")  # fmt: skip
    ap.add_argument("--step-duration", type=float, default=8, help="measured s per step (8)")
    ap.add_argument("--step-warmup", type=float, default=2, help="warm-up s per step (2)")
    ap.add_argument("--p99-factor", type=float, default=10.0,
                    help="p99 bound of a ramp step = F x the first step's p50 (10)")  # fmt: skip
    ap.add_argument("--p99-bound-ms", type=float, default=0.0,
                    help="an absolute p99 bound instead (ms)")  # fmt: skip
    ap.add_argument("--plateau-gain", type=float, default=0.05,
                    help="stop after 2 steps each below (1 + G) x the best RPS (0.05)")  # fmt: skip
    ap.add_argument("--hold-fraction", type=float, default=0.8,
                    help="the hold's rate as a fraction of the max (0.8)")  # fmt: skip
    ap.add_argument("--hold-warmup", type=float, default=5,
                    help="s at the hold's rate before it, discarded (5)")  # fmt: skip
    ap.add_argument("--docs", type=lambda s: s.split(","), default=[],
                    help="samples/docs files to ingest (all of them)")  # fmt: skip
    ap.add_argument("--envoy-concurrency", type=int, default=2, help="Envoy workers (2)")
    ap.add_argument("--access-log", action="store_true",
                    help="Envoy access log (run/envoy/envoy.out; costs Envoy CPU)")  # fmt: skip
    ap.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE",
                    help="extra environment for every process of the mesh (repeatable)")  # fmt: skip
    ap.add_argument(
        "--out", type=Path, default=REPO_ROOT / "bench" / "out" / f"load-{stamp}.json",
        help="JSON record (bench/out/load-<date>-<time>.json, ignored by git)",
    )  # fmt: skip
    ap.add_argument("--serve-fake", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--stats-port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if set(args.targets) - set(TARGETS):
        ap.error(f"unknown targets: {sorted(set(args.targets) - set(TARGETS))}")
    if args.quick:
        args.duration = min(args.duration, 5)
        args.step_duration, args.step_warmup, args.hold_warmup = 2, 0.5, 1
        args.concurrency = [c for c in args.concurrency if c <= 16]
    args.profile = args.profile or ("fast" if args.quick else "e5")
    return args


def _terminate(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve_fake:
        serve_fake(args.stats_port)
        return 0
    if shutil.which("h2load") is None:
        print("h2load not found: apt-get install -y nghttp2-client (or `make bench-load`)")
        return 2
    signal.signal(signal.SIGTERM, _terminate)
    started = dt.datetime.now(dt.UTC)
    load_before = loadavg()
    print(f"load average before: {load_before}; embedding profile {args.profile}", flush=True)
    files = [DOCS_DIR / d for d in args.docs] if args.docs else sorted(
        f for f in DOCS_DIR.iterdir() if f.suffix in (".md", ".pdf")
    )  # fmt: skip
    results = []
    keep = os.environ.get("BENCH_KEEP_LOGS")
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmpdir:
        tmp = Path(keep or tmpdir)
        tmp.mkdir(parents=True, exist_ok=True)
        with running(args, tmp) as (mesh, fake_stats, pids):
            t0 = time.perf_counter()
            chunks = ingest(mesh, files)
            ingest_s = round(time.perf_counter() - t0, 1)
            print(
                f"mesh up; ingested {sum(chunks.values())} chunks of {len(chunks)} documents "
                f"into tenant {TENANT} in {ingest_s} s",
                flush=True,
            )
            for name in args.targets:
                results.append(run_target(TARGETS[name], mesh, fake_stats, pids, args, tmp))
    load_after = loadavg()

    holds = [r["hold"] for r in results if "hold" in r]
    notes, status = [], 0
    for r in results:
        if r["max_sustainable_rps"] is None:
            notes.append(f"{r['target']}: no ramp step without errors under the p99 bound")
            status = 1
    for h in holds:
        if h["errors"] or h["problems"]:
            status = 1
            notes.append(
                f"{h['target']}: FAILED: {h['errors']} errors (HTTP status: "
                f"{h['error_statuses'] or '-'}); " + "; ".join(h["problems"])
            )
            continue
        why = held(h)
        h["held"] = not why
        if why:
            status = max(status, 2)
            notes.append(f"{h['target']}: NOT HELD: " + "; ".join(why))
        else:
            notes.append(
                f"{h['target']}: HELD {h['offered_rps']:.1f} RPS "
                f"({100 * args.hold_fraction:g} % of the max) for {h['duration_s']:g} s: "
                "0 errors, servers' counts match "
                f"({', '.join(f'{k} {v}' for k, v in h['server_counts'].items())})"
            )
        g = h["generator"]
        notes.append(
            f"  generator: start lag p99 {g['schedule_lag_ms']['p99']:.1f} ms (tick "
            f"{g['tick_ms']:g} ms), max {g['max_in_flight']} in flight (limit "
            f"{g['stream_limit']}), {g['cpu_pct']:.1f} % of a core"
        )
        first, last = h["latency_p50_first_last_third_ms"]
        if last > 2 * first:
            notes.append(
                f"WARNING: {h['target']}: p50 grew from {first:.1f} ms (first third of the "
                f"hold) to {last:.1f} ms (last third): a queue was building"
            )
        if h["other_cores"] > 0.25 or h["steal_cores"] > 0.05:
            notes.append(
                f"WARNING: {h['target']}: other load {h['other_cores']:.2f} cores, steal "
                f"{h['steal_cores']:.2f} during the hold: a noisy run"
            )
    table = format_holds(holds)
    ramps = "\n\n".join("\n".join(r["ramp_table"]) for r in results)
    print(f"\n{ramps}\n\nHold, open loop (ms; cpu/req = mesh CPU ms per request):\n{table}\n")
    print("\n".join(notes))
    print(f"load average before {load_before}, after {load_after}")

    import psutil

    write_record(
        "load",
        started,
        args,
        {**environment_info(), "psutil": psutil.__version__, "h2load": H2load.version()},
        documents=chunks,
        ingest_s=ingest_s,
        loadavg={"before": load_before, "after": load_after},
        results=results,
        table=table.splitlines(),
        notes=notes,
        exit_status=status,
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
