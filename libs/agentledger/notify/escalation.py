"""Escalation and expiry notices of pending approvals (issue 42 item 3), swept by the notifier.

A rule with ``escalate_to`` and ``escalate_after`` (agentledger.notify.routing): a request of
that rule still pending ``escalate_after`` after it was created is escalated **once** — one
conditional update (only while pending and not yet escalated: two notifiers racing escalate
it once), an ``approval.escalated`` audit event and the escalation group's notifications, all
in one transaction. Nothing else changes: the request keeps its expiry, its quorum and its
votes, and it still expires as before (the reconciler's ``approvals.expire_due``, with its
``approval.expired`` audit event).

Who may decide after escalation: any approver the directory and Cedar allow, as before, and
for a quorum rule one holding the request's role. check-config requires the escalation group
to have the rule group's role, so the escalated group's members may decide (and the first
group's still may); their votes count toward the same N.

An expired request of a routed rule is announced to its group (and to the escalation group,
if it was escalated) by ``expired`` notifications, written by this sweep after the expiry
(the expiry itself is the reconciler's statement; the keys make the sweep idempotent).

Time: the sweep compares against the notifier's clock (``Notifier.clock``): the seam the
tests move instead of sleeping. Expiry follows the database's clock, as it always has.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final
from uuid import UUID

from agentledger.approvals import repository as approvals
from agentledger.ledger import repository as ledger
from agentledger.notify import outbox, routing

# Expired requests older than this are not announced any more: a notifier down for a day
# does not wake people for requests long gone, and the sweep's scan stays bounded.
EXPIRY_NOTICE_WINDOW: Final = timedelta(days=1)


async def escalate_due(conn: ledger.Conn, router: outbox.Router, *, now: datetime,
                       limit: int = 100) -> list[UUID]:
    """Escalate every request whose window has passed at ``now``; returns their ids."""
    done: list[UUID] = []
    for rule in router.rules.rules:
        if rule.escalate_to is None or rule.escalate_after is None:
            continue
        async with ledger.transaction(conn, None) as tx:
            due = await tx.fetch(outbox.Q["escalation_due"], rule.name,
                                 now - rule.escalate_after, now, limit)
        for row in due:
            if await _escalate(conn, router, approvals.Approval.from_row(row), rule.escalate_to,
                               now):
                done.append(row["approval_id"])
    return done


async def _escalate(conn: ledger.Conn, router: outbox.Router, a: approvals.Approval,
                    group: str, now: datetime) -> bool:
    async with ledger.transaction(conn, a.tenant_id) as tx:
        row = await tx.fetchrow(outbox.Q["escalate"], a.tenant_id, a.approval_id, now, group)
        if row is None:
            return False  # decided, or escalated by another notifier, meanwhile
        await ledger.append_event(
            tx, tenant_id=a.tenant_id, operation_id=a.operation_id, family="audit",
            type="approval.escalated",
            payload={"approval_id": str(a.approval_id), "action": a.action,
                     "principal_id": a.principal_id, "request_hash": a.hash_hex,
                     "rule": a.quorum_rule, "escalated_to": group,
                     "escalated_at": now.isoformat(), "expires_at": a.expires_at.isoformat()},
            traceparent=a.traceparent, tracestate=a.tracestate)
        await router.write(tx, a, "escalated", now)
    return True


async def announce_expired(conn: ledger.Conn, router: outbox.Router, *, now: datetime,
                           limit: int = 100) -> list[UUID]:
    """Write the ``expired`` notifications of routed requests that expired; returns their ids."""
    # Only rules whose group someone is told through: a request no row can be written for
    # would be selected again every period.
    routed = [r.name for r in router.rules.rules
              if routing.recipients(router.rules, r.group, router.kinds)]
    if not routed:
        return []
    async with ledger.transaction(conn, None) as tx:
        rows = await tx.fetch(outbox.Q["expired_unnotified"], now - EXPIRY_NOTICE_WINDOW,
                              routed, limit)
    done: list[UUID] = []
    for row in rows:
        a = approvals.Approval.from_row(row)
        async with ledger.transaction(conn, a.tenant_id) as tx:
            if await router.write(tx, a, "expired", now, escalated_to=row["escalated_to"]):
                done.append(a.approval_id)
    return done


__all__ = ["EXPIRY_NOTICE_WINDOW", "announce_expired", "escalate_due"]
