"""kill -9 in the middle of an Edge optimize loses nothing: the shard reopens with every
point, answers, and the next optimize finishes (the server runs optimize on its own after
ingest bursts and at start-up, services/retrieval/index_maintenance.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from services.retrieval.index.base import IndexFilter
from services.retrieval.index.edge import EdgeIndex
from tests.index_points import chunk_points

REPO = Path(__file__).resolve().parents[2]
N, DIM = 20_000, 64  # optimize takes ~1.3 s here with HNSW forced on

CHILD = """
import sys
from services.retrieval.index.edge import EdgeIndex
from tests.index_points import chunk_points
idx = EdgeIndex(sys.argv[1], int(sys.argv[2]), indexing_threshold_kb=1)
print("optimizing", flush=True)
idx.optimize()
print("done", flush=True)
"""


def test_kill_9_mid_optimize_loses_nothing(tmp_path):
    path = str(tmp_path / "shard")
    vectors = np.random.default_rng(3).standard_normal((N, DIM)).astype(np.float32)
    idx = EdgeIndex(path, DIM, indexing_threshold_kb=1)
    for start in range(0, N, 2000):
        idx.upsert(chunk_points(vectors)[start : start + 2000])
    idx.close()

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "gen" / "python")])}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, path, str(DIM)],
        stdout=subprocess.PIPE, text=True, env=env, cwd=REPO,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "optimizing"
        time.sleep(0.2)
        child.send_signal(signal.SIGKILL)
        rest = child.communicate(timeout=30)[0]
    finally:
        if child.poll() is None:
            child.kill()
    assert "done" not in rest, "optimize finished before the kill: make the shard bigger"
    assert child.returncode == -signal.SIGKILL

    idx = EdgeIndex(path, DIM, indexing_threshold_kb=1)
    try:
        assert idx.count() == N
        hits = idx.search_dense_ids(vectors[123], IndexFilter("a", kinds=("chunk",)), 3)
        assert hits[0][0] == 124
        idx.optimize()
        assert idx.count() == N
        assert (
            idx.search_dense_ids(vectors[456], IndexFilter("a", kinds=("chunk",)), 1)[0][0] == 457
        )
    finally:
        idx.close()
