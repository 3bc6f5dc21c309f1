"""ToolsProxyService settings (MCP_PROXY_*)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.settings import Env, ServerSettings
from services.docstore.config import docstore_path
from services.toolsproxy.tools import ToolLimits

DEFAULT_PORT = 50054
DEFAULT_WINDOW_RADIUS = 3


def window_radius(env: Env, primary: list[str], legacy: list[str]) -> int:
    """Per-side radius R (DESIGN §2.6): R from `primary`, else legacy total N -> floor((N-1)/2)."""
    found = env.raw(primary)
    if found is not None:
        return env.integer(primary, DEFAULT_WINDOW_RADIUS, minimum=0, maximum=50)
    if env.raw(legacy) is not None:
        total = env.integer(legacy, 2 * DEFAULT_WINDOW_RADIUS + 1, minimum=1, maximum=101)
        return (total - 1) // 2
    return DEFAULT_WINDOW_RADIUS


@dataclass(frozen=True)
class ToolsProxySettings:
    """Everything the tools proxy reads from the environment."""

    server: ServerSettings
    """gRPC server knobs (MCP_PROXY_HOST, MCP_PROXY_PORT, ...)."""
    limits: ToolLimits
    """Window radius and result size limits."""
    docstore_path: str
    """SQLite document store (MCP_PROXY_DOCSTORE_URL / METADATA_DB_URL / VISIOR_DATA_DIR)."""

    @classmethod
    def from_env(cls, env: Env | None = None) -> ToolsProxySettings:
        env = env or Env()
        return cls(
            server=ServerSettings.from_env("toolsproxy", "MCP_PROXY_", env, DEFAULT_PORT),
            limits=ToolLimits(
                max_window_radius=window_radius(
                    env,
                    ["MCP_PROXY_MAX_WINDOW_RADIUS", "RAG_WINDOW_RADIUS"],
                    ["MCP_PROXY_MAX_CHUNK_WINDOW"],
                ),
                max_text_bytes=env.integer(
                    "MCP_PROXY_MAX_TEXT_BYTES", 16_384, minimum=256, maximum=1 << 20
                ),
            ),
            docstore_path=docstore_path(env, "MCP_PROXY_"),
        )
