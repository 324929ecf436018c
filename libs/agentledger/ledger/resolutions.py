"""Operator reconciliation: the ``unknown`` commands of a tenant and their resolution (R6.6).

Split from ``dispatch`` (the worker's side of the ledger); same queries file.
"""

from __future__ import annotations

from typing import Any, Literal
from uuid import UUID

from agentledger import errors
from agentledger.contracts import common, outcomes
from agentledger.ledger import repository
from agentledger.ledger.dispatch import MAX_CALL_S, Q, ReceiptCheck
from agentledger.ledger.repository import Conn


async def resolve_unknown(
    conn: Conn, tenant_id: UUID, operation_id: UUID, *, outcome: Literal["succeeded", "failed"],
    resolved_by: str, reason: str, receipt_check: ReceiptCheck, check_detail: str,
    receipt: str | None = None, evidence: str | None = None, override_acting: bool = False,
    max_call_s: float = MAX_CALL_S, provisional: str | None = None,
) -> UUID:
    """An operator resolves an ``unknown`` command, recorded with who, when, why (R6.6).

    The caller has verified ``resolved_by`` as a current operator and checked the outcome with
    the provider where it can be asked (``executor.resolution.resolve`` does both); what that
    check rests on (``receipt_check``, ``check_detail``) is recorded with the resolution, in
    its reason and audit event, so an auditor never mistakes an operator's word for a
    provider's confirmation.

    Refused while an attempt that may have reached the provider can still act (stamped, never
    closed, younger than ``max_call_s``): a stalled worker's call could land after the
    resolution and contradict it. ``override_acting`` resolves anyway; the risk is recorded
    in the resolution's reason and audit event.

    ``provisional``: why a late call may still land and contradict this resolution (a
    provider that cannot be fenced, issue 37); recorded with it and shown by ``explain``.

    Raises:
        ValidationFailed: ``succeeded`` without a receipt (never a success without one).
        InvalidTransition: the command is not ``unknown``.
        AttemptMayStillAct: an attempt may still act, and no override.
    """
    if outcome == "succeeded" and not receipt:
        raise errors.ValidationFailed("a success needs the provider's receipt as evidence")
    async with repository.transaction(conn, tenant_id) as tx:
        acting = await tx.fetch(Q["acting_attempts"], tenant_id, operation_id, max_call_s)
        if acting and not override_acting:
            first = acting[0]
            raise errors.AttemptMayStillAct(
                f"attempt {first['attempt_id']} (worker {first['worker_id']}, generation "
                f"{first['fencing_generation']}) was sent at {first['sent_at'].isoformat()} and "
                f"may act until {max_call_s:.0f} s after; resolve after that, or override "
                "knowing its effect may still land", operation_id=str(operation_id))
        reason = f"[{receipt_check}: {check_detail[:200]}] {reason}"
        if provisional:
            reason = f"[PROVISIONAL: {provisional[:200]}] " + reason
        if acting:
            reason = (f"[OVERRIDE: resolved while {len(acting)} attempt(s) may still act] "
                      + reason)
        short = common.reason_text(reason)
        row = await tx.fetchrow(Q["resolve_unknown"], tenant_id, operation_id, outcome, receipt,
                                short)
        if row is None:
            raise errors.InvalidTransition("only an unknown command can be resolved",
                                           operation_id=str(operation_id))
        resolution = await tx.fetchrow(Q["record_resolution"], tenant_id, operation_id,
                                       resolved_by, outcome, receipt, reason, evidence,
                                       provisional is not None)
        assert resolution is not None
        await repository.append_event(
            tx, tenant_id=tenant_id, operation_id=operation_id, family="audit",
            type="command.reconciled",
            payload={"operation_id": str(operation_id), "outcome": outcome,
                     "resolved_by": resolved_by, "reason": short, "receipt": receipt,
                     "resolution_id": str(resolution["resolution_id"]),
                     "receipt_check": receipt_check,
                     "check_detail": common.reason_text(check_detail),
                     "overrode_acting_attempts": len(acting),
                     "provisional": provisional is not None,
                     "provisional_reason": (None if provisional is None
                                            else common.reason_text(provisional))},
        )
        await repository.append_event(
            tx, tenant_id=tenant_id, operation_id=operation_id, family="outcome",
            type=f"outcome.{outcome}",
            payload=outcomes.event_payload(tenant_id, operation_id, outcome, receipt, reason) or {},
        )
    resolution_id: UUID = resolution["resolution_id"]
    return resolution_id


async def unknown_commands(conn: Conn, tenant_id: UUID) -> list[dict[str, Any]]:
    """A tenant's commands awaiting reconciliation by an operator."""
    async with repository.transaction(conn, tenant_id) as tx:
        rows = await tx.fetch(Q["unknown_commands"], tenant_id)
    return [dict(r) for r in rows]
