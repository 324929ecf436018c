"""``agentledger mcp``: serve agentledger's allowlisted actions to MCP clients."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from pydantic import ValidationError

from agentledger import errors, settings
from agentledger.mcp import server
from agentledger.mcp.settings import McpSettings


def mcp(
    transport: Annotated[str | None, typer.Option(
        help="stdio (one agent, token from AGENTLEDGER_MCP_TOKEN) or http (streamable HTTP, "
             "bearer token per request); default AGENTLEDGER_MCP_TRANSPORT, else stdio")] = None,
    host: Annotated[str | None, typer.Option(
        help="HTTP: the address to listen on (default AGENTLEDGER_MCP_HOST, else 127.0.0.1)"
    )] = None,
    port: Annotated[int | None, typer.Option(
        help="HTTP: the port (default AGENTLEDGER_MCP_PORT, else 8060)")] = None,
) -> None:
    """Serve the allowlisted actions as MCP tools; every call is a proposal through ingress.

    Everything else comes from AGENTLEDGER_MCP_* (docs/mcp.md): ingress URL, session keys,
    topics, console URL, the wait bound.
    """
    # Never the packaged (demo) allowlist and policies by accident (issue 38): one line.
    settings.require_configuration("mcp", allowlist=True, policies=True)
    overrides: dict[str, str | int] = {}
    if transport is not None:
        overrides["transport"] = transport
    if host is not None:
        overrides["host"] = host
    if port is not None:
        overrides["port"] = port
    try:
        # Options given win over the environment (init values beat env in pydantic-settings).
        configured = McpSettings.model_validate(overrides)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                             for e in exc.errors())
        typer.echo(f"agentledger mcp: configuration invalid: {problems}", err=True)
        raise typer.Exit(2) from exc
    server.configure_logging()
    try:
        asyncio.run(server.serve(configured))
    except errors.AgentLedgerError as exc:
        typer.echo(f"agentledger mcp: {exc.code}: {exc.message}", err=True)
        raise typer.Exit(2) from exc

