"""A 600 EUR refund under a 2-of-3 finance rule, end to end (issue 42, R16.2).

Real services as processes — admission with the operator's approval file, the approvals
console, relay, executors, reconciler, the billing stand-in — and the console's JSON API as
the approvers use it: the requester's own approval is refused; one finance approval runs
nothing; the second distinct approver's runs the refund, exactly once (the provider's refunds
counted); the console and ``explain`` show the quorum and who approved.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator

import httpx
import psycopg2
import pytest

from agentledger.testing import identities
from agentledger.testing.pipeline import Pipeline, pipeline
from agentledger.testing.polling import wait_until
from tests.stack import Stack

REFUND = "billing.refund.create"
FINANCE = ["user:fiona", "user:frank", "user:fred"]
APPROVALS = {"format": "agentledger.approvals.v1",
             "groups": {"finance": {"role": "finance-approver", "members": FINANCE}},
             "rules": [{"name": "large-refunds", "action": REFUND, "argument": "amount_minor",
                        "above": 50_000, "group": "finance", "required": 2}]}


@pytest.fixture(scope="module")
def world(stack: Stack, database_url: str, make_database: Callable[[], str],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    config = tmp_path_factory.mktemp("config")
    (config / "approvals.json").write_text(json.dumps(APPROVALS))
    with pipeline(stack.kafka_bootstrap, database_url, make_database(),
                  tmp_path_factory.mktemp("quorum"), console=True,
                  config_env={"AGENTLEDGER_APPROVALS": str(config / "approvals.json")}) as p:
        asyncio.run(identities.put_principals(
            database_url, p.tenant, {m: ["finance-approver"] for m in FINANCE[1:]}))
        yield p


def _one(p: Pipeline, sql: str, *args: object) -> list[tuple[object, ...]]:
    conn = psycopg2.connect(p.database_url)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())
    finally:
        conn.close()


def _refunds(p: Pipeline, invoice: str) -> int:
    conn = psycopg2.connect(p.crm.database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM crm_refund WHERE tenant_id = %s AND invoice_id = %s",
                        (p.tenant, invoice))
            row = cur.fetchone()
            return int(row[0]) if row else 0
    finally:
        conn.close()


def test_two_of_three_approvers_run_a_600_eur_refund_exactly_once(world: Pipeline) -> None:
    p = world
    assert p.sessions is not None and p.console_url
    invoice = f"inv-q-{uuid.uuid4().hex[:8]}"
    op = p.propose(REFUND, {"invoice_id": invoice, "amount_minor": 60_000, "currency": "EUR",
                            "reason": "damaged in transit"})
    assert wait_until(lambda: p.pending_approval(op), timeout=60)
    [(approval_id,)] = _one(p, "SELECT approval_id::text FROM approval_request "
                               "WHERE operation_id = %s", str(op))

    def as_(principal: str, roles: list[str]) -> dict[str, str]:
        assert p.sessions is not None
        return {"Authorization": f"Bearer {p.sessions.issue(p.tenant, principal, roles)}"}

    shown = httpx.get(f"{p.console_url}/api/v1/approvals/{approval_id}",
                      headers=as_("user:fiona", ["finance-approver"]), timeout=30)
    assert shown.status_code == 200, shown.text
    body = shown.json()
    assert body["quorum"] == {"required": 2, "role": "finance-approver",
                              "rule": "large-refunds", "approved_by": []}

    def approve(principal: str, roles: list[str]) -> httpx.Response:
        return httpx.post(f"{p.console_url}/api/v1/approvals/{approval_id}/approve",
                          json={"shown_hash": body["request_hash"], "reason": "invoice checked"},
                          headers=as_(principal, roles), timeout=30)

    # The requester's own approval is refused.
    own = approve("user:alice", ["user", "finance-approver"])
    assert own.status_code == 403, own.text
    # One finance approval: still pending, nothing admitted, nothing run.
    first = approve("user:fiona", ["finance-approver"])
    assert first.status_code == 200 and first.json()["state"] == "pending", first.text
    assert approve("user:fiona", ["finance-approver"]).json()["state"] == "pending"
    assert p.state(op) is None and _refunds(p, invoice) == 0
    # The second distinct approver: approved, admitted, run once.
    second = approve("user:frank", ["finance-approver"])
    assert second.status_code == 200, second.text
    assert (second.json()["state"], second.json()["admitted"]) == ("approved", "admitted")
    p.wait_state(op, "succeeded")
    assert approve("user:fred", ["finance-approver"]).status_code == 409
    assert _refunds(p, invoice) == 1
    assert _one(p, "SELECT approver FROM approval_vote WHERE approval_id = %s ORDER BY voted_at",
                approval_id) == [("user:fiona",), ("user:frank",)]

    explained = httpx.get(f"{p.console_url}/api/v1/operations/{op}/explain",
                          headers=as_("user:fiona", ["finance-approver"]), timeout=30)
    assert explained.status_code == 200, explained.text
    [summary] = explained.json()["permitted"]["approvals"]
    assert (summary["required_approvals"], summary["approved_by"]) == (
        2, ["user:fiona", "user:frank"])
