"""`python -m services.retrieval`: the RetrievalService + IngestionService process."""

from services.common.runner import run_service
from services.retrieval.app import start
from services.retrieval.config import RetrievalSettings

if __name__ == "__main__":
    run_service(RetrievalSettings.from_env, start)
