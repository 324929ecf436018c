"""What an approver reviews and how a decision is taken: the console's use of the library.

A review puts the pending request (``agentledger.approvals``) next to the target record as
the CRM answers NOW (read scope only), so the approver sees the concrete change as a diff
against the current record (R2.4). A decision asks the policy whether this approver may
approve this request, reads the current revision again, and hands both to
``approvals.decide``, which admits exactly the hash the approver was shown or nothing (R2.5).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import asyncpg
import httpx

from agentledger import errors, identity
from agentledger.approvals import repository as approvals
from agentledger.ledger import keys
from agentledger.ledger import repository as ledger
from agentledger.policy import allowlist as allowlist_mod
from agentledger.policy import repository as policy_repo

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
    """Reads customers from the CRM with each tenant's read-only token."""

    def __init__(self, client: httpx.AsyncClient, read_tokens: Mapping[str, str]) -> None:
        self._client, self._tokens = client, dict(read_tokens)

    async def fetch(self, tenant_id: UUID, customer_id: str) -> Current:
        token = self._tokens.get(str(tenant_id))
        if token is None:
            return Current(None, None, "unavailable")
        try:
            response = await self._client.get(
                f"/v1/customers/{customer_id}", headers={"Authorization": f"Bearer {token}"})
        except httpx.HTTPError as exc:
            log.warning("event=crm_read_failed tenant_id=%s error=%s", tenant_id,
                        type(exc).__name__)
            return Current(None, None, "unavailable")
        if response.status_code in (404, 422):
            return Current(None, None, "not_found")
        if response.status_code != 200:
            log.warning("event=crm_read_failed tenant_id=%s status=%s", tenant_id,
                        response.status_code)
            return Current(None, None, "unavailable")
        etag = response.headers.get("ETag", "")
        body = response.json()
        return Current(body if isinstance(body, dict) else None,
                       etag.removeprefix("W/").strip('"') or None)


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

    async def listing(self, session: identity.Session, state: approvals.State = "pending"
                      ) -> list[Review]:
        """The signed-in tenant's requests in one state (no CRM reads: a list stays fast)."""
        async with self.pool.acquire() as conn:
            await policy_repo.require_approver(conn, session.tenant_id, session.principal_id)
            found = await approvals.listing(conn, session.tenant_id, state)
        unread = Current(None, None, "unavailable")
        return [Review(a, self.allowlist.actions.get(a.action), None, unread) for a in found]

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
        current = await self.records.fetch(session.tenant_id, approval.resource_id)
        return Review(approval, self.allowlist.actions.get(approval.action), arguments, current,
                      evidence=evidence)

    async def _arguments(self, conn: ledger.Conn, a: approvals.Approval) -> dict[str, Any] | None:
        if a.payload_ciphertext is None or a.payload_key_version is None:
            return None  # purged by retention, long after the decision
        try:
            plain = await self.cipher.decrypt(conn, a.tenant_id, a.operation_id,
                                              a.payload_ciphertext, a.payload_key_version)
        except errors.DecryptionFailed:
            log.warning("event=approval_payload_unreadable approval_id=%s", a.approval_id)
            return None
        value = json.loads(plain)
        return value if isinstance(value, dict) else None

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
        tenant, approver = session.tenant_id, session.principal_id
        async with self.pool.acquire() as conn:
            # Only a current approver of this tenant reads or closes a request, whatever the
            # token claims; Cedar then decides whether this one may approve this request.
            await policy_repo.require_approver(conn, tenant, approver)
            pending = await approvals.get(conn, tenant, approval_id)
            verdict = None
            if approve:
                spec = self.allowlist.get(pending.action)
                arguments = await self._arguments(conn, pending)
                if arguments is None:
                    raise errors.DecryptionFailed("the proposed arguments cannot be read")
                verdict = await self.authorizer.may_approve(
                    conn, tenant_id=tenant, approver_id=approver,
                    requester_id=pending.principal_id, action=spec,
                    resource_id=pending.resource_id, arguments=arguments)
            spec_now = self.allowlist.actions.get(pending.action)
            requires_revision = bool(spec_now and spec_now.requires_revision)
            current_revision = None
            if requires_revision and approve:
                current = await self.records.fetch(tenant, pending.resource_id)
                if current.problem == "unavailable":
                    raise errors.StorageError(
                        "the CRM did not answer: the current record could not be checked")
                current_revision = current.revision

            async def record(tx: ledger.Conn) -> None:
                if verdict is not None:
                    await policy_repo.record_decision(
                        tx, verdict, tenant_id=tenant, principal_id=approver,
                        action=pending.action, resource_id=pending.resource_id,
                        operation_id=pending.operation_id, stage="approval")

            decided, admitted = await approvals.decide(
                conn, tenant, approval_id, approver=approver, approve=approve,
                shown_hash=shown_hash, reason=reason, approver_decision=verdict,
                current_revision=current_revision,
                requires_revision=requires_revision and approve, also=record)
        log.info("event=approval_decided tenant_id=%s approval_id=%s operation_id=%s state=%s "
                 "decided_by=%s", tenant, approval_id, decided.operation_id, decided.state,
                 approver)
        return decided, admitted
