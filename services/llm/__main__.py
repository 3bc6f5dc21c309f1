"""`python -m services.llm`: the LlmService process."""

from services.common.runner import run_service
from services.llm.app import start
from services.llm.config import LlmSettings

if __name__ == "__main__":
    run_service(LlmSettings.from_env, start)
