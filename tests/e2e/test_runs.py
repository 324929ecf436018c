"""Multi-step runs through the front door (issue 21 item 6): the steps a gateway names as one
run (``AgentLedger-Run``) share the run's tool-call budget (R7) across their HTTP calls.

Before, each call to ingress was its own workflow, so a per-workflow budget never ran out
for a real agent making several calls. Real services: ingress, admission (two tool calls per
workflow), relay, executors, reconciler, over Kafka and PostgreSQL. Assertions are on the
ledger: budget rows and reservations, commands, audit events, not only on the answers.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg2
import pytest

from agentledger import client as client_mod
from agentledger import identity
from agentledger.testing import identities
from agentledger.testing.pipeline import Pipeline, pipeline
from tests.stack import Stack

LIMIT = 2


@pytest.fixture(scope="module")
def world(stack: Stack, database_url: str, make_database: Callable[[], str],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    with pipeline(stack.kafka_bootstrap, database_url, make_database(),
                  tmp_path_factory.mktemp("runs"), ingress=True,
                  env={"admission": {"AGENTLEDGER_ADMISSION_BUDGET_TOOL_CALLS": str(LIMIT)}}) as p:
        # A second agent of the same tenant, who may propose notes like alice.
        asyncio.run(identities.put_principals(database_url, p.tenant, {"user:carol": ["user"]}))
        yield p


def _client(p: Pipeline, principal: str = "user:alice") -> client_mod.GatewayClient:
    assert p.sessions is not None and p.ingress_url
    return client_mod.GatewayClient(
        token=p.sessions.issue(p.tenant, principal, ["user"]), ingress_url=p.ingress_url,
        kafka_bootstrap=p.bootstrap, gateway_topic=p.topic("gateway.proposals.v1"),
        admissions_topic=p.topic("agent.admissions.v1"), outcomes_topic=p.topic("agent.outcomes.v1"))


def _rows(p: Pipeline, query: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(p.database_url)
    try:
        with conn.cursor() as cur:
            cur.execute(query, args)
            return list(cur.fetchall())
    finally:
        conn.close()


def _budget(p: Pipeline, workflow: uuid.UUID) -> list[tuple[Any, ...]]:
    return _rows(p, "SELECT limit_amount, reserved, used FROM budget WHERE tenant_id = %s"
                    " AND workflow_id = %s AND kind = 'tool_calls'", p.tenant, str(workflow))


def _reservations(p: Pipeline, workflow: uuid.UUID) -> list[tuple[str, str]]:
    return sorted(_rows(p, "SELECT operation_id::text, state FROM budget_reservation"
                           " WHERE tenant_id = %s AND workflow_id = %s", p.tenant, str(workflow)))


async def _step(gw: client_mod.GatewayClient, p: Pipeline, body: str, *, run: str | None,
                over_kafka: bool = False) -> tuple[client_mod.Submission, str, str | None]:
    """Submit one note and wait for admission's answer to it: (submission, status, code)."""
    since = datetime.now(UTC)
    arguments = {"customer_id": p.customer, "body": body}
    if over_kafka:
        sub = await gw.publish_proposal("crm.note.create", arguments, p.customer, run=run)
    else:
        sub = await gw.submit_proposal("crm.note.create", arguments, p.customer, run=run)
    found = await gw.await_outcome(sub, since=since, until="admission", timeout_s=60)
    assert found.admission is not None, found
    return sub, found.admission.status, found.admission.reason_code


def test_the_steps_of_one_run_share_its_budget_and_other_runs_do_not(world: Pipeline) -> None:
    p = world
    run = f"triage-{uuid.uuid4().hex[:12]}"
    run_id = identity.derive_run_id(uuid.UUID(p.tenant), "user:alice", run)

    async def steps() -> dict[str, Any]:
        alice, carol = _client(p), _client(p, "user:carol")
        try:
            # Each step waits for its answer: the budget decides in submission order.
            in_run = [await _step(alice, p, f"step {n}", run=run) for n in range(1, LIMIT + 2)]
            # The same run over the Kafka entry: still this run, still exhausted.
            kafka = await _step(alice, p, "step over kafka", run=run, over_kafka=True)
            other = await _step(alice, p, "another task", run=f"{run}-b")
            alone = await _step(alice, p, "no run at all", run=None)
            # Another principal naming the same string: another run, its own budget.
            carols = await _step(carol, p, "carol's step", run=run)
        finally:
            await alice.aclose()
            await carol.aclose()
        return {"in_run": in_run, "kafka": kafka, "other": other, "alone": alone, "carol": carols}

    found = asyncio.run(steps())
    in_run = found["in_run"]
    assert [(status, code) for _, status, code in in_run] == [
        ("admitted", None)] * LIMIT + [("rejected", "budget_exhausted")], in_run
    assert found["kafka"][1:] == ("rejected", "budget_exhausted")
    for name in ("other", "alone", "carol"):
        assert found[name][1:] == ("admitted", None), (name, found[name])
    assert {sub.run_id for sub, _, _ in in_run} == {found["kafka"][0].run_id} == {run_id}
    assert found["alone"][0].run_id is None

    # The ledger: the run's one budget row holds exactly its limit, spent by its first steps.
    assert _budget(p, run_id) == [(LIMIT, 0, LIMIT)]
    admitted = sorted(str(sub.operation_id) for sub, _, _ in in_run[:LIMIT])
    refused = [str(found["kafka"][0].operation_id), str(in_run[-1][0].operation_id)]
    assert _reservations(p, run_id) == [(op, "committed") for op in admitted]
    commands = _rows(p, "SELECT operation_id::text FROM agent_command WHERE operation_id = ANY(%s::uuid[])",
                     admitted + refused)
    assert sorted(op for (op,) in commands) == admitted
    audited = _rows(p, "SELECT operation_id::text FROM audit_event WHERE type = 'budget.exhausted'"
                       " AND operation_id = ANY(%s::uuid[])", admitted + refused)
    assert sorted(op for (op,) in audited) == sorted(refused)

    # Every other run has a budget of its own, with one call spent.
    other_id = identity.derive_run_id(uuid.UUID(p.tenant), "user:alice", f"{run}-b")
    carol_id = identity.derive_run_id(uuid.UUID(p.tenant), "user:carol", run)
    alone = found["alone"][0]
    assert alone.proposal_id is not None  # without a run: the proposal is its own workflow
    for workflow, sub in ((other_id, found["other"][0]), (carol_id, found["carol"][0]),
                          (alone.proposal_id, alone)):
        assert _budget(p, workflow) == [(LIMIT, 0, 1)], workflow
        assert _reservations(p, workflow) == [(str(sub.operation_id), "committed")]
