"""In-process micro-benchmark of RetrievalEngine.search on retrieval_search.py's data dirs.

No gRPC, no Envoy: the engine as app.py builds it (Edge shard, SQLite document store, real
embedder of the profile, section catalog), searches one after another with
fresh queries, and prints wall time per search, meta.engine_ms and meta.query_embedding_ms.
`--profile-out FILE` writes a cProfile of the searches, run in this thread (the engine's
worker-thread part called directly, since cProfile sees one thread). Meant for iterating on the engine;
the figures that count come from bench/retrieval_search.py.

    python bench/search_engine.py --data /tmp/visior-bench-retrieval/<key> [--searches 500]

The data dir is copied first (opening a shard writes to it), unless --in-place.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
for p in (str(REPO_ROOT), str(BENCH_DIR)):
    if p not in sys.path:
        sys.path.insert(0, p)

from index_engine import query_pool  # noqa: E402
from retrieval_search import working_copy  # noqa: E402

from services.common.breaker import BreakerPolicy, CircuitBreaker  # noqa: E402
from services.common.settings import Env  # noqa: E402
from services.common.tokenizer import default_tokenizer  # noqa: E402
from services.docstore.sqlite_store import SqliteDocumentStore  # noqa: E402
from services.retrieval.config import engine_settings  # noqa: E402
from services.retrieval.embeddings import EmbeddingSettings  # noqa: E402
from services.retrieval.engine import EngineSettings, RetrievalEngine  # noqa: E402
from services.retrieval.factories import build_embedder  # noqa: E402
from services.retrieval.index.edge import EdgeIndex  # noqa: E402
from services.retrieval.search import SearchDefaults, SearchQuery  # noqa: E402
from services.retrieval.search_log import SearchTiming  # noqa: E402
from services.retrieval.sections import SectionCatalog  # noqa: E402


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def run(args: argparse.Namespace, data: Path) -> None:
    embedder = build_embedder(EmbeddingSettings(profile=args.profile))
    store = SqliteDocumentStore(data / "docstore.sqlite")
    index = EdgeIndex(str(data / "index"), embedder.dim)
    engine = RetrievalEngine(
        index=index, embedder=embedder, sections=SectionCatalog(store), chunks=store,
        tokenizer=default_tokenizer(),
        defaults=SearchDefaults(),
        # The server's ranking settings for the profile (cross-language is off for fast).
        settings=replace(engine_settings(Env({}), args.profile), candidate_factor=args.factor),
        breaker=CircuitBreaker("vector store", BreakerPolicy(3, 60)),
    )  # fmt: skip
    queries = query_pool(args.seed, args.searches + args.warmup)
    tenants = [f"tenant-{i % args.tenants:02d}" for i in range(len(queries))]
    mode = args.mode or ""
    for i in range(args.warmup):
        await engine.search(SearchQuery(query=queries[i], tenant_id=tenants[i], mode=mode))
    wall, eng, emb, hits = [], [], [], []
    prof = cProfile.Profile() if args.profile_out else None
    if prof:
        prof.enable()
    for i in range(args.warmup, len(queries)):
        q = SearchQuery(query=queries[i], tenant_id=tenants[i], mode=mode)
        t0 = time.perf_counter()
        if prof:  # the body of search() without rerank, in this thread
            r = engine._search_sync(engine._plan(q), SearchTiming(), t0)
        else:
            r = await engine.search(q)
        wall.append((time.perf_counter() - t0) * 1000)
        eng.append(r.engine_ms)
        emb.append(r.query_embedding_ms)
        hits.append(len(r.hits))
    if prof:
        prof.disable()
        prof.dump_stats(args.profile_out)
    index.close()
    store.close()
    print(
        f"{args.profile} {data.name} mode={mode or 'default'} factor={args.factor} "
        f"n={len(wall)} hits/search {statistics.mean(hits):.1f}\n"
        f"  wall   p50 {pct(wall, 50):7.2f}  p95 {pct(wall, 95):7.2f} ms  "
        f"({1000 / statistics.mean(wall):.0f} searches/s, one at a time)\n"
        f"  engine p50 {pct(eng, 50):7.2f}  p95 {pct(eng, 95):7.2f} ms\n"
        f"  embed  p50 {pct(emb, 50):7.2f}  p95 {pct(emb, 95):7.2f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="a retrieval_search.py data dir")
    ap.add_argument("--profile", default="fast", help="embedding profile (fast | e5)")
    ap.add_argument("--searches", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--tenants", type=int, default=10)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--mode", default="", help="retrieval mode (server default if empty)")
    ap.add_argument("--factor", type=int, default=EngineSettings().candidate_factor)
    ap.add_argument("--profile-out", default="", help="write a cProfile of the searches here")
    ap.add_argument("--in-place", action="store_true", help="do not copy the data dir")
    args = ap.parse_args()
    with working_copy(args.data, args.in_place, "visior-search-engine-") as data:
        asyncio.run(run(args, data))


if __name__ == "__main__":
    main()
