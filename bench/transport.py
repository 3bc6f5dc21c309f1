"""Transport benchmark: one cheap RPC, direct gRPC vs JSON through the Envoy sidecar.

Starts the real mesh (four server processes and Envoy) in this process tree, then for each
concurrency runs a fixed-duration closed loop against the tools proxy:

  grpc     native gRPC over h2c straight to the server's gRPC port (h2load, C)
  json     JSON through Envoy's listener, transcoded to gRPC (wrk, C, HTTP/1.1 keep-alive)
  grpc-py  the same RPC from Python grpc.aio clients (what a Python caller sees)

and prints p50/p95/p99, requests/s, errors and the CPU each process used, then writes the
whole result as JSON. bench/README.md says how to read it.

    python bench/transport.py [--duration 10] [--concurrency 1,32] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import multiprocessing as mp
import os
import platform
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from array import array
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

SERVICE_KEY = "toolsproxy"
GRPC_TIMEOUT_S = 5.0
"""Deadline every client sends; Envoy sends the /health route's 5 s as grpc-timeout too."""


@dataclass(frozen=True)
class Rpc:
    """The RPC under test: its gRPC method and its JSON route on the service's listener."""

    name: str
    grpc_method: str
    http_path: str
    stub_method: str
    request_type: str


RPCS = {
    # Trivial handler (a three-field message), full interceptor stack, 90-byte JSON body:
    # the cost measured is transport + interceptors, not the handler.
    "health": Rpc(
        "health",
        "/visior.toolsproxy.v1.ToolsProxyService/GetHealth",
        "/health",
        "GetHealth",
        "GetHealthRequest",
    ),
    # Builds three google.protobuf.Struct schemas per call (~1.2 KB JSON): also measures
    # Struct building in Python and Struct->JSON in the transcoder.
    "tools": Rpc(
        "tools",
        "/visior.toolsproxy.v1.ToolsProxyService/ListTools",
        "/internal/mcp/tools",
        "ListTools",
        "ListToolsRequest",
    ),
}

# Both RPCs take an empty request: one gRPC frame is a 0 flag byte and a 0 length.
EMPTY_GRPC_FRAME = b"\x00\x00\x00\x00\x00"

WRK_LUA = """\
-- Prints wrk's summary and latency percentiles (microseconds) as one JSON line.
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"duration_us":%d,"p50":%.1f,"p95":%.1f,"p99":%.1f,' ..
    '"mean":%.1f,"max":%.1f,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d}\\n',
    summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(95), latency:percentile(99),
    latency.mean, latency.max,
    e.connect, e.read, e.write, e.status, e.timeout))
end
"""


# ---------------------------------------------------------------------------------------
# CPU accounting from /proc (no psutil)

CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return math.nan
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent not idle (all cores), from /proc/stat."""
    parts = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(p) for p in parts[:8]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / CLK_TCK


def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


@dataclass
class CpuSample:
    server: float
    envoy: float
    machine: float

    @classmethod
    def take(cls, server_pid: int, envoy_pid: int) -> CpuSample:
        return cls(proc_cpu_s(server_pid), proc_cpu_s(envoy_pid), machine_busy_s())


# ---------------------------------------------------------------------------------------
# Server-side truth: the service's own Prometheus counter of handled RPCs by status code

_HANDLED = re.compile(r'^grpc_server_handled_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$')


def server_handled(metrics_port: int, method: str) -> dict[str, float]:
    """grpc_server_handled_total for `method` by grpc_code (empty dict if unreachable)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    counts: dict[str, float] = {}
    for line in text.splitlines():
        m = _HANDLED.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group("labels")))
        if labels.get("grpc_method") == method:
            code = labels.get("grpc_code", "?")
            counts[code] = counts.get(code, 0.0) + float(m.group("value"))
    return counts


# ---------------------------------------------------------------------------------------
# Results


@dataclass
class Result:
    transport: str
    client: str
    concurrency: int
    duration_s: float
    requests: int
    errors: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    error_detail: dict[str, int] = field(default_factory=dict)
    cpu_cores: dict[str, float] = field(default_factory=dict)
    cpu_us_per_request: dict[str, float] = field(default_factory=dict)
    server_handled: dict[str, int] = field(default_factory=dict)
    fallback: bool = False
    note: str = ""

    @property
    def rps(self) -> float:
        return self.requests / self.duration_s if self.duration_s > 0 else 0.0


def percentile(sorted_values: Sequence[int], p: float) -> float:
    """Nearest-rank percentile of an ascending sequence."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return float(sorted_values[rank - 1])


def latency_stats_us(latencies_us: list[int]) -> dict[str, float]:
    values = sorted(latencies_us)
    return {
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "mean": sum(values) / len(values) if values else math.nan,
        "max": float(values[-1]) if values else math.nan,
    }


@dataclass
class Measured:
    """What one load generator run returns before CPU and server counts are attached."""

    requests: int
    errors: int
    duration_s: float
    lat_us: dict[str, float]
    error_detail: dict[str, int]
    client_cpu_s: float


# ---------------------------------------------------------------------------------------
# Load generators in C: wrk (HTTP/1.1 JSON) and h2load (gRPC over h2c)


def tool_version(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return "?"
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0] if text else "?"


def run_wrk(
    url: str, concurrency: int, duration: int, workdir: Path, *, threads: int
) -> Measured:
    script = workdir / "report.lua"
    script.write_text(WRK_LUA)
    cmd = [
        "wrk",
        f"-t{min(threads, concurrency)}",
        f"-c{concurrency}",
        f"-d{duration}s",
        "--timeout",
        f"{GRPC_TIMEOUT_S:g}s",
        "-s",
        str(script),
        url,
    ]
    before = children_cpu_s()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60, check=False)
    client_cpu = children_cpu_s() - before
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("BENCH_JSON ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    data = json.loads(line.removeprefix("BENCH_JSON "))
    detail = {k: int(data[k]) for k in ("connect", "read", "write", "status", "timeout")}
    return Measured(
        requests=int(data["requests"]),
        errors=sum(detail.values()),
        duration_s=data["duration_us"] / 1e6,
        lat_us={k: float(data[k]) for k in ("p50", "p95", "p99", "mean", "max")},
        error_detail={k: v for k, v in detail.items() if v},
        client_cpu_s=client_cpu,
    )


def run_h2load(
    url: str, concurrency: int, duration: int, workdir: Path, *, connections: int
) -> Measured:
    conns = max(1, min(connections, concurrency))
    streams = math.ceil(concurrency / conns)
    body = workdir / "grpc-request.bin"
    body.write_bytes(EMPTY_GRPC_FRAME)
    log = workdir / "h2load.log"
    log.unlink(missing_ok=True)
    cmd = [
        "h2load",
        "-D",
        str(duration),
        "-t",
        "1",
        "-c",
        str(conns),
        "-m",
        str(streams),
        "-d",
        str(body),
        "-H",
        "content-type: application/grpc",
        "-H",
        "te: trailers",
        "-H",
        f"grpc-timeout: {round(GRPC_TIMEOUT_S * 1000)}m",
        f"--log-file={log}",
        url,
    ]
    before = children_cpu_s()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60, check=False)
    client_cpu = children_cpu_s() - before
    if out.returncode != 0 or not log.exists():
        raise RuntimeError(f"h2load failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    latencies: list[int] = []
    bad_status = 0
    for ln in log.read_text().splitlines():
        _start, status, lat = ln.split("\t")
        if status != "200":
            bad_status += 1
        latencies.append(int(lat))
    m = re.search(r"(\d+) failed, (\d+) errored, (\d+) timeout", out.stdout)
    # h2load's "failed" (no 2xx answer) are the non-200 lines already counted above.
    _failed, errored, timeouts = (int(g) for g in m.groups()) if m else (0, 0, 0)
    detail = {"http_status": bad_status, "errored": errored, "timeout": timeouts}
    return Measured(
        requests=len(latencies),
        errors=sum(detail.values()),
        duration_s=float(duration),
        lat_us=latency_stats_us(latencies),
        error_detail={k: v for k, v in detail.items() if v},
        client_cpu_s=client_cpu,
    )


# ---------------------------------------------------------------------------------------
# Load generators in Python: grpc.aio, and an asyncio HTTP/1.1 client (fallback for wrk)
#
# Each worker process runs `tasks` closed loops on one event loop (one channel, or one
# keep-alive connection per loop for HTTP), warms up, then all workers and the parent meet
# at a barrier, measure for `duration` seconds and meet again, so the parent reads CPU
# counters exactly around the measured window.


async def _grpc_loops(target: str, rpc: Rpc, tasks: int, seconds: float, lat: array) -> dict:
    import grpc
    from visior.toolsproxy.v1 import toolsproxy_pb2, toolsproxy_pb2_grpc

    errors: dict[str, int] = {}
    channel = _worker_state.get("channel")
    if channel is None:
        channel = grpc.aio.insecure_channel(target)
        _worker_state["channel"] = channel
    stub = toolsproxy_pb2_grpc.ToolsProxyServiceStub(channel)
    call = getattr(stub, rpc.stub_method)
    request = getattr(toolsproxy_pb2, rpc.request_type)()
    deadline = time.perf_counter() + seconds
    clock = time.perf_counter_ns

    async def loop() -> None:
        while time.perf_counter() < deadline:
            t0 = clock()
            try:
                await call(request, timeout=GRPC_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                key = exc.code().name
                errors[key] = errors.get(key, 0) + 1
                continue
            lat.append((clock() - t0) // 1000)

    await asyncio.gather(*(loop() for _ in range(tasks)))
    return errors


async def _http_loops(target: str, rpc: Rpc, tasks: int, seconds: float, lat: array) -> dict:
    host, port = target.rsplit(":", 1)
    request = f"GET {rpc.http_path} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode()
    errors: dict[str, int] = {}
    deadline = time.perf_counter() + seconds
    clock = time.perf_counter_ns

    def count(key: str) -> None:
        errors[key] = errors.get(key, 0) + 1

    async def loop() -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while time.perf_counter() < deadline:
                t0 = clock()
                try:
                    writer.write(request)
                    head = await reader.readuntil(b"\r\n\r\n")
                    status = int(head.split(b" ", 2)[1])
                    length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))  # type: ignore[union-attr]
                    await reader.readexactly(length)
                except (OSError, asyncio.IncompleteReadError, AttributeError, ValueError):
                    count("connection")
                    writer.close()
                    reader, writer = await asyncio.open_connection(host, int(port))
                    continue
                if status != 200:
                    count(f"http_{status}")
                    continue
                lat.append((clock() - t0) // 1000)
        finally:
            writer.close()

    await asyncio.gather(*(loop() for _ in range(tasks)))
    return errors


_worker_state: dict[str, Any] = {}


def _worker(
    kind: str,
    target: str,
    rpc_name: str,
    tasks: int,
    warmup: float,
    duration: float,
    start: Any,
    stop: Any,
    conn: Any,
) -> None:
    sys.path.insert(0, str(REPO_ROOT))
    rpc = RPCS[rpc_name]
    loops = _grpc_loops if kind == "grpc" else _http_loops

    async def main() -> tuple[array, dict]:
        if warmup > 0:
            await loops(target, rpc, tasks, warmup, array("q"))
        await asyncio.to_thread(start.wait)
        lat = array("q")
        errors = await loops(target, rpc, tasks, duration, lat)
        await asyncio.to_thread(stop.wait)
        channel = _worker_state.pop("channel", None)
        if channel is not None:
            await channel.close()
        return lat, errors

    lat, errors = asyncio.run(main())
    conn.send((lat.tobytes(), errors))
    conn.close()


def run_python(
    kind: str,
    target: str,
    rpc: Rpc,
    concurrency: int,
    duration: int,
    warmup: int,
    *,
    processes: int,
    on_start: Callable[[], None],
) -> Measured:
    """Closed loops in `processes` spawned workers; `on_start` runs when measuring starts."""
    ctx = mp.get_context("spawn")  # the parent has used grpc already: no fork
    nproc = max(1, min(processes, concurrency))
    shares = [concurrency // nproc + (1 if i < concurrency % nproc else 0) for i in range(nproc)]
    start, stop = ctx.Barrier(nproc + 1), ctx.Barrier(nproc + 1)
    pipes, procs = [], []
    for share in shares:
        parent_end, child_end = ctx.Pipe(duplex=False)
        p = ctx.Process(
            target=_worker,
            args=(kind, target, rpc.name, share, warmup, duration, start, stop, child_end),
            daemon=True,
        )
        p.start()
        child_end.close()
        pipes.append(parent_end)
        procs.append(p)
    try:
        start.wait(timeout=warmup + 60)
        on_start()
        cpu0 = sum(proc_cpu_s(p.pid) for p in procs if p.pid)
        t0 = time.perf_counter()
        stop.wait(timeout=duration + 60)
        elapsed = time.perf_counter() - t0
        cpu1 = sum(proc_cpu_s(p.pid) for p in procs if p.pid)
        latencies: list[int] = []
        errors: dict[str, int] = {}
        for pipe in pipes:
            raw, errs = pipe.recv()
            latencies.extend(array("q", raw))
            for k, v in errs.items():
                errors[k] = errors.get(k, 0) + v
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return Measured(
        requests=len(latencies),
        errors=sum(errors.values()),
        duration_s=elapsed,
        lat_us=latency_stats_us(latencies),
        error_detail=errors,
        client_cpu_s=cpu1 - cpu0,
    )


# ---------------------------------------------------------------------------------------
# The benchmark


@dataclass
class Scenario:
    transport: str
    client: str
    fallback: bool
    note: str
    # (concurrency, duration) -> Measured; `warm` is the same call for the warm-up seconds.
    run: Callable[[int, int, Callable[[], None]], Measured]
    separate_warmup: bool


def build_scenarios(args: argparse.Namespace, mesh: Any, rpc: Rpc, workdir: Path) -> list[Scenario]:
    grpc_target = f"127.0.0.1:{mesh.ports.grpc[SERVICE_KEY]}"
    http_target = f"127.0.0.1:{mesh.ports.http[SERVICE_KEY]}"
    have_wrk = shutil.which("wrk") is not None and args.json_client in ("auto", "wrk")
    have_h2load = shutil.which("h2load") is not None and args.grpc_client in ("auto", "h2load")
    if args.json_client == "wrk" and not have_wrk:
        sys.exit("wrk not found: apt-get install -y wrk")
    if args.grpc_client == "h2load" and not have_h2load:
        sys.exit("h2load not found: apt-get install -y nghttp2-client")
    procs = args.py_procs
    scenarios: list[Scenario] = []
    for transport in args.transports:
        if transport == "grpc" and have_h2load:
            scenarios.append(
                Scenario(
                    "grpc",
                    f"h2load {tool_version(['h2load', '--version']).split('/')[-1]} "
                    f"(h2c, {args.grpc_connections} conn)",
                    False,
                    "",
                    lambda c, d, on_start: _timed(
                        on_start,
                        lambda: run_h2load(
                            f"http://{grpc_target}{rpc.grpc_method}",
                            c,
                            d,
                            workdir,
                            connections=args.grpc_connections,
                        ),
                    ),
                    True,
                )
            )
        elif transport == "grpc":
            why = "h2load not found (apt-get install -y nghttp2-client)"
            scenarios.append(
                Scenario(
                    "grpc",
                    f"FALLBACK python grpc.aio x{procs}",
                    True,
                    why,
                    lambda c, d, on_start: run_python(
                        "grpc", grpc_target, rpc, c, d, args.warmup, processes=procs,
                        on_start=on_start,
                    ),  # fmt: skip
                    False,
                )
            )
        elif transport == "json" and have_wrk:
            scenarios.append(
                Scenario(
                    "json",
                    f"wrk {tool_version(['wrk', '-v']).split()[1]} (HTTP/1.1 keep-alive)",
                    False,
                    "",
                    lambda c, d, on_start: _timed(
                        on_start,
                        lambda: run_wrk(
                            f"http://{http_target}{rpc.http_path}",
                            c,
                            d,
                            workdir,
                            threads=args.wrk_threads,
                        ),
                    ),
                    True,
                )
            )
        elif transport == "json":
            why = "wrk not found (apt-get install -y wrk)"
            scenarios.append(
                Scenario(
                    "json",
                    f"FALLBACK python asyncio HTTP/1.1 x{procs}",
                    True,
                    why,
                    lambda c, d, on_start: run_python(
                        "http", http_target, rpc, c, d, args.warmup, processes=procs,
                        on_start=on_start,
                    ),  # fmt: skip
                    False,
                )
            )
        elif transport == "grpc-py":
            scenarios.append(
                Scenario(
                    "grpc-py",
                    f"python grpc.aio x{procs}",
                    False,
                    "",
                    lambda c, d, on_start: run_python(
                        "grpc", grpc_target, rpc, c, d, args.warmup, processes=procs,
                        on_start=on_start,
                    ),  # fmt: skip
                    False,
                )
            )
    return scenarios


def _timed(on_start: Callable[[], None], fn: Callable[[], Measured]) -> Measured:
    on_start()
    return fn()


def measure(
    scenario: Scenario, concurrency: int, args: argparse.Namespace, mesh: Any, rpc: Rpc
) -> Result:
    pids = mesh.pids()
    server_pid, envoy_pid = pids[SERVICE_KEY], pids["envoy"]
    metrics_port = mesh.ports.metrics[SERVICE_KEY]
    method = rpc.grpc_method.rsplit("/", 1)[1]
    if scenario.separate_warmup and args.warmup > 0:
        scenario.run(concurrency, args.warmup, lambda: None)
    time.sleep(args.pause)
    marks: dict[str, Any] = {}

    def on_start() -> None:
        marks["handled"] = server_handled(metrics_port, method)
        marks["cpu"] = CpuSample.take(server_pid, envoy_pid)
        marks["t"] = time.perf_counter()

    m = scenario.run(concurrency, args.duration, on_start)
    cpu1 = CpuSample.take(server_pid, envoy_pid)
    wall = time.perf_counter() - marks["t"]
    handled1 = server_handled(metrics_port, method)
    cpu0: CpuSample = marks["cpu"]
    used = {
        "server": cpu1.server - cpu0.server,
        "envoy": cpu1.envoy - cpu0.envoy,
        "client": m.client_cpu_s,
        "machine": cpu1.machine - cpu0.machine,
    }
    # Everything else on the machine: the idle services, this script, other people's jobs.
    used["other"] = max(0.0, used["machine"] - used["server"] - used["envoy"] - used["client"])
    if scenario.transport != "json":
        used["envoy"] = 0.0  # no traffic went through it; its idle ticks belong to "other"
    handled0 = marks["handled"]
    delta = {k: int(v - handled0.get(k, 0.0)) for k, v in handled1.items()}
    delta = {k: v for k, v in delta.items() if v}
    n = max(m.requests, 1)
    return Result(
        transport=scenario.transport,
        client=scenario.client,
        concurrency=concurrency,
        duration_s=round(m.duration_s, 3),
        requests=m.requests,
        errors=m.errors,
        p50_ms=m.lat_us["p50"] / 1000,
        p95_ms=m.lat_us["p95"] / 1000,
        p99_ms=m.lat_us["p99"] / 1000,
        mean_ms=m.lat_us["mean"] / 1000,
        max_ms=m.lat_us["max"] / 1000,
        error_detail=m.error_detail,
        cpu_cores={k: round(v / wall, 3) for k, v in used.items()},
        cpu_us_per_request={
            k: round(used[k] / n * 1e6, 1) for k in ("server", "envoy", "client")
        },
        server_handled=delta,
        fallback=scenario.fallback,
        note=scenario.note,
    )


# ---------------------------------------------------------------------------------------
# Report


def format_table(results: list[Result]) -> str:
    head = (
        f"{'transport':<8} {'c':>3} {'requests':>8} {'RPS':>7} {'p50 ms':>7} {'p95 ms':>7} "
        f"{'p99 ms':>7} {'err':>4}  {'cores srv/envoy/client/other':<28} "
        f"{'CPU us/req srv/envoy':<20}  client"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        c = r.cpu_cores
        u = r.cpu_us_per_request
        cores = f"{c['server']:.2f}/{c['envoy']:.2f}/{c['client']:.2f}/{c['other']:.2f}"
        per = f"{u['server']:.0f}/{u['envoy']:.0f}" if r.transport == "json" else f"{u['server']:.0f}/-"
        lines.append(
            f"{r.transport:<8} {r.concurrency:>3} {r.requests:>8} {r.rps:>7.0f} {r.p50_ms:>7.3f} "
            f"{r.p95_ms:>7.3f} {r.p99_ms:>7.3f} {r.errors:>4}  {cores:<28} {per:<20}  {r.client}"
        )
    return "\n".join(lines)


def verdicts(results: list[Result], args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    by = {(r.transport, r.concurrency): r for r in results}
    summary: dict[str, Any] = {}
    lines: list[str] = []
    low, high = min(args.concurrency), max(args.concurrency)
    g, j = by.get(("grpc", low)), by.get(("json", low))
    if g and j:
        overhead = j.p50_ms - g.p50_ms
        ok = overhead <= args.target_overhead_ms
        summary["envoy_overhead_p50_ms"] = round(overhead, 3)
        summary["envoy_overhead_ok"] = ok
        lines.append(
            f"Envoy overhead at c={low}: JSON p50 {j.p50_ms:.3f} - gRPC p50 {g.p50_ms:.3f} = "
            f"{overhead:+.3f} ms (target <= {args.target_overhead_ms:g}): "
            f"{'PASS' if ok else 'MISS'}"
        )
        p = by.get(("grpc-py", low))
        if p:
            summary["json_minus_python_grpc_p50_ms"] = round(j.p50_ms - p.p50_ms, 3)
            lines.append(
                f"  (for reference, JSON p50 - Python grpc.aio p50 at c={low}: "
                f"{j.p50_ms - p.p50_ms:+.3f} ms; that client is slower than the server)"
            )
    j = by.get(("json", high))
    if j:
        ok = j.rps >= args.target_rps
        summary["json_rps"] = round(j.rps, 1)
        summary["json_rps_ok"] = ok
        lines.append(
            f"JSON through Envoy at c={high}: {j.rps:.0f} RPS (target >= {args.target_rps:g}): "
            f"{'PASS' if ok else 'MISS'}"
        )
        g = by.get(("grpc", high))
        if g:
            lines.append(
                f"  direct gRPC at c={high}: {g.rps:.0f} RPS; server CPU per request "
                f"{g.cpu_us_per_request['server']:.0f} us direct vs "
                f"{j.cpu_us_per_request['server']:.0f} us behind Envoy, Envoy "
                f"{j.cpu_us_per_request['envoy']:.0f} us"
            )
    for r in results:
        expected = r.requests
        ok_count = r.server_handled.get("OK", 0)
        bad = {k: v for k, v in r.server_handled.items() if k != "OK"}
        if bad:
            lines.append(f"WARNING {r.transport} c={r.concurrency}: server answered {bad}")
        # The server may finish up to `c` requests the client stopped waiting for.
        if ok_count < expected or ok_count > expected + r.concurrency + 2:
            lines.append(
                f"WARNING {r.transport} c={r.concurrency}: client counted {expected} "
                f"successes, server {ok_count} OK"
            )
        if r.cpu_cores.get("other", 0.0) > args.busy_threshold:
            lines.append(
                f"WARNING {r.transport} c={r.concurrency}: other processes used "
                f"{r.cpu_cores['other']:.2f} cores during the run; figures may be skewed"
            )
        if r.fallback:
            lines.append(f"NOTE {r.transport}: {r.client} because {r.note}")
    return summary, lines


def environment_info() -> dict[str, Any]:
    import grpc

    from services.devtools.envoy import envoy_binary

    return {
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "envoy": tool_version([envoy_binary(), "--version"]).split("version:")[-1].strip(),
        "wrk": tool_version(["wrk", "-v"]) if shutil.which("wrk") else None,
        "h2load": tool_version(["h2load", "--version"]) if shutil.which("h2load") else None,
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    today = dt.datetime.now().strftime("%Y-%m-%d-%H%M%S")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=int, default=10, help="measured seconds per run (10)")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up seconds before each run (2)")
    ap.add_argument("--pause", type=float, default=0.5, help="idle seconds between runs (0.5)")
    ap.add_argument(
        "--concurrency",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 32],
        help="comma-separated in-flight request counts (1,32)",
    )
    ap.add_argument(
        "--transports",
        type=lambda s: s.split(","),
        default=["grpc", "json", "grpc-py"],
        help="comma-separated subset of grpc,json,grpc-py (all)",
    )
    ap.add_argument("--rpc", choices=sorted(RPCS), default="health", help="RPC under test")
    ap.add_argument("--envoy-concurrency", type=int, default=2, help="Envoy worker threads (2)")
    ap.add_argument("--json-client", choices=["auto", "wrk", "python"], default="auto")
    ap.add_argument("--grpc-client", choices=["auto", "h2load", "python"], default="auto")
    ap.add_argument("--wrk-threads", type=int, default=1, help="wrk -t (1)")
    ap.add_argument(
        "--grpc-connections", type=int, default=1, help="h2load connections; streams = c/conns (1)"
    )
    ap.add_argument("--py-procs", type=int, default=2, help="Python client processes (2)")
    ap.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the servers, e.g. LOG_LEVEL=WARNING (repeatable)",
    )
    ap.add_argument("--target-overhead-ms", type=float, default=0.3)
    ap.add_argument("--target-rps", type=float, default=2000.0)
    ap.add_argument(
        "--busy-threshold", type=float, default=0.25, help="warn above this many other cores"
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=REPO_ROOT / "bench" / "results" / f"transport-{today}.json",
        help="where to write the JSON results (bench/results/transport-<date>.json)",
    )
    args = ap.parse_args(argv)
    unknown = set(args.transports) - {"grpc", "json", "grpc-py"}
    if unknown:
        ap.error(f"unknown transports: {sorted(unknown)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from services.devtools.mesh import Mesh
    from services.devtools.topology import Ports

    rpc = RPCS[args.rpc]
    env = dict(kv.split("=", 1) for kv in args.server_env)
    started = dt.datetime.now(dt.UTC)
    for tool, pkg in (("wrk", "wrk"), ("h2load", "nghttp2-client")):
        if shutil.which(tool) is None:
            print(f"note: {tool} not found (apt-get install -y {pkg}); using the Python fallback")
    with tempfile.TemporaryDirectory(prefix="bench-transport-") as tmp:
        tmpdir = Path(tmp)
        mesh = Mesh(
            Ports.free(),
            tmpdir / "data",
            tmpdir / "run",
            env=env,
            envoy_concurrency=args.envoy_concurrency,
        )
        t = time.perf_counter()
        mesh.start()
        try:
            print(
                f"mesh up in {time.perf_counter() - t:.1f}s; RPC {rpc.grpc_method} "
                f"(JSON: GET {rpc.http_path} on the {SERVICE_KEY} listener); "
                f"{args.duration}s per run after {args.warmup}s warm-up",
                flush=True,
            )
            scenarios = build_scenarios(args, mesh, rpc, tmpdir)
            results: list[Result] = []
            for c in args.concurrency:
                for sc in scenarios:
                    r = measure(sc, c, args, mesh, rpc)
                    results.append(r)
                    print(
                        f"  {r.transport:<8} c={c:<3} {r.rps:7.0f} RPS  p50 {r.p50_ms:.3f} ms  "
                        f"errors {r.errors}",
                        flush=True,
                    )
            alive = mesh.alive()
        finally:
            mesh.stop()
    if not all(alive.values()):
        print(f"WARNING: a server died during the run: {alive}")
    summary, lines = verdicts(results, args)
    print()
    print(format_table(results))
    print()
    print("\n".join(lines))
    record = {
        "benchmark": "transport",
        "started_utc": started.isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "rpc": asdict(rpc),
        "config": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
        },
        "environment": environment_info(),
        "summary": summary,
        "results": [{**asdict(r), "rps": round(r.rps, 1)} for r in results],
        "table": format_table(results),
        "notes": lines,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"\nresults written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
