"""ToolsProxyService settings (MCP_PROXY_*): each variable declared once, read here only."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.settings import (
    DownstreamSettings,
    Env,
    Fields,
    ServerSettings,
    downstream,
    flag,
    integer,
    number,
    retry_attempts,
    secret,
    text,
)
from services.common.shared_config import proxy_max_window_radius
from services.docstore.config import DocstoreSettings, docstore_settings
from services.toolsproxy.cbr import DEFAULT_URL as CBR_URL
from services.toolsproxy.cbr import CbrSettings
from services.toolsproxy.mcp_server import DEFAULT_MCP_PORT, McpSettings
from services.toolsproxy.ratelimit import RateLimits
from services.toolsproxy.tavily import DEFAULT_BASE_URL as TAVILY_URL
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
    """Document store, SQLite or PostgreSQL (METADATA_DB_URL / VISIOR_DATA_DIR,
    MCP_PROXY_DOCSTORE_POOL_SIZE, MCP_PROXY_DOCSTORE_TIMEOUT_S)."""
    retrieval: DownstreamSettings
    """RetrievalService for the search tools (MCP_PROXY_RETRIEVAL_URL, _TIMEOUT_SECONDS)."""
    cbr: CbrSettings
    """Bank of Russia DailyInfo (MCP_PROXY_CBR_*)."""
    tavily: TavilySettings
    """Tavily news search (MCP_PROXY_TAVILY_*)."""
    mcp: McpSettings
    """The MCP endpoint (MCP_PROXY_MCP_*)."""

    @classmethod
    def from_env(cls, env: Env | None = None) -> ToolsProxySettings:
        env = env or Env()
        return cls(
            server=ServerSettings.from_env("toolsproxy", "MCP_PROXY_", env, DEFAULT_PORT),
            limits=LIMITS.read(env, max_window_radius=proxy_max_window_radius(env)),
            rate_limits=RATE_LIMITS.read(env),
            docstore=docstore_settings(env, "MCP_PROXY_"),
            retrieval=RETRIEVAL.read(env, retry_attempts("MCP_PROXY_")),
            cbr=cbr_settings(env),
            tavily=tavily_settings(env),
            mcp=mcp_settings(env),
        )


def cbr_settings(env: Env) -> CbrSettings:
    """The Bank of Russia client's settings (MCP_PROXY_CBR_*)."""
    return CBR.read(env)


def tavily_settings(env: Env) -> TavilySettings:
    """The Tavily client's settings (MCP_PROXY_TAVILY_*)."""
    values = TAVILY.values(env)
    return TavilySettings(**{**values, "base_url": values["base_url"].rstrip("/")})


def mcp_settings(env: Env) -> McpSettings:
    """The MCP endpoint's settings (MCP_PROXY_MCP_*)."""
    values = MCP.values(env)
    hosts = values.pop("allowed_hosts")
    return McpSettings(
        **values, allowed_hosts=tuple(h.strip() for h in hosts.split(",") if h.strip())
    )


RETRIEVAL = downstream(
    "MCP_PROXY_RETRIEVAL_URL", "MCP_PROXY_RETRIEVAL_TIMEOUT_SECONDS", 5.0, "RetrievalService",
    "127.0.0.1:50053",
    doc="RetrievalService for the search tools: host:port or a grpc:// / http:// URL.",
)  # fmt: skip
LIMITS = Fields(
    ToolLimits,
    max_text_bytes=integer("MCP_PROXY_MAX_TEXT_BYTES", 16_384, 256, 1 << 20),
    max_pages_per_call=integer("MCP_PROXY_MAX_PAGES_PER_CALL", 5, 1, 100),
    max_full_documents=integer("MCP_PROXY_MAX_FULL_DOCUMENTS", 10, 1, 50),
    max_full_text_bytes=integer("MCP_PROXY_MAX_FULL_TEXT_BYTES", 200_000, 256, 3 << 20),
)
RATE_LIMITS = Fields(
    RateLimits,
    calls_per_minute=integer("MCP_PROXY_RATE_LIMIT_CALLS_PER_MIN", 60, 0, 1_000_000),
    tokens_per_minute=integer("MCP_PROXY_RATE_LIMIT_TOKENS_PER_MIN", 100_000, 0),
    tenant_calls_per_minute=integer("MCP_PROXY_RATE_LIMIT_TENANT_CALLS_PER_MIN", 120, 0, 1_000_000),
    tenant_tokens_per_minute=integer("MCP_PROXY_RATE_LIMIT_TENANT_TOKENS_PER_MIN", 200_000, 0),
)
CBR = Fields(
    CbrSettings,
    url=text("MCP_PROXY_CBR_URL", CBR_URL),
    timeout_s=number("MCP_PROXY_CBR_TIMEOUT_S", 10.0, 0.01),
    cache_ttl_s=number("MCP_PROXY_CBR_CACHE_TTL_S", 900.0, 0.0),
    cache_max_entries=integer("MCP_PROXY_CBR_CACHE_MAX_ENTRIES", 512, 1, 100_000),
    retries=integer("MCP_PROXY_CBR_RETRIES", 1, 0, 3),
    retry_delay_s=number("MCP_PROXY_CBR_RETRY_DELAY_S", 0.2, 0.0),
    breaker_failures=integer("MCP_PROXY_CBR_BREAKER_FAILURES", 3, 1, 5),
    breaker_reset_s=number("MCP_PROXY_CBR_BREAKER_RESET_S", 30.0, 0.0),
    max_range_days=integer("MCP_PROXY_CBR_MAX_RANGE_DAYS", 366, 1, 3660),
    max_items=integer("MCP_PROXY_CBR_MAX_ITEMS", 400, 1, 10_000),
    max_response_bytes=integer("MCP_PROXY_CBR_MAX_RESPONSE_BYTES", 4 * 1024 * 1024, 1024),
    demo=flag("MCP_PROXY_CBR_DEMO", False),
)
TAVILY = Fields(
    TavilySettings,
    api_key=secret("MCP_PROXY_TAVILY_API_KEY"),
    base_url=text("MCP_PROXY_TAVILY_URL", TAVILY_URL),
    allow_http=flag("MCP_PROXY_TAVILY_ALLOW_HTTP", False),
    timeout_s=number("MCP_PROXY_TAVILY_TIMEOUT_S", 9.0, 0.1),
    deadline_s=number("MCP_PROXY_TAVILY_DEADLINE_S", 20.0, 0.1),
    max_attempts=integer("MCP_PROXY_TAVILY_MAX_ATTEMPTS", 3, 1, 5),
    backoff_s=number("MCP_PROXY_TAVILY_BACKOFF_S", 0.5, 0.0),
    backoff_max_s=number("MCP_PROXY_TAVILY_BACKOFF_MAX_S", 4.0, 0.0),
    max_retry_after_s=number("MCP_PROXY_TAVILY_MAX_RETRY_AFTER_S", 5.0, 0.0),
    cache_ttl_s=number("MCP_PROXY_TAVILY_CACHE_TTL_S", 300.0, 0.0),
    cache_max_entries=integer("MCP_PROXY_TAVILY_CACHE_MAX_ENTRIES", 1024, 1),
    breaker_failures=integer("MCP_PROXY_TAVILY_BREAKER_FAILURES", 5, 1),
    breaker_reset_s=number("MCP_PROXY_TAVILY_BREAKER_RESET_S", 30.0, 0.0),
    max_snippet_chars=integer("MCP_PROXY_TAVILY_MAX_SNIPPET_CHARS", 1000, 50),
)
MCP = Fields(
    McpSettings,
    enabled=flag("MCP_PROXY_MCP_ENABLED", False),
    host=text("MCP_PROXY_MCP_HOST", "127.0.0.1"),
    port=integer("MCP_PROXY_MCP_PORT", DEFAULT_MCP_PORT, 0, 65535),
    path=text("MCP_PROXY_MCP_PATH", "/mcp"),
    tenant_header=text("MCP_PROXY_MCP_TENANT_HEADER", "X-Visior-Tenant-Id"),
    user_header=text("MCP_PROXY_MCP_USER_HEADER", "X-Visior-User-Id"),
    token=text("MCP_PROXY_MCP_TOKEN"),
    stateless=flag("MCP_PROXY_MCP_STATELESS", True),
    json_response=flag("MCP_PROXY_MCP_JSON_RESPONSE", True),
    allowed_hosts=text("MCP_PROXY_MCP_ALLOWED_HOSTS"),
    max_body_bytes=integer("MCP_PROXY_MCP_MAX_BODY_BYTES", 1024 * 1024, 1024, 64 << 20),
    grace_seconds=number("MCP_PROXY_MCP_GRACE_SECONDS", 5.0, 0.0),
)
