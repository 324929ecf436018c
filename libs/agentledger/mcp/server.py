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
replicas need no sticky sessions; the SDK serves protocol ``2026-07-28`` per request
(``server/discover``, no ``initialize``) and the ``initialize`` handshake of ``2025-11-25``
and earlier on the same endpoint. Over HTTP the SDK's OAuth resource-server parts guard
``/mcp`` (``mcp.server.auth``: bearer middleware, Protected Resource Metadata route), with
:class:`Challenge` adding the ``scope`` to every challenge.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import logging
import sys
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

import httpx
import mcp_types as types
import uvicorn
from mcp.server import Server, ServerRequestContext
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend, RequireAuthMiddleware
from mcp.server.auth.routes import build_resource_metadata_url, create_protected_resource_routes
from mcp.server.auth.settings import AuthSettings
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from pydantic import AnyHttpUrl
from starlette.applications import Starlette
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Send

from agentledger import client, identity
from agentledger.mcp import auth, calls, directory, oauth, results, runs, tasks, tools
from agentledger.mcp.settings import McpSettings
from agentledger.policy import allowlist as allowlist_mod
from agentledger.policy import cedar

log = logging.getLogger(__name__)

MCP_PATH: Final = "/mcp"

INSTRUCTIONS = (
    "Each agentledger tool PROPOSES an action; trusted services authorize it, may ask a "
    "person to approve it, and carry it out once. Read the answer's status: succeeded "
    "(with a receipt) is the only success. pending_approval and in_progress mean nothing is "
    "known to have happened yet: ask agentledger_status with the operation_id later. "
    "unknown means it may or may not have happened: never retry it under a new key. A "
    "retried call with the same input (or the same _meta['dev.agentledger/idempotency_key']) is "
    "the same operation and never acts twice."
)


def _version() -> str:
    try:
        return importlib.metadata.version("agentledger")
    except importlib.metadata.PackageNotFoundError:
        return "0"


def gate(settings: McpSettings, http: httpx.AsyncClient) -> auth.Gate:
    """The token gate ``settings`` describe; its directory opens in the server's lifespan.

    Raises:
        errors.IdentityRejected: ``session_keys`` holds no usable public key.
    """
    verifier = None
    if settings.oauth_issuer is not None:
        assert settings.resource_url is not None  # the settings require it
        verifier = oauth.Verifier(
            oauth.Jwks(http, issuer=settings.oauth_issuer, url=settings.oauth_jwks_url,
                       ttl_s=settings.oauth_jwks_ttl_s, refetch_s=settings.oauth_jwks_refetch_s),
            issuer=settings.oauth_issuer, resource=settings.resource_url,
            tenant_claim=settings.oauth_tenant_claim,
            principal_claim=settings.oauth_principal_claim, leeway_s=settings.oauth_leeway_s)
    exchange = None
    if settings.exchange_key is not None and settings.session_issuer is not None:
        exchange = auth.Exchange(settings.exchange_key.get_secret_value(), settings.exchange_kid,
                                 settings.session_issuer, settings.session_audience)
    return auth.Gate(
        directory=directory.Directory(), oauth_verifier=verifier,
        session_keys=(identity.KeySet.from_pem(settings.session_keys)
                      if settings.session_keys else None),
        session_issuer=settings.session_issuer, session_audience=settings.session_audience,
        exchange=exchange, scopes=settings.oauth_scopes,
        stdio_token=settings.token.get_secret_value() if settings.token is not None else None)


def build(settings: McpSettings, authenticator: auth.Gate, *,
          allowlist: allowlist_mod.Allowlist | None = None,
          policy: cedar.CedarPolicy | None = None,
          jwks_http: httpx.AsyncClient | None = None) -> Server[calls.Calls]:
    """The MCP server for ``settings`` (allowlist and policy: the configured ones by default).

    Raises:
        errors.ValidationFailed: The allowlist or the policies do not load.
        errors.ConfigurationError: An action's arguments use a name the tool input reserves.
    """
    catalog = tools.Catalog(allowlist or allowlist_mod.Allowlist.load(),
                            policy or cedar.CedarPolicy(), results.OUTPUT_SCHEMA)

    @contextlib.asynccontextmanager
    async def lifespan(_: Server[calls.Calls]) -> AsyncIterator[calls.Calls]:
        await authenticator.directory.open(settings.database_url, role=settings.db_role,
                                           size=settings.pool_size)
        try:
            async with httpx.AsyncClient(base_url=settings.ingress_url,
                                         timeout=client.HTTP_TIMEOUT_S) as http:
                yield calls.Calls(
                    catalog=catalog, http=http, kafka_bootstrap=settings.kafka_bootstrap,
                    admissions_topic=settings.admissions_topic,
                    outcomes_topic=settings.outcomes_topic, console_url=settings.console_url,
                    wait_s=settings.wait_s, remembered=settings.remembered_operations,
                    directory=authenticator.directory)
        finally:
            await authenticator.directory.close()
            if jwks_http is not None:
                await jwks_http.aclose()

    async def list_tools(ctx: ServerRequestContext[calls.Calls, Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        caller = await authenticator.caller(ctx.request)
        return types.ListToolsResult(tools=catalog.tools(caller.session))

    async def call_tool(ctx: ServerRequestContext[calls.Calls, Any],
                        params: types.CallToolRequestParams
                        ) -> types.CallToolResult | dict[str, Any]:
        caller = await authenticator.caller(ctx.request)
        tool_input = params.arguments or {}
        if params.name == tools.STATUS_TOOL:
            answer = await ctx.lifespan_context.status(caller, tool_input)
        elif params.name == tools.OPEN_RUN_TOOL:
            answer = runs.opened(tool_input)
        else:
            answer = await ctx.lifespan_context.call(
                caller, params.name, tool_input, params.meta,
                session_run=runs.session_run(ctx.request, settings.run))
            if (answer.status == "pending_approval" and answer.operation_id is not None
                    and tasks.declared(ctx)):
                # The task is the ledger's record: read it back, so a tasks/get for this id
                # resolves before the CreateTaskResult is sent (the extension's MUST).
                known = await authenticator.directory.operation(caller.session.tenant_id,
                                                                answer.operation_id)
                if known is not None and known.approval_state == "pending":
                    log.info("event=mcp_task_created operation_id=%s", answer.operation_id)
                    return tasks.created(answer.operation_id, known)
        return answer.to_result()

    async def followed(ctx: ServerRequestContext[calls.Calls, Any], params: tasks.TaskParams
                       ) -> tuple[uuid.UUID, directory.Known]:
        tasks.require_declared(ctx)
        caller = await authenticator.caller(ctx.request)
        operation_id = tasks.task_id(params)
        known = await authenticator.directory.operation(caller.session.tenant_id, operation_id)
        if known is None or not directory.may_follow(caller.session, known):
            raise MCPError(types.INVALID_PARAMS, "unknown taskId")
        return operation_id, known

    async def get_task(ctx: ServerRequestContext[calls.Calls, Any], params: tasks.TaskParams
                       ) -> dict[str, Any]:
        operation_id, known = await followed(ctx, params)
        return tasks.detailed(operation_id, known, settings.console_url)

    async def acknowledge(ctx: ServerRequestContext[calls.Calls, Any],
                          params: tasks.TaskParams) -> dict[str, Any]:
        # tasks/update and tasks/cancel: the person decides in the console, and an
        # approval is decided or expires; nothing the client sends changes the operation.
        await followed(ctx, params)
        return {"resultType": "complete"}

    server = Server(
        "agentledger", version=_version(), title="agentledger",
        description="Propose allowlisted actions through agentledger's ledger and policy.",
        instructions=INSTRUCTIONS, lifespan=lifespan, on_list_tools=list_tools,
        # Header validation of modern clients asks for a schema by name, before any caller
        # is known; schemas are the same for everyone (only the listing is filtered).
        get_tool_input_schema=catalog.input_schema_of)
    # Registered as a request handler, as the SDK's extension interceptors are: a call may
    # answer a CreateTaskResult (tasks extension) besides a CallToolResult.
    server.add_request_handler("tools/call", types.CallToolRequestParams, call_tool)
    server.add_request_handler("tasks/get", tasks.TaskParams, get_task)
    server.add_request_handler("tasks/update", tasks.UpdateParams, acknowledge)
    server.add_request_handler("tasks/cancel", tasks.TaskParams, acknowledge)
    server.extensions[tasks.EXTENSION] = {}
    return server


class Challenge(RequireAuthMiddleware):
    """The SDK's ``RequireAuthMiddleware`` (401 without a valid token, 403
    ``insufficient_scope`` without the scopes), whose ``WWW-Authenticate`` also names the
    ``scope`` a client should ask for (MCP authorization: scope selection from the
    challenge)."""

    async def _send_auth_error(self, send: Send, status_code: int, error: str,
                               description: str) -> None:
        parts = [f'error="{error}"', f'error_description="{description}"']
        if self.resource_metadata_url:
            parts.append(f'resource_metadata="{self.resource_metadata_url}"')
        if self.required_scopes:
            parts.append(f'scope="{" ".join(self.required_scopes)}"')
        body = json.dumps({"error": error, "error_description": description}).encode()
        await send({"type": "http.response.start", "status": status_code,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", f"Bearer {', '.join(parts)}".encode())]})
        await send({"type": "http.response.body", "body": body})


def http_app(server: Server[calls.Calls], settings: McpSettings,
             authenticator: auth.Gate) -> Starlette:
    """The streamable HTTP app: ``POST /mcp`` behind the bearer middleware, the Protected
    Resource Metadata (RFC 9728) when an authorization server is configured, and
    ``GET /healthz``."""
    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    app = server.streamable_http_app(
        stateless_http=True, json_response=True, host=settings.host,
        custom_starlette_routes=[Route("/healthz", healthz, methods=["GET"])])
    metadata_url = (build_resource_metadata_url(AnyHttpUrl(settings.resource_url))
                    if settings.resource_url is not None else None)
    for index, route in enumerate(app.router.routes):
        if isinstance(route, Route) and route.path == MCP_PATH:
            app.router.routes[index] = Route(MCP_PATH, endpoint=Challenge(
                route.endpoint, list(settings.oauth_scopes), metadata_url))
    if settings.resource_url is not None and settings.oauth_issuer is not None:
        # The SDK's settings model keeps a path-less issuer exactly as configured (RFC 8414
        # compares issuers as strings: no trailing slash added).
        urls = AuthSettings(issuer_url=settings.oauth_issuer,
                            resource_server_url=settings.resource_url,
                            validate_token_resource=False)
        assert urls.resource_server_url is not None
        app.router.routes.extend(create_protected_resource_routes(
            resource_url=urls.resource_server_url, authorization_servers=[urls.issuer_url],
            scopes_supported=list(settings.oauth_scopes), resource_name="agentledger"))
    app.add_middleware(AuthContextMiddleware)
    app.add_middleware(AuthenticationMiddleware, backend=BearerAuthBackend(authenticator))
    return app


async def serve(settings: McpSettings) -> None:
    """Serve on the configured transport until stdin closes (stdio) or a signal (HTTP)."""
    jwks_http = httpx.AsyncClient(timeout=oauth.FETCH_TIMEOUT_S)
    authenticator = gate(settings, jwks_http)
    server = build(settings, authenticator, jwks_http=jwks_http)
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(
        max_workers=settings.wait_threads, thread_name_prefix="agentledger-mcp-wait"))
    if settings.transport == "stdio":
        log.info("event=mcp_ready transport=stdio")
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
        return
    log.info("event=mcp_ready transport=http host=%s port=%s", settings.host, settings.port)
    # Access logs carry query strings and are unstructured; handlers log events instead.
    config = uvicorn.Config(http_app(server, settings, authenticator), host=settings.host,
                            port=settings.port, log_config=None, access_log=False,
                            lifespan="on")
    await uvicorn.Server(config).serve()


def configure_logging() -> None:
    """Logs to stderr only: on stdio, stdout is the protocol."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # httpx logs every request line at INFO; the handlers log one event per call instead.
    logging.getLogger("httpx").setLevel(logging.WARNING)
