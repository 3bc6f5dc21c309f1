"""`python -m services.retrieval`: the RetrievalService + IngestionService process."""

import os

# One BLAS/OpenMP thread per call: the server runs searches in parallel threads already, and
# numpy's default BLAS threading made the fast (USE) profile 5x slower on a busy 2-core box
# (bench/embedders.py). Set before numpy is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from services.common.runner import run_service
from services.retrieval.app import start
from services.retrieval.config import RetrievalSettings

if __name__ == "__main__":
    run_service(RetrievalSettings.from_env, start)
