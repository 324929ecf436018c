"""An MCP server in front of agentledger: allowlisted actions as tools, each call a proposal.

``agentledger mcp`` (or ``python -m agentledger.mcp``) serves it over stdio or streamable
HTTP; docs/mcp.md shows how to point an MCP client at it. Rooms: ``settings`` (what is
configured), ``auth`` (who calls), ``tools`` (what the caller sees), ``idempotency`` (which
operation a call is), ``runs`` (which run it is a step of), ``calls`` (proposal and
bounded wait), ``results`` (what the answer says), ``server`` (the SDK wiring and
transports).
"""

from agentledger.mcp.idempotency import META_KEY
from agentledger.mcp.results import Answer
from agentledger.mcp.runs import META_RUN
from agentledger.mcp.settings import McpSettings
from agentledger.mcp.tools import STATUS_TOOL

__all__ = ["META_KEY", "META_RUN", "STATUS_TOOL", "Answer", "McpSettings"]
