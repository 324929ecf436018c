"""The MCP server as an OAuth 2.1 resource server (issue 40), with a real Keycloak.

Keycloak 26 (``deploy/local/keycloak.sh``; :mod:`agentledger.testing.keycloak`) on free
ports, a realm whose confidential clients stand for the pipeline's principals; the real
pipeline's services as processes; ``agentledger mcp`` over streamable HTTP with the issuer,
its canonical URI and an exchange key ingress trusts. The official ``mcp`` SDK's client
discovers the authorization server from the 401 (RFC 9728 metadata), gets a
client-credentials token from Keycloak and calls tools, at protocol ``2026-07-28`` and at
``2025-11-25``. Tokens the server must refuse — another audience, expired, an unknown key,
a missing scope, another tenant — are refused with the HTTP status the specification
names, and nothing reaches the ledger. A refund that needs a person is followed as a Task
(``io.modelcontextprotocol/tasks``) until the approvals console's API decides it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qsl, urlsplit

import asyncpg
import httpx2
import jwt
import mcp_types as types
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)
from playwright.async_api import async_playwright
from pydantic import AnyUrl

from agentledger import identity, logins
from agentledger.mcp import idempotency
from agentledger.testing import identities, keycloak, processes
from agentledger.testing.pipeline import Pipeline, pipeline
from agentledger.testing.polling import wait_until
from tests.e2e.test_mcp import _refunds
from tests.stack import Stack

WAIT_S = 20
SCOPE = keycloak.TOOLS_SCOPE
EXCHANGE_KID = "mcp-oauth-test"


# A person who signs in on Keycloak's login page (the authorization-code flow with PKCE), a
# principal of the directory that no agent client stands for.
PERSON, PERSON_PRINCIPAL, BROWSER_CLIENT = "carol", "user:carol", "mcp-browser"


@dataclass(frozen=True)
class World:
    p: Pipeline
    url: str  # the MCP endpoint = its canonical URI (the tokens' audience)
    realm: keycloak.Realm
    redirect_uri: str  # the public client's, on a loopback port the PKCE test listens on


@pytest.fixture(scope="module")
def kc() -> Iterator[keycloak.Keycloak]:
    with keycloak.running() as found:
        yield found


@pytest.fixture(scope="module")
def world(stack: Stack, database_url: str, make_database: Callable[[], str], kc: keycloak.Keycloak,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    logs = tmp_path_factory.mktemp("mcp-oauth")
    exchange_private, exchange_public = identity.generate_keypair("EdDSA")
    with pipeline(stack.kafka_bootstrap, database_url, make_database(), logs, ingress=True,
                  console=True, session_keys={EXCHANGE_KID: exchange_public}) as p:
        assert p.sessions is not None and p.ingress_url and p.console_url
        port = processes.free_port()
        url = f"http://127.0.0.1:{port}/mcp"
        redirect_uri = f"http://127.0.0.1:{processes.free_port()}/callback"
        asyncio.run(identities.put_principals(p.database_url, p.tenant,
                                              {PERSON_PRINCIPAL: ["user"]}))
        realm = kc.realm(f"agentledger-{uuid.uuid4().hex[:8]}", url, [
            keycloak.Agent("agent-alice", p.tenant, "user:alice", roles=["user"]),
            keycloak.Agent("agent-elsewhere", p.tenant, "user:alice", roles=["user"],
                           audience=f"http://127.0.0.1:{port}/other"),
            keycloak.Agent("agent-noscope", p.tenant, "user:alice", roles=["user"], scopes=()),
            keycloak.Agent("agent-brief", p.tenant, "user:alice", roles=["user"],
                           token_lifespan_s=1),
            # The same principal name, in a tenant whose directory does not hold it.
            keycloak.Agent("agent-stranger", str(uuid.uuid4()), "user:alice", roles=["user"]),
        ], people=[keycloak.Person(PERSON, p.tenant, PERSON_PRINCIPAL)],
            public_client=keycloak.PublicClient(BROWSER_CLIENT, redirect_uri))
        env = {"AGENTLEDGER_KAFKA_BOOTSTRAP": p.bootstrap,
               "AGENTLEDGER_DATABASE_URL": logins.url_for(p.database_url, "mcp"),
               "AGENTLEDGER_MCP_TRANSPORT": "http", "AGENTLEDGER_MCP_PORT": str(port),
               "AGENTLEDGER_MCP_INGRESS_URL": p.ingress_url,
               "AGENTLEDGER_MCP_ADMISSIONS_TOPIC": p.topic("agent.admissions.v1"),
               "AGENTLEDGER_MCP_OUTCOMES_TOPIC": p.topic("agent.outcomes.v1"),
               "AGENTLEDGER_MCP_WAIT_S": str(WAIT_S),
               "AGENTLEDGER_MCP_CONSOLE_URL": p.console_url,
               "AGENTLEDGER_MCP_RESOURCE_URL": url,
               "AGENTLEDGER_MCP_OAUTH_ISSUER": realm.issuer,
               # The token's own clock is the test's: no skew to forgive here.
               "AGENTLEDGER_MCP_OAUTH_LEEWAY_S": "0",
               "AGENTLEDGER_MCP_EXCHANGE_KEY": exchange_private,
               "AGENTLEDGER_MCP_EXCHANGE_KID": EXCHANGE_KID,
               "AGENTLEDGER_MCP_SESSION_ISSUER": p.sessions.issuer,
               "AGENTLEDGER_MCP_SESSION_AUDIENCE": p.sessions.audience}
        with processes.running("agentledger.mcp", env, logs / "mcp.log",
                               ready=processes.http_ok(f"http://127.0.0.1:{port}/healthz")):
            yield World(p, url, realm, redirect_uri)


@asynccontextmanager
async def _oauth_client(w: World, client_id: str, mode: str = "auto") -> AsyncIterator[Client]:
    """The SDK's client with the SDK's client-credentials provider: no token given, it finds
    the authorization server from the 401 and asks it."""
    agent = w.realm.agents[client_id]
    provider = ClientCredentialsOAuthProvider(
        server_url=w.url, storage=keycloak.MemoryTokens(), client_id=agent.client_id,
        client_secret=agent.secret, issuer=w.realm.issuer, scope=SCOPE)
    async with httpx2.AsyncClient(auth=provider, timeout=httpx2.Timeout(30, read=120)) as http, \
            Client(streamable_http_client(w.url, http_client=http), mode=mode) as mcp:
        yield mcp


def _answer(result: types.CallToolResult) -> dict[str, Any]:
    assert isinstance(result.structured_content, dict), result
    return result.structured_content


def _note(p: Pipeline, body: str) -> dict[str, Any]:
    return {"customer_id": p.customer, "body": body, "target": p.customer}


def _ledger(p: Pipeline, op: uuid.UUID) -> tuple[int, int]:
    """(commands, approval requests) the ledger holds for one operation."""
    async def count() -> tuple[int, int]:
        conn = await asyncpg.connect(p.database_url)
        try:
            commands = await conn.fetchval(
                "SELECT count(*) FROM agent_command WHERE operation_id = $1", op)
            approvals = await conn.fetchval(
                "SELECT count(*) FROM approval_request WHERE operation_id = $1", op)
            return int(commands), int(approvals)
        finally:
            await conn.close()
    return asyncio.run(count())


def _effects(p: Pipeline, op: str) -> list[dict[str, Any]]:
    return [e for e in asyncio.run(p.crm.effects(p.tenant))
            if e["kind"] == "note.created" and e.get("idempotency_key") == op]


def test_the_401_names_the_metadata_and_the_metadata_names_keycloak(world: World) -> None:
    w = world
    answer = httpx2.post(w.url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                         headers={"Accept": "application/json, text/event-stream"}, timeout=30)
    assert answer.status_code == 401
    challenge = answer.headers["www-authenticate"]
    metadata_url = w.url.replace("/mcp", "/.well-known/oauth-protected-resource/mcp")
    assert f'resource_metadata="{metadata_url}"' in challenge and f'scope="{SCOPE}"' in challenge
    metadata = httpx2.get(metadata_url, timeout=30).json()
    assert metadata["resource"] == w.url and metadata["authorization_servers"] == [w.realm.issuer]
    assert metadata["scopes_supported"] == [SCOPE]


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
def test_a_client_credentials_agent_lists_and_calls_once_in_either_protocol_era(
        world: World, mode: str) -> None:
    w = world
    key = f"oauth-{mode}-{uuid.uuid4().hex[:12]}"
    body = _note(w.p, f"via oauth {mode} {uuid.uuid4()}")

    async def session() -> tuple[str, set[str], list[dict[str, Any]]]:
        async with _oauth_client(w, "agent-alice", mode) as mcp:
            names = {t.name for t in (await mcp.list_tools()).tools}
            answers = [_answer(await mcp.call_tool("crm.note.create", body,
                                                   meta={idempotency.META_KEY: key}))
                       for _ in range(5)]
            return mcp.protocol_version, names, answers
    version, names, answers = asyncio.run(session())
    # The modern client adopts 2026-07-28 statelessly; the legacy one negotiates 2025-11-25
    # through `initialize` on the same endpoint.
    assert version == ("2026-07-28" if mode != "legacy" else "2025-11-25")
    assert {"crm.note.create", "billing.refund.create", "agentledger_status"} <= names
    op = identity.derive_operation_id(uuid.UUID(w.p.tenant), "user:alice", key)
    assert {a["operation_id"] for a in answers} == {str(op)}
    assert {a["status"] for a in answers} == {"succeeded"}, answers
    assert w.p.state(op) == ("succeeded", answers[0]["receipt"])
    assert len(_effects(w.p, str(op))) == 1 and _ledger(w.p, op) == (1, 0)


def _forged(w: World, *, kid: str) -> str:
    """A token with every claim right, signed by a key that is not the realm's."""
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = int(time.time())
    return jwt.encode({"iss": w.realm.issuer, "aud": w.url, "exp": now + 300, "iat": now,
                       "tenant_id": w.p.tenant, "principal": "user:alice", "azp": "agent-alice",
                       "scope": SCOPE}, stranger, algorithm="RS256", headers={"kid": kid})


def test_tokens_the_server_must_not_accept_are_refused_with_the_specified_status(
        world: World) -> None:
    w = world
    good = w.realm.token("agent-alice")["access_token"]
    realm_kid = jwt.get_unverified_header(good)["kid"]
    brief = w.realm.token("agent-brief")["access_token"]
    expires = jwt.decode(brief, options={"verify_signature": False})["exp"]
    # Wait on the clock for the token's expiry (a condition with a deadline, not a sleep).
    assert wait_until(lambda: time.time() > expires + 1, timeout=30)
    cases = {
        "another audience": (w.realm.token("agent-elsewhere")["access_token"], 401, "invalid_token"),
        "expired": (brief, 401, "invalid_token"),
        "an unknown key": (_forged(w, kid="kid-nobody-published"), 401, "invalid_token"),
        "the realm's kid, another key": (_forged(w, kid=realm_kid), 401, "invalid_token"),
        "no scope": (w.realm.token("agent-noscope")["access_token"], 403, "insufficient_scope"),
        "another tenant": (w.realm.token("agent-stranger")["access_token"], 401, "invalid_token"),
    }
    seen: dict[str, tuple[int, str]] = {}
    ops = []
    for name, (token, _, _) in cases.items():
        key = f"refused-{uuid.uuid4().hex[:12]}"
        answer = httpx2.post(w.url, json={
            "jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "crm.note.create", "arguments": _note(w.p, f"refused {name}"),
                       "_meta": {idempotency.META_KEY: key}}},
            headers={"Authorization": f"Bearer {token}", "MCP-Protocol-Version": "2025-11-25",
                     "Accept": "application/json, text/event-stream"}, timeout=30)
        challenge = answer.headers.get("www-authenticate", "")
        seen[name] = (answer.status_code, challenge)
        assert "resource_metadata=" in challenge and f'scope="{SCOPE}"' in challenge, (name, challenge)
        ops.append(identity.derive_operation_id(uuid.UUID(w.p.tenant), "user:alice", key))
    def error_of(challenge: str) -> str | None:
        found = re.search(r'error="([^"]+)"', challenge)
        return found.group(1) if found else None
    assert {name: (status, error_of(challenge)) for name, (status, challenge) in seen.items()} == {
        name: (status, error) for name, (_, status, error) in cases.items()}, seen
    # Nothing admitted, nothing waiting for approval, no effect.
    assert [_ledger(w.p, op) for op in ops] == [(0, 0)] * len(ops)
    assert all(not _effects(w.p, str(op)) for op in ops)


def test_the_callers_access_token_never_reaches_ingress(world: World) -> None:
    # No token passthrough: ingress accepts only sessions of its configured keys (the test
    # IdP's and this server's exchange key), so the realm's RS256 access token would be
    # refused there; the call succeeding under the verified principal is the proof.
    w = world
    key = f"exchange-{uuid.uuid4().hex[:12]}"

    async def call() -> dict[str, Any]:
        async with _oauth_client(w, "agent-alice") as mcp:
            return _answer(await mcp.call_tool("crm.note.create", _note(w.p, f"exchange {key}"),
                                               meta={idempotency.META_KEY: key}))
    done = asyncio.run(call())
    assert done["status"] == "succeeded", done
    records = w.p.read("agent.proposals.v1",
                       lambda r: r.get("operation_id") == done["operation_id"])
    assert [(r["tenant_id"], r["principal_id"]) for r in records] == [(w.p.tenant, "user:alice")]
    assert w.realm.issuer not in json.dumps(records)


def _modern(w: World, token: str, method: str, params: dict[str, Any], name: str,
            extensions: dict[str, Any], status: int = 200) -> dict[str, Any]:
    """One 2026-07-28 request on the wire (the SDK's client does not speak the tasks
    extension): per-request version and capabilities, the routing headers."""
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"extensions": extensions},
            "io.modelcontextprotocol/clientInfo": {"name": "tasks-e2e", "version": "1"}}
    answer = httpx2.post(w.url, json={"jsonrpc": "2.0", "id": 1, "method": method,
                                      "params": {**params, "_meta": {**params.get("_meta", {}), **meta}}},
                         headers={"Authorization": f"Bearer {token}",
                                  "Accept": "application/json, text/event-stream",
                                  "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method,
                                  "Mcp-Name": name}, timeout=120)
    assert answer.status_code == status, answer.text
    found: dict[str, Any] = answer.json()
    return found


def _approve_in_console(w: World, approval: str) -> None:
    """fiona decides through the console's HTTP API, as the approval page would."""
    assert w.p.sessions is not None and w.p.console_url
    fiona = {"Authorization": f"Bearer {w.p.sessions.issue(w.p.tenant, 'user:fiona', ['finance-approver'])}"}
    shown = httpx2.get(f"{w.p.console_url}/api/v1/approvals/{approval}", headers=fiona, timeout=30)
    assert shown.status_code == 200, shown.text
    decided = httpx2.post(f"{w.p.console_url}/api/v1/approvals/{approval}/approve", headers=fiona,
                          json={"shown_hash": shown.json()["request_hash"], "reason": "checked"},
                          timeout=60)
    assert decided.status_code == 200 and decided.json()["state"] == "approved", decided.text


def _refund(w: World, invoice: str) -> dict[str, Any]:
    return {"customer_id": w.p.customer, "invoice_id": invoice, "amount_minor": 4200,
            "currency": "EUR", "reason": "double charge", "target": w.p.customer}


def test_an_approval_is_followed_as_a_task_until_the_console_decides(world: World) -> None:
    w = world
    assert w.p.sessions is not None and w.p.console_url
    token = w.realm.token("agent-alice")["access_token"]
    declared = {"io.modelcontextprotocol/tasks": {}}
    invoice = f"inv-{uuid.uuid4().hex[:8]}"
    called = _modern(w, token, "tools/call", {"name": "billing.refund.create",
                                              "arguments": _refund(w, invoice)},
                     "billing.refund.create", declared)["result"]
    # The task id is the operation id, and the ledger holds it before the answer.
    assert called["resultType"] == "task" and called["status"] == "input_required", called
    op = uuid.UUID(called["taskId"])
    assert _ledger(w.p, op) == (0, 1) and w.p.pending_approval(op)

    def get() -> dict[str, Any]:
        found: dict[str, Any] = _modern(w, token, "tasks/get", {"taskId": str(op)}, str(op),
                                        declared)["result"]
        return found
    waiting = get()
    assert waiting["status"] == "input_required" and waiting["resultType"] == "complete"
    [(key, request)] = waiting["inputRequests"].items()
    approval = key.removeprefix("approval-")
    assert request["method"] == "elicitation/create" and request["params"]["mode"] == "url"
    assert request["params"]["url"] == f"{w.p.console_url}/approvals/{approval}"
    # A client that does not declare the extension is refused the tasks/* methods.
    undeclared = _modern(w, token, "tasks/get", {"taskId": str(op)}, str(op), {}, status=400)
    assert undeclared["error"]["code"] == -32021

    _approve_in_console(w, approval)

    seen: list[dict[str, Any]] = []

    def completed() -> bool:
        seen.append(get())
        return bool(seen[-1]["status"] == "completed")
    # The task's own poll interval (2 s) between polls, to a deadline.
    assert wait_until(completed, timeout=120, interval=waiting["pollIntervalMs"] / 1000), seen[-3:]
    assert {s["status"] for s in seen} <= {"input_required", "working", "completed"}
    result = seen[-1]["result"]
    assert result["isError"] is False and result["structuredContent"]["status"] == "succeeded"
    receipt = result["structuredContent"]["receipt"]
    assert w.p.state(op) == ("succeeded", receipt) and _ledger(w.p, op) == (1, 1)
    # Refunds carry no key (never deduped): the CRM's own rows for this invoice are the proof.
    assert _refunds(w.p, invoice) == [receipt.removeprefix("crm:refund:")]


# --- the official TypeScript SDK's client ------------------------------------------------------

TS_CLIENT = Path(__file__).parent / "ts_client"
TS_SDK = TS_CLIENT / "node_modules" / "@modelcontextprotocol" / "client"
TS_DEADLINE_S = 180


class Lines:
    """The JSON lines a subprocess prints, read as they come (a thread per stream)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.events: list[dict[str, Any]] = []
        self.other: list[str] = []
        assert proc.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            try:
                self.events.append(json.loads(line))
            except json.JSONDecodeError:
                self.other.append(line)

    def of(self, event: str) -> list[dict[str, Any]]:
        return [e for e in list(self.events) if e["event"] == event]

    def join(self, timeout: float) -> None:
        self._reader.join(timeout)


def test_the_typescript_sdk_client_discovers_calls_once_and_follows_a_task(
        world: World, tmp_path: Path) -> None:
    w = world
    node = shutil.which("node")
    assert node and TS_SDK.is_dir(), f"node or {TS_SDK} is missing: bash deploy/local/bootstrap.sh test"
    agent = w.realm.agents["agent-alice"]
    key = f"ts-{uuid.uuid4().hex[:12]}"
    invoice = f"inv-{uuid.uuid4().hex[:8]}"
    config = {"url": w.url, "issuer": w.realm.issuer, "clientId": agent.client_id,
              "clientSecret": agent.secret, "scope": SCOPE, "deadlineMs": TS_DEADLINE_S * 1000,
              "note": {"tool": "crm.note.create", "key": key,
                       "arguments": _note(w.p, f"via the TypeScript SDK {key}")},
              "refund": {"tool": "billing.refund.create", "arguments": _refund(w, invoice)}}
    stderr = tmp_path / "ts_client.stderr"
    started = time.monotonic()
    with open(stderr, "w") as err:
        proc = subprocess.Popen(
            [node, str(TS_CLIENT / "client.mjs")], cwd=TS_CLIENT, text=True,
            stdout=subprocess.PIPE, stderr=err,
            env={**os.environ, "AGENTLEDGER_TS_CLIENT": json.dumps(config)})
    lines = Lines(proc)
    try:
        def waiting_for_a_person() -> bool:
            assert proc.poll() is None or lines.of("done"), (lines.events[-3:], stderr.read_text())
            return any("inputRequests" in e["task"] for e in lines.of("task"))
        assert wait_until(waiting_for_a_person, timeout=TS_DEADLINE_S), (
            lines.events[-5:], stderr.read_text())
        [(_, request)] = next(e["task"] for e in lines.of("task")
                              if "inputRequests" in e["task"])["inputRequests"].items()
        assert request["params"]["mode"] == "url"
        approval = request["params"]["url"].rsplit("/", 1)[-1]
        assert request["params"]["url"] == f"{w.p.console_url}/approvals/{approval}"
        _approve_in_console(w, approval)
        assert proc.wait(timeout=TS_DEADLINE_S) == 0, (lines.of("error"), stderr.read_text())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        lines.join(timeout=30)
        assert proc.stdout is not None
        proc.stdout.close()
    elapsed = time.monotonic() - started
    assert lines.of("done") and not lines.other, (lines.other, lines.events[-3:])

    # Discovery from the 401: the unauthenticated POST, the RFC 9728 metadata it names, the
    # authorization server's metadata, the client-credentials token, then the MCP call.
    http = [(e["method"], e["url"], e["status"]) for e in lines.of("http")]
    metadata_url = w.url.replace("/mcp", "/.well-known/oauth-protected-resource/mcp")
    assert http[0] == ("POST", w.url, 401), http
    assert ("GET", metadata_url, 200) in http, http
    issuer_metadata = [u for (m, u, s) in http
                       if m == "GET" and u.startswith(w.realm.base_url) and s == 200]
    assert issuer_metadata and "/.well-known/" in issuer_metadata[0], http
    assert ("POST", w.realm.token_endpoint, 200) in http, http
    assert http.index(("POST", w.realm.token_endpoint, 200)) < next(
        i for i, (m, u, s) in enumerate(http) if m == "POST" and u == w.url and s == 200)

    [connected] = lines.of("connected")
    assert connected == {"event": "connected", "protocolVersion": "2026-07-28", "era": "modern"}
    [tools] = lines.of("tools")
    assert {"crm.note.create", "billing.refund.create", "agentledger_status"} <= set(tools["names"])

    # Five retries with one key: one operation, one command, one effect.
    called = lines.of("called")
    assert len(called) == 5 and not any(c["isError"] for c in called), called
    op = identity.derive_operation_id(uuid.UUID(w.p.tenant), "user:alice", key)
    assert {c["structuredContent"]["operation_id"] for c in called} == {str(op)}
    assert {c["structuredContent"]["status"] for c in called} == {"succeeded"}
    assert w.p.state(op) == ("succeeded", called[0]["structuredContent"]["receipt"])
    assert len(_effects(w.p, str(op))) == 1 and _ledger(w.p, op) == (1, 0)

    # The refund as a Task: created input_required (the id is the operation id), then
    # completed with the tool's result once the console approved it.
    tasks = [e["task"] for e in lines.of("task")]
    assert tasks[0]["resultType"] == "task" and tasks[0]["status"] == "input_required", tasks[0]
    refund_op = uuid.UUID(tasks[0]["taskId"])
    assert {t["status"] for t in tasks} <= {"input_required", "working", "completed"}
    final = tasks[-1]
    assert final["status"] == "completed" and final["taskId"] == str(refund_op), final
    assert final["result"]["isError"] is False, final
    assert final["result"]["structuredContent"]["status"] == "succeeded", final
    receipt = final["result"]["structuredContent"]["receipt"]
    assert w.p.state(refund_op) == ("succeeded", receipt) and _ledger(w.p, refund_op) == (1, 1)
    assert _refunds(w.p, invoice) == [receipt.removeprefix("crm:refund:")]
    print(f"TypeScript SDK client: {elapsed:.1f} s from start to the task's completion")


# --- a person: the authorization-code flow with PKCE, through Keycloak's login page -----------

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


class Callback:
    """The loopback redirect URI's listener (RFC 8252): records the authorization response."""

    def __init__(self, redirect_uri: str) -> None:
        parsed = urlsplit(redirect_uri)
        self.path = parsed.path
        self.answers: list[dict[str, str]] = []
        self.arrived = threading.Event()
        callback = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                if url.path != callback.path:
                    self.send_error(404)
                    return
                callback.answers.append(dict(parse_qsl(url.query)))
                callback.arrived.set()
                body = b"signed in; this window can be closed"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        assert parsed.hostname and parsed.port
        self.server = ThreadingHTTPServer((parsed.hostname, parsed.port), Handler)
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Callback:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_person_signs_in_through_keycloaks_login_page_with_pkce_and_calls_as_themselves(
        world: World) -> None:
    w = world
    person = w.realm.people[PERSON]
    key = f"pkce-{uuid.uuid4().hex[:12]}"
    # The client requires PKCE: an authorization request without a challenge is refused.
    refused = httpx2.get(f"{w.realm.issuer}/protocol/openid-connect/auth", params={
        "client_id": BROWSER_CLIENT, "response_type": "code", "redirect_uri": w.redirect_uri,
        "scope": SCOPE, "state": "s"}, follow_redirects=False, timeout=30)
    assert refused.status_code == 302, refused.text
    assert dict(parse_qsl(urlsplit(refused.headers["location"]).query))["error"] == "invalid_request"

    authorizations: list[str] = []
    pages: list[str] = []

    async def session(callback: Callback) -> tuple[dict[str, Any], OAuthToken | None]:
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = await browser.new_page()
                page.set_default_timeout(30_000)

                async def redirect(url: str) -> None:
                    # The SDK's authorization URL, opened in the browser; a person signs in.
                    authorizations.append(url)
                    await page.goto(url)
                    pages.append(page.url)
                    await page.fill("#username", person.username)
                    await page.fill("#password", person.password)
                    await page.click("#kc-login")
                    await page.wait_for_url(f"{w.redirect_uri}?*")

                async def answered() -> AuthorizationCodeResult:
                    assert await asyncio.to_thread(callback.arrived.wait, 30)
                    [found] = callback.answers
                    return AuthorizationCodeResult(code=found["code"], state=found.get("state"),
                                                   iss=found.get("iss"))
                storage = keycloak.MemoryTokens()
                # Pre-registered (Keycloak's registration needs an initial access token): the
                # public client, no secret.
                storage.client = OAuthClientInformationFull(
                    client_id=BROWSER_CLIENT, redirect_uris=[AnyUrl(w.redirect_uri)],
                    token_endpoint_auth_method="none", scope=SCOPE,
                    grant_types=["authorization_code"], response_types=["code"])
                provider = OAuthClientProvider(
                    server_url=w.url, storage=storage, redirect_handler=redirect,
                    callback_handler=answered,
                    client_metadata=OAuthClientMetadata(
                        redirect_uris=[AnyUrl(w.redirect_uri)], token_endpoint_auth_method="none",
                        grant_types=["authorization_code"], response_types=["code"],
                        scope=SCOPE, client_name="agentledger PKCE e2e"))
                async with httpx2.AsyncClient(auth=provider, timeout=httpx2.Timeout(30, read=120)
                                              ) as http, \
                        Client(streamable_http_client(w.url, http_client=http)) as mcp:
                    answer = _answer(await mcp.call_tool(
                        "crm.note.create", _note(w.p, f"signed in {key}"),
                        meta={idempotency.META_KEY: key}))
                return answer, storage.tokens
            finally:
                await browser.close()

    started = time.monotonic()
    with Callback(w.redirect_uri) as callback:
        answer, tokens = asyncio.run(session(callback))
    elapsed = time.monotonic() - started
    # One sign-in on Keycloak's own login page, the SDK's PKCE parameters in the request.
    [authorization] = authorizations
    asked = dict(parse_qsl(urlsplit(authorization).query))
    assert authorization.startswith(f"{w.realm.issuer}/protocol/openid-connect/auth?")
    assert asked["code_challenge_method"] == "S256" and len(asked["code_challenge"]) == 43
    assert asked["resource"] == w.url and asked["client_id"] == BROWSER_CLIENT
    assert pages[0].startswith(f"{w.realm.issuer}/protocol/openid-connect/auth")
    assert callback.answers[0]["iss"] == w.realm.issuer
    # The token is the person's, for this server.
    assert tokens is not None
    claims = jwt.decode(tokens.access_token, options={"verify_signature": False})
    assert (claims["azp"], claims["preferred_username"], claims["principal"], claims["aud"]) == (
        BROWSER_CLIENT, PERSON, PERSON_PRINCIPAL, w.url), claims
    # The call happened once, as that person: the ledger's command and the proposal name them.
    op = identity.derive_operation_id(uuid.UUID(w.p.tenant), PERSON_PRINCIPAL, key)
    assert answer["operation_id"] == str(op) and answer["status"] == "succeeded", answer
    assert w.p.state(op) == ("succeeded", answer["receipt"]) and _ledger(w.p, op) == (1, 0)
    assert _principal_of(w.p, op) == PERSON_PRINCIPAL
    assert len(_effects(w.p, str(op))) == 1
    print(f"authorization code + PKCE through the login page, then the call: {elapsed:.1f} s")


def _principal_of(p: Pipeline, op: uuid.UUID) -> str | None:
    async def read() -> str | None:
        conn = await asyncpg.connect(p.database_url)
        try:
            found = await conn.fetchval(
                "SELECT principal_id FROM agent_command WHERE operation_id = $1", op)
            return None if found is None else str(found)
        finally:
            await conn.close()
    return asyncio.run(read())
