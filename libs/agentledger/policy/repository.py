"""Policy data in Postgres: the principal directory and the decision records (R2.6, R2.9).

The only code that runs the statements of ``queries.sql``. Decisions are written inside the
caller's transaction, so admission records a decision in the same transaction as the command
it admits (or refuses); reads open their own tenant-bound transaction.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Literal
from uuid import UUID

from agentledger import errors, sql
from agentledger.ledger import repository as ledger
from agentledger.policy import allowlist as allowlist_mod
from agentledger.policy import cedar
from agentledger.policy import decision as decision_mod

Q = sql.load(Path(__file__).with_name("queries.sql"))

Stage = Literal["admission", "approval", "dispatch"]


class PostgresPrincipalDirectory:
    """The principal directory of table ``principal``, read anew at every lookup.

    Args:
        conn: A connection whose role may read ``principal`` (admission, executor, auditor).
        in_transaction: ``conn`` is inside a transaction already bound to the tenant that
            will be looked up: read there (one statement) instead of in a transaction of
            its own.
    """

    def __init__(self, conn: ledger.Conn, *, in_transaction: bool = False) -> None:
        self._conn = conn
        self._in_transaction = in_transaction

    async def lookup(self, tenant_id: UUID, principal_id: str) -> cedar.Principal | None:
        """The principal as currently recorded, or ``None``.

        Raises:
            errors.AccessDenied, errors.StorageError: as :func:`ledger.transaction`.
        """
        if self._in_transaction:
            row = await self._conn.fetchrow(Q["lookup_principal"], tenant_id, principal_id)
        else:
            async with ledger.transaction(self._conn, tenant_id) as tx:
                row = await tx.fetchrow(Q["lookup_principal"], tenant_id, principal_id)
        return None if row is None else _principal(row)


async def lookup_principals(tx: ledger.Conn, tenant_id: UUID, principal_ids: Iterable[str]
                            ) -> dict[str, cedar.Principal]:
    """The principals as currently recorded, by id (an id the tenant does not have is
    absent), read in one statement inside the caller's transaction bound to ``tenant_id``:
    an admission batch's directory reads, before its Cedar decisions."""
    rows = await tx.fetch(Q["lookup_principals"], tenant_id, sorted(set(principal_ids)))
    return {row["principal_id"]: _principal(row) for row in rows}


def _principal(row: Any) -> cedar.Principal:
    return cedar.Principal(row["tenant_id"], row["principal_id"],
                           frozenset(json.loads(row["roles"])), bool(row["revoked"]))


# Who may read and decide approval requests: a role in the directory, checked at every read
# and decision. A session token's roles only say what the identity provider claimed when it
# was issued; a revoked or demoted approver's unexpired token must stop working at once.
APPROVING_ROLES: Final = frozenset({"approver", "finance-approver"})


async def require_approver(conn: ledger.Conn, tenant_id: UUID, principal_id: str
                           ) -> cedar.Principal:
    """The principal, if the directory records it as a current approver of this tenant.

    Raises:
        errors.PolicyDenied: Unknown here, revoked, or holding no approving role.
        errors.AccessDenied, errors.StorageError: as :func:`ledger.transaction`.
    """
    found = await PostgresPrincipalDirectory(conn).lookup(tenant_id, principal_id)
    if found is None or found.revoked or not APPROVING_ROLES & found.roles:
        raise errors.PolicyDenied("you are not an approver of this tenant")
    return found


# Who may run operator commands (resolve an `unknown` outcome, change the directory): the
# principal directory's operators, checked at every command like approvers. The SPEC's
# operators (§ Users) carry this role in the directory already (Cedar lets them request too).
OPERATING_ROLES: Final = frozenset({"agent-operator"})


def is_operator(found: cedar.Principal | None) -> bool:
    """Whether a directory entry is a current operator: present, not revoked, an operating role."""
    return found is not None and not found.revoked and bool(OPERATING_ROLES & found.roles)


async def require_operator(conn: ledger.Conn, tenant_id: UUID, principal_id: str
                           ) -> cedar.Principal:
    """The principal, if the directory records it as a current operator of this tenant.

    Args:
        conn: A connection whose role may read ``principal`` (e.g. ``agentledger_auditor``).

    Raises:
        errors.NotAnOperator: Unknown here, revoked, or holding no operating role.
        errors.AccessDenied, errors.StorageError: as :func:`ledger.transaction`.
    """
    found = await PostgresPrincipalDirectory(conn).lookup(tenant_id, principal_id)
    if found is None or not is_operator(found):
        raise errors.NotAnOperator(f"{principal_id[:128]} is not a current operator of "
                                   "this tenant in the principal directory")
    return found


async def put_principal(
    conn: ledger.Conn, tenant_id: UUID, principal_id: str, roles: Iterable[str]
) -> None:
    """Create or update a principal (an operator's act; needs the owner's rights)."""
    async with ledger.transaction(conn, tenant_id) as tx:
        await tx.execute(Q["put_principal"], tenant_id, principal_id,
                         json.dumps(sorted(set(roles))))


async def revoke_principal(conn: ledger.Conn, tenant_id: UUID, principal_id: str) -> bool:
    """Revoke a principal: every later evaluation denies it, queued work included.

    Returns:
        Whether the principal exists in this tenant.
    """
    async with ledger.transaction(conn, tenant_id) as tx:
        revoked_at = await tx.fetchval(Q["revoke_principal"], tenant_id, principal_id)
    return revoked_at is not None


@dataclass(frozen=True)
class RecordedDecision:
    """A decision as persisted."""

    decision_id: UUID
    tenant_id: UUID
    principal_id: str
    action: str
    resource_id: str
    effect: decision_mod.Effect
    policy_version: str
    reasons: tuple[str, ...]
    reason: str
    stage: Stage
    operation_id: UUID | None
    decided_at: datetime


async def record_decision(
    conn: ledger.Conn, decision: decision_mod.Decision, *, tenant_id: UUID, principal_id: str,
    action: str, resource_id: str, operation_id: UUID | None = None,
    stage: Stage = "admission",
) -> None:
    """Persist a decision inside the caller's transaction (bound to ``tenant_id``).

    Args:
        conn: A connection inside :func:`ledger.transaction` for ``tenant_id``.
        decision: Any policy's decision; a :class:`cedar.CedarDecision` also records the
            ``@id`` of the Cedar policies that determined it.
        stage: Which question was decided: admission, an approval, or the re-check before
            dispatch.
    """
    reasons = list(decision.reasons) if isinstance(decision, cedar.CedarDecision) else []
    await conn.execute(
        Q["record_decision"], decision.decision_id, tenant_id, principal_id, action,
        resource_id, decision.effect, decision.policy_version, json.dumps(reasons),
        decision.reason, stage, operation_id,
    )


async def decisions_for(
    conn: ledger.Conn, tenant_id: UUID, operation_id: UUID
) -> list[RecordedDecision]:
    """The decisions about one operation of this tenant, oldest first."""
    async with ledger.transaction(conn, tenant_id) as tx:
        rows = await tx.fetch(Q["decisions_for"], tenant_id, operation_id)
    return [_recorded(r) for r in rows]


def _recorded(row: Any) -> RecordedDecision:
    fields = {f: row[f] for f in RecordedDecision.__dataclass_fields__}
    fields["reasons"] = tuple(json.loads(row["reasons"]))
    return RecordedDecision(**fields)


class CedarAuthorizer:
    """The Cedar policy asked about principals as table ``principal`` records them now."""

    def __init__(self, policy: cedar.CedarPolicy | None = None) -> None:
        self.policy = policy or cedar.CedarPolicy()

    @property
    def version(self) -> str:
        return self.policy.version

    async def authorize(
        self, conn: ledger.Conn, *, tenant_id: UUID, principal_id: str,
        action: allowlist_mod.ActionSpec, resource_id: str,
        arguments: Mapping[str, object] | None = None, in_transaction: bool = False,
    ) -> cedar.CedarDecision:
        return await self.policy.authorize(
            PostgresPrincipalDirectory(conn, in_transaction=in_transaction),
            tenant_id=tenant_id, principal_id=principal_id,
            action=action, resource_id=resource_id, arguments=arguments,
        )

    def authorize_known(
        self, found: cedar.Principal | None, *, tenant_id: UUID, principal_id: str,
        action: allowlist_mod.ActionSpec, resource_id: str,
        arguments: Mapping[str, object] | None = None,
    ) -> cedar.CedarDecision:
        """:meth:`authorize` with the principal already read in the caller's statement (the
        executor's claim returns it as the directory records it now; an admission batch
        reads its principals in one statement): no read of its own."""
        return self.policy.authorize_found(found, tenant_id=tenant_id, principal_id=principal_id,
                                           action=action, resource_id=resource_id,
                                           arguments=arguments)

    async def may_approve(
        self, conn: ledger.Conn, *, tenant_id: UUID, approver_id: str, requester_id: str,
        action: allowlist_mod.ActionSpec, resource_id: str,
        arguments: Mapping[str, object] | None = None,
    ) -> cedar.CedarDecision:
        directory = PostgresPrincipalDirectory(conn)
        approver = await directory.lookup(tenant_id, approver_id)
        requester = await directory.lookup(tenant_id, requester_id)
        if approver is None or requester is None:
            return cedar.CedarDecision(
                "deny", self.version, f"{action.name}: approver or requester unknown here")
        return self.policy.may_approve(approver, cedar.PolicyRequest(
            requester, action, resource_id, dict(arguments or {}), tenant_id))
