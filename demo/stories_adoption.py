"""The adoption stories: your own connector (e-mail, from a distribution outside the library)
and an MCP client, on the same running demo.

As in :mod:`demo.scenarios`, every fact printed is read after the step from the
LEDGER, the CRM's effect log, Mailpit's API or the SMTP fault proxy, never taken from what a
client was told. Operation ids land in ``World.operations`` for the test to check.
"""

from __future__ import annotations

import asyncio
import re
import urllib.parse
import uuid
from datetime import UTC, datetime
from typing import Any, cast

import httpx
import httpx2
from agentledger_email import deployment_domain
from agentledger_email import message_id as email_message_id
from mcp import Client
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, RequestParamsMeta, TextContent
from rich.console import Console
from rich.markup import escape

from agentledger import client as gateway
from agentledger.connectors import conformance, plugins
from agentledger.mcp import idempotency
from agentledger.testing import keycloak
from demo.adoption import DEPLOYMENT_ID, EMAIL_DOMAINS, HTTP_ACTION, http_declaration
from demo.launch import World, seed_realm
from demo.scenarios import OUTCOME_TIMEOUT_S, Story

# What ends a command; the lost e-mail passes through `unknown` on its way to one of these.
FINAL = ("succeeded", "failed", "denied", "expired", "review_required")
# The MCP story's key: what a client would send to tie the call to its own id (a ticket).
MCP_KEY = "ticket-8812-note"
MCP_CALLS = 3


def message_id(operation_id: uuid.UUID | str) -> str:
    """The Message-ID the e-mail connector gives a command's message: its operation id, in
    the demo deployment's own domain."""
    return email_message_id(uuid.UUID(str(operation_id)), deployment_domain(DEPLOYMENT_ID))


async def mailpit_messages(world: World, operation_id: uuid.UUID | str) -> list[dict[str, Any]]:
    """The messages Mailpit holds with this command's Message-ID, from its search API."""
    query = urllib.parse.urlencode({"query": f"message-id:{message_id(operation_id)}"})
    async with httpx.AsyncClient(timeout=10) as http:
        found = (await http.get(f"{world.mailpit_url}/api/v1/search?{query}")
                 ).raise_for_status().json()
    return list(found["messages"])


async def smtp_fault(world: World, arm: bool = False) -> dict[str, Any]:
    """The SMTP fault proxy's state (``armed``, ``dropped``); arms it first if asked."""
    async with httpx.AsyncClient(base_url=world.smtp_fault_url, timeout=10) as http:
        answer = await (http.post("/arm") if arm else http.get("/healthz"))
    state: dict[str, Any] = answer.raise_for_status().json()
    return state


def _held(messages: list[dict[str, Any]]) -> str:
    if not messages:
        return "no message"
    m = messages[0]
    to = ", ".join(str(t["Address"]) for t in m.get("To", []))
    return f"To {to}, Subject {escape(repr(m.get('Subject')))}"


async def _audit_types(s: Story, op: uuid.UUID) -> list[str]:
    return [r["type"] for r in await s.rows(
        "SELECT type FROM audit_event WHERE operation_id = $1 ORDER BY seq", op)]


async def email_connector(s: Story) -> None:
    s.out.rule("[bold]6 · Your own connector: e-mail, from a distribution outside the library")
    w = s.world
    point = plugins.installed().get("email")
    dist = point.dist if point is not None else None
    where = f"{dist.name} {dist.version}" if dist is not None else "an unnamed distribution"
    s.say("A connector is a plugin. agentledger-email lives outside the library, the way yours "
          "would; bootstrap installed it into .venv, and every service found it by its entry "
          "point [bold]email[/bold]. The operator's configuration names it in "
          "AGENTLEDGER_CONNECTORS (SMTP host, sender, search API, recipient domains "
          f"{', '.join(EMAIL_DOMAINS)}) and adds its allowlist entry and policy "
          "(30_email.cedar) to the packaged ones; an executor of its own sends to Mailpit, a "
          f"real SMTP server (web UI {w.mailpit_url}).")
    s.fact(f"entry points 'email' in agentledger.connectors and agentledger.resolvers: {where}"
           f" ({point.value if point is not None else 'missing'})")
    s.say("alice's gateway proposes [bold]email.send[/bold] to ada@example.com (the proposal's "
          "target is the recipient; admission's resolver is the connector's own)")
    gw = s.gateway()
    try:
        since = datetime.now(UTC)
        sent = await gw.submit_proposal("email.send", {
            "subject": "Your invoices, by e-mail from now on",
            "body": "Dear Ada, as you asked, your invoices will come by e-mail."},
            "ada@example.com")
        w.operations["email"] = str(sent.operation_id)
        found = await gw.await_outcome(sent, since=since, timeout_s=OUTCOME_TIMEOUT_S)
        row = await s.command(sent.operation_id)
        held = await mailpit_messages(w, sent.operation_id)
        s.fact(f"admission: {found.admission and found.admission.status}; ledger: [bold]"
               f"{row and row['state']}[/bold] receipt={row and row['provider_receipt']}")
        s.fact(f"attempts: {await s.attempts(sent.operation_id)}")
        s.fact(f"Mailpit holds [bold]{len(held)}[/bold] message with Message-ID "
               f"<{message_id(sent.operation_id)}> — the operation id: {_held(held)}")

        await smtp_fault(w, arm=True)
        s.say("Now the SMTP path to Mailpit is armed to lose the server's answer to the next "
              "accepted message (250 after DATA). SMTP has no idempotency key (contract "
              "[bold]none[/bold]): a resend could send it twice, so the executor never resends. "
              "The connector declares a [bold]lookup[/bold]: Mailpit's search by Message-ID.")
        lost = await gw.submit_proposal("email.send", {
            "subject": "Your refund of 49.00 EUR",
            "body": "Dear Ada, your refund for invoice inv-1001 is on its way."},
            "ada@example.com")
        op = lost.operation_id
        w.operations["email_lost"] = str(op)
    finally:
        await gw.aclose()

    async def settled() -> dict[str, Any] | None:
        row = await s.command(op)
        return row if row and row["state"] in FINAL else None

    row = await s.until(settled)
    if not row:
        raise RuntimeError(f"the lost e-mail {op} did not settle in time "
                           f"(state {(await s.command(op) or {}).get('state')})")
    fault = await smtp_fault(w)
    types = await _audit_types(s, op)
    held = await mailpit_messages(w, op)
    s.fact(f"the proxy dropped {fault['dropped']} answer after Mailpit accepted the message")
    s.fact(f"attempts: {await s.attempts(op)}")
    s.fact("audit: " + " → ".join(types))
    s.fact(f"ledger: [bold]{row['state']}[/bold] receipt={row['provider_receipt']}: the "
           "executor recorded [bold]unknown[/bold], the reconciler's lookup found the message")
    s.fact(f"Mailpit holds exactly [bold]{len(held)}[/bold] message with Message-ID "
           f"<{message_id(op)}>: {_held(held)}")


def _text(result: CallToolResult) -> str:
    return " ".join(c.text for c in result.content[:1] if isinstance(c, TextContent))


def _answer(result: CallToolResult) -> dict[str, Any]:
    if not isinstance(result.structured_content, dict):
        raise RuntimeError(f"the MCP server answered without structured content: {result}")
    return result.structured_content


async def _unauthorized(w: World) -> tuple[int, str, list[str]]:
    """What a caller without a token gets (status, resource_metadata of its challenge), and
    the authorization servers that metadata names."""
    async with httpx.AsyncClient(timeout=10) as http:
        answer = await http.post(w.mcp_url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                                 headers={"Accept": "application/json, text/event-stream"})
        challenge = answer.headers.get("www-authenticate", "")
        found = re.search(r'resource_metadata="([^"]+)"', challenge)
        servers: list[str] = []
        if found:
            metadata = (await http.get(found.group(1))).raise_for_status().json()
            servers = [str(s) for s in metadata.get("authorization_servers", [])]
    return answer.status_code, found.group(1) if found else "", servers


async def mcp_client(s: Story) -> None:
    s.out.rule("[bold]7 · An MCP client: the allowlisted actions as tools")
    w = s.world
    token = w.tokens["user:alice"]
    agent = w.mcp_agent
    s.say(f"[bold]agentledger mcp[/bold] serves the allowlisted actions as MCP tools at "
          f"{w.mcp_url} (streamable HTTP), an OAuth 2.1 resource server with Keycloak as its "
          "authorization server. Each call is a proposal through ingress: admission, policy "
          "and the executor decide as before. An MCP client (the official mcp SDK's) connects "
          f"with no token, as agent {agent['client_id']} (Keycloak's client for user:alice).")
    # Keycloak has booted while the stories above played; its realm is created now.
    await asyncio.to_thread(seed_realm, w)
    status, metadata_url, servers = await _unauthorized(w)
    s.fact(f"without a token: HTTP {status}, its challenge names {metadata_url}, which names "
           f"the authorization server {', '.join(servers) or '(none)'}")
    storage = keycloak.MemoryTokens()
    provider = ClientCredentialsOAuthProvider(
        server_url=w.mcp_url, storage=storage, client_id=agent["client_id"],
        client_secret=agent["client_secret"], issuer=w.oauth_issuer, scope=agent["scope"])
    arguments = {"customer_id": "c-1001", "body": "Ada prefers a call after 17:00",
                 "target": "c-1001"}
    # An open map in the SDK's types; the key is agentledger's (docs/mcp.md).
    meta = cast(RequestParamsMeta, {idempotency.META_KEY: MCP_KEY})
    answers: list[dict[str, Any]] = []
    first_text = ""
    async with httpx2.AsyncClient(auth=provider, timeout=httpx2.Timeout(30, read=120)) as http, \
            Client(streamable_http_client(w.mcp_url, http_client=http)) as mcp:
        granted = storage.tokens
        s.fact("the SDK's client-credentials provider followed that 401 to Keycloak and got "
               f"an access token (scope {granted and granted.scope}, "
               f"{granted and granted.expires_in} s): the MCP server verified it and signs "
               "ingress' session for user:alice itself")
        tools = sorted(t.name for t in (await mcp.list_tools()).tools)
        s.fact(f"tools/list for user:alice (role user): {', '.join(tools)}")
        s.say(f"It calls [bold]crm.note.create[/bold] for c-1001 with _meta "
              f"{idempotency.META_KEY}={MCP_KEY}, then twice more with the same key and input: "
              "a client retrying after answers it did not get")
        for n in range(MCP_CALLS):
            result = await mcp.call_tool("crm.note.create", arguments, meta=meta)
            answers.append(_answer(result))
            if n == 0:
                first_text = _text(result)
    op = str(gateway.operation_id_for(token, MCP_KEY))
    w.operations["mcp"] = {"key": MCP_KEY, "operation": op, "tools": tools,
                           "answers": [a.get("operation_id") for a in answers]}
    ids = sorted({str(a.get("operation_id")) for a in answers})
    s.fact(f"the tool result's text: [italic]{escape(first_text)}[/italic]")
    s.fact(f"{len(answers)} calls, statuses {', '.join(str(a['status']) for a in answers)}; "
           f"[bold]{len(ids)}[/bold] operation id {', '.join(ids)} (= the id ingress derives "
           f"from alice's tenant, principal and key: {op})")
    row = await s.command(uuid.UUID(op))
    notes = [e for e in await s.effects("note.created") if e["idempotency_key"] == op]
    commands = await s.rows("SELECT count(*) AS n FROM agent_command WHERE operation_id = $1",
                            uuid.UUID(op))
    s.fact(f"ledger: {commands[0]['n']} command, [bold]{row and row['state']}[/bold] "
           f"receipt={row and row['provider_receipt']}; CRM effect log: [bold]{len(notes)}"
           f"[/bold] note.created under idempotency key {op}")


async def declared_api(s: Story) -> None:
    s.out.rule("[bold]8 · A REST API declared, not coded: the HTTP connector")
    w = s.world
    declared = http_declaration(w.crm_url)
    s.say("Most REST APIs with an Idempotency-Key need no code at all. agentledger-http (another "
          "distribution outside the library) reads a declaration: a request per action, the "
          "key header, If-Match, a lookup URL and which statuses mean what. Here the CRM's "
          "note API is declared as connector [bold]crmhttp[/bold], with an executor of its own.")
    s.fact(f"declared: contract {declared.get('contract')}; action crmhttp.note.create = "
           f"POST {declared.get('actions', {}).get(HTTP_ACTION, {}).get('path')}; lookup "
           f"{declared.get('lookup', {}).get('path')}")
    s.say("First the conformance kit checks the declaration against the real API, as "
          "[bold]agentledger connector test[/bold] would (it writes in Acme's tenant):")
    made = plugins.make("crmhttp", declared)
    try:
        found = await conformance.check(conformance.Endpoint(
            connector=made, tenant_id=w.tenant, write_token=w.acme["crm_tokens"]["write"],
            lookup_token=w.acme["crm_tokens"]["lookup"],
            sample=conformance.Sample(HTTP_ACTION, "c-1001", {"customer_id": "c-1001",
                                                              "body": "conformance check"}),
            stale_revision="999",
            # The same declaration against the kit's hostile stand-ins (the `answers` claim).
            retarget=lambda t: plugins.make("crmhttp", plugins.retargeted(
                declared, http_url=t.http_url, smtp_host=t.smtp_host, smtp_port=t.smtp_port))))
    finally:
        await made.aclose()
    w.operations["conformance"] = {f.claim: f.holds for f in found}
    s.fact("; ".join(f"{f.claim} {'holds' if f.holds else 'FAILS' if f.holds is False else '—'}"
                     for f in found))
    s.say("alice's gateway proposes [bold]crmhttp.note.create[/bold]")
    gw = s.gateway()
    try:
        since = datetime.now(UTC)
        sent = await gw.submit_proposal(HTTP_ACTION, {"customer_id": "c-1001",
                                                      "body": "Declared, not coded"}, "c-1001")
        w.operations["declared"] = str(sent.operation_id)
        await gw.await_outcome(sent, since=since, timeout_s=OUTCOME_TIMEOUT_S)
    finally:
        await gw.aclose()
    op = sent.operation_id
    row = await s.command(op)
    by = await s.rows("SELECT connector FROM agent_command WHERE operation_id = $1", op)
    notes = [e for e in await s.effects("note.created") if e["idempotency_key"] == str(op)]
    s.fact(f"ledger: [bold]{row and row['state']}[/bold] receipt={row and row['provider_receipt']}"
           f" (connector {by[0]['connector'] if by else None}); attempts: "
           f"{await s.attempts(op)}; CRM effect log: [bold]{len(notes)}[/bold] note.created "
           "under its key")


STORIES = (email_connector, mcp_client, declared_api)


async def play(world: World, console: Console) -> None:
    """Play the adoption stories after the others; operation ids saved in ``world.operations``."""
    story = Story(world, console)
    for tell in STORIES:
        await tell(story)
        world.save()


__all__ = ["STORIES", "mailpit_messages", "message_id", "play"]
