"""`python -m services.orchestrator`: the OrchestratorService process."""

from services.common.runner import run_service
from services.orchestrator.app import start
from services.orchestrator.config import OrchestratorSettings

if __name__ == "__main__":
    run_service(OrchestratorSettings.from_env, start)
