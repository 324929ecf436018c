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

from pydantic import BaseModel, ConfigDict

from agentledger import errors, sql
from agentledger.ledger import repository as ledger
from agentledger.telemetry import spans

Q = sql.load(Path(__file__).with_name("queries.sql"))


class _Row(BaseModel):
    """A ledger row as it reads in JSON: ids and times as strings, bytes as hex."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Evidence(_Row):
    """One piece of evidence the proposal cited (its reference and digest, never its body)."""

    ref: str | None = None
    source: str | None = None
    sha256: str | None = None
    fetched_at: str | None = None


class Proposed(_Row):
    """What was proposed: the action, its target and principal, and who planned it."""

    action: str | None
    target: str | None
    principal: str | None
    planner: str | None
    model: str | None
    proposal_id: str | None
    request_hash: str | None
    allowlist_version: str | None
    evidence: list[Evidence]


class Decision(_Row):
    """One policy decision (admission or dispatch stage) about the operation."""

    decision_id: str
    stage: str
    effect: str
    policy_version: str
    reasons: list[Any]
    reason: str | None
    principal_id: str | None
    decided_at: str


class ApprovalSummary(_Row):
    """One approval request the intent had, and how it was decided."""

    approval_id: str
    state: str
    risk: str | None
    decided_by: str | None
    decided_at: str | None
    decision_reason: str | None
    expires_at: str | None
    superseded_by: str | None
    # N-of-M (issue 42): distinct approvers of ``approver_role`` needed, and who approved.
    required_approvals: int = 1
    approver_role: str | None = None
    approved_by: list[str] = []
    # Narrow-only edits (issue 42): the request this one narrowed, and the one narrowing it.
    narrowed_from: str | None = None
    narrowed_to: str | None = None


class BudgetCharge(_Row):
    """What the operation costs one of the operator's budgets (issue 42)."""

    budget: str
    scope: str
    scope_key: str
    window_kind: str
    window_start: str | None
    unit: str
    currency: str | None
    amount: int
    limit_amount: int
    state: str  # reserved, settled (the command succeeded) or released
    created_at: str
    settled_at: str | None


class BudgetRefusal(_Row):
    """A budget that had no room for the operation: nothing was admitted."""

    budget: str
    scope: str | None = None
    window: str | None = None
    window_start: str | None = None
    unit: str | None = None
    currency: str | None = None
    amount: int | None = None
    limit: int | None = None
    spent: int | None = None  # already reserved or used in the window when it was refused
    recorded_at: str


class Permitted(_Row):
    """What was permitted: every decision, every approval, and the authorization's validity."""

    decisions: list[Decision]
    approvals: list[ApprovalSummary]
    command_decision_id: str | None
    policy_version: str | None
    valid_until: str | None
    budget_charges: list[BudgetCharge] = []
    budget_refusals: list[BudgetRefusal] = []


class Attempt(_Row):
    """One execution attempt (dispatch, resend, lookup …) and its result."""

    attempt_id: str
    kind: str
    worker_id: str | None
    fencing_generation: int | None
    started_at: str
    finished_at: str | None
    result: str | None
    detail: str | None
    # What the provider answered after this attempt's claim was taken over (issue 37).
    late_answer: str | None = None
    late_receipt: str | None = None
    late_at: str | None = None


class Resolution(_Row):
    """An operator's reconciliation of an outcome the system could not know."""

    resolved_by: str
    resolved_at: str
    outcome: str
    receipt: str | None
    reason: str | None
    evidence: str | None
    # A late call may still land and contradict it (a provider that cannot be fenced).
    provisional: bool = False


class Known(_Row):
    """What is known to have happened: the state, the provider's receipt, reconciliations —
    and, when a provider later said otherwise, the contradiction (the state is what was
    recorded; ``contradiction`` is what the provider said after)."""

    state: str
    receipt: str | None
    reason: str | None
    finished_at: str | None
    payload_purged: bool
    reconciliations: list[Resolution]
    contradicted_at: str | None = None
    contradiction: str | None = None


class TimelineEntry(_Row):
    """One audit event, in the order the ledger recorded it."""

    seq: int
    type: str
    recorded_at: str
    event_id: str


class Explanation(_Row):
    """The four answers about one operation, plus the audit timeline behind them."""

    tenant_id: UUID
    operation_id: UUID
    proposed: Proposed
    permitted: Permitted
    attempted: list[Attempt]
    known: Known
    timeline: list[TimelineEntry]
    # The W3C trace its first traced event was recorded under (admission's, R8.2): where its
    # spans are, when the services export them.
    trace_id: str | None = None

    def trace_link(self, traces_url: str | None) -> str | None:
        """The operation's trace in a trace UI (Jaeger's ``/trace/<id>``), if both are known."""
        if not (traces_url and self.trace_id):
            return None
        return f"{traces_url.rstrip('/')}/trace/{self.trace_id}"


_EVIDENCE_KEYS = tuple(Evidence.model_fields)


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
        approvals = [_plain(r, ("evidence", "approved_by"))
                     for r in await tx.fetch(Q["approvals"], tenant_id, operation_id)]
        attempts = [_plain(r) for r in await tx.fetch(Q["attempts"], tenant_id, operation_id)]
        resolutions = [_plain(r) for r in
                       await tx.fetch(Q["resolutions"], tenant_id, operation_id)]
        events = [_plain(r, ("payload",))
                  for r in await tx.fetch(Q["events"], tenant_id, operation_id)]
        charges = [_plain(r) for r in await tx.fetch(Q["budget_charges"], tenant_id,
                                                     operation_id)]
    if command is None and not (decisions or approvals or events):
        raise errors.CommandNotFound(operation_id=str(operation_id))
    cmd = _plain(command) if command is not None else {}
    first_proposal: dict[str, Any] = next(
        (e["payload"] for e in events if e["type"] in ("command.admitted", "approval.requested")),
        {})
    evidence = approvals[0]["evidence"] if approvals else first_proposal.get("evidence", [])
    proposed = Proposed(
        action=cmd.get("action") or (approvals[0]["action"] if approvals else None)
        or first_proposal.get("action"),
        target=cmd.get("resource_id") or (approvals[0]["resource_id"] if approvals else None),
        principal=cmd.get("principal_id") or first_proposal.get("principal_id"),
        planner=first_proposal.get("planner"),
        model=first_proposal.get("model"),
        proposal_id=first_proposal.get("proposal_id"),
        request_hash=cmd.get("request_hash") or (approvals[-1]["request_hash"]
                                                 if approvals else None),
        allowlist_version=cmd.get("allowlist_version"),
        evidence=[Evidence(**{k: e.get(k) for k in _EVIDENCE_KEYS}) for e in evidence],
    )
    permitted = Permitted(
        decisions=[Decision(**d) for d in decisions],
        approvals=[ApprovalSummary(**{k: a[k] for k in ApprovalSummary.model_fields})
                   for a in approvals],
        command_decision_id=cmd.get("decision_id"),
        policy_version=cmd.get("policy_version"),
        valid_until=cmd.get("expires_at"),
        budget_charges=[BudgetCharge(**c) for c in charges],
        budget_refusals=[_refusal(e) for e in events if e["type"] == "budget.exhausted"
                         and "budget" in (e["payload"] or {})],
    )
    known = Known(
        state=cmd.get("state", "not admitted"),
        receipt=cmd.get("provider_receipt"),
        reason=cmd.get("outcome_reason"),
        finished_at=cmd.get("finished_at"),
        payload_purged=cmd.get("payload_purged_at") is not None,
        reconciliations=[Resolution(**r) for r in resolutions],
        contradicted_at=cmd.get("contradicted_at"),
        contradiction=cmd.get("contradiction"),
    )
    timeline = [TimelineEntry(seq=e["seq"], type=e["type"], recorded_at=e["recorded_at"],
                              event_id=e["event_id"]) for e in events]
    return Explanation(tenant_id=tenant_id, operation_id=operation_id, proposed=proposed,
                       permitted=permitted, attempted=[Attempt(**a) for a in attempts],
                       known=known, timeline=timeline,
                       trace_id=next((t for e in events if (t := _trace_id(e["traceparent"]))),
                                     None))


def _refusal(event: dict[str, Any]) -> BudgetRefusal:
    p = event["payload"]
    return BudgetRefusal(
        budget=str(p["budget"]), scope=p.get("scope"), window=p.get("window"),
        window_start=p.get("window_start"), unit=p.get("unit"), currency=p.get("currency"),
        amount=p.get("amount"), limit=p.get("limit"), spent=p.get("spent"),
        recorded_at=event["recorded_at"])


def _trace_id(traceparent: str | None) -> str | None:
    """The trace id of a stored ``traceparent`` (``00-<32 hex>-<16 hex>-<flags>``), else None."""
    context = spans.span_context_from(traceparent)
    return format(context.trace_id, "032x") if context is not None else None
