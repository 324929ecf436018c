"""What a provider says after the ledger moved on: kept, never dropped (issue 37 §3).

A worker whose claim was taken over (a take-over after its lease ran out, an operator's
resolution) may still get the provider's answer to a call it sent before: a process that
stalled and resumed, a slow network. The ledger no longer lets that worker record an
outcome (R5.3), but what the provider said is a fact about one of its attempts, so it is
recorded on that attempt — and weighed against what the ledger says:

- ``applied`` while the command is ``unknown`` and nobody holds it: **settled** — the
  provider's answer to this command's own attempt is the evidence a lookup would give, so the
  command becomes ``succeeded`` with its receipt (audited as settled by a late answer);
- ``applied`` while the command is ``succeeded`` with that receipt: **consistent**;
- ``applied`` while the command is decided otherwise (resolved ``failed``, refused, expired,
  or ``succeeded`` with another receipt): **contradicted** — a flag on the command, an audit
  event ``command.contradicted``, the metric ``agentledger.contradictions`` and its alert;
  the recorded state stays what was decided, and an operator acts (docs/operations.md);
- anything else, or a command still being dispatched: **recorded** on the attempt only. The
  reconciler's sweep weighs a late ``applied`` again once the command is decided
  (:func:`late_applied` + :func:`weigh`), so a late answer that crossed a decision is never
  left unweighed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from uuid import UUID

from agentledger import errors, sql
from agentledger.contracts import commands, common, outcomes
from agentledger.ledger import repository
from agentledger.ledger.repository import Conn

Q = sql.load(Path(__file__).with_name("late.sql"))

Kind = Literal["applied", "precondition_failed", "refused", "fenced", "not_sent", "in_doubt"]
Disposition = Literal["settled", "consistent", "contradicted", "recorded"]


@dataclass(frozen=True)
class Answer:
    """A provider's answer as the ledger keeps it on an attempt (classified and storable at
    the connector boundary)."""

    kind: Kind
    text: str
    receipt: str | None = None

    def __post_init__(self) -> None:
        if (self.kind == "applied") != (self.receipt is not None):
            raise ValueError("an applied answer, and only one, carries a receipt")


@dataclass(frozen=True)
class Weighed:
    """What a late answer did to its command."""

    disposition: Disposition
    state: str
    connector: str


async def record(conn: Conn, tenant_id: UUID, operation_id: UUID, attempt_id: UUID,
                 answer: Answer, *, worker_id: str, traceparent: str | None = None) -> Weighed:
    """Record ``answer`` on the attempt ``attempt_id`` and weigh it against the command, in
    one transaction (the command's row locked first)."""
    receipt = (None if answer.receipt is None
               else outcomes.receipt_text(answer.receipt, str(operation_id)))
    text = common.reason_text(answer.text) or answer.kind
    async with repository.transaction(conn, tenant_id) as tx:
        command = await tx.fetchrow(Q["command_for_late_answer"], tenant_id, operation_id)
        if command is None:
            raise errors.CommandNotFound(operation_id=str(operation_id))
        generation = await tx.fetchval(Q["record_late_answer"], tenant_id, attempt_id,
                                       answer.kind, receipt, text)
        weighed = Weighed("recorded", command["state"], command["connector"])
        if answer.kind == "applied" and receipt is not None:
            weighed = await _weigh(tx, tenant_id, operation_id, dict(command), receipt,
                                   generation, traceparent)
        await repository.append_event(
            tx, tenant_id=tenant_id, operation_id=operation_id, family="audit",
            type="command.late_answer",
            payload={"operation_id": str(operation_id), "attempt_id": str(attempt_id),
                     "worker_id": worker_id, "fencing_generation": generation,
                     "answer": answer.kind, "receipt": receipt, "detail": text,
                     "state": weighed.state, "disposition": weighed.disposition},
            traceparent=traceparent)
    return weighed


async def weigh(conn: Conn, tenant_id: UUID, operation_id: UUID, *,
                traceparent: str | None = None) -> Weighed | None:
    """Weigh the newest late ``applied`` of a command against it again (the reconciler's
    sweep, for answers whose own record crossed a decision). None: nothing to weigh."""
    async with repository.transaction(conn, tenant_id) as tx:
        command = await tx.fetchrow(Q["command_for_late_answer"], tenant_id, operation_id)
        found = await tx.fetch(Q["late_applied_of"], tenant_id, operation_id)
        if command is None or not found:
            return None
        newest = found[0]
        return await _weigh(tx, tenant_id, operation_id, dict(command), newest["late_receipt"],
                            newest["fencing_generation"], traceparent)


async def _weigh(tx: Conn, tenant_id: UUID, operation_id: UUID, command: dict[str, Any],
                 receipt: str, generation: int, traceparent: str | None) -> Weighed:
    state, connector = command["state"], command["connector"]
    if state == "unknown" and command["claim_token"] is None:
        why = common.reason_text(
            f"settled by the provider's late answer to the attempt of generation {generation}: "
            "it applied the effect")
        settled = await tx.fetchval(Q["settle_by_late_answer"], tenant_id, operation_id,
                                    receipt, why)
        if settled is not None:
            payload = {"operation_id": str(operation_id), "state": "succeeded",
                       "receipt": receipt, "reason": why, "settled_by": "late_answer",
                       "fencing_generation": generation}
            await repository.append_event(tx, tenant_id=tenant_id, operation_id=operation_id,
                                          family="audit", type="command.succeeded",
                                          payload=payload, traceparent=traceparent)
            await repository.append_event(
                tx, tenant_id=tenant_id, operation_id=operation_id, family="outcome",
                type="outcome.succeeded",
                payload=outcomes.event_payload(tenant_id, operation_id, "succeeded", receipt,
                                               why) or {},
                traceparent=traceparent)
            return Weighed("settled", "succeeded", connector)
    if state == "succeeded" and command["provider_receipt"] == receipt:
        return Weighed("consistent", state, connector)
    if state in commands.TERMINAL_STATES:
        recorded = (f"succeeded with receipt {command['provider_receipt']}"
                    if state == "succeeded" else state)
        why = common.reason_text(
            f"the provider answered applied (receipt {receipt}) to the attempt of generation "
            f"{generation} after the command was recorded {recorded}")
        marked = await tx.fetchval(Q["mark_contradicted"], tenant_id, operation_id, why)
        if marked is not None:
            await repository.append_event(
                tx, tenant_id=tenant_id, operation_id=operation_id, family="audit",
                type="command.contradicted",
                payload={"operation_id": str(operation_id), "state": state,
                         "recorded_receipt": command["provider_receipt"],
                         "provider_receipt": receipt, "fencing_generation": generation,
                         "contradiction": why},
                traceparent=traceparent)
            return Weighed("contradicted", state, connector)
        return Weighed("recorded", state, connector)  # marked before: counted then
    return Weighed("recorded", state, connector)


async def late_applied(conn: Conn, *, limit: int = 100) -> list[dict[str, Any]]:
    """Across tenants, keys only: commands a late ``applied`` still has to settle or mark."""
    async with repository.transaction(conn, None) as tx:
        rows = await tx.fetch(Q["late_applied"], limit)
    return [dict(r) for r in rows]
