"""Transport benchmark: one cheap RPC, direct gRPC vs JSON through the Envoy sidecar.

Starts the real mesh (four server processes and Envoy) in this process tree and drives the
tools proxy's GetHealth with closed loops at each concurrency:

  grpc     native gRPC (h2c) straight to the server's gRPC port        h2load, C
  json     JSON through Envoy's listener, transcoded to gRPC            wrk, C, HTTP/1.1
  grpc-py  the same gRPC call from Python grpc.aio client processes     what a Python caller sees

With --breakdown, three more paths through a second, minimal Envoy split the JSON cost into
"one more process hop" and "HTTP routing" and "transcoding":

  grpc-tcp   gRPC through an Envoy tcp_proxy (L4 hop only)
  grpc-h2    gRPC through an Envoy HTTP/2 router, no transcoder (L7 hop)
  json-min   JSON through an Envoy with only the transcoder and router

The measured time of every (path, concurrency) is cut into --rounds slices run in turn
(grpc, json, grpc-py, grpc, json, ...) so that background noise lands on all paths alike;
latencies of the slices are pooled. Prints a table, writes JSON; bench/README.md explains.

    python bench/transport.py [--duration 10] [--concurrency 1,32] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import math
import multiprocessing as mp
import os
import platform
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

SERVICE_KEY = "toolsproxy"
GRPC_SERVICE = "visior.toolsproxy.v1.ToolsProxyService"
GRPC_TIMEOUT_S = 5.0
"""Deadline every gRPC client sends; Envoy puts about the same (5.25 s) on /health."""


@dataclass(frozen=True)
class Rpc:
    """The RPC under test: its gRPC method and its JSON route on the service's listener."""

    name: str
    method: str
    http_path: str
    request_type: str

    @property
    def grpc_path(self) -> str:
        return f"/{GRPC_SERVICE}/{self.method}"


RPCS = {
    # Trivial handler (a three-field message), the full interceptor stack, 90-byte JSON body:
    # what is measured is transport and interceptors, not the handler.
    "health": Rpc("health", "GetHealth", "/health", "GetHealthRequest"),
    # Builds three google.protobuf.Struct schemas per call (~1.2 KB of JSON): adds Struct
    # building in Python and Struct -> JSON in the transcoder.
    "tools": Rpc("tools", "ListTools", "/internal/mcp/tools", "ListToolsRequest"),
}

# Both RPCs take an empty request: one gRPC frame is a 0 flag byte and a 0 length.
EMPTY_GRPC_FRAME = b"\x00\x00\x00\x00\x00"

# wrk applies a coordinated-omission "correction" to its histogram before done() runs
# (stats_correct: every sample above 2x the mean interval adds synthetic samples), so its
# percentiles are not the raw ones h2load and the Python client report. The script dumps the
# corrected histogram; `wrk_raw_histogram` undoes the correction exactly.
WRK_LUA = """\
done = function(summary, latency, requests)
  local e = summary.errors
  local parts = {}
  for i = 1, #latency do
    local v, c = latency(i)
    parts[#parts + 1] = string.format("%d:%d", v, c)
  end
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,' ..
    '"status":%d,"timeout":%d,"p50":%.1f,"p95":%.1f,"p99":%.1f,"hist":"%s"}\\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(95), latency:percentile(99),
    table.concat(parts, ",")))
end
"""

TRANSPORTS = ("grpc", "json", "grpc-py", "grpc-tcp", "grpc-h2", "json-min")
BREAKDOWN = ("grpc-tcp", "grpc-h2", "json-min")


# ---------------------------------------------------------------------------------------
# CPU accounting from /proc (no psutil)

CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int | None) -> float:
    """utime + stime of a process (all its threads), in seconds; 0 if it is gone."""
    if not pid:
        return 0.0
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_cpu_s() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine, all cores, from /proc/stat.

    busy is user+nice+system+irq+softirq; steal is time the hypervisor gave the vCPUs to
    someone else (a noisy neighbour outside this machine)."""
    parts = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(p) for p in parts[:8])
    return (user + nice + system + irq + softirq) / CLK_TCK, steal / CLK_TCK


def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


# ---------------------------------------------------------------------------------------
# Server-side truth: the service's own Prometheus counter of handled RPCs by status code

_HANDLED = re.compile(r"^grpc_server_handled_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$")


def server_handled(metrics_port: int, method: str) -> dict[str, float]:
    """grpc_server_handled_total for `method` by grpc_code (empty if unreachable)."""
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
# Latency statistics


def percentile(sorted_values: Sequence[int], p: float) -> float:
    """Nearest-rank percentile of an ascending sequence."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return float(sorted_values[rank - 1])


def wrk_raw_histogram(hist: dict[int, int], duration_us: int, requests: int, conns: int) -> dict:
    """Undo wrk's stats_correct(): raw[m] = H[m] - H[m + e] for m > e, with
    e = duration_us / (requests / connections) in wrk's integer arithmetic."""
    per_conn = requests // conns
    if per_conn == 0:
        return dict(hist)
    e = duration_us // per_conn
    return {m: (n - hist.get(m + e, 0) if m > e else n) for m, n in hist.items()}


@dataclass
class Slice:
    """One run of a load generator: raw latencies in microseconds and what it counted."""

    latencies_us: list[int]
    requests: int
    errors: dict[str, int]
    wall_s: float
    client_cpu_s: float
    note: str = ""


# ---------------------------------------------------------------------------------------
# Load generators. Each: start() warms up, run(seconds) -> Slice, close().


def tool_version(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return "?"
    lines = (out.stdout or out.stderr).strip().splitlines()
    return lines[0] if lines else "?"


class Wrk:
    """wrk, one thread, `c` HTTP/1.1 keep-alive connections, GET `url`."""

    def __init__(self, url: str, concurrency: int, workdir: Path, warmup: int) -> None:
        self.url, self.c, self.warmup = url, concurrency, warmup
        self.script = workdir / "wrk-report.lua"
        self.script.write_text(WRK_LUA)

    @staticmethod
    def label() -> str:
        return f"wrk {tool_version(['wrk', '-v']).split()[1]} HTTP/1.1 keep-alive"

    def start(self) -> None:
        if self.warmup > 0:
            self.run(self.warmup)

    def run(self, seconds: int) -> Slice:
        cmd = ["wrk", "-t1", f"-c{self.c}", f"-d{seconds}s", "--timeout", "5s"]
        cmd += ["-s", str(self.script), self.url]
        before = children_cpu_s()
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60, check=False)
        cpu = children_cpu_s() - before
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("BENCH_JSON ")), None)
        if out.returncode != 0 or line is None:
            raise RuntimeError(f"wrk failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
        data = json.loads(line.removeprefix("BENCH_JSON "))
        hist = {int(v): int(n) for v, n in (p.split(":") for p in data["hist"].split(",") if p)}
        raw = wrk_raw_histogram(hist, data["duration_us"], data["requests"], self.c)
        note = ""
        if sum(raw.values()) != data["requests"] or min(raw.values(), default=0) < 0:
            # The inversion did not add up: keep wrk's own (corrected) histogram, say so.
            raw, note = hist, "wrk histogram kept corrected (inversion did not add up)"
        latencies = [v for v, n in sorted(raw.items()) for _ in range(n)]
        errors = {k: int(data[k]) for k in ("connect", "read", "write", "status", "timeout")}
        return Slice(
            latencies,
            data["requests"],
            {k: v for k, v in errors.items() if v},
            data["duration_us"] / 1e6,
            cpu,
            note,
        )

    def close(self) -> None:
        pass


class H2load:
    """h2load speaking gRPC's wire format over h2c: `conns` connections, c/conns streams each."""

    def __init__(
        self, url: str, concurrency: int, workdir: Path, warmup: int, connections: int
    ) -> None:
        self.url, self.warmup = url, warmup
        self.conns = max(1, min(connections, concurrency))
        self.streams = math.ceil(concurrency / self.conns)
        self.body = workdir / "grpc-request.bin"
        self.body.write_bytes(EMPTY_GRPC_FRAME)
        self.log = workdir / "h2load.log"

    @staticmethod
    def label(connections: int) -> str:
        version = tool_version(["h2load", "--version"]).split("/")[-1]
        return f"h2load {version} gRPC/h2c, {connections} conn"

    def start(self) -> None:
        if self.warmup > 0:
            self.run(self.warmup)

    def run(self, seconds: int) -> Slice:
        self.log.unlink(missing_ok=True)  # h2load appends to its log file
        cmd = ["h2load", "-D", str(seconds), "-t", "1", "-c", str(self.conns)]
        cmd += ["-m", str(self.streams), "-d", str(self.body)]
        for header in (
            "content-type: application/grpc",
            "te: trailers",
            f"grpc-timeout: {round(GRPC_TIMEOUT_S * 1000)}m",
        ):
            cmd += ["-H", header]
        cmd += [f"--log-file={self.log}", self.url]
        before = children_cpu_s()
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60, check=False)
        cpu = children_cpu_s() - before
        if out.returncode != 0 or not self.log.exists():
            raise RuntimeError(f"h2load failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
        latencies: list[int] = []
        bad_status = 0
        for ln in self.log.read_text().splitlines():
            _start, status, lat = ln.split("\t")
            bad_status += status != "200"
            latencies.append(int(lat))
        latencies.sort()
        # h2load checks the HTTP status only; grpc-status is checked against the server's
        # own counters (see `verify`). Its "failed" are the non-200 lines counted above.
        m = re.search(r"(\d+) failed, (\d+) errored, (\d+) timeout", out.stdout)
        _failed, errored, timeouts = (int(g) for g in m.groups()) if m else (0, 0, 0)
        errors = {"http_status": bad_status, "errored": errored, "timeout": timeouts}
        return Slice(
            latencies,
            len(latencies),
            {k: v for k, v in errors.items() if v},
            float(seconds),
            cpu,
        )

    def close(self) -> None:
        pass


# Python clients. Each worker process runs `tasks` closed loops on one event loop (one
# grpc.aio channel, or one keep-alive connection per loop for HTTP) and waits for "run N"
# commands on its pipe; between commands it is idle, so slices of other paths run undisturbed.


async def _grpc_session(target: str, rpc: Rpc, tasks: int, conn: Any) -> None:
    import grpc
    from visior.toolsproxy.v1 import toolsproxy_pb2, toolsproxy_pb2_grpc

    async with grpc.aio.insecure_channel(target) as channel:
        stub = toolsproxy_pb2_grpc.ToolsProxyServiceStub(channel)
        call = getattr(stub, rpc.method)
        request = getattr(toolsproxy_pb2, rpc.request_type)()

        async def one() -> str | None:
            try:
                await call(request, timeout=GRPC_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                return str(exc.code().name)
            return None

        await _serve_commands(conn, tasks, lambda _i: one)


async def _http_session(target: str, rpc: Rpc, tasks: int, conn: Any) -> None:
    host, port = target.rsplit(":", 1)
    request = f"GET {rpc.http_path} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode()
    streams = [await asyncio.open_connection(host, int(port)) for _ in range(tasks)]

    def make(i: int) -> Any:
        async def one() -> str | None:
            reader, writer = streams[i]
            try:
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head.split(b" ", 2)[1])
                length = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
                await reader.readexactly(int(length.group(1)) if length else 0)
            except (OSError, asyncio.IncompleteReadError, ValueError):
                writer.close()
                streams[i] = await asyncio.open_connection(host, int(port))
                return "connection"
            return None if status == 200 else f"http_{status}"

        return one

    try:
        await _serve_commands(conn, tasks, make)
    finally:
        for _, writer in streams:
            writer.close()


async def _serve_commands(conn: Any, tasks: int, make: Any) -> None:
    loop = asyncio.get_running_loop()
    clock = time.perf_counter_ns
    calls = [make(i) for i in range(tasks)]
    conn.send("ready")
    while True:
        seconds = await loop.run_in_executor(None, conn.recv)
        if seconds is None:
            return
        lat: array = array("q")
        errors: dict[str, int] = {}
        stop_at = time.perf_counter() + seconds

        async def closed_loop(
            one: Any, lat: array = lat, errors: dict = errors, stop_at: float = stop_at
        ) -> None:
            while time.perf_counter() < stop_at:
                t0 = clock()
                err = await one()
                if err is None:
                    lat.append((clock() - t0) // 1000)
                else:
                    errors[err] = errors.get(err, 0) + 1

        t0 = time.perf_counter()
        await asyncio.gather(*(closed_loop(one) for one in calls))
        conn.send(("done", time.perf_counter() - t0))
        conn.send((lat.tobytes(), errors))


def _worker(kind: str, target: str, rpc_name: str, tasks: int, conn: Any) -> None:
    sys.path.insert(0, str(REPO_ROOT))
    session = _grpc_session if kind == "grpc" else _http_session
    asyncio.run(session(target, RPCS[rpc_name], tasks, conn))


class PythonClient:
    """`procs` spawned worker processes sharing `c` closed loops."""

    def __init__(
        self, kind: str, target: str, rpc: Rpc, concurrency: int, warmup: int, procs: int
    ) -> None:
        self.kind, self.target, self.rpc, self.warmup = kind, target, rpc, warmup
        n = max(1, min(procs, concurrency))
        self.shares = [concurrency // n + (1 if i < concurrency % n else 0) for i in range(n)]
        self.procs: list[Any] = []
        self.pipes: list[Any] = []

    @staticmethod
    def label(kind: str, procs: int) -> str:
        what = "grpc.aio" if kind == "grpc" else "asyncio HTTP/1.1"
        return f"python {what}, {procs} proc"

    def start(self) -> None:
        ctx = mp.get_context("spawn")  # the parent has used grpc already: never fork
        for share in self.shares:
            parent_end, child_end = ctx.Pipe()
            p = ctx.Process(
                target=_worker,
                args=(self.kind, self.target, self.rpc.name, share, child_end),
                daemon=True,
            )
            p.start()
            child_end.close()
            self.procs.append(p)
            self.pipes.append(parent_end)
        for pipe in self.pipes:
            if not pipe.poll(60) or pipe.recv() != "ready":
                raise RuntimeError("a Python load worker did not start")
        if self.warmup > 0:
            self.run(self.warmup)

    def run(self, seconds: int) -> Slice:
        cpu0 = sum(proc_cpu_s(p.pid) for p in self.procs)
        t0 = time.perf_counter()
        for pipe in self.pipes:
            pipe.send(seconds)
        for pipe in self.pipes:
            if not pipe.poll(seconds + 60):
                raise RuntimeError("a Python load worker did not finish")
            pipe.recv()  # ("done", elapsed): the measured window ends here
        wall = time.perf_counter() - t0
        cpu = sum(proc_cpu_s(p.pid) for p in self.procs) - cpu0
        latencies: list[int] = []
        errors: dict[str, int] = {}
        for pipe in self.pipes:
            raw, errs = pipe.recv()
            latencies.extend(array("q", raw))
            for k, v in errs.items():
                errors[k] = errors.get(k, 0) + v
        latencies.sort()
        return Slice(latencies, len(latencies), errors, wall, cpu)

    def close(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send(None)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        self.procs, self.pipes = [], []


# ---------------------------------------------------------------------------------------
# A second, minimal Envoy for --breakdown: the same hop without the sidecar's filters


def _typed(name: str) -> str:
    return f"type.googleapis.com/{name}"


def probe_envoy_config(server_port: int, ports: dict[str, int], descriptor: Path) -> str:
    import yaml

    def cluster(name: str, h2: bool) -> dict[str, Any]:
        addr = {"socket_address": {"address": "127.0.0.1", "port_value": server_port}}
        c: dict[str, Any] = {
            "name": name,
            "type": "STATIC",
            "connect_timeout": "1s",
            "load_assignment": {
                "cluster_name": name,
                "endpoints": [{"lb_endpoints": [{"endpoint": {"address": addr}}]}],
            },
        }
        if h2:
            opts = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
            c["typed_extension_protocol_options"] = {
                opts: {
                    "@type": _typed(opts),
                    "explicit_http_config": {"http2_protocol_options": {}},
                }
            }
        return c

    def hcm(name: str, filters: list[dict[str, Any]]) -> dict[str, Any]:
        route = {"match": {"prefix": "/"}, "route": {"cluster": "h2", "timeout": "5s"}}
        router = {
            "name": "envoy.filters.http.router",
            "typed_config": {"@type": _typed("envoy.extensions.filters.http.router.v3.Router")},
        }
        return {
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": _typed(
                    "envoy.extensions.filters.network.http_connection_manager.v3."
                    "HttpConnectionManager"
                ),
                "stat_prefix": name,
                "codec_type": "AUTO",
                "route_config": {
                    "virtual_hosts": [{"name": name, "domains": ["*"], "routes": [route]}]
                },
                "http_filters": [*filters, router],
            },
        }

    transcoder = {
        "name": "envoy.filters.http.grpc_json_transcoder",
        "typed_config": {
            "@type": _typed(
                "envoy.extensions.filters.http.grpc_json_transcoder.v3.GrpcJsonTranscoder"
            ),
            "proto_descriptor": str(descriptor),
            "services": [GRPC_SERVICE],
            "convert_grpc_status": True,
            "print_options": {
                "add_whitespace": False,
                "preserve_proto_field_names": True,
                "always_print_primitive_fields": True,
            },
        },
    }
    tcp = {
        "name": "envoy.filters.network.tcp_proxy",
        "typed_config": {
            "@type": _typed("envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy"),
            "stat_prefix": "tcp",
            "cluster": "tcp",
        },
    }
    chains = {"grpc-tcp": tcp, "grpc-h2": hcm("h2", []), "json-min": hcm("json", [transcoder])}
    listeners = [
        {
            "name": key,
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": ports[key]}},
            "filter_chains": [{"filters": [chain]}],
        }
        for key, chain in chains.items()
    ]
    config = {
        "admin": {
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": ports["admin"]}}
        },
        "static_resources": {
            "listeners": listeners,
            "clusters": [cluster("tcp", h2=False), cluster("h2", h2=True)],
        },
    }
    return yaml.safe_dump(config, sort_keys=False)


# ---------------------------------------------------------------------------------------
# The benchmark


@dataclass
class Target:
    """One way to reach the RPC: which generator, against which address."""

    transport: str
    client: str
    fallback: str
    kind: str  # wrk | h2load | python-grpc | python-http
    url: str
    envoy: str  # which Envoy carries it: "", "sidecar" or "probe"


@dataclass
class Result:
    transport: str
    client: str
    concurrency: int
    requests: int
    seconds: float
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
    slices: list[dict[str, float]] = field(default_factory=list)
    fallback: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0


def plan_paths(args: argparse.Namespace, mesh: Any, rpc: Rpc, probe: dict[str, int]) -> list:
    grpc_addr = f"127.0.0.1:{mesh.ports.grpc[SERVICE_KEY]}"
    http_addr = f"127.0.0.1:{mesh.ports.http[SERVICE_KEY]}"
    have_wrk = shutil.which("wrk") is not None and args.json_client != "python"
    have_h2load = shutil.which("h2load") is not None and args.grpc_client != "python"
    if args.json_client == "wrk" and not have_wrk:
        sys.exit("wrk not found: apt-get install -y wrk")
    if args.grpc_client == "h2load" and not have_h2load:
        sys.exit("h2load not found: apt-get install -y nghttp2-client")

    def why(tool: str, option: str, package: str) -> str:
        if args.__dict__[option] == "python":
            return f"--{option.replace('_', '-')} python"
        return f"{tool} not found (apt-get install -y {package})"

    no_wrk = "" if have_wrk else why("wrk", "json_client", "wrk")
    no_h2 = "" if have_h2load else why("h2load", "grpc_client", "nghttp2-client")
    py_grpc = PythonClient.label("grpc", args.py_procs)
    py_http = PythonClient.label("http", args.py_procs)
    wrk_label = Wrk.label() if have_wrk else f"FALLBACK {py_http}"
    h2_label = H2load.label(args.grpc_connections) if have_h2load else f"FALLBACK {py_grpc}"
    json_kind = "wrk" if have_wrk else "python-http"
    grpc_kind = "h2load" if have_h2load else "python-grpc"

    def grpc_url(addr: str) -> str:
        return f"http://{addr}{rpc.grpc_path}" if have_h2load else addr

    def json_url(addr: str) -> str:
        return f"http://{addr}{rpc.http_path}" if have_wrk else addr

    def addr(transport: str) -> str:
        if transport in BREAKDOWN:
            return f"127.0.0.1:{probe[transport]}"
        return http_addr if transport == "json" else grpc_addr

    def target(transport: str) -> Target:
        envoy = "probe" if transport in BREAKDOWN else "sidecar" if transport == "json" else ""
        if transport == "grpc-py":
            return Target(transport, py_grpc, "", "python-grpc", grpc_addr, envoy)
        if transport.startswith("json"):
            url = json_url(addr(transport))
            return Target(transport, wrk_label, no_wrk, json_kind, url, envoy)
        url = grpc_url(addr(transport))
        return Target(transport, h2_label, no_h2, grpc_kind, url, envoy)

    return [target(t) for t in args.transports]


def make_generator(path: Target, c: int, args: argparse.Namespace, rpc: Rpc, workdir: Path) -> Any:
    sub = workdir / f"{path.transport}-c{c}"
    sub.mkdir(parents=True, exist_ok=True)
    if path.kind == "wrk":
        return Wrk(path.url, c, sub, args.warmup)
    if path.kind == "h2load":
        return H2load(path.url, c, sub, args.warmup, args.grpc_connections)
    kind = "grpc" if path.kind == "python-grpc" else "http"
    return PythonClient(kind, path.url, rpc, c, args.warmup, args.py_procs)


@dataclass
class Pids:
    server: int
    sidecar: int
    probe: int | None


def measure_concurrency(
    paths: list[Target],
    c: int,
    args: argparse.Namespace,
    mesh: Any,
    rpc: Rpc,
    pids: Pids,
    workdir: Path,
) -> list[Result]:
    """Warm each path up, then run `rounds` slices of each in turn; pool per path."""
    metrics_port = mesh.ports.metrics[SERVICE_KEY]
    slice_s = args.duration // args.rounds
    gens = {p.transport: make_generator(p, c, args, rpc, workdir) for p in paths}
    acc: dict[str, dict[str, Any]] = {
        p.transport: {
            "slices": [],
            "cpu": dict.fromkeys(("server", "envoy", "client", "other", "steal"), 0.0),
            "handled": {},
        }
        for p in paths
    }
    try:
        for p in paths:
            gens[p.transport].start()
        for _round in range(args.rounds):
            for p in paths:
                time.sleep(args.pause)
                envoy_pid = {"sidecar": pids.sidecar, "probe": pids.probe}.get(p.envoy)
                h0 = server_handled(metrics_port, rpc.method)
                s0, e0, (m0, st0) = proc_cpu_s(pids.server), proc_cpu_s(envoy_pid), machine_cpu_s()
                sl: Slice = gens[p.transport].run(slice_s)
                s1, e1, (m1, st1) = proc_cpu_s(pids.server), proc_cpu_s(envoy_pid), machine_cpu_s()
                h1 = server_handled(metrics_port, rpc.method)
                a = acc[p.transport]
                a["slices"].append(sl)
                used = {"server": s1 - s0, "envoy": e1 - e0, "client": sl.client_cpu_s}
                # Everything else: the idle services, this script, anyone else's jobs.
                used["other"] = max(0.0, (m1 - m0) - sum(used.values()))
                used["steal"] = st1 - st0
                for k, v in used.items():
                    a["cpu"][k] += v
                for code, v in h1.items():
                    a["handled"][code] = a["handled"].get(code, 0) + int(v - h0.get(code, 0.0))
    finally:
        for g in gens.values():
            g.close()
    return [summarize(p, c, acc[p.transport]) for p in paths]


def summarize(path: Target, c: int, a: dict[str, Any]) -> Result:
    slices: list[Slice] = a["slices"]
    latencies = sorted(v for s in slices for v in s.latencies_us)
    requests = sum(s.requests for s in slices)
    seconds = sum(s.wall_s for s in slices)
    errors: dict[str, int] = {}
    for s in slices:
        for k, v in s.errors.items():
            errors[k] = errors.get(k, 0) + v
    n = max(requests, 1)
    cpu = a["cpu"]
    return Result(
        transport=path.transport,
        client=path.client,
        concurrency=c,
        requests=requests,
        seconds=round(seconds, 3),
        errors=sum(errors.values()),
        p50_ms=percentile(latencies, 50) / 1000,
        p95_ms=percentile(latencies, 95) / 1000,
        p99_ms=percentile(latencies, 99) / 1000,
        mean_ms=round(sum(latencies) / len(latencies) / 1000, 3) if latencies else math.nan,
        max_ms=(latencies[-1] / 1000) if latencies else math.nan,
        error_detail=errors,
        cpu_cores={k: round(v / seconds, 3) for k, v in cpu.items()} if seconds else {},
        cpu_us_per_request={k: round(cpu[k] / n * 1e6, 1) for k in ("server", "envoy", "client")},
        server_handled={k: v for k, v in a["handled"].items() if v},
        slices=[
            {
                "requests": s.requests,
                "seconds": round(s.wall_s, 3),
                "p50_ms": percentile(s.latencies_us, 50) / 1000,
                "p99_ms": percentile(s.latencies_us, 99) / 1000,
            }
            for s in slices
        ],
        fallback=path.fallback,
        notes=sorted({s.note for s in slices if s.note}),
    )


# ---------------------------------------------------------------------------------------
# Report


def format_table(results: list[Result]) -> str:
    head = (
        f"{'path':<8} {'c':>3} {'requests':>8} {'RPS':>6} {'p50 ms':>7} {'p95 ms':>7} "
        f"{'p99 ms':>7} {'err':>3}  {'cores: srv envoy clnt other steal':<33} "
        f"{'us/req: srv envoy':<17}  client"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        c, u = r.cpu_cores, r.cpu_us_per_request
        cores = " ".join(f"{c[k]:.2f}" for k in ("server", "envoy", "client", "other", "steal"))
        envoy = f"{u['envoy']:.0f}" if c["envoy"] > 0.005 else "-"
        per = f"{u['server']:.0f} {envoy}"
        lines.append(
            f"{r.transport:<8} {r.concurrency:>3} {r.requests:>8} {r.rps:>6.0f} {r.p50_ms:>7.3f} "
            f"{r.p95_ms:>7.3f} {r.p99_ms:>7.3f} {r.errors:>3}  {cores:>33} {per:>17}  {r.client}"
        )
    return "\n".join(lines)


def verify(results: list[Result], args: argparse.Namespace) -> list[str]:
    """Cross-checks: the server's own counters, background load, fallbacks."""
    lines = []
    for r in results:
        tag = f"{r.transport} c={r.concurrency}"
        bad = {k: v for k, v in r.server_handled.items() if k != "OK"}
        if bad:
            lines.append(f"WARNING {tag}: the server answered {bad}")
        ok = r.server_handled.get("OK", 0)
        # Per slice the server may finish up to `c` requests the client stopped waiting for.
        slack = (r.concurrency + 1) * args.rounds
        if r.server_handled and not r.requests <= ok <= r.requests + slack:
            lines.append(f"WARNING {tag}: client counted {r.requests} OK, server {ok} OK")
        other, steal = r.cpu_cores.get("other", 0.0), r.cpu_cores.get("steal", 0.0)
        if other > args.busy_threshold or steal > args.busy_threshold / 2:
            lines.append(
                f"WARNING {tag}: other processes used {other:.2f} cores and the hypervisor "
                f"stole {steal:.2f} during the run; its figures may be skewed"
            )
        if r.fallback:
            lines.append(f"NOTE {r.transport}: {r.client} because {r.fallback}")
        lines += [f"NOTE {tag}: {n}" for n in r.notes]
    return list(dict.fromkeys(lines))


def verdicts(results: list[Result], args: argparse.Namespace) -> tuple[dict[str, Any], list]:
    by = {(r.transport, r.concurrency): r for r in results}
    summary: dict[str, Any] = {}
    lines: list[str] = []
    low, high = min(args.concurrency), max(args.concurrency)
    g, j = by.get(("grpc", low)), by.get(("json", low))
    if g and j:
        overhead = j.p50_ms - g.p50_ms
        ok = overhead <= args.target_overhead_ms
        per_round = [
            round(js["p50_ms"] - gs["p50_ms"], 3) for gs, js in zip(g.slices, j.slices, strict=True)
        ]
        summary |= {
            "envoy_overhead_p50_ms": round(overhead, 3),
            "envoy_overhead_per_round_ms": per_round,
            "envoy_overhead_ok": ok,
        }
        verdict = "PASS" if ok else "MISS"
        if g.fallback or j.fallback:
            # A Python client's own cost swamps the hop: the difference means nothing.
            verdict, summary["envoy_overhead_ok"] = "NOT COMPARABLE (fallback client)", None
        lines.append(
            f"Envoy overhead at c={low}: JSON p50 {j.p50_ms:.3f} - gRPC p50 {g.p50_ms:.3f} = "
            f"{overhead:+.3f} ms (target <= {args.target_overhead_ms:g}): {verdict}"
        )
        if len(per_round) > 1:
            lines.append(
                f"  per round: {', '.join(f'{x:+.3f}' for x in per_round)} "
                f"(median {statistics.median(per_round):+.3f})"
            )
        p = by.get(("grpc-py", low))
        if p:
            lines.append(
                f"  for reference, JSON p50 - Python grpc.aio client p50 = "
                f"{j.p50_ms - p.p50_ms:+.3f} ms"
            )
        steps = {t: r.p50_ms - g.p50_ms for t in BREAKDOWN if (r := by.get((t, low)))}
        if len(steps) == len(BREAKDOWN):
            summary["breakdown_p50_over_grpc_ms"] = {k: round(v, 3) for k, v in steps.items()}
            lines.append(
                f"  breakdown at c={low} (p50 over direct gRPC): L4 hop "
                f"{steps['grpc-tcp']:+.3f}, L7 h2 router {steps['grpc-h2']:+.3f}, "
                f"JSON min {steps['json-min']:+.3f}, JSON sidecar {overhead:+.3f} ms"
            )
    j = by.get(("json", high)) if high > low else None
    if j:
        ok = j.rps >= args.target_rps
        summary |= {"json_rps": round(j.rps, 1), "json_rps_ok": ok}
        verdict = "PASS" if ok else "MISS"
        if j.fallback:
            verdict += " (fallback client: it takes CPU from the server, so a lower bound)"
        lines.append(
            f"JSON through Envoy at c={high}: {j.rps:.0f} RPS (target >= {args.target_rps:g}): "
            f"{verdict}"
        )
        g = by.get(("grpc", high))
        if g:
            summary["grpc_rps"] = round(g.rps, 1)
            lines.append(
                f"  direct gRPC at c={high}: {g.rps:.0f} RPS. CPU per request: server "
                f"{g.cpu_us_per_request['server']:.0f} us direct, "
                f"{j.cpu_us_per_request['server']:.0f} us behind Envoy; Envoy "
                f"{j.cpu_us_per_request['envoy']:.0f} us"
            )
    return summary, lines


def write_record(
    benchmark: str, started: Any, args: Any, environment: dict[str, Any], **fields: Any
) -> None:
    """Write a run's JSON record to args.out (every bench's envelope: what ran, when, with
    which arguments on which machine, then `fields`) and say where."""
    record = {
        "benchmark": benchmark,
        "started_utc": started.isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "environment": environment,
        **fields,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2, ensure_ascii=False, default=str) + "\n")
    print(f"\nresults written to {args.out}")


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
    stamp = dt.datetime.now().strftime("%Y-%m-%d-%H%M%S")
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--duration", type=int, default=10, help="measured seconds per path and concurrency (10)"
    )
    ap.add_argument(
        "--rounds", type=int, default=5, help="slices the duration is cut into, interleaved (5)"
    )
    ap.add_argument(
        "--warmup", type=int, default=2, help="warm-up seconds per path and concurrency (2)"
    )
    ap.add_argument("--pause", type=float, default=0.2, help="idle seconds before each slice")
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
        help=f"comma-separated paths out of {','.join(TRANSPORTS)} (grpc,json,grpc-py)",
    )
    ap.add_argument("--breakdown", action="store_true", help="add grpc-tcp,grpc-h2,json-min")
    ap.add_argument("--rpc", choices=sorted(RPCS), default="health", help="RPC under test")
    ap.add_argument("--envoy-concurrency", type=int, default=2, help="Envoy worker threads (2)")
    ap.add_argument("--json-client", choices=["auto", "wrk", "python"], default="auto")
    ap.add_argument("--grpc-client", choices=["auto", "h2load", "python"], default="auto")
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
        default=REPO_ROOT / "bench" / "out" / f"transport-{stamp}.json",
        help="JSON results file (bench/out/transport-<date>-<time>.json, ignored by git)",
    )
    args = ap.parse_args(argv)
    if args.breakdown:
        args.transports += [t for t in BREAKDOWN if t not in args.transports]
    unknown = set(args.transports) - set(TRANSPORTS)
    if unknown:
        ap.error(f"unknown transports: {sorted(unknown)}")
    if args.rounds < 1 or args.duration < args.rounds or args.duration % args.rounds:
        ap.error("--duration must be a multiple of --rounds (whole seconds per slice)")
    return args


def _terminate(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def running_mesh(args: argparse.Namespace, tmpdir: Path) -> Iterator[tuple[Any, Pids, dict]]:
    """The real mesh, plus the probe Envoy when a breakdown path needs it; stopped on exit."""
    from services.common.topology import Ports, free_ports
    from services.devtools.envoy import REPO_ROOT as ENVOY_CWD
    from services.devtools.envoy import EnvoyProcess
    from services.devtools.mesh import Mesh

    env = dict(kv.split("=", 1) for kv in args.server_env)
    mesh = Mesh(
        Ports.free(),
        tmpdir / "data",
        tmpdir / "run",
        env=env,
        envoy_concurrency=args.envoy_concurrency,
    )
    probe = EnvoyProcess(concurrency=args.envoy_concurrency)
    probe_ports: dict[str, int] = {}
    mesh.start()
    try:
        if set(args.transports) & set(BREAKDOWN):
            probe_ports = dict(zip(("admin", *BREAKDOWN), free_ports(4), strict=True))
            config = probe_envoy_config(
                mesh.ports.grpc[SERVICE_KEY], probe_ports, ENVOY_CWD / "envoy" / "visior.pb"
            )
            probe.start(config, tmpdir / "probe-envoy")
            probe.wait_ready()
        pids = mesh.pids()
        yield mesh, Pids(pids[SERVICE_KEY], pids["envoy"], probe.pid), probe_ports
        dead = [k for k, alive in mesh.alive().items() if not alive]
        if dead:
            raise RuntimeError(f"server(s) died during the benchmark: {dead}")
    finally:
        probe.stop()
        mesh.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    rpc = RPCS[args.rpc]
    started = dt.datetime.now(dt.UTC)
    for tool, pkg in (("wrk", "wrk"), ("h2load", "nghttp2-client")):
        if shutil.which(tool) is None:
            print(f"note: {tool} not found (apt-get install -y {pkg}); using a Python fallback")
    results: list[Result] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-transport-") as tmp,
        running_mesh(args, Path(tmp)) as (mesh, pids, probe_ports),
    ):
        paths = plan_paths(args, mesh, rpc, probe_ports)
        print(
            f"mesh up; {rpc.grpc_path} (JSON: GET {rpc.http_path} on the {SERVICE_KEY} "
            f"listener); per path and concurrency {args.warmup}s warm-up, then "
            f"{args.rounds} x {args.duration // args.rounds}s interleaved",
            flush=True,
        )
        for c in args.concurrency:
            for r in measure_concurrency(paths, c, args, mesh, rpc, pids, Path(tmp)):
                results.append(r)
                print(
                    f"  {r.transport:<8} c={c:<3} {r.rps:6.0f} RPS  p50 {r.p50_ms:.3f} ms  "
                    f"errors {r.errors}",
                    flush=True,
                )
    summary, lines = verdicts(results, args)
    checks = verify(results, args)
    table = format_table(results)
    print(f"\n{table}\n\n" + "\n".join(lines + checks))
    write_record(
        "transport",
        started,
        args,
        environment_info(),
        rpc={**asdict(rpc), "grpc_path": rpc.grpc_path},
        summary=summary,
        results=[{**asdict(r), "rps": round(r.rps, 1)} for r in results],
        table=table.splitlines(),
        notes=lines + checks,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
