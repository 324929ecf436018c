"""Executor and reconciler against the real CRM and ledger (issue 5): state AND effects."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from agentledger import errors
from agentledger.connectors import crm as crm_connectors
from agentledger.ledger import dispatch, resolutions
from agentledger.testing.crm import Crm, run_crm
from tests.helpers import Points, assert_eventually
from tests.integration import executor_world
from tests.integration.executor_world import World, close_world, open_world

NOTE = "crm.note.create"
REFUND = "billing.refund.create"
CONTACT = "crm.contact.update"
# The billing connector's declared call bound: what the pre-call check covers for a refund.
REFUND_CALL_S = crm_connectors.CALL_TIMEOUT_S
# Ledger-level resolutions (the verified, checked path is tests/integration/test_resolution.py).
UNCHECKED: dict[str, Any] = {"receipt_check": "unchecked", "check_detail": "billing declares no lookup"}


crm, world = executor_world.fixtures()

async def test_lost_response_on_a_keyed_note_yields_one_note_and_success(world: World) -> None:
    t = await world.tenant()
    op = await world.admit(t, NOTE, {"body": "call back on Monday"})
    await world.crm.arm({"match": {"method": "POST", "path_prefix": f"/v1/customers/{t.customer_id}/notes"},
                         "action": "drop_after_commit", "times": 1})
    worker = world.dispatcher()
    begun = await worker.begin(t.tenant_id, op)
    assert begun.claim is not None
    assert await worker.complete(begun.claim) == "succeeded"

    notes = await world.effects(t, "note.created")
    assert len(notes) == 1 and notes[0]["idempotency_key"] == str(op)
    row = await world.row(t, op)
    assert row["state"] == "succeeded" and row["provider_receipt"].startswith("crm:note:")
    async with world.owner.acquire() as conn:
        attempts = await dispatch.attempts(conn, t.tenant_id, op)
    assert [(a["kind"], a["result"]) for a in attempts] == [("dispatch", "unknown"), ("resend", "succeeded")]


async def test_lost_response_on_a_refund_is_unknown_until_an_operator_resolves_it(
    world: World, database_url: str
) -> None:
    t = await world.tenant()
    op = await world.admit(t, REFUND, {"invoice_id": "inv-9", "amount_minor": 2500, "currency": "EUR",
                                       "reason": "damaged parcel"})
    await world.crm.arm({"match": {"method": "POST", "path_prefix": "/v1/refunds"},
                         "action": "drop_after_commit", "times": 1})
    worker = world.dispatcher()
    begun = await worker.begin(t.tenant_id, op)
    assert begun.claim is not None
    assert await worker.complete(begun.claim) == "unknown"
    assert len(await world.effects(t, "refund.created")) == 1  # it did happen; we just don't know
    row = await world.row(t, op)
    assert (row["state"], row["provider_receipt"]) == ("unknown", None)

    # The reconciler cannot look refunds up and never resends them.
    assert (await world.reconciler().sweep()).get(op) in (None, "skipped")
    assert len(await world.effects(t, "refund.created")) == 1

    operator = await asyncpg.connect(database_url)
    try:
        await operator.execute("SET ROLE agentledger_reconciler")
        listed = await resolutions.unknown_commands(operator, t.tenant_id)
        assert [c["operation_id"] for c in listed] == [op]
        with pytest.raises(errors.ValidationFailed):
            await resolutions.resolve_unknown(operator, t.tenant_id, op, outcome="succeeded",
                                           resolved_by="ops:bob", **UNCHECKED, reason="customer saw money")
        assert (await world.row(t, op))["state"] == "unknown"
        effect = (await world.effects(t, "refund.created"))[0]
        await resolutions.resolve_unknown(operator, t.tenant_id, op, outcome="succeeded",
                                       resolved_by="ops:bob", **UNCHECKED, reason="found in the CRM effect log",
                                       receipt=f"crm:refund:effect-{effect['effect_id']}",
                                       evidence="GET /admin/effects")
    finally:
        await operator.close()
    row = await world.row(t, op)
    assert row["state"] == "succeeded" and row["provider_receipt"].startswith("crm:refund:")
    async with world.owner.acquire() as conn:
        resolution = await conn.fetchrow("SELECT * FROM command_resolution WHERE operation_id=$1", op)
    assert resolution["resolved_by"] == "ops:bob" and resolution["reason"]


async def test_stale_worker_past_its_lease_cannot_finalize_and_one_effect(world: World) -> None:
    t = await world.tenant()
    op = await world.admit(t, NOTE, {"body": "race"})
    slow = world.dispatcher("slow-worker", lease_s=0.5)
    begun = await slow.begin(t.tenant_id, op)
    assert begun.claim is not None

    async def lease_expired() -> bool:
        async with world.owner.acquire() as conn:
            return bool(await conn.fetchval("SELECT now() > $1::timestamptz", begun.claim.lease_until))
    await assert_eventually(lease_expired, timeout=10)

    # The reconciler takes over (new token, new generation), finds no effect, and requeues;
    # a second worker dispatches with the same key.
    assert (await world.reconciler().sweep())[op] == "requeued"
    fast = world.dispatcher("fast-worker")
    again = await fast.begin(t.tenant_id, op)
    assert again.claim is not None and again.claim.generation == begun.claim.generation + 2
    assert await fast.complete(again.claim) == "succeeded"

    # The paused worker wakes up and completes its call: the provider dedupes the key, and
    # the fencing check refuses its outcome.
    with pytest.raises(errors.StaleClaim):
        await slow.complete(begun.claim)
    assert len(await world.effects(t, "note.created")) == 1
    row = await world.row(t, op)
    assert row["state"] == "succeeded" and row["fencing_generation"] == again.claim.generation


async def test_expired_approval_stops_the_command_with_no_call(world: World) -> None:
    t = await world.tenant()
    note = await world.admit(t, NOTE, {"body": "too late"})  # allowed by policy alone
    refund = await world.admit(t, REFUND, {"invoice_id": "inv-late", "amount_minor": 100,
                                           "currency": "EUR", "reason": "late"})  # approved
    async with world.owner.acquire() as conn:  # the clock moving on, in one statement
        await conn.execute("UPDATE agent_command SET expires_at = now() - interval '1 second' "
                           "WHERE operation_id = ANY($1::uuid[])", [note, refund])
    worker = world.dispatcher()
    for op in (note, refund):
        begun = await worker.begin(t.tenant_id, op)
        assert await worker.complete(begun.claim) == "expired"  # type: ignore[arg-type]
    assert await world.effects(t) == []
    # Each reason says who had authorized it: nobody approved the note (issue 18 §2).
    assert (await world.row(t, note))["outcome_reason"].startswith(
        "the authorization expired before dispatch: the policy allowed it without a human "
        "approval")
    assert (await world.row(t, refund))["outcome_reason"].startswith(
        "the approval (by user:fiona) expired before dispatch")


async def test_changed_revision_sends_the_command_to_review_with_no_effect(world: World) -> None:
    t = await world.tenant(email="old@example.com")
    op = await world.admit(t, CONTACT, {"changes": {"email": "new@example.com"}},
                           expected_revision=world.directory[(t.tenant_id, "crm", t.customer_id)])
    await world.crm.customer(str(t.tenant_id), t.customer_id, email="someone-else@example.com")
    worker = world.dispatcher()
    begun = await worker.begin(t.tenant_id, op)
    assert await worker.complete(begun.claim) == "review_required"  # type: ignore[arg-type]
    assert await world.effects(t, "contact.updated") == []
    assert (await world.row(t, op))["state"] == "review_required"


async def test_redelivered_command_calls_nothing(world: World) -> None:
    t = await world.tenant()
    op = await world.admit(t, NOTE, {"body": "once"})
    worker = world.dispatcher()
    results = await asyncio.gather(*(worker.begin(t.tenant_id, op) for _ in range(5)))
    claims = [r.claim for r in results if r.claim is not None]
    assert len(claims) == 1 and {r.disposition for r in results} == {"claimed", "held"}
    assert await worker.complete(claims[0]) == "succeeded"
    later = await worker.begin(t.tenant_id, op)
    assert (later.disposition, later.state) == ("terminal", "succeeded")
    assert len(await world.effects(t, "note.created")) == 1


async def test_connection_refused_requeues_without_an_effect(
        world: World, crm: Crm, recorded: Callable[[str], Points], monkeypatch: pytest.MonkeyPatch) -> None:
    capped = recorded("retries_capped")
    t = await world.tenant()
    op = await world.admit(t, NOTE, {"body": "provider down"})
    from agentledger.connectors import crm as crm_connectors
    from agentledger.executor import dispatcher as dispatcher_mod
    down = world.dispatcher()
    down.connectors = crm_connectors.registry("http://127.0.0.1:9")  # nothing listens on 9
    begun = await down.begin(t.tenant_id, op)
    original = dispatcher_mod.NOT_SENT_RETRIES
    dispatcher_mod.NOT_SENT_RETRIES = 0
    try:
        assert await down.complete(begun.claim) == "pending"  # type: ignore[arg-type]
    finally:
        dispatcher_mod.NOT_SENT_RETRIES = original
        for c in down.connectors.values():
            await c.aclose()
    async with world.owner.acquire() as conn:
        outbox = await conn.fetch("SELECT type FROM command_outbox WHERE operation_id=$1", op)
        wait = await conn.fetchval("SELECT extract(epoch FROM retry_at - updated_at) "
                                   "FROM agent_command WHERE operation_id=$1", op)
    # Nothing was sent: requeued, but not at once into the same outage (issue 18 §4): the
    # first generation backs off 1-2 s (2 s, equal jitter), with no obligation until then.
    assert outbox == [] and 1.0 <= float(wait) <= 2.0, (outbox, wait)
    assert (await world.row(t, op))["state"] == "pending"
    assert await world.effects(t) == []
    reconciler = world.reconciler()
    assert op not in await reconciler.sweep()  # not due yet
    async with world.owner.acquire() as conn:  # the backoff runs out
        await conn.execute("UPDATE agent_command SET retry_at = now() - interval '1 ms' "
                           "WHERE operation_id = $1", op)
    assert (await reconciler.sweep())[op] == "retried"
    async with world.owner.acquire() as conn:
        outbox = await conn.fetch("SELECT type FROM command_outbox WHERE operation_id=$1", op)
        retry_at = await conn.fetchval("SELECT retry_at FROM agent_command WHERE operation_id=$1",
                                       op)
    assert [o["type"] for o in outbox] == ["command.requeued"] and retry_at is None
    assert op not in await reconciler.sweep()  # published once
    assert capped() == {}
    # Still refused at the cap of generations: held `unknown` for an operator, counted once.
    still_down = world.dispatcher()
    still_down.connectors = crm_connectors.registry("http://127.0.0.1:9")
    still_down.max_generations = 2
    monkeypatch.setattr(dispatcher_mod, "NOT_SENT_RETRIES", 0)
    again = await still_down.begin(t.tenant_id, op)
    assert again.claim is not None and again.claim.generation == 2
    try:
        assert await still_down.complete(again.claim) == "unknown"
    finally:
        for c in still_down.connectors.values():
            await c.aclose()
    row = await world.row(t, op)
    assert row["state"] == "unknown" and row["outcome_reason"].startswith("retry cap: 2"), dict(row)
    assert capped() == {(("connector", "crm"),): 1}
    assert await world.effects(t) == []


async def test_operator_cli_lists_and_resolves_an_unknown_refund(world: World, database_url: str) -> None:
    import os
    import subprocess
    import sys

    t = await world.tenant()
    op = await world.admit(t, REFUND, {"invoice_id": "inv-2", "amount_minor": 700, "currency": "EUR",
                                       "reason": "wrong size"})
    await world.crm.arm({"match": {"method": "POST", "path_prefix": "/v1/refunds"},
                         "action": "late_answer_after_commit", "delay_ms": 8000, "times": 1})
    worker = world.dispatcher()
    begun = await worker.begin(t.tenant_id, op)
    assert await worker.complete(begun.claim) == "unknown"  # type: ignore[arg-type]

    # ops:eve operates: in the directory, and signing with her own session token.
    from agentledger.policy import repository as policy_repo
    from agentledger.testing import identities

    async with world.owner.acquire() as conn:
        await policy_repo.put_principal(conn, t.tenant_id, "ops:eve", ["agent-operator"])
    env = {**os.environ, **identities.operator_env(database_url, world.crm.url,
                                                  world.lookup_tokens),
           "AGENTLEDGER_TOKEN": identities.session_token(t.tenant_id, "ops:eve")}
    cli = [sys.executable, "-m", "agentledger.cli"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args], env=env, capture_output=True, text=True, timeout=60,
                              check=False)

    listed = await asyncio.to_thread(run, "reconcile", "list", "--tenant", str(t.tenant_id))
    assert listed.returncode == 0 and str(op) in listed.stdout, listed.stderr
    refused = await asyncio.to_thread(run, "reconcile", "resolve", str(op), "--tenant", str(t.tenant_id),
                                      "--outcome", "succeeded", "--reason", "looks done")
    assert refused.returncode == 2 and "validation_failed" in refused.stdout
    assert (await world.row(t, op))["state"] == "unknown"
    done = await asyncio.to_thread(run, "reconcile", "resolve", str(op), "--tenant", str(t.tenant_id),
                                   "--outcome", "failed", "--reason", "refund reversed by finance")
    assert done.returncode == 0, done.stdout + done.stderr
    row = await world.row(t, op)
    assert (row["state"], row["provider_receipt"]) == ("failed", None)
    assert row["outcome_reason"].startswith("[unchecked: connector billing declares no lookup"), dict(row)
    async with world.owner.acquire() as conn:
        audit = await conn.fetchval("SELECT count(*) FROM event_outbox WHERE operation_id=$1 "
                                    "AND type='command.reconciled'", op)
    assert audit == 1


async def test_permission_revoked_while_queued_is_denied_with_no_call(world: World) -> None:
    from agentledger.policy import repository as policy_repo

    t = await world.tenant()
    op = await world.admit(t, NOTE, {"body": "queued before the revocation"})
    async with world.owner.acquire() as conn:
        assert await policy_repo.revoke_principal(conn, t.tenant_id, "user:alice")
    worker = world.dispatcher()
    begun = await worker.begin(t.tenant_id, op)
    assert await worker.complete(begun.claim) == "denied"  # type: ignore[arg-type]
    assert await world.effects(t) == []
    row = await world.row(t, op)
    assert row["outcome_reason"].startswith("current policy denies it")
    async with world.owner.acquire() as conn:
        stages = await conn.fetch("SELECT stage, effect FROM policy_decision WHERE operation_id=$1 "
                                  "ORDER BY decided_at", op)
    assert [(s["stage"], s["effect"]) for s in stages] == [("admission", "allow"), ("dispatch", "deny")]


async def test_a_command_whose_record_was_lost_is_republished_once_then_dispatched_once(
    world: World,
) -> None:
    """The relay swept the obligation (Kafka acknowledged it) but no executor ever saw the
    record: once it has been pending for ``stranded_after_s`` the reconciler renews the
    obligation — once — and the command is then dispatched like any other."""
    t = await world.tenant()
    lost = await world.admit(t, NOTE, {"body": "lost on the way"})
    queued = await world.admit(t, NOTE, {"body": "still waiting in the outbox"})
    async with world.owner.acquire() as conn:
        # What the relay does after an acknowledgement: the row leaves the outbox.
        await conn.execute("DELETE FROM command_outbox WHERE tenant_id=$1 AND operation_id=$2",
                           t.tenant_id, lost)
        await conn.execute("UPDATE agent_command SET updated_at = now() - interval '2 hours'"
                           " WHERE tenant_id=$1 AND operation_id = ANY($2::uuid[])",
                           t.tenant_id, [lost, queued])
    sweeper = world.reconciler()
    sweeper.stranded_after_s = 3600.0

    done = await sweeper.sweep()
    assert done.get(lost) == "republished"
    assert queued not in done  # its obligation is still in the outbox: not stranded
    async with world.owner.acquire() as conn:
        obligation = await conn.fetchrow(
            "SELECT type, aggregatetype, aggregateid FROM command_outbox"
            " WHERE tenant_id=$1 AND operation_id=$2", t.tenant_id, lost)
        audit = await conn.fetch("SELECT type, payload FROM audit_event"
                                 " WHERE tenant_id=$1 AND operation_id=$2 ORDER BY seq",
                                 t.tenant_id, lost)
    assert obligation is not None
    assert dict(obligation) == {"type": "command.republished", "aggregatetype": "crm",
                                "aggregateid": f"{t.tenant_id}:{lost}"}
    assert [a["type"] for a in audit][-1] == "command.republished"
    assert (await world.row(t, lost))["state"] == "pending"  # nothing was sent

    # Renewed once: with its obligation back (and its age reset), the next sweeps skip it,
    # even after the relay has swept the new row.
    assert lost not in await sweeper.sweep()
    async with world.owner.acquire() as conn:
        await conn.execute("DELETE FROM command_outbox WHERE tenant_id=$1 AND operation_id=$2",
                           t.tenant_id, lost)
    assert lost not in await sweeper.sweep()

    worker = world.dispatcher()
    begun = await worker.begin(t.tenant_id, lost)
    assert begun.claim is not None
    assert await worker.complete(begun.claim) == "succeeded"
    notes = [n for n in await world.effects(t, "note.created") if n["idempotency_key"] == str(lost)]
    assert len(notes) == 1


async def test_a_command_that_never_gets_an_answer_stops_at_the_retry_cap(
        world: World, recorded: Callable[[str], Points]) -> None:
    capped_metric, expired = recorded("retries_capped"), recorded("leases_expired")
    # Issue 17: a provider answering 5xx to every send of a request, and a lookup that never
    # finds it, made dispatch -> unknown -> lookup -> requeue loop without end (363 attempts
    # in 105 s). Past the cap of fencing generations the command is held for an operator.
    t = await world.tenant()
    op = await world.admit(t, NOTE, {"body": "never answered"})
    await world.crm.arm({"match": {"method": "POST", "path_prefix": f"/v1/customers/{t.customer_id}/notes"},
                         "action": "fail_before_commit", "times": None})
    cap = 4
    worker, recovery = world.dispatcher(), world.reconciler()
    worker.max_generations = recovery.max_generations = cap
    rounds = 0
    while (await world.row(t, op))["fencing_generation"] < cap and rounds < 2 * cap:  # bounded
        rounds += 1
        begun = await worker.begin(t.tenant_id, op)
        if begun.claim is not None:
            assert await worker.complete(begun.claim) == "unknown"
        await recovery.sweep()

    row = await world.row(t, op)
    assert (row["state"], row["fencing_generation"]) == ("unknown", cap), dict(row)
    assert row["outcome_reason"].startswith(f"retry cap: {cap} dispatch generations"), row["outcome_reason"]
    # The marker that recovery had its chance: a whole sweep after the cap leaves it alone,
    # and the executor finds nothing to claim.
    assert op not in await recovery.sweep()
    assert (await worker.begin(t.tenant_id, op)).claim is None
    row = await world.row(t, op)
    assert (row["state"], row["fencing_generation"]) == ("unknown", cap)
    async with world.owner.acquire() as conn:
        attempts = await dispatch.attempts(conn, t.tenant_id, op)
        capped = await conn.fetchval("SELECT count(*) FROM audit_event WHERE operation_id = $1 "
                                     "AND type = 'command.unknown' AND payload->>'reason' LIKE 'retry cap%'", op)
    # Two executor generations of three sends each, two lookups: bounded, and nothing created.
    assert len(attempts) == 8, [(a["kind"], a["result"]) for a in attempts]
    assert capped == 1
    # The reconciler's requeue hit the cap: one count, after the extra sweep too. Every take-
    # over was of an `unknown` command, never of a lease that ran out.
    assert capped_metric() == {(("connector", "crm"),): 1}
    assert expired() == {}
    assert await world.effects(t, "note.created") == []


async def test_a_record_on_the_wrong_topic_is_never_claimed_by_a_worker_without_its_connector(
    world: World,
) -> None:
    # Issue 17: with the billing executor down, a record on exec.crm.v1 naming a billing
    # command was claimed by the crm executor, which failed on the connector it lacks; the
    # reconciler then recorded `unknown` although nothing was sent.
    t = await world.tenant()
    op = await world.admit(t, REFUND, {"invoice_id": "inv-w", "amount_minor": 700, "currency": "EUR",
                                       "reason": "wrong topic"})
    crm_only = dataclasses.replace(world.dispatcher(), connectors={"crm": world.connectors["crm"]})
    begun = await crm_only.begin(t.tenant_id, op)
    assert (begun.disposition, begun.claim) == ("foreign", None)
    async with world.pool.acquire() as conn:  # the claim statement refuses it by itself too
        assert await dispatch.claim(conn, t.tenant_id, op, worker_id="w-crm", lease_s=60,
                                    connectors=["crm"]) is None
        assert await dispatch.attempts(conn, t.tenant_id, op) == []
    row = await world.row(t, op)
    assert (row["state"], row["fencing_generation"]) == ("pending", 0)
    assert op not in await world.reconciler().sweep()  # nothing to recover: nobody claimed it
    # The executor of its connector dispatches it as usual.
    begun = await world.dispatcher().begin(t.tenant_id, op)
    assert begun.claim is not None
    assert await world.dispatcher().complete(begun.claim) == "succeeded"
    assert len(await world.effects(t, "refund.created")) == 1


async def _claimed_refund(world: World, t: Any, invoice: str, amount: int, reason: str,
                          worker: str = "w1") -> tuple[uuid.UUID, dispatch.Claim]:
    """A refund admitted and claimed by ``worker`` (nothing sent yet)."""
    op = await world.admit(t, REFUND, {"invoice_id": invoice, "amount_minor": amount, "currency": "EUR",
                                       "reason": reason})
    begun = await world.dispatcher(worker).begin(t.tenant_id, op)
    assert begun.claim is not None
    return op, begun.claim


async def _expire(world: World, op: uuid.UUID, *, past_call: bool = False) -> None:
    """The clock moving past the lease, in one statement; ``past_call``: also past the call
    bound after it, the window in which a stalled holder might still send (issue 18 §1)."""
    ago = REFUND_CALL_S + dispatch.CALL_MARGIN_S + 1 if past_call else 1.0
    async with world.owner.acquire() as conn:
        await conn.execute("UPDATE agent_command SET lease_until = now() - make_interval(secs => $2) "
                           "WHERE operation_id = $1 AND state = 'dispatching'", op, ago)


async def test_a_refund_whose_worker_stopped_before_the_call_is_requeued_not_unknown(
        world: World, recorded: Callable[[str], Points]) -> None:
    expired = recorded("leases_expired")
    # Issue 17 §4: a claim that expired before any call reached the connector was recorded
    # `unknown` for a provider that can neither dedupe nor be asked — an operator's problem
    # although nothing was sent. The pre-call check stamps every attempt that may have
    # reached the connector; an expired claim without a stamp is requeued.
    t = await world.tenant()
    op = await world.admit(t, REFUND, {"invoice_id": "inv-s", "amount_minor": 900, "currency": "EUR",
                                       "reason": "stopped before the call"})
    stalled = world.dispatcher("stalled")
    begun = await stalled.begin(t.tenant_id, op)
    assert begun.claim is not None
    await _expire(world, op)
    assert (await world.reconciler().sweep())[op] == "requeued"
    assert expired() == {(("connector", "billing"),): 1}
    row = await world.row(t, op)
    assert (row["state"], row["outcome_reason"]) == (
        "pending", "the lease expired before any call reached the connector: nothing was sent")
    # The stalled worker wakes: its pre-call check finds the claim gone; it does not call.
    with pytest.raises(errors.StaleClaim):
        await stalled.complete(begun.claim)
    assert await world.effects(t, "refund.created") == []
    again = await world.dispatcher().begin(t.tenant_id, op)
    assert again.claim is not None
    assert await world.dispatcher().complete(again.claim) == "succeeded"
    assert len(await world.effects(t, "refund.created")) == 1
    async with world.pool.acquire() as conn:
        tried = await dispatch.attempts(conn, t.tenant_id, op)
    first = next(a for a in tried if a["worker_id"] == "stalled")
    assert (first["sent_at"], first["result"]) == (None, "abandoned")
    assert [a["sent_at"] is not None for a in tried if a["result"] == "succeeded"] == [True]


async def test_a_refund_whose_call_may_have_been_sent_stays_unknown(
        world: World, recorded: Callable[[str], Points]) -> None:
    expired = recorded("leases_expired")
    # The other side of the stamp: once the pre-call check passed, the call may have reached
    # the provider; a lease that expires then is `unknown` for a `none` contract, as before.
    t = await world.tenant()
    op, claim = await _claimed_refund(world, t, "inv-u", 901, "sent then silent")
    async with world.pool.acquire() as conn:
        await dispatch.mark_sending(conn, claim, call_s=REFUND_CALL_S)  # the check a call passes, then a crash
    await _expire(world, op)
    # Its holder may only be stalled: nobody declares anything within a call bound of the
    # lease's end (issue 18 §1) — no take-over, no new generation, no `unknown` yet.
    assert (await world.reconciler().sweep())[op] == "skipped"
    row = await world.row(t, op)
    assert (row["state"], row["fencing_generation"]) == ("dispatching", claim.generation)
    assert expired() == {}  # nothing taken over yet
    await _expire(world, op, past_call=True)
    assert (await world.reconciler().sweep())[op] == "unknown"
    assert expired() == {(("connector", "billing"),): 1}
    assert (await world.row(t, op))["state"] == "unknown"


async def test_a_worker_whose_lease_ran_out_does_not_call_even_before_a_take_over(world: World) -> None:
    # The check is the lease on the ledger, not the worker's clock or belief: expired is
    # expired, whether or not a reconciler has come by yet.
    t = await world.tenant()
    op, claim = await _claimed_refund(world, t, "inv-e", 902, "late")
    await _expire(world, op)
    with pytest.raises(errors.StaleClaim):
        await world.dispatcher().complete(claim)
    assert await world.effects(t, "refund.created") == []
    assert (await world.reconciler().sweep())[op] == "requeued"  # and it was never sent


RETENTION_S = 5.0


@pytest.fixture(scope="module")
def short_crm(make_database: Callable[[], str], tmp_path_factory: pytest.TempPathFactory) -> object:
    with run_crm(make_database(), tmp_path_factory.mktemp("crm-short"), faults_enabled="true",
                 idempotency_retention_seconds=str(RETENTION_S)) as c:
        yield c


async def test_a_lookup_after_the_provider_forgot_the_key_never_resends(
    short_crm: Crm, database_url: str
) -> None:
    # Issue 18 §0: `Contract.retention` was never read. After a lost answer, a lookup that
    # comes after the provider purged the key finds nothing, and the reconciler requeued and
    # resent — a second effect (the CRM lets an expired key be used again).
    w = await open_world(short_crm, database_url)
    w.connectors["crm"].contract = dataclasses.replace(  # type: ignore[misc]
        w.connectors["crm"].contract, retention=timedelta(seconds=RETENTION_S))
    try:
        t = await w.tenant()
        op = await w.admit(t, NOTE, {"body": "said once"})
        await w.crm.arm({"match": {"method": "POST", "path_prefix": f"/v1/customers/{t.customer_id}/notes"},
                         "action": "drop_after_commit", "times": 10})
        begun = await w.dispatcher().begin(t.tenant_id, op)
        assert begun.claim is not None
        assert await w.dispatcher().complete(begun.claim) == "unknown"  # every answer lost
        await w.crm.disarm()
        assert len(await w.effects(t, "note.created")) == 1

        async def forgotten() -> bool:
            async with w.crm.client(t.lookup) as c:
                return (await c.get(f"/v1/operations/{op}")).status_code == 404
        await assert_eventually(forgotten, timeout=RETENTION_S + 15, message="the CRM never forgot the key")
        assert (await w.reconciler().sweep())[op] == "unknown"
        row = await w.row(t, op)
        assert row["state"] == "unknown" and "key retention" in row["outcome_reason"], dict(row)
        generation = row["fencing_generation"]
        # Concluded past the retention: left to an operator — no new generation, no lookup,
        # no resend on later passes (it used to take a generation each pass until the cap).
        assert (await w.reconciler().sweep())[op] == "skipped"
        row = await w.row(t, op)
        assert (row["state"], row["fencing_generation"]) == ("unknown", generation)
        assert len(await w.effects(t, "note.created")) == 1  # never a second note
    finally:
        await short_crm.disarm()
        await close_world(w)


async def test_nobody_resolves_a_command_while_an_attempt_may_still_act(world: World, database_url: str) -> None:
    # Issue 18 §1: a worker stalled mid-call (after its pre-call check) while the reconciler
    # recorded `unknown` and an operator resolved `failed`; then the call landed — a refund the
    # ledger says failed. A resolution is refused while such an attempt may still act, or
    # recorded as an explicit override.
    t = await world.tenant()
    ops = []
    for n in range(2):
        op, claim = await _claimed_refund(world, t, f"inv-a{n}", 700 + n, "stalled mid-call", "stalled")
        async with world.pool.acquire() as conn:
            await dispatch.mark_sending(conn, claim, call_s=REFUND_CALL_S)  # passed the check; then it stalls
        await _expire(world, op, past_call=True)
        assert (await world.reconciler().sweep())[op] == "unknown"
        ops.append(op)
    operator = await asyncpg.connect(database_url)
    try:
        await operator.execute("SET ROLE agentledger_reconciler")
        with pytest.raises(errors.AttemptMayStillAct, match="may act until"):
            await resolutions.resolve_unknown(operator, t.tenant_id, ops[0], outcome="failed",
                                           resolved_by="ops:bob", **UNCHECKED, reason="nothing in the CRM")
        assert (await world.row(t, ops[0]))["state"] == "unknown"
        async with world.owner.acquire() as conn:  # the clock moving past the longest call
            await conn.execute("UPDATE command_attempt SET sent_at = sent_at - make_interval(secs => $2) "
                               "WHERE operation_id = $1", ops[0], dispatch.MAX_CALL_S + 1)
        await resolutions.resolve_unknown(operator, t.tenant_id, ops[0], outcome="failed",
                                       resolved_by="ops:bob", **UNCHECKED, reason="nothing in the CRM")
        await resolutions.resolve_unknown(operator, t.tenant_id, ops[1], outcome="failed", resolved_by="ops:bob", **UNCHECKED,
                                       reason="customer cancelled", override_acting=True)
    finally:
        await operator.close()
    assert (await world.row(t, ops[0]))["state"] == "failed"
    overridden = await world.row(t, ops[1])
    assert overridden["state"] == "failed" and overridden["outcome_reason"].startswith("[OVERRIDE"), dict(overridden)


async def test_a_restarted_worker_closes_its_predecessors_attempts_so_recovery_need_not_wait(
    world: World
) -> None:
    # A stalled holder may still send for a call bound after its lease, so the reconciler
    # waits that out (issue 18 §1) — but a successor under the same identity knows its
    # predecessor is gone: ending its leases closes their open attempts, and recovery is at
    # once (the restarted-worker story must not wait the lease, nor the call bound).
    t = await world.tenant()
    op, claim = await _claimed_refund(world, t, "inv-r", 903, "predecessor crashed", "exec-1")
    async with world.pool.acquire() as conn:
        await dispatch.mark_sending(conn, claim, call_s=REFUND_CALL_S)  # sent, then the crash
        assert await dispatch.end_leases_of(conn, "exec-1") == 1  # the successor starts
        tried = await dispatch.attempts(conn, t.tenant_id, op)
    assert [(a["result"], a["finished_at"] is not None) for a in tried] == [("abandoned", True)]
    assert "restarted under the same identity" in tried[0]["detail"]
    assert (await world.reconciler().sweep())[op] == "unknown"  # a refund: nobody can ask
