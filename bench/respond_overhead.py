"""Respond overhead: what the mesh adds to a Respond beyond the model runtime's own time.

Starts the whole mesh in this process tree (services.devtools.mesh.Mesh: the four servers and
Envoy) against a zero-latency OpenAI-compatible runtime (tests/fakes/openai_chat.py
`FakeChatServer` in its own process, as bench/llm_overhead.py runs it), ingests samples/docs
into tenant `bench`, and sends S1 questions (document questions, rule-routed:
ORCH_MODEL_ROUTING=false) to OrchestratorService/Respond at concurrency 1, in interleaved
slices over two paths:

  grpc   Python grpc.aio straight to the orchestrator's port
  json   Python HTTP/1.1 keep-alive client, POST /internal/orchestrator/respond through Envoy

The fake model makes 3 tool calls (read_chunk_window on the anchors listed in the
orchestrator's first prompt), each executed by the real ToolsProxy, then answers. Every
request has a unique id, sent as its trace_id and, for the fake, in one earlier assistant turn
of `history`; retrieval's query-embedding cache is off (RETR_QUERY_CACHE_SIZE=0), so every
query is embedded as a new question would be. In the same run, per request:

  total     Respond latency as the client sees it
  rt-own    the runtime's own handling time of its 4 calls, timed in the fake's process
  overhead  total - rt-own: everything the mesh does for the request (the target's subject)
  embed     SearchResponse.meta.query_embedding_ms of the orchestrator's own Search
  engine    SearchResponse.meta.engine_ms of the same Search
  tools     ToolsProxy handling of the 3 Execute calls (its interceptor's latency_ms)
  hops      sum over the request's 9 inter-process calls of (caller's round trip - callee's
            handler time): client->orchestrator, orchestrator->retrieval,
            orchestrator->LLM, LLM->ToolsProxy x3, LLM->runtime x4
  parts     embed + engine + tools + hops
  glue      overhead - parts = the three services' own in-handler work (orchestrator,
            retrieval besides embed+engine, LLM service besides runtime and tool calls)

The orchestrator and the LLM service run from this file (`--serve-orch`, `--serve-llm`)
exactly as `python -m services.<svc>` runs them, after wrapping (not changing) their
downstream stubs to time the calls and keep the Search meta; the callees' handler times come
from each service's own "rpc" log line (latency_ms, trace_id). Target: p95(overhead) <= 1.3 x
p95(parts). bench/README.md explains.

    python bench/respond_overhead.py [--duration 30] [--rounds 6] [--paths grpc,json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
for _p in (str(REPO_ROOT), str(BENCH_DIR)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import llm_overhead  # noqa: E402
from llm_overhead import environment_info, fetch, free_ports, loadavg, pstats, serve_stats  # noqa: E402
from tool_limits import NO_TOOL_RATE_LIMITS  # noqa: E402
from transport import machine_cpu_s, percentile, proc_cpu_s, write_record  # noqa: E402

ME = str(Path(__file__).resolve())
TENANT = "bench"
DOCS_DIR = REPO_ROOT / "samples" / "docs"
STEPS = 3
QUESTIONS = (
    # (question, doc_id the top source must come from): all S1 by the rules
    ("Как настроить LDAP интеграцию?", "orion-x-admin-guide"),
    ("Как выполняется обновление кластера: в каком порядке обновляют узлы?",
     "orion-x-operations-manual"),
    ("Кто согласует выдачу административных прав сотруднику?", "orion-x-operations-manual"),
    ("In what order are cluster nodes updated during maintenance?", "orion-x-operations-manual"),
)  # fmt: skip
ANSWER = "Ответ по документам [стр. 2]."
MARK = re.compile(r"\(ref (?P<id>[0-9a-f]{32})\)")
ANCHOR = re.compile(r"doc_id=(?P<doc>\S+) section_id=\S+ anchor_chunk_id=(?P<anchor>\S+)")
PATHS = ("grpc", "json")
TIMEOUT_S = 60.0
FIRST_ERRORS: dict[str, str] = {}
TOP_SOURCES: dict[str, int] = {}
"""question -> first source's doc_id: count (a check that the answers stay on topic)."""


# ---------------------------------------------------------------------------------------
# The fake model: read_chunk_window on the prompt's anchors, STEPS times, then the answer


def make_model(_plan: Any, seen: threading.local | None = None):  # type: ignore[no-untyped-def]
    """Replaces llm_overhead.make_model in the fake's process (same signature)."""
    from tests.fakes.openai_chat import ChatRequest, Reply, text, tool_call

    def model(request: ChatRequest) -> Reply:
        messages = request.messages
        user = next(m for m in messages if m.get("role") == "user")
        content = str(user.get("content") or "")
        m = next(filter(None, (MARK.search(str(x.get("content") or "")) for x in messages)), None)
        if seen is not None and m:
            seen.id = m.group("id")
        anchors = [(a.group("doc"), a.group("anchor")) for a in ANCHOR.finditer(content)]
        done = sum(1 for x in messages if x.get("role") == "tool")
        if anchors and done < STEPS:
            doc, anchor = anchors[done % len(anchors)]
            return tool_call(
                "read_chunk_window", {"doc_id": doc, "anchor_chunk_id": anchor, "radius": 1}
            )
        return text(ANSWER)

    return model


def serve_fake(args: argparse.Namespace) -> None:
    llm_overhead.make_model = make_model  # serve_fake looks both up in its module
    llm_overhead.plan_from_env = lambda: []
    llm_overhead.serve_fake(args)


# ---------------------------------------------------------------------------------------
# The orchestrator, as `python -m services.orchestrator` runs it, its two stubs timed


def serve_orch(args: argparse.Namespace) -> None:
    from services.common.runner import run_service
    from services.orchestrator import app, clients
    from services.orchestrator.config import OrchestratorSettings

    # trace_id -> [search ns, embed ms, engine ms, retrieval_time_ms, searches,
    #              generate ns, generates]
    records: dict[str, list[float]] = {}

    def rec_for(trace_id: str) -> list[float]:
        return records.setdefault(trace_id, [0, 0.0, 0.0, 0, 0, 0, 0])

    retriever_init = clients.GrpcRetriever.__init__

    def timed_retriever(self, channel):  # type: ignore[no-untyped-def]
        retriever_init(self, channel)
        search = self._stub.Search

        async def timed_search(request, **kw):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter_ns()
            response = await search(request, **kw)
            rec = rec_for(request.trace_id)
            rec[0] += time.perf_counter_ns() - t0
            rec[1] += response.meta.query_embedding_ms
            rec[2] += response.meta.engine_ms
            rec[3] += response.meta.retrieval_time_ms
            rec[4] += 1
            return response

        self._stub.Search = timed_search

    generator_init = clients.GrpcGenerator.__init__

    def timed_generator(self, channel):  # type: ignore[no-untyped-def]
        generator_init(self, channel)
        generate = self._stub.Generate

        async def timed_generate(request, **kw):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter_ns()
            try:
                return await generate(request, **kw)
            finally:
                rec = rec_for(request.trace_id)
                rec[5] += time.perf_counter_ns() - t0
                rec[6] += 1

        self._stub.Generate = timed_generate

    clients.GrpcRetriever.__init__ = timed_retriever  # type: ignore[method-assign]
    clients.GrpcGenerator.__init__ = timed_generator  # type: ignore[method-assign]

    def snapshot(path: str) -> Any:
        out = {}
        for key in list(records):
            out[key] = records.pop(key)
        return out

    serve_stats(args.stats_port, snapshot)
    run_service(OrchestratorSettings.from_env, app.start)


def serve_llm(args: argparse.Namespace) -> None:
    """bench/llm_overhead.py's instrumented LLM service (Generate, runtime and Execute timed)."""
    args.inproc = False
    args.cprofile = ""
    llm_overhead.serve_llm(args)


# ---------------------------------------------------------------------------------------
# The parent: the mesh, the data, the load, the join


def bench_mesh_class():  # type: ignore[no-untyped-def]
    from services.common.topology import SERVICES
    from services.devtools.mesh import Mesh

    class BenchMesh(Mesh):
        """Mesh whose orchestrator and LLM service run from this file (instrumented)."""

        serve: dict[str, list[str]]  # set before start()

        def start_service(self, key: str) -> None:
            if key not in self.serve:
                super().start_service(key)
                return
            assert any(s.key == key for s in SERVICES)
            self.workdir.mkdir(parents=True, exist_ok=True)
            log = self.log_path(key).open("ab")
            self._logs[key] = log
            self._procs[key] = subprocess.Popen(
                [sys.executable, ME, *self.serve[key]], cwd=str(REPO_ROOT), env=self.env(),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    return BenchMesh


class RpcLog:
    """Reads each service's JSON log from where it last stopped: latency_ms per trace id."""

    def __init__(self, mesh: Any) -> None:
        self.mesh = mesh
        self.offsets: dict[str, int] = {}

    def read(self) -> dict[str, dict[str, list[float]]]:
        """{trace_id: {"<svc>:<Method>": [latency_ms, ...]}} of the "rpc" lines since last read."""
        out: dict[str, dict[str, list[float]]] = {}
        for key in ("orchestrator", "llm", "retrieval", "toolsproxy"):
            path = self.mesh.log_path(key)
            with path.open("rb") as f:
                f.seek(self.offsets.get(key, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1
            self.offsets[key] = self.offsets.get(key, 0) + end
            for line in data[:end].splitlines():
                if b'"rpc"' not in line:
                    continue
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if e.get("msg") != "rpc" or not e.get("trace_id"):
                    continue
                method = str(e.get("method", "")).rsplit("/", 1)[-1]
                out.setdefault(e["trace_id"], {}).setdefault(f"{key}:{method}", []).append(
                    float(e["latency_ms"])
                )
        return out


def ingest(mesh: Any, files: list[Path]) -> dict[str, int]:
    import grpc
    from visior.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc

    chunks = {}
    with grpc.insecure_channel(f"127.0.0.1:{mesh.ports.grpc['retrieval']}") as channel:
        stub = retrieval_pb2_grpc.IngestionServiceStub(channel)
        for f in files:
            r = stub.IngestDocument(
                retrieval_pb2.IngestDocumentRequest(
                    tenant_id=TENANT, file_name=f.name, content=f.read_bytes()
                ),
                timeout=600,
            )
            chunks[f.stem] = r.chunks
    return chunks


def question(i: int) -> tuple[str, str, str]:
    rid = uuid.uuid4().hex
    q, doc = QUESTIONS[i % len(QUESTIONS)]
    return rid, q, doc


def history(rid: str) -> list[dict[str, str]]:
    """One earlier assistant turn carrying the request's id to the fake model (the rules
    ignore assistant turns; retrieval never sees history)."""
    return [{"role": "assistant", "content": f"(ref {rid})"}]


class Client:
    """One path's closed loop at concurrency 1; checks every answer."""

    def __init__(self, path: str, mesh: Any) -> None:
        self.path, self.mesh = path, mesh
        self.n = 0

    async def open(self) -> None:
        import grpc
        import httpx
        from visior.orchestrator.v1 import orchestrator_pb2_grpc

        if self.path == "grpc":
            self.channel = grpc.aio.insecure_channel(
                f"127.0.0.1:{self.mesh.ports.grpc['orchestrator']}"
            )
            self.stub = orchestrator_pb2_grpc.OrchestratorServiceStub(self.channel)
        else:
            self.http = httpx.AsyncClient(
                base_url=self.mesh.json_url("orchestrator"), timeout=TIMEOUT_S
            )

    async def close(self) -> None:
        if self.path == "grpc":
            await self.channel.close()
        else:
            await self.http.aclose()

    async def one(self) -> tuple[str, int | None, str]:
        """(trace id, latency ns or None, error kind)."""
        import grpc
        from visior.common.v1 import common_pb2
        from visior.orchestrator.v1 import orchestrator_pb2

        rid, q, doc = question(self.n)
        self.n += 1
        user = {"tenant_id": TENANT, "user_id": "bench-user"}
        if self.path == "grpc":
            req = orchestrator_pb2.RespondRequest(
                query=q,
                user=common_pb2.UserContext(**user),
                trace_id=rid,
                history=[common_pb2.ChatMessage(**h) for h in history(rid)],
            )
            t0 = time.perf_counter_ns()
            try:
                r = await self.stub.Respond(req, timeout=TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                FIRST_ERRORS.setdefault(exc.code().name, exc.details() or "")
                return rid, None, exc.code().name
            elapsed = time.perf_counter_ns() - t0
            got = (r.telemetry.scenario, r.telemetry.tool_steps, r.answer,
                   r.sources[0].doc_id if r.sources else "")  # fmt: skip
        else:
            body = {"query": q, "user": user, "trace_id": rid, "history": history(rid)}
            t0 = time.perf_counter_ns()
            try:
                resp = await self.http.post("/internal/orchestrator/respond", json=body)
            except Exception as exc:  # counted as an error
                FIRST_ERRORS.setdefault(type(exc).__name__, str(exc))
                return rid, None, type(exc).__name__
            elapsed = time.perf_counter_ns() - t0
            if resp.status_code != 200:
                FIRST_ERRORS.setdefault(f"HTTP {resp.status_code}", resp.text[:300])
                return rid, None, f"HTTP {resp.status_code}"
            r = resp.json()
            t = r.get("telemetry", {})
            got = (t.get("scenario"), int(t.get("tool_steps", 0)), r.get("answer"),
                   (r.get("sources") or [{}])[0].get("doc_id", ""))  # fmt: skip
        if got[:3] != ("S1", STEPS, ANSWER) or not got[3]:
            FIRST_ERRORS.setdefault(f"WRONG_ANSWER {q[:40]!r}", repr(got)[:300])
            return rid, None, "WRONG_ANSWER"
        # Which document came first: retrieval quality, not this benchmark's subject; reported.
        key = f"{q} -> {got[3]}{'' if got[3] == doc else ' (expected ' + doc + ')'}"
        TOP_SOURCES[key] = TOP_SOURCES.get(key, 0) + 1
        return rid, elapsed, ""


async def run_slice(client: Client, seconds: float) -> tuple[list[tuple[str, int]], dict, float]:
    lat: list[tuple[str, int]] = []
    errors: dict[str, int] = {}
    t_start = time.perf_counter()
    while time.perf_counter() < t_start + seconds:
        rid, ns, err = await client.one()
        if ns is None:
            errors[err] = errors.get(err, 0) + 1
        else:
            lat.append((rid, ns))
    return lat, errors, time.perf_counter() - t_start


def join(
    lat: list[tuple[str, int]],
    orch: dict[str, list[float]],
    llm: dict[str, list[int]],
    fake: list,
    logs: dict[str, dict[str, list[float]]],
) -> tuple[list[dict[str, Any]], int]:
    own: dict[str, list[int]] = {}
    for rid, ns in fake:
        own.setdefault(rid, []).append(ns)
    rows, missing = [], 0
    for rid, total_ns in lat:
        o, g, rt, lg = orch.get(rid), llm.get(rid), own.get(rid), logs.get(rid, {})
        handlers = (lg.get("orchestrator:Respond"), lg.get("retrieval:Search"),
                    lg.get("llm:Generate"), lg.get("toolsproxy:Execute"))  # fmt: skip
        if o is None or g is None or rt is None or any(h is None for h in handlers):
            missing += 1
            continue
        orch_h, retr_h, llm_h, tp = (sum(h) for h in handlers)  # type: ignore[arg-type]
        search, embed, engine, retr_ms, n_search, generate, n_gen = o
        # llm_overhead's record: handler, runtime, runtime calls, tools, tool calls, ...
        _handler, runtime, rt_calls, execute, tool_calls = g[:5]
        total = total_ns / 1e6
        rt_own = sum(rt) / 1e6
        hop = {
            "client": total - orch_h,
            "retrieval": search / 1e6 - retr_h,
            "llm": generate / 1e6 - llm_h,
            "toolsproxy": execute / 1e6 - tp,
            "runtime": runtime / 1e6 - rt_own,
        }
        hops = sum(hop.values())
        overhead = total - rt_own
        parts = embed + engine + tp + hops
        rows.append({
            "total": total, "rt_own": rt_own, "overhead": overhead,
            "embed": embed, "engine": engine, "tools": tp, "hops": hops,
            "parts": parts, "parts_strict": embed + engine + hops,
            "glue": overhead - parts,
            "glue_orch": orch_h - search / 1e6 - generate / 1e6,
            "glue_retrieval": retr_h - embed - engine,
            "glue_llm": llm_h - runtime / 1e6 - execute / 1e6,
            "runtime": runtime / 1e6, "overhead_transport": total - runtime / 1e6,
            "search_rtt": search / 1e6, "retrieval_handler": retr_h,
            "retrieval_time_ms": retr_ms,
            **{f"hop_{k}": v for k, v in hop.items()},
            "calls": (n_search, n_gen, rt_calls, len(rt), tool_calls,
                      len(lg["toolsproxy:Execute"])),
        })  # fmt: skip
    return rows, missing


COLS = (
    "total", "rt_own", "overhead", "embed", "engine", "tools", "hops", "parts", "parts_strict",
    "glue", "glue_orch", "glue_retrieval", "glue_llm", "runtime", "overhead_transport",
    "search_rtt", "retrieval_handler", "hop_client", "hop_retrieval", "hop_llm",
    "hop_toolsproxy", "hop_runtime",
)  # fmt: skip


class Cell:
    def __init__(self, path: str) -> None:
        self.path = path
        self.rows: list[dict[str, Any]] = []
        self.errors: dict[str, int] = {}
        self.missing = 0
        self.wall_s = 0.0
        self.other_cores: list[float] = []
        self.steal_cores: list[float] = []
        self.slice_p95: list[tuple[float, float]] = []  # (overhead p95, parts p95)


async def measure(mesh: Any, stats: dict[str, int], args: argparse.Namespace) -> list[Cell]:
    clients = {p: Client(p, mesh) for p in args.paths}
    for c in clients.values():
        await c.open()
    cells = {p: Cell(p) for p in args.paths}
    rpclog = RpcLog(mesh)
    watched = [os.getpid(), *mesh.pids().values(), *stats["pids"]]

    def drain() -> tuple[dict, dict, list, dict]:
        return (fetch(stats["orch"], "/records"), fetch(stats["llm"], "/records"),
                fetch(stats["fake"], "/records"), rpclog.read())  # fmt: skip

    try:
        for p in args.paths:  # warm-up, discarded
            await run_slice(clients[p], args.warmup)
        await asyncio.sleep(0.5)  # the last log lines
        drain()
        for r in range(args.rounds):
            for p in args.paths:
                cell = cells[p]
                ours0 = sum(proc_cpu_s(x) for x in watched)
                busy0, steal0 = machine_cpu_s()
                lat, errors, wall = await run_slice(clients[p], args.duration / args.rounds)
                busy1, steal1 = machine_cpu_s()
                ours1 = sum(proc_cpu_s(x) for x in watched)
                cell.wall_s += wall
                cell.other_cores.append(max(0.0, (busy1 - busy0) - (ours1 - ours0)) / wall)
                cell.steal_cores.append((steal1 - steal0) / wall)
                await asyncio.sleep(0.3)  # let the services flush their last "rpc" lines
                rows, missing = join(lat, *drain())
                cell.rows += rows
                cell.missing += missing
                for k, n in errors.items():
                    cell.errors[k] = cell.errors.get(k, 0) + n
                if rows:
                    cell.slice_p95.append(
                        (percentile(sorted(x["overhead"] for x in rows), 95),
                         percentile(sorted(x["parts"] for x in rows), 95))
                    )  # fmt: skip
                print(
                    f"  round {r + 1}/{args.rounds} {p:<4} {len(rows):>4} req  other "
                    f"{cell.other_cores[-1]:.2f} steal {cell.steal_cores[-1]:.2f} cores",
                    flush=True,
                )
    finally:
        for c in clients.values():
            await c.close()
    return list(cells.values())


def summarize(cell: Cell) -> dict[str, Any]:
    out: dict[str, Any] = {
        "path": cell.path,
        "requests": len(cell.rows),
        "errors": cell.errors,
        "unmatched": cell.missing,
        "rps": round(len(cell.rows) / cell.wall_s, 1) if cell.wall_s else 0.0,
        "other_cores_max": round(max(cell.other_cores, default=0.0), 2),
        "other_cores_mean": round(sum(cell.other_cores) / max(1, len(cell.other_cores)), 2),
        "steal_cores_max": round(max(cell.steal_cores, default=0.0), 2),
        "slice_p95_overhead_parts": [[round(a, 2), round(b, 2)] for a, b in cell.slice_p95],
        "calls_per_request": sorted({tuple(r["calls"]) for r in cell.rows}),
    }
    for col in COLS:
        vals = [r[col] for r in cell.rows]
        if vals:
            out[col] = pstats(vals)
    return out


def format_table(summaries: list[dict[str, Any]]) -> str:
    cols = ("total", "rt_own", "overhead", "embed", "engine", "tools", "hops", "parts", "glue")
    head = f"{'path':<5} {'reqs':>5} " + " ".join(f"{c + ' p50/p95':>16}" for c in cols)
    head += f" {'err':>4}"
    lines = [head, "-" * len(head)]
    for s in summaries:
        if "total" not in s:
            lines.append(f"{s['path']:<5} {s['requests']:>5}  (no matched request)")
            continue
        cells = " ".join(f"{s[c]['p50']:7.2f}/{s[c]['p95']:<8.2f}" for c in cols)
        errs = sum(s["errors"].values()) + s["unmatched"]
        lines.append(f"{s['path']:<5} {s['requests']:>5} {cells} {errs:>4}")
    return "\n".join(lines)


def format_breakdown(summaries: list[dict[str, Any]]) -> str:
    cols = ("hop_client", "hop_retrieval", "hop_llm", "hop_toolsproxy", "hop_runtime",
            "glue_orch", "glue_retrieval", "glue_llm")  # fmt: skip
    head = f"{'path':<5} " + " ".join(f"{c.replace('_', ' '):>14}" for c in cols)
    lines = [head, "-" * len(head)]
    for s in summaries:
        if "total" in s:
            lines.append(
                f"{s['path']:<5} "
                + " ".join(f"{s[c]['p50']:6.2f}/{s[c]['p95']:<7.2f}" for c in cols)
            )
    return "\n".join(lines)


def verdicts(summaries: list[dict[str, Any]], args: argparse.Namespace) -> tuple[dict, list]:
    lines, verdict = [], {}
    for s in summaries:
        if "overhead" not in s:
            continue
        o, p, ps = s["overhead"]["p95"], s["parts"]["p95"], s["parts_strict"]["p95"]
        ok = o <= args.factor * p
        verdict[s["path"]] = {"overhead_p95": o, "parts_p95": p, "ratio": round(o / p, 3),
                              "pass": ok}  # fmt: skip
        lines.append(
            f"{s['path']}: p95 overhead {o:.2f} ms vs {args.factor:g} x p95 parts "
            f"(embed+engine+tools+hops) {p:.2f} = {args.factor * p:.2f} ms "
            f"(ratio {o / p:.2f}): {'PASS' if ok else 'MISS'}"
        )
        lines.append(
            f"  p50 overhead {s['overhead']['p50']:.2f} / parts {s['parts']['p50']:.2f} ms; "
            f"without the tools in the parts (embed+engine+hops) p95 {ps:.2f} ms: ratio "
            f"{o / ps:.2f} ({'PASS' if o <= args.factor * ps else 'MISS'}); overhead with the "
            f"runtime taken as the LLM's transport time (as bench/llm_overhead.py) p95 "
            f"{s['overhead_transport']['p95']:.2f} ms"
        )
        lines.append(
            "  per round p95 overhead/parts: "
            + ", ".join(f"{a:.1f}/{b:.1f}" for a, b in s["slice_p95_overhead_parts"])
        )
    busy = [s for s in summaries if s["other_cores_max"] > args.busy_threshold
            or s["steal_cores_max"] > 0.05]  # fmt: skip
    if busy:
        lines.append(
            f"WARNING: other load up to {max(s['other_cores_max'] for s in busy):.2f} cores "
            f"(mean {max(s['other_cores_mean'] for s in busy):.2f}), steal up to "
            f"{max(s['steal_cores_max'] for s in busy):.2f} during some slices: a noisy run"
        )
    for s in summaries:
        if s["errors"] or s["unmatched"]:
            lines.append(f"WARNING: {s['path']}: errors {s['errors']}, unmatched {s['unmatched']}")
    for code, message in FIRST_ERRORS.items():
        lines.append(f"  first {code}: {message[:300]}")
    lines.append(
        "First source per question (all paths): "
        + "; ".join(f"{k}: {n}" for k, n in sorted(TOP_SOURCES.items()))
    )
    return verdict, lines


@contextlib.contextmanager
def running(args: argparse.Namespace, tmp: Path) -> Iterator[tuple[Any, dict[str, Any]]]:
    from services.common.topology import Ports

    py = sys.executable
    fake_stats, orch_stats, llm_stats = free_ports(3)
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "LLM_RUNTIME_URL": "",  # set below
        "DEFAULT_MODEL_NAME": "fake",
        "ORCH_MODEL_ROUTING": "false",
        # Every question is new to the server, as in use: the questions repeat, so the
        # query-embedding cache is off (--query-cache keeps it: embed ~0 after the first).
        **({} if args.query_cache else {"RETR_QUERY_CACHE_SIZE": "0"}),
        **NO_TOOL_RATE_LIMITS,  # bench/tool_limits.py
        **dict(kv.split("=", 1) for kv in args.server_env),
    }
    fake_argv = [py, ME, "--serve-fake", "--stats-port", str(fake_stats)]
    fake = subprocess.Popen(
        fake_argv, cwd=str(REPO_ROOT), env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=(tmp / "fake.log").open("ab"),
    )  # fmt: skip
    mesh = None
    try:
        assert fake.stdout is not None
        line = fake.stdout.readline().decode().strip()
        if not line.startswith("FAKE_URL "):
            raise RuntimeError(f"fake runtime did not start:\n{(tmp / 'fake.log').read_text()}")
        env["LLM_RUNTIME_URL"] = line.split()[1]
        mesh = bench_mesh_class()(Ports.free(), tmp / "data", tmp / "run", env=env)
        mesh.serve = {
            "orchestrator": ["--serve-orch", "--stats-port", str(orch_stats)],
            "llm": ["--serve-llm", "--stats-port", str(llm_stats)],
        }
        mesh.start()
        yield mesh, {"fake": fake_stats, "orch": orch_stats, "llm": llm_stats,
                     "pids": [fake.pid], "fake_url": env["LLM_RUNTIME_URL"]}  # fmt: skip
        dead = [k for k, alive in mesh.alive().items() if not alive]
        if dead or fake.poll() is not None:
            raise RuntimeError(f"process(es) died during the benchmark: {dead}")
    finally:
        if mesh is not None:
            mesh.stop()
        if fake.poll() is None:
            fake.send_signal(signal.SIGTERM)
            try:
                fake.wait(10)
            except subprocess.TimeoutExpired:
                fake.kill()
                fake.wait()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    stamp = dt.datetime.now().strftime("%Y-%m-%d-%H%M%S")
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--duration", type=float, default=30, help="measured s per path (30)")
    ap.add_argument("--rounds", type=int, default=6, help="interleaved slices per path (6)")
    ap.add_argument("--warmup", type=float, default=3, help="warm-up s per path (3)")
    ap.add_argument("--paths", type=lambda s: s.split(","), default=list(PATHS),
                    help="grpc,json (both)")  # fmt: skip
    ap.add_argument("--docs", type=lambda s: s.split(","), default=[],
                    help="samples/docs files to ingest (all of them)")  # fmt: skip
    ap.add_argument(
        "--query-cache",
        action="store_true",
        help="keep retrieval's query-embedding cache (off: every query embedded)",
    )
    ap.add_argument(
        "--factor", type=float, default=1.3, help="target: p95 overhead <= F x p95 parts"
    )
    ap.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE",
                    help="extra environment for every process of the mesh (repeatable)")  # fmt: skip
    ap.add_argument("--busy-threshold", type=float, default=0.25, help="warn above (cores)")
    ap.add_argument(
        "--out", type=Path,
        default=REPO_ROOT / "bench" / "out" / f"respond-overhead-{stamp}.json",
        help="JSON record (bench/out/respond-overhead-<date>-<time>.json, ignored by git)",
    )  # fmt: skip
    ap.add_argument("--serve-fake", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--serve-orch", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--serve-llm", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--stats-port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--keep-nagle", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if set(args.paths) - set(PATHS):
        ap.error(f"unknown paths: {sorted(set(args.paths) - set(PATHS))}")
    return args


def _terminate(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve_fake:
        serve_fake(args)
        return 0
    if args.serve_orch:
        serve_orch(args)
        return 0
    if args.serve_llm:
        serve_llm(args)
        return 0
    signal.signal(signal.SIGTERM, _terminate)
    started = dt.datetime.now(dt.UTC)
    load_before = loadavg()
    print(f"load average before: {load_before}", flush=True)
    files = [DOCS_DIR / d for d in args.docs] if args.docs else sorted(
        f for f in DOCS_DIR.iterdir() if f.suffix in (".md", ".pdf")
    )  # fmt: skip
    keep = os.environ.get("BENCH_KEEP_LOGS")
    with tempfile.TemporaryDirectory(prefix="bench-respond-") as tmpdir:
        tmp = Path(keep or tmpdir)
        tmp.mkdir(parents=True, exist_ok=True)
        with running(args, tmp) as (mesh, stats):
            t0 = time.perf_counter()
            chunks = ingest(mesh, files)
            print(
                f"up: mesh + fake runtime {stats['fake_url']}; ingested {chunks} into tenant "
                f"{TENANT} in {time.perf_counter() - t0:.1f}s; per path {args.warmup:g}s "
                f"warm-up, then {args.rounds} x {args.duration / args.rounds:g}s interleaved",
                flush=True,
            )
            cells = asyncio.run(measure(mesh, stats, args))
    load_after = loadavg()
    summaries = [summarize(c) for c in cells]
    verdict, lines = verdicts(summaries, args)
    table, breakdown = format_table(summaries), format_breakdown(summaries)
    print(f"\n{table}\n\n" + "\n".join(lines))
    print(f"\nHops and glue, ms p50/p95 per Respond:\n{breakdown}")
    print(f"load average before {load_before}, after {load_after}")

    write_record(
        "respond-overhead",
        started,
        args,
        environment_info(),
        documents=chunks,
        loadavg={"before": load_before, "after": load_after},
        verdict=verdict,
        results=summaries,
        table=table.splitlines(),
        breakdown=breakdown.splitlines(),
        notes=lines,
        top_sources=TOP_SOURCES,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
