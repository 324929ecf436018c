"""N-of-M approvals (issue 42, R16.2): a 600 EUR refund under a 2-of-3 rule of finance.

Through the real decision path (``approvals.rules.decide``: the directory, Cedar, the request's
row lock) and the real executor on the billing stand-in: the requester's own approval is
refused and never counts; one finance approval executes nothing; the same approver twice
counts once; the second distinct approver admits the command, which runs exactly once (the
provider's refunds counted). One denial denies, whatever approvals came before. ``explain``
shows the quorum and who approved.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from agentledger import errors
from agentledger.approvals import quorum, rules
from agentledger.approvals import repository as approvals
from agentledger.audit import explain as audit_explain
from agentledger.contracts.proposals import ProposalV1
from agentledger.ledger import keys
from agentledger.policy import repository as policy_repo
from tests.integration import executor_world
from tests.integration.executor_world import RULES, Tenant, World

crm, world = executor_world.fixtures()

REFUND = "billing.refund.create"
FINANCE = ("user:fiona", "user:frank", "user:fred")
APPROVAL_RULES = quorum.ApprovalRules.parse({
    "format": quorum.FILE_FORMAT,
    "groups": {"finance": {"role": "finance-approver", "members": list(FINANCE)}},
    "rules": [{"name": "large-refunds", "action": REFUND, "argument": "amount_minor",
               "above": 50_000, "group": "finance", "required": 2}]})


async def _pending(w: World, t: Tenant, amount: int) -> tuple[uuid.UUID, uuid.UUID]:
    async with w.owner.acquire() as conn:
        for member in FINANCE[1:]:
            await policy_repo.put_principal(conn, t.tenant_id, member, ["finance-approver"])
    admitter = w.admitter()
    admitter.approval_rules = APPROVAL_RULES
    op = uuid.uuid4()
    result = await admitter.admit(ProposalV1.model_validate({
        "schema": "agentledger.proposal.v1", "proposal_id": str(uuid.uuid4()),
        "tenant_id": str(t.tenant_id), "principal_id": "user:alice", "operation_id": str(op),
        "action": REFUND, "target": t.customer_id, "planner": {"name": "scripted"},
        "arguments": {"customer_id": t.customer_id, "invoice_id": f"inv-{op.hex[:8]}",
                      "amount_minor": amount, "currency": "EUR", "reason": "damaged"},
        "created_at": datetime.now(UTC).isoformat()}))
    assert result.status == "pending_approval" and result.approval_id is not None, result
    return op, result.approval_id


async def _decide(w: World, t: Tenant, approval_id: uuid.UUID, approver: str, *,
                  approve: bool = True) -> tuple[approvals.Approval, object]:
    async def no_revision(_: approvals.Approval) -> str | None:
        return None

    async with w.admission_pool.acquire() as conn:
        pending = await approvals.get(conn, t.tenant_id, approval_id)
        return await rules.decide(
            conn, authorizer=w.authorizer, allowlist=RULES, cipher=keys.PayloadCipher(w.master),
            revision=no_revision, tenant_id=t.tenant_id, approver_id=approver,
            approval_id=approval_id, approve=approve, shown_hash=pending.hash_hex,
            reason="checked the invoice")


async def _ledger(w: World, t: Tenant, op: uuid.UUID, approval_id: uuid.UUID
                  ) -> tuple[int, list[str]]:
    async with w.owner.acquire() as conn:
        commands = await conn.fetchval("SELECT count(*) FROM agent_command WHERE tenant_id = $1 "
                                       "AND operation_id = $2", t.tenant_id, op)
        votes = await conn.fetch("SELECT approver FROM approval_vote WHERE approval_id = $1 "
                                 "ORDER BY voted_at, approver", approval_id)
    return int(commands), [v["approver"] for v in votes]


async def test_two_of_three_finance_approvers_run_a_600_eur_refund_exactly_once(
        world: World) -> None:
    t = await world.tenant()
    op, approval_id = await _pending(world, t, 60_000)
    async with world.admission_pool.acquire() as conn:
        request = await approvals.get(conn, t.tenant_id, approval_id)
    assert (request.required_approvals, request.approver_role, request.quorum_rule) == (
        2, "finance-approver", "large-refunds")

    # The requester's own approval is refused, and counts for nothing.
    with pytest.raises(errors.AgentLedgerError) as own:
        await _decide(world, t, approval_id, "user:alice")
    assert own.value.code in ("policy_denied", "not_an_approver"), own.value
    assert await _ledger(world, t, op, approval_id) == (0, [])

    # One finance approval: still pending, no command, nothing run.
    first, admitted = await _decide(world, t, approval_id, "user:fiona")
    assert (first.state, admitted) == ("pending", None)
    # The same person again counts once.
    again, admitted = await _decide(world, t, approval_id, "user:fiona")
    assert (again.state, admitted) == ("pending", None)
    assert await _ledger(world, t, op, approval_id) == (0, ["user:fiona"])
    assert await world.effects(t, "refund.created") == []

    # The second distinct approver: approved, admitted, and it runs once.
    second, admitted = await _decide(world, t, approval_id, "user:frank")
    assert second.state == "approved" and admitted is not None
    assert await _ledger(world, t, op, approval_id) == (1, ["user:fiona", "user:frank"])
    worker = world.dispatcher()
    begun = await worker.begin(t.tenant_id, op)
    assert begun.claim is not None
    assert await worker.complete(begun.claim) == "succeeded"
    # A third approval changes nothing: the request is decided, the refund not repeated.
    with pytest.raises(errors.InvalidTransition):
        await _decide(world, t, approval_id, "user:fred")
    assert len(await world.effects(t, "refund.created")) == 1
    assert (await world.row(t, op))["state"] == "succeeded"

    async with world.owner.acquire() as conn:
        audited = [r["type"] for r in await conn.fetch(
            "SELECT type FROM audit_event WHERE operation_id = $1 AND type LIKE 'approval.%' "
            "ORDER BY seq", op)]
        await conn.execute("SET ROLE agentledger_auditor")
        try:
            found = await audit_explain.explain(conn, t.tenant_id, op)
        finally:
            await conn.execute("RESET ROLE")
    assert audited == ["approval.requested", "approval.vote", "approval.vote",
                       "approval.approved"]
    [summary] = found.permitted.approvals
    assert (summary.required_approvals, summary.approver_role, summary.approved_by) == (
        2, "finance-approver", ["user:fiona", "user:frank"])


async def test_one_denial_denies_whatever_approvals_came_before(world: World) -> None:
    t = await world.tenant()
    op, approval_id = await _pending(world, t, 60_000)
    first, _ = await _decide(world, t, approval_id, "user:fiona")
    assert first.state == "pending"
    denied, admitted = await _decide(world, t, approval_id, "user:fred", approve=False)
    assert (denied.state, admitted) == ("denied", None)
    with pytest.raises(errors.InvalidTransition):
        await _decide(world, t, approval_id, "user:frank")
    assert await _ledger(world, t, op, approval_id) == (0, ["user:fiona"])


async def test_an_approver_without_the_role_does_not_count(world: World) -> None:
    t = await world.tenant()
    op, approval_id = await _pending(world, t, 60_000)
    # bob approves ordinary requests; this one needs finance (Cedar and the quorum's role).
    with pytest.raises(errors.PolicyDenied):
        await _decide(world, t, approval_id, "user:bob")
    assert await _ledger(world, t, op, approval_id) == (0, [])


async def test_below_the_threshold_one_approver_is_enough(world: World) -> None:
    t = await world.tenant()
    op, approval_id = await _pending(world, t, 40_000)
    decided, admitted = await _decide(world, t, approval_id, "user:fiona")
    assert decided.state == "approved" and admitted is not None
    assert decided.required_approvals == 1
    assert await _ledger(world, t, op, approval_id) == (1, [])
