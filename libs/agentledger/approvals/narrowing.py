"""Narrow-only edits of a pending request, approved in the same step (issue 42, item 4).

An approver may lower an amount or drop items of a list where the action declares it
(``narrowable`` in the allowlist, ``agentledger.policy.narrowing``). The edit is never a
change to the pending request: it is a **new request for the same intent**, with the narrowed
arguments and its own hash, linked to the original (``narrowed_from``), which closes
``narrowed`` and never runs. In one transaction:

1. the original, locked, must still be pending with the hash the approver was shown;
2. the narrowed arguments are validated by the action's schema and checked to only narrow
   (anything else is :class:`errors.NarrowingRefused`, and nothing is written);
3. the narrowed command is re-authorized as a new command: Cedar's admission question for
   the requester (recorded as its decision) and Cedar's ``approve`` question for the approver,
   both on the narrowed arguments;
4. the original closes ``narrowed`` (its budget reservations are given back by a trigger) and
   the new request is stored (``approvals.request``: it reserves its own charges — the
   original's, with each amount budget recomputed from the narrowed arguments), with the
   quorum its narrowed arguments need (600 → 400 under "above 500 needs 2" needs one);
5. the approver's approval is bound to the new hash (``approvals.decide``): with a quorum of
   one the new request is approved and its command admitted; with more, it is the first vote.

Any refusal on the way rolls the whole step back: the original stays pending, as it was.
The requester never narrows their own request (they could otherwise approve a command of
their own choosing).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

from agentledger import canonical, errors, sql
from agentledger.approvals import quorum as quorum_mod
from agentledger.approvals import repository as approvals
from agentledger.approvals import rules
from agentledger.budgets import rules as budget_rules_mod
from agentledger.contracts import common
from agentledger.ledger import keys
from agentledger.ledger import repository as ledger
from agentledger.policy import allowlist as allowlist_mod
from agentledger.policy import narrowing
from agentledger.policy import repository as policy_repo

Q = sql.load(Path(__file__).with_name("narrowing.sql"))
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Narrowed:
    """What a narrowing did.

    ``original`` is closed ``narrowed``; ``narrowed`` is the new request — ``approved`` (its
    command admitted: ``admitted``) or, when its quorum needs more approvers, ``pending``
    with the narrowing approver's vote.
    """

    original: approvals.Approval
    narrowed: approvals.Approval
    admitted: ledger.AdmitResult | None
    fields: tuple[str, ...]


def proposal_id(original: approvals.Approval) -> UUID:
    """The new request's proposal id: derived, so the edit names the proposal it narrowed."""
    return uuid.uuid5(original.proposal_id, "narrowed")


def charges(reserved: Sequence[Mapping[str, Any]], budgets: budget_rules_mod.Budgets,
            arguments: Mapping[str, Any]) -> str | None:
    """The narrowed command's budget charges (pure): the original's reservations, each amount
    budget's amount read again from the narrowed arguments (calls and tokens unchanged, the
    scope key and window the original's). A budget the operator no longer declares keeps
    the original's amount: a narrowing never charges more than the original did."""
    by_name = {b.name: b for b in budgets.budgets}
    out: list[dict[str, Any]] = []
    for row in reserved:
        amount = int(row["amount"])
        budget = by_name.get(row["budget"])
        if row["unit"] == "amount" and budget is not None:
            assert budget.amount_argument is not None  # the model requires it for amounts
            value = arguments.get(budget.amount_argument)
            if (isinstance(value, bool) or not isinstance(value, int)
                    or arguments.get(budget.currency_argument or "") != budget.currency):
                continue
            amount = min(amount, value)
        if amount <= 0:
            continue
        start = row["window_start"]
        out.append({"budget": row["budget"], "scope": row["scope"],
                    "scope_key": row["scope_key"], "window_kind": row["window_kind"],
                    "window_start": start.isoformat() if start is not None else None,
                    "unit": row["unit"], "currency": row["currency"], "amount": amount,
                    "limit": int(row["limit_amount"])})
    return json.dumps(out) if out else None


async def narrow(
    conn: ledger.Conn, *, authorizer: policy_repo.CedarAuthorizer,
    allowlist: allowlist_mod.Allowlist, cipher: keys.PayloadCipher,
    revision: rules.RevisionReader, approval_rules: quorum_mod.ApprovalRules,
    budgets: budget_rules_mod.Budgets, tenant_id: UUID, approver_id: str, approval_id: UUID,
    shown_hash: str, arguments: Mapping[str, Any], reason: str,
    routed: approvals.Routed | None = None,
) -> Narrowed:
    """Narrow one pending request to ``arguments`` and approve the result as ``approver_id``.

    Args:
        shown_hash: the hex hash of the original the approver was shown.
        arguments: the complete narrowed arguments (untrusted: validated here).
        routed: writes the narrowed request's notifications in the same transaction
            (the operator's routing, issue 42; None: nobody is told, as with a v1 file).

    Raises:
        NarrowingRefused: not a narrowing the action declares (a larger amount, an added
            item, another field changed, nothing narrowed). InvalidArguments: the narrowed
            arguments violate the schema. PolicyDenied: not an approver here, the requester
            themself, or Cedar refuses the narrowed command or this approver.
            ApprovalNotFound, ApprovalMismatch, ApprovalExpired, InvalidTransition (not
            pending), UnknownAction, DecryptionFailed, StaleRevision, BudgetExhausted,
            IdempotencyConflict, StorageError. On any of them nothing was written.
    """
    await policy_repo.require_approver(conn, tenant_id, approver_id)
    original = await approvals.get(conn, tenant_id, approval_id)
    if original.state != "pending":
        raise errors.InvalidTransition(f"this request is already {original.state}",
                                       state=original.state)
    if approver_id == original.principal_id:
        raise errors.PolicyDenied("the requester never narrows their own request")
    spec = allowlist.get(original.action)
    proposed = await rules.arguments(conn, cipher, original)
    if proposed is None:
        raise errors.DecryptionFailed("the proposed arguments cannot be read")
    narrowed_args = spec.validate(arguments)
    fields = narrowing.check(spec.name, spec.narrowable, proposed, narrowed_args)
    new_hash = canonical.request_hash(
        tenant_id=tenant_id, principal_id=original.principal_id, action=spec.name,
        target=original.resource_id, arguments=narrowed_args,
        expected_revision=original.expected_revision)
    verdict = await authorizer.may_approve(
        conn, tenant_id=tenant_id, approver_id=approver_id,
        requester_id=original.principal_id, action=spec, resource_id=original.resource_id,
        arguments=narrowed_args)
    if verdict.effect != "allow":
        raise errors.PolicyDenied(verdict.reason)
    bound = spec.requires_revision
    current_revision = await revision(original) if bound else None
    if not cipher.holds(tenant_id):
        await cipher.warm(conn, tenant_id)

    async with ledger.transaction(conn, tenant_id) as tx:
        row = await tx.fetchrow(approvals.Q["lock_request"], tenant_id, approval_id)
        if row is None:
            raise errors.ApprovalNotFound(approval_id=str(approval_id))
        locked = approvals.Approval.from_row(row)
        if locked.state != "pending":
            raise errors.InvalidTransition(f"this request is already {locked.state}",
                                           state=locked.state)
        if locked.hash_hex != shown_hash.strip().lower():
            raise errors.ApprovalMismatch("the command shown is not the command pending")
        if locked.expired():
            raise errors.ApprovalExpired("this approval expired; the agent must propose again")
        # The narrowed command is a new command: Cedar's admission question again, for the
        # requester, on the narrowed arguments (a policy may deny what it allowed before).
        decision = await authorizer.authorize(
            tx, tenant_id=tenant_id, principal_id=locked.principal_id, action=spec,
            resource_id=locked.resource_id, arguments=narrowed_args, in_transaction=True)
        if decision.effect == "deny":
            raise errors.PolicyDenied(decision.reason)
        reserved = await tx.fetch(Q["reserved_charges"], tenant_id, locked.operation_id)
        ciphertext, key_version = await cipher.encrypt(
            tx, tenant_id, locked.operation_id, canonical.canonical_bytes(narrowed_args))
        reason = common.reason_text(reason.strip() or "narrowed by the approver")
        closed_row = await tx.fetchrow(Q["close_narrowed"], tenant_id, approval_id, approver_id,
                                       reason, locked.request_hash)
        closed = approvals.Approval.from_row(closed_row)
        await policy_repo.record_decision(
            tx, decision, tenant_id=tenant_id, principal_id=locked.principal_id,
            action=spec.name, resource_id=locked.resource_id,
            operation_id=locked.operation_id)
        quorum = approval_rules.quorum(spec.name, narrowed_args)
        requested = await approvals.request(tx, approvals.NewApproval(
            command=ledger.NewCommand.of(
                locked, request_hash=new_hash, decision_id=decision.decision_id,
                policy_version=decision.policy_version, allowlist_version=allowlist.version,
                payload_ciphertext=ciphertext, payload_key_version=key_version),
            proposal_id=proposal_id(locked), risk=locked.risk, evidence=locked.evidence,
            evidence_ciphertext=locked.evidence_ciphertext,
            evidence_key_version=locked.evidence_key_version,
            charges=charges([dict(r) for r in reserved], budgets, narrowed_args), quorum=quorum,
        ), audit={"narrowed_from": str(approval_id), "narrowed_by": approver_id,
                  "narrowed_fields": list(fields)}, routed=routed)
        if requested.status == "budget_refused":
            raise errors.BudgetExhausted(
                f"budget {requested.refused_by} has no room for the narrowed command",
                budget=requested.refused_by)
        if requested.status != "pending" or requested.approval is None:
            raise errors.IdempotencyConflict(
                "the intent was admitted with another payload; nothing was narrowed")
        linked_row = await tx.fetchrow(Q["link_narrowed"], tenant_id,
                                       requested.approval.approval_id, approval_id)
        linked = approvals.Approval.from_row(linked_row)
        await ledger.append_event(
            tx, tenant_id=tenant_id, operation_id=locked.operation_id, family="audit",
            type="approval.narrowed",
            payload={"operation_id": str(locked.operation_id),
                     "approval_id": str(approval_id), "action": spec.name,
                     "principal_id": locked.principal_id, "narrowed_by": approver_id,
                     "request_hash": locked.hash_hex, "narrowed_hash": linked.hash_hex,
                     "narrowed_to": str(linked.approval_id), "fields": list(fields),
                     "reason": reason, "required_approvals": quorum.required},
            traceparent=locked.traceparent, tracestate=locked.tracestate)
        # Approved in the same step, bound to the new hash (a nested savepoint: a refusal
        # there rolls the narrowing back too).
        decided, admitted = await approvals.decide(
            tx, tenant_id, linked.approval_id, approver=approver_id, approve=True,
            shown_hash=linked.hash_hex, reason=reason, approver_decision=verdict,
            current_revision=current_revision, requires_revision=bound)
    log.info("event=approval_narrowed tenant_id=%s approval_id=%s narrowed_to=%s "
             "operation_id=%s state=%s narrowed_by=%s", tenant_id, approval_id,
             decided.approval_id, decided.operation_id, decided.state, approver_id)
    return Narrowed(closed, decided, admitted, tuple(fields))

