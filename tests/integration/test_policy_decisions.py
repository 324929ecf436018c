"""Policy decisions are persisted per tenant, and principal data changes the next decision."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from agentledger import errors
from agentledger.ledger import repository
from agentledger.policy import allowlist, cedar
from agentledger.policy import repository as policy_store
from tests.integration.conftest import AsRole

POLICY = cedar.CedarPolicy()
NOTE = allowlist.Allowlist.load().get("crm.note.create")



async def _decide_and_record(
    conn: asyncpg.Connection, tenant: uuid.UUID, operation_id: uuid.UUID, *, stage: str = "admission"
) -> cedar.CedarDecision:
    directory = policy_store.PostgresPrincipalDirectory(conn)
    decision = await POLICY.authorize(directory, tenant_id=tenant, principal_id="alice",
                                      action=NOTE, resource_id="cust-1")
    async with repository.transaction(conn, tenant) as tx:
        await policy_store.record_decision(
            tx, decision, tenant_id=tenant, principal_id="alice", action=NOTE.name,
            resource_id="cust-1", operation_id=operation_id, stage=stage,  # type: ignore[arg-type]
        )
    return decision


async def test_admission_records_decisions_that_only_its_tenant_reads(
    db: asyncpg.Connection, as_role: AsRole
) -> None:
    tenant, other, op = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await policy_store.put_principal(db, tenant, "alice", ["user"])
    admission = await as_role("agentledger_admission")

    decision = await _decide_and_record(admission, tenant, op)
    assert decision.effect == "allow"

    recorded = await policy_store.decisions_for(admission, tenant, op)
    assert len(recorded) == 1
    r = recorded[0]
    assert (r.decision_id, r.effect, r.policy_version, r.reasons, r.stage, r.operation_id) == (
        decision.decision_id, "allow", POLICY.version, ("low-risk-auto-approved",), "admission", op)
    assert (r.tenant_id, r.principal_id, r.action, r.resource_id) == (
        tenant, "alice", NOTE.name, "cust-1")

    for role in ("agentledger_admission", "agentledger_executor", "agentledger_auditor"):
        conn = await as_role(role)
        assert len(await policy_store.decisions_for(conn, tenant, op)) == 1, role
        assert await policy_store.decisions_for(conn, other, op) == [], role
        async with repository.transaction(conn, None) as tx:
            assert await tx.fetchval("SELECT count(*) FROM policy_decision") == 0, role


async def test_a_decision_is_written_in_the_callers_transaction(
    db: asyncpg.Connection, as_role: AsRole
) -> None:
    tenant, op = uuid.uuid4(), uuid.uuid4()
    admission = await as_role("agentledger_admission")
    decision = POLICY.decide(tenant_id=tenant, principal_id="alice", action=NOTE,
                             resource_id="cust-1")
    with pytest.raises(RuntimeError):
        async with repository.transaction(admission, tenant) as tx:
            await policy_store.record_decision(
                tx, decision, tenant_id=tenant, principal_id="alice", action=NOTE.name,
                resource_id="cust-1", operation_id=op)
            raise RuntimeError("the admission failed after deciding")
    assert await policy_store.decisions_for(admission, tenant, op) == []

    # Recording the same decision again (a retried transaction) keeps one record.
    for _ in range(2):
        async with repository.transaction(admission, tenant) as tx:
            await policy_store.record_decision(
                tx, decision, tenant_id=tenant, principal_id="alice", action=NOTE.name,
                resource_id="cust-1", operation_id=op)
    [r] = await policy_store.decisions_for(admission, tenant, op)
    assert (r.effect, r.reasons) == ("deny", ())


async def test_decisions_are_append_only_and_tenant_checked(
    db: asyncpg.Connection, as_role: AsRole
) -> None:
    tenant, op = uuid.uuid4(), uuid.uuid4()
    await policy_store.put_principal(db, tenant, "alice", ["user"])
    executor = await as_role("agentledger_executor")
    await _decide_and_record(executor, tenant, op, stage="dispatch")
    for statement in ("UPDATE policy_decision SET effect = 'allow'", "DELETE FROM policy_decision"):
        with pytest.raises(errors.AccessDenied):
            async with repository.transaction(executor, tenant) as tx:
                await tx.execute(statement)
    # Bound to one tenant, a decision claiming another is refused by row security.
    decision = POLICY.decide(tenant_id=tenant, principal_id="alice", action=NOTE, resource_id="c")
    with pytest.raises(errors.AccessDenied):
        async with repository.transaction(executor, uuid.uuid4()) as tx:
            await policy_store.record_decision(tx, decision, tenant_id=tenant,
                                               principal_id="alice", action=NOTE.name,
                                               resource_id="c")
    auditor = await as_role("agentledger_auditor")
    with pytest.raises(errors.AccessDenied):
        async with repository.transaction(auditor, tenant) as tx:
            await policy_store.record_decision(tx, decision, tenant_id=tenant,
                                               principal_id="alice", action=NOTE.name,
                                               resource_id="c")


async def test_revoking_a_principal_flips_the_next_evaluation_to_deny(
    db: asyncpg.Connection, as_role: AsRole
) -> None:
    tenant, op = uuid.uuid4(), uuid.uuid4()
    await policy_store.put_principal(db, tenant, "alice", ["user"])
    admission = await as_role("agentledger_admission")
    executor = await as_role("agentledger_executor")

    assert (await _decide_and_record(admission, tenant, op)).effect == "allow"
    # Queued: the command waits for dispatch while an operator revokes alice.
    assert await policy_store.revoke_principal(db, tenant, "alice")
    assert not await policy_store.revoke_principal(db, tenant, "nobody")
    at_dispatch = await _decide_and_record(executor, tenant, op, stage="dispatch")
    assert (at_dispatch.effect, at_dispatch.reasons) == ("deny", ("revoked-principal",))

    history = await policy_store.decisions_for(admission, tenant, op)
    assert [(d.stage, d.effect) for d in history] == [("admission", "allow"), ("dispatch", "deny")]

    # Reinstating is a data change too.
    await policy_store.put_principal(db, tenant, "alice", ["user"])
    assert (await _decide_and_record(executor, tenant, op, stage="dispatch")).effect == "allow"


async def test_principals_are_read_per_tenant_and_written_by_no_service(
    db: asyncpg.Connection, as_role: AsRole
) -> None:
    tenant = uuid.uuid4()
    await policy_store.put_principal(db, tenant, "alice", ["user", "approver"])
    executor = await as_role("agentledger_executor")
    directory = policy_store.PostgresPrincipalDirectory(executor)
    found = await directory.lookup(tenant, "alice")
    assert found == cedar.Principal(tenant, "alice", frozenset({"user", "approver"}))
    # Another tenant's binding hides the row even when asked by its key.
    async with repository.transaction(executor, uuid.uuid4()) as tx:
        assert await tx.fetchval("SELECT count(*) FROM principal") == 0
    assert await directory.lookup(uuid.uuid4(), "alice") is None

    for role in ("agentledger_admission", "agentledger_executor", "agentledger_planner",
                 "agentledger_auditor"):
        conn = await as_role(role)
        with pytest.raises(errors.AccessDenied):
            await policy_store.put_principal(conn, tenant, "mallory", ["finance-approver"])
        with pytest.raises(errors.AccessDenied):
            await policy_store.revoke_principal(conn, tenant, "alice")
    assert (await directory.lookup(tenant, "alice")) == found
    assert await directory.lookup(tenant, "mallory") is None
