"""The operator's budgets bind principals and tenants over time, in money (issue 42, R16.3).

A principal capped at 1,000 EUR per calendar UTC day sends 40 refunds of 100 EUR at once,
spread over 10 runs (a new run name each time does not escape a principal's budget): exactly
10 are admitted, the 30 others are refused naming the budget, the day's total never passes
the cap, and a resubmission is counted once. The admitted refunds run on the real billing
provider and settle their charges; the next day's window (the admission clock moved through
its seam, no sleeping) admits again. A refund held for approval holds its charge while a
person decides and gives it back when denied. ``explain`` names the budget that refused.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agentledger import admission
from agentledger.approvals import repository as approvals
from agentledger.audit import explain as audit_explain
from agentledger.budgets import rules as budget_rules
from agentledger.contracts.proposals import ProposalV1
from agentledger.policy import cedar
from agentledger.policy import repository as policy_repo
from agentledger.testing import identities
from tests.integration import executor_world
from tests.integration.executor_world import Tenant, World

crm, world = executor_world.fixtures()

REFUND = "billing.refund.create"
CAP = "refunds-eur-per-principal-day"
BUDGETS = budget_rules.Budgets.parse({
    "format": "agentledger.budgets.v1",
    "budgets": [
        {"name": CAP, "scope": "principal", "window": "day", "unit": "amount",
         "limit": 100_000, "actions": [REFUND], "amount_argument": "amount_minor",
         "currency_argument": "currency", "currency": "EUR"},
        {"name": "refund-calls-per-tenant-hour", "scope": "tenant", "window": "hour",
         "unit": "calls", "limit": 1_000, "actions": [REFUND]},
    ]})
# The policies of the demo, plus: refunds up to 100 EUR need no person (so they take the
# allowed path, admission's one statement).
SMALL_REFUNDS = """
@id("small-refunds-unattended")
permit (principal, action == AgentLedger::Action::"perform_unattended", resource)
when {
  context.operation.name == "billing.refund.create" &&
  context.operation has amount_minor && context.operation.amount_minor <= 10000 &&
  principal.roles.contains("user")
};
"""


class Clock:
    """The admission clock's seam: tests move it, nothing sleeps."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def small_refunds(tmp_path: Path) -> Iterator[cedar.CedarPolicy]:
    target = tmp_path / "policies"
    shutil.copytree(cedar.DEFAULT_DIR, target)
    (target / "30_small_refunds.cedar").write_text(SMALL_REFUNDS, encoding="utf-8")
    yield cedar.CedarPolicy(target)


def _admitter(w: World, clock: Clock) -> admission.Admitter:
    found = w.admitter()
    found.envelope_keys = identities.KEYSET
    found.budget_rules = BUDGETS
    found.clock = clock
    found.budget_limits = {"tool_calls": 20}
    return found


def refund(t: Tenant, run: uuid.UUID, amount: int, *, op: uuid.UUID | None = None,
           currency: str = "EUR") -> ProposalV1:
    return ProposalV1.model_validate(identities.sign({
        "schema": "agentledger.proposal.v1", "proposal_id": str(uuid.uuid4()),
        "tenant_id": str(t.tenant_id), "principal_id": "user:alice",
        "operation_id": str(op or uuid.uuid4()), "action": REFUND,
        "arguments": {"customer_id": t.customer_id, "invoice_id": f"inv-{uuid.uuid4().hex[:8]}",
                      "amount_minor": amount, "currency": currency, "reason": "duplicate"},
        "target": t.customer_id, "planner": {"name": "scripted"},
        "created_at": datetime.now(UTC).isoformat()}, request_id=run))


async def _window(w: World, t: Tenant, start: datetime) -> tuple[int, int]:
    async with w.owner.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT reserved, used FROM budget_window WHERE tenant_id = $1 AND budget = $2 "
            "AND scope_key = 'user:alice' AND window_start = $3", t.tenant_id, CAP, start)
    return (int(row["reserved"]), int(row["used"])) if row else (0, 0)


async def _charges(w: World, t: Tenant) -> dict[str, int]:
    async with w.owner.acquire() as conn:
        rows = await conn.fetch("SELECT state, count(*) AS n FROM budget_charge WHERE "
                                "tenant_id = $1 AND budget = $2 GROUP BY state", t.tenant_id, CAP)
    return {r["state"]: int(r["n"]) for r in rows}


async def test_a_principal_day_cap_admits_exactly_ten_of_forty_concurrent_refunds_across_runs(
    world: World, small_refunds: cedar.CedarPolicy,
) -> None:
    world.authorizer = policy_repo.CedarAuthorizer(small_refunds)
    t = await world.tenant()
    day = datetime(2026, 12, 6, 9, 30, tzinfo=UTC)
    clock = Clock(day)
    admitter = _admitter(world, clock)
    runs = [uuid.uuid4() for _ in range(10)]
    proposals = [refund(t, runs[i % 10], 10_000) for i in range(40)]

    results = await asyncio.gather(*(admitter.admit(p) for p in proposals))

    admitted = [p for p, r in zip(proposals, results, strict=True) if r.status == "admitted"]
    refused = [r for r in results if r.status == "rejected"]
    assert (len(admitted), len(refused)) == (10, 30), [r.status for r in results]
    assert {r.reason_code for r in refused} == {"budget_exhausted"}
    assert all(CAP in (r.reason or "") for r in refused)
    start = day.replace(hour=0, minute=0)
    # No overshoot: 1,000.00 EUR reserved, exactly the cap; one live charge per admission.
    assert await _window(world, t, start) == (100_000, 0)
    assert await _charges(world, t) == {"reserved": 10}
    async with world.owner.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM agent_command WHERE tenant_id = $1",
                                   t.tenant_id) == 10
        exhausted = await conn.fetch(
            "SELECT payload FROM audit_event WHERE tenant_id = $1 AND type = 'budget.exhausted'",
            t.tenant_id)
    assert len(exhausted) == 30
    assert {_payload(e)["budget"] for e in exhausted} == {CAP}

    # Resubmitted, the admitted refunds are replays: counted once.
    again = await asyncio.gather(*(admitter.admit(p) for p in admitted))
    assert {r.status for r in again} == {"replayed"}
    assert await _window(world, t, start) == (100_000, 0)

    # Run on the real provider: each charge settles (reserved → used), once.
    worker = world.dispatcher()
    for p in admitted:
        begun = await worker.begin(t.tenant_id, p.operation_id)
        assert begun.claim is not None
        assert await worker.complete(begun.claim) == "succeeded"
    assert len(await world.effects(t, "refund.created")) == 10
    assert await _window(world, t, start) == (0, 100_000)
    assert await _charges(world, t) == {"settled": 10}

    # explain names the budget that refused one of them.
    refused_op = next(p.operation_id for p, r in zip(proposals, results, strict=True)
                      if r.status == "rejected")
    async with world.owner.acquire() as conn:
        await conn.execute("SET ROLE agentledger_auditor")  # as `agentledger explain` reads
        try:
            found = await audit_explain.explain(conn, t.tenant_id, refused_op)
            settled = await audit_explain.explain(conn, t.tenant_id, admitted[0].operation_id)
        finally:
            await conn.execute("RESET ROLE")
    assert found.known.state == "not admitted"
    assert [(r.budget, r.amount, r.limit, r.currency) for r in found.permitted.budget_refusals] \
        == [(CAP, 10_000, 100_000, "EUR")]
    assert (found.permitted.budget_refusals[0].spent or 0) + 10_000 > 100_000
    assert {(c.budget, c.state) for c in settled.permitted.budget_charges} == {
        (CAP, "settled"), ("refund-calls-per-tenant-hour", "settled")}

    # Still the same day: refused. The next calendar UTC day: a fresh window admits.
    assert (await admitter.admit(refund(t, runs[0], 10_000))).status == "rejected"
    clock.now = day + timedelta(days=1)
    tomorrow = await admitter.admit(refund(t, runs[0], 10_000))
    assert tomorrow.status == "admitted", tomorrow
    assert await _window(world, t, start + timedelta(days=1)) == (10_000, 0)


async def test_a_refund_in_another_currency_is_not_counted_by_a_eur_budget(
    world: World, small_refunds: cedar.CedarPolicy,
) -> None:
    world.authorizer = policy_repo.CedarAuthorizer(small_refunds)
    t = await world.tenant()
    clock = Clock(datetime(2026, 12, 6, 12, tzinfo=UTC))
    admitter = _admitter(world, clock)
    result = await admitter.admit(refund(t, uuid.uuid4(), 10_000, currency="USD"))
    assert result.status == "admitted"
    async with world.owner.acquire() as conn:
        budgets_charged = await conn.fetch(
            "SELECT budget FROM budget_charge WHERE tenant_id = $1", t.tenant_id)
    assert [r["budget"] for r in budgets_charged] == ["refund-calls-per-tenant-hour"]


async def test_a_refund_waiting_for_approval_holds_its_charge_and_a_denial_releases_it(
    world: World,
) -> None:
    # The demo's policies: every refund needs a person.
    t = await world.tenant()
    day = datetime(2026, 12, 6, 18, tzinfo=UTC)
    admitter = _admitter(world, Clock(day))
    start = day.replace(hour=0)
    big = await admitter.admit(refund(t, uuid.uuid4(), 60_000))
    assert big.status == "pending_approval" and big.approval_id is not None
    assert await _window(world, t, start) == (60_000, 0)
    # While it waits, a second 600 EUR refund would pass the cap: refused, naming it.
    second = await admitter.admit(refund(t, uuid.uuid4(), 60_000))
    assert (second.status, second.reason_code) == ("rejected", "budget_exhausted")
    assert CAP in (second.reason or "")
    assert await _window(world, t, start) == (60_000, 0)

    await _deny(world, t, big.approval_id)
    assert await _window(world, t, start) == (0, 0)
    assert await _charges(world, t) == {"released": 1}
    # Given back: the second refund now fits.
    third = await admitter.admit(refund(t, uuid.uuid4(), 60_000))
    assert third.status == "pending_approval"
    assert await _window(world, t, start) == (60_000, 0)


async def _deny(w: World, t: Tenant, approval_id: uuid.UUID) -> None:
    async with w.admission_pool.acquire() as conn:
        pending = await approvals.get(conn, t.tenant_id, approval_id)
        decided, admitted = await approvals.decide(
            conn, t.tenant_id, approval_id, approver="user:bob", approve=False,
            shown_hash=pending.hash_hex, reason="not due", approver_decision=None)
    assert admitted is None and decided.state == "denied"


async def test_a_failed_command_releases_its_charge(world: World,
                                                   small_refunds: cedar.CedarPolicy) -> None:
    world.authorizer = policy_repo.CedarAuthorizer(small_refunds)
    t = await world.tenant()
    day = datetime(2026, 12, 7, 1, tzinfo=UTC)
    admitter = _admitter(world, Clock(day))
    p = refund(t, uuid.uuid4(), 5_000)
    assert (await admitter.admit(p)).status == "admitted"
    assert await _window(world, t, day.replace(hour=0)) == (5_000, 0)
    # The principal's permission is revoked before dispatch: the dispatch-time re-check
    # denies, the command ends `denied`, and its charge goes back.
    async with world.owner.acquire() as conn:
        assert await policy_repo.revoke_principal(conn, t.tenant_id, "user:alice")
    worker = world.dispatcher()
    begun = await worker.begin(t.tenant_id, p.operation_id)
    assert begun.claim is not None
    assert await worker.complete(begun.claim) == "denied"
    row = await world.row(t, p.operation_id)
    assert row["state"] == "denied"
    assert await _window(world, t, day.replace(hour=0)) == (0, 0)
    assert await _charges(world, t) == {"released": 1}
    assert await world.effects(t, "refund.created") == []


def _payload(row: Any) -> dict[str, Any]:
    value = row["payload"]
    return dict(json.loads(value) if isinstance(value, str) else value)




async def test_the_budget_counter_is_least_privilege(world: World) -> None:
    async with world.owner.acquire() as conn:
        role = await conn.fetchrow(
            "SELECT rolsuper, rolbypassrls, rolcreaterole, rolcreatedb, rolcanlogin "
            "FROM pg_roles WHERE rolname = 'agentledger_budget_counter'")
        functions = await conn.fetch(
            "SELECT p.proname, p.prosecdef, p.proconfig, "
            "       has_function_privilege('public', p.oid, 'EXECUTE') AS public_exec, "
            "       has_function_privilege('agentledger_admission', p.oid, 'EXECUTE') AS admits "
            "FROM pg_proc p WHERE pg_get_userbyid(p.proowner) = 'agentledger_budget_counter'")
        # Admission may read its tenant's totals, never write them but through the function.
        writes = await conn.fetchval(
            "SELECT has_table_privilege('agentledger_admission', 'budget_window', 'UPDATE') OR "
            "has_table_privilege('agentledger_admission', 'budget_charge', 'INSERT')")
    assert role is not None and not any(role.values())
    assert {f["proname"]: f["admits"] for f in functions} == {
        "agentledger_budget_charge_v1": True, "agentledger_budget_settle_charges_v1": False,
        "agentledger_budget_on_command_end_v1": False,
        "agentledger_budget_on_request_end_v1": False}
    for f in functions:
        assert f["prosecdef"] and not f["public_exec"], f
        assert f["proconfig"] == ["search_path=pg_catalog, public, pg_temp"], f
    assert writes is False


async def test_an_expired_approval_gives_its_charge_back_through_the_reconcilers_sweep(
    world: World,
) -> None:
    # The sweep runs as the reconciler across tenants, with no tenant bound: the release
    # trigger still finds the charge (its owner sees every tenant's budget rows).
    t = await world.tenant()
    day = datetime(2026, 12, 8, 10, tzinfo=UTC)
    admitter = _admitter(world, Clock(day))
    pending = await admitter.admit(refund(t, uuid.uuid4(), 30_000))
    assert pending.status == "pending_approval" and pending.approval_id is not None
    assert await _window(world, t, day.replace(hour=0)) == (30_000, 0)
    async with world.owner.acquire() as conn:
        await conn.execute("UPDATE approval_request SET expires_at = now() - interval '1 second'"
                           " WHERE approval_id = $1", pending.approval_id)
    async with world.reconciler_pool.acquire() as conn:
        expired = await approvals.expire_due(conn)
    assert (t.tenant_id, pending.approval_id) in expired
    assert await _window(world, t, day.replace(hour=0)) == (0, 0)
    assert await _charges(world, t) == {"released": 1}
