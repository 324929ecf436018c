"""``explain`` names the budget that refused an operation and shows its charges, and an
N-of-M request's quorum and who approved (issue 42)."""

from __future__ import annotations

import uuid

from rich.console import Console

from agentledger.audit import explain
from agentledger.cli import explain as cli_explain


def _explanation(permitted: explain.Permitted) -> explain.Explanation:
    return explain.Explanation(
        tenant_id=uuid.uuid4(), operation_id=uuid.uuid4(),
        proposed=explain.Proposed(action="billing.refund.create", target="c-1",
                                  principal="user:alice", planner=None, model=None,
                                  proposal_id=None, request_hash=None, allowlist_version=None,
                                  evidence=[]),
        permitted=permitted, attempted=[],
        known=explain.Known(state="not admitted", receipt=None, reason=None, finished_at=None,
                            payload_purged=False, reconciliations=[]),
        timeline=[])


def _shown(found: explain.Explanation) -> str:
    console = Console(record=True, width=200)
    cli_explain.render(found, console)
    return console.export_text()


def test_explain_names_the_budget_that_refused_in_money() -> None:
    found = _explanation(explain.Permitted(
        decisions=[], approvals=[], command_decision_id=None, policy_version=None,
        valid_until=None, budget_refusals=[explain.BudgetRefusal(
            budget="refunds-eur-per-principal-day", scope="principal", window="day",
            window_start="2026-12-06T00:00:00+00:00", unit="amount", currency="EUR",
            amount=10_000, limit=100_000, spent=100_000,
            recorded_at="2026-12-06T09:30:00+00:00")]))
    assert ("refused by budget refunds-eur-per-principal-day (principal, day "
            "2026-12-06T00:00:00+00:00): 100.00 EUR asked, 1,000.00 EUR of 1,000.00 EUR "
            "already spent") in _shown(found)


def test_explain_shows_the_charges_and_the_quorum() -> None:
    found = _explanation(explain.Permitted(
        decisions=[], command_decision_id=None, policy_version=None, valid_until=None,
        approvals=[explain.ApprovalSummary(
            approval_id="a-1", state="approved", risk="high", decided_by="user:frank",
            decided_at=None, decision_reason="ok", expires_at=None, superseded_by=None,
            required_approvals=2, approver_role="finance-approver",
            approved_by=["user:fiona", "user:frank"])],
        budget_charges=[explain.BudgetCharge(
            budget="calls-per-tenant-hour", scope="tenant", scope_key="tenant",
            window_kind="hour", window_start="2026-12-06T09:00:00+00:00", unit="calls",
            currency=None, amount=1, limit_amount=5000, state="settled",
            created_at="2026-12-06T09:30:00+00:00", settled_at=None)]))
    shown = _shown(found)
    assert "needs 2 approvers of role finance-approver; approved by user:fiona, user:frank" \
        in shown
    assert ("budget calls-per-tenant-hour (tenant tenant, hour 2026-12-06T09:00:00+00:00): "
            "1 calls of 5000 calls — settled") in shown
