"""Wiring of the MCP server: the SDK's low-level ``Server``, its handlers, two transports.

- ``tools/list``: the actions the caller's roles may propose under the current policy, and
  the status tool (:mod:`agentledger.mcp.tools`);
- ``tools/call``: a proposal through ingress, answered with what is known
  (:mod:`agentledger.mcp.calls`, :mod:`agentledger.mcp.results`), a step of the run the call
  or its session names (:mod:`agentledger.mcp.runs`);
- every request is authenticated first (:mod:`agentledger.mcp.auth`).

The low-level server, not ``MCPServer``: the tool list differs per caller, and the schemas
are the allowlist's, not derived from Python signatures. Streamable HTTP runs stateless
(each request carries its bearer token, and the server keeps nothing per MCP session), so
replicas need no sticky sessions. MCP Tasks are not offered: this SDK serves no
``tasks/*`` methods, so a pending call is followed with the status tool.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
import sys
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import mcp_types as types
import uvicorn
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentledger import client, identity
from agentledger.mcp import auth, calls, runs, tools
from agentledger.mcp.settings import McpSettings
from agentledger.policy import allowlist as allowlist_mod
from agentledger.policy import cedar

log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "Each agentledger tool PROPOSES an action; trusted services authorize it, may ask a "
    "person to approve it, and carry it out once. Read the answer's status: succeeded "
    "(with a receipt) is the only success. pending_approval and in_progress mean nothing is "
    "known to have happened yet: ask agentledger_status with the operation_id later. "
    "unknown means it may or may not have happened: never retry it under a new key. A "
    "retried call with the same input (or the same _meta['agentledger/idempotency_key']) is "
    "the same operation and never acts twice."
)


def _version() -> str:
    try:
        return importlib.metadata.version("agentledger")
    except importlib.metadata.PackageNotFoundError:
        return "0"


def build(settings: McpSettings, *, allowlist: allowlist_mod.Allowlist | None = None,
          policy: cedar.CedarPolicy | None = None) -> Server[calls.Calls]:
    """The MCP server for ``settings`` (allowlist and policy: the configured ones by default).

    Raises:
        errors.ValidationFailed: The allowlist or the policies do not load.
        errors.ConfigurationError: An action's arguments use a name the tool input reserves.
        errors.IdentityRejected: ``session_keys`` holds no usable public key.
    """
    catalog = tools.Catalog(allowlist or allowlist_mod.Allowlist.load(),
                            policy or cedar.CedarPolicy())
    authenticator = auth.Authenticator(
        identity.KeySet.from_pem(settings.session_keys), settings.session_issuer,
        settings.session_audience,
        settings.token.get_secret_value() if settings.token is not None else None)

    @contextlib.asynccontextmanager
    async def lifespan(_: Server[calls.Calls]) -> AsyncIterator[calls.Calls]:
        async with httpx.AsyncClient(base_url=settings.ingress_url,
                                     timeout=client.HTTP_TIMEOUT_S) as http:
            yield calls.Calls(
                catalog=catalog, http=http, kafka_bootstrap=settings.kafka_bootstrap,
                admissions_topic=settings.admissions_topic,
                outcomes_topic=settings.outcomes_topic, console_url=settings.console_url,
                wait_s=settings.wait_s, remembered=settings.remembered_operations)

    async def list_tools(ctx: ServerRequestContext[calls.Calls, Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        caller = authenticator.caller(ctx.request)
        return types.ListToolsResult(tools=catalog.tools(caller.session))

    async def call_tool(ctx: ServerRequestContext[calls.Calls, Any],
                        params: types.CallToolRequestParams) -> types.CallToolResult:
        caller = authenticator.caller(ctx.request)
        tool_input = params.arguments or {}
        if params.name == tools.STATUS_TOOL:
            answer = await ctx.lifespan_context.status(caller, tool_input)
        else:
            answer = await ctx.lifespan_context.call(
                caller, params.name, tool_input, params.meta,
                session_run=runs.session_run(ctx.request, settings.run))
        return answer.to_result()

    return Server(
        "agentledger", version=_version(), title="agentledger",
        description="Propose allowlisted actions through agentledger's ledger and policy.",
        instructions=INSTRUCTIONS, lifespan=lifespan, on_list_tools=list_tools,
        on_call_tool=call_tool,
        # Header validation of modern clients asks for a schema by name, before any caller
        # is known; schemas are the same for everyone (only the listing is filtered).
        get_tool_input_schema=catalog.input_schema_of)


def http_app(server: Server[calls.Calls], settings: McpSettings) -> Starlette:
    """The streamable HTTP app: ``POST /mcp`` and ``GET /healthz``."""
    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return server.streamable_http_app(
        stateless_http=True, json_response=True, host=settings.host,
        custom_starlette_routes=[Route("/healthz", healthz, methods=["GET"])])


async def serve(settings: McpSettings) -> None:
    """Serve on the configured transport until stdin closes (stdio) or a signal (HTTP)."""
    server = build(settings)
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(
        max_workers=settings.wait_threads, thread_name_prefix="agentledger-mcp-wait"))
    if settings.transport == "stdio":
        log.info("event=mcp_ready transport=stdio")
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
        return
    log.info("event=mcp_ready transport=http host=%s port=%s", settings.host, settings.port)
    # Access logs carry query strings and are unstructured; handlers log events instead.
    config = uvicorn.Config(http_app(server, settings), host=settings.host, port=settings.port,
                            log_config=None, access_log=False, lifespan="on")
    await uvicorn.Server(config).serve()


def configure_logging() -> None:
    """Logs to stderr only: on stdio, stdout is the protocol."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # httpx logs every request line at INFO; the handlers log one event per call instead.
    logging.getLogger("httpx").setLevel(logging.WARNING)
