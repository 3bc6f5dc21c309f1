"""ToolsProxyService settings (MCP_PROXY_*): each variable declared once, read here only."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.settings import (
    DownstreamSettings,
    Env,
    Fields,
    ServerSettings,
    SettingsError,
    downstream,
    flag,
    integer,
    retry_attempts,
    secret,
    text,
)
from services.common.shared_config import (
    PROXY_MAX_FULL_TEXT_BYTES,
    proxy_full_documents,
    proxy_full_text_bytes,
    proxy_max_window_radius,
)
from services.docstore.config import DocstoreSettings, check_store_path, docstore_settings
from services.toolsproxy.cbr import CbrSettings
from services.toolsproxy.mcp_server import McpSettings
from services.toolsproxy.ratelimit import RateLimits
from services.toolsproxy.tavily import TavilySettings
from services.toolsproxy.tools import ToolLimits

RESULT_ENVELOPE_BYTES = 1 << 20
"""Room one tool result takes beside the texts its limits count (MCP_PROXY_MAX_TEXT_BYTES,
MCP_PROXY_MAX_FULL_TEXT_BYTES): ids, titles, section lists, pages, the delimiters around each
text and protobuf's Struct encoding. Measured on the samples: 1.1 KB for a whole read of five
documents, 7.6 KB for a search of 20 hits; estimated, a metadata read of 500 sections or a
whole read of 50 documents with 128-character ids and long titles takes 100-400 KB. The
largest whole read (3 MiB of text) and it make the default message limit (4 MiB)."""


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
        server = ServerSettings.for_service("toolsproxy", env)
        limits = LIMITS.read(
            env,
            max_window_radius=proxy_max_window_radius(env),
            max_full_text_bytes=proxy_full_text_bytes(env),
            max_full_documents=proxy_full_documents(env),
        )
        check_message_room(server.max_message_bytes, limits)
        docstore = docstore_settings(env, "MCP_PROXY_")
        check_store_path(env, docstore)  # made or opened at start
        return cls(
            server=server,
            limits=limits,
            rate_limits=RATE_LIMITS.read(env),
            docstore=docstore,
            retrieval=RETRIEVAL.read(env, retry_attempts("MCP_PROXY_")),
            cbr=cbr_settings(env),
            tavily=tavily_settings(env),
            mcp=mcp_settings(env),
        )


def check_message_room(max_message_bytes: int, limits: ToolLimits) -> None:
    """SettingsError naming both settings when MCP_PROXY_MAX_MESSAGE_BYTES (also the send limit
    of ToolsProxy's replies) cannot hold its largest result: the larger of its two text limits
    plus RESULT_ENVELOPE_BYTES. Such a result would fail with RESOURCE_EXHAUSTED."""
    text, name = max(
        (limits.max_full_text_bytes, PROXY_MAX_FULL_TEXT_BYTES.name),
        (limits.max_text_bytes, LIMITS.vars["max_text_bytes"].name),
    )
    if max_message_bytes < text + RESULT_ENVELOPE_BYTES:
        raise SettingsError(
            f"MCP_PROXY_MAX_MESSAGE_BYTES={max_message_bytes} cannot hold a result of "
            f"{name}={text} bytes of text and its envelope ({RESULT_ENVELOPE_BYTES}): "
            f"raise it to at least {text + RESULT_ENVELOPE_BYTES}, or lower {name}"
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
    hosts = tuple(h.strip() for h in values.pop("allowed_hosts").split(",") if h.strip())
    for host in hosts:
        if any(c.isspace() for c in host):
            raise SettingsError(
                f"MCP_PROXY_MCP_ALLOWED_HOSTS: {host!r} holds white space; the hosts are "
                "separated by commas (gw.example.com:*, localhost:*)"
            )
    return McpSettings(**values, allowed_hosts=hosts)


RETRIEVAL = downstream(
    "MCP_PROXY_RETRIEVAL_URL", "MCP_PROXY_RETRIEVAL_TIMEOUT_SECONDS", 5.0, "retrieval",
    doc="RetrievalService for the search tools: host:port or a grpc:// / http:// URL.",
)  # fmt: skip
LIMITS = Fields(
    ToolLimits,
    max_text_bytes=integer("MCP_PROXY_MAX_TEXT_BYTES", minimum=256, maximum=1 << 20),
    max_pages_per_call=integer("MCP_PROXY_MAX_PAGES_PER_CALL", minimum=1, maximum=100),
)
RATE_LIMITS = Fields(
    RateLimits,
    calls_per_minute=integer("MCP_PROXY_RATE_LIMIT_CALLS_PER_MIN", minimum=0, maximum=1_000_000),
    tokens_per_minute=integer("MCP_PROXY_RATE_LIMIT_TOKENS_PER_MIN", minimum=0),
    tenant_calls_per_minute=integer(
        "MCP_PROXY_RATE_LIMIT_TENANT_CALLS_PER_MIN", minimum=0, maximum=1_000_000
    ),
    tenant_tokens_per_minute=integer("MCP_PROXY_RATE_LIMIT_TENANT_TOKENS_PER_MIN", minimum=0),
)
# Timeouts, retries, breakers, caches and response limits of the Bank of Russia and Tavily
# clients and the MCP endpoint's transport are the defaults of CbrSettings, TavilySettings and
# McpSettings (cbr.py, tavily.py, mcp_server.py), not read from the environment.
CBR = Fields(
    CbrSettings,
    url=text("MCP_PROXY_CBR_URL"),
    demo=flag("MCP_PROXY_CBR_DEMO"),
)
TAVILY = Fields(
    TavilySettings,
    api_key=secret("MCP_PROXY_TAVILY_API_KEY"),
    base_url=text("MCP_PROXY_TAVILY_URL"),
)
MCP = Fields(
    McpSettings,
    enabled=flag("MCP_PROXY_MCP_ENABLED"),
    host=text("MCP_PROXY_MCP_HOST"),
    port=integer("MCP_PROXY_MCP_PORT", minimum=0, maximum=65535),
    token=text("MCP_PROXY_MCP_TOKEN"),
    allowed_hosts=text("MCP_PROXY_MCP_ALLOWED_HOSTS", ""),
)
