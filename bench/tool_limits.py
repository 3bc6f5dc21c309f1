"""Settings every benchmark mesh runs with.

ToolsProxy's rate limits (calls and result tokens per tenant and per tenant:document, in a
one-minute window; 0 switches a limit off) are right for production and wrong for a benchmark:
a benchmark reads the same documents far more often than a user would, and a refused tool call
would be counted as the answer's or the latency's fault. Every benchmark switches them off.
"""

NO_TOOL_RATE_LIMITS: dict[str, str] = {
    "MCP_PROXY_RATE_LIMIT_CALLS_PER_MIN": "0",
    "MCP_PROXY_RATE_LIMIT_TOKENS_PER_MIN": "0",
    "MCP_PROXY_RATE_LIMIT_TENANT_CALLS_PER_MIN": "0",
    "MCP_PROXY_RATE_LIMIT_TENANT_TOKENS_PER_MIN": "0",
}
