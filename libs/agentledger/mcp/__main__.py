"""``python -m agentledger.mcp``: the MCP server, configured from ``AGENTLEDGER_MCP_*`` only."""

from __future__ import annotations

import asyncio

from agentledger.mcp import server
from agentledger.mcp.settings import McpSettings

if __name__ == "__main__":
    server.configure_logging()
    asyncio.run(server.serve(McpSettings.model_validate({})))
