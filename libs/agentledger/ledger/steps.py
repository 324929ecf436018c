"""The executor's three writes — claim, pre-call mark, outcome — as set-based statements over
the rows of one tenant (issue 41, lever 1b; the SQL and what each guarantees: ``steps.sql``).

Each function runs ONE statement inside the caller's tenant-bound transaction and returns
one result per row, in order. One row is what :mod:`agentledger.ledger.dispatch` sends for a
single command; the executor sends the rows its concurrent calls submit together
(:mod:`agentledger.ledger.coalesce`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from uuid import UUID

import asyncpg

from agentledger import sql
from agentledger.ledger import repository
from agentledger.ledger.repository import Conn

Q = sql.load(Path(__file__).with_name("steps.sql"))

# What an attempt whose claim was gone at its pre-call check says (nothing left the worker).
ABANDONED = ("the claim was taken over or its lease expired before the call; nothing was "
             "sent")


@dataclass(frozen=True)
class DispatchDecision:
    """The dispatch-time policy decision (R2.6), written in the statement of the pre-call
    mark — durable before any call, in no transaction of its own."""

    decision_id: UUID
    principal_id: str
    action: str
    resource_id: str
    effect: str
    policy_version: str
    reasons: str  # JSON list of the policy ids that decided
    reason: str


@dataclass(frozen=True)
class Claim:
    """A worker's right to act on one command until ``lease_until``."""

    tenant_id: UUID
    operation_id: UUID
    token: UUID
    worker_id: str
    generation: int
    lease_until: datetime
    attempt_id: UUID
    previous_state: str = "pending"


@dataclass(frozen=True)
class ClaimRow:
    """One command to claim, and the trace its attempt records."""

    operation_id: UUID
    traceparent: str | None = None


async def claim(
    tx: Conn, tenant_id: UUID, rows: Sequence[ClaimRow], *, worker_id: str, lease_s: float,
    connectors: Sequence[str], kind: str = "dispatch",
) -> list[tuple[Claim, asyncpg.Record] | None]:
    """Claim the pending commands of ``rows`` that are of one of ``connectors``; per row the
    claim and the command row (with ``principal_*`` columns), or None: not claimed."""
    tokens = [uuid.uuid4() for _ in rows]
    found = await tx.fetch(
        Q["claim"], tenant_id, [r.operation_id for r in rows], tokens, worker_id,
        float(lease_s), list(connectors), kind, [r.traceparent for r in rows],
        [repository.event_json({"operation_id": str(r.operation_id), "worker_id": worker_id,
                                "kind": kind, "previous_state": "pending"}) for r in rows])
    by_op = {row["operation_id"]: row for row in found}
    out: list[tuple[Claim, asyncpg.Record] | None] = []
    for r, token in zip(rows, tokens, strict=True):
        row = by_op.get(r.operation_id)
        out.append(None if row is None else (Claim(
            tenant_id, r.operation_id, token, worker_id, int(row["fencing_generation"]),
            row["lease_until"], row["attempt_id"], "pending"), row))
    return out


@dataclass(frozen=True)
class MarkRow:
    """One claim about to call, the bound (plus margin) its lease must cover, its decision."""

    held: Claim
    secs: float
    decision: DispatchDecision | None = None


async def mark(tx: Conn, tenant_id: UUID, rows: Sequence[MarkRow]) -> list[datetime | None]:
    """Per row the lease's end once the claim is proven current and the attempt stamped, or
    None: the claim is gone (its unsent attempt closed ``abandoned``); never call then."""
    d = [r.decision for r in rows]
    found = await tx.fetch(
        Q["mark"], tenant_id, [r.held.operation_id for r in rows],
        [r.held.token for r in rows], [r.held.attempt_id for r in rows],
        [float(r.secs) for r in rows], [x and x.decision_id for x in d],
        [x and x.principal_id for x in d], [x and x.action for x in d],
        [x and x.resource_id for x in d], [x and x.effect for x in d],
        [x and x.policy_version for x in d], [x and x.reasons for x in d],
        [x and x.reason for x in d], ABANDONED)
    by_op = {row["operation_id"]: row["lease_until"] for row in found}
    return [by_op.get(r.held.operation_id) for r in rows]


@dataclass(frozen=True)
class FinalRow:
    """One outcome to record under a claim, with its attempt's result and its events."""

    held: Claim
    state: str
    receipt: str | None
    reason: str | None
    attempt_result: str
    detail: str
    audit: str  # the audit event's JSON payload
    outcome: str | None  # the outcome event's JSON payload; None: none (pending)
    traceparent: str | None = None


async def finalize(tx: Conn, tenant_id: UUID, rows: Sequence[FinalRow]) -> list[bool]:
    """Per row whether the claim held and the outcome is recorded (False: taken over,
    nothing written for it)."""
    found = await tx.fetch(
        Q["finalize"], tenant_id, [r.held.operation_id for r in rows],
        [r.held.token for r in rows], [r.state for r in rows], [r.receipt for r in rows],
        [r.reason for r in rows], [r.held.attempt_id for r in rows],
        [r.attempt_result for r in rows], [r.detail for r in rows],
        [f"command.{r.state}" for r in rows], [r.audit for r in rows],
        [None if r.outcome is None else f"outcome.{r.state}" for r in rows],
        [r.outcome for r in rows], [r.traceparent for r in rows])
    recorded = {row["operation_id"] for row in found}
    return [r.held.operation_id in recorded for r in rows]


def command_of(row: ClaimRow | MarkRow | FinalRow) -> UUID:
    """The command a row is about: a statement's rows name distinct commands."""
    return row.operation_id if isinstance(row, ClaimRow) else row.held.operation_id
