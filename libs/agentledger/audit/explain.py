"""``explain``: for one operation, what was proposed, permitted, attempted and known — from
the durable ledger (commands, decisions, approvals, attempts, resolutions, audit events), never
from traces (R8.4, R8.6). Reads run as ``agentledger_auditor``, tenant-bound.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from agentledger import errors, sql
from agentledger.ledger import repository as ledger

Q = sql.load(Path(__file__).with_name("queries.sql"))


class Explanation(BaseModel):
    """The four answers about one operation, plus the audit timeline behind them."""

    tenant_id: UUID
    operation_id: UUID
    proposed: dict[str, Any]
    permitted: dict[str, Any]
    attempted: list[dict[str, Any]]
    known: dict[str, Any]
    timeline: list[dict[str, Any]]


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _plain(row: Any, json_keys: tuple[str, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in dict(row).items():
        if isinstance(value, bytes | bytearray | memoryview):
            out[key] = bytes(value).hex()
        elif isinstance(value, UUID):
            out[key] = str(value)
        elif isinstance(value, datetime):
            out[key] = value.isoformat()
        elif key in json_keys:
            out[key] = _json(value)
        else:
            out[key] = value
    return out


async def explain(conn: ledger.Conn, tenant_id: UUID, operation_id: UUID) -> Explanation:
    """Explain one operation of one tenant.

    Raises:
        CommandNotFound: the ledger knows nothing about it in this tenant.
    """
    async with ledger.transaction(conn, tenant_id) as tx:
        command = await tx.fetchrow(Q["command"], tenant_id, operation_id)
        decisions = [_plain(r, ("reasons",))
                     for r in await tx.fetch(Q["decisions"], tenant_id, operation_id)]
        approvals = [_plain(r, ("evidence",))
                     for r in await tx.fetch(Q["approvals"], tenant_id, operation_id)]
        attempts = [_plain(r) for r in await tx.fetch(Q["attempts"], tenant_id, operation_id)]
        resolutions = [_plain(r) for r in
                       await tx.fetch(Q["resolutions"], tenant_id, operation_id)]
        events = [_plain(r, ("payload",))
                  for r in await tx.fetch(Q["events"], tenant_id, operation_id)]
    if command is None and not (decisions or approvals or events):
        raise errors.CommandNotFound(operation_id=str(operation_id))
    cmd = _plain(command) if command is not None else {}
    first_proposal: dict[str, Any] = next(
        (e["payload"] for e in events if e["type"] in ("command.admitted", "approval.requested")),
        {})
    evidence = approvals[0]["evidence"] if approvals else first_proposal.get("evidence", [])
    proposed = {
        "action": cmd.get("action") or (approvals[0]["action"] if approvals else None)
        or first_proposal.get("action"),
        "target": cmd.get("resource_id") or (approvals[0]["resource_id"] if approvals else None),
        "principal": cmd.get("principal_id") or first_proposal.get("principal_id"),
        "planner": first_proposal.get("planner"),
        "model": first_proposal.get("model"),
        "proposal_id": first_proposal.get("proposal_id"),
        "request_hash": cmd.get("request_hash") or (approvals[-1]["request_hash"]
                                                    if approvals else None),
        "allowlist_version": cmd.get("allowlist_version"),
        "evidence": [{k: e.get(k) for k in ("ref", "source", "sha256", "fetched_at")}
                     for e in evidence],
    }
    permitted = {
        "decisions": decisions,
        "approvals": [{k: a[k] for k in ("approval_id", "state", "risk", "decided_by",
                                         "decided_at", "decision_reason", "expires_at",
                                         "superseded_by")} for a in approvals],
        "command_decision_id": cmd.get("decision_id"),
        "policy_version": cmd.get("policy_version"),
        "valid_until": cmd.get("expires_at"),
    }
    known = {
        "state": cmd.get("state", "not admitted"),
        "receipt": cmd.get("provider_receipt"),
        "reason": cmd.get("outcome_reason"),
        "finished_at": cmd.get("finished_at"),
        "payload_purged": cmd.get("payload_purged_at") is not None,
        "reconciliations": resolutions,
    }
    timeline = [{"seq": e["seq"], "type": e["type"], "recorded_at": e["recorded_at"],
                 "event_id": e["event_id"]} for e in events]
    return Explanation(tenant_id=tenant_id, operation_id=operation_id, proposed=proposed,
                       permitted=permitted, attempted=attempts, known=known, timeline=timeline)
