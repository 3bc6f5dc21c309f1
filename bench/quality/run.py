"""Retrieval-quality harness: ingest the gold corpus into a Retrieval server, search, score."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for extra in (REPO, REPO / "gen" / "python"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import grpc  # noqa: E402
from visior.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc  # noqa: E402

from bench.quality.gold import (  # noqa: E402
    SPLITS,
    GoldQuery,
    corpus_files,
    load_queries,
    validate_gold,
)
from bench.quality.metrics import (  # noqa: E402
    LEVELS,
    Level,
    QueryScore,
    RetrievedHit,
    doc_id_for,
    mean_scores,
    score_query,
)
from services.common.topology import free_ports  # noqa: E402

RESULTS_DIR = Path(__file__).resolve().parents[1] / "out" / "quality"  # ignored by git
MODES = ("section_first", "doc_first", "chunk_priority", "hybrid_only")
DEFAULT_TARGET = "127.0.0.1:50053"
MAX_MESSAGE = 64 * 1024 * 1024


@dataclass(frozen=True)
class Config:
    """One ranking configuration: the SearchParams fields that select it."""

    name: str
    fields: dict[str, object]
    """SearchParams fields to set, e.g. {"ranking": "hybrid", "fusion": "rrf"}."""
    needs_rerank: bool = False
    """Only meaningful when the server has a reranker (RERANK_MODEL_URL or RERANK_MODEL_PATH)."""


CONFIGS: tuple[Config, ...] = (
    Config("bm25", {"ranking": "sparse"}),
    Config("dense", {"ranking": "dense"}),
    Config("hybrid-weighted", {"ranking": "hybrid", "fusion": "weighted"}),
    Config("hybrid-rrf", {"ranking": "hybrid", "fusion": "rrf"}),
    Config(
        "hybrid+rerank",
        {"ranking": "hybrid", "fusion": "weighted", "enable_rerank": True},
        needs_rerank=True,
    ),
    # What a caller gets without choosing: whatever the server is configured to do.
    Config("server-default", {}),
)


def missing_fields(cfg: Config) -> list[str]:
    """SearchParams fields this configuration needs that the generated code lacks."""
    known = retrieval_pb2.SearchParams.DESCRIPTOR.fields_by_name
    return [name for name in cfg.fields if name not in known]


@dataclass
class QueryRun:
    """What one search returned for one query, reduced to what the metrics need."""

    qid: str
    hits: list[RetrievedHit]
    latency_ms: float
    hybrid_used: bool = False
    rerank_used: bool = False
    error: str = ""


@dataclass
class RowResult:
    """One table row: a configuration and mode over one split and one query group."""

    config: str
    mode: str
    split: str
    group: str
    queries: int
    metrics: dict[str, float] = field(default_factory=dict)
    note: str = ""


# --------------------------------------------------------------------------- server


@contextmanager
def spawned_server(extra_env: dict[str, str], server_dir: Path) -> Iterator[str]:
    """Start `python -m services.retrieval` (from server_dir) on a free port and a tmp data dir."""
    work = Path(tempfile.mkdtemp(prefix="visior-quality-"))
    data_dir = work / "data"
    log_path = work / "server.log"
    port = free_ports(1)[0]
    env = dict(os.environ)
    env.update(
        {
            "RETR_HOST": "127.0.0.1",
            "RETR_PORT": str(port),
            "VISIOR_DATA_DIR": str(data_dir),
            "LOG_LEVEL": env.get("LOG_LEVEL", "WARNING"),
        }
    )
    env.update(extra_env)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(server_dir), str(server_dir / "gen" / "python"), env.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.retrieval"],
        cwd=server_dir,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    target = f"127.0.0.1:{port}"
    try:
        wait_ready(target, proc, log_path)
        print(f"spawned retrieval server pid {proc.pid} on {target} from {server_dir}")
        yield target
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(work, ignore_errors=True)


def wait_ready(target: str, proc: subprocess.Popen[bytes], log_path: Path) -> None:
    """Poll GetHealth until the spawned server answers (or died, or 120 s passed)."""
    deadline = time.monotonic() + 120
    with grpc.insecure_channel(target) as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise SystemExit(f"the retrieval server exited with {proc.returncode}:\n{tail}")
            try:
                stub.GetHealth(retrieval_pb2.GetHealthRequest(), timeout=2)
                return
            except grpc.RpcError:
                time.sleep(0.5)
    raise SystemExit(f"the retrieval server on {target} did not become ready in 120 s")


# --------------------------------------------------------------------------- ingest


def ingest_corpus(
    channel: grpc.Channel, tenant: str, timeout: float
) -> tuple[dict[str, dict[str, object]], list[str]]:
    """IngestDocument every corpus file, with progress; returns stats per doc and failures."""
    stub = retrieval_pb2_grpc.IngestionServiceStub(channel)
    files = corpus_files()
    total = sum(p.stat().st_size for p in files)
    done = 0
    stats: dict[str, dict[str, object]] = {}
    failed: list[str] = []
    started = time.perf_counter()
    for n, path in enumerate(files, start=1):
        content = path.read_bytes()
        doc_id = doc_id_for(path.name)
        prefix = f"[{n:2d}/{len(files)}] {path.name} ({len(content) / 1024:.0f} KB)"
        # On a terminal the line is rewritten in place; in a log only the result line appears.
        tty = sys.stdout.isatty()
        if tty:
            print(f"{prefix} ...", end="", flush=True)
        t0 = time.perf_counter()
        try:
            resp = stub.IngestDocument(
                retrieval_pb2.IngestDocumentRequest(
                    tenant_id=tenant, file_name=path.name, doc_id=doc_id, content=content
                ),
                timeout=timeout,
            )
        except grpc.RpcError as exc:
            failed.append(path.name)
            print(f"{chr(13) if tty else ''}{prefix} FAILED {exc.code().name}: {exc.details()}")
            continue
        finally:
            done += len(content)
        took = time.perf_counter() - t0
        stats[doc_id] = {
            "file": path.name,
            "pages": resp.pages,
            "sections": resp.sections,
            "chunks": resp.chunks,
            "seconds": round(took, 3),
        }
        print(
            f"{chr(13) if tty else ''}{prefix} {took:6.1f} s  pages={resp.pages} sections={resp.sections} "
            f"chunks={resp.chunks}  [{100 * done / total:3.0f}% of bytes, "
            f"{time.perf_counter() - started:.0f} s]"
        )
    return stats, failed


# --------------------------------------------------------------------------- search


class Searcher:
    """Runs Search for one configuration and mode and resolves section titles."""

    def __init__(self, channel: grpc.Channel, tenant: str, max_results: int, timeout: float):
        self._stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        self._tenant = tenant
        self._max_results = max_results
        self._timeout = timeout
        self.titles: dict[str, str] = {}
        """section_id -> title, learnt from every response's used_sections."""
        self.unresolved: set[str] = set()

    def params(self, cfg: Config, mode: str) -> retrieval_pb2.SearchParams:
        """SearchParams for a configuration and mode."""
        params = retrieval_pb2.SearchParams(retrieval_mode=mode)
        for name, value in cfg.fields.items():
            setattr(params, name, value)
        return params

    def _search(
        self, query: str, params: retrieval_pb2.SearchParams, section_id: str = ""
    ) -> retrieval_pb2.SearchResponse:
        request = retrieval_pb2.SearchRequest(
            query=query,
            tenant_id=self._tenant,
            max_results=1 if section_id else self._max_results,
            params=params,
        )
        if section_id:
            request.filters.section_ids.append(section_id)
        response: retrieval_pb2.SearchResponse = self._stub.Search(request, timeout=self._timeout)
        for sec in response.used_sections:
            if sec.section_id and sec.title:
                self.titles[sec.section_id] = sec.title
        return response

    def title(self, section_id: str, query: str, params: retrieval_pb2.SearchParams) -> str | None:
        """A section's title: from used_sections seen so far, else a Search filtered to it."""
        if not section_id:
            return None
        if section_id not in self.titles and section_id not in self.unresolved:
            try:
                self._search(query, params, section_id)
            except grpc.RpcError:
                pass
            if section_id not in self.titles:
                self.unresolved.add(section_id)
        return self.titles.get(section_id)

    def run(self, q: GoldQuery, cfg: Config, mode: str) -> QueryRun:
        """Search one query; hits (or the full spec's chunks when hits are empty) in order."""
        params = self.params(cfg, mode)
        t0 = time.perf_counter()
        try:
            response = self._search(q.query, params)
        except grpc.RpcError as exc:
            return QueryRun(q.qid, [], 0.0, error=f"{exc.code().name}: {exc.details()}")
        latency = (time.perf_counter() - t0) * 1000
        items = list(response.hits) or list(response.chunks)
        hits = [
            RetrievedHit(
                doc_id=h.doc_id,
                section_title=self.title(h.section_id, q.query, params),
                page_start=h.page_start,
                page_end=h.page_end,
            )
            for h in items
        ]
        return QueryRun(
            q.qid,
            hits,
            latency,
            hybrid_used=response.meta.hybrid_used,
            rerank_used=response.meta.rerank_used,
        )


# --------------------------------------------------------------------------- scoring


def groups_of(q: GoldQuery) -> list[str]:
    """Table groups a query belongs to: all, its language, cross-lingual and mixed-language
    when it is."""
    out = ["all", q.lang]
    if q.cross_lingual:
        out.append("cross")
    if q.mixed_language:
        out.append("mixed")
    return out


def score_runs(
    cfg: Config,
    mode: str,
    queries: Sequence[GoldQuery],
    runs: dict[str, QueryRun],
    level: Level,
    splits: Sequence[str],
) -> tuple[list[RowResult], dict[str, dict[str, float]]]:
    """Rows per split and group, and per-query scores."""
    rows: list[RowResult] = []
    per_query: dict[str, dict[str, float]] = {}
    scored: dict[tuple[str, str], list[QueryScore]] = {}
    for q in queries:
        score = score_query(runs[q.qid].hits, q.relevant, level)
        if score is None:
            continue
        per_query[q.qid] = asdict(score)
        for group in groups_of(q):
            scored.setdefault((q.split, group), []).append(score)
    lat = [r.latency_ms for r in runs.values() if not r.error]
    errors = sum(1 for r in runs.values() if r.error)
    note_parts = []
    if errors:
        first = next(r.error for r in runs.values() if r.error)
        note_parts.append(f"{errors} errors ({first[:60]})")
    if runs and lat:
        hybrid = sum(r.hybrid_used for r in runs.values()) / len(runs)
        rerank = sum(r.rerank_used for r in runs.values()) / len(runs)
        note_parts.append(f"hybrid_used {hybrid:.0%} rerank_used {rerank:.0%}")
        note_parts.append(f"p50 {statistics.median(lat):.1f} ms")
    note = "; ".join(note_parts)
    for split in splits:
        for group in ("all", "ru", "en", "cross", "mixed"):
            scores = scored.get((split, group), [])
            if not scores:
                continue
            rows.append(
                RowResult(cfg.name, mode, split, group, len(scores), mean_scores(scores), note)
            )
    return rows, per_query


HEADER = (
    f"{'config':<16} {'mode':<15} {'split':<8} {'group':<6} {'nDCG@10':>7} {'R@5':>6} "
    f"{'R@10':>6} {'hit@1':>6} {'hit@5':>6} {'MRR':>6} {'n':>4}  notes"
)


def format_row(row: RowResult) -> str:
    """One table line."""
    m = row.metrics
    return (
        f"{row.config:<16} {row.mode:<15} {row.split:<8} {row.group:<6} {m['ndcg10']:7.3f} "
        f"{m['recall5']:6.3f} {m['recall10']:6.3f} {m['hit1']:6.3f} {m['hit5']:6.3f} "
        f"{m['mrr']:6.3f} {row.queries:4d}  {row.note if row.group == 'all' else ''}"
    )


def format_skip(cfg: Config, mode: str, reason: str) -> str:
    """A table line for a configuration that did not run."""
    return f"{cfg.name:<16} {mode:<15} {'-':<8} {'-':<6} {reason}"


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--target", default=DEFAULT_TARGET, help="Retrieval gRPC host:port")
    p.add_argument("--spawn", action="store_true", help="start python -m services.retrieval")
    p.add_argument(
        "--server-dir",
        type=Path,
        default=REPO,
        help="checkout whose services.retrieval --spawn starts (default: this one)",
    )
    p.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="K=V",
        help="extra environment for --spawn (repeatable), e.g. RETR_EMBEDDING_PROFILE=fast",
    )
    p.add_argument("--tenant", default="quality-bench", help="tenant to ingest into and search")
    p.add_argument("--split", choices=(*SPLITS, "all"), default="dev")
    p.add_argument("--level", choices=LEVELS, default="section")
    p.add_argument(
        "--configs",
        default=",".join(c.name for c in CONFIGS),
        help="comma-separated configurations",
    )
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated retrieval modes")
    p.add_argument("--max-results", type=int, default=10)
    p.add_argument("--skip-ingest", action="store_true", help="the corpus is already ingested")
    p.add_argument("--rerank", action="store_true", help="run the rerank row without checking env")
    p.add_argument("--timeout", type=float, default=30.0, help="Search deadline, seconds")
    p.add_argument("--ingest-timeout", type=float, default=900.0, help="per document, seconds")
    p.add_argument("--out", type=Path, help="results JSON (default bench/out/quality/…)")
    p.add_argument("--check", action="store_true", help="validate the gold set and exit")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the harness; returns the exit code."""
    args = parse_args(argv)
    splits = list(SPLITS) if args.split == "all" else [args.split]
    queries = [q for s in splits for q in load_queries(s)]
    problems = validate_gold(queries)
    if problems:
        print("the gold set does not match the corpus:\n  " + "\n  ".join(problems))
        return 1
    if args.check:
        print(f"gold set OK: {len(queries)} queries ({', '.join(splits)})")
        return 0
    if "heldout" in splits:
        print("NOTE: scoring the HELD-OUT split. Report it; do not tune on it.")
    configs = [c for c in CONFIGS if c.name in args.configs.split(",")]
    unknown = set(args.configs.split(",")) - {c.name for c in CONFIGS}
    modes = [m for m in args.modes.split(",") if m]
    if unknown or not set(modes) <= set(MODES):
        print(f"unknown configs {sorted(unknown)} or modes {modes}")
        return 2
    extra_env = dict(kv.split("=", 1) for kv in args.server_env)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y-%m-%d-%H%M%S")
    out = args.out or RESULTS_DIR / f"quality-{stamp}-{args.split}-{args.level}.json"
    if args.spawn:
        with spawned_server(extra_env, args.server_dir.resolve()) as target:
            return evaluate(args, target, queries, splits, configs, modes, out, extra_env)
    return evaluate(args, args.target, queries, splits, configs, modes, out, extra_env)


def evaluate(
    args: argparse.Namespace,
    target: str,
    queries: list[GoldQuery],
    splits: list[str],
    configs: list[Config],
    modes: list[str],
    out: Path,
    extra_env: dict[str, str],
) -> int:
    """Ingest, search every configuration and mode, print the table, write the JSON."""
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE),
        ("grpc.max_receive_message_length", MAX_MESSAGE),
    ]
    record: dict[str, object] = {
        "when": dt.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "target": target,
        "tenant": args.tenant,
        "split": args.split,
        "level": args.level,
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
    }
    with grpc.insecure_channel(target, options=options) as channel:
        health = retrieval_pb2_grpc.RetrievalServiceStub(channel).GetHealth(
            retrieval_pb2.GetHealthRequest(), timeout=10
        )
        record["server_health"] = {"status": health.status, **dict(health.details)}
        print(f"server {target}: {health.status} {dict(health.details)}")
        if not args.skip_ingest:
            stats, failed = ingest_corpus(channel, args.tenant, args.ingest_timeout)
            record["ingested"] = stats
            record["not_ingested"] = failed
            if failed:
                print(
                    f"WARNING: {len(failed)} documents were not ingested: {', '.join(failed)}; "
                    "queries judged on them count as misses."
                )
        rerank_env = args.rerank or any(
            os.environ.get(name) or extra_env.get(name)
            for name in ("RERANK_MODEL_URL", "RERANK_MODEL_PATH")
        )
        searcher = Searcher(channel, args.tenant, args.max_results, args.timeout)
        table: list[str] = []
        rows_out: list[dict[str, object]] = []
        per_query_out: dict[str, object] = {}
        print()
        print(f"level={args.level}  split={args.split}  k: nDCG@10, R@5, R@10, hit@1, hit@5")
        print(HEADER)
        print("-" * len(HEADER))
        for cfg in configs:
            missing = missing_fields(cfg)
            if missing:
                line = format_skip(
                    cfg, "*", f"SKIPPED: SearchParams has no {missing} in gen/python (regenerate)"
                )
                print(line)
                table.append(line)
                continue
            if cfg.needs_rerank and not rerank_env:
                line = format_skip(
                    cfg, "*", "not configured (RERANK_MODEL_URL / RERANK_MODEL_PATH unset)"
                )
                print(line)
                table.append(line)
                continue
            for mode in modes:
                runs = {q.qid: searcher.run(q, cfg, mode) for q in queries}
                if all(r.error for r in runs.values()):
                    first = next(iter(runs.values())).error
                    line = format_skip(cfg, mode, f"FAILED on every query: {first[:90]}")
                    print(line)
                    table.append(line)
                    continue
                rows, per_query = score_runs(cfg, mode, queries, runs, args.level, splits)
                for row in rows:
                    line = format_row(row)
                    print(line)
                    table.append(line)
                    rows_out.append(asdict(row))
                per_query_out[f"{cfg.name}/{mode}"] = {
                    qid: {
                        "scores": per_query.get(qid),
                        "error": run.error,
                        "top": [
                            [h.doc_id, h.section_title, h.page_start, h.page_end]
                            for h in run.hits[:10]
                        ],
                    }
                    for qid, run in runs.items()
                }
        if searcher.unresolved:
            print(f"{len(searcher.unresolved)} section ids had no title (scored as not relevant)")
    record["rows"] = rows_out
    record["table"] = table
    record["unresolved_sections"] = sorted(searcher.unresolved)
    record["per_query"] = per_query_out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, ensure_ascii=False, indent=1), encoding="utf-8")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
