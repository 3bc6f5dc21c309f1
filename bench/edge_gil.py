"""Does a Qdrant Edge search let other Python threads run? (the ceiling of one server process)

A pure-Python thread counts loop iterations while the main thread (a) sleeps and (b) runs a
section_first search's four ranking lists through `EdgeIndex.search_ids_batch` (Edge's
`query_batch`) back to back, on a retrieval_search.py data dir. If Edge released the GIL
while it searches, the counter would keep most of its pace in (b); the share it keeps is
the share of a search's Edge time that other requests' Python work can overlap.

    python bench/edge_gil.py --data /tmp/visior-bench-retrieval/<key> [--seconds 3]

The data dir is copied first (opening a shard writes to it), unless --in-place.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
for p in (str(REPO_ROOT), str(BENCH_DIR)):
    if p not in sys.path:
        sys.path.insert(0, p)

from index_engine import query_pool  # noqa: E402
from retrieval_search import working_copy  # noqa: E402

from services.retrieval.index.base import IndexFilter, RankQuery  # noqa: E402
from services.retrieval.index.edge import EdgeIndex  # noqa: E402


def batches(dim: int, n: int, tenants: int, seed: int) -> list[list[RankQuery]]:
    """n searches' four lists (section and chunk level, dense and BM25) at the server's
    default depths (max_sections 50, max_chunks 40, candidate factor 2)."""
    rng = np.random.default_rng(seed)
    out = []
    for i, text in enumerate(query_pool(seed, n)):
        vec = rng.standard_normal(dim).astype(np.float32)
        vec /= np.linalg.norm(vec)
        tenant = f"tenant-{i % tenants:02d}"
        section = IndexFilter(tenant, kinds=("section",))
        chunk = IndexFilter(tenant, kinds=("chunk",))
        out.append(
            [
                RankQuery(section, 100, vector=vec),
                RankQuery(section, 100, text=text),
                RankQuery(chunk, 80, vector=vec),
                RankQuery(chunk, 80, text=text),
            ]
        )
    return out


def measure(
    index: EdgeIndex | None, work: list[list[RankQuery]], seconds: float
) -> tuple[float, float]:
    """(counter iterations/s, searches/s) with the main thread searching, or sleeping."""
    count = 0
    stop = threading.Event()

    def spin() -> None:
        nonlocal count
        while not stop.is_set():
            count += 1
            sum(range(100))

    thread = threading.Thread(target=spin)
    thread.start()
    t0 = time.perf_counter()
    done = 0
    while time.perf_counter() - t0 < seconds:
        if index is None:
            time.sleep(0.002)
        else:
            index.search_ids_batch(work[done % len(work)])
        done += 1
    elapsed = time.perf_counter() - t0
    stop.set()
    thread.join()
    return count / elapsed, (done / elapsed if index is not None else 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="a retrieval_search.py data dir")
    ap.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    ap.add_argument("--rounds", type=int, default=2, help="alternations of sleep / search")
    ap.add_argument("--tenants", type=int, default=10)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--in-place", action="store_true", help="do not copy the data dir")
    args = ap.parse_args()
    with working_copy(Path(args.data), args.in_place, "visior-edge-gil-") as data:
        index = EdgeIndex(str(data / "index"), _dataset(data)["dim"])
        try:
            work = batches(index.dim, 300, args.tenants, args.seed)
            for warm in work[:20]:
                index.search_ids_batch(warm)
            for r in range(1, args.rounds + 1):
                idle, _ = measure(None, work, args.seconds)
                busy, rate = measure(index, work, args.seconds)
                print(
                    f"round {r}: counter {idle:,.0f}/s beside a sleeping thread, "
                    f"{busy:,.0f}/s beside Edge searches ({busy / idle:.0%} kept); "
                    f"{rate:.0f} searches/s ({1000 / rate:.2f} ms each)"
                )
        finally:
            index.close()


def _dataset(data: Path) -> dict[str, Any]:
    """What retrieval_search.py recorded of the data dir it built (dim, tenants, ...)."""
    try:
        return json.loads((data / "dataset.json").read_text())  # type: ignore[no-any-return]
    except FileNotFoundError:
        raise SystemExit(
            f"{data}: no dataset.json; is it a retrieval_search.py data dir?"
        ) from None


if __name__ == "__main__":
    main()
