"""Index engine benchmark: Qdrant Edge upsert rate, optimize time, dense/BM25 latency, recall.

Synthetic data: random L2-normalised vectors, texts drawn (Zipf) from a small bilingual
vocabulary, spread over --tenants tenants. For each size: upsert (points/s, sparse
encoding included), then dense and BM25 latency p50/p95 with the tenant filter before
and after optimize() (HNSW build), and dense recall@10 against exact search. With
--incremental N, N more points are upserted and a second optimize() is timed while a
pure-Python thread counts loop turns: how much of its normal rate it got (qdrant-edge-py
holds the GIL during optimize; the retrieval server runs it after ingest bursts,
services/retrieval/index_maintenance.py). The same ticker runs while searches loop back to
back after optimize: how much of a search holds the GIL.

    python bench/index_engine.py [--sizes 10000,100000] [--dim 384] [--queries 300]
                                 [--quantization int8|none] [--incremental 5000]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from services.retrieval.index import EdgeIndex, IndexFilter, IndexPoint  # noqa: E402

RU_WORDS = (
    "договор поставка оплата счет штраф срок аренда склад оборудование сервер настройка "
    "интеграция пользователь доступ пароль резервный копия восстановление сеть кластер узел "
    "лицензия версия обновление ошибка журнал отчет налог ставка банк кредит инфляция"
).split()
EN_WORDS = (
    "contract supply payment invoice penalty term lease storage equipment server setup "
    "integration user access password backup copy restore network cluster node license "
    "version update error log report tax rate bank credit inflation"
).split()
RU_ENDINGS = ("", "а", "ы", "у", "ом", "ов", "ами", "ах", "е", "и")
EN_ENDINGS = ("", "s", "ing", "ed")


def vocabulary(rng: np.random.Generator, size: int) -> list[str]:
    """A small bilingual vocabulary: real stems with inflections, plus synthetic words."""
    words = [w + e for w in RU_WORDS for e in RU_ENDINGS] + [
        w + e for w in EN_WORDS for e in EN_ENDINGS
    ]
    letters = "абвгдежзиклмнопрстуфхцчшэюя"
    while len(words) < size:
        n = int(rng.integers(4, 10))
        words.append("".join(rng.choice(list(letters), n)))
    return words[:size]


def unit_vectors(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    v = rng.standard_normal((n, dim)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v


def percentiles(samples: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(samples, n=100, method="inclusive")
    return q[49], q[94]


def rss_mb() -> float:
    """Current resident set size (Linux /proc), MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def timed(fn: Any, args: list[Any]) -> list[float]:
    out = []
    for a in args:
        t0 = time.perf_counter()
        fn(*a)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def python_turns(seconds: float | None, stop: threading.Event | None = None) -> int:
    """Pure-Python loop turns in `seconds` (or until `stop` is set)."""
    t0, turns = time.perf_counter(), 0
    while (stop is None or not stop.is_set()) and (
        seconds is None or time.perf_counter() - t0 < seconds
    ):
        sum(range(200))
        turns += 1
    return turns


def python_progress(work: Callable[[], None]) -> tuple[float, float]:
    """(seconds `work` took, the share of its normal rate a pure-Python thread got meanwhile).

    1.0: `work` left the GIL free; ~0: it held the GIL throughout.
    """
    baseline = python_turns(1.0)
    turns: list[int] = []
    stop = threading.Event()
    ticker = threading.Thread(target=lambda: turns.append(python_turns(None, stop)))
    ticker.start()
    t0 = time.perf_counter()
    try:
        work()
    finally:
        elapsed = time.perf_counter() - t0
        stop.set()
        ticker.join()
    return elapsed, turns[0] / max(1.0, baseline * elapsed)


def run_size(
    n: int, args: argparse.Namespace, rng: np.random.Generator, workdir: Path
) -> dict[str, Any]:
    vocab = vocabulary(rng, args.vocab)
    zipf = 1.0 / np.arange(1, len(vocab) + 1) ** 1.05
    zipf /= zipf.sum()
    vectors = unit_vectors(rng, n, args.dim)
    tenants = [f"tenant-{i}" for i in range(args.tenants)]
    tenant_of = rng.integers(0, args.tenants, n)
    path = workdir / f"edge-{n}"
    idx = EdgeIndex(
        str(path),
        args.dim,
        hnsw_m=args.hnsw_m,
        hnsw_payload_m=args.payload_m,
        hnsw_on_filter_fields=args.filter_field_hnsw,
        idf_per_tenant=not args.idf_global,
        hnsw_ef=args.ef,
        quantization=args.quantization,
    )
    res: dict[str, Any] = {"n": n}
    try:
        texts: list[str] = []

        def points(start: int, stop: int) -> list[IndexPoint]:
            batch = []
            for i in range(start, stop):
                words = rng.choice(len(vocab), int(rng.integers(40, 160)), p=zipf)
                text = " ".join(vocab[w] for w in words)
                texts.append(text)
                t = tenants[tenant_of[i % n]]
                doc = f"doc-{i // 50}"
                batch.append(
                    IndexPoint(
                        point_id=uuid.uuid5(uuid.NAMESPACE_URL, f"{t}/{i}").int >> 64,
                        tenant_id=t,
                        doc_id=doc,
                        section_id=f"{doc}-s{(i % 50) // 10}",
                        chunk_id=f"c{i}",
                        kind="chunk",
                        ord=i % 50,
                        page_start=1,
                        page_end=1,
                        tokens=len(words),
                        source="user",
                        product="orion",
                        version="1.0",
                        tags=("bench",),
                        generation="g1",
                        dense=vectors[i % len(vectors)],
                        sparse_text=text,
                    )
                )
            return batch

        upsert_s = 0.0
        for start in range(0, n, args.batch):
            batch = points(start, min(n, start + args.batch))
            t0 = time.perf_counter()
            idx.upsert(batch)
            upsert_s += time.perf_counter() - t0
        res["upsert_per_s"] = n / upsert_s
        res["rss_after_upsert_mb"] = rss_mb()
        res["upsert_s"] = upsert_s

        q_tenants = rng.integers(0, args.tenants, args.queries)
        q_vecs = unit_vectors(rng, args.queries, args.dim)
        # Query words: uniform over the vocabulary minus its 20 most frequent words (which
        # occur in nearly every synthetic chunk and play the part of stopwords).
        q_texts = [
            " ".join(vocab[w] for w in rng.integers(20, len(vocab), int(rng.integers(2, 6))))
            for _ in range(args.queries)
        ]
        dense_args = [
            (q_vecs[i], IndexFilter(tenants[q_tenants[i]]), 10) for i in range(args.queries)
        ]
        sparse_args = [
            (q_texts[i], IndexFilter(tenants[q_tenants[i]]), 10) for i in range(args.queries)
        ]

        def measure(stage: str) -> None:
            for a in dense_args[:20]:  # warm-up
                idx.search_dense(*a)
            res[f"dense_{stage}"] = percentiles(timed(idx.search_dense, dense_args))
            res[f"sparse_{stage}"] = percentiles(timed(idx.search_sparse, sparse_args))
            idx.idf_per_tenant = not idx.idf_per_tenant  # the other IDF scope, for comparison
            res[f"sparse_other_idf_{stage}"] = percentiles(timed(idx.search_sparse, sparse_args))
            idx.idf_per_tenant = not idx.idf_per_tenant
            # recall@10 of the dense search against exact search inside the tenant
            hits = 0
            for i in range(min(args.queries, 100)):
                mask = tenant_of == q_tenants[i]
                ids = np.nonzero(mask)[0]
                exact = ids[np.argsort(-(vectors[ids] @ q_vecs[i]))[:10]]
                want = {f"c{j}" for j in exact}
                got = {h.chunk_id for h in idx.search_dense(*dense_args[i])}
                hits += len(want & got)
            res[f"recall_{stage}"] = hits / (10 * min(args.queries, 100))

        measure("before")
        t0 = time.perf_counter()
        idx.optimize()
        res["optimize_s"] = time.perf_counter() - t0
        res["health"] = idx.health()
        measure("after")

        # Does a search let other Python threads run? A ticker thread while searches loop.
        def search_all() -> None:
            timed(idx.search_dense, dense_args)
            timed(idx.search_sparse, sparse_args)

        _, res["python_progress_searching"] = python_progress(search_all)
        if args.incremental:
            for start in range(n, n + args.incremental, args.batch):
                idx.upsert(points(start, min(n + args.incremental, start + args.batch)))
            res["optimize_incremental_s"], res["python_progress"] = python_progress(idx.optimize)
        res["rss_mb"] = rss_mb()
        res["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    finally:
        idx.close()
        shutil.rmtree(path, ignore_errors=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--tenants", type=int, default=10)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--vocab", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--hnsw-m", type=int, default=0)
    ap.add_argument("--payload-m", type=int, default=16)
    ap.add_argument("--ef", type=int, default=None, help="HNSW search beam (default: engine's)")
    ap.add_argument("--filter-field-hnsw", action="store_true")
    ap.add_argument("--idf-global", action="store_true", help="BM25 IDF over all tenants")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--quantization", default="int8", choices=("int8", "none"))
    ap.add_argument(
        "--incremental", type=int, default=0, help="points upserted before a second optimize"
    )
    ap.add_argument("--out", default="", help="also write the results as JSON here")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    results = []
    with tempfile.TemporaryDirectory(prefix="visior-bench-") as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            r = run_size(n, args, rng, Path(tmp))
            results.append(r)
            print(json.dumps(r, default=str), file=sys.stderr, flush=True)

    print(
        f"\nQdrant Edge, dim={args.dim}, {args.tenants} tenants, tenant filter, top-10, "
        f"hnsw m={args.hnsw_m} payload_m={args.payload_m} ef={args.ef} "
        f"quantization={args.quantization} "
        f"filter-field-hnsw={args.filter_field_hnsw} idf-global={args.idf_global}; latencies in ms (p50 / p95)"
    )
    other = "global" if not args.idf_global else "tenant"
    print(f"bm25/{other}: the same queries with IDF over {other} statistics")
    head = (
        f"{'chunks':>8} {'upsert/s':>9} {'optimize s':>10} | {'dense before':>13} "
        f"{'bm25 before':>13} {'bm25/' + other:>13} {'recall':>6} | {'dense after':>13} "
        f"{'bm25 after':>13} {'bm25/' + other:>13} {'recall':>6} | {'RSS MB':>7} {'peak':>6}"
    )
    print(head)
    print("-" * len(head))
    for r in results:

        def pp(key: str, r: dict[str, Any] = r) -> str:
            p50, p95 = r[key]
            return f"{p50:6.2f}/{p95:6.2f}"

        print(
            f"{r['n']:>8} {r['upsert_per_s']:>9.0f} {r['optimize_s']:>10.1f} | "
            f"{pp('dense_before'):>13} {pp('sparse_before'):>13} "
            f"{pp('sparse_other_idf_before'):>13} {r['recall_before']:>6.3f} | "
            f"{pp('dense_after'):>13} {pp('sparse_after'):>13} "
            f"{pp('sparse_other_idf_after'):>13} {r['recall_after']:>6.3f} | "
            f"{r['rss_mb']:>7.0f} {r['peak_rss_mb']:>6.0f}"
        )
        print(
            f"{'':>8} while searches ran back to back, a Python thread ran at "
            f"{100 * r['python_progress_searching']:.0f} % of its rate"
        )
        if "optimize_incremental_s" in r:
            print(
                f"{'':>8} +{args.incremental} points: optimize {r['optimize_incremental_s']:.1f} s, "
                f"a Python thread ran at {100 * r['python_progress']:.0f} % of its rate meanwhile"
            )
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))


# ---------------------------------------------------------------------------------------
# Queries: realistic-looking bilingual questions over the corpus vocabulary (index_engine's
# real stems and inflections, so BM25 matches), combinatorially many, all distinct.

RU_TEMPLATES = (
    "как настроить {a} {b}",
    "что делать если {a} {b} не работает",
    "почему {a} {b} {c}",
    "где найти {a} по {b}",
    "сроки {a} {b} {c}",
    "порядок {a} {b} для {c}",
    "можно ли {a} {b} без {c}",
    "ошибка {a} при {b} {c}",
    "{a} {b} {c} инструкция",
    "какие требования к {a} {b}",
    "как изменить {a} {b} в версии {n}",
    "кто отвечает за {a} {b}",
)
EN_TEMPLATES = (
    "how to configure {a} {b}",
    "what happens if {a} {b} fails",
    "why is {a} {b} {c} slow",
    "where can I find the {a} {b}",
    "{a} {b} {c} requirements",
    "how do I {a} the {b} {c}",
    "is {a} required for {b} {c}",
    "{a} {b} limit per {c}",
    "steps to {a} {b} after {c}",
    "difference between {a} and {b} {c}",
    "{a} {b} in version {n}",
    "who approves the {a} {b}",
)


def query_pool(seed: int, count: int) -> list[str]:
    """`count` distinct queries, 4-12 words, ~2/3 Russian; deterministic for a seed."""
    rng = np.random.default_rng(seed)
    ru = [w + e for w in RU_WORDS for e in RU_ENDINGS]
    en = [w + e for w in EN_WORDS for e in EN_ENDINGS]
    seen: dict[str, None] = {}
    while len(seen) < count:
        if rng.random() < 0.66:
            words, template = ru, RU_TEMPLATES[int(rng.integers(len(RU_TEMPLATES)))]
        else:
            words, template = en, EN_TEMPLATES[int(rng.integers(len(EN_TEMPLATES)))]
        a, b, c = (words[int(i)] for i in rng.integers(0, len(words), 3))
        n = f"{int(rng.integers(1, 9))}.{int(rng.integers(0, 20))}"
        seen.setdefault(template.format(a=a, b=b, c=c, n=n))
    return list(seen)


if __name__ == "__main__":
    main()
