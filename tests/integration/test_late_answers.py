"""Fencing that reaches the provider, and a late answer never dropped (issue 37), on the real
ledger and the real CRM, through the executor, the reconciler and `reconcile resolve`.

The scenario of the issue: a billing worker stalls after its pre-call check, just before its
request leaves (``executor.before_call``). Its lease runs out; the reconciler takes the
refund over and records ``unknown`` (refunds have no lookup); an operator resolves it
``failed``. Then the worker resumes and sends with its old generation. On 85a9f05 the CRM
applied that refund, the worker dropped the answer, and the ledger said ``failed`` with one
refund at the provider and nothing anywhere saying so.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from typer.testing import CliRunner

from agentledger import cli, errors, faults
from agentledger.audit import explain as audit_explain
from agentledger.connectors import crm as crm_connectors
from agentledger.ledger import dispatch, late
from agentledger.testing import identities
from tests.conftest import Points
from tests.integration import executor_world
from tests.integration.executor_world import Tenant, World
from tests.integration.test_resolution import run_resolve, tenant

REFUND = "billing.refund.create"

crm, world = executor_world.fixtures()


class StallOnce:
    """Stands in for ``faults.point``: the first pass of ``point`` stalls until released (a
    GC pause, a frozen VM); every other point and pass goes through."""

    def __init__(self, point: str) -> None:
        self.point = point
        self.reached, self.release = asyncio.Event(), asyncio.Event()

    async def __call__(self, name: str) -> None:
        if name == self.point and not self.reached.is_set():
            self.reached.set()
            await self.release.wait()


async def _refund(world: World, t: Tenant) -> uuid.UUID:
    return await world.admit(t, REFUND, {"invoice_id": f"inv-{uuid.uuid4().hex[:6]}",
                                         "amount_minor": 4200, "currency": "EUR",
                                         "reason": "stalled worker"})


async def _stalled(world: World, t: Tenant, op: uuid.UUID, gate: StallOnce
                   ) -> asyncio.Task[str]:
    """Worker ``stalled`` claims ``op`` and runs until the gate holds it."""
    worker = world.dispatcher("stalled")
    held = (await worker.begin(t.tenant_id, op)).claim
    assert held is not None
    task = asyncio.create_task(worker.complete(held))
    await asyncio.wait_for(gate.reached.wait(), timeout=30)
    return task


async def _time_passes(world: World, op: uuid.UUID) -> None:
    """The stall outlasts the lease, the call bound after it and the resolution's acting
    window: what a minute of a frozen VM does, written to the ledger instead of waited."""
    async with world.owner.acquire() as conn:
        await conn.execute("UPDATE agent_command SET lease_until = now() - interval '2 minutes'"
                           " WHERE operation_id = $1", op)
        await conn.execute("UPDATE command_attempt SET sent_at = now() - interval '2 minutes'"
                           " WHERE operation_id = $1 AND sent_at IS NOT NULL", op)


async def _events(world: World, op: uuid.UUID, kind: str) -> list[dict[str, Any]]:
    async with world.owner.acquire() as conn:
        rows = await conn.fetch("SELECT payload::text FROM audit_event WHERE operation_id = $1 "
                                "AND type = $2 ORDER BY seq", op, kind)
    return [json.loads(r[0]) for r in rows]


async def _explained(world: World, t: Tenant, op: uuid.UUID) -> audit_explain.Explanation:
    async with world.owner.acquire() as conn:
        await conn.execute("SET ROLE agentledger_auditor")
        try:
            return await audit_explain.explain(conn, t.tenant_id, op)
        finally:
            await conn.execute("RESET ROLE")


async def _resolve_failed(world: World, database_url: str, t: Tenant, op: uuid.UUID,
                          connectors: dict[str, Any] | None = None) -> None:
    """`reconcile resolve --outcome failed` as the operator; ``connectors``: the deployment's
    AGENTLEDGER_CONNECTORS, the same the executor and reconciler run with."""
    env = {**identities.operator_env(database_url, world.crm.url, world.lookup_tokens),
           "AGENTLEDGER_TOKEN": None,
           "AGENTLEDGER_CONNECTORS": json.dumps(connectors) if connectors else None}
    done = await asyncio.to_thread(CliRunner().invoke, cli.app, [
        "reconcile", "resolve", str(op), "--token",
        identities.session_token(t.tenant_id, identities.OPERATOR), "--outcome", "failed",
        "--reason", "finance found no refund at the provider",
        "--evidence", "billing dashboard, 10:42"], env=env)
    assert done.exit_code == 0, done.output


async def test_a_fencing_provider_refuses_the_late_refund(
    world: World, database_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    t = await tenant(world)
    op = await _refund(world, t)
    gate = StallOnce("executor.before_call")
    monkeypatch.setattr(faults, "point", gate)
    stale = await _stalled(world, t, op, gate)
    try:
        await _time_passes(world, op)
        assert (await world.reconciler().sweep())[op] == "unknown"
        # The take-over advanced the provider's fence before it recorded anything.
        (fenced,) = await _events(world, op, "command.fence_advanced")
        assert fenced["fencing_generation"] == 2
        row = await world.row(t, op)
        assert row["state"] == "unknown"
        assert "fence was advanced to generation 2" in row["outcome_reason"], row["outcome_reason"]

        await _resolve_failed(world, database_url, t, op)
        row = await world.row(t, op)
        assert (row["state"], row["fencing_generation"]) == ("failed", 3)  # fenced again
        assert [e["fencing_generation"] for e in await _events(
            world, op, "command.fence_advanced")] == [2, 3]
        async with world.owner.acquire() as conn:
            provisional = await conn.fetchval(
                "SELECT provisional FROM command_resolution WHERE operation_id = $1", op)
        assert provisional is False  # fenced: no late call can land

        gate.release.set()  # the worker resumes and sends with generation 1
        with pytest.raises(errors.StaleClaim, match="fencing token"):
            await asyncio.wait_for(stale, timeout=30)
    finally:
        gate.release.set()

    assert await world.effects(t, "refund.created") == []  # the provider refused it
    row = await world.row(t, op)
    assert (row["state"], row["contradicted_at"]) == ("failed", None)
    async with world.owner.acquire() as conn:
        tried = await dispatch.attempts(conn, t.tenant_id, op)
    mine = next(a for a in tried if a["worker_id"] == "stalled")
    assert (mine["result"], mine["late_answer"]) == ("fenced", "fenced")  # recorded, not dropped
    (said,) = await _events(world, op, "command.late_answer")
    assert (said["answer"], said["disposition"], said["state"]) == ("fenced", "recorded", "failed")


async def test_a_provider_that_cannot_fence_has_the_late_effect_recorded_and_flagged(
    world: World, database_url: str, monkeypatch: pytest.MonkeyPatch,
    recorded: Callable[[str], Points],
) -> None:
    contradictions, late_answers = recorded("contradictions"), recorded("late_answers")
    # A billing provider that can neither fence nor refuse a late request.
    unfenced = {"crm": {"url": world.crm.url},
                "billing": {"url": world.crm.url, "fencing": False, "deadline": False}}
    await world.connectors["billing"].aclose()
    world.connectors["billing"] = crm_connectors.billing(unfenced["billing"])
    t = await tenant(world)
    op = await _refund(world, t)
    gate = StallOnce("executor.before_call")
    monkeypatch.setattr(faults, "point", gate)
    stale = await _stalled(world, t, op, gate)
    try:
        await _time_passes(world, op)
        assert (await world.reconciler().sweep())[op] == "unknown"
        assert await _events(world, op, "command.fence_advanced") == []
        assert "cannot be fenced" in (await world.row(t, op))["outcome_reason"]

        await _resolve_failed(world, database_url, t, op, unfenced)
        async with world.owner.acquire() as conn:
            resolution = await conn.fetchrow(
                "SELECT provisional, reason FROM command_resolution WHERE operation_id = $1", op)
        assert resolution["provisional"] is True
        assert resolution["reason"].startswith("[PROVISIONAL: a late call may still land"), (
            resolution["reason"])

        gate.release.set()  # the stalled request lands: the refund is applied
        with pytest.raises(errors.StaleClaim):
            await asyncio.wait_for(stale, timeout=30)
    finally:
        gate.release.set()

    assert len(await world.effects(t, "refund.created")) == 1
    row = await world.row(t, op)
    # Never `failed` + an effect + silence: the state stays what was resolved, and the
    # contradiction is on the command, in the audit trail, in a metric and in explain.
    assert row["state"] == "failed" and row["contradicted_at"] is not None
    assert "after the command was recorded failed" in row["contradiction"], row["contradiction"]
    (contradicted,) = await _events(world, op, "command.contradicted")
    assert contradicted["state"] == "failed"
    assert contradicted["provider_receipt"].startswith("crm:refund:")
    assert contradictions() == {(("connector", "billing"),): 1}
    assert late_answers() == {(("connector", "billing"), ("outcome", "applied")): 1}
    explained = await _explained(world, t, op)
    assert explained.known.state == "failed" and explained.known.contradiction == row["contradiction"]
    assert explained.known.reconciliations[0].provisional is True
    mine = next(a for a in explained.attempted if a.worker_id == "stalled")
    assert (mine.late_answer, mine.result) == ("applied", "late")
    assert mine.late_receipt == contradicted["provider_receipt"]
    # The sweep finds nothing left to weigh: the record already marked it.
    assert op not in await world.reconciler().sweep()


async def test_a_late_applied_answer_settles_an_unknown_command(
    world: World, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Paused between the provider's answer and its record: the answer arrives late.
    t = await tenant(world)
    op = await _refund(world, t)
    gate = StallOnce("executor.after_remote_write")
    monkeypatch.setattr(faults, "point", gate)
    stale = await _stalled(world, t, op, gate)
    try:
        await _time_passes(world, op)
        assert (await world.reconciler().sweep())[op] == "unknown"
        gate.release.set()
        with pytest.raises(errors.StaleClaim):
            await asyncio.wait_for(stale, timeout=30)
    finally:
        gate.release.set()

    assert len(await world.effects(t, "refund.created")) == 1  # applied once, and now known
    row = await world.row(t, op)
    assert row["state"] == "succeeded" and row["provider_receipt"].startswith("crm:refund:")
    assert "settled by the provider's late answer" in row["outcome_reason"]
    assert row["contradicted_at"] is None
    (settled,) = await _events(world, op, "command.succeeded")
    assert (settled["settled_by"], settled["fencing_generation"]) == ("late_answer", 1)


async def test_the_sweep_weighs_a_late_answer_that_crossed_a_decision(world: World) -> None:
    # The late answer is recorded while the reconciler holds the command (it cannot settle
    # it then); the reconciler then records `unknown`. The next sweep settles it.
    t = await tenant(world)
    op = await _refund(world, t)
    worker = world.dispatcher("slow")
    held = (await worker.begin(t.tenant_id, op)).claim
    assert held is not None
    async with world.pool.acquire() as conn:
        await dispatch.mark_sending(conn, held, call_s=1.0)
    async with world.owner.acquire() as conn:
        await conn.execute("UPDATE agent_command SET lease_until = now() - interval '1 minute' "
                           "WHERE operation_id = $1", op)
    async with world.reconciler_pool.acquire() as conn:
        taken = await dispatch.claim(conn, t.tenant_id, op, worker_id="reconciler-1",
                                     lease_s=30, take_over=True, kind="resend")
    assert taken is not None
    async with world.pool.acquire() as conn:
        weighed = await late.record(conn, t.tenant_id, op, held.attempt_id,
                                    late.Answer("applied", "201", receipt="crm:refund:r-late"),
                                    worker_id="slow")
    assert weighed.disposition == "recorded" and weighed.state == "dispatching"
    async with world.reconciler_pool.acquire() as conn:
        await dispatch.finalize(conn, taken, "unknown", reason="no answer")
    assert (await world.reconciler().sweep())[op] == "settled"
    row = await world.row(t, op)
    assert (row["state"], row["provider_receipt"]) == ("succeeded", "crm:refund:r-late")


async def test_a_resolution_contradicting_a_recorded_late_answer_is_refused(
    world: World, database_url: str,
) -> None:
    t = await tenant(world)
    op = await _refund(world, t)
    worker = world.dispatcher("slow")
    held = (await worker.begin(t.tenant_id, op)).claim
    assert held is not None
    async with world.pool.acquire() as conn:
        await dispatch.mark_sending(conn, held, call_s=1.0)
        await dispatch.finalize(conn, held, "unknown", reason="no answer in time")
    # Its answer came after all and is on the attempt, the command still `unknown` (as when
    # the record crossed an operator's check; the sweep would settle it next period).
    async with world.owner.acquire() as conn:
        await conn.execute(
            "UPDATE command_attempt SET late_answer = 'applied', late_receipt = 'crm:refund:r-9', "
            "late_at = now() WHERE attempt_id = $1", held.attempt_id)
        await conn.execute("UPDATE command_attempt SET sent_at = now() - interval '2 minutes' "
                           "WHERE attempt_id = $1", held.attempt_id)
    token = identities.session_token(t.tenant_id, identities.OPERATOR)
    refused = await run_resolve(world, database_url, op, token, "--outcome", "failed",
                                "--reason", "looks failed")
    assert refused.exit_code == 2 and "receipt_contradicted" in refused.output, refused.output
    assert (await world.row(t, op))["state"] == "unknown"
    confirmed = await run_resolve(world, database_url, op, token, "--outcome", "succeeded",
                                  "--receipt", "crm:refund:r-9", "--reason", "the late answer")
    assert confirmed.exit_code == 0, confirmed.output
    row = await world.row(t, op)
    assert row["state"] == "succeeded" and row["outcome_reason"].startswith("[confirmed:")
