"""The ledger's shadow flag: a command of a shadow run is never dispatched (R9.2).

Admission refuses shadow proposals, so no command should ever carry the flag; the executor
reads it anyway before any connector call, so a shadow command that reached the ledger by
any other way (a bug, a manual insert) is denied without a call.
"""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

from agentledger import sql
from agentledger.ledger import repository

Q = sql.load(Path(__file__).with_name("shadow_marker.sql"))


async def is_shadow(conn: repository.Conn, tenant_id: UUID, operation_id: UUID) -> bool:
    """Whether the ledger marks this command as a shadow run's (False when there is no row).

    Raises:
        errors.AccessDenied, errors.StorageError: as :func:`repository.transaction`.
    """
    async with repository.transaction(conn, tenant_id) as tx:
        return bool(await tx.fetchval(Q["is_shadow"], tenant_id, operation_id))
