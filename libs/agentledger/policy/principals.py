"""Changes to the principal directory: an operator's verified, audited act (issue 18 §3).

Roles and revocation are data in table ``principal`` (migration 0003), read anew at every
evaluation — admission, every console request, the executor's re-check before dispatch,
every operator command — so a change made here takes effect on the next one, with nothing to
restart and no token to wait out. Before, changing it needed SQL, and left no trace.

Each change is ONE transaction that checks the acting session's principal is a current
operator of the tenant (:func:`repository.require_operator`), locks the changed entry, writes
it, and appends a ``principal.*`` audit event (who, what before, what after, why): a change
without its audit event cannot commit, and the event goes to ``audit.events.v1`` like every
other. An operator never changes their own entry: granting oneself ``approver``, or undoing
one's own revocation, would make the directory's check worthless; another operator does it.

No role below the ledger's owner may write ``principal``: run these on a connection of the
owner, as the directory is seeded (:func:`repository.put_principal`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from agentledger import errors, identity, sql
from agentledger.contracts import common
from agentledger.ledger import repository as ledger
from agentledger.policy import repository

Q = sql.load(Path(__file__).with_name("queries.sql"))

Change = Literal["role_granted", "role_revoked", "revoked", "reinstated"]
# (roles held, revoked) → (roles, revoked) after the change.
Edit = Callable[[frozenset[str], bool], tuple[frozenset[str], bool]]


@dataclass(frozen=True)
class Entry:
    """A principal as the directory records it."""

    principal_id: str
    roles: tuple[str, ...]
    revoked_at: datetime | None
    updated_at: datetime

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


def _entry(row: Any) -> Entry:
    return Entry(row["principal_id"], tuple(sorted(json.loads(row["roles"]))),
                 row["revoked_at"], row["updated_at"])


async def grant(conn: ledger.Conn, actor: identity.Session, principal_id: str,
                roles: Iterable[str], *, reason: str) -> Entry:
    """Add roles to a principal of the actor's tenant, creating the principal if new.

    A revoked principal stays revoked (its roles change; :func:`reinstate` lifts it).

    Raises:
        NotAnOperator: The actor is not a current operator of its tenant.
        PolicyDenied: The actor names itself.
        ValidationFailed: Not a principal id or role name a session could carry.
    """
    wanted = _roles(roles)
    return await _change(conn, actor, principal_id, "role_granted", reason=reason,
                         create=True, edit=lambda held, revoked: (held | wanted, revoked),
                         detail={"roles": sorted(wanted)})


async def revoke_role(conn: ledger.Conn, actor: identity.Session, principal_id: str,
                      roles: Iterable[str], *, reason: str) -> Entry:
    """Take roles from a principal (from the next request on, it is refused what they gave).

    Raises:
        PrincipalNotFound: No such principal in the actor's tenant.
        NotAnOperator, PolicyDenied, ValidationFailed: as :func:`grant`.
    """
    dropped = _roles(roles)
    return await _change(conn, actor, principal_id, "role_revoked", reason=reason,
                         edit=lambda held, revoked: (held - dropped, revoked),
                         detail={"roles": sorted(dropped)})


async def revoke(conn: ledger.Conn, actor: identity.Session, principal_id: str, *,
                 reason: str) -> Entry:
    """Revoke a principal: denied everything from the next evaluation on, queued work included.

    Raises:
        PrincipalNotFound, NotAnOperator, PolicyDenied, ValidationFailed: as :func:`revoke_role`.
    """
    return await _change(conn, actor, principal_id, "revoked", reason=reason,
                         edit=lambda held, revoked: (held, True))


async def reinstate(conn: ledger.Conn, actor: identity.Session, principal_id: str, *,
                    reason: str) -> Entry:
    """Lift a principal's revocation (with the roles it holds).

    Raises:
        PrincipalNotFound, NotAnOperator, PolicyDenied, ValidationFailed: as :func:`revoke_role`.
    """
    return await _change(conn, actor, principal_id, "reinstated", reason=reason,
                         edit=lambda held, revoked: (held, False))


async def show(conn: ledger.Conn, actor: identity.Session, principal_id: str | None = None
               ) -> list[Entry]:
    """The actor's tenant's directory, or one principal of it.

    Raises:
        NotAnOperator: The actor is not a current operator of its tenant.
    """
    await repository.require_operator(conn, actor.tenant_id, actor.principal_id)
    async with ledger.transaction(conn, actor.tenant_id) as tx:
        rows = await tx.fetch(Q["list_principals"], actor.tenant_id, principal_id)
    return [_entry(r) for r in rows]


def _roles(roles: Iterable[str]) -> frozenset[str]:
    found = frozenset(roles)
    bad = sorted(r for r in found if not identity.is_role_name(r))
    if not found or bad:
        raise errors.ValidationFailed(f"not role names a session could carry: {bad!r}"[:300]
                                      if bad else "name at least one role")
    return found


async def _change(
    conn: ledger.Conn, actor: identity.Session, principal_id: str, change: Change, *,
    reason: str, edit: Edit, create: bool = False, detail: dict[str, Any] | None = None,
) -> Entry:
    if not identity.is_principal_id(principal_id):
        raise errors.ValidationFailed("not a principal id a session could carry")
    if principal_id == actor.principal_id:
        raise errors.PolicyDenied("an operator does not change their own directory entry: "
                                  "another operator does")
    if not reason.strip():
        raise errors.ValidationFailed("say why (--reason): it is recorded in the audit event")
    tenant_id = actor.tenant_id
    async with ledger.transaction(conn, tenant_id) as tx:
        await repository.require_operator(tx, tenant_id, actor.principal_id)
        created = create and await tx.fetchval(Q["create_principal"], tenant_id,
                                               principal_id) is not None
        row = await tx.fetchrow(Q["lock_principal"], tenant_id, principal_id)
        if row is None:
            raise errors.PrincipalNotFound(principal_id=principal_id)
        before = _entry(row)
        roles, revoked = edit(frozenset(before.roles), before.revoked)
        after = _entry(await tx.fetchrow(Q["change_principal"], tenant_id, principal_id,
                                         json.dumps(sorted(roles)), revoked))
        await ledger.append_event(
            tx, tenant_id=tenant_id, operation_id=None, family="audit", type=f"principal.{change}",
            payload={"principal_id": principal_id, "by": actor.principal_id,
                     "reason": common.reason_text(reason), "created": created, **(detail or {}),
                     "roles_before": list(before.roles), "roles_after": list(after.roles),
                     "revoked_before": before.revoked, "revoked_after": after.revoked})
    return after
