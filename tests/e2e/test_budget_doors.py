"""A principal's money budget holds across both front doors (issue 42, R16.3).

Real services as processes: ingress, admission (with the operator's budget file and a policy
letting refunds up to 100 EUR run unattended), relay, executors, reconciler, the CRM stand-in,
and the MCP server (which proposes through ingress). Forty 100 EUR refunds of one principal go
out at once — twenty through ingress' ``POST /v1/proposals``, twenty as MCP tool calls — named
across ten runs: exactly ten run, the thirty others are refused naming the budget, and the
day's total never passes 1,000.00 EUR.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import httpx2
import psycopg2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from agentledger import client as client_mod
from agentledger import logins
from agentledger.mcp import runs
from agentledger.policy import cedar
from agentledger.testing import processes
from agentledger.testing.pipeline import Pipeline, pipeline
from agentledger.testing.polling import wait_until
from tests.stack import Stack

REFUND = "billing.refund.create"
CAP = "refunds-eur-per-principal-day"
BUDGETS = {"format": "agentledger.budgets.v1", "budgets": [
    {"name": CAP, "scope": "principal", "window": "day", "unit": "amount", "limit": 100_000,
     "actions": [REFUND], "amount_argument": "amount_minor", "currency_argument": "currency",
     "currency": "EUR"}]}
SMALL_REFUNDS = """
@id("small-refunds-unattended")
permit (principal, action == AgentLedger::Action::"perform_unattended", resource)
when {
  context.operation.name == "billing.refund.create" &&
  context.operation has amount_minor && context.operation.amount_minor <= 10000 &&
  principal.roles.contains("user")
};
"""
WAIT_S = 20


@pytest.fixture(scope="module")
def doors(stack: Stack, database_url: str, make_database: Callable[[], str],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Pipeline, str]]:
    config = tmp_path_factory.mktemp("config")
    shutil.copytree(cedar.DEFAULT_DIR, config / "policies")
    (config / "policies" / "30_small_refunds.cedar").write_text(SMALL_REFUNDS)
    (config / "budgets.json").write_text(json.dumps(BUDGETS))
    logs = tmp_path_factory.mktemp("doors")
    with pipeline(stack.kafka_bootstrap, database_url, make_database(), logs, ingress=True,
                  config_env={"AGENTLEDGER_POLICY_DIR": str(config / "policies"),
                              "AGENTLEDGER_BUDGETS": str(config / "budgets.json")}) as p:
        assert p.sessions is not None and p.ingress_url
        port = processes.free_port()
        env = {"AGENTLEDGER_KAFKA_BOOTSTRAP": p.bootstrap,
               "AGENTLEDGER_MCP_INGRESS_URL": p.ingress_url,
               "AGENTLEDGER_MCP_ADMISSIONS_TOPIC": p.topic("agent.admissions.v1"),
               "AGENTLEDGER_MCP_OUTCOMES_TOPIC": p.topic("agent.outcomes.v1"),
               "AGENTLEDGER_MCP_CONSOLE_URL": "http://console.example.test",
               "AGENTLEDGER_MCP_WAIT_S": str(WAIT_S),
               "AGENTLEDGER_MCP_SESSION_KEYS": json.dumps({p.sessions.kid: p.sessions.public_pem}),
               "AGENTLEDGER_MCP_SESSION_ISSUER": p.sessions.issuer,
               "AGENTLEDGER_MCP_SESSION_AUDIENCE": p.sessions.audience,
               "AGENTLEDGER_POLICY_DIR": str(config / "policies"),
               # Its own login (agentledger_auditor): the directory and the ledger, read only.
               "AGENTLEDGER_DATABASE_URL": logins.url_for(p.database_url, "mcp"),
               "AGENTLEDGER_MCP_TRANSPORT": "http", "AGENTLEDGER_MCP_PORT": str(port)}
        with processes.running("agentledger.mcp", env, logs / "mcp.log",
                               ready=processes.http_ok(f"http://127.0.0.1:{port}/healthz")):
            yield p, f"http://127.0.0.1:{port}/mcp"


def _refund(p: Pipeline, n: int) -> dict[str, Any]:
    return {"customer_id": p.customer, "invoice_id": f"inv-door-{n}", "amount_minor": 10_000,
            "currency": "EUR", "reason": "duplicate charge"}


def _ledger(p: Pipeline, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(p.database_url)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())
    finally:
        conn.close()


def test_forty_refunds_through_ingress_and_mcp_admit_exactly_the_days_cap(
        doors: tuple[Pipeline, str]) -> None:
    p, url = doors
    assert p.sessions is not None and p.ingress_url
    token = p.sessions.issue(p.tenant, "user:alice", ["user"])
    names = [f"door-run-{n}" for n in range(10)]

    async def through_ingress(n: int) -> str:
        gateway = client_mod.GatewayClient(token=token, ingress_url=p.ingress_url)
        try:
            submitted = await gateway.submit_proposal(
                REFUND, _refund(p, n), p.customer, idempotency_key=f"door-{n}",
                run=names[n % 10])
        finally:
            await gateway.aclose()
        return str(submitted.operation_id)

    async def through_mcp(n: int) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as h, \
                Client(streamable_http_client(url, http_client=h)) as mcp:
            result = await mcp.call_tool(REFUND, {**_refund(p, n), "target": p.customer},
                                         meta={runs.META_RUN: names[n % 10]})
        assert isinstance(result.structured_content, dict), result
        return result.structured_content

    async def both() -> tuple[list[str], list[dict[str, Any]]]:
        gateway = asyncio.gather(*(through_ingress(n) for n in range(20)))
        mcp = asyncio.gather(*(through_mcp(n) for n in range(20, 40)))
        return await gateway, await mcp

    ingress_ops, mcp_answers = asyncio.run(both())
    mcp_ops = [a["operation_id"] for a in mcp_answers]
    assert len(set(ingress_ops + mcp_ops)) == 40
    # Each door's refusals say which budget refused (MCP: refused + code + message).
    refused_mcp = [a for a in mcp_answers if a["status"] == "rejected"]
    assert refused_mcp and all(a.get("code") == "budget_exhausted" and CAP in a.get("reason", "")
                               for a in refused_mcp), mcp_answers

    def settled() -> bool:
        admitted = _ledger(p, "SELECT count(*) FROM agent_command WHERE tenant_id = %s "
                              "AND action = %s", p.tenant, REFUND)[0][0]
        refused = _ledger(p, "SELECT count(*) FROM audit_event WHERE tenant_id = %s AND "
                             "type = 'budget.exhausted'", p.tenant)[0][0]
        return bool(admitted + refused == 40)
    assert wait_until(settled, timeout=120)
    commands = _ledger(p, "SELECT operation_id::text FROM agent_command WHERE tenant_id = %s "
                          "AND action = %s", p.tenant, REFUND)
    refusals = _ledger(p, "SELECT operation_id::text, payload->>'budget' FROM audit_event "
                          "WHERE tenant_id = %s AND type = 'budget.exhausted'", p.tenant)
    assert (len(commands), len(refusals)) == (10, 30)
    assert {budget for _, budget in refusals} == {CAP}
    admitted_ops = {op for (op,) in commands}
    # Both doors reached the one budget: with 10 admissions among 40, each door of 20 had at
    # least 10 of its proposals refused by it.
    refused_ops = {op for op, _ in refusals}
    assert admitted_ops | refused_ops == set(ingress_ops) | set(mcp_ops)
    assert len(refused_ops & set(ingress_ops)) >= 10 and len(refused_ops & set(mcp_ops)) >= 10
    # No overshoot, and each admitted refund runs once and settles its charge.
    assert wait_until(lambda: _ledger(
        p, "SELECT reserved, used FROM budget_window WHERE tenant_id = %s AND budget = %s",
        p.tenant, CAP) == [(0, 100_000)], timeout=120), _ledger(
        p, "SELECT reserved, used FROM budget_window WHERE tenant_id = %s", p.tenant)
    # The provider's refunds: one per admitted operation's invoice, none for a refused one.
    invoice_of = {op: f"inv-door-{n}" for n, op in enumerate(ingress_ops + mcp_ops)}
    conn = psycopg2.connect(p.crm.database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT invoice_id FROM crm_refund WHERE tenant_id = %s", (p.tenant,))
            refunded = sorted(str(row[0]) for row in cur.fetchall())
    finally:
        conn.close()
    assert refunded == sorted(invoice_of[op] for op in admitted_ops)
