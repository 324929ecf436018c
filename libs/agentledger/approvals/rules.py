"""Who may approve or deny a pending request, and the order a decision is taken in.

The rule used to live in the console's shell: it asked Cedar before an approval but let any
approver deny without asking. Both questions now go to Cedar here (``approve`` and ``deny``
in ``policy/policies/20_approve.cedar``), and a shell only turns HTTP into :func:`decide`.

Order of a decision: the directory must list the principal as a current approver of the
tenant (:func:`policy_repo.require_approver`, whatever the token claims); Cedar answers
"may this principal approve / deny this request?"; a refused deny writes nothing, a refused
approve is recorded (``approvals.decide`` keeps the refusal); an approval of a
revision-bound action reads the target's revision now, so a changed record supersedes the
request instead of admitting a stale change.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final
from uuid import UUID

from agentledger import errors
from agentledger.approvals import repository as approvals
from agentledger.ledger import keys
from agentledger.ledger import repository as ledger
from agentledger.policy import allowlist as allowlist_mod
from agentledger.policy import cedar
from agentledger.policy import repository as policy_repo

log = logging.getLogger(__name__)

# Roles that may read and decide requests: the one list, which the Cedar permits of
# ``approve`` and ``deny`` must name too (tests/unit/test_approval_rules.py checks it).
APPROVING_ROLES: Final = policy_repo.APPROVING_ROLES

# The target's revision as its system answers now (None: the record has none). Raises
# errors.StorageError when the system did not answer.
RevisionReader = Callable[[approvals.Approval], Awaitable[str | None]]


async def arguments(conn: ledger.Conn, cipher: keys.PayloadCipher, a: approvals.Approval
                    ) -> dict[str, Any] | None:
    """The proposed arguments, decrypted; None once purged by retention or unreadable."""
    if a.payload_ciphertext is None or a.payload_key_version is None:
        return None  # purged by retention, long after the decision
    try:
        plain = await cipher.decrypt(conn, a.tenant_id, a.operation_id, a.payload_ciphertext,
                                     a.payload_key_version)
    except errors.DecryptionFailed:
        log.warning("event=approval_payload_unreadable approval_id=%s", a.approval_id)
        return None
    value = json.loads(plain)
    return value if isinstance(value, dict) else None


async def may_deny(conn: ledger.Conn, authorizer: policy_repo.CedarAuthorizer, *,
                   approver_id: str, pending: approvals.Approval) -> cedar.CedarDecision:
    """Cedar's answer to "may ``approver_id`` deny this request?" (:meth:`CedarPolicy.may_deny`)
    for the principal as the directory has them now."""
    directory = policy_repo.PostgresPrincipalDirectory(conn)
    denier = await directory.lookup(pending.tenant_id, approver_id)
    if denier is None:
        return cedar.CedarDecision("deny", authorizer.version,
                                   f"{pending.action}: denier unknown here")
    return authorizer.policy.may_deny(denier, tenant_id=pending.tenant_id,
                                      action=pending.action, risk=pending.risk,
                                      connector=pending.connector,
                                      resource_id=pending.resource_id)


async def decide(
    conn: ledger.Conn, *, authorizer: policy_repo.CedarAuthorizer,
    allowlist: allowlist_mod.Allowlist, cipher: keys.PayloadCipher, revision: RevisionReader,
    tenant_id: UUID, approver_id: str, approval_id: UUID, approve: bool, shown_hash: str,
    reason: str,
) -> tuple[approvals.Approval, ledger.AdmitResult | None]:
    """Approve or deny one pending request as ``approver_id``, if Cedar lets them.

    Raises:
        ApprovalNotFound, ApprovalMismatch, ApprovalExpired, StaleRevision (the request is
        now superseded), PolicyDenied (not an approver here, or Cedar refuses: a refused
        deny writes nothing), InvalidTransition (not pending), IdempotencyConflict,
        UnknownAction (approving an action no longer allowlisted), DecryptionFailed
        (approving arguments that cannot be read), StorageError (the database, or the
        target's system for a revision-bound action, failed).
    """
    await policy_repo.require_approver(conn, tenant_id, approver_id)
    pending = await approvals.get(conn, tenant_id, approval_id)
    if approve:
        spec = allowlist.get(pending.action)
        proposed = await arguments(conn, cipher, pending)
        if proposed is None:
            raise errors.DecryptionFailed("the proposed arguments cannot be read")
        verdict = await authorizer.may_approve(
            conn, tenant_id=tenant_id, approver_id=approver_id,
            requester_id=pending.principal_id, action=spec, resource_id=pending.resource_id,
            arguments=proposed)
    else:
        verdict = await may_deny(conn, authorizer, approver_id=approver_id, pending=pending)
        if verdict.effect != "allow":
            raise errors.PolicyDenied(verdict.reason)
    spec_now = allowlist.actions.get(pending.action)
    bound = approve and bool(spec_now and spec_now.requires_revision)
    current_revision = await revision(pending) if bound else None

    # ``approvals.decide`` records the verdict with the decision (or the refusal), once.
    decided, admitted = await approvals.decide(
        conn, tenant_id, approval_id, approver=approver_id, approve=approve,
        shown_hash=shown_hash, reason=reason, approver_decision=verdict,
        current_revision=current_revision, requires_revision=bound)
    log.info("event=approval_decided tenant_id=%s approval_id=%s operation_id=%s state=%s "
             "decided_by=%s", tenant_id, approval_id, decided.operation_id, decided.state,
             approver_id)
    return decided, admitted
