"""`explain` answers the four questions for every executor scenario, from the audit ledger."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from agentledger import errors
from agentledger.audit import explain as audit_explain
from agentledger.ledger import resolutions
from agentledger.policy import repository as policy_repo
from tests.integration import executor_world
from tests.integration.executor_world import World

NOTE, REFUND, CONTACT = "crm.note.create", "billing.refund.create", "crm.contact.update"
REFUND_ARGS = {"invoice_id": "inv-3", "amount_minor": 4200, "currency": "EUR", "reason": "dented"}


crm, world = executor_world.fixtures()


async def explain(database_url: str, tenant: uuid.UUID, op: uuid.UUID) -> audit_explain.Explanation:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("SET ROLE agentledger_auditor")
        return await audit_explain.explain(conn, tenant, op)
    finally:
        await conn.close()


async def run(world: World, t: object, op: uuid.UUID) -> str:
    worker = world.dispatcher()
    begun = await worker.begin(t.tenant_id, op)  # type: ignore[attr-defined]
    assert begun.claim is not None
    return await worker.complete(begun.claim)


async def test_success(world: World, database_url: str) -> None:
    t = await world.tenant()
    op = await world.admit(t, NOTE, {"body": "hello"})
    assert await run(world, t, op) == "succeeded"
    e = await explain(database_url, t.tenant_id, op)
    assert (e.proposed.action, e.proposed.target, e.proposed.principal) == (NOTE, t.customer_id, "user:alice")
    assert e.proposed.planner == "test"
    assert [(d.stage, d.effect) for d in e.permitted.decisions] == [("admission", "allow"), ("dispatch", "allow")]
    assert [(a.kind, a.result, a.fencing_generation) for a in e.attempted] == [("dispatch", "succeeded", 1)]
    assert e.known.state == "succeeded" and e.known.receipt.startswith("crm:note:")
    assert [x.type for x in e.timeline] == ["command.admitted", "command.claimed", "command.succeeded"]


async def test_lost_response_recovered_by_key(world: World, database_url: str) -> None:
    t = await world.tenant()
    op = await world.admit(t, NOTE, {"body": "lost"})
    await world.crm.arm({"match": {"method": "POST", "path_prefix": "/v1/customers/"},
                         "action": "drop_after_commit", "times": 1})
    assert await run(world, t, op) == "succeeded"
    e = await explain(database_url, t.tenant_id, op)
    assert [(a.kind, a.result) for a in e.attempted] == [("dispatch", "unknown"), ("resend", "succeeded")]
    assert e.known.state == "succeeded"


async def test_unknown_then_reconciled_by_an_operator(world: World, database_url: str) -> None:
    t = await world.tenant()
    op = await world.admit(t, REFUND, REFUND_ARGS)
    await world.crm.arm({"match": {"method": "POST", "path_prefix": "/v1/refunds"},
                         "action": "drop_after_commit", "times": 1})
    assert await run(world, t, op) == "unknown"
    mid = await explain(database_url, t.tenant_id, op)
    assert mid.known.state == "unknown" and mid.known.receipt is None
    async with world.reconciler_pool.acquire() as conn:
        await resolutions.resolve_unknown(conn, t.tenant_id, op, outcome="succeeded", resolved_by="ops:bob",
                                       reason="seen in CRM", receipt="crm:refund:checked", evidence="effect log",
                                       receipt_check="unchecked", check_detail="billing declares no lookup")
    e = await explain(database_url, t.tenant_id, op)
    # Permitted: admission required approval, finance approved it, dispatch re-check allowed.
    effects = [(d.stage, d.effect) for d in e.permitted.decisions]
    # At dispatch the current policy still says "needs approval" — it has one; only a deny stops it.
    assert effects == [("admission", "require_approval"), ("approval", "allow"),
                       ("dispatch", "require_approval")]
    assert [(a.state, a.decided_by) for a in e.permitted.approvals] == [("approved", "user:fiona")]
    assert e.known.state == "succeeded"
    assert [(r.resolved_by, r.outcome) for r in e.known.reconciliations] == [("ops:bob", "succeeded")]
    assert "command.reconciled" in [x.type for x in e.timeline]


async def test_denied_after_revocation(world: World, database_url: str) -> None:
    t = await world.tenant()
    op = await world.admit(t, NOTE, {"body": "revoked"})
    async with world.owner.acquire() as conn:
        await policy_repo.revoke_principal(conn, t.tenant_id, "user:alice")
    assert await run(world, t, op) == "denied"
    e = await explain(database_url, t.tenant_id, op)
    assert [(d.stage, d.effect) for d in e.permitted.decisions][-1] == ("dispatch", "deny")
    assert [a.result for a in e.attempted] == ["denied"]
    assert e.known.state == "denied" and "current policy denies" in e.known.reason


async def test_expired(world: World, database_url: str) -> None:
    t = await world.tenant()
    op = await world.admit(t, NOTE, {"body": "late"})
    async with world.owner.acquire() as conn:
        await conn.execute("UPDATE agent_command SET expires_at = now() - interval '1 second' WHERE operation_id=$1", op)
    assert await run(world, t, op) == "expired"
    e = await explain(database_url, t.tenant_id, op)
    assert e.known.state == "expired" and e.known.reason.startswith("the authorization expired")


async def test_precondition_failed(world: World, database_url: str) -> None:
    t = await world.tenant(email="a@example.com")
    op = await world.admit(t, CONTACT, {"changes": {"email": "b@example.com"}},
                           expected_revision=world.directory[(t.tenant_id, "crm", t.customer_id)])
    await world.crm.customer(str(t.tenant_id), t.customer_id, email="c@example.com")
    assert await run(world, t, op) == "review_required"
    e = await explain(database_url, t.tenant_id, op)
    assert e.known.state == "review_required"
    assert [a.result for a in e.attempted] == ["review_required"]


async def test_other_tenants_and_unknown_operations_explain_nothing(world: World, database_url: str) -> None:
    t = await world.tenant()
    op = await world.admit(t, NOTE, {"body": "mine"})
    with pytest.raises(errors.CommandNotFound):
        await explain(database_url, uuid.uuid4(), op)
    with pytest.raises(errors.CommandNotFound):
        await explain(database_url, t.tenant_id, uuid.uuid4())


async def test_the_audit_ledger_is_append_only(world: World) -> None:
    t = await world.tenant()
    await world.admit(t, NOTE, {"body": "x"})
    async with world.owner.acquire() as conn:
        for statement in ("UPDATE audit_event SET type = 'forged'", "DELETE FROM audit_event"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(statement)
    async with world.pool.acquire() as conn:  # the executor role cannot even insert
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("INSERT INTO audit_event (event_id, tenant_id, type, payload) "
                               "VALUES (gen_random_uuid(), gen_random_uuid(), 'x', '{}')")
