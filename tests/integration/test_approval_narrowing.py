"""Narrow-only edits (issue 42, item 4): a 600 EUR refund narrowed to 400 runs 400, once.

Through the real decision path (``approvals.narrowing.narrow``: the directory, Cedar's
admission and ``approve`` questions on the narrowed arguments, the original's row lock,
``approvals.decide``) and the real executor on the billing stand-in. Under the rule "above
500 EUR needs 2 finance approvers", a finance approver narrows 600 → 400: the narrowed request
needs one approver, so it is approved in the same step; its command runs once and the provider
holds one refund of 400 and none of 600. The original closes ``narrowed`` and never runs;
``explain`` shows the link both ways. A widening (600 → 700), an edit of a field that may not
narrow, and the requester's own narrowing are refused and change nothing. The budget charge
follows the narrowed amount.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from agentledger import errors
from agentledger.approvals import narrowing, quorum, rules
from agentledger.approvals import repository as approvals
from agentledger.audit import explain as audit_explain
from agentledger.budgets import rules as budget_rules
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
CAP = "refunds-eur-per-principal-day"
BUDGETS = budget_rules.Budgets.parse({
    "format": "agentledger.budgets.v1",
    "budgets": [{"name": CAP, "scope": "principal", "window": "day", "unit": "amount",
                 "limit": 1_000_000, "actions": [REFUND], "amount_argument": "amount_minor",
                 "currency_argument": "currency", "currency": "EUR"}]})


async def _pending(w: World, t: Tenant, amount: int) -> tuple[uuid.UUID, uuid.UUID,
                                                             dict[str, Any]]:
    async with w.owner.acquire() as conn:
        for member in FINANCE[1:]:
            await policy_repo.put_principal(conn, t.tenant_id, member, ["finance-approver"])
    admitter = w.admitter()
    admitter.approval_rules = APPROVAL_RULES
    admitter.budget_rules = BUDGETS
    op = uuid.uuid4()
    arguments = {"customer_id": t.customer_id, "invoice_id": f"inv-{op.hex[:8]}",
                 "amount_minor": amount, "currency": "EUR", "reason": "damaged"}
    result = await admitter.admit(ProposalV1.model_validate({
        "schema": "agentledger.proposal.v1", "proposal_id": str(uuid.uuid4()),
        "tenant_id": str(t.tenant_id), "principal_id": "user:alice", "operation_id": str(op),
        "action": REFUND, "target": t.customer_id, "planner": {"name": "scripted"},
        "arguments": arguments, "created_at": datetime.now(UTC).isoformat()}))
    assert result.status == "pending_approval" and result.approval_id is not None, result
    return op, result.approval_id, arguments


async def _narrow(w: World, t: Tenant, approval_id: uuid.UUID, approver: str,
                  arguments: dict[str, Any]) -> narrowing.Narrowed:
    async def no_revision(_: approvals.Approval) -> str | None:
        return None

    async with w.admission_pool.acquire() as conn:
        original = await approvals.get(conn, t.tenant_id, approval_id)
        return await narrowing.narrow(
            conn, authorizer=w.authorizer, allowlist=RULES, cipher=keys.PayloadCipher(w.master),
            revision=no_revision, approval_rules=APPROVAL_RULES, budgets=BUDGETS,
            tenant_id=t.tenant_id, approver_id=approver, approval_id=approval_id,
            shown_hash=original.hash_hex, arguments=arguments, reason="partial refund agreed")


async def _refunds(w: World, t: Tenant) -> list[tuple[int, str]]:
    """The refunds the billing stand-in holds for the tenant (its own database)."""
    conn = await asyncpg.connect(w.crm.database_url)
    try:
        rows = await conn.fetch("SELECT amount_cents, currency FROM crm_refund "
                                "WHERE tenant_id = $1 ORDER BY created_at", str(t.tenant_id))
    finally:
        await conn.close()
    return [(r["amount_cents"], r["currency"]) for r in rows]


async def _decide(w: World, t: Tenant, approval_id: uuid.UUID, approver: str
                  ) -> tuple[approvals.Approval, object]:
    async def no_revision(_: approvals.Approval) -> str | None:
        return None

    async with w.admission_pool.acquire() as conn:
        pending = await approvals.get(conn, t.tenant_id, approval_id)
        return await rules.decide(
            conn, authorizer=w.authorizer, allowlist=RULES, cipher=keys.PayloadCipher(w.master),
            revision=no_revision, tenant_id=t.tenant_id, approver_id=approver,
            approval_id=approval_id, approve=True, shown_hash=pending.hash_hex,
            reason="checked the invoice")


async def _state(w: World, t: Tenant, op: uuid.UUID) -> dict[str, Any]:
    """Requests, commands, live budget charges and approval audit events of the intent."""
    async with w.owner.acquire() as conn:
        requests = await conn.fetch(
            "SELECT approval_id, state, narrowed_from FROM approval_request "
            "WHERE tenant_id = $1 AND operation_id = $2 ORDER BY created_at", t.tenant_id, op)
        commands = await conn.fetchval("SELECT count(*) FROM agent_command WHERE tenant_id = $1 "
                                       "AND operation_id = $2", t.tenant_id, op)
        charges = await conn.fetch(
            "SELECT amount, state FROM budget_charge WHERE tenant_id = $1 AND operation_id = $2 "
            "ORDER BY created_at, state", t.tenant_id, op)
        reserved = await conn.fetchval(
            "SELECT coalesce(sum(reserved), 0) FROM budget_window WHERE tenant_id = $1",
            t.tenant_id)
        events = await conn.fetch(
            "SELECT type, payload FROM audit_event WHERE tenant_id = $1 AND operation_id = $2 "
            "AND type LIKE 'approval.%' ORDER BY seq", t.tenant_id, op)
    return {"requests": [(r["state"], r["narrowed_from"]) for r in requests],
            "commands": int(commands),
            "charges": [(int(c["amount"]), c["state"]) for c in charges],
            "reserved": int(reserved),
            "events": [(e["type"], json.loads(e["payload"])) for e in events]}


async def test_a_600_eur_refund_narrowed_to_400_runs_400_exactly_once(world: World) -> None:
    t = await world.tenant()
    op, approval_id, proposed = await _pending(world, t, 60_000)
    before = await _state(world, t, op)
    assert before["charges"] == [(60_000, "reserved")] and before["reserved"] == 60_000

    done = await _narrow(world, t, approval_id, "user:fiona", {**proposed, "amount_minor": 40_000})
    assert done.fields == ("amount_minor",)
    assert (done.original.state, done.original.approval_id) == ("narrowed", approval_id)
    # 400 EUR is below the rule's threshold: one approver, the one who narrowed, suffices.
    assert done.narrowed.state == "approved" and done.narrowed.required_approvals == 1
    assert done.narrowed.narrowed_from == approval_id and done.narrowed.decided_by == "user:fiona"
    assert done.narrowed.request_hash != done.original.request_hash
    assert done.admitted is not None and done.admitted.status == "admitted"

    after = await _state(world, t, op)
    assert after["requests"] == [("narrowed", None), ("approved", approval_id)]
    assert after["commands"] == 1
    # The original's reservation was given back; the narrowed command reserved its own 400.
    assert after["charges"] == [(60_000, "released"), (40_000, "reserved")]
    assert after["reserved"] == 40_000
    types = [e[0] for e in after["events"]]
    assert types == ["approval.requested", "approval.requested", "approval.narrowed",
                     "approval.approved"], types
    narrowed_event = after["events"][2][1]
    assert narrowed_event["request_hash"] == done.original.hash_hex
    assert narrowed_event["narrowed_hash"] == done.narrowed.hash_hex
    assert narrowed_event["narrowed_to"] == str(done.narrowed.approval_id)
    assert narrowed_event["narrowed_by"] == "user:fiona"

    # The command admitted is the narrowed one: its hash, and it runs once with 400.
    row = await world.row(t, op)
    assert bytes(row["request_hash"]) == done.narrowed.request_hash
    worker = world.dispatcher()
    begun = await worker.begin(t.tenant_id, op)
    assert begun.claim is not None
    assert await worker.complete(begun.claim) == "succeeded"
    assert len(await world.effects(t, "refund.created")) == 1
    # The provider's own record: one refund, of 400.00 EUR, none of 600.
    assert await _refunds(world, t) == [(40_000, "EUR")]
    async with world.owner.acquire() as conn:
        settled = await conn.fetch("SELECT amount, state FROM budget_charge WHERE operation_id "
                                   "= $1 ORDER BY amount", op)
    assert [(s["amount"], s["state"]) for s in settled] == [(40_000, "settled"),
                                                             (60_000, "released")]

    # The original can never be approved now, nor narrowed again.
    with pytest.raises(errors.InvalidTransition):
        await _narrow(world, t, approval_id, "user:frank", {**proposed, "amount_minor": 30_000})

    async with world.owner.acquire() as conn:
        await conn.execute("SET ROLE agentledger_auditor")
        try:
            found = await audit_explain.explain(conn, t.tenant_id, op)
        finally:
            await conn.execute("RESET ROLE")
    first, second = found.permitted.approvals
    assert (first.state, first.narrowed_to, first.narrowed_from) == (
        "narrowed", str(done.narrowed.approval_id), None)
    assert (second.state, second.narrowed_from, second.narrowed_to) == (
        "approved", str(approval_id), None)


async def test_a_narrowing_that_still_needs_two_approvers_counts_as_the_first(
        world: World) -> None:
    t = await world.tenant()
    op, approval_id, proposed = await _pending(world, t, 90_000)
    # fiona's vote for 900 is bound to the original's hash: it does not carry over.
    voted, _ = await _decide(world, t, approval_id, "user:fiona")
    assert voted.state == "pending"
    done = await _narrow(world, t, approval_id, "user:frank", {**proposed, "amount_minor": 60_000})
    # 600 is still above 500: the narrowed request needs two, and frank's approval is one.
    assert (done.narrowed.state, done.narrowed.required_approvals, done.admitted) == (
        "pending", 2, None)
    async with world.owner.acquire() as conn:
        votes = await conn.fetch("SELECT approver, request_hash FROM approval_vote "
                                 "WHERE approval_id = $1", done.narrowed.approval_id)
    assert [(v["approver"], bytes(v["request_hash"])) for v in votes] == [
        ("user:frank", done.narrowed.request_hash)]
    assert (await _state(world, t, op))["commands"] == 0
    # A second finance approver of the narrowed request admits it: 600, once.
    second, admitted = await _decide(world, t, done.narrowed.approval_id, "user:fiona")
    assert second.state == "approved" and admitted is not None
    worker = world.dispatcher()
    begun = await worker.begin(t.tenant_id, op)
    assert begun.claim is not None
    assert await worker.complete(begun.claim) == "succeeded"
    assert await _refunds(world, t) == [(60_000, "EUR")]


@pytest.mark.parametrize(("change", "code"), [
    ({"amount_minor": 70_000}, "narrowing_refused"),        # widening
    ({"reason": "goodwill"}, "narrowing_refused"),           # not declared narrowable
    ({"currency": "USD", "amount_minor": 40_000}, "narrowing_refused"),
    ({"amount_minor": 60_000}, "narrowing_refused"),         # nothing narrowed
    ({"amount_minor": 0}, "invalid_arguments"),              # below the schema's minimum
    ({"note": "x"}, "invalid_arguments"),                    # an argument the schema lacks
])
async def test_anything_but_a_narrowing_is_refused_and_changes_nothing(
        world: World, change: dict[str, Any], code: str) -> None:
    t = await world.tenant()
    op, approval_id, proposed = await _pending(world, t, 60_000)
    before = await _state(world, t, op)
    with pytest.raises(errors.ValidationFailed) as refused:
        await _narrow(world, t, approval_id, "user:fiona", {**proposed, **change})
    assert refused.value.code == code, refused.value
    assert await _state(world, t, op) == before
    assert before["requests"] == [("pending", None)] and before["commands"] == 0
    assert await world.effects(t, "refund.created") == [] and await _refunds(world, t) == []


async def test_the_requester_cannot_narrow_their_own_request(world: World) -> None:
    t = await world.tenant()
    op, approval_id, proposed = await _pending(world, t, 60_000)
    before = await _state(world, t, op)
    async with world.owner.acquire() as conn:
        # Even holding the role, alice never narrows (and so never approves) her own request.
        await policy_repo.put_principal(conn, t.tenant_id, "user:alice",
                                        ["user", "approver", "finance-approver"])
    with pytest.raises(errors.PolicyDenied):
        await _narrow(world, t, approval_id, "user:alice", {**proposed, "amount_minor": 40_000})
    assert await _state(world, t, op) == before


async def test_an_approver_cedar_refuses_cannot_narrow(world: World) -> None:
    t = await world.tenant()
    op, approval_id, proposed = await _pending(world, t, 60_000)
    before = await _state(world, t, op)
    # bob approves ordinary requests; Cedar asks finance for refunds above 500 EUR, and
    # 550 is still one: narrowing is approving, so it is refused.
    with pytest.raises(errors.PolicyDenied):
        await _narrow(world, t, approval_id, "user:bob", {**proposed, "amount_minor": 55_000})
    assert await _state(world, t, op) == before
