"""What the MCP server reads from the database: the principal directory and what the ledger
knows of one operation. Read only, as ``agentledger_auditor`` (its login: ``logins``).

The directory is asked at every request, as the console and admission ask it: a revoked
principal's still-valid token stops working at once. The status tool asks the ledger which
principal proposed an operation (so it answers only them, an approver or an operator of the
tenant) and what is recorded — an id the ledger does not know is answered ``not_found``
without reading any topic from its start.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import asyncpg

from agentledger import db, errors, identity, sql
from agentledger.ledger import repository as ledger
from agentledger.policy import cedar
from agentledger.policy import repository as policy_repo

Q = sql.load(Path(__file__).with_name("queries.sql"))


@dataclass(frozen=True)
class Known:
    """What the ledger records of one operation (``None``: nothing of it)."""

    proposer: str
    state: str | None  # the command's, once admitted
    receipt: str | None
    reason: str | None
    approval_id: uuid.UUID | None
    approval_state: str | None
    since: datetime  # when it entered the ledger: its answers are on the topics from then
    updated: datetime  # the last change the ledger records


class Directory:
    """The directory and the ledger over one pool (opened in the server's lifespan)."""

    def __init__(self, pool: asyncpg.Pool | None = None) -> None:
        self._pool_or_none = pool

    async def open(self, url: str, *, role: str | None, size: int) -> None:
        """Open the pool (the server's lifespan).

        Raises:
            errors.StorageError: The database did not answer.
        """
        self._pool_or_none = await db.create_pool(url, role=role, size=size)

    async def close(self) -> None:
        """Close the pool (the server stops)."""
        pool, self._pool_or_none = self._pool_or_none, None
        if pool is not None:
            await pool.close()

    @property
    def _pool(self) -> asyncpg.Pool:
        if self._pool_or_none is None:
            raise errors.StorageError("the MCP server's database pool is not open")
        return self._pool_or_none

    async def principal(self, tenant_id: uuid.UUID, principal_id: str) -> cedar.Principal:
        """The principal as the directory records it, if current.

        Raises:
            errors.IdentityRejected: Unknown in this tenant, or revoked.
            errors.StorageError: The database did not answer.
        """
        async with self._pool.acquire() as conn:
            found = await policy_repo.PostgresPrincipalDirectory(conn).lookup(
                tenant_id, principal_id)
        if found is None:
            raise errors.IdentityRejected("principal unknown in the directory of its tenant")
        if found.revoked:
            raise errors.IdentityRejected("principal revoked in the directory")
        return found

    async def operation(self, tenant_id: uuid.UUID, operation_id: uuid.UUID) -> Known | None:
        """What the ledger records of one operation of this tenant.

        Raises:
            errors.StorageError: The database did not answer.
        """
        async with self._pool.acquire() as conn, ledger.transaction(conn, tenant_id) as tx:
            row = await tx.fetchrow(Q["operation_known"], tenant_id, operation_id)
        if row is None or (row["command_principal"] is None
                           and row["approval_principal"] is None):
            return None
        admitted = row["command_principal"] is not None
        return Known(
            proposer=row["command_principal"] if admitted else row["approval_principal"],
            state=row["state"], receipt=row["provider_receipt"],
            reason=row["outcome_reason"] or row["decision_reason"],
            approval_id=row["approval_id"], approval_state=row["approval_state"],
            since=row["admitted_at"] if admitted and row["requested_at"] is None
            else row["requested_at"] or row["admitted_at"],
            updated=max(t for t in (row["command_updated_at"], row["decided_at"],
                                    row["requested_at"], row["admitted_at"]) if t is not None))


def may_follow(asker: identity.Session, known: Known) -> bool:
    """Whether ``asker`` (a session of the operation's tenant whose roles are the
    directory's, as the gate builds it) may read ``known``: the principal that proposed it,
    or an approver or operator of the tenant."""
    return (asker.principal_id == known.proposer
            or bool(set(asker.roles) & (policy_repo.APPROVING_ROLES
                                        | policy_repo.OPERATING_ROLES)))
