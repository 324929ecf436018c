"""Admission's allowed path for a batch of commands of one tenant, in one statement (issue 41).

:func:`admit_allowed_batch` is :func:`repository.admit_allowed` over arrays: every command of
the batch whose key is new and whose request's budget has room for all of the batch's new
commands of that request is admitted — budget spend, command, dispatch obligation,
``command.admitted`` audit event and allow decision — by one statement. A command it writes
nothing for (already recorded: a replay or a conflict; a budget without room for the batch)
is answered ``None``, and the caller runs the per-row path for it in the same transaction,
which is exact for budgets and reads back what the ledger holds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

from agentledger import sql
from agentledger.ledger import repository

Q = sql.load(Path(__file__).with_name("admitbatch.sql"))


@dataclass(frozen=True, slots=True)
class Allowed:
    """One allowed command of the batch, as ``repository.admit_allowed`` takes it."""

    command: repository.NewCommand
    workflow_id: str | None  # the request whose tool-call budget it spends; None: unbudgeted
    audit: Mapping[str, Any]  # the proposal's part of the ``command.admitted`` audit event
    decision_reasons: str  # JSON list of the policy ids that allowed it
    decision_reason: str


async def admit_allowed_batch(
    tx: repository.Conn, tenant_id: UUID, rows: Sequence[Allowed], *,
    tool_call_limit: int | None,
) -> list[repository.AdmitResult | None]:
    """Admit every row that is a first admission with budget room, in one statement, inside
    the caller's transaction bound to ``tenant_id``.

    Args:
        rows: commands of ``tenant_id``, each operation id at most once.
        tool_call_limit: the limit a request's budget opens with (rows with a workflow).

    Returns:
        Per row, in order: the admission, or None when nothing was written for it (the caller
        answers it by the per-row path). Spends that raced a concurrent first admission of
        the same key are given back first (one more statement, on that rare path).

    Raises:
        DataRejected, StorageError: as :func:`repository.transaction` (the caller's
        transaction is then aborted).
    """
    if len({r.command.operation_id for r in rows}) != len(rows):
        raise ValueError("an operation id appears twice in one admission batch")
    commands = [r.command for r in rows]
    found = await tx.fetch(
        Q["admit_allowed_batch"], tenant_id,
        [c.operation_id for c in commands], [c.request_hash for c in commands],
        [c.principal_id for c in commands], [c.action for c in commands],
        [c.connector for c in commands], [c.resource_id for c in commands],
        [c.expected_revision for c in commands], [c.decision_id for c in commands],
        [c.policy_version for c in commands], [c.allowlist_version for c in commands],
        [c.expires_at for c in commands], [c.payload_ciphertext for c in commands],
        [c.payload_key_version for c in commands], [c.traceparent for c in commands],
        [c.tracestate for c in commands], [r.workflow_id for r in rows], tool_call_limit,
        [repository.admitted_audit_json(r.command, r.audit) for r in rows],
        [r.decision_reasons for r in rows], [r.decision_reason for r in rows])
    if len(found) != len(rows):
        raise AssertionError("admit_allowed_batch answers one row per command")
    results: list[repository.AdmitResult | None] = []
    raced: Counter[str] = Counter()
    for row, answer in zip(rows, found, strict=True):
        if answer["created_at"] is not None:
            results.append(repository.admitted_now(row.command, answer["created_at"]))
            continue
        results.append(None)
        if answer["spent"] and row.workflow_id is not None:
            raced[row.workflow_id] += 1
    for workflow_id, count in sorted(raced.items()):
        await tx.execute(Q["give_back_tool_calls"], tenant_id, workflow_id, count)
    return results
