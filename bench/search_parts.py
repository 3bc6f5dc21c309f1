"""Where one search's time goes, on retrieval_search.py's data dirs. Two parts:

  edge   Qdrant Edge alone, in this process: the four id-only lists of a default
         (section_first, hybrid) search in one `search_ids_batch`, then its dense lists
         alone and its BM25 lists alone; wall and CPU time a search (Edge searches a
         shard's segments on threads of its own, so CPU exceeds wall).
  split  the retrieval server (its Envoy too, not used) on a copy of the data dir, one gRPC
         caller, fresh queries one after another: the latency the caller sees, the
         handler's own time (the server's "rpc" log line, from the interceptor), and the
         response's query_embedding_ms + engine_ms. Caller minus handler is gRPC's
         transport and both ends' (de)serialisation; handler minus embed+engine is
         planning, the thread hand-off, shaping outside engine_ms and building the
         response.

    python bench/search_parts.py edge  --data /tmp/visior-bench-retrieval/<key> [--seconds 3]
    python bench/search_parts.py split --data /tmp/visior-bench-retrieval/<key> [--seconds 8]

Diagnostics for the figures of bench/retrieval_search.py; --profile must match the data
dir's vectors (d512: fast, d384: e5).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
for p in (str(REPO_ROOT), str(BENCH_DIR)):
    if p not in sys.path:
        sys.path.insert(0, p)

from index_engine import query_pool  # noqa: E402
from retrieval_search import running_mesh, working_copy  # noqa: E402
from search_engine import pct  # noqa: E402

from services.retrieval.index.base import IndexFilter, RankQuery  # noqa: E402
from services.retrieval.index.edge import EdgeIndex  # noqa: E402
from services.retrieval.search import SearchDefaults  # noqa: E402


def edge(args: argparse.Namespace, data: Path) -> None:
    dim = 512 if args.profile == "fast" else 384
    index = EdgeIndex(str(data / "index"), dim)
    d = SearchDefaults()
    rng = np.random.default_rng(args.seed)
    texts = query_pool(args.seed, 5000)
    vectors = rng.standard_normal((len(texts), dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    factor = 2  # EngineSettings().candidate_factor

    def lists(i: int) -> list[RankQuery]:
        tenant = f"tenant-{i % args.tenants:02d}"
        out = []
        for kind, limit in (("section", d.max_sections), ("chunk", d.max_chunks)):
            flt = IndexFilter(tenant_id=tenant, kinds=(kind,))
            out.append(RankQuery(flt, limit * factor, vector=vectors[i]))
            out.append(RankQuery(flt, limit * factor, text=texts[i]))
        return out

    shapes = {
        "four lists (one search)": lists,
        "its two dense lists": lambda i: [q for q in lists(i) if q.vector is not None],
        "its two BM25 lists": lambda i: [q for q in lists(i) if q.vector is None],
    }
    print(f"{data.name}: Edge search_ids_batch, {args.seconds:g} s each")
    for label, make in shapes.items():
        for i in range(50):
            index.search_ids_batch(make(i))
        n, w0, c0 = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - w0 < args.seconds:
            index.search_ids_batch(make(n % len(texts)))
            n += 1
        wall = (time.perf_counter() - w0) / n * 1000
        cpu = (time.process_time() - c0) / n * 1000
        print(f"  {label:26s} wall {wall:6.3f} ms  cpu {cpu:6.3f} ms a search  (n={n})")
    index.close()


def split(args: argparse.Namespace, data: Path) -> None:
    import grpc
    from visior.retrieval.v1 import retrieval_pb2 as pb
    from visior.retrieval.v1 import retrieval_pb2_grpc as pbg

    tmp = Path(tempfile.mkdtemp(prefix="visior-search-parts-"))
    try:
        env = {"RETR_EMBEDDING_PROFILE": args.profile}
        with running_mesh(data, tmp / "run", env, 2, False) as mesh:
            channel = grpc.insecure_channel(f"127.0.0.1:{mesh.ports.grpc['retrieval']}")
            stub = pbg.RetrievalServiceStub(channel)
            queries = query_pool(args.seed + 1, 20000)
            for i in range(50):  # warm-up (its queries are not sent again)
                stub.Search(pb.SearchRequest(query=queries[i], tenant_id="tenant-00"))
            seen, meta = [], []
            n, t0 = 50, time.perf_counter()
            while time.perf_counter() - t0 < args.seconds and n < len(queries):
                req = pb.SearchRequest(
                    query=queries[n], tenant_id=f"tenant-{n % args.tenants:02d}", trace_id=f"sp{n}"
                )
                t = time.perf_counter()
                r = stub.Search(req)
                seen.append((time.perf_counter() - t) * 1000)
                meta.append((r.meta.query_embedding_ms, r.meta.engine_ms))
                n += 1
            channel.close()
            time.sleep(0.5)  # the last log lines
            handler = []
            for line in mesh.log_path("retrieval").read_text().splitlines():
                entry = json.loads(line) if line.startswith("{") else {}
                if entry.get("msg") == "rpc" and str(entry.get("trace_id", "")).startswith("sp"):
                    handler.append(float(entry["latency_ms"]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ee = [a + b for a, b in meta]
    rows = {
        "caller sees": seen,
        "handler (rpc log)": handler,
        "embed + engine": ee,
        "query embed": [a for a, _ in meta],
        "engine_ms": [b for _, b in meta],
    }
    print(f"{data.name}: {len(seen)} searches, one caller, fresh queries ({args.profile})")
    for label, values in rows.items():
        print(f"  {label:18s} p50 {pct(values, 50):7.2f}  p95 {pct(values, 95):7.2f} ms")
    print(
        f"  caller - handler   p50 {pct(seen, 50) - pct(handler, 50):7.2f} ms (transport, "
        f"(de)serialisation)\n  handler - e+e      p50 {pct(handler, 50) - pct(ee, 50):7.2f} ms "
        "(planning, thread hand-off, shaping, response)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("part", choices=("edge", "split"))
    ap.add_argument("--data", type=Path, required=True, help="a retrieval_search.py data dir")
    ap.add_argument("--profile", default="fast", help="embedding profile of the data (fast | e5)")
    ap.add_argument("--seconds", type=float, default=0.0, help="per measurement (3 / 8)")
    ap.add_argument("--tenants", type=int, default=10)
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()
    args.seconds = args.seconds or (3.0 if args.part == "edge" else 8.0)
    with working_copy(args.data, False, "visior-search-parts-") as data:
        (edge if args.part == "edge" else split)(args, data)


if __name__ == "__main__":
    main()
