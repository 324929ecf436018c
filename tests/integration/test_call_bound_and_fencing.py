"""A call the lease provably covers, and a fencing generation the provider enforces (issue 18
§1), on the real ledger and the real CRM."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from agentledger import errors, faults
from agentledger.ledger import dispatch
from tests.helpers import assert_eventually
from tests.integration import executor_world
from tests.integration.executor_world import Tenant, World

NOTE = "crm.note.create"
REFUND = "billing.refund.create"
# The CRM forgets an idempotency key after this: a stale writer waking up later would make a
# second note were it not fenced.
RETENTION_S = 3.0


crm, world = executor_world.fixtures(idempotency_retention_seconds=str(RETENTION_S))


async def _claimed(world: World, t: Tenant, action: str, arguments: dict[str, Any],
                   worker: str = "w1") -> tuple[uuid.UUID, dispatch.Claim]:
    op = await world.admit(t, action, arguments)
    begun = await world.dispatcher(worker).begin(t.tenant_id, op)
    assert begun.claim is not None
    return op, begun.claim


async def _refund(world: World, t: Tenant, invoice: str) -> tuple[uuid.UUID, dispatch.Claim]:
    return await _claimed(world, t, REFUND, {"invoice_id": invoice, "amount_minor": 500,
                                             "currency": "EUR", "reason": "bound"})


async def _lease(world: World, op: uuid.UUID) -> Any:
    async with world.owner.acquire() as conn:
        return await conn.fetchval("SELECT lease_until FROM agent_command WHERE operation_id=$1",
                                   op)


async def test_the_pre_call_check_renews_a_current_lease_to_cover_the_call(world: World) -> None:
    t = await world.tenant()
    call_s = 20.0
    # A lease that already covers the call is left as it is (never shortened).
    long_op, long_claim = await _refund(world, t, "inv-long")
    async with world.pool.acquire() as conn:
        assert await dispatch.mark_sending(conn, long_claim, call_s=call_s) == long_claim.lease_until
    # A lease about to run out is renewed to the call's bound plus the margin, counted from
    # the check itself (the same transaction stamps sent_at).
    op, claim = await _refund(world, t, "inv-short")
    async with world.owner.acquire() as conn:
        await conn.execute("UPDATE agent_command SET lease_until = now() + interval '1 second' "
                           "WHERE operation_id = $1", op)
    async with world.pool.acquire() as conn:
        renewed = await dispatch.mark_sending(conn, claim, call_s=call_s)
        (attempt,) = await dispatch.attempts(conn, t.tenant_id, op)
    assert renewed == await _lease(world, op)
    assert renewed - attempt["sent_at"] == timedelta(seconds=call_s + dispatch.CALL_MARGIN_S)
    # So the reconciler cannot take the command over while the call may run.
    assert op not in await world.reconciler().sweep()
    assert (await world.row(t, op))["fencing_generation"] == claim.generation
    assert long_op not in await world.reconciler().sweep()


async def test_the_pre_call_check_refuses_an_expired_or_taken_lease_and_renews_nothing(
    world: World,
) -> None:
    t = await world.tenant()
    expired_op, expired = await _refund(world, t, "inv-expired")
    taken_op, taken = await _refund(world, t, "inv-taken")
    async with world.owner.acquire() as conn:
        await conn.execute("UPDATE agent_command SET lease_until = now() - interval '1 second' "
                           "WHERE operation_id = ANY($1::uuid[])", [expired_op, taken_op])
    async with world.reconciler_pool.acquire() as conn:
        newer = await dispatch.claim(conn, t.tenant_id, taken_op, worker_id="reconciler-1",
                                     lease_s=30, take_over=True, kind="lookup")
    assert newer is not None
    lease_before = await _lease(world, expired_op)

    for op, claim in ((expired_op, expired), (taken_op, taken)):
        async with world.pool.acquire() as conn:
            with pytest.raises(errors.StaleClaim):
                await dispatch.mark_sending(conn, claim, call_s=dispatch.MAX_CALL_S)
            tried = await dispatch.attempts(conn, t.tenant_id, op)
        mine = next(a for a in tried if a["attempt_id"] == claim.attempt_id)
        assert (mine["sent_at"], mine["result"]) == (None, "abandoned")
    assert await _lease(world, expired_op) == lease_before  # still expired: nothing renewed
    assert await _lease(world, taken_op) == newer.lease_until  # the newer holder's, untouched


async def test_a_take_over_closes_the_unsent_attempt_of_a_holder_that_never_returns(
    world: World,
) -> None:
    # A holder cut off from the ledger after its claim gives up at its transaction bound and
    # never writes again (tests/chaos/test_partitions.py): the take-over ends its attempt.
    # One that was marked as sent may still act: it stays open for the lookup to judge.
    t = await world.tenant()
    unsent_op, unsent = await _refund(world, t, "inv-cut")
    sent_op, sent = await _refund(world, t, "inv-sent")
    async with world.pool.acquire() as conn:
        await dispatch.mark_sending(conn, sent, call_s=1.0)
    async with world.owner.acquire() as conn:
        await conn.execute("UPDATE agent_command SET lease_until = now() - interval '1 second' "
                           "WHERE operation_id = ANY($1::uuid[])", [unsent_op, sent_op])
    for op, old in ((unsent_op, unsent), (sent_op, sent)):
        async with world.reconciler_pool.acquire() as conn:
            newer = await dispatch.claim(conn, t.tenant_id, op, worker_id="reconciler-1",
                                         lease_s=30, take_over=True, kind="lookup")
            assert newer is not None
            tried = {a["attempt_id"]: a for a in await dispatch.attempts(conn, t.tenant_id, op)}
        assert tried[newer.attempt_id]["finished_at"] is None  # the new attempt is open
        closed = tried[old.attempt_id]
        if op == unsent_op:
            assert closed["result"] == "abandoned" and closed["finished_at"] is not None
            assert "taken over" in closed["detail"]
        else:
            assert (closed["result"], closed["finished_at"]) == (None, None)


async def test_a_provider_that_hangs_past_the_call_bound_is_unknown_never_success(
    world: World,
) -> None:
    # The CRM commits the refund, then holds its answer 3 s: under every httpx timeout (5 s
    # of inactivity), so without the bound the call would just succeed late — after the
    # lease that was meant to cover it.
    t = await world.tenant()
    op = await world.admit(t, REFUND, {"invoice_id": "inv-hang", "amount_minor": 600,
                                       "currency": "EUR", "reason": "slow provider"})
    await world.crm.arm({"match": {"method": "POST", "path_prefix": "/v1/refunds"},
                         "action": "late_answer_after_commit", "delay_ms": 3000, "times": 1})
    worker = world.dispatcher()
    worker.call_timeout_s = 1.0
    begun = await worker.begin(t.tenant_id, op)
    assert begun.claim is not None
    assert await worker.complete(begun.claim) == "unknown"

    row = await world.row(t, op)
    assert (row["state"], row["provider_receipt"]) == ("unknown", None)
    assert "call bound (1 s)" in row["outcome_reason"], row["outcome_reason"]
    # The doubt was right: the refund exists; only an operator may now say so.
    assert len(await world.effects(t, "refund.created")) == 1


class StallOnce:
    """Stands in for ``faults.point``: the first worker to pass ``executor.before_call`` (after
    its pre-call check, before the call's timer and request) stalls there until released —
    a GC pause, a frozen VM. Every other point and pass goes through."""

    def __init__(self) -> None:
        self.reached, self.release = asyncio.Event(), asyncio.Event()

    async def __call__(self, name: str) -> None:
        if name == "executor.before_call" and not self.reached.is_set():
            self.reached.set()
            await self.release.wait()


@contextlib.asynccontextmanager
async def stalled_after_its_mark(
    world: World, t: Tenant, op: uuid.UUID, monkeypatch: pytest.MonkeyPatch,
    call_timeout_s: float | None = None,
) -> AsyncIterator[tuple[StallOnce, dispatch.Claim, asyncio.Task[Any]]]:
    """A worker ("stalled") that claimed ``op`` and passed its pre-call check, stalled before
    its call until the gate is released; the task of its ``complete`` is cancelled on exit if
    it never ended."""
    gate = StallOnce()
    monkeypatch.setattr(faults, "point", gate)
    stalled = world.dispatcher("stalled")
    stalled.call_timeout_s = call_timeout_s
    held = (await stalled.begin(t.tenant_id, op)).claim
    assert held is not None
    stale = asyncio.create_task(stalled.complete(held))
    try:
        await asyncio.wait_for(gate.reached.wait(), timeout=30)  # passed the pre-call check
        yield gate, held, stale
    finally:
        gate.release.set()
        if not stale.done():
            stale.cancel()


async def test_a_stalled_worker_is_refused_by_the_crm_after_a_newer_claim_wrote(
    world: World, monkeypatch: pytest.MonkeyPatch,
) -> None:
    t = await world.tenant()
    op = await world.admit(t, NOTE, {"body": "said once"})
    async with stalled_after_its_mark(world, t, op, monkeypatch) as (gate, held, stale):
        async with world.owner.acquire() as conn:  # then its lease and the call bound after
            await conn.execute("UPDATE agent_command SET lease_until = now() - interval '1 minute'"
                               " WHERE operation_id = $1", op)  # it run out while it stalls
        assert (await world.reconciler().sweep())[op] == "requeued"  # the lookup finds nothing
        newer = await world.dispatcher("fresh").begin(t.tenant_id, op)
        assert newer.claim is not None and newer.claim.generation == held.generation + 2
        assert await world.dispatcher("fresh").complete(newer.claim) == "succeeded"

        # The CRM forgets the key: from now on only the fence stands between the stalled
        # request and a second note.
        async def forgotten() -> bool:
            async with world.crm.client(t.lookup) as c:
                return (await c.get(f"/v1/operations/{op}")).status_code == 404
        await assert_eventually(forgotten, timeout=RETENTION_S + 15,
                                message="the CRM never forgot the key")
        gate.release.set()
        with pytest.raises(errors.StaleClaim, match="fencing token"):
            await asyncio.wait_for(stale, timeout=30)

    notes = await world.effects(t, "note.created")
    assert [n["idempotency_key"] for n in notes] == [str(op)]  # one note: the newer claim's
    row = await world.row(t, op)
    assert (row["state"], row["fencing_generation"]) == ("succeeded", newer.claim.generation)
    assert row["provider_receipt"].startswith("crm:note:")
    async with world.owner.acquire() as conn:
        tried = await dispatch.attempts(conn, t.tenant_id, op)
        outcomes = await conn.fetch("SELECT (payload->>'fencing_generation')::int AS generation"
                                    " FROM audit_event WHERE operation_id = $1"
                                    " AND type = 'command.succeeded'", op)
    mine = next(a for a in tried if a["worker_id"] == "stalled")
    # The provider's refusal is kept on the stale attempt, never dropped (issue 37 §3).
    assert mine["sent_at"] is not None and mine["result"] == "fenced"
    assert (mine["late_answer"], mine["late_receipt"]) == ("fenced", None)
    assert "stale_fencing_token" in mine["detail"], mine["detail"]
    # One outcome, the newer claim's; nothing recorded for the stale generation.
    assert [o["generation"] for o in outcomes] == [newer.claim.generation]


async def test_the_reconciler_waits_out_the_bound_the_worker_marked_not_the_contracts(
    world: World, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue 41 §6: a worker whose call bound is its executor's override (2 s, as in the chaos
    # tiers) against the CRM contract's 14 s. Stalled after its pre-call check, its lease then
    # out: the reconciler waits the lease plus the bound the mark recorded for that attempt —
    # not the contract's, which held every take-over after a database blip 12 s too long.
    t = await world.tenant()
    op = await world.admit(t, NOTE, {"body": "bound by its worker"})
    async with stalled_after_its_mark(world, t, op, monkeypatch, 2.0) as (gate, held, stale):
        async with world.pool.acquire() as conn:
            (mine,) = [a for a in await dispatch.attempts(conn, t.tenant_id, op)
                       if a["attempt_id"] == held.attempt_id]
        assert mine["sent_at"] is not None
        assert mine["call_bound_s"] == pytest.approx(2.0 + dispatch.CALL_MARGIN_S)
        contract_s = world.connectors["crm"].contract.call_timeout_s
        assert contract_s > 2 * mine["call_bound_s"]  # the window's two readings differ

        async def lease_ended(ago: float) -> None:
            async with world.owner.acquire() as conn:
                await conn.execute("UPDATE agent_command SET lease_until = now() - "
                                   "make_interval(secs => $2) WHERE operation_id = $1", op, ago)

        # Inside the recorded bound (2 s past a 3 s window): nothing is taken over.
        await lease_ended(mine["call_bound_s"] - 1)
        assert (await world.reconciler().sweep())[op] == "skipped"
        row = await world.row(t, op)
        assert (row["state"], row["fencing_generation"]) == ("dispatching", held.generation)
        # Past it, still well inside the contract's: taken over and looked up at once.
        await lease_ended(mine["call_bound_s"] + 1)
        assert (await world.reconciler().sweep())[op] == "requeued"  # the call never left
        row = await world.row(t, op)
        assert (row["state"], row["fencing_generation"]) == ("pending", held.generation + 1)
        # The stalled worker wakes: the provider refuses its generation, nothing is applied.
        gate.release.set()
        with pytest.raises(errors.StaleClaim, match="fencing token"):
            await asyncio.wait_for(stale, timeout=30)
        assert await world.effects(t, "note.created") == []
