"""LLM Generate overhead: what the LLM service adds around the model runtime and the tools.

Starts real processes in this process tree: the retrieval server (to ingest one small sample
document), the real ToolsProxy, a zero-latency OpenAI-compatible runtime
(tests/fakes/openai_chat.py `FakeChatServer` in its own process, real HTTP on loopback) and
the real LLM service (`services.llm.app.start`, as `python -m services.llm` runs it) in two
variants:

  socket   LLM_RUNTIME_URL points at the FakeChatServer process (what production has)
  inproc   the same fake logic served in the LLM process by `FakeChatServer.transport()`
           (no socket: the runtime costs only its own Python work)

A Python grpc.aio client sends Generate (mode rag, 4 context chunks, tools allowed) in a
closed loop. The fake model makes N tool calls (N = 0, 1, 3: read_chunk_window,
read_doc_metadata, read_chunk_window on another anchor), each executed by the real ToolsProxy
over gRPC, then answers. In the same run, for every request:

  total     Generate latency as the client sees it
  runtime   time inside the LLM service's HTTP transport calls to the runtime (request
            written, response read to the end), summed over the request's model calls
  rt-own    (socket) the fake's own handling time of those calls, measured in the fake
  tools     time inside the LLM service's ToolsProxy Execute calls (gRPC round trips)
  overhead  total - runtime - tools: the LLM service's own work plus the client's hop

The LLM process is instrumented by wrapping (not changing) three things at start-up: the
servicer's Generate (server-side handler time), httpx's transport and the ToolsProxy stub;
each wrapper costs ~2 us. Cells (variant x steps) run in interleaved slices; percentiles
are raw nearest-rank over the pooled requests. bench/README.md explains.

    python bench/llm_overhead.py [--duration 20] [--rounds 5] [--rps-concurrency 8]
    python bench/llm_overhead.py --profile      # cProfile of the LLM process (socket, c=1)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import datetime as dt
import json
import logging
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
for _p in (str(REPO_ROOT), str(BENCH_DIR)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from tool_limits import NO_TOOL_RATE_LIMITS  # noqa: E402
from transport import machine_cpu_s, percentile, proc_cpu_s, write_record  # noqa: E402

TENANT = "bench"
DOC_FILE = REPO_ROOT / "samples" / "docs" / "orion-x-admin-guide.md"
MODEL = "bench-model"
QUESTION = "Как настроить LDAP интеграцию в Orion X?"
ANSWER = (
    "LDAP настраивается в разделе «Настройки» → «Аутентификация» → «LDAP»: укажите адрес "
    "сервера, базовый DN и учётную запись для поиска, затем проверьте подключение кнопкой "
    "«Проверить» и сохраните настройки [orion-x-admin-guide, стр. 2]."
)
MARK = re.compile(r"\[bench (?P<id>[0-9a-f]{32}) steps=(?P<steps>\d+)\]")
VARIANTS = ("socket", "inproc")
GRPC_TIMEOUT_S = 30.0
FIRST_ERRORS: dict[str, str] = {}
"""The first error message per gRPC code, for the report."""


# ---------------------------------------------------------------------------------------
# The fake model: N tool calls, then the answer (stateless: decided from the conversation)


def plan_from_env() -> list[tuple[str, dict[str, Any]]]:
    return [(name, args) for name, args in json.loads(os.environ["BENCH_PLAN"])]


def make_model(plan: list[tuple[str, dict[str, Any]]], seen: threading.local | None = None):  # type: ignore[no-untyped-def]
    from tests.fakes.openai_chat import ChatRequest, Reply, text, tool_call

    def model(request: ChatRequest) -> Reply:
        messages = request.messages
        # The first user message is the question (after the last tool step the loop adds
        # its "answer now" note as another user message).
        user = next(m for m in messages if m.get("role") == "user")
        m = MARK.search(str(user.get("content") or ""))
        assert m, "bench request without its mark"
        if seen is not None:
            seen.id = m.group("id")
        done = sum(1 for x in messages if x.get("role") == "tool")
        if done < int(m.group("steps")):
            name, args = plan[done % len(plan)]
            return tool_call(name, args)
        return text(ANSWER)

    return model


# ---------------------------------------------------------------------------------------
# Child processes: a stats endpoint (a daemon thread) that hands over and clears records


def serve_stats(port: int, snapshot) -> ThreadingHTTPServer:  # type: ignore[no-untyped-def]
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            body = json.dumps(snapshot(self.path)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def fetch(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return json.loads(r.read())


def serve_fake(args: argparse.Namespace) -> None:
    """The runtime process: FakeChatServer, each request's handling time recorded by bench id."""
    from tests.fakes import openai_chat

    seen = threading.local()
    records: list[tuple[str, int]] = []
    lock = threading.Lock()
    fake = openai_chat.FakeChatServer().respond_with(make_model(plan_from_env(), seen))
    original = openai_chat._Handler._handle

    def timed(self, method: str) -> None:  # type: ignore[no-untyped-def]
        seen.id = ""
        t0 = time.perf_counter_ns()
        original(self, method)
        elapsed = time.perf_counter_ns() - t0
        with lock:
            records.append((seen.id, elapsed))
        with fake._lock:
            fake.requests.clear()  # the fake keeps every request; a benchmark makes thousands

    openai_chat._Handler._handle = timed  # type: ignore[method-assign]
    # The fake writes the status line + headers and the body in two send()s; with Nagle on
    # (socketserver's default) the body waits for the client's delayed ACK of the headers,
    # ~40 ms per call on Linux loopback. A real runtime (uvicorn, vLLM) sets TCP_NODELAY.
    openai_chat._Handler.disable_nagle_algorithm = not args.keep_nagle

    def snapshot(path: str) -> Any:
        with lock:
            out = list(records)
            records.clear()
        return out

    fake.start()
    serve_stats(args.stats_port, snapshot)
    print(f"FAKE_URL {fake.url}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    fake.stop()


def serve_llm(args: argparse.Namespace) -> None:
    """The LLM service exactly as `python -m services.llm` runs it, with timing wrappers."""
    import httpx

    from services.common.runner import run_service
    from services.llm import app, loop, servicer, tools_client
    from services.llm.config import LlmSettings

    current: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
        "bench_rec", default=None
    )
    records: dict[str, list[int]] = {}
    loops: list[Any] = []

    generate = servicer.LlmServicer.Generate

    async def timed_generate(self, request, context):  # type: ignore[no-untyped-def]
        # handler, runtime, runtime calls, tools, tool calls, then time (ns) and calls of:
        # tokenizer, log records handled, runtime request building (httpx build_request)
        rec = [0] * 11
        token = current.set(rec)
        t0 = time.perf_counter_ns()
        try:
            return await generate(self, request, context)
        finally:
            rec[0] = time.perf_counter_ns() - t0
            current.reset(token)
            records[request.trace_id] = rec

    servicer.LlmServicer.Generate = timed_generate  # type: ignore[method-assign]

    class TimedStream(httpx.AsyncByteStream):
        def __init__(self, inner: Any, rec: list[int]) -> None:
            self.inner, self.rec = inner, rec

        async def __aiter__(self):  # type: ignore[no-untyped-def]
            it = self.inner.__aiter__()
            while True:
                t0 = time.perf_counter_ns()
                try:
                    chunk = await it.__anext__()
                except StopAsyncIteration:
                    self.rec[1] += time.perf_counter_ns() - t0
                    return
                self.rec[1] += time.perf_counter_ns() - t0
                yield chunk

        async def aclose(self) -> None:
            t0 = time.perf_counter_ns()
            await self.inner.aclose()
            self.rec[1] += time.perf_counter_ns() - t0

    def timed_transport(handle):  # type: ignore[no-untyped-def]
        async def wrapper(self, request):  # type: ignore[no-untyped-def]
            rec = current.get()
            t0 = time.perf_counter_ns()
            response = await handle(self, request)
            if rec is not None:
                rec[1] += time.perf_counter_ns() - t0
                rec[2] += 1
                response.stream = TimedStream(response.stream, rec)
            return response

        return wrapper

    if args.inproc:
        from tests.fakes.openai_chat import FakeChatServer

        fake = FakeChatServer().respond_with(make_model(plan_from_env()))

        class InProc(httpx.AsyncBaseTransport):
            def __init__(self) -> None:
                self.inner = fake.transport()

            async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
                fake.requests.clear()
                return await self.inner.handle_async_request(request)

        InProc.handle_async_request = timed_transport(InProc.handle_async_request)  # type: ignore[method-assign]
        base_client = httpx.AsyncClient

        class Client(base_client):  # type: ignore[misc,valid-type]
            def __init__(self, *a: Any, **kw: Any) -> None:
                kw.setdefault("transport", InProc())
                super().__init__(*a, **kw)

        app.httpx = type("httpx", (), {"AsyncClient": Client})  # type: ignore[attr-defined]
    else:
        httpx.AsyncHTTPTransport.handle_async_request = timed_transport(  # type: ignore[method-assign]
            httpx.AsyncHTTPTransport.handle_async_request
        )

    runner_init = tools_client.GrpcToolRunner.__init__

    def timed_runner_init(self, channel):  # type: ignore[no-untyped-def]
        runner_init(self, channel)
        execute = self._stub.Execute

        async def timed_execute(request, **kw):  # type: ignore[no-untyped-def]
            rec = current.get()
            t0 = time.perf_counter_ns()
            try:
                return await execute(request, **kw)
            finally:
                if rec is not None:
                    rec[3] += time.perf_counter_ns() - t0
                    rec[4] += 1

        self._stub.Execute = timed_execute

    tools_client.GrpcToolRunner.__init__ = timed_runner_init  # type: ignore[method-assign]

    def timed_method(cls: Any, name: str, slot: int) -> None:
        """Adds the time (and count) of cls.name calls made inside a Generate to rec[slot]."""
        original = getattr(cls, name)

        def wrapper(*a: Any, **kw: Any) -> Any:
            rec = current.get()
            if rec is None:
                return original(*a, **kw)
            t0 = time.perf_counter_ns()
            try:
                return original(*a, **kw)
            finally:
                rec[slot] += time.perf_counter_ns() - t0
                rec[slot + 1] += 1

        setattr(cls, name, wrapper)

    from services.common.tokenizer import BpeTokenizer

    # truncate() calls encode(): counting count() and encode() covers the tokenizer once.
    timed_method(BpeTokenizer, "count", 5)
    timed_method(BpeTokenizer, "encode", 5)
    timed_method(logging.Logger, "callHandlers", 7)  # format + write of each record
    timed_method(httpx.AsyncClient, "build_request", 9)  # the body's JSON encoding

    loop_init = loop.ToolLoop.__init__

    def keep_loop(self, *a, **kw):  # type: ignore[no-untyped-def]
        loop_init(self, *a, **kw)
        loops.append(self)

    loop.ToolLoop.__init__ = keep_loop  # type: ignore[method-assign]

    def snapshot(path: str) -> Any:
        if path == "/info":
            return {"catalogue": [t.name for t in loops[0].catalogue] if loops else []}
        out = {}
        for key in list(records):
            out[key] = records.pop(key)
        return out

    serve_stats(args.stats_port, snapshot)
    profiler = None
    if args.cprofile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    try:
        run_service(LlmSettings.from_env, app.start)
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.cprofile)


# ---------------------------------------------------------------------------------------
# The parent: processes, data, load, statistics


def free_ports(n: int) -> list[int]:
    from services.common.topology import free_ports as fp

    return fp(n)


class Procs:
    """Child processes of this run, logs under `workdir`; stopped (SIGTERM, then kill) on exit."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, key: str, argv: list[str], env: dict[str, str], *, pipe: bool = False) -> None:
        log = (self.workdir / f"{key}.log").open("ab")
        self.procs[key] = subprocess.Popen(
            argv, cwd=str(REPO_ROOT), env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if pipe else log, stderr=log,
        )  # fmt: skip

    def tail(self, key: str, lines: int = 30) -> str:
        path = self.workdir / f"{key}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def pid(self, key: str) -> int:
        return self.procs[key].pid

    def alive(self) -> dict[str, bool]:
        return {k: p.poll() is None for k, p in self.procs.items()}

    def stop(self, key: str) -> None:
        p = self.procs.pop(key, None)
        if p is None:
            return
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def stop_all(self) -> None:
        for key in reversed(list(self.procs)):
            self.stop(key)


def wait_healthy(procs: Procs, key: str, port: int, timeout: float = 60.0) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if procs.procs[key].poll() is not None:
                raise RuntimeError(f"{key} exited:\n{procs.tail(key)}")
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{key} not healthy after {timeout:g}s:\n{procs.tail(key)}")
            time.sleep(0.1)


def ingest(retrieval_port: int) -> int:
    import grpc
    from visior.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{retrieval_port}") as channel:
        stub = retrieval_pb2_grpc.IngestionServiceStub(channel)
        r = stub.IngestDocument(
            retrieval_pb2.IngestDocumentRequest(
                tenant_id=TENANT, file_name=DOC_FILE.name, content=DOC_FILE.read_bytes()
            ),
            timeout=120,
        )
        return r.chunks


def read_chunks(tools_port: int, doc_id: str, count: int) -> list[dict[str, Any]]:
    """The document's first chunks, one by one through ToolsProxy (the context of the request)."""
    import grpc
    from visior.common.v1 import common_pb2
    from visior.toolsproxy.v1 import toolsproxy_pb2, toolsproxy_pb2_grpc

    from services.common.structs import struct_to_dict

    out = []
    with grpc.insecure_channel(f"127.0.0.1:{tools_port}") as channel:
        stub = toolsproxy_pb2_grpc.ToolsProxyServiceStub(channel)
        for i in range(count):
            req = toolsproxy_pb2.ExecuteRequest(
                tool_name="read_chunk_window",
                user=common_pb2.UserContext(tenant_id=TENANT, user_id="bench"),
            )
            req.arguments.update(
                {"doc_id": doc_id, "anchor_chunk_id": f"{doc_id}:c{i:05d}", "radius": 0}
            )
            r = stub.Execute(req, timeout=10)
            assert r.status == "ok", r
            out.append(struct_to_dict(r.result))
    return out


def make_template(doc_id: str, chunks: list[dict[str, Any]], anchors: list[str]) -> Any:
    from visior.common.v1 import common_pb2
    from visior.llm.v1 import llm_pb2

    req = llm_pb2.GenerateRequest(
        mode="rag",
        user=common_pb2.UserContext(tenant_id=TENANT, user_id="bench-user", roles=["user"]),
        tool_policy=llm_pb2.ToolPolicy(
            allowed_tools=["read_chunk_window", "read_doc_metadata"],
            anchors=[llm_pb2.AnchorChunk(doc_id=doc_id, anchor_chunk_id=a) for a in anchors],
            window_radius_schedule=[1, 2],
        ),
        generation_params=llm_pb2.GenerationParams(max_tokens=256, temperature=0.2),
    )
    for i, c in enumerate(chunks):
        req.context_chunks.append(
            llm_pb2.ContextChunk(
                doc_id=doc_id, section_id="", text=c["text"], page_start=int(c["page_start"]),
                page_end=int(c["page_end"]), chunk_id=c["chunk_ids"][0], score=1.0 - 0.1 * i,
            )
        )  # fmt: skip
    return req


def request_for(template: Any, steps: int) -> tuple[str, Any]:
    from visior.common.v1 import common_pb2
    from visior.llm.v1 import llm_pb2

    rid = uuid.uuid4().hex
    req = llm_pb2.GenerateRequest()
    req.CopyFrom(template)
    req.trace_id = rid
    req.messages.append(
        common_pb2.ChatMessage(role="user", content=f"{QUESTION} [bench {rid} steps={steps}]")
    )
    return rid, req


async def closed_loop(
    stub: Any, template: Any, steps: int, concurrency: int, seconds: float
) -> tuple[list[tuple[str, int]], dict[str, int], float]:
    """`concurrency` loops sending Generate for `seconds`: [(id, latency ns)], errors, wall s."""
    import grpc

    lat: list[tuple[str, int]] = []
    errors: dict[str, int] = {}
    t_start = time.perf_counter()
    stop_at = t_start + seconds

    async def one() -> None:
        while time.perf_counter() < stop_at:
            rid, req = request_for(template, steps)
            t0 = time.perf_counter_ns()
            try:
                resp = await stub.Generate(req, timeout=GRPC_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                errors[exc.code().name] = errors.get(exc.code().name, 0) + 1
                FIRST_ERRORS.setdefault(exc.code().name, exc.details() or "")
                continue
            elapsed = time.perf_counter_ns() - t0
            if resp.meta.tool_steps != steps or resp.answer != ANSWER:
                errors["WRONG_ANSWER"] = errors.get("WRONG_ANSWER", 0) + 1
                continue
            lat.append((rid, elapsed))

    await asyncio.gather(*(one() for _ in range(concurrency)))
    return lat, errors, time.perf_counter() - t_start


class Cell:
    """One (variant, steps, concurrency): pooled per-request figures over its slices."""

    def __init__(self, variant: str, steps: int, c: int) -> None:
        self.variant, self.steps, self.c = variant, steps, c
        self.rows: list[dict[str, float]] = []  # ms per request
        self.errors: dict[str, int] = {}
        self.wall_s = 0.0
        self.llm_cpu_s = 0.0
        self.other_cores: list[float] = []
        self.steal_cores: list[float] = []
        self.slice_p50: list[float] = []
        self.missing = 0

    @property
    def key(self) -> str:
        return f"{self.variant}/{self.steps}/c{self.c}"


def join(lat: list[tuple[str, int]], llm: dict[str, list[int]], fake: list) -> tuple[list, int]:
    own: dict[str, int] = {}
    for rid, ns in fake:
        own[rid] = own.get(rid, 0) + ns
    rows, missing = [], 0
    for rid, total in lat:
        rec = llm.get(rid)
        if rec is None:
            missing += 1
            continue
        handler, rt, rt_calls, tools, tool_calls, tok, tok_n, logs, log_n, build, _ = rec
        row = {
            "total": total / 1e6,
            "handler": handler / 1e6,
            "runtime": rt / 1e6,
            "runtime_calls": rt_calls,
            "tools": tools / 1e6,
            "tool_calls": tool_calls,
            "overhead": (total - rt - tools) / 1e6,
            "in_service": (handler - rt - tools) / 1e6,
            "tokenizer": tok / 1e6,
            "tokenizer_calls": tok_n,
            "logging": logs / 1e6,
            "log_records": log_n,
            "request_build": build / 1e6,
        }
        if rid in own:
            row["rt_own"] = own[rid] / 1e6
        rows.append(row)
    return rows, missing


def pstats(values: Sequence[float]) -> dict[str, float]:
    s = sorted(values)
    return {
        "p50": round(percentile(s, 50), 3),
        "p95": round(percentile(s, 95), 3),
        "p99": round(percentile(s, 99), 3),
        "mean": round(sum(s) / len(s), 3) if s else float("nan"),
    }


def summarize(cell: Cell) -> dict[str, Any]:
    cols = (
        "total", "runtime", "rt_own", "tools", "overhead", "in_service", "handler",
        "tokenizer", "tokenizer_calls", "logging", "log_records", "request_build",
    )  # fmt: skip
    out: dict[str, Any] = {
        "variant": cell.variant,
        "steps": cell.steps,
        "concurrency": cell.c,
        "requests": len(cell.rows),
        "errors": cell.errors,
        "unmatched": cell.missing,
        "rps": round(len(cell.rows) / cell.wall_s, 1) if cell.wall_s else 0.0,
        "llm_cpu_us_per_request": round(cell.llm_cpu_s / len(cell.rows) * 1e6)
        if cell.rows
        else None,
        "other_cores": round(max(cell.other_cores, default=0.0), 2),
        "steal_cores": round(max(cell.steal_cores, default=0.0), 2),
        "slice_overhead_p50": [round(x, 3) for x in cell.slice_p50],
    }
    for col in cols:
        vals = [r[col] for r in cell.rows if col in r]
        if vals:
            out[col] = pstats(vals)
    out["means"] = {
        k: round(v["mean"], 3) for k, v in out.items() if isinstance(v, dict) and "mean" in v
    }
    calls = {(r["runtime_calls"], r["tool_calls"]) for r in cell.rows}
    out["calls_per_request"] = sorted(calls)
    return out


def format_table(summaries: list[dict[str, Any]]) -> str:
    head = (
        f"{'variant':<7} {'steps':>5} {'c':>2} {'reqs':>6} {'RPS':>6}  "
        f"{'total p50/p95':>15} {'runtime p50/p95':>15} {'rt-own p50/p95':>15} "
        f"{'tools p50/p95':>15} {'overhead p50/p95':>16} {'in-svc p95':>10} "
        f"{'cpu us/req':>10} {'err':>4}"
    )
    lines = [head, "-" * len(head)]

    def pair(s: dict[str, Any], col: str, width: int = 15) -> str:
        if col not in s:
            return f"{'-':>{width}}"
        return f"{s[col]['p50']:7.2f}/{s[col]['p95']:<7.2f}".rjust(width)

    for s in summaries:
        errs = sum(s["errors"].values()) + s["unmatched"]
        lines.append(
            f"{s['variant']:<7} {s['steps']:>5} {s['concurrency']:>2} {s['requests']:>6} "
            f"{s['rps']:>6.0f}  {pair(s, 'total')} {pair(s, 'runtime')} {pair(s, 'rt_own')} "
            f"{pair(s, 'tools')} {pair(s, 'overhead', 16)} "
            f"{s['in_service']['p95'] if 'in_service' in s else float('nan'):>10.2f} "
            f"{s['llm_cpu_us_per_request'] or 0:>10} {errs:>4}"
        )
    return "\n".join(lines)


def git_state() -> dict[str, Any]:
    """The commit and the uncommitted files (read-only git commands): the tree measured."""

    def run(*cmd: str) -> str:
        try:
            out = subprocess.run(
                ["git", *cmd], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
            )
        except OSError:
            return ""
        return out.stdout.strip()

    return {"commit": run("rev-parse", "HEAD"), "dirty": run("status", "--short").splitlines()}


def format_breakdown(summaries: list[dict[str, Any]]) -> str:
    """Where the in-service time goes, c=1, p50 per request (ms; tokenizer calls and log records)."""
    head = (
        f"{'variant':<7} {'steps':>5}  {'overhead':>8} {'hop':>6} {'in-svc':>7} "
        f"{'tokenizer':>9} {'(calls)':>7} {'logging':>7} {'(recs)':>6} {'req-build':>9} {'rest':>6}"
    )
    lines = [head, "-" * len(head)]
    for s in summaries:
        if s["concurrency"] != 1 or "overhead" not in s:
            continue
        m = s["means"]
        rest = m["in_service"] - m["tokenizer"] - m["logging"] - m["request_build"]
        lines.append(
            f"{s['variant']:<7} {s['steps']:>5}  {m['overhead']:8.2f} "
            f"{m['overhead'] - m['in_service']:6.2f} {m['in_service']:7.2f} "
            f"{m['tokenizer']:9.2f} {m['tokenizer_calls']:7.0f} {m['logging']:7.2f} "
            f"{m['log_records']:6.0f} {m['request_build']:9.2f} {rest:6.2f}"
        )
    return "\n".join(lines)


def environment_info() -> dict[str, Any]:
    import grpc
    import httpx

    return {
        "git": git_state(),
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "httpx": httpx.__version__,
    }


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    stamp = dt.datetime.now().strftime("%Y-%m-%d-%H%M%S")
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--duration", type=float, default=20, help="measured s per cell at c=1 (20)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved slices per cell (5)")
    ap.add_argument("--warmup", type=float, default=2, help="warm-up s per cell, discarded (2)")
    ap.add_argument(
        "--steps",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[0, 1, 3],
        help="tool steps per Generate (0,1,3)",
    )
    ap.add_argument(
        "--variants",
        type=lambda s: s.split(","),
        default=list(VARIANTS),
        help="socket,inproc (both)",
    )
    ap.add_argument(
        "--rps-concurrency",
        type=int,
        default=8,
        help="in-flight requests of the RPS pass (8; 0: skip)",
    )
    ap.add_argument(
        "--rps-duration", type=float, default=6, help="measured s per cell, RPS pass (6)"
    )
    ap.add_argument("--rps-rounds", type=int, default=3, help="slices per cell, RPS pass (3)")
    ap.add_argument(
        "--server-env", action="append", default=[], metavar="KEY=VALUE",
        help="extra environment for the LLM service, e.g. LOG_LEVEL=WARNING (repeatable)",
    )  # fmt: skip
    ap.add_argument("--target-ms", type=float, default=5.0, help="p95 overhead target (5)")
    ap.add_argument("--spec-ms", type=float, default=30.0, help="the spec's limit (30)")
    ap.add_argument(
        "--profile", action="store_true",
        help="cProfile the socket LLM process over a c=1 run (figures then not comparable)",
    )  # fmt: skip
    ap.add_argument("--profile-top", type=int, default=30, help="functions listed (30)")
    ap.add_argument("--busy-threshold", type=float, default=0.25, help="warn above this (cores)")
    ap.add_argument(
        "--out",
        type=Path,
        default=REPO_ROOT / "bench" / "out" / f"llm-overhead-{stamp}.json",
        help="JSON record (bench/out/llm-overhead-<date>-<time>.json, ignored by git)",
    )
    # internal: the child processes
    ap.add_argument("--serve-fake", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--serve-llm", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--inproc", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--stats-port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--cprofile", default="", help=argparse.SUPPRESS)
    ap.add_argument(
        "--keep-nagle", action="store_true",
        help="leave Nagle on in the fake's socket server (as tests/fakes has it: +~40 ms/call)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    if args.profile:
        args.variants = ["socket"]
        args.rps_concurrency = 0
    if set(args.variants) - set(VARIANTS):
        ap.error(f"unknown variants: {sorted(set(args.variants) - set(VARIANTS))}")
    return args


def _terminate(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def running(args: argparse.Namespace, tmp: Path) -> Iterator[dict[str, Any]]:
    """retrieval + ToolsProxy + the fake runtime + one LLM service per variant."""
    procs = Procs(tmp)
    py = sys.executable
    names = ["retrieval", "toolsproxy", "fake_stats"] + [
        f"{v}_{k}" for v in VARIANTS for k in ("grpc", "stats")
    ]
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    base = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "VISIOR_DATA_DIR": str(tmp / "data"),
        "RETR_PORT": str(ports["retrieval"]),
        "MCP_PROXY_PORT": str(ports["toolsproxy"]),
        "MCP_PROXY_RETRIEVAL_URL": f"127.0.0.1:{ports['retrieval']}",
        **NO_TOOL_RATE_LIMITS,  # bench/tool_limits.py
    }
    try:
        procs.start("retrieval", [py, "-m", "services.retrieval"], base)
        wait_healthy(procs, "retrieval", ports["retrieval"], 120)
        n_chunks = ingest(ports["retrieval"])
        doc_id = DOC_FILE.stem
        procs.start("toolsproxy", [py, "-m", "services.toolsproxy"], base)
        wait_healthy(procs, "toolsproxy", ports["toolsproxy"])
        chunks = read_chunks(ports["toolsproxy"], doc_id, min(4, n_chunks))
        anchors = [f"{doc_id}:c{min(2, n_chunks - 1):05d}", f"{doc_id}:c{min(4, n_chunks - 1):05d}"]
        plan = [
            ("read_chunk_window", {"doc_id": doc_id, "anchor_chunk_id": anchors[0], "radius": 1}),
            ("read_doc_metadata", {"doc_id": doc_id}),
            ("read_chunk_window", {"doc_id": doc_id, "anchor_chunk_id": anchors[1], "radius": 1}),
        ]
        env = {**base, "BENCH_PLAN": json.dumps(plan)}
        me = str(Path(__file__).resolve())
        fake_argv = [py, me, "--serve-fake", "--stats-port", str(ports["fake_stats"])]
        if args.keep_nagle:
            fake_argv.append("--keep-nagle")
        procs.start("fake", fake_argv, env, pipe=True)
        out = procs.procs["fake"].stdout
        assert out is not None
        line = out.readline().decode().strip()
        if not line.startswith("FAKE_URL "):
            raise RuntimeError(f"fake runtime did not start:\n{procs.tail('fake')}")
        fake_url = line.split()[1]
        llm_env = {
            **env,
            "MCP_PROXY_URL": f"127.0.0.1:{ports['toolsproxy']}",
            "DEFAULT_MODEL_NAME": MODEL,
            **dict(kv.split("=", 1) for kv in args.server_env),
        }
        prof = tmp / "llm.prof"
        for v in args.variants:
            argv = [py, me, "--serve-llm", "--stats-port", str(ports[f"{v}_stats"])]
            if v == "inproc":
                argv.append("--inproc")
            if args.profile and v == "socket":
                argv += ["--cprofile", str(prof)]
            venv = {
                **llm_env,
                "LLM_SERVICE_PORT": str(ports[f"{v}_grpc"]),
                "LLM_RUNTIME_URL": fake_url if v == "socket" else "http://fake.invalid",
            }
            procs.start(v, argv, venv)
        for v in args.variants:
            wait_healthy(procs, v, ports[f"{v}_grpc"])
            deadline = time.monotonic() + 30
            while "read_doc_metadata" not in fetch(ports[f"{v}_stats"], "/info")["catalogue"]:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{v}: no tool catalogue:\n{procs.tail(v)}")
                time.sleep(0.1)
        yield {
            "procs": procs,
            "ports": ports,
            "doc_id": doc_id,
            "chunks": chunks,
            "anchors": anchors,
            "plan": plan,
            "fake_url": fake_url,
            "profile": prof,
        }
        dead = [k for k, alive in procs.alive().items() if not alive]
        if dead:
            raise RuntimeError(f"process(es) died during the benchmark: {dead}")
    finally:
        procs.stop_all()


async def measure(
    ctx: dict[str, Any], args: argparse.Namespace, c: int, seconds: float, rounds: int
) -> list[Cell]:
    import grpc
    from visior.llm.v1 import llm_pb2_grpc

    procs, ports = ctx["procs"], ctx["ports"]
    template = make_template(ctx["doc_id"], ctx["chunks"], ctx["anchors"])
    channels = {
        v: grpc.aio.insecure_channel(f"127.0.0.1:{ports[f'{v}_grpc']}") for v in args.variants
    }
    stubs = {v: llm_pb2_grpc.LlmServiceStub(ch) for v, ch in channels.items()}
    cells = [Cell(v, s, c) for v in args.variants for s in args.steps]
    watched = [os.getpid(), *(procs.pid(k) for k in procs.procs)]

    def drain() -> None:
        for v in args.variants:
            fetch(ports[f"{v}_stats"], "/records")
        fetch(ports["fake_stats"], "/records")

    try:
        for cell in cells:  # warm-up
            await closed_loop(stubs[cell.variant], template, cell.steps, c, args.warmup)
        drain()
        for _ in range(rounds):
            for cell in cells:
                await asyncio.sleep(0.1)
                pid = procs.pid(cell.variant)
                cpu0 = proc_cpu_s(pid)
                ours0 = sum(proc_cpu_s(p) for p in watched)
                busy0, steal0 = machine_cpu_s()
                lat, errors, wall = await closed_loop(
                    stubs[cell.variant], template, cell.steps, c, seconds / rounds
                )
                busy1, steal1 = machine_cpu_s()
                ours1 = sum(proc_cpu_s(p) for p in watched)
                cell.llm_cpu_s += proc_cpu_s(pid) - cpu0
                cell.wall_s += wall
                cell.other_cores.append(max(0.0, (busy1 - busy0) - (ours1 - ours0)) / wall)
                cell.steal_cores.append((steal1 - steal0) / wall)
                llm = fetch(ports[f"{cell.variant}_stats"], "/records")
                fake = fetch(ports["fake_stats"], "/records")
                rows, missing = join(lat, llm, fake)
                cell.rows += rows
                cell.missing += missing
                for k, n in errors.items():
                    cell.errors[k] = cell.errors.get(k, 0) + n
                if rows:
                    cell.slice_p50.append(percentile(sorted(r["overhead"] for r in rows), 50))
    finally:
        for ch in channels.values():
            await ch.close()
    return cells


AREAS = (
    # (area, substrings of "file:function"), first match wins; self time is summed per area
    ("idle: epoll wait", ("select.epoll",)),
    ("tokenizer (quicktok BPE)", ("quicktok", "tokenizer.py")),
    ("socket send/recv syscalls", ("_socket.socket",)),
    ("JSON encode/decode", ("json/", "encoder.py", "decoder.py", "_json.")),
    ("logging", ("logging", "__init__.py:292", "__init__.py:1", "__init__.py:2")),
    (
        "httpx/httpcore/h11/anyio (runtime client)",
        (
            "httpx",
            "httpcore",
            "h11",
            "anyio",
            "_models.py",
            "_headers.py",
            "_connection.py",
            "http11.py",
            "connection_pool.py",
            "default.py",
            "_client.py",
            "_sockets.py",
            "_asyncio.py",
            "_impl.py",
            "sniffio",
            "idna",
            "_urls.py",
            "_urlparse.py",
            "_content.py",
            "_multipart.py",
            "_decoders.py",
            "_config.py",
            "_transports",
            "_synchronization.py",
            "_exceptions.py",
            "_auth.py",
            "_readers.py",
            "_writers.py",
            "_events.py",
            "_state.py",
            "_util.py",
            "_abnf.py",
            "_backends",
        ),
    ),
    (
        "gRPC (client to ToolsProxy + server)",
        (
            "grpc",
            "_call.py",
            "_channel.py",
            "cygrpc",
            "_interceptor.py",
            "interceptors.py",
            "_server.py",
            "_base_call",
            "aio",
        ),
    ),
    (
        "protobuf / Struct conversion",
        ("protobuf", "structs.py", "well_known_types", "_pb2", "message.py", "servicer.py"),
    ),
    (
        "LLM service code (loop, prompt, budget, toolcalls, runtime, engine)",
        (
            "loop.py",
            "prompt.py",
            "budget.py",
            "toolcalls.py",
            "model_runtime/",
            "engine.py",
            "model.py",
            "chat.py",
            "untrusted.py",
            "tools_client.py",
            "breaker.py",
            "context.py",
            "metrics.py",
            "errors.py",
        ),
    ),
    (
        "asyncio event loop and tasks",
        (
            "asyncio",
            "base_events.py",
            "events.py",
            "tasks.py",
            "futures.py",
            "selector_events.py",
            "selectors.py",
            "_contextvars",
            "timeouts.py",
            "contextlib.py",
            "locks.py",
        ),
    ),
    ("prometheus_client", ("prometheus",)),
)


def profile_areas(stats: Any) -> list[tuple[str, float]]:
    """Self time per area (the AREAS table), busy time only, largest first."""
    totals: dict[str, float] = {}
    for (file, line, func), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():
        key = f"{file}:{line}:{func}"
        area = next((a for a, keys in AREAS if any(k in key for k in keys)), "other")
        totals[area] = totals.get(area, 0.0) + tt
    totals.pop("idle: epoll wait", None)
    return sorted(totals.items(), key=lambda kv: -kv[1])


def profile_report(path: Path, top: int) -> list[str]:
    import pstats as ps
    from io import StringIO

    if not path.exists():
        return [f"no profile at {path}"]
    buf = StringIO()
    stats = ps.Stats(str(path), stream=buf)
    areas = profile_areas(stats)
    busy = sum(t for _, t in areas) or 1.0
    buf.write("Busy self time by area (idle epoll wait excluded; cProfile inflates small calls):\n")
    for area, t in areas:
        buf.write(f"  {100 * t / busy:5.1f}%  {t:7.2f} s  {area}\n")
    buf.write("\n")
    stats.strip_dirs().sort_stats("tottime").print_stats(top)
    buf.write("\n")
    stats.sort_stats("cumulative").print_stats(top)
    return buf.getvalue().splitlines()


def verdicts(summaries: list[dict[str, Any]], args: argparse.Namespace) -> tuple[dict, list[str]]:
    lines, verdict = [], {}
    c1 = [s for s in summaries if s["concurrency"] == 1 and "overhead" in s]
    for variant in args.variants:
        rows = [s for s in c1 if s["variant"] == variant]
        if not rows:
            continue
        worst = max(s["overhead"]["p95"] for s in rows)
        ok = worst <= args.target_ms
        verdict[variant] = {"worst_p95_ms": worst, "pass": ok}
        per = ", ".join(
            f"{s['steps']} steps p50 {s['overhead']['p50']:.2f} / p95 {s['overhead']['p95']:.2f}"
            for s in rows
        )
        label = "production path" if variant == "socket" else "in-process runtime"
        lines.append(f"{variant} ({label}), c=1: overhead = total - runtime - tools: {per} ms")
        lines.append(
            f"  worst p95 {worst:.2f} ms (target <= {args.target_ms:g}): "
            f"{'PASS' if ok else 'MISS'}; spec limit {args.spec_ms:g} ms: "
            f"{'PASS' if worst <= args.spec_ms else 'MISS'}"
        )
        for s in rows:
            lines.append(
                f"  {s['steps']} steps: overhead p50 per round "
                + ", ".join(f"{x:.2f}" for x in s["slice_overhead_p50"])
            )
    busy = [
        s for s in summaries if s["other_cores"] > args.busy_threshold or s["steal_cores"] > 0.05
    ]
    if busy:
        lines.append(
            f"WARNING: other load up to {max(s['other_cores'] for s in busy):.2f} cores, steal up "
            f"to {max(s['steal_cores'] for s in busy):.2f} cores during some slices: a noisy run"
        )
    bad = [s for s in summaries if s["errors"] or s["unmatched"]]
    for s in bad:
        lines.append(
            f"WARNING: {s['variant']}/{s['steps']} c={s['concurrency']}: errors {s['errors']}, "
            f"unmatched {s['unmatched']}"
        )
    for code, message in FIRST_ERRORS.items():
        lines.append(f"  first {code}: {message[:300]}")
    return verdict, lines


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve_fake:
        serve_fake(args)
        return 0
    if args.serve_llm:
        serve_llm(args)
        return 0
    signal.signal(signal.SIGTERM, _terminate)
    started = dt.datetime.now(dt.UTC)
    load_before = loadavg()
    print(f"load average before: {load_before}", flush=True)
    summaries: list[dict[str, Any]] = []
    profile_lines: list[str] = []
    keep = os.environ.get("BENCH_KEEP_LOGS")
    with tempfile.TemporaryDirectory(prefix="bench-llm-") as tmp:
        if keep:
            tmp = keep
            Path(tmp).mkdir(parents=True, exist_ok=True)
        with running(args, Path(tmp)) as ctx:
            print(
                f"up: retrieval, toolsproxy, fake runtime {ctx['fake_url']}, LLM "
                f"{'+'.join(args.variants)}; doc {ctx['doc_id']}, {len(ctx['chunks'])} context "
                f"chunks; per cell {args.warmup:g}s warm-up, then {args.rounds} x "
                f"{args.duration / args.rounds:g}s interleaved",
                flush=True,
            )
            passes = [(1, args.duration, args.rounds)]
            if args.rps_concurrency > 0:
                passes.append((args.rps_concurrency, args.rps_duration, args.rps_rounds))
            for c, seconds, rounds in passes:
                for cell in asyncio.run(measure(ctx, args, c, seconds, rounds)):
                    s = summarize(cell)
                    summaries.append(s)
                    if "overhead" in s:
                        print(
                            f"  {cell.key:<16} {s['requests']:>6} req {s['rps']:>6.0f} RPS  "
                            f"total p95 {s['total']['p95']:.2f} ms  overhead p50 "
                            f"{s['overhead']['p50']:.2f} p95 {s['overhead']['p95']:.2f} ms",
                            flush=True,
                        )
            if args.profile:
                ctx["procs"].stop("socket")
                profile_lines = profile_report(ctx["profile"], args.profile_top)
    load_after = loadavg()
    verdict, lines = verdicts(summaries, args)
    table = format_table(summaries)
    breakdown = format_breakdown(summaries)
    print(f"\n{table}\n\n" + "\n".join(lines))
    print(
        "\nIn-service time, c=1, mean ms per Generate (hop = overhead - in-svc: client, gRPC, "
        f"interceptor):\n{breakdown}"
    )
    print(f"load average before {load_before}, after {load_after}")
    if profile_lines:
        print("\ncProfile of the LLM process (socket variant):\n" + "\n".join(profile_lines))
    write_record(
        "llm-overhead",
        started,
        args,
        environment_info(),
        loadavg={"before": load_before, "after": load_after},
        verdict=verdict,
        results=summaries,
        table=table.splitlines(),
        breakdown=breakdown.splitlines(),
        notes=lines,
        profile=profile_lines,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
