"""What admission answers and what its audit keeps of a proposal: pure, no I/O.

The answers the flow (``admitter``) and the transaction (``transaction``) both build — a
conflict, a budget refusal, a replay's recorded outcome — and the audit payload every admitted,
replayed or sealed proposal carries.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from agentledger import errors
from agentledger.contracts import admission as admission_contract
from agentledger.contracts import outcomes
from agentledger.contracts.proposals import ProposalV1
from agentledger.ledger import repository
from agentledger.policy import allowlist as allowlist_mod

AdmissionResultV1 = admission_contract.AdmissionResultV1


def now() -> datetime:
    return datetime.now(UTC)


def budget_refusal(budget: str) -> errors.BudgetExhausted:
    """The refusal naming the operator's budget that had no room (issue 42)."""
    return errors.BudgetExhausted(
        f"budget {budget!r} has no room for this command; nothing was admitted")


def conflict(base: dict[str, Any]) -> AdmissionResultV1:
    """The answer to a proposal whose operation id holds a different request."""
    return AdmissionResultV1.refused(errors.IdempotencyConflict(
        "operation id already bound to a different request; nothing was changed",
    ), decided_at=now(), **base)


def proposal_audit(proposal: ProposalV1, spec: allowlist_mod.ActionSpec) -> dict[str, Any]:
    """What the audit keeps of a proposal: who planned it on which evidence — hashes and
    sources only, never the evidence text, the prompt or the payload (R8.5)."""
    return {"proposal_id": str(proposal.proposal_id), "planner": proposal.planner.name,
            "model": proposal.planner.model, "risk": spec.risk,
            "evidence": [{"ref": e.ref, "source": e.source, "sha256": e.sha256,
                          "fetched_at": e.fetched_at.isoformat()} for e in proposal.evidence],
            "usage": proposal.usage.model_dump() if proposal.usage else None}


def recorded_outcome(
    recorded: repository.Recorded, proposal: ProposalV1
) -> outcomes.Outcome | None:
    """The outcome a replay returns: what the ledger recorded, or None while in flight."""
    return outcomes.of_state(proposal.operation_id, recorded.state, recorded.provider_receipt,
                             recorded.outcome_reason or recorded.state)
