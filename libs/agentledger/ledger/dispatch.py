"""Claims, attempts and outcomes: the dispatch half of the ledger (SPEC R5, R6).

Every function is one short transaction; none holds a lock across a network call (R5.4).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, NamedTuple
from uuid import UUID

import asyncpg

from agentledger import errors, sql
from agentledger.contracts import commands, common, outcomes
from agentledger.ledger import repository, steps
from agentledger.ledger.repository import Conn

# More writes for a dispatch transaction, given the transaction.
Also = Callable[[Conn], Awaitable[None]]

Q = sql.load(Path(__file__).with_name("dispatch.sql"))

# Fencing generations (claims and take-overs) a command may go through before the ledger
# stops requeueing it and holds it as `unknown` for an operator. Normal recovery needs 3 or 4
# (dispatch, a lost worker, the reconciler, the resend); a command still without an answer
# after 10 is not going to get one by retrying, and each generation is up to six provider
# calls (a send, reconnects, resends).
MAX_GENERATIONS = 10
# The longest a connector call may be declared or configured to take (Contract.call_timeout_s,
# the executor's override): the dispatcher refuses a longer bound, so a call that passed the
# pre-call check has ended within this of its stamp unless its process stalled (fencing covers
# that). Nobody declares an outcome while an attempt younger than this may still act.
MAX_CALL_S = 30.0
# A requeue after nothing was sent (the provider unreachable) waits before the next dispatch:
# 2 s after the first generation, doubling, at most a minute (see ``backoff``). Over the ten
# generations that is about four minutes of outage before the command goes to an operator.
RETRY_BASE_S = 2.0
RETRY_CAP_S = 60.0
_JITTER = random.Random()  # noqa: S311 - spreads retries; not a secret
# What the pre-call check adds to the call bound when it renews the lease: the commit's round
# trip and the scheduling between the ledger's now() and the start of the call's own timer.
CALL_MARGIN_S = 1.0

AttemptKind = Literal["dispatch", "lookup", "resend"]
# What an operator's resolution rests on: the provider's lookup agreed with it, or the
# provider could not be asked (a connector without lookup, or an explicit unchecked record).
ReceiptCheck = Literal["confirmed", "unchecked"]
Requeued = Literal["requeued", "capped"]
# What ``finalize`` may record: any state but ``dispatching`` (a claim's, never an outcome).
FinalState = Literal["pending", "unknown", commands.TerminalState]


# Defined with the statements that write them (steps); named here, where callers look.
DispatchDecision = steps.DispatchDecision
Claim = steps.Claim


async def claim(
    conn: Conn, tenant_id: UUID, operation_id: UUID, *, worker_id: str, lease_s: float,
    kind: AttemptKind = "dispatch", traceparent: str | None = None, take_over: bool = False,
    connectors: Sequence[str] = (),
) -> Claim | None:
    """Claim a pending command of one of ``connectors`` (or, with ``take_over``, an expired
    or unknown one, whatever its connector: the caller checked it can recover it).

    The claim and its attempt row are written in one transaction; a take-over also closes
    the earlier holders' attempts that were never sent (``abandoned``). Returns None when the
    command is not claimable now: terminal, held by a live lease, locked by another worker,
    or (without ``take_over``) of a connector not in ``connectors``.
    """
    async with repository.transaction(conn, tenant_id) as tx:
        return await claim_in(tx, tenant_id, operation_id, worker_id=worker_id, lease_s=lease_s,
                              kind=kind, traceparent=traceparent, take_over=take_over,
                              connectors=connectors)


async def claim_in(
    tx: Conn, tenant_id: UUID, operation_id: UUID, *, worker_id: str, lease_s: float,
    kind: AttemptKind = "dispatch", traceparent: str | None = None, take_over: bool = False,
    connectors: Sequence[str] = (),
) -> Claim | None:
    """:func:`claim` inside the caller's transaction, bound to ``tenant_id`` (the executor
    loads, claims and re-checks the policy in one). The claim counts once that commits."""
    if not take_over:
        # The claim, its attempt and its audit event in one statement (steps.sql `claim`).
        (claimed,) = await steps.claim(tx, tenant_id, [steps.ClaimRow(operation_id, traceparent)],
                                       worker_id=worker_id, lease_s=lease_s,
                                       connectors=connectors, kind=kind)
        return None if claimed is None else claimed[0]
    token = uuid.uuid4()
    row = await tx.fetchrow(Q["take_over"], tenant_id, operation_id, token, worker_id,
                            lease_s)
    if row is None:
        return None
    await tx.execute(Q["close_unsent_attempts"], tenant_id, operation_id,
                     row["fencing_generation"])
    attempt = await tx.fetchrow(
        Q["start_attempt"], tenant_id, operation_id, row["fencing_generation"], worker_id,
        kind, traceparent,
    )
    assert attempt is not None
    await repository.append_event(
        tx, tenant_id=tenant_id, operation_id=operation_id, family="audit",
        type="command.claimed",
        payload={"operation_id": str(operation_id), "worker_id": worker_id, "kind": kind,
                 "fencing_generation": row["fencing_generation"],
                 "previous_state": row.get("previous_state", "pending")},
        traceparent=traceparent,
    )
    return Claim(tenant_id, operation_id, token, worker_id, int(row["fencing_generation"]),
                 row["lease_until"], attempt["attempt_id"],
                 row.get("previous_state") or "pending")


async def claim_loaded_in(
    tx: Conn, tenant_id: UUID, operation_id: UUID, *, worker_id: str, lease_s: float,
    traceparent: str | None = None, connectors: Sequence[str] = (),
) -> tuple[Claim, asyncpg.Record] | None:
    """:func:`claim_in` of a pending command in ONE statement that also returns the command as
    admission stored it and its principal as the directory records it now (``principal_*``
    columns; issue 41). None: nothing was claimed (the caller loads the command to say why)."""
    (claimed,) = await steps.claim(tx, tenant_id, [steps.ClaimRow(operation_id, traceparent)],
                                   worker_id=worker_id, lease_s=lease_s, connectors=connectors)
    return claimed


async def new_attempt(
    conn: Conn, held: Claim, *, kind: AttemptKind, traceparent: str | None = None
) -> Claim:
    """Record another attempt under the same claim (a resend with the same key)."""
    async with repository.transaction(conn, held.tenant_id) as tx:
        attempt = await tx.fetchrow(
            Q["start_attempt"], held.tenant_id, held.operation_id, held.generation,
            held.worker_id, kind, traceparent,
        )
    assert attempt is not None
    return Claim(held.tenant_id, held.operation_id, held.token, held.worker_id, held.generation,
                 held.lease_until, attempt["attempt_id"], held.previous_state)


async def mark_sending(conn: Conn, held: Claim, *, call_s: float,
                       decision: DispatchDecision | None = None) -> datetime:
    """Prove the claim is current, on the ledger, immediately before a connector call, and
    make its lease cover the whole call.

    The lease is renewed to at least ``call_s`` (the call's bound) plus ``CALL_MARGIN_S`` from
    now, conditionally on the token being current and the lease unexpired: a current holder
    always has the call covered, so the reconciler cannot take over while it runs. Marks the
    attempt as one that may have reached the connector (``sent_at``): the reconciler treats
    an expired claim none of whose attempts was marked as never sent.

    ``decision``: the dispatch-time policy decision, written in the same statement, only
    while the claim is current (durable before any call). One statement: a lease that already
    covers the call is not rewritten (issue 41).

    Returns:
        The lease's end after the renewal.

    Raises:
        StaleClaim: The claim was taken over or its lease expired: the caller must not call
            (the attempt is closed as ``abandoned``). A database error propagates: no ledger,
            no call.
    """
    async with repository.transaction(conn, held.tenant_id) as tx:
        (lease_until,) = await steps.mark(tx, held.tenant_id, [
            steps.MarkRow(held, float(call_s) + CALL_MARGIN_S, decision)])
    if lease_until is None:
        raise errors.StaleClaim("the claim is no longer current; the call was not made",
                                operation_id=str(held.operation_id))
    return lease_until


async def end_leases_of(conn: Conn, worker_id: str) -> int:
    """End the leases still held under ``worker_id`` — only by that worker's successor, at
    start-up, with an identity no other live process holds. Returns how many."""
    return int(await conn.fetchval(Q["end_leases_of"], worker_id))


def never_sent(tried: Sequence[dict[str, Any]], generation: int) -> bool:
    """Whether the claim of ``generation`` — taken from ``pending`` — made no attempt that may
    have reached its connector (none marked by ``mark_sending``).

    Only a claim taken from ``pending`` (a ``dispatch`` attempt first) qualifies: before it,
    nothing was outstanding. A take-over's history reaches further back, so it never does.
    """
    held = [a for a in tried if a["fencing_generation"] == generation]
    return bool(held) and held[0]["kind"] == "dispatch" and all(
        a["sent_at"] is None for a in held)


def may_still_act(tried: Sequence[dict[str, Any]], lease_until: datetime | None, *,
                  now: datetime | None = None) -> bool:
    """Whether an earlier attempt may still reach the provider: stamped as sent, never closed,
    and its claim's lease ended less than that attempt's call bound (plus margin) ago (issue 18
    §1).

    The pre-call check renews the lease to cover each call, so a worker that is merely slow
    has finished by its lease's end; one that stalled (a GC pause, a frozen VM) may still send
    for up to a call bound after it. Declaring ``unknown`` — or resolving — inside that window
    could be contradicted by its late effect, so the reconciler waits it out.

    The bound is the one the attempt's pre-call mark covered, margin included (``call_bound_s``,
    migration 0052): what its worker used, the executor's override or the contract's. An
    attempt that recorded none (marked before 0052) is given the longest bound any worker may
    use (``MAX_CALL_S``) plus the margin, since nobody knows which one it had.
    """
    if lease_until is None:
        return False
    bounds = [a.get("call_bound_s") or MAX_CALL_S + CALL_MARGIN_S for a in tried
              if a["sent_at"] is not None and a["finished_at"] is None]
    if not bounds:
        return False
    return (now or datetime.now(UTC)) < lease_until + timedelta(seconds=max(bounds))


def past_retention(tried: Sequence[dict[str, Any]], retention: timedelta | None, *,
                   now: datetime | None = None) -> str | None:
    """Why resending by key is no longer safe, or None while it is.

    A provider dedupes a key only for its retention window: once the first send that may have
    reached it is older than the window minus a margin (a tenth, at least a second), a lookup
    that finds nothing proves nothing and a resend may create a second effect (issue 18).
    """
    sent = [a["sent_at"] for a in tried if a.get("sent_at") is not None]
    if retention is None or not sent:
        return None
    first = min(sent)
    if (now or datetime.now(UTC)) < _retention_edge(first, retention):
        return None
    return common.reason_text(
        f"the first send ({first.isoformat(timespec='seconds')}) is past the provider's "
        f"key retention ({retention}) less a margin: a resend could make a second effect "
        "and a lookup proves nothing; an operator must check the provider")


def _retention_edge(first_sent: datetime, retention: timedelta) -> datetime:
    """Where recovery by key stops: the retention window less a margin (a tenth, >= 1 s)."""
    return first_sent + retention - max(retention / 10, timedelta(seconds=1))


def looked_up_past_retention(tried: Sequence[dict[str, Any]],
                             retention: timedelta | None) -> bool:
    """Whether a reconciliation already looked this command up past the retention edge: its
    verdict (``unknown``, for an operator) stands, and another lookup proves nothing — so
    the reconciler leaves it alone instead of taking a new generation every pass."""
    sent = [a["sent_at"] for a in tried if a.get("sent_at") is not None]
    if retention is None or not sent:
        return False
    edge = _retention_edge(min(sent), retention)
    return any(a["kind"] == "lookup" and a["started_at"] >= edge for a in tried)


async def finish_attempt(conn: Conn, held: Claim, result: str, detail: str) -> None:
    """Close an attempt without finalizing the command (e.g. before a resend)."""
    async with repository.transaction(conn, held.tenant_id) as tx:
        await tx.execute(Q["finish_attempt"], held.tenant_id, held.attempt_id, result,
                         common.reason_text(detail))


async def finalize(
    conn: Conn, held: Claim, state: FinalState, *, receipt: str | None = None,
    reason: str | None = None, traceparent: str | None = None, also: Also | None = None,
) -> None:
    """Record the outcome, conditional on still holding the claim (R5.3).

    In the same transaction: the attempt is closed, an audit event is written and, for
    terminal and unknown states, the outcome event for ``agent.outcomes.v1``; then ``also``
    (e.g. the dispatch-time decision that denied the command).

    Raises:
        StaleClaim: the claim was taken over; nothing was written.
    """
    row = final_row(held, state, receipt=receipt, reason=reason, traceparent=traceparent)
    async with repository.transaction(conn, held.tenant_id) as tx:
        # The outcome, the attempt's end and both events in one statement.
        (held_on,) = await steps.finalize(tx, held.tenant_id, [row])
        if not held_on:
            raise stale_outcome(held)
        if also is not None:
            await also(tx)


def stale_outcome(held: Claim) -> errors.StaleClaim:
    """What a worker whose outcome the ledger refused (the claim was taken over) is told."""
    return errors.StaleClaim("the lease was taken over; this worker's outcome is not recorded",
                             operation_id=str(held.operation_id), generation=held.generation)


def final_row(held: Claim, state: FinalState, *, receipt: str | None = None,
              reason: str | None = None, traceparent: str | None = None) -> steps.FinalRow:
    """The outcome of ``held`` as the finalize statement writes it: state, receipt, reason,
    the attempt's end, the audit event and (terminal or unknown) the outcome event."""
    # Text from a provider is made storable at the connector boundary; again here, so that no
    # value can make the one write that records an outcome fail (issue 38 §2).
    if receipt is not None:
        receipt = outcomes.receipt_text(receipt, str(held.operation_id))
    if reason is not None:
        reason = common.reason_text(reason)
    # Built before any write: a payload that cannot be built (a success without a receipt)
    # writes nothing.
    audit = repository.event_json(
        {"operation_id": str(held.operation_id), "state": state, "receipt": receipt,
         "reason": reason, "worker_id": held.worker_id, "fencing_generation": held.generation})
    outcome = outcomes.event_payload(held.tenant_id, held.operation_id, state, receipt, reason)
    return steps.FinalRow(
        held, state, receipt, reason, "error" if state == "pending" else state,
        common.reason_text(reason or receipt or ""), audit,
        None if outcome is None else repository.event_json(outcome), traceparent)


async def record_fence(conn: Conn, held: Claim, *, advanced: bool, detail: str,
                       traceparent: str | None = None) -> None:
    """Audit a fence call made for ``held``'s generation (a take-over's, issue 37): whether
    the provider now refuses every earlier generation of the key."""
    await fence_recorded(conn, held.tenant_id, held.operation_id, held.generation,
                         advanced=advanced, detail=detail, traceparent=traceparent)


async def fence_recorded(conn: Conn, tenant_id: UUID, operation_id: UUID, generation: int, *,
                         advanced: bool, detail: str, traceparent: str | None = None) -> None:
    """Audit a fence call for ``generation``: ``command.fence_advanced`` or
    ``command.fence_not_advanced`` with why."""
    async with repository.transaction(conn, tenant_id) as tx:
        await repository.append_event(
            tx, tenant_id=tenant_id, operation_id=operation_id, family="audit",
            type="command.fence_advanced" if advanced else "command.fence_not_advanced",
            payload={"operation_id": str(operation_id), "fencing_generation": generation,
                     "detail": common.reason_text(detail)},
            traceparent=traceparent)


async def advance_generation(conn: Conn, tenant_id: UUID, operation_id: UUID) -> int:
    """A new fencing generation for an ``unknown`` command nobody holds, so an operator's
    resolution can fence every earlier attempt out at the provider before it is recorded.

    Raises:
        InvalidTransition: the command is not ``unknown``.
    """
    async with repository.transaction(conn, tenant_id) as tx:
        generation = await tx.fetchval(Q["advance_generation"], tenant_id, operation_id)
    if generation is None:
        raise errors.InvalidTransition("only an unknown command can be resolved",
                                       operation_id=str(operation_id))
    return int(generation)


async def attempts(conn: Conn, tenant_id: UUID, operation_id: UUID) -> list[dict[str, Any]]:
    """The attempts of a command, oldest first."""
    async with repository.transaction(conn, tenant_id) as tx:
        rows = await tx.fetch(Q["attempts"], tenant_id, operation_id)
    return [dict(r) for r in rows]


async def requeue(
    conn: Conn, held: Claim, *, reason: str, traceparent: str | None = None,
    max_generations: int = MAX_GENERATIONS, delay_s: float | None = None,
) -> Requeued:
    """Release the claim to ``pending`` and renew the dispatch obligation, in one transaction.

    Only for a command proven safe to send again: nothing reached the provider, or the
    connector dedupes by key and a lookup found no effect. At ``max_generations`` it is not
    requeued but finalized ``unknown`` for an operator, the reason naming the cap: no retry
    path is unbounded. With ``delay_s`` (see ``backoff``) the obligation is not renewed now:
    ``retry_at`` records when, and the reconciler publishes it once due (0019).

    Returns:
        ``requeued``, or ``capped`` when the command was held as ``unknown`` instead.

    Raises:
        StaleClaim: the claim was taken over; nothing was written.
    """
    if held.generation >= max_generations:
        await finalize(conn, held, "unknown", traceparent=traceparent, reason=common.reason_text(
            f"retry cap: {held.generation} dispatch generations without a definitive answer "
            f"(last: {reason[:200]}); held for an operator"))
        return "capped"
    reason = common.reason_text(reason)
    async with repository.transaction(conn, held.tenant_id) as tx:
        connector = await tx.fetchval(
            Q["release"], held.tenant_id, held.operation_id, held.token, reason, delay_s
        )
        if connector is None:
            raise errors.StaleClaim("the lease was taken over; not requeued",
                                    operation_id=str(held.operation_id))
        await tx.execute(Q["finish_attempt"], held.tenant_id, held.attempt_id, "error",
                         reason)
        await tx.execute(Q["drop_obligation"], held.tenant_id, held.operation_id)
        if delay_s is None:
            await tx.execute(Q["renew_obligation"], held.tenant_id, held.operation_id,
                             connector, traceparent, "command.requeued")
        payload: dict[str, Any] = {
            "operation_id": str(held.operation_id), "reason": reason,
            "worker_id": held.worker_id, "fencing_generation": held.generation}
        if delay_s is not None:
            payload["retry_in_s"] = round(delay_s, 3)
        await repository.append_event(
            tx, tenant_id=held.tenant_id, operation_id=held.operation_id, family="audit",
            type="command.requeued", payload=payload, traceparent=traceparent)
    return "requeued"


async def needs_reconciliation(
    conn: Conn, *, limit: int = 100, lookup_connectors: Sequence[str] = (),
    max_generations: int = MAX_GENERATIONS,
) -> list[dict[str, Any]]:
    """Commands with an expired lease, then `unknown` ones of connectors that can be looked
    up, across tenants (keys only). Other `unknown` commands wait for an operator, and so do
    those held at the retry cap (``max_generations``)."""
    async with repository.transaction(conn, None) as tx:
        rows = await tx.fetch(Q["needs_reconciliation"], limit, list(lookup_connectors),
                              max_generations)
    return [dict(r) for r in rows]


class UnknownBacklog(NamedTuple):
    """One connector's commands in state ``unknown``, across tenants."""

    connector: str
    commands: int
    # Seconds since the oldest of them was first sent (its ``dispatched_at``, migration 0023).
    oldest_age_s: float


async def unknown_backlog(conn: Conn) -> list[UnknownBacklog]:
    """Per connector that has any, how many commands are ``unknown`` now and how long ago
    the oldest of them became so, across tenants (counts only; the reconciler's role)."""
    async with repository.transaction(conn, None) as tx:
        rows = await tx.fetch(Q["unknown_backlog"])
    return [UnknownBacklog(r["connector"], int(r["commands"]), float(r["oldest_age_s"]))
            for r in rows]


async def expiry_reason(conn: Conn, tenant_id: UUID, decision_id: UUID) -> str:
    """Why a command past its ``expires_at`` is not dispatched, saying who had authorized it.

    An approved command's validity is its approval's; a command the policy allowed on its own
    (no approval required) was never approved by anyone, and its reason must not say so.
    """
    async with repository.transaction(conn, tenant_id) as tx:
        row = await tx.fetchrow(Q["authorized_by"], tenant_id, decision_id)
    if row is not None and row["stage"] == "approval":
        return (f"the approval (by {row['principal_id']}) expired before dispatch; "
                "nothing was sent")
    return ("the authorization expired before dispatch: the policy allowed it without a "
            "human approval, and it was not dispatched within its validity; nothing was sent")


def backoff(generation: int, *, base_s: float = RETRY_BASE_S, cap_s: float = RETRY_CAP_S,
            rng: random.Random | None = None) -> float:
    """Seconds before generation ``generation + 1`` may be sent after nothing was sent.

    Exponential (base·2^(g-1), at most ``cap_s``) with "equal jitter": between half and all
    of it, so commands refused by one outage do not all come back at the same instant.
    """
    ceiling = min(cap_s, base_s * 2.0 ** max(generation - 1, 0))
    return ceiling / 2 + (rng or _JITTER).uniform(0, ceiling / 2)


async def stranded_pending(
    conn: Conn, *, older_than_s: float, limit: int = 100
) -> list[dict[str, Any]]:
    """Commands to publish again: pending for longer than ``older_than_s`` with their
    obligation gone from the outbox (published, the relay swept it, yet never claimed), or
    whose requeue backoff ran out (``retry_at`` set). Keys only, across tenants."""
    async with repository.transaction(conn, None) as tx:
        rows = await tx.fetch(Q["stranded_pending"], limit, float(older_than_s))
    return [dict(r) for r in rows]


async def republish(
    conn: Conn, tenant_id: UUID, operation_id: UUID, *, older_than_s: float,
    traceparent: str | None = None, retry_due: bool = False,
) -> bool:
    """Renew the dispatch obligation of a stranded command, or of a requeued one whose backoff
    ran out (``retry_due``: its ``command.requeued`` audit event was written at the requeue);
    ``False`` if it no longer qualifies.

    Only ``pending`` commands qualify: nothing was ever sent for them, so publishing the
    obligation again can at most wake an executor that claims the command once.
    """
    async with repository.transaction(conn, tenant_id) as tx:
        connector = await tx.fetchval(Q["touch_stranded"], tenant_id, operation_id,
                                      float(older_than_s))
        if connector is None:
            return False
        if retry_due:
            # The backoff of a requeue ran out: its obligation, deferred by ``requeue``.
            await tx.execute(Q["renew_obligation"], tenant_id, operation_id, connector,
                             traceparent, "command.requeued")
            return True
        await tx.execute(Q["renew_obligation"], tenant_id, operation_id, connector,
                         traceparent, "command.republished")
        await repository.append_event(
            tx, tenant_id=tenant_id, operation_id=operation_id, family="audit",
            type="command.republished",
            payload={"operation_id": str(operation_id),
                     "reason": "published (its outbox row was swept) and never claimed: the "
                               "record was lost, or no executor consumes its topic",
                     "pending_for_more_than_s": older_than_s},
            traceparent=traceparent,
        )
    return True
