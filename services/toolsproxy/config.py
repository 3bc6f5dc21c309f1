"""ToolsProxyService settings (MCP_PROXY_*)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.search_contract import window_radius
from services.common.settings import DownstreamSettings, Env, ServerSettings, downstream
from services.docstore.config import DocstoreSettings, docstore_settings
from services.toolsproxy.cbr import CbrSettings
from services.toolsproxy.mcp_server import McpSettings
from services.toolsproxy.ratelimit import RateLimits
from services.toolsproxy.tavily import TavilySettings
from services.toolsproxy.tools import ToolLimits

DEFAULT_PORT = 50054


@dataclass(frozen=True)
class ToolsProxySettings:
    """Everything the tools proxy reads from the environment."""

    server: ServerSettings
    """gRPC server knobs (MCP_PROXY_HOST, MCP_PROXY_PORT, ...)."""
    limits: ToolLimits
    """Window radius, pages per call and result size limits."""
    rate_limits: RateLimits
    """Calls and result tokens per minute, per tenant_id:doc_id and per tenant."""
    docstore: DocstoreSettings
    """Document store, SQLite or PostgreSQL (MCP_PROXY_DOCSTORE_URL / METADATA_DB_URL /
    VISIOR_DATA_DIR, MCP_PROXY_DOCSTORE_POOL_SIZE / DOCSTORE_POOL_SIZE)."""
    retrieval: DownstreamSettings
    """RetrievalService for the search tools (MCP_PROXY_RETRIEVAL_URL, _TIMEOUT_SECONDS)."""
    cbr: CbrSettings
    """Bank of Russia DailyInfo (MCP_PROXY_CBR_*)."""
    tavily: TavilySettings
    """Tavily news search (MCP_PROXY_TAVILY_*, TAVILY_API_KEY)."""
    mcp: McpSettings
    """The MCP endpoint (MCP_PROXY_MCP_*)."""

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
                max_pages_per_call=env.integer(
                    "MCP_PROXY_MAX_PAGES_PER_CALL", 5, minimum=1, maximum=100
                ),
                max_full_documents=env.integer(
                    "MCP_PROXY_MAX_FULL_DOCUMENTS", 10, minimum=1, maximum=50
                ),
                max_full_text_bytes=env.integer(
                    "MCP_PROXY_MAX_FULL_TEXT_BYTES", 200_000, minimum=256, maximum=3 << 20
                ),
            ),
            rate_limits=RateLimits(
                calls_per_minute=env.integer(
                    "MCP_PROXY_RATE_LIMIT_CALLS_PER_MIN", 60, minimum=0, maximum=1_000_000
                ),
                tokens_per_minute=env.integer(
                    "MCP_PROXY_RATE_LIMIT_TOKENS_PER_MIN", 100_000, minimum=0
                ),
                tenant_calls_per_minute=env.integer(
                    "MCP_PROXY_RATE_LIMIT_TENANT_CALLS_PER_MIN", 120, minimum=0, maximum=1_000_000
                ),
                tenant_tokens_per_minute=env.integer(
                    "MCP_PROXY_RATE_LIMIT_TENANT_TOKENS_PER_MIN", 200_000, minimum=0
                ),
            ),
            docstore=docstore_settings(env, "MCP_PROXY_"),
            retrieval=downstream(
                env,
                ["MCP_PROXY_RETRIEVAL_URL", "RETRIEVAL_URL"],
                "127.0.0.1:50053",
                ["MCP_PROXY_RETRIEVAL_TIMEOUT_SECONDS"],
                5.0,
            ),
            cbr=CbrSettings.from_env(env),
            tavily=TavilySettings.from_env(env),
            mcp=McpSettings.from_env(env),
        )
