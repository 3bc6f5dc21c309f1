"""`python -m services.toolsproxy`: the ToolsProxyService process."""

from services.common.runner import run_service
from services.toolsproxy.app import start
from services.toolsproxy.config import ToolsProxySettings

if __name__ == "__main__":
    run_service(ToolsProxySettings.from_env, start)
