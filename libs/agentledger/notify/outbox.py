"""The notification outbox (migration 0042): the only code that runs ``queries.sql``.

Rows are written in the transaction that creates (or escalates, or expires) the request they
are about, so a crash never loses one; the notifier (:mod:`agentledger.notify.worker`) claims
them with a lease, sends, and marks them. One row per request x recipient x channel x kind,
keyed by :func:`key`: every redelivery of a notification carries the same key.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, cast
from uuid import UUID

from agentledger import sql
from agentledger.approvals import quorum as quorum_mod
from agentledger.approvals import repository as approvals
from agentledger.ledger import repository as ledger
from agentledger.notify import plugins, routing

Q = sql.load(Path(__file__).with_name("queries.sql"))


def key(approval_id: UUID, recipient: str, channel: str, kind: routing.Kind) -> str:
    """The notification's idempotency key: the same for the same request, recipient, channel
    and kind, whoever computes it and however often (a UUIDv5 under the approval id)."""
    return str(uuid.uuid5(approval_id, f"{kind}\x00{channel}\x00{recipient}"))


def link(console_url: str, approval_id: UUID) -> str:
    """The console page of exactly this request (its route: ``/approvals/{approval_id}``)."""
    return f"{console_url.rstrip('/')}/approvals/{approval_id}"


@dataclass(frozen=True)
class Router:
    """Turns an approval request into its notification rows, per the operator's routing."""

    rules: quorum_mod.ApprovalRules
    kinds: Mapping[str, plugins.ContactKind]

    @classmethod
    def of(cls, rules: quorum_mod.ApprovalRules) -> Router | None:
        """The file's router; None when it routes nowhere (no channels: a v1 file).

        Raises:
            ConfigurationError: a channel's plugin is not installed.
        """
        return cls(rules, routing.contact_kinds(rules)) if rules.channels else None

    def groups(self, a: approvals.Approval, kind: routing.Kind,
               escalated_to: str | None = None) -> list[str]:
        """The groups a kind of notification of ``a`` goes to: the rule's group when it is
        requested; the rule's ``escalate_to`` when escalated; both (if it was escalated) when
        it expired. None matched a rule: nobody."""
        rule = self.rules.rule(a.quorum_rule)
        if rule is None:
            return []
        if kind == "requested":
            return [rule.group]
        if kind == "escalated":
            return [rule.escalate_to] if rule.escalate_to else []
        return [rule.group] + ([escalated_to] if escalated_to else [])

    def rows(self, a: approvals.Approval, kind: routing.Kind,
             escalated_to: str | None = None) -> list[dict[str, Any]]:
        """The rows to write (pure), one per key."""
        message = {"operation_id": str(a.operation_id), "action": a.action,
                   "required_approvals": a.required_approvals,
                   "expires_at": a.expires_at.isoformat()}
        out: dict[str, dict[str, Any]] = {}
        for group in self.groups(a, kind, escalated_to):
            for r in routing.recipients(self.rules, group, self.kinds):
                k = key(a.approval_id, r.member, r.channel, kind)
                out.setdefault(k, {
                    "idempotency_key": k, "tenant_id": str(a.tenant_id),
                    "approval_id": str(a.approval_id), "kind": kind, "group_name": group,
                    "recipient": r.member, "channel": r.channel, "address": r.address,
                    "message": message})
        return list(out.values())

    async def write(self, tx: ledger.Conn, a: approvals.Approval, kind: routing.Kind,
                    now: datetime | None = None, escalated_to: str | None = None) -> int:
        """Write ``a``'s notifications of ``kind`` inside the caller's transaction; returns
        how many rows were planned (a row already written is left as it is)."""
        rows = self.rows(a, kind, escalated_to)
        if rows:
            await tx.execute(Q["write_notifications"], json.dumps(rows),
                             now or a.created_at)
        return len(rows)

    async def requested(self, tx: ledger.Conn, a: approvals.Approval) -> None:
        """The hook :func:`agentledger.approvals.request` calls with the new request."""
        await self.write(tx, a, "requested")


@dataclass(frozen=True, slots=True)
class Claimed:
    """A row leased to this worker."""

    key: str
    tenant_id: UUID
    approval_id: UUID
    kind: routing.Kind
    group: str
    recipient: str
    channel: str
    address: str
    message: Mapping[str, Any]
    attempts: int
    request_state: str = "pending"  # the request's state when claimed
    lease: str = ""  # this claim's own token: only it settles the row

    @property
    def moot(self) -> bool:
        """Whether the request closed before this notice went out: asking someone to decide
        (``requested``, ``escalated``) what is already decided, superseded or expired."""
        return self.kind != "expired" and self.request_state != "pending"

    @classmethod
    def from_row(cls, row: Any) -> Claimed:
        message = row["message"]
        return cls(row["idempotency_key"], row["tenant_id"], row["approval_id"],
                   cast(routing.Kind, row["kind"]), row["group_name"], row["recipient"],
                   row["channel"], row["address"],
                   json.loads(message) if isinstance(message, str) else message,
                   row["attempts"], row.get("request_state") or "pending",
                   row.get("lease_owner") or "")

    def notification(self, console_url: str) -> plugins.Notification:
        return plugins.Notification(
            key=self.key, kind=self.kind, tenant_id=self.tenant_id,
            approval_id=self.approval_id, operation_id=UUID(self.message["operation_id"]),
            action=self.message["action"], group=self.group, recipient=self.recipient,
            address=self.address, link=link(console_url, self.approval_id),
            required_approvals=int(self.message["required_approvals"]),
            expires_at=datetime.fromisoformat(self.message["expires_at"]))


async def claim(conn: ledger.Conn, *, worker: str, now: datetime, lease: timedelta,
                limit: int) -> list[Claimed]:
    """Lease up to ``limit`` due rows across tenants to ``worker`` until ``now + lease``."""
    async with ledger.transaction(conn, None) as tx:
        rows = await tx.fetch(Q["claim"], worker, now, now + lease, limit)
    return [Claimed.from_row(r) for r in rows]


async def mark_sent(conn: ledger.Conn, c: Claimed, *, now: datetime) -> bool:
    """Whether this worker's mark counted (False: its lease passed and another took over)."""
    async with ledger.transaction(conn, None) as tx:
        return await tx.fetchval(Q["mark_sent"], c.key, c.lease, now) is not None


async def cancel(conn: ledger.Conn, c: Claimed) -> bool:
    """Do not send a notice whose request closed (:attr:`Claimed.moot`)."""
    async with ledger.transaction(conn, None) as tx:
        return await tx.fetchval(Q["cancel"], c.key, c.lease,
                                 f"the request is {c.request_state}") is not None


async def back_off(conn: ledger.Conn, c: Claimed, *, until: datetime, error: str) -> bool:
    async with ledger.transaction(conn, None) as tx:
        return await tx.fetchval(Q["back_off"], c.key, c.lease, until, error[:500]) is not None


async def mark_failed(conn: ledger.Conn, c: Claimed, *, error: str) -> bool:
    """Give up on a row, with an ``approval.notification_failed`` audit event in the same
    transaction (an operator sees who was never told)."""
    async with ledger.transaction(conn, c.tenant_id) as tx:
        row = await tx.fetchrow(Q["mark_failed"], c.key, c.lease, error[:500])
        if row is None:
            return False
        await ledger.append_event(
            tx, tenant_id=c.tenant_id, operation_id=UUID(c.message["operation_id"]),
            family="audit", type="approval.notification_failed",
            payload={"approval_id": str(c.approval_id), "idempotency_key": c.key,
                     "kind": c.kind, "recipient": c.recipient, "channel": c.channel,
                     "attempts": c.attempts, "error": error[:500]})
    return True


async def for_approval(conn: ledger.Conn, approval_id: UUID) -> list[dict[str, Any]]:
    """Every notification row of one request, as stored (cross-tenant roles, tests)."""
    async with ledger.transaction(conn, None) as tx:
        return [dict(r) for r in await tx.fetch(Q["for_approval"], approval_id)]


__all__ = ["Claimed", "Router", "back_off", "cancel", "claim", "for_approval", "key", "link",
           "mark_failed", "mark_sent"]
