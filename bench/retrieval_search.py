"""Retrieval search benchmark: Search through gRPC and through Envoy at 10k and 100k chunks.

For each embedding profile (e5, fast) and each size, the run:

1. builds (or reuses from --cache-dir) a synthetic data dir: bilingual documents of 5
   sections x 8 chunks (~200 BPE tokens each) over --tenants tenants, written to BOTH the
   SQLite document store and the Qdrant Edge shard with the server's own point layout
   (chunk, section and doc points, `Ingestor._points`), random unit vectors of the
   profile's dimension; then optimize() (HNSW), as the server's background optimizer does
   once ingestion pauses (RETR_OPTIMIZE_QUIET_S). Keyed by size/dim/seed, so reruns reuse it;
2. measures the embedder in this process (cache off): raw single-query rate (one caller,
   one core per call: the unit the server embeds queries in under load) and raw passage
   rate (~200-token passages in the server's batch size, one core per batch, as the server
   runs them); for e5 also lone queries with the server's RETR_EMBEDDING_THREADS (auto:
   every usable CPU for a query that runs alone), the embedding a c=1 search sees;
3. copies the data dir, starts the retrieval server on it with the mesh's Envoy in front
   (services.devtools.mesh.Mesh; --full-mesh starts all four servers), checks that searches
   find hits, and drives RetrievalService/Search, hybrid (server default), every request
   naming a tenant, no rerank, closed loops:

     grpc   Python grpc.aio client processes straight to the server's port; every response's
            meta.engine_ms and meta.query_embedding_ms are recorded
     json   wrk through Envoy (POST /internal/retrieval/search), a Lua script rotating bodies

   at concurrency 1 (latency) and 32 (RPS), first with queries never sent before (the
   server's query-embedding cache misses on every request), then with a small set of
   queries sent before ("cached": the embedding comes from the cache);
4. ingests real documents (samples/docs/*.pdf and *.md, several times under new doc_ids)
   through the IngestDocument RPC, one at a time, and reports chunks/s;
5. reads the retrieval server's RSS from /proc/<pid>/status.

Then prints one table and PASS/MISS per target, and writes JSON (bench/README.md explains).

    python bench/retrieval_search.py [--profiles e5,fast] [--sizes 10000,100000]
                                     [--duration 10] [--out FILE]
"""

from __future__ import annotations

import os

# The server runs its models with one BLAS/OpenMP thread (services/retrieval/__main__.py);
# measure the embedder in-process the same way. Before numpy is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GOMP_SPINCOUNT", "10000")  # as services/retrieval/__main__.py

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import math
import multiprocessing as mp
import shutil
import signal
import statistics
import sys
import tempfile
import time
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
for p in (str(REPO_ROOT), str(BENCH_DIR)):
    if p not in sys.path:
        sys.path.insert(0, p)

from embedders import make_passages  # noqa: E402
from index_engine import query_pool, vocabulary  # noqa: E402
from transport import (  # noqa: E402
    WRK_LUA,
    Slice,
    Wrk,
    environment_info,
    machine_cpu_s,
    percentile,
    proc_cpu_s,
    server_handled,
    write_record,
)

from services.docstore.chunking import ChunkingConfig, whole_text_tokens  # noqa: E402
from services.retrieval.embeddings import E5_DIM, PASSAGE_BATCH_DEFAULTS, USE_DIM  # noqa: E402

SERVICE_KEY = "retrieval"
SEARCH_PATH = "/internal/retrieval/search"
GRPC_TIMEOUT_S = 10.0
PROFILE_DIM = {"e5": E5_DIM, "fast": USE_DIM}
DATASET_VERSION = "v1"  # bump when the synthetic corpus changes: old caches are not reused
SECTIONS_PER_DOC = 5
CHUNKS_PER_SECTION = 8
CHUNK_TOKENS = ChunkingConfig.chunk_tokens  # the server's RETR_CHUNK_TOKENS default
GENERATION = "bench-synthetic"

# ---------------------------------------------------------------------------------------
# The synthetic data dir (document store + Edge shard), cached


class SyntheticEmbedder:
    """Random unit vectors of `dim` (deterministic for the rng): scale without embedding cost."""

    name = "synthetic"

    def __init__(self, dim: int, rng: np.random.Generator) -> None:
        self.dim = dim
        self._rng = rng

    def _rows(self, n: int) -> np.ndarray:
        v = self._rng.standard_normal((n, self.dim)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._rows(len(texts))

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._rows(len(texts))


LAYOUT_SOURCES = (
    "services/retrieval/index/base.py",
    "services/retrieval/index/edge.py",
    "services/retrieval/index/sparse.py",
    "services/retrieval/ingestion.py",
    "services/docstore/model.py",
    "services/docstore/sqlite_store.py",
)
"""The code that decides what lands on disk: a change to any of it rebuilds the cache."""


def layout_hash() -> str:
    import hashlib

    h = hashlib.sha256()
    for rel in LAYOUT_SOURCES:
        h.update((REPO_ROOT / rel).read_bytes())
    return h.hexdigest()[:10]


def dataset_key(n: int, dim: int, seed: int, tenants: int) -> str:
    return f"retrieval-{DATASET_VERSION}-{layout_hash()}-n{n}-d{dim}-t{tenants}-s{seed}"


def build_dataset(path: Path, n: int, dim: int, seed: int, tenants: int) -> dict[str, Any]:
    """Write `n` chunks (plus section and doc points) to path/docstore.sqlite and path/index."""
    from services.common.tokenizer import default_tokenizer
    from services.docstore.model import Chunk, Document, Section
    from services.docstore.sqlite_store import SqliteDocumentStore
    from services.retrieval.index.edge import EdgeIndex
    from services.retrieval.ingestion import Ingestor, stored_points
    from services.retrieval.journal import IngestJournal
    from services.retrieval.sections import SectionCatalog

    rng = np.random.default_rng(seed)
    vocab = vocabulary(rng, 3000)
    zipf = 1.0 / np.arange(1, len(vocab) + 1) ** 1.05
    zipf /= zipf.sum()
    tok = default_tokenizer()
    # Words per ~200-token chunk, calibrated on this vocabulary with the server's tokenizer.
    sample = [" ".join(vocab[w] for w in rng.choice(len(vocab), 100, p=zipf)) for _ in range(50)]
    per_word = sum(tok.count(s) for s in sample) / (100 * len(sample))
    words_per_chunk = max(20, round(CHUNK_TOKENS / per_word))

    path.mkdir(parents=True, exist_ok=True)
    store = SqliteDocumentStore(path / "docstore.sqlite")
    index = EdgeIndex(str(path / "index"), dim)
    ingestor = Ingestor(
        store=store,
        index=index,
        embedder=SyntheticEmbedder(dim, rng),
        sections=SectionCatalog(store),
        journal=IngestJournal(path / "ingest-journal.jsonl"),
        max_document_bytes=1 << 20,
    )
    per_doc = SECTIONS_PER_DOC * CHUNKS_PER_SECTION
    info: dict[str, Any] = {"chunks": n, "dim": dim, "seed": seed, "tenants": tenants}
    t_gen = t_upsert = t_store = 0.0
    points_total = tokens_total = 0
    started = time.perf_counter()

    def words(k: int) -> str:
        return " ".join(vocab[w] for w in rng.choice(len(vocab), k, p=zipf))

    async def build() -> None:
        nonlocal t_gen, t_upsert, t_store, points_total, tokens_total
        pending_docs: list[tuple[Document, Any]] = []
        pending_points: list[Any] = []
        made = 0
        d = 0
        while made < n:
            t0 = time.perf_counter()
            doc_id = f"doc-{d:06d}"
            tenant = f"tenant-{d % tenants:02d}"
            count = min(per_doc, n - made)
            chunks: list[Chunk] = []
            sections: list[Section] = []
            for s in range(math.ceil(count / CHUNKS_PER_SECTION)):
                sid = f"{doc_id}:s{s:03d}"
                first = len(chunks)
                for _ in range(min(CHUNKS_PER_SECTION, count - first)):
                    k = int(rng.integers(int(words_per_chunk * 0.8), int(words_per_chunk * 1.2)))
                    text = words(k)
                    tokens = tok.count(text)
                    tokens_total += tokens
                    ord_ = len(chunks)
                    chunks.append(
                        Chunk(
                            doc_id, f"{doc_id}:c{ord_:05d}", sid, ord_, text, tokens, s + 1, s + 1
                        )
                    )
                title = words(int(rng.integers(2, 6)))
                summary = " ".join(chunks[first].text.split()[:30])
                sections.append(
                    Section(sid, s, title, summary, s + 1, s + 1, first, len(chunks) - 1)
                )
            doc = Document(
                tenant_id=tenant,
                doc_id=doc_id,
                title=words(int(rng.integers(3, 7))),
                source="user",
                product="orion",
                version="1.0",
                tags=("bench",),
                pages=len(sections),
                sections=tuple(sections),
                chunks=tuple(chunks),
                generation=GENERATION,
                metadata={"synthetic": "true"},
                tokens=whole_text_tokens((), (c.text for c in chunks)),
            )
            points = await ingestor._points(doc)  # the server's own point layout and ids
            t_gen += time.perf_counter() - t0
            pending_docs.append((doc, stored_points(points)))
            pending_points.extend(points)
            made += count
            d += 1
            if len(pending_points) >= 2000 or made >= n:
                # The server's order: index points first, then the store commits them.
                t0 = time.perf_counter()
                index.upsert(pending_points)
                t1 = time.perf_counter()
                for doc_, listed in pending_docs:
                    store.put(doc_, listed)
                done_docs = [doc_ for doc_, _ in pending_docs]
                t_store += time.perf_counter() - t1
                t_upsert += t1 - t0
                points_total += len(pending_points)
                pending_docs, pending_points = [], []
                if made // 10_000 != (made - sum(len(x.chunks) for x in done_docs)) // 10_000:
                    print(f"    {made}/{n} chunks", flush=True)
        info["docs"] = d

    try:
        asyncio.run(build())
        info.update(points=points_total, mean_chunk_tokens=round(tokens_total / n, 1))
        info.update(
            generate_s=round(t_gen, 1), upsert_s=round(t_upsert, 1), store_s=round(t_store, 1)
        )
        t0 = time.perf_counter()
        index.optimize()
        info["optimize_s"] = round(time.perf_counter() - t0, 1)
        info["index_health"] = index.health()
    finally:
        index.close()
        store.close()
    info["build_s"] = round(time.perf_counter() - started, 1)
    return info


def ensure_dataset(cache: Path, n: int, dim: int, seed: int, tenants: int) -> tuple[Path, dict]:
    """The cached data dir for (n, dim, seed, tenants), built first if it is not there."""
    final = cache / dataset_key(n, dim, seed, tenants)
    marker = final / "dataset.json"
    if marker.exists():
        return final, {**json.loads(marker.read_text()), "cached": True}
    cache.mkdir(parents=True, exist_ok=True)
    building = cache / f"{final.name}.building-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    print(f"  building {n} chunks, dim {dim} in {building} (minutes at 100k) ...", flush=True)
    info = build_dataset(building, n, dim, seed, tenants)
    (building / "dataset.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    os.rename(building, final)
    return final, {**info, "cached": False}


@contextlib.contextmanager
def working_copy(data: Path, in_place: bool, prefix: str) -> Iterator[Path]:
    """`data` itself, or a temporary copy of it: opening an Edge shard writes to its directory,
    and a data dir is a cache other runs reuse."""
    if in_place:
        yield data
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        copy = Path(tmp) / data.name
        shutil.copytree(data, copy)
        yield copy


def dir_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


# ---------------------------------------------------------------------------------------
# The embedder in this process


def sample_files() -> list[Path]:
    """The real documents the ingestion run sends: samples/docs/*.pdf and *.md."""
    docs = REPO_ROOT / "samples" / "docs"
    return sorted(p for p in docs.iterdir() if p.suffix in (".pdf", ".md"))


def sample_chunk_texts() -> list[list[str]]:
    """What ingestion embeds for each sample file: "section title\nchunk text" per chunk."""
    from services.docstore.parsing import guess_format, parse_document

    out = []
    for path in sample_files():
        doc = parse_document(
            tenant_id="t", doc_id="d", content=path.read_bytes(), fmt=guess_format(path.name, "")
        )
        titles = {s.section_id: s.title for s in doc.sections}
        out.append([f"{titles.get(c.section_id, '')}\n{c.text}".strip() for c in doc.chunks])
    return out


def _query_rate(emb: Any, seconds: float, queries: list[str]) -> tuple[float, list[float]]:
    """Single queries one after another from one thread: queries/s and sorted latencies (ms)."""
    lat: list[float] = []
    i = 0
    deadline = time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < deadline:
        t = time.perf_counter()
        emb.embed_queries([queries[i % len(queries)]])
        lat.append((time.perf_counter() - t) * 1000)
        i += 1
    rate = i / (time.perf_counter() - start)
    lat.sort()
    return rate, lat


def measure_embedder(profile: str, seconds: float, queries: list[str]) -> dict[str, Any]:
    """Raw query/s (batch 1, one caller, one core per call, no cache) and passages/s.

    The raw query rate is the embedder's rate per core, the unit the server runs queries in
    under load (RETR_EMBEDDING_THREADS=auto gives a query more cores only when it runs
    alone); the lone-query rate and latency with the server's own setting are reported
    next to it (`lone_*`), as the latency a c=1 search sees.
    """
    from services.common.settings import Env
    from services.retrieval.config import embedding_settings
    from services.retrieval.embeddings import EmbeddingSettings
    from services.retrieval.factories import build_embedder

    t0 = time.perf_counter()
    emb = build_embedder(
        EmbeddingSettings(profile=profile, query_cache_size=0, query_batch_size=1, threads=1)
    )
    emb.embed_queries(["warm-up"])
    load_s = time.perf_counter() - t0
    out: dict[str, Any] = {"profile": profile, "model": emb.name, "load_s": round(load_s, 2)}

    rate, lat = _query_rate(emb, seconds, queries)
    out["query_per_s"] = round(rate, 1)
    out["query_ms_p50"] = round(fpercentile(lat, 50), 3)
    out["query_ms_p95"] = round(fpercentile(lat, 95), 3)
    server = embedding_settings(Env())  # the server's RETR_EMBEDDING_THREADS (default auto)
    if server.threads != 1 and profile == "e5":
        lone = build_embedder(
            EmbeddingSettings(profile=profile, query_cache_size=0, threads=server.threads)
        )
        lone.embed_queries(["warm-up"])
        rate, lat = _query_rate(lone, seconds, queries)
        out["lone_threads"] = "auto" if server.threads is None else server.threads
        out["lone_query_per_s"] = round(rate, 1)
        out["lone_query_ms_p50"] = round(fpercentile(lat, 50), 3)
        out["lone_query_ms_p95"] = round(fpercentile(lat, 95), 3)

    passages = make_passages(400)
    batch = PASSAGE_BATCH_DEFAULTS[profile]  # build_embedder's, with RETR_EMBEDDING_* unset
    emb.embed_passages(passages[:batch])
    done = 0
    deadline = time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < deadline:
        k = (done // batch) % (len(passages) // batch)
        emb.embed_passages(passages[k * batch : (k + 1) * batch])
        done += batch
    out["passages_per_s"] = round(done / (time.perf_counter() - start), 1)
    out["passage_batch"] = batch

    # The ingestion reference: the very chunk texts IngestDocument embeds for samples/docs,
    # a document's in one call as Ingestor._embed sends them (the embedder batches them).
    documents = sample_chunk_texts()
    done = 0
    deadline = time.perf_counter() + seconds
    start = time.perf_counter()
    while True:
        for texts in documents:
            emb.embed_passages(texts)
            done += len(texts)
        if time.perf_counter() >= deadline:
            break
    out["sample_chunks_per_s"] = round(done / (time.perf_counter() - start), 1)
    return out


# ---------------------------------------------------------------------------------------
# Load generators


def search_body(query: str, tenant: str) -> dict[str, str]:
    return {"query": query, "tenant_id": tenant}


@dataclass
class _Run:
    """One slice of a gRPC worker: its items and what its closed loops recorded."""

    items: list[tuple[str, str]]
    stop_at: float
    lat: array = field(default_factory=lambda: array("q"))
    eng: array = field(default_factory=lambda: array("d"))
    emb: array = field(default_factory=lambda: array("d"))
    errors: dict[str, int] = field(default_factory=dict)
    sent: int = 0
    empty: int = 0


async def _closed_loop(stub: Any, run: _Run) -> None:
    import grpc
    from visior.retrieval.v1 import retrieval_pb2

    clock = time.perf_counter_ns
    while time.perf_counter() < run.stop_at:
        q, tenant = run.items[run.sent % len(run.items)]
        run.sent += 1
        req = retrieval_pb2.SearchRequest(query=q, tenant_id=tenant)
        t0 = clock()
        try:
            resp = await stub.Search(req, timeout=GRPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            run.errors[exc.code().name] = run.errors.get(exc.code().name, 0) + 1
            continue
        run.lat.append((clock() - t0) // 1000)
        run.eng.append(resp.meta.engine_ms)
        run.emb.append(resp.meta.query_embedding_ms)
        run.empty += not resp.hits


async def _grpc_search_session(target: str, tasks: int, conn: Any) -> None:
    import grpc
    from visior.retrieval.v1 import retrieval_pb2_grpc

    loop = asyncio.get_running_loop()
    async with grpc.aio.insecure_channel(target) as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        conn.send("ready")
        while True:
            cmd = await loop.run_in_executor(None, conn.recv)
            if cmd is None:
                return
            seconds, items = cmd  # items: [(query, tenant)], this worker's share
            run = _Run(items, time.perf_counter() + seconds)
            t0 = time.perf_counter()
            await asyncio.gather(*(_closed_loop(stub, run) for _ in range(tasks)))
            conn.send(("done", time.perf_counter() - t0))
            conn.send(
                (
                    run.lat.tobytes(),
                    run.eng.tobytes(),
                    run.emb.tobytes(),
                    run.errors,
                    run.sent,
                    run.empty,
                )
            )


def _grpc_worker(target: str, tasks: int, conn: Any) -> None:
    sys.path.insert(0, str(REPO_ROOT))
    asyncio.run(_grpc_search_session(target, tasks, conn))


@dataclass
class SearchSlice(Slice):
    engine_ms: list[float] = field(default_factory=list)
    embed_ms: list[float] = field(default_factory=list)
    sent: int = 0
    """Requests started; above len(items) the queries repeated (cache hits)."""
    offered: int = 0
    """Distinct (query, tenant) items handed to the generator for the slice."""
    empty: int = 0
    """Responses without hits (gRPC only): a search that finds nothing costs nothing."""


class GrpcSearchClient:
    """`procs` spawned grpc.aio processes sharing `c` closed loops; items split among them."""

    def __init__(self, target: str, concurrency: int, procs: int) -> None:
        n = max(1, min(procs, concurrency))
        self.target = target
        self.shares = [concurrency // n + (1 if i < concurrency % n else 0) for i in range(n)]
        self.procs: list[Any] = []
        self.pipes: list[Any] = []

    def start(self) -> None:
        ctx = mp.get_context("spawn")  # the parent has used grpc already: never fork
        for share in self.shares:
            parent_end, child_end = ctx.Pipe()
            p = ctx.Process(target=_grpc_worker, args=(self.target, share, child_end), daemon=True)
            p.start()
            child_end.close()
            self.procs.append(p)
            self.pipes.append(parent_end)
        for pipe in self.pipes:
            if not pipe.poll(60) or pipe.recv() != "ready":
                raise RuntimeError("a Python load worker did not start")

    def run(self, seconds: float, items: list[tuple[str, str]]) -> SearchSlice:
        n = len(self.pipes)
        cpu0 = sum(proc_cpu_s(p.pid) for p in self.procs)
        t0 = time.perf_counter()
        for i, pipe in enumerate(self.pipes):
            pipe.send((seconds, items[i::n]))
        for pipe in self.pipes:
            if not pipe.poll(seconds + 60):
                raise RuntimeError("a Python load worker did not finish")
            pipe.recv()
        wall = time.perf_counter() - t0
        cpu = sum(proc_cpu_s(p.pid) for p in self.procs) - cpu0
        lat: list[int] = []
        eng: list[float] = []
        emb: list[float] = []
        errors: dict[str, int] = {}
        sent = empty = 0
        for pipe in self.pipes:
            raw_lat, raw_eng, raw_emb, errs, started, none = pipe.recv()
            empty += none
            lat.extend(array("q", raw_lat))
            eng.extend(array("d", raw_eng))
            emb.extend(array("d", raw_emb))
            sent += started
            for k, v in errs.items():
                errors[k] = errors.get(k, 0) + v
        return SearchSlice(
            sorted(lat), len(lat), errors, wall, cpu, "", eng, emb, sent, len(items), empty
        )

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


def _lua_string(s: str) -> str:
    level = "=" * 3
    while f"]{level}]" in s:
        level += "="
    return f"[{level}[{s}]{level}]"


class JsonWrk(Wrk):
    """wrk, one thread, `c` keep-alive connections, POSTing the given JSON bodies in turn."""

    def __init__(self, url: str, concurrency: int, workdir: Path) -> None:
        super().__init__(url, concurrency, workdir, warmup=0)
        self.script = workdir / "wrk-search.lua"

    def run_items(self, seconds: int, items: list[tuple[str, str]]) -> SearchSlice:
        bodies = ",\n".join(
            _lua_string(json.dumps(search_body(q, t), ensure_ascii=False)) for q, t in items
        )
        self.script.write_text(
            f"local bodies = {{\n{bodies}\n}}\nlocal n = 0\n"
            'local headers = {["Content-Type"] = "application/json"}\n'
            "request = function()\n  n = n + 1\n"
            '  return wrk.format("POST", nil, headers, bodies[(n - 1) % #bodies + 1])\nend\n'
            + WRK_LUA
        )
        s = self.run(seconds)
        return SearchSlice(
            s.latencies_us,
            s.requests,
            s.errors,
            s.wall_s,
            s.client_cpu_s,
            s.note,
            [],
            [],
            s.requests,
            len(items),
        )


# ---------------------------------------------------------------------------------------
# One benchmark cell: a path x concurrency x query set, in interleaved rounds


@dataclass
class Cell:
    profile: str
    chunks: int
    path: str
    concurrency: int
    queries: str  # "fresh" | "cached"
    requests: int
    seconds: float
    rps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    errors: dict[str, int]
    engine_ms: dict[str, float] = field(default_factory=dict)
    embed_ms: dict[str, float] = field(default_factory=dict)
    work_ms_p95: float = math.nan
    """p95 over requests of query_embedding_ms + engine_ms (gRPC only)."""
    empty: int = 0
    """gRPC responses without any hit."""
    repeated: int = 0
    """Requests whose query had been sent before in the slice (wrapped around the items)."""
    cpu_cores: dict[str, float] = field(default_factory=dict)
    cpu_us_per_request: dict[str, float] = field(default_factory=dict)
    server_handled: dict[str, int] = field(default_factory=dict)
    slices: list[dict[str, float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def fpercentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of ascending floats (transport.percentile is typed for ints)."""
    if not sorted_values:
        return math.nan
    return float(sorted_values[max(1, math.ceil(p / 100 * len(sorted_values))) - 1])


def p50_p95(values: Sequence[float]) -> dict[str, float]:
    v = sorted(values)
    return {"p50": round(fpercentile(v, 50), 3), "p95": round(fpercentile(v, 95), 3)} if v else {}


class QuerySource:
    """Hands out (query, tenant) items never given out before in this server's life."""

    def __init__(self, queries: list[str], tenants: int, seed: int) -> None:
        self.queries = queries
        self.tenants = tenants
        self.rng = np.random.default_rng(seed)
        self.next = 0

    def take(self, k: int) -> list[tuple[str, str]]:
        if self.next + k > len(self.queries):
            raise RuntimeError("query pool exhausted: raise --pool")
        out = [
            (q, f"tenant-{int(t):02d}")
            for q, t in zip(
                self.queries[self.next : self.next + k],
                self.rng.integers(0, self.tenants, k),
                strict=True,
            )
        ]
        self.next += k
        return out


def measure_cells(
    ctx: dict[str, Any],
    c: int,
    queries: str,
    source: QuerySource | None,
    cached_items: list[tuple[str, str]],
    args: argparse.Namespace,
    workdir: Path,
) -> list[Cell]:
    """Warm up, then --rounds slices of each path in turn (grpc, json, grpc, ...); pool them."""
    mesh = ctx["mesh"]
    grpc_addr = f"127.0.0.1:{mesh.ports.grpc[SERVICE_KEY]}"
    url = f"{mesh.json_url(SERVICE_KEY)}{SEARCH_PATH}"
    metrics_port = mesh.ports.metrics[SERVICE_KEY]
    slice_s = args.duration / args.rounds
    # Distinct items per slice: generous, so a slice never wraps around (wrapping = cache hits).
    cap = math.ceil(slice_s * (args.max_rps if c > 1 else args.max_rps_c1))

    def items_for_slice() -> list[tuple[str, str]]:
        return source.take(cap) if source is not None else cached_items

    gens: dict[str, Any] = {}
    sub = workdir / f"{queries}-c{c}"
    sub.mkdir(parents=True, exist_ok=True)
    if "grpc" in args.paths:
        gens["grpc"] = GrpcSearchClient(grpc_addr, c, args.py_procs)
    if "json" in args.paths:
        gens["json"] = JsonWrk(url, c, sub)
    acc: dict[str, dict[str, Any]] = {
        k: {
            "slices": [],
            "cpu": dict.fromkeys(("server", "envoy", "client", "other", "steal"), 0.0),
            "handled": {},
        }
        for k in gens
    }

    def one(path: str, seconds: float) -> SearchSlice:
        g = gens[path]
        items = items_for_slice()
        if path == "grpc":
            return g.run(seconds, items)
        return g.run_items(max(1, round(seconds)), items)

    try:
        for path, g in gens.items():
            if path == "grpc":
                g.start()
            if args.warmup > 0:
                one(path, args.warmup)
        for _ in range(args.rounds):
            for path in gens:
                time.sleep(args.pause)
                envoy_pid = ctx["pids"]["envoy"] if path == "json" else None
                srv = ctx["pids"][SERVICE_KEY]
                h0 = server_handled(metrics_port, "Search")
                s0, e0, (m0, st0) = proc_cpu_s(srv), proc_cpu_s(envoy_pid), machine_cpu_s()
                sl = one(path, slice_s)
                s1, e1, (m1, st1) = proc_cpu_s(srv), proc_cpu_s(envoy_pid), machine_cpu_s()
                h1 = server_handled(metrics_port, "Search")
                a = acc[path]
                a["slices"].append(sl)
                used = {"server": s1 - s0, "envoy": e1 - e0, "client": sl.client_cpu_s}
                used["other"] = max(0.0, (m1 - m0) - sum(used.values()))
                used["steal"] = st1 - st0
                for k, v in used.items():
                    a["cpu"][k] += v
                for code, v in h1.items():
                    a["handled"][code] = a["handled"].get(code, 0) + int(v - h0.get(code, 0.0))
                print(
                    f"    {queries:<6} {path:<4} c={c:<3} {sl.requests / sl.wall_s:7.1f} RPS  "
                    f"p50 {percentile(sl.latencies_us, 50) / 1000:7.2f} ms  "
                    f"p95 {percentile(sl.latencies_us, 95) / 1000:7.2f} ms  err {sl.errors}",
                    flush=True,
                )
    finally:
        for g in gens.values():
            g.close()
    return [summarize(ctx, path, c, queries, acc[path]) for path in gens]


def summarize(ctx: dict[str, Any], path: str, c: int, queries: str, a: dict[str, Any]) -> Cell:
    slices: list[SearchSlice] = a["slices"]
    lat = sorted(v for s in slices for v in s.latencies_us)
    eng = [v for s in slices for v in s.engine_ms]
    emb = [v for s in slices for v in s.embed_ms]
    work = sorted(x + y for x, y in zip(eng, emb, strict=True))
    requests = sum(s.requests for s in slices)
    seconds = sum(s.wall_s for s in slices)
    errors: dict[str, int] = {}
    for s in slices:
        for k, v in s.errors.items():
            errors[k] = errors.get(k, 0) + v
    repeated = sum(max(0, s.sent - s.offered) for s in slices)
    empty = sum(s.empty for s in slices)
    cpu = a["cpu"]
    n = max(requests, 1)
    notes = sorted({s.note for s in slices if s.note})
    if empty:
        notes.append(f"{empty} of {requests} responses had no hits")
    if queries == "fresh" and repeated:
        notes.append(f"{repeated} requests reused a query of the slice (raise --max-rps)")
    if queries == "fresh" and emb:
        hits = sum(1 for v in emb if v < 0.2)
        if hits > 0.05 * len(emb):
            notes.append(f"{hits} of {len(emb)} fresh queries embedded in < 0.2 ms (cache hits?)")
    return Cell(
        profile=ctx["profile"],
        chunks=ctx["chunks"],
        path=path,
        concurrency=c,
        queries=queries,
        requests=requests,
        seconds=round(seconds, 3),
        rps=round(requests / seconds, 1) if seconds else 0.0,
        p50_ms=percentile(lat, 50) / 1000,
        p95_ms=percentile(lat, 95) / 1000,
        p99_ms=percentile(lat, 99) / 1000,
        errors=errors,
        engine_ms=p50_p95(eng),
        embed_ms=p50_p95(emb),
        work_ms_p95=round(fpercentile(work, 95), 3) if work else math.nan,
        empty=empty,
        repeated=repeated,
        cpu_cores={k: round(v / seconds, 3) for k, v in cpu.items()} if seconds else {},
        cpu_us_per_request={k: round(cpu[k] / n * 1e6) for k in ("server", "envoy", "client")},
        server_handled={k: v for k, v in a["handled"].items() if v},
        slices=[
            {
                "requests": s.requests,
                "seconds": round(s.wall_s, 3),
                "p50_ms": percentile(s.latencies_us, 50) / 1000,
                "p95_ms": percentile(s.latencies_us, 95) / 1000,
            }
            for s in slices
        ],
        notes=notes,
    )


# ---------------------------------------------------------------------------------------
# Ingestion through the IngestDocument RPC


def measure_ingestion(grpc_addr: str, rounds: int, tag: str) -> dict[str, Any]:
    """Ingest samples/docs/*.pdf|*.md `rounds` times under new doc_ids, one at a time."""
    import grpc
    from visior.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc

    files = sample_files()
    blobs = [(p.name, p.read_bytes()) for p in files]
    per_doc: list[dict[str, Any]] = []
    with grpc.insecure_channel(
        grpc_addr,
        options=[
            ("grpc.max_send_message_length", 64 << 20),
            ("grpc.max_receive_message_length", 64 << 20),
        ],
    ) as channel:
        stub = retrieval_pb2_grpc.IngestionServiceStub(channel)

        def ingest(doc_id: str, name: str, content: bytes) -> tuple[int, float]:
            req = retrieval_pb2.IngestDocumentRequest(
                tenant_id="bench-ingest", doc_id=doc_id, file_name=name, content=content
            )
            t0 = time.perf_counter()
            resp = stub.IngestDocument(req, timeout=300)
            return resp.chunks, time.perf_counter() - t0

        ingest(f"{tag}-warmup", *blobs[0])  # first call: lazy imports, PDF library, ...
        t0 = time.perf_counter()
        for r in range(rounds):
            for name, content in blobs:
                doc_id = f"{tag}-r{r}-{Path(name).stem}"
                chunks, secs = ingest(doc_id, name, content)
                per_doc.append({"doc_id": doc_id, "chunks": chunks, "s": round(secs, 3)})
        wall = time.perf_counter() - t0
    chunks = sum(d["chunks"] for d in per_doc)
    from services.common.tokenizer import default_tokenizer
    from services.docstore.parsing import guess_format, parse_document

    # The same chunks, parsed here, for their size (BPE tokens, the server's chunker's unit).
    sizes = [
        c.tokens
        for name, content in blobs
        for c in parse_document(
            tenant_id="t", doc_id="d", content=content, fmt=guess_format(name, "")
        ).chunks
    ]
    tok = default_tokenizer()
    passage_tokens = statistics.mean(tok.count(p) for p in make_passages(50))
    return {
        "mean_chunk_tokens": round(statistics.mean(sizes), 1),
        "reference_passage_tokens": round(passage_tokens, 1),
        "documents": len(per_doc),
        "chunks": chunks,
        "seconds": round(wall, 2),
        "chunks_per_s": round(chunks / wall, 1),
        "files": [n for n, _ in blobs],
        "per_doc": per_doc,
    }


# ---------------------------------------------------------------------------------------
# Mesh


def proc_status_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM, and Pss: RSS counts a file page once per mapping of it, and the
    document store maps its file once per read connection (up to four), so RSS grows with
    them while the memory used does not; Pss counts each page once."""
    out = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = round(int(rest.split()[0]) / 1024, 1)
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key == "Pss":
                out[key] = round(int(rest.split()[0]) / 1024, 1)
    return out


@contextlib.contextmanager
def running_mesh(
    data_dir: Path, workdir: Path, env: dict[str, str], envoy_concurrency: int, full: bool
) -> Iterator[Any]:
    """The retrieval server and the Envoy sidecar (all four servers with `full`); stopped on exit."""
    from services.common.topology import Ports
    from services.devtools.envoy import REPO_ROOT as ENVOY_CWD
    from services.devtools.envoy_config import render
    from services.devtools.mesh import Mesh

    mesh = Mesh(Ports.free(), data_dir, workdir, env=env, envoy_concurrency=envoy_concurrency)
    try:
        if full:
            mesh.start()
        else:
            # Only the server under test (the others would idle, or fail to start while
            # someone edits them); Envoy with the mesh's real config, as Mesh.start runs it.
            mesh.start_service(SERVICE_KEY)
            mesh.wait_healthy(SERVICE_KEY, timeout=120)
            mesh.envoy.start(
                render(mesh.ports, str(ENVOY_CWD / "envoy" / "visior.pb")), workdir / "envoy"
            )
            mesh.envoy.wait_ready()
        yield mesh
        dead = [k for k, alive in mesh.alive().items() if not alive]
        if dead:
            raise RuntimeError(f"server(s) died during the benchmark: {dead}")
    finally:
        mesh.stop()


def check_hits(grpc_addr: str, items: list[tuple[str, str]]) -> float:
    """Mean hits per search over `items`; exits when searches find nothing (a broken index)."""
    import grpc
    from visior.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc

    with grpc.insecure_channel(grpc_addr) as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        hits = [
            len(
                stub.Search(
                    retrieval_pb2.SearchRequest(query=q, tenant_id=t), timeout=GRPC_TIMEOUT_S
                ).hits
            )
            for q, t in items
        ]
    if not any(hits):
        raise SystemExit(
            "searches of the synthetic data return no hits: the index layout does not match "
            "the server's (stale --cache-dir?); nothing worth measuring"
        )
    return sum(hits) / len(hits)


def warm_cache(grpc_addr: str, items: list[tuple[str, str]]) -> None:
    """Send each cached-set query once, so the cached runs hit the query-embedding cache."""
    import grpc
    from visior.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc

    with grpc.insecure_channel(grpc_addr) as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        for q, t in items:
            stub.Search(retrieval_pb2.SearchRequest(query=q, tenant_id=t), timeout=GRPC_TIMEOUT_S)


def run_size(
    profile: str, n: int, args: argparse.Namespace, pool: list[str], tmp: Path
) -> dict[str, Any]:
    dim = PROFILE_DIM[profile]
    print(f"\n== {profile} at {n} chunks", flush=True)
    cached_dir, dataset = ensure_dataset(args.cache_dir, n, dim, args.seed, args.tenants)
    dataset["size_mb"] = round(dir_mb(cached_dir), 1)
    print(
        f"  data: {cached_dir} ({dataset['size_mb']} MB, points {dataset.get('points')}, "
        f"{'cached' if dataset['cached'] else 'built in ' + str(dataset['build_s']) + ' s'})",
        flush=True,
    )
    # The server writes to its data dir (journal, ingestion): work on a copy.
    data = tmp / f"data-{profile}-{n}"
    t0 = time.perf_counter()
    shutil.copytree(cached_dir, data)
    copy_s = time.perf_counter() - t0
    env = {"RETR_EMBEDDING_PROFILE": profile}
    env.update(dict(kv.split("=", 1) for kv in args.server_env))
    result: dict[str, Any] = {
        "profile": profile,
        "chunks": n,
        "dataset": dataset,
        "copy_s": round(copy_s, 1),
        "server_env": env,
    }
    t0 = time.perf_counter()
    with running_mesh(
        data, tmp / f"run-{profile}-{n}", env, args.envoy_concurrency, args.full_mesh
    ) as mesh:
        result["mesh_start_s"] = round(time.perf_counter() - t0, 1)
        pids = mesh.pids()
        ctx = {"mesh": mesh, "pids": pids, "profile": profile, "chunks": n}
        grpc_addr = f"127.0.0.1:{mesh.ports.grpc[SERVICE_KEY]}"
        result["rss_start_mb"] = proc_status_mb(pids[SERVICE_KEY])
        print(
            f"  mesh up in {result['mesh_start_s']} s; retrieval RSS "
            f"{result['rss_start_mb'].get('VmRSS')} MB",
            flush=True,
        )
        source = QuerySource(pool, args.tenants, args.seed + n)
        crng = np.random.default_rng(args.seed + 1)
        cached_items = [
            (q, f"tenant-{int(crng.integers(args.tenants)):02d}")
            for q in query_pool(args.seed + 99, args.cached_queries)
        ]
        # The probe's queries: the cached set's first 16, or 16 of their own without one.
        probe = cached_items[:16] or [
            (q, f"tenant-{i % args.tenants:02d}")
            for i, q in enumerate(query_pool(args.seed + 98, 16))
        ]
        result["mean_hits"] = check_hits(grpc_addr, probe)
        print(f"  probe: {result['mean_hits']:.1f} hits per search", flush=True)
        cells: list[Cell] = []
        for c in args.concurrency:
            cells += measure_cells(ctx, c, "fresh", source, cached_items, args, tmp)
        if args.cached_queries > 0:
            warm_cache(grpc_addr, cached_items)
            for c in args.concurrency:
                cells += measure_cells(ctx, c, "cached", None, cached_items, args, tmp)
        result["fresh_queries_used"] = source.next
        result["rss_after_search_mb"] = proc_status_mb(pids[SERVICE_KEY])
        if args.ingest_rounds > 0:
            srv = pids[SERVICE_KEY]
            c0 = proc_cpu_s(srv)
            ing = measure_ingestion(grpc_addr, args.ingest_rounds, f"ing-{profile}-{n}")
            ing["server_cores"] = round((proc_cpu_s(srv) - c0) / ing["seconds"], 2)
            result["ingestion"] = ing
            print(
                f"  ingestion: {ing['chunks']} chunks of {ing['documents']} documents in "
                f"{ing['seconds']} s = {ing['chunks_per_s']} chunks/s",
                flush=True,
            )
        result["rss_end_mb"] = proc_status_mb(pids[SERVICE_KEY])
    shutil.rmtree(data, ignore_errors=True)
    result["cells"] = [asdict(x) for x in cells]
    return result


# ---------------------------------------------------------------------------------------
# Report


def format_table(runs: list[dict[str, Any]]) -> str:
    head = (
        f"{'profile':<7} {'chunks':>7} {'queries':<7} {'path':<4} {'c':>3} {'req':>6} "
        f"{'RPS':>6} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} {'embed p50/p95':>14} "
        f"{'engine p50/p95':>15} {'e+e p95':>8} {'err':>4}  {'cores srv/envoy/clnt/other':<26}"
        f" {'srv us/req':>10}"
    )
    lines = [head, "-" * len(head)]
    for run in runs:
        for x in run["cells"]:
            emb = f"{x['embed_ms']['p50']:.2f}/{x['embed_ms']['p95']:.2f}" if x["embed_ms"] else "-"
            eng = (
                f"{x['engine_ms']['p50']:.2f}/{x['engine_ms']['p95']:.2f}"
                if x["engine_ms"]
                else "-"
            )
            work = f"{x['work_ms_p95']:.2f}" if not math.isnan(x["work_ms_p95"]) else "-"
            cc = x["cpu_cores"]
            cores = "/".join(f"{cc.get(k, 0):.2f}" for k in ("server", "envoy", "client", "other"))
            lines.append(
                f"{x['profile']:<7} {x['chunks']:>7} {x['queries']:<7} {x['path']:<4} "
                f"{x['concurrency']:>3} {x['requests']:>6} {x['rps']:>6.0f} {x['p50_ms']:>7.2f} "
                f"{x['p95_ms']:>7.2f} {x['p99_ms']:>7.2f} {emb:>14} {eng:>15} {work:>8} "
                f"{sum(x['errors'].values()):>4}  {cores:<26} "
                f"{x['cpu_us_per_request']['server']:>10}"
            )
    return "\n".join(lines)


def verdicts(
    runs: list[dict[str, Any]], embed: dict[str, dict[str, Any]], args: argparse.Namespace
) -> tuple[list[str], list[dict[str, Any]]]:
    lines: list[str] = []
    checks: list[dict[str, Any]] = []
    biggest = max(args.sizes)
    low, high = min(args.concurrency), max(args.concurrency)

    def check(name: str, value: float, limit: float, ok: bool, detail: str) -> None:
        checks.append({"check": name, "value": round(value, 3), "limit": round(limit, 3), "ok": ok})
        lines.append(f"{'PASS' if ok else 'MISS'}  {name}: {detail}")

    for run in runs:
        prof, n = run["profile"], run["chunks"]
        cells = {(x["path"], x["concurrency"], x["queries"]): x for x in run["cells"]}
        e = embed.get(prof, {})
        tag = f"{prof} {n // 1000}k"
        g = cells.get(("grpc", low, "fresh"))
        for path in ("grpc", "json"):
            x = cells.get((path, low, "fresh"))
            if x is None or g is None or math.isnan(g["work_ms_p95"]):
                continue
            ref = g["work_ms_p95"]
            check(
                f"{tag} {path} c={low} p95 <= 1.3 x (query-embed + engine)",
                x["p95_ms"],
                1.3 * ref,
                x["p95_ms"] <= 1.3 * ref,
                f"p95 {x['p95_ms']:.2f} ms vs 1.3 x {ref:.2f} = {1.3 * ref:.2f} ms "
                f"(embed+engine p95 per request, from the gRPC responses; "
                f"p95s apart: embed {g['embed_ms']['p95']:.2f} + engine "
                f"{g['engine_ms']['p95']:.2f} ms)",
            )
        if n == biggest:
            limit = args.target_p95_e5 if prof == "e5" else args.target_p95_fast
            for path in ("grpc", "json"):
                x = cells.get((path, low, "fresh"))
                if x:
                    check(
                        f"{tag} {path} c={low} p95 <= {limit:g} ms",
                        x["p95_ms"],
                        limit,
                        x["p95_ms"] <= limit,
                        f"p95 {x['p95_ms']:.2f} ms",
                    )
        for path in ("grpc", "json"):
            x = cells.get((path, high, "fresh"))
            if x is None or not e:
                continue
            want = 0.8 * e["query_per_s"]
            check(
                f"{tag} {path} c={high} RPS >= 0.8 x raw query rate",
                x["rps"],
                want,
                x["rps"] >= want,
                f"{x['rps']:.0f} RPS vs 0.8 x {e['query_per_s']:.0f} = {want:.0f} q/s "
                f"(embedder in-process, 1 thread, batch 1)",
            )
            if prof == "fast":
                check(
                    f"{tag} {path} c={high} RPS >= {args.target_rps_fast:g}",
                    x["rps"],
                    args.target_rps_fast,
                    x["rps"] >= args.target_rps_fast,
                    f"{x['rps']:.0f} RPS",
                )
        ing = run.get("ingestion")
        if ing and e:
            want = 0.8 * e["sample_chunks_per_s"]
            check(
                f"{tag} ingestion >= 0.8 x raw passage rate (same chunks)",
                ing["chunks_per_s"],
                want,
                ing["chunks_per_s"] >= want,
                f"{ing['chunks_per_s']:.1f} chunks/s through IngestDocument vs 0.8 x "
                f"{e['sample_chunks_per_s']:.1f} = {want:.1f} chunks/s (the embedder alone, "
                f"in-process, 1 thread, on the same {ing['mean_chunk_tokens']:.0f}-token chunks)",
            )
            want = 0.8 * e["passages_per_s"]
            check(
                f"{tag} ingestion >= 0.8 x raw passage rate (~200-token passages)",
                ing["chunks_per_s"],
                want,
                ing["chunks_per_s"] >= want,
                f"{ing['chunks_per_s']:.1f} chunks/s (mean {ing['mean_chunk_tokens']:.0f} BPE tokens) "
                f"vs 0.8 x {e['passages_per_s']:.1f} = {want:.1f} passages/s (mean "
                f"{ing['reference_passage_tokens']:.0f} BPE tokens, batch {e['passage_batch']}, "
                f"1 thread)",
            )
    return lines, checks


def warnings(runs: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    out = []
    for run in runs:
        for x in run["cells"]:
            tag = f"{x['profile']} {x['chunks']} {x['queries']} {x['path']} c={x['concurrency']}"
            bad = {k: v for k, v in x["server_handled"].items() if k != "OK"}
            # wrk stops with requests in flight: Envoy cancels them upstream (<= c per slice).
            if (
                bad.get("CANCELLED", 0) <= x["concurrency"] * len(x["slices"])
                and x["path"] == "json"
            ):
                bad.pop("CANCELLED", None)
            if bad:
                out.append(f"WARNING {tag}: the server answered {bad}")
            if sum(x["errors"].values()):
                out.append(f"WARNING {tag}: client errors {x['errors']}")
            other, steal = x["cpu_cores"].get("other", 0), x["cpu_cores"].get("steal", 0)
            if other > args.busy_threshold or steal > args.busy_threshold / 2:
                out.append(
                    f"WARNING {tag}: other processes used {other:.2f} cores, steal "
                    f"{steal:.2f}; figures may be skewed"
                )
            out += [f"NOTE {tag}: {note}" for note in x["notes"]]
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    stamp = dt.datetime.now().strftime("%Y-%m-%d-%H%M%S")
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--profiles", default="e5,fast", help="embedding profiles to run (e5,fast)")
    ap.add_argument("--sizes", type=ints, default=[10_000, 100_000], help="chunks (10000,100000)")
    ap.add_argument(
        "--fast-sizes",
        type=ints,
        default=None,
        help="sizes for the fast profile (default: --sizes)",
    )
    ap.add_argument("--duration", type=float, default=10, help="seconds per path and cell (10)")
    ap.add_argument("--rounds", type=int, default=2, help="slices per cell, interleaved (2)")
    ap.add_argument("--warmup", type=float, default=2, help="warm-up seconds per path (2)")
    ap.add_argument("--pause", type=float, default=0.2)
    ap.add_argument("--concurrency", type=ints, default=[1, 32])
    ap.add_argument("--paths", default="grpc,json", help="grpc (Python grpc.aio), json (wrk)")
    ap.add_argument("--py-procs", type=int, default=2, help="gRPC client processes (2)")
    ap.add_argument("--envoy-concurrency", type=int, default=2)
    ap.add_argument(
        "--full-mesh", action="store_true", help="start all four servers, not only retrieval"
    )
    ap.add_argument("--tenants", type=int, default=10)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--pool", type=int, default=200_000, help="distinct fresh queries (200000)")
    ap.add_argument(
        "--cached-queries",
        type=int,
        default=64,
        help="size of the cached query set; 0 skips the cached runs (64)",
    )
    ap.add_argument(
        "--max-rps",
        type=float,
        default=1500,
        help="distinct queries per second of a c>1 slice (1500)",
    )
    ap.add_argument("--max-rps-c1", type=float, default=500)
    ap.add_argument("--embed-seconds", type=float, default=5, help="per embedder measurement")
    ap.add_argument(
        "--ingest-rounds",
        type=int,
        default=3,
        help="passes over samples/docs through IngestDocument; 0 skips (3)",
    )
    ap.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "visior-bench-retrieval",
        help="built data dirs (/tmp/visior-bench-retrieval)",
    )
    ap.add_argument("--target-p95-e5", type=float, default=25.0)
    ap.add_argument("--target-p95-fast", type=float, default=10.0)
    ap.add_argument("--target-rps-fast", type=float, default=500.0)
    ap.add_argument("--busy-threshold", type=float, default=0.25)
    ap.add_argument(
        "--out",
        type=Path,
        default=REPO_ROOT / "bench" / "out" / f"retrieval-search-{stamp}.json",
    )
    args = ap.parse_args(argv)
    args.profiles = [p for p in args.profiles.split(",") if p]
    args.paths = [p for p in args.paths.split(",") if p]
    if set(args.profiles) - set(PROFILE_DIM):
        ap.error(f"--profiles: choose from {','.join(PROFILE_DIM)}")
    if set(args.paths) - {"grpc", "json"}:
        ap.error("--paths: grpc and/or json")
    if "json" in args.paths and shutil.which("wrk") is None:
        ap.error("wrk not found: apt-get install -y wrk (or --paths grpc)")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    return args


def _terminate(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _lone(e: dict[str, Any]) -> str:
    if "lone_query_per_s" not in e:
        return ""
    return (
        f"; lone queries with the server's RETR_EMBEDDING_THREADS={e['lone_threads']}: "
        f"{e['lone_query_per_s']} queries/s (p50 {e['lone_query_ms_p50']} ms, "
        f"p95 {e['lone_query_ms_p95']} ms)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    started = dt.datetime.now(dt.UTC)
    pool = query_pool(args.seed, args.pool)
    embed: dict[str, dict[str, Any]] = {}
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-retrieval-") as tmp:
        for profile in args.profiles:
            print(
                f"\n== embedder {profile}: in-process, one caller, one core per call, no cache",
                flush=True,
            )
            # Queries from the far end of the pool: never sent to a server in this run.
            e = measure_embedder(profile, args.embed_seconds, pool[-5000:])
            embed[profile] = e
            print(
                f"  {e['model']}: {e['query_per_s']} queries/s (p50 {e['query_ms_p50']} ms), "
                f"{e['passages_per_s']} passages/s (batch {e['passage_batch']}), "
                f"{e['sample_chunks_per_s']} sample-doc chunks/s{_lone(e)}",
                flush=True,
            )
            sizes = args.fast_sizes if profile == "fast" and args.fast_sizes else args.sizes
            for n in sizes:
                runs.append(run_size(profile, n, args, pool[:-5000], Path(tmp)))
    table = format_table(runs)
    lines, checks = verdicts(runs, embed, args)
    warn = warnings(runs, args)
    summary = []
    for run in runs:
        ing = run.get("ingestion", {})
        summary.append(
            f"{run['profile']:<5} {run['chunks']:>7} chunks: retrieval RSS start "
            f"{run['rss_start_mb'].get('VmRSS')} MB, after search "
            f"{run['rss_after_search_mb'].get('VmRSS')} MB, end {run['rss_end_mb'].get('VmRSS')}"
            f" MB (peak {run['rss_end_mb'].get('VmHWM')} MB; Pss after search "
            f"{run['rss_after_search_mb'].get('Pss')} MB); ingestion "
            f"{ing.get('chunks_per_s', '-')} chunks/s ({ing.get('chunks', 0)} chunks, "
            f"server {ing.get('server_cores', '-')} cores); data "
            f"{run['dataset']['size_mb']} MB, {run['dataset'].get('points')} points"
        )
    for prof, e in embed.items():
        summary.append(
            f"embedder {prof} ({e['model']}), in-process, one core per call: {e['query_per_s']} queries/s "
            f"(p50 {e['query_ms_p50']} ms, p95 {e['query_ms_p95']} ms), "
            f"{e['passages_per_s']} passages/s of ~200 tokens (batch {e['passage_batch']}), "
            f"{e['sample_chunks_per_s']} sample-doc chunks/s (what IngestDocument embeds)"
            f"{_lone(e)}"
        )
    print(f"\n{table}\n\n" + "\n".join(summary) + "\n\n" + "\n".join(lines + warn))
    write_record(
        "retrieval_search",
        started,
        args,
        environment_info(),
        embedders=embed,
        runs=runs,
        checks=checks,
        table=table.splitlines(),
        summary=summary,
        notes=lines + warn,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
