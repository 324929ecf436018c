"""Approval requests in Postgres: the only code that runs ``queries.sql``.

A pending request is a row, not a lock or an open transaction (R2.8). Approving runs the
admission statements for exactly the bound hash in the same transaction as the decision, so
an approval is never used for another payload, target revision or policy (R2.5).
"""

from __future__ import annotations

import hmac
import json
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar
from uuid import UUID

from opentelemetry import trace

from agentledger import errors, sql
from agentledger.approvals import quorum as quorum_mod
from agentledger.contracts import common
from agentledger.ledger import repository as ledger
from agentledger.policy import decision as decision_mod
from agentledger.policy import repository as policy_repo
from agentledger.telemetry import metrics as telemetry_metrics
from agentledger.telemetry import spans

Q = sql.load(Path(__file__).with_name("queries.sql"))
tracer = trace.get_tracer("agentledger.approvals")

State = Literal["pending", "approved", "denied", "expired", "superseded", "narrowed"]
Also = Callable[[ledger.Conn], Awaitable[None]]
# Writes about a new request in its transaction (its notifications: agentledger.notify.outbox).
Routed = Callable[[ledger.Conn, "Approval"], Awaitable[None]]


@dataclass(frozen=True, slots=True, kw_only=True)
class NewApproval:
    """A command that policy says needs a human, as admission validated and encrypted it.

    ``command`` is what approving admits (the approver's decision replaces its decision id
    and policy version): its ``decision_id`` is admission's, its ``expires_at`` the
    request's expiry, which stays the command's when approved.
    """

    command: ledger.NewCommand
    proposal_id: UUID
    risk: str
    evidence: Sequence[Mapping[str, Any]]  # refs, sources, digests: never excerpts
    # The full evidence (with excerpts), encrypted with the tenant's key (None: no evidence).
    evidence_ciphertext: bytes | None = None
    evidence_key_version: int | None = None
    # The operator's budgets the command falls under (JSON, issue 42): reserved with the
    # request, released if it is denied, expires or is superseded.
    charges: str | None = None
    # How many distinct approvers of which role must approve (issue 42; default one).
    quorum: quorum_mod.Quorum = quorum_mod.ONE


@dataclass(frozen=True)
class Approval:
    """An approval request as stored."""

    approval_id: UUID
    tenant_id: UUID
    operation_id: UUID
    proposal_id: UUID
    principal_id: str
    action: str
    connector: str
    resource_id: str
    expected_revision: str | None
    request_hash: bytes
    payload_ciphertext: bytes | None  # None once retention purged a decided request
    payload_key_version: int | None
    policy_version: str
    allowlist_version: str
    decision_id: UUID
    risk: str
    evidence: list[dict[str, Any]]
    evidence_ciphertext: bytes | None
    evidence_key_version: int | None
    state: State
    expires_at: datetime
    created_at: datetime
    decided_by: str | None
    decided_at: datetime | None
    decision_reason: str | None
    approval_decision_id: UUID | None
    shown_hash: bytes | None
    superseded_by: UUID | None
    traceparent: str | None
    tracestate: str | None
    # N-of-M (issue 42): distinct approvers of ``approver_role`` needed (1: any one approver).
    required_approvals: int = 1
    approver_role: str | None = None
    quorum_rule: str | None = None
    # A narrow-only edit (issue 42): the request this one narrowed (migration 0046).
    narrowed_from: UUID | None = None

    @classmethod
    def from_row(cls, row: Any) -> Approval:
        fields = {f: row[f] for f in cls.__dataclass_fields__}
        fields["evidence"] = json.loads(row["evidence"])
        fields["request_hash"] = bytes(row["request_hash"])
        for blob in ("payload_ciphertext", "evidence_ciphertext"):
            if row[blob] is not None:
                fields[blob] = bytes(row[blob])
        return cls(**fields)

    @property
    def hash_hex(self) -> str:
        return self.request_hash.hex()

    def expired(self, now: datetime | None = None) -> bool:
        return self.expires_at <= (now or datetime.now(UTC))


@dataclass(frozen=True)
class Requested:
    """What asking for approval did.

    ``pending``: a request waits for a decision (new, or the same one again); ``admitted``:
    the intent already has a command with this hash (a replay); ``conflict``: it has one
    with another hash; ``replayed_envelope``: this proposal id was requested before with
    another hash — its envelope reused for other content; nothing was written;
    ``budget_refused``: the operator's budget ``refused_by`` has no room (audited).
    """

    status: Literal["pending", "admitted", "conflict", "replayed_envelope", "budget_refused"]
    refused_by: str | None = None
    approval: Approval | None = None
    recorded: ledger.Recorded | None = None
    superseded: UUID | None = None


_T = TypeVar("_T")


def evidence_aad(operation_id: UUID) -> UUID:
    """The id the evidence ciphertext of ``operation_id``'s request is bound to: not the
    payload's, so neither ciphertext can be passed off as the other."""
    return uuid.uuid5(operation_id, "approval-evidence")


def _kept(value: _T | None) -> _T:
    """A pending request's payload, which the schema keeps until a decision (0016)."""
    if value is None:
        raise errors.InvalidTransition("the request's payload was purged: it was decided long ago")
    return value


async def _audit(tx: ledger.Conn, a: Approval, type: str, **extra: Any) -> None:
    await ledger.append_event(
        tx, tenant_id=a.tenant_id, operation_id=a.operation_id, family="audit", type=type,
        payload={"operation_id": str(a.operation_id), "approval_id": str(a.approval_id),
                 "action": a.action, "principal_id": a.principal_id,
                 "request_hash": a.hash_hex, "policy_version": a.policy_version,
                 "expires_at": a.expires_at.isoformat(), **extra},
        traceparent=a.traceparent, tracestate=a.tracestate,
    )


async def request(
    conn: ledger.Conn, new: NewApproval, *, also: Also | None = None,
    audit: Mapping[str, Any] | None = None, routed: Routed | None = None,
) -> Requested:
    """Persist a request for approval (or recognise it), in one short transaction.

    A pending request with another hash for the same intent is superseded by this one; an
    intent that already has a command is answered from the ledger. ``routed`` writes what
    the new request causes (its notifications) in the same transaction.
    """
    cmd = new.command
    async with ledger.transaction(conn, cmd.tenant_id) as tx:
        existing = await tx.fetchrow(ledger.Q["recorded_command"], cmd.tenant_id,
                                     cmd.operation_id)
        if existing is not None:
            recorded = ledger.Recorded.from_row(existing)
            same = hmac.compare_digest(recorded.request_hash, cmd.request_hash)
            return Requested("admitted" if same else "conflict", recorded=recorded)
        if await tx.fetchval(Q["proposal_with_other_content"], cmd.tenant_id,
                             cmd.operation_id, new.proposal_id, cmd.request_hash):
            # One proposal id, one content: ingress and the planner never reuse an id, so
            # this is an envelope replayed with new arguments (issue 17 §6). It must not
            # supersede what the principal really asked for.
            return Requested("replayed_envelope")
        pending_row = await tx.fetchrow(Q["pending_for_operation"], cmd.tenant_id,
                                        cmd.operation_id)
        superseded = None
        if pending_row is not None:
            pending = Approval.from_row(pending_row)
            if hmac.compare_digest(pending.request_hash, cmd.request_hash):
                return Requested("pending", approval=pending)
            superseded = pending.approval_id
        approval_id = uuid.uuid4()
        if superseded is not None:
            # Closed first (one pending request per intent), linked once the new one exists.
            await tx.execute(Q["supersede"], cmd.tenant_id, superseded, "system:revision",
                             "a revised proposal replaced it; it needs its own decision", None)
        if new.charges is not None:
            # Reserved while a person decides, so pending requests cannot overshoot together.
            refused = await ledger.charge_budgets(tx, cmd.tenant_id, cmd.operation_id,
                                                  new.charges)
            if refused is not None:
                return Requested("budget_refused", refused_by=refused.budget)
        row = await tx.fetchrow(
            Q["insert_request"], approval_id, cmd.tenant_id, cmd.operation_id, new.proposal_id,
            cmd.principal_id, cmd.action, cmd.connector, cmd.resource_id, cmd.expected_revision,
            cmd.request_hash, cmd.payload_ciphertext, cmd.payload_key_version,
            cmd.policy_version, cmd.allowlist_version, cmd.decision_id, new.risk,
            json.dumps(list(new.evidence), default=str), cmd.expires_at, cmd.traceparent,
            cmd.tracestate, new.evidence_ciphertext, new.evidence_key_version,
            new.quorum.required, new.quorum.role, new.quorum.rule,
        )
        created = Approval.from_row(row)
        if superseded is not None:
            await tx.execute(Q["link_superseded"], cmd.tenant_id, superseded, approval_id)
            await _audit(tx, created, "approval.superseded", superseded=str(superseded))
        await _audit(tx, created, "approval.requested", **{
            "risk": new.risk, "required_approvals": new.quorum.required,
            "approver_role": new.quorum.role, **(audit or {})})
        if also is not None:
            await also(tx)
        if routed is not None:
            await routed(tx, created)
    return Requested("pending", approval=created, superseded=superseded)


async def get(conn: ledger.Conn, tenant_id: UUID, approval_id: UUID) -> Approval:
    """One request of this tenant.

    Raises:
        ApprovalNotFound: none with this id in this tenant (another tenant's looks the same).
    """
    async with ledger.transaction(conn, tenant_id) as tx:
        row = await tx.fetchrow(Q["get_request"], tenant_id, approval_id)
    if row is None:
        raise errors.ApprovalNotFound(approval_id=str(approval_id))
    return Approval.from_row(row)


async def listing(
    conn: ledger.Conn, tenant_id: UUID, state: State = "pending", *, limit: int = 200
) -> list[Approval]:
    """A tenant's requests in one state, oldest first."""
    async with ledger.transaction(conn, tenant_id) as tx:
        rows = await tx.fetch(Q["list_requests"], tenant_id, state, limit)
    return [Approval.from_row(r) for r in rows]


async def history(conn: ledger.Conn, tenant_id: UUID, operation_id: UUID) -> list[Approval]:
    """Every request an intent has had, oldest first."""
    async with ledger.transaction(conn, tenant_id) as tx:
        rows = await tx.fetch(Q["requests_for_operation"], tenant_id, operation_id)
    return [Approval.from_row(r) for r in rows]


_UNCHANGED = object()


async def _record(
    tx: ledger.Conn, pending: Approval, approver: str, verdict: decision_mod.Decision
) -> None:
    """The approver's policy decision, persisted with the approval it allowed or refused."""
    await policy_repo.record_decision(
        tx, verdict, tenant_id=pending.tenant_id, principal_id=approver, action=pending.action,
        resource_id=pending.resource_id, operation_id=pending.operation_id, stage="approval")


@spans.traced(tracer, "approval.decision")
async def decide(
    conn: ledger.Conn, tenant_id: UUID, approval_id: UUID, *, approver: str, approve: bool,
    shown_hash: str, reason: str, approver_decision: decision_mod.Decision | None,
    current_revision: str | object | None = _UNCHANGED, requires_revision: bool = False,
    also: Also | None = None,
) -> tuple[Approval, ledger.AdmitResult | None]:
    """Approve or deny one pending request.

    Approving admits exactly the bound hash in this transaction (ledger row + outbox row +
    audit), with the approval's decision id and expiry on the command: a command still
    queued when the approval expires is ``expired`` at dispatch.

    Args:
        shown_hash: the hex hash the approver was shown; it must be the request's.
        approver_decision: the policy's answer to "may this approver approve this?" (deny
            refuses the approval; required to approve).
        current_revision: the target's revision as the console just read it; when the
            action requires a revision and it differs, the request is superseded.
        also: more writes for the transaction (the decision record).

    Raises:
        ApprovalNotFound, ApprovalMismatch, ApprovalExpired, StaleRevision, PolicyDenied,
        InvalidTransition (not pending), IdempotencyConflict.
    """
    late: errors.AgentLedgerError | None = None
    admitted: ledger.AdmitResult | None = None
    async with ledger.transaction(conn, tenant_id) as tx:
        row = await tx.fetchrow(Q["lock_request"], tenant_id, approval_id)
        if row is None:
            raise errors.ApprovalNotFound(approval_id=str(approval_id))
        pending = Approval.from_row(row)
        # The decision resumes a paused trace: link to the request's context (R8.2).
        spans.annotate(operation_id=str(pending.operation_id), action=pending.action)
        spans.add_link(trace.get_current_span(), pending.traceparent, "approval_request")
        if pending.state != "pending":
            raise errors.InvalidTransition(f"this request is already {pending.state}",
                                           state=pending.state)
        if not hmac.compare_digest(pending.hash_hex, shown_hash.strip().lower()):
            raise errors.ApprovalMismatch("the command shown is not the command pending")
        if pending.expired():
            closed = await tx.fetchrow(Q["close_request"], tenant_id, approval_id, "expired",
                                       "system:expiry", "no decision before it expired", None,
                                       None)
            await _audit(tx, Approval.from_row(closed), "approval.expired")
            late = errors.ApprovalExpired("this approval expired; the agent must propose again")
        elif (requires_revision and current_revision is not _UNCHANGED
              and current_revision != pending.expected_revision):
            await tx.execute(Q["supersede"], tenant_id, approval_id, "system:revision",
                             "the target record changed since the proposal", None)
            await _audit(tx, pending, "approval.superseded", reason="target revision changed")
            late = errors.StaleRevision(
                "the record changed since the proposal; a new proposal and decision are needed")
        elif approve and (approver_decision is None or approver_decision.effect != "allow"):
            # The refusal is itself a decision to keep: recorded, committed, then raised.
            if approver_decision is not None:
                await _record(tx, pending, approver, approver_decision)
            if also is not None:
                await also(tx)
            late = errors.PolicyDenied(
                approver_decision.reason if approver_decision else "no approver decision")
        elif approve and pending.required_approvals > 1 and not await _quorum_reached(
                tx, pending, approver, approver_decision, also):
            return pending, None  # this approval counted; more are needed
        else:
            state: State = "approved" if approve else "denied"
            spans.annotate(outcome=state)
            reason = common.reason_text(reason)
            closed = await tx.fetchrow(
                Q["close_request"], tenant_id, approval_id, state, approver, reason,
                approver_decision.decision_id if approver_decision else None,
                bytes.fromhex(pending.hash_hex),
            )
            decided = Approval.from_row(closed)
            await _audit(tx, decided, f"approval.{state}", decided_by=approver,
                         reason=reason)
            if approver_decision is not None:
                await _record(tx, pending, approver, approver_decision)
            if also is not None:
                await also(tx)
            if approve:
                assert approver_decision is not None
                # The command continues this decision's trace, naming the request it resumes.
                resumed_tp, resumed_ts = spans.resume(pending.traceparent, pending.tracestate)
                # Exactly the request's command (its hash, payload and expiry), under the
                # approver's decision.
                admitted = await ledger.admit_in(tx, ledger.NewCommand.of(
                    pending, decision_id=approver_decision.decision_id,
                    policy_version=approver_decision.policy_version,
                    payload_ciphertext=_kept(pending.payload_ciphertext),
                    payload_key_version=_kept(pending.payload_key_version),
                    traceparent=resumed_tp, tracestate=resumed_ts,
                ), audit={"approval_id": str(approval_id), "approved_by": approver})
                if admitted.status == "conflict":
                    raise errors.IdempotencyConflict(
                        "the intent was admitted with another payload; nothing was approved")
            telemetry_metrics.approval_decisions.add(
                1, outcome=state, action=telemetry_metrics.bounded(pending.action))
            return decided, admitted
    assert late is not None
    raise late


async def _quorum_reached(
    tx: ledger.Conn, pending: Approval, approver: str,
    approver_decision: decision_mod.Decision | None, also: Also | None,
) -> bool:
    """Count one approver's approval of a request that needs several (issue 42, R16.2).

    The approver must hold the request's role now (the directory's roles, not the token's)
    and is never the requester; the vote binds the request's hash, and the same approver
    again counts once. Returns whether this vote reached the quorum (the caller then closes
    the request approved and admits its command); otherwise the vote, the approver's policy
    decision and an ``approval.vote`` audit event are written and the request stays pending.

    Raises:
        PolicyDenied: the approver is the requester or does not hold the role (nothing is
            written).
    """
    assert approver_decision is not None  # an approval without Cedar's allow never gets here
    if approver == pending.principal_id:
        raise errors.PolicyDenied("the requester never counts toward their own approval")
    roles = await tx.fetchval(Q["approver_roles"], pending.tenant_id, approver)
    held = set(json.loads(roles)) if isinstance(roles, str) else set(roles or ())
    if pending.approver_role is not None and pending.approver_role not in held:
        raise errors.PolicyDenied(
            f"this request needs {pending.required_approvals} approvers of role "
            f"{pending.approver_role!r}; {approver} does not hold it")
    await tx.execute(Q["add_vote"], pending.tenant_id, pending.approval_id, approver,
                     pending.request_hash, approver_decision.decision_id)
    votes = await tx.fetch(Q["votes"], pending.tenant_id, pending.approval_id)
    if len(votes) >= pending.required_approvals:
        return True
    await _record(tx, pending, approver, approver_decision)
    if also is not None:
        await also(tx)
    await _audit(tx, pending, "approval.vote", approver=approver, approvals=len(votes),
                 required=pending.required_approvals, approver_role=pending.approver_role)
    return False


@dataclass(frozen=True)
class Vote:
    """One approver's approval of a request that needs several."""

    approver: str
    request_hash: bytes
    decision_id: UUID
    voted_at: datetime


async def votes(conn: ledger.Conn, tenant_id: UUID, approval_id: UUID) -> list[Vote]:
    """The approvals a request has gathered, oldest first."""
    async with ledger.transaction(conn, tenant_id) as tx:
        rows = await tx.fetch(Q["votes"], tenant_id, approval_id)
    return [Vote(r["approver"], bytes(r["request_hash"]), r["decision_id"], r["voted_at"])
            for r in rows]


async def expire_due(conn: ledger.Conn, *, limit: int = 500) -> list[tuple[UUID, UUID]]:
    """Expire pending requests past their expiry across tenants (the reconciler's sweep)."""
    async with ledger.transaction(conn, None) as tx:
        rows = await tx.fetch(Q["expire_due"], limit)
    return [(r["tenant_id"], r["approval_id"]) for r in rows]
