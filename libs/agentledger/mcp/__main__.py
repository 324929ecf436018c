"""``python -m agentledger.mcp``: the MCP server, configured from ``AGENTLEDGER_MCP_*`` only."""

from __future__ import annotations

import asyncio

from agentledger import settings
from agentledger.mcp import server
from agentledger.mcp.settings import McpSettings

if __name__ == "__main__":
    # Never the packaged (demo) allowlist and policies by accident (issue 38): one line.
    settings.require_configuration("mcp", allowlist=True, policies=True)
    server.configure_logging()
    asyncio.run(server.serve(McpSettings.model_validate({})))
