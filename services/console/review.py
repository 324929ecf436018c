"""What an approver reviews and how a decision is taken: the console's use of the library.

A review puts the pending request (``agentledger.approvals``) next to the target record as
the CRM answers NOW (read scope only), so the approver sees the concrete change as a diff
against the current record (R2.4). A decision is the library's
(``approvals.rules.decide``: who may approve or deny, asked of Cedar); the console only
supplies the CRM's current revision and the session's principal.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import asyncpg

from agentledger import errors, identity
from agentledger.approvals import narrowing, quorum, rules
from agentledger.approvals import repository as approvals
from agentledger.audit import explain as audit_explain
from agentledger.budgets import rules as budget_rules
from agentledger.ledger import keys
from agentledger.ledger import repository as ledger
from agentledger.notify import outbox as notify_outbox
from agentledger.policy import allowlist as allowlist_mod
from agentledger.policy import repository as policy_repo
from agentledger.resources import crm_client

log = logging.getLogger(__name__)

# The contact fields a contact update may change, in the order a person reads an address.
CONTACT_FIELDS = ("display_name", "email", "phone", "address_line1", "address_line2", "city",
                  "postal_code", "country")


@dataclass(frozen=True)
class Current:
    """The target record as the CRM answered just now.

    ``problem`` says why there is no record: ``not_found`` (gone, or never in this tenant) or
    ``unavailable`` (no read token for the tenant, or the CRM did not answer).
    """

    record: dict[str, Any] | None
    revision: str | None
    problem: str | None = None


class CurrentRecords:
    """The target as the CRM answers now, with each tenant's read-only token."""

    def __init__(self, reader: crm_client.CrmReader) -> None:
        self._reader = reader

    async def fetch(self, tenant_id: UUID, customer_id: str) -> Current:
        if not self._reader.reads_tenant(tenant_id):
            return Current(None, None, "unavailable")
        try:
            found = await self._reader.customer(tenant_id, customer_id)
        except (errors.StorageError, errors.IdentityRejected) as exc:
            log.warning("event=crm_read_failed tenant_id=%s error=%s", tenant_id, exc.code)
            return Current(None, None, "unavailable")
        if found is None:
            return Current(None, None, "not_found")
        return Current(dict(found.record) or None, found.revision)

    async def revision(self, pending: approvals.Approval) -> str | None:
        """The target's revision now (``approvals.rules.RevisionReader``).

        Raises:
            errors.StorageError: The CRM did not answer.
        """
        current = await self.fetch(pending.tenant_id, pending.resource_id)
        if current.problem == "unavailable":
            raise errors.StorageError(
                "the CRM did not answer: the current record could not be checked")
        return current.revision


@dataclass(frozen=True)
class FieldChange:
    """One field of a contact update: the current value and the proposed one."""

    name: str
    before: Any
    after: Any

    @property
    def changed(self) -> bool:
        return bool(self.before != self.after)


@dataclass(frozen=True)
class Review:
    """Everything the detail page and the API show about one request."""

    approval: approvals.Approval
    spec: allowlist_mod.ActionSpec | None
    arguments: dict[str, Any] | None
    current: Current
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    # Decrypted evidence with excerpts (untrusted data); the stored refs when none.
    evidence: list[dict[str, Any]] | None = None
    # The approvals an N-of-M request has gathered (issue 42).
    votes: list[approvals.Vote] = field(default_factory=list)
    # Narrow-only edits (issue 42): the request this one narrowed and its arguments, or the
    # request that narrowed this one.
    original: approvals.Approval | None = None
    original_arguments: dict[str, Any] | None = None
    narrowed_to: UUID | None = None

    @property
    def narrowable(self) -> dict[str, str]:
        """The arguments an approver may narrow here, and how (none once decided)."""
        return dict(self.spec.narrowable) if self.spec is not None and self.decidable else {}

    @property
    def narrowed_changes(self) -> list[FieldChange]:
        """What the narrowing changed: the original's value and this request's."""
        if self.original_arguments is None or self.arguments is None:
            return []
        names = sorted(set(self.original_arguments) | set(self.arguments))
        return [FieldChange(n, self.original_arguments.get(n), self.arguments.get(n))
                for n in names if self.original_arguments.get(n) != self.arguments.get(n)]

    @property
    def shown_evidence(self) -> list[dict[str, Any]]:
        return self.evidence if self.evidence is not None else self.approval.evidence

    @property
    def state(self) -> str:
        """The state as a person should read it: a pending request past its expiry is expired."""
        a = self.approval
        return "expired" if a.state == "pending" and a.expired(self.now) else a.state

    @property
    def decidable(self) -> bool:
        return self.state == "pending"

    @property
    def seconds_left(self) -> int:
        return max(0, int((self.approval.expires_at - self.now).total_seconds()))

    @property
    def stale(self) -> bool:
        """The target changed since the proposal: approving would supersede the request."""
        return bool(self.spec is not None and self.spec.requires_revision
                    and self.current.problem != "unavailable"
                    and self.current.revision != self.approval.expected_revision)

    @property
    def changes(self) -> list[FieldChange]:
        """Field-by-field before/after of a contact update, against the current record."""
        proposed = (self.arguments or {}).get("changes")
        if self.approval.action != "crm.contact.update" or not isinstance(proposed, dict):
            return []
        before = self.current.record or {}
        names = [n for n in CONTACT_FIELDS if n in proposed] + sorted(
            n for n in proposed if n not in CONTACT_FIELDS)
        return [FieldChange(n, before.get(n), proposed[n]) for n in names]

    @property
    def refund(self) -> dict[str, Any] | None:
        """Amount, currency, invoice and reason of a refund, the amount in major units."""
        args = self.arguments or {}
        if self.approval.action != "billing.refund.create":
            return None
        amount = args.get("amount_minor")
        major = (f"{Decimal(amount).scaleb(-2):,.2f}" if isinstance(amount, int)
                 and not isinstance(amount, bool) else "?")
        return {"amount": major, "amount_minor": amount, "currency": args.get("currency"),
                "invoice_id": args.get("invoice_id"), "reason": args.get("reason")}

    @property
    def note(self) -> str | None:
        if self.approval.action != "crm.note.create":
            return None
        body = (self.arguments or {}).get("body")
        return body if isinstance(body, str) else None

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, indent=2, sort_keys=True, ensure_ascii=False)


def time_left(seconds: int) -> str:
    """A short human duration: ``42 min``, ``1 h 5 min``, ``30 s``."""
    if seconds <= 0:
        return "expired"
    if seconds < 60:
        return f"{seconds} s"
    hours, minutes = divmod(seconds // 60, 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min"


@dataclass
class Console:
    """The console's collaborators. One per process; safe for concurrent use."""

    pool: asyncpg.Pool
    allowlist: allowlist_mod.Allowlist
    authorizer: policy_repo.CedarAuthorizer
    cipher: keys.PayloadCipher
    records: CurrentRecords
    # The operator's N-of-M rules and budgets: a narrowed request's quorum and charges are
    # computed again from its narrowed arguments (issue 42).
    approval_rules: quorum.ApprovalRules = field(default_factory=quorum.ApprovalRules.empty)
    budgets: budget_rules.Budgets = field(default_factory=budget_rules.Budgets)

    @property
    def router(self) -> notify_outbox.Router | None:
        """Who a narrowed request that still needs votes is announced to (issue 42): the
        same routing admission writes with a new request (None: the file routes nowhere)."""
        return notify_outbox.Router.of(self.approval_rules)

    async def listing(self, session: identity.Session, state: approvals.State = "pending"
                      ) -> list[Review]:
        """The signed-in tenant's requests in one state (no CRM reads: a list stays fast)."""
        async with self.pool.acquire() as conn:
            await policy_repo.require_approver(conn, session.tenant_id, session.principal_id)
            found = await approvals.listing(conn, session.tenant_id, state)
        unread = Current(None, None, "unavailable")
        return [Review(a, self.allowlist.actions.get(a.action), None, unread) for a in found]

    async def explain(self, session: identity.Session, audit: asyncpg.Pool,
                      operation_id: UUID) -> audit_explain.Explanation:
        """``explain`` for one operation of the signed-in tenant, for a current approver of
        it: the directory is asked like every other console read (a revoked approver's token
        that still verifies reads nothing, issue 38).

        Raises:
            PolicyDenied: not a current approver. CommandNotFound: nothing in this tenant.
        """
        async with self.pool.acquire() as conn:
            await policy_repo.require_approver(conn, session.tenant_id, session.principal_id)
        async with audit.acquire() as conn:
            return await audit_explain.explain(conn, session.tenant_id, operation_id)

    async def review(self, session: identity.Session, approval_id: UUID) -> Review:
        """One request of the signed-in tenant, its decrypted arguments and the current record.

        Raises:
            ApprovalNotFound: none with this id in the session's tenant.
        """
        async with self.pool.acquire() as conn:
            await policy_repo.require_approver(conn, session.tenant_id, session.principal_id)
            approval = await approvals.get(conn, session.tenant_id, approval_id)
            arguments = await self._arguments(conn, approval)
            evidence = await self._evidence(conn, approval)
            votes = (await approvals.votes(conn, session.tenant_id, approval_id)
                     if approval.required_approvals > 1 else [])
            original, original_arguments, narrowed_to = None, None, None
            if approval.narrowed_from is not None:
                original = await approvals.get(conn, session.tenant_id, approval.narrowed_from)
                original_arguments = await self._arguments(conn, original)
            elif approval.state == "narrowed":
                narrowed_to = next((a.approval_id for a in await approvals.history(
                    conn, session.tenant_id, approval.operation_id)
                    if a.narrowed_from == approval_id), None)
        current = await self.records.fetch(session.tenant_id, approval.resource_id)
        return Review(approval, self.allowlist.actions.get(approval.action), arguments, current,
                      evidence=evidence, votes=votes, original=original,
                      original_arguments=original_arguments, narrowed_to=narrowed_to)

    async def _arguments(self, conn: ledger.Conn, a: approvals.Approval) -> dict[str, Any] | None:
        return await rules.arguments(conn, self.cipher, a)

    async def _evidence(self, conn: ledger.Conn, a: approvals.Approval
                        ) -> list[dict[str, Any]] | None:
        """The evidence with its excerpts, decrypted (None: none sealed, or unreadable)."""
        if a.evidence_ciphertext is None or a.evidence_key_version is None:
            return None
        try:
            plain = await self.cipher.decrypt(conn, a.tenant_id, approvals.evidence_aad(
                a.operation_id), a.evidence_ciphertext, a.evidence_key_version)
        except errors.DecryptionFailed:
            log.warning("event=approval_evidence_unreadable approval_id=%s", a.approval_id)
            return None
        value = json.loads(plain)
        return [e for e in value if isinstance(e, dict)] if isinstance(value, list) else None

    async def decide(
        self, session: identity.Session, approval_id: UUID, *, approve: bool, shown_hash: str,
        reason: str,
    ) -> tuple[approvals.Approval, ledger.AdmitResult | None]:
        """Approve or deny as the signed-in principal.

        Raises:
            ApprovalNotFound, ApprovalMismatch, ApprovalExpired, StaleRevision (the request is
            now superseded), PolicyDenied, InvalidTransition (not pending),
            IdempotencyConflict, UnknownAction (approving an action no longer allowlisted),
            StorageError (the database, or the CRM for a revision-bound action, failed).
        """
        async with self.pool.acquire() as conn:
            return await rules.decide(
                conn, authorizer=self.authorizer, allowlist=self.allowlist, cipher=self.cipher,
                revision=self.records.revision, tenant_id=session.tenant_id,
                approver_id=session.principal_id, approval_id=approval_id, approve=approve,
                shown_hash=shown_hash, reason=reason)

    async def narrow(
        self, session: identity.Session, approval_id: UUID, *, shown_hash: str,
        arguments: dict[str, Any], reason: str,
    ) -> narrowing.Narrowed:
        """Narrow a request as the signed-in principal and approve the result
        (``approvals.narrowing.narrow``).

        Raises:
            NarrowingRefused, InvalidArguments, PolicyDenied, ApprovalNotFound,
            ApprovalMismatch, ApprovalExpired, InvalidTransition, StaleRevision,
            BudgetExhausted, IdempotencyConflict, UnknownAction, DecryptionFailed,
            StorageError. Nothing is written on any of them.
        """
        async with self.pool.acquire() as conn:
            return await narrowing.narrow(
                conn, authorizer=self.authorizer, allowlist=self.allowlist, cipher=self.cipher,
                revision=self.records.revision, approval_rules=self.approval_rules,
                budgets=self.budgets, tenant_id=session.tenant_id,
                approver_id=session.principal_id, approval_id=approval_id,
                shown_hash=shown_hash, arguments=arguments, reason=reason,
                routed=router.requested if (router := self.router) else None)
