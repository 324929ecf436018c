"""The operator's steps of the demo, through the library's own functions (never the CLI's
commands): the unknown commands of a tenant, and a resolution signed with a session token.

Each step reads and writes as the role the ``agentledger reconcile`` commands use, so the
ledger answers the demo exactly as it answers an operator at a shell.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any, Literal

from agentledger import db, operators
from agentledger.executor import resolution
from agentledger.ledger import resolutions

RECONCILER = "agentledger_reconciler"
# The principal directory is read as the auditor: the reconciler role cannot read it.
AUDITOR = "agentledger_auditor"


async def unknown_commands(database_url: str, tenant: uuid.UUID) -> list[dict[str, Any]]:
    """The tenant's commands whose outcome is unknown, as ``reconcile list`` reads them."""
    conn = await db.connect(database_url, role=RECONCILER)
    try:
        return await resolutions.unknown_commands(conn, tenant)
    finally:
        await conn.close()


def describe(row: dict[str, Any]) -> str:
    """One line per command, full ids, as ``reconcile list`` prints it."""
    return (f"{row['operation_id']}  {row['action']}  connector={row['connector']}  "
            f"target={row['resource_id']}  principal={row['principal_id']}  "
            f"since={row['updated_at']:%Y-%m-%dT%H:%M:%SZ}  why={row['outcome_reason']}")


async def resolve(database_url: str, token: str, op: uuid.UUID, *,
                  outcome: Literal["succeeded", "failed"], reason: str, receipt: str | None,
                  evidence: str | None) -> resolution.Resolved:
    """Resolve ``op`` as the operator whose session ``token`` is, checked with the connector's
    lookup where it has one (the operator settings come from the environment, as for
    ``reconcile resolve``)."""
    cfg = operators.OperatorSettings()
    session = operators.verify(token, cfg)
    async with contextlib.AsyncExitStack() as stack:
        connectors = cfg.connectors()
        for connector in connectors.values():
            stack.push_async_callback(connector.aclose)
        conn = await db.connect(database_url, role=RECONCILER)
        stack.push_async_callback(conn.close)
        directory = await db.connect(database_url, role=AUDITOR)
        stack.push_async_callback(directory.close)
        return await resolution.resolve(
            conn, directory, session, op, outcome=outcome, reason=reason, receipt=receipt,
            evidence=evidence, connectors=connectors, credentials=cfg.credentials())
