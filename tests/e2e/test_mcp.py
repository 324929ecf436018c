"""The MCP server (`agentledger mcp`) in front of the real pipeline (issue 21 item 5), with
the project's session tokens (OAuth access tokens: test_mcp_oauth.py).

Real services as processes over the shared Kafka and PostgreSQL: ingress, admission, relay,
executors, reconciler, the CRM stand-in; the MCP server as its own process (its own database
login, reading the principal directory), reached with the official `mcp` SDK's client over
streamable HTTP and, started by that client, over stdio.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import httpx2
import mcp_types as types
import psycopg2
import pytest
from confluent_kafka import Consumer
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from opentelemetry import context as otel_context

from agentledger import client as client_mod
from agentledger import identity, logins
from agentledger.mcp import idempotency, runs
from agentledger.policy import repository as policy_repo
from agentledger.telemetry import spans
from agentledger.testing import identities, processes
from agentledger.testing.pipeline import Pipeline, pipeline
from agentledger.testing.polling import wait_until
from tests.stack import Stack

ACTIONS = {"crm.note.create", "crm.contact.update", "billing.refund.create"}
STATUS = "agentledger_status"
CONSOLE = "http://console.example.test"
# Long enough for admission + dispatch on a loaded CI machine (a second or two normally),
# short enough that asking about a still-pending approval returns soon.
WAIT_S = 20


@pytest.fixture(scope="module")
def world(stack: Stack, database_url: str, make_database: Callable[[], str],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Pipeline, str, dict[str, str]]]:
    logs = tmp_path_factory.mktemp("mcp")
    with pipeline(stack.kafka_bootstrap, database_url, make_database(), logs, ingress=True) as p:
        assert p.sessions is not None and p.ingress_url
        port = processes.free_port()
        env = {"AGENTLEDGER_KAFKA_BOOTSTRAP": p.bootstrap,
               "AGENTLEDGER_MCP_INGRESS_URL": p.ingress_url,
               "AGENTLEDGER_MCP_ADMISSIONS_TOPIC": p.topic("agent.admissions.v1"),
               "AGENTLEDGER_MCP_OUTCOMES_TOPIC": p.topic("agent.outcomes.v1"),
               "AGENTLEDGER_MCP_CONSOLE_URL": CONSOLE,
               "AGENTLEDGER_MCP_WAIT_S": str(WAIT_S),
               "AGENTLEDGER_MCP_SESSION_KEYS": json.dumps({p.sessions.kid: p.sessions.public_pem}),
               "AGENTLEDGER_MCP_SESSION_ISSUER": p.sessions.issuer,
               "AGENTLEDGER_MCP_SESSION_AUDIENCE": p.sessions.audience,
               # Its own login (agentledger_auditor): the directory and the ledger, read only.
               "AGENTLEDGER_DATABASE_URL": logins.url_for(p.database_url, "mcp")}
        with processes.running("agentledger.mcp", {
                **env, "AGENTLEDGER_MCP_TRANSPORT": "http", "AGENTLEDGER_MCP_PORT": str(port)},
                logs / "mcp.log", ready=processes.http_ok(f"http://127.0.0.1:{port}/healthz")):
            yield p, f"http://127.0.0.1:{port}/mcp", env


def _token(p: Pipeline, principal: str = "user:alice", roles: list[str] | None = None) -> str:
    assert p.sessions is not None
    return p.sessions.issue(p.tenant, principal, ["user"] if roles is None else roles)


@asynccontextmanager
async def _http(url: str, token: str | None, run: str | None = None) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    if run is not None:
        headers["AgentLedger-Run"] = run  # the session's run (issue 21 item 6)
    # The read bound covers a call's whole wait (WAIT_S) with margin.
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as h, \
            Client(streamable_http_client(url, http_client=h)) as mcp:
        yield mcp


def _raw(url: str, token: str | None, method: str = "tools/list",
         params: dict[str, Any] | None = None) -> httpx2.Response:
    """One JSON-RPC request as a bare HTTP POST (the HTTP status is what is checked)."""
    headers = {"Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-11-25"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx2.post(url, json={"jsonrpc": "2.0", "id": 1, "method": method,
                                  "params": params or {}}, headers=headers, timeout=30)


def _stdio(env: dict[str, str], token: str) -> Client:
    return Client(StdioServerParameters(
        command=sys.executable, args=["-m", "agentledger.mcp"], cwd=str(Path.cwd()),
        env={**os.environ, **processes.PROFILE, **env, "AGENTLEDGER_MCP_TRANSPORT": "stdio",
             "AGENTLEDGER_MCP_TOKEN": token}))


def _mcp_error(exc: BaseException) -> MCPError | None:
    if isinstance(exc, MCPError):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        found = _mcp_error(inner)
        if found is not None:
            return found
    return None


async def _refused(connect: Callable[[], Any], act: Callable[[Client], Awaitable[object]]
                   ) -> MCPError:
    """The MCP error `act` ends with (the SDK raises it inside task groups)."""
    try:
        async with connect() as mcp:
            await act(mcp)
    except BaseException as exc:  # an ExceptionGroup around the MCPError
        found = _mcp_error(exc)
        assert found is not None, repr(exc)
        return found
    raise AssertionError("the call was not refused")


def _answer(result: types.CallToolResult) -> dict[str, Any]:
    assert isinstance(result.structured_content, dict), result
    return result.structured_content


def _effects(p: Pipeline, kind: str, op: str) -> list[dict[str, Any]]:
    return [e for e in asyncio.run(p.crm.effects(p.tenant))
            if e["kind"] == kind and e.get("idempotency_key") == op]


def _refunds(p: Pipeline, invoice: str) -> list[str]:
    conn = psycopg2.connect(p.crm.database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT refund_id FROM crm_refund WHERE tenant_id = %s AND invoice_id = %s",
                        (p.tenant, invoice))
            return [str(row[0]) for row in cur.fetchall()]
    finally:
        conn.close()


def _note(p: Pipeline, body: str) -> dict[str, Any]:
    return {"customer_id": p.customer, "body": body, "target": p.customer}


def test_tools_list_shows_what_the_callers_roles_may_propose(world: tuple[Pipeline, str, dict[str, str]]) -> None:
    p, url, _ = world

    async def listed(token: str) -> dict[str, types.Tool]:
        async with _http(url, token) as mcp:
            return {t.name: t for t in (await mcp.list_tools()).tools}

    user = asyncio.run(listed(_token(p)))
    assert ACTIONS | {STATUS} <= set(user)
    update = user["crm.contact.update"].input_schema
    assert update["additionalProperties"] is False
    assert {"customer_id", "changes", "target", "expected_revision"} <= set(update["required"])
    note = user["crm.note.create"].input_schema
    assert "expected_revision" not in note["properties"] and "target" in note["required"]
    assert "approve" in (user["billing.refund.create"].description or "")
    # The directory's roles decide, not the token's: bob is an approver there, whatever his
    # token claims, and may request nothing: only the status tool.
    assert set(asyncio.run(listed(_token(p, "user:bob", ["user"])))) == {STATUS}

    # And a call of a tool it does not see is an MCP error: nothing proposed.
    bob = _token(p, "user:bob", ["user"])
    error = asyncio.run(_refused(lambda: _http(url, bob), lambda mcp: mcp.call_tool(
        "crm.note.create", _note(p, "from bob"))))
    assert error.code == types.INVALID_PARAMS
    key = idempotency.derived_key("user:bob", "crm.note.create", _note(p, "from bob"))
    assert p.state(client_mod.operation_id_for(bob, key)) is None

    # A principal the directory does not know in the token's tenant is refused like a bad token.
    nobody = _raw(url, _token(p, "user:nobody", ["user"]))
    assert nobody.status_code == 401 and "invalid_token" in nobody.headers["www-authenticate"]


def test_a_note_succeeds_with_its_receipt_and_one_effect(world: tuple[Pipeline, str, dict[str, str]]) -> None:
    p, url, _ = world

    async def call() -> dict[str, Any]:
        async with _http(url, _token(p)) as mcp:
            result = await mcp.call_tool("crm.note.create", _note(p, f"note {uuid.uuid4()}"))
            assert result.is_error is False
            return _answer(result)
    answer = asyncio.run(call())
    assert answer["status"] == "succeeded", answer
    assert answer["receipt"].startswith("crm:note:")
    op = answer["operation_id"]
    assert p.state(uuid.UUID(op)) == ("succeeded", answer["receipt"])
    assert len(_effects(p, "note.created", op)) == 1

    # Aimed at one record, writing to another: admission rejects it, and the answer says so.
    async def astray() -> types.CallToolResult:
        async with _http(url, _token(p)) as mcp:
            return await mcp.call_tool("crm.note.create", {**_note(p, "astray"), "target": "c-elsewhere"})
    result = asyncio.run(astray())
    rejected = _answer(result)
    assert result.is_error is True and rejected["status"] == "rejected", rejected
    assert rejected["code"] == "invalid_arguments" and "receipt" not in rejected
    assert p.state(uuid.UUID(rejected["operation_id"])) is None


def test_five_retries_of_one_call_are_one_operation_and_one_effect(world: tuple[Pipeline, str, dict[str, str]]) -> None:
    p, url, _ = world
    token, key = _token(p), f"mcp-retry-{uuid.uuid4().hex}"
    arguments = _note(p, f"once {uuid.uuid4()}")

    async def calls() -> list[dict[str, Any]]:
        async with _http(url, token) as mcp:
            first = _answer(await mcp.call_tool("crm.note.create", arguments,
                                                meta={idempotency.META_KEY: key}))
            # Four more at once, as a client retrying after lost answers might.
            again = await asyncio.gather(*[mcp.call_tool(
                "crm.note.create", arguments, meta={idempotency.META_KEY: key}) for _ in range(4)])
            return [first, *[_answer(r) for r in again]]
    answers = asyncio.run(calls())
    op = str(client_mod.operation_id_for(token, key))
    assert [a["operation_id"] for a in answers] == [op] * 5
    assert {a["status"] for a in answers} == {"succeeded"}, answers
    assert len({a["receipt"] for a in answers}) == 1
    assert {a["idempotency_key"] for a in answers} == {key}
    assert len(_effects(p, "note.created", op)) == 1

    # Without a key the call derives one: a retry with the same input is the same operation.
    async def derived() -> list[dict[str, Any]]:
        async with _http(url, token) as mcp:
            body = _note(p, f"derived {uuid.uuid4()}")
            return [_answer(await mcp.call_tool("crm.note.create", body)) for _ in range(2)]
    one, two = asyncio.run(derived())
    assert one["operation_id"] == two["operation_id"] and one["status"] == two["status"] == "succeeded"
    assert one["idempotency_key"].startswith(idempotency.DERIVED_PREFIX)
    assert len(_effects(p, "note.created", one["operation_id"])) == 1


def test_a_refund_waits_for_approval_then_the_status_tool_says_succeeded(world: tuple[Pipeline, str, dict[str, str]]) -> None:
    p, url, _ = world
    token = _token(p)
    refund = {"customer_id": p.customer, "invoice_id": f"inv-{uuid.uuid4().hex[:8]}",
              "amount_minor": 1999, "currency": "EUR", "reason": "double charge", "target": p.customer}

    async def propose() -> types.CallToolResult:
        async with _http(url, token) as mcp:
            return await mcp.call_tool("billing.refund.create", refund)
    result = asyncio.run(propose())
    pending = _answer(result)
    assert result.is_error is False and pending["status"] == "pending_approval", pending
    op, approval = uuid.UUID(pending["operation_id"]), pending["approval_id"]
    assert pending["approval_url"] == f"{CONSOLE}/approvals/{approval}"
    assert p.pending_approval(op) and p.state(op) is None, "nothing admitted before the decision"

    p.approve(op)  # user:fiona, finance, through the approvals repository and the policy

    async def status() -> dict[str, Any]:
        async with _http(url, token) as mcp:
            return _answer(await mcp.call_tool(STATUS, {"operation_id": str(op)}))
    seen: list[dict[str, Any]] = []

    def succeeded() -> bool:
        # Each question waits up to WAIT_S on the server for the outcome: no sleep here.
        seen.append(asyncio.run(status()))
        return bool(seen[-1]["status"] == "succeeded")
    assert wait_until(succeeded, timeout=120, interval=0), seen
    assert seen[-1]["receipt"] and seen[-1]["operation_id"] == str(op)
    assert all(s["status"] in ("pending_approval", "in_progress", "succeeded") for s in seen), seen
    # Refunds carry no key (never deduped): the CRM's own rows for this invoice are the proof.
    assert _refunds(p, str(refund["invoice_id"])) == [seen[-1]["receipt"].removeprefix("crm:refund:")]


def test_an_invalid_token_is_refused_and_nothing_is_proposed(world: tuple[Pipeline, str, dict[str, str]]) -> None:
    p, url, env = world
    other_private, _ = identity.generate_keypair("EdDSA")
    assert p.sessions is not None
    forged = identity.issue_session(other_private, p.sessions.kid, tenant_id=uuid.UUID(p.tenant),
                                    subject="user:alice", audience=p.sessions.audience,
                                    issuer=p.sessions.issuer, roles=["user"])
    body = _note(p, f"forged {uuid.uuid4()}")
    for token in (forged, None, "not-a-jwt"):
        for method, params in (("tools/list", {}),
                               ("tools/call", {"name": "crm.note.create", "arguments": body})):
            # HTTP 401 with a challenge, never a JSON-RPC error code (issue 40).
            answer = _raw(url, token, method, params)
            assert answer.status_code == 401, answer.text
            assert answer.headers["www-authenticate"].startswith("Bearer ")
            assert "jsonrpc" not in answer.text
    key = idempotency.derived_key("user:alice", "crm.note.create", body)
    assert p.state(client_mod.operation_id_for(forged, key)) is None
    # Over stdio the configured token is checked the same way; stdio has no HTTP status, so
    # it is a standard JSON-RPC code (never one of the reserved -32020..-32099).
    over_stdio = asyncio.run(_refused(lambda: _stdio(env, forged), lambda mcp: mcp.list_tools()))
    assert over_stdio.code == types.INVALID_REQUEST


def test_stdio_lists_and_proposes_with_the_configured_token(world: tuple[Pipeline, str, dict[str, str]]) -> None:
    p, _, env = world
    token = _token(p)

    async def session() -> tuple[set[str], dict[str, Any], dict[str, Any]]:
        async with _stdio(env, token) as mcp:
            names = {t.name for t in (await mcp.list_tools()).tools}
            done = _answer(await mcp.call_tool("crm.note.create", _note(p, f"stdio {uuid.uuid4()}")))
            # Refused before it is proposed: the input breaks the action's closed schema.
            bad = await mcp.call_tool("crm.note.create", {"customer_id": p.customer, "target": p.customer})
            assert bad.is_error is True
            return names, done, _answer(bad)
    names, done, bad = asyncio.run(session())
    assert ACTIONS | {STATUS} <= names
    assert done["status"] == "succeeded" and done["receipt"].startswith("crm:note:"), done
    assert len(_effects(p, "note.created", done["operation_id"])) == 1
    assert bad["status"] == "refused" and bad["code"] == "invalid_arguments", bad
    assert "operation_id" not in bad


def test_the_status_tool_answers_the_proposer_and_the_tenants_approvers_from_the_ledger(
        world: tuple[Pipeline, str, dict[str, str]]) -> None:
    # Issue 38's leftovers: only the proposer, an approver or an operator of the tenant is
    # answered; the directory is asked (revoked → refused); an id the ledger does not know is
    # answered at once, without reading any topic from its start.
    p, url, env = world
    token = _token(p)
    asyncio.run(identities.put_principals(p.database_url, p.tenant, {
        "user:carol": ["user"], "user:rex": ["user"]}))

    async def over_http() -> dict[str, Any]:
        async with _http(url, token) as mcp:
            return _answer(await mcp.call_tool("crm.note.create", _note(p, f"asked {uuid.uuid4()}")))
    done = asyncio.run(over_http())
    assert done["status"] == "succeeded", done
    op = done["operation_id"]

    async def ask(token: str, operation_id: str = op) -> dict[str, Any]:
        # A fresh stdio process never submitted it: it reads the ledger.
        async with _stdio(env, token) as mcp:
            return _answer(await mcp.call_tool(STATUS, {"operation_id": operation_id}))
    expected = {"status": "succeeded", "operation_id": op, "receipt": done["receipt"]}
    assert asyncio.run(ask(token)) == expected
    assert asyncio.run(ask(_token(p, "user:bob", ["approver"]))) == expected
    # Another user of the tenant: as if there were no such operation.
    assert asyncio.run(ask(_token(p, "user:carol"))) == {"status": "not_found", "operation_id": op}

    # An id nobody proposed: not_found from the ledger, well within the wait bound (the
    # topics are not read from their start; that took the whole WAIT_S before).
    unknown = str(uuid.uuid4())
    started = time.monotonic()
    assert asyncio.run(ask(token, unknown)) == {"status": "not_found", "operation_id": unknown}
    assert time.monotonic() - started < WAIT_S / 2

    # A revoked principal's still-valid token is refused: HTTP 401, and over stdio an error.
    rex = _token(p, "user:rex")
    assert _raw(url, rex, "tools/call", {"name": STATUS, "arguments": {"operation_id": op}}
                ).status_code == 200
    asyncio.run(_revoke(p, "user:rex"))
    assert _raw(url, rex, "tools/call", {"name": STATUS, "arguments": {"operation_id": op}}
                ).status_code == 401
    refused = asyncio.run(_refused(lambda: _stdio(env, rex), lambda mcp: mcp.list_tools()))
    assert refused.code == types.INVALID_REQUEST


async def _revoke(p: Pipeline, principal: str) -> None:
    conn = await asyncpg.connect(p.database_url)
    try:
        assert await policy_repo.revoke_principal(conn, uuid.UUID(p.tenant), principal)
    finally:
        await conn.close()


def _run_budget(p: Pipeline, principal: str, run: str) -> tuple[list[tuple[Any, ...]], list[str]]:
    """(the run's tool-call budget row, its committed reservations' operation ids)."""
    workflow = str(identity.derive_run_id(uuid.UUID(p.tenant), principal, run))
    conn = psycopg2.connect(p.database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT limit_amount, reserved, used FROM budget WHERE tenant_id = %s"
                        " AND workflow_id = %s AND kind = 'tool_calls'", (p.tenant, workflow))
            budget = list(cur.fetchall())
            cur.execute("SELECT operation_id::text FROM budget_reservation WHERE tenant_id = %s"
                        " AND workflow_id = %s AND state = 'committed'", (p.tenant, workflow))
            return budget, sorted(str(row[0]) for row in cur.fetchall())
    finally:
        conn.close()


def test_calls_naming_one_run_spend_one_budget(world: tuple[Pipeline, str, dict[str, str]]) -> None:
    # Issue 21 item 6: the run comes from the call's _meta, else the session (the HTTP
    # header; on stdio AGENTLEDGER_MCP_RUN); the steps of a run reserve in ONE budget.
    p, url, env = world
    token, run = _token(p), f"mcp-run-{uuid.uuid4().hex[:10]}"
    bad_body = _note(p, f"bad run {uuid.uuid4()}")

    async def calls() -> list[dict[str, Any]]:
        async with _http(url, token) as mcp:
            by_meta = [_answer(await mcp.call_tool("crm.note.create", _note(p, f"{run} meta {n}"),
                                                   meta={runs.META_RUN: run})) for n in range(2)]
        async with _http(url, token, run=run) as mcp:
            by_header = _answer(await mcp.call_tool("crm.note.create", _note(p, f"{run} header")))
            # _meta names another run for this one call.
            elsewhere = _answer(await mcp.call_tool("crm.note.create", _note(p, f"{run} elsewhere"),
                                                    meta={runs.META_RUN: f"{run}-x"}))
        async with _stdio({**env, "AGENTLEDGER_MCP_RUN": run}, token) as mcp:
            by_stdio = _answer(await mcp.call_tool("crm.note.create", _note(p, f"{run} stdio")))
        return [*by_meta, by_header, by_stdio, elsewhere]
    answers = asyncio.run(calls())
    # The budget is spent at admission; an outcome slower than WAIT_S (a loaded box) is not
    # what this test is about, so `in_progress` passes and the ledger is asked to a deadline.
    assert all(a["status"] in ("succeeded", "in_progress") for a in answers), answers
    expected = {run: ([(20, 0, 4)], sorted(a["operation_id"] for a in answers[:4])),
                f"{run}-x": ([(20, 0, 1)], [answers[4]["operation_id"]])}
    assert wait_until(lambda: all(_run_budget(p, "user:alice", name) == rows
                                  for name, rows in expected.items()), timeout=60), (
        {name: _run_budget(p, "user:alice", name) for name in expected})

    # A malformed run is refused before anything is proposed.
    refused = asyncio.run(_refused(lambda: _http(url, token), lambda mcp: mcp.call_tool(
        "crm.note.create", bad_body, meta={runs.META_RUN: "not a run"})))
    assert refused.code == types.INVALID_PARAMS and runs.META_RUN in refused.message
    key = idempotency.derived_key("user:alice", "crm.note.create", bad_body)
    assert p.state(client_mod.operation_id_for(token, key)) is None


def test_a_traceparent_in_meta_parents_the_proposals_trace(world: tuple[Pipeline, str, dict[str, str]]) -> None:
    # Issue 40 item 6: the caller's trace context (MCP `_meta.traceparent`) is the parent of
    # what ingress publishes, whose headers admission's spans continue (tests/e2e/test_traces.py).
    p, url, _ = world
    trace_id = uuid.uuid4().hex
    parent = f"00-{trace_id}-{uuid.uuid4().hex[:16]}-01"

    async def call() -> dict[str, Any]:
        # The caller's context is also its current one, as in an agent that traces: the MCP
        # SDK starts a client span and injects *its* context into `_meta` (SEP-414). That
        # span is a child of the caller's when this process has a tracer provider (one an
        # earlier test installed), and records nothing, injecting nothing, when it has none;
        # either way the trace is the caller's. Without the attach, the outcome would depend
        # on which tests ran before in this process.
        caller = spans.context_from(parent, "agentledger=test")
        assert caller is not None
        token = otel_context.attach(caller)
        try:
            async with _http(url, _token(p)) as mcp:
                return _answer(await mcp.call_tool(
                    "crm.note.create", _note(p, f"traced {uuid.uuid4()}"),
                    meta={"traceparent": parent, "tracestate": "agentledger=test"}))
        finally:
            otel_context.detach(token)
    done = asyncio.run(call())
    assert done["status"] == "succeeded", done
    consumer = Consumer({"bootstrap.servers": p.bootstrap, "group.id": f"trace-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([p.topic("agent.proposals.v1")])
    found: list[dict[str, str]] = []

    def seen() -> bool:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None and json.loads(
                msg.value() or b"null").get("operation_id") == done["operation_id"]:
            found.append({k: v.decode() for k, v in (msg.headers() or []) if isinstance(v, bytes)})
        return bool(found)
    try:
        assert wait_until(seen, timeout=60, interval=0)
    finally:
        consumer.close()
    published = found[0]["traceparent"].split("-")
    assert published[1] == trace_id and published[2] != parent.split("-")[2]  # a child span
    assert found[0]["tracestate"] == "agentledger=test"


def test_a_run_opened_by_its_tool_is_passed_as_an_argument_and_spends_one_budget(
        world: tuple[Pipeline, str, dict[str, str]]) -> None:
    # Issue 40 item 5: runs as handles. The opener answers a handle; calls pass it as their
    # `run` argument; the steps share one budget, and the run does not change the operation.
    p, url, _ = world

    async def calls() -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
        async with _http(url, _token(p)) as mcp:
            opened = _answer(await mcp.call_tool("agentledger_open_run", {}))
            handle = opened["run"]
            notes = [_note(p, f"handle {handle} {n}") for n in range(2)]
            steps = [_answer(await mcp.call_tool("crm.note.create", {**note, "run": handle}))
                     for note in notes]
            # The first call again, in another run: the same operation, nothing spent there.
            again = _answer(await mcp.call_tool("crm.note.create", {**notes[0], "run": f"{handle}-x"}))
            return handle, steps, again
    handle, steps, again = asyncio.run(calls())
    assert all(s["status"] in ("succeeded", "in_progress") for s in steps), steps
    assert again["operation_id"] == steps[0]["operation_id"]
    expected = ([(20, 0, 2)], sorted(s["operation_id"] for s in steps))
    assert wait_until(lambda: _run_budget(p, "user:alice", handle) == expected, timeout=60), (
        _run_budget(p, "user:alice", handle))
    # The replay in the other run reserved nothing (its budget row, if made, is unspent).
    rows, reserved = _run_budget(p, "user:alice", f"{handle}-x")
    assert reserved == [] and all(row[1:] == (0, 0) for row in rows), rows
