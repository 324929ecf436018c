"""``agentledger explain``: what was proposed, permitted, attempted and is known."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from agentledger import db, settings
from agentledger.audit import explain as audit_explain
from agentledger.evidence import keys as evidence_keys
from agentledger.evidence import receipt

console = Console()


def explain(
    operation_id: uuid.UUID,
    tenant: Annotated[uuid.UUID, typer.Option(help="Tenant id")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
    jwks: Annotated[Path | None, typer.Option(
        envvar="AGENTLEDGER_EVIDENCE_JWKS",
        help="The notary's JWKS: also say whether the operation's evidence verifies "
             "(docs/evidence.md)")] = None,
) -> None:
    """What was proposed, permitted, attempted and is known for one operation (audit ledger)."""

    async def run() -> tuple[audit_explain.Explanation, str | None]:
        conn = await db.connect(settings.load().database_url, role="agentledger_auditor")
        try:
            found = await audit_explain.explain(conn, tenant, operation_id)
            checked = None
            if jwks is not None:
                checked = await receipt.status(conn, tenant, operation_id,
                                               evidence_keys.load_jwks(jwks))
            return found, checked
        finally:
            await conn.close()

    found, checked = asyncio.run(run())  # a refusal: one line, from agentledger.cli.group
    if as_json:
        console.print_json(found.model_dump_json())
        return
    render(found, console, settings.load().traces_url)
    if checked is not None:
        colour = "green" if checked.startswith("verified") else (
            "red" if checked.startswith("BROKEN") else "yellow")
        console.print(f"[bold]evidence[/bold]  [{colour}]{escape(checked)}[/{colour}]",
                      highlight=False, soft_wrap=True)


def render(found: audit_explain.Explanation, console: Console,
           traces_url: str | None = None) -> None:
    """The four answers, for a person (the demo prints them the same way), and the trace's
    link when a trace UI is configured (``AGENTLEDGER_TRACES_URL``)."""
    p, k = found.proposed, found.known
    console.rule(f"operation {found.operation_id}")
    console.print(f"[bold]proposed[/bold]  {p.action} on {p.target} for {p.principal} "
                  f"by planner {p.planner} (model {p.model}); "
                  f"{len(p.evidence)} evidence item(s); hash {str(p.request_hash)[:16]}…")
    console.print("[bold]permitted[/bold]")
    for d in found.permitted.decisions:
        console.print(f"  {d.decided_at}  {d.stage:<9} {d.effect:<16} "
                      f"{d.policy_version[:30]}  {d.reason}", highlight=False)
    for a in found.permitted.approvals:
        console.print(f"  approval {a.approval_id}: {a.state} by {a.decided_by} "
                      f"({a.decision_reason})", highlight=False)
        if a.required_approvals > 1:
            console.print(f"    needs {a.required_approvals} approvers of role "
                          f"{a.approver_role}; approved by {', '.join(a.approved_by) or 'nobody'}",
                          highlight=False)
        if a.narrowed_to:
            console.print(f"    narrowed by {a.decided_by} into approval {a.narrowed_to}; "
                          "it never runs", highlight=False)
        if a.narrowed_from:
            console.print(f"    narrows approval {a.narrowed_from}", highlight=False)
    for c in found.permitted.budget_charges:
        console.print(f"  budget {c.budget} ({c.scope} {c.scope_key}, {c.window_kind} "
                      f"{c.window_start or ''}): {_units(c.amount, c.unit, c.currency)} of "
                      f"{_units(c.limit_amount, c.unit, c.currency)} — {c.state}",
                      highlight=False)
    for b in found.permitted.budget_refusals:
        console.print(f"  [red]refused by budget {b.budget}[/red] ({b.scope}, {b.window} "
                      f"{b.window_start or ''}): "
                      f"{_units(b.amount, b.unit, b.currency)} asked, "
                      f"{_units(b.spent, b.unit, b.currency)} of "
                      f"{_units(b.limit, b.unit, b.currency)} already spent", highlight=False)
    console.print("[bold]attempted[/bold]")
    if not found.attempted:
        console.print("  nothing was attempted")
    for t in found.attempted:
        console.print(f"  {t.started_at}  {t.kind:<8} worker={t.worker_id} "
                      f"generation={t.fencing_generation} → {t.result} {t.detail or ''}",
                      highlight=False)
        if t.late_answer:
            console.print(f"    [yellow]late answer[/yellow] at {t.late_at}: the provider said "
                          f"{t.late_answer}" + (f" (receipt {t.late_receipt})"
                                                if t.late_receipt else ""), highlight=False)
    console.print(f"[bold]known[/bold]     state={k.state} receipt={k.receipt} "
                  f"reason={k.reason}", highlight=False)
    for r in k.reconciliations:
        console.print(f"  reconciled {r.outcome} by {r.resolved_by} at {r.resolved_at}: "
                      f"{r.reason} (evidence: {r.evidence})", highlight=False)
        if r.provisional:
            console.print("  [yellow]provisional[/yellow]: a late call may still land and "
                          "contradict it", highlight=False)
    if k.contradicted_at:
        console.print(f"  [red]CONTRADICTED[/red] at {k.contradicted_at}: {k.contradiction} — "
                      "recorded as above, and the provider later said otherwise "
                      "(docs/operations.md#contradicted-outcomes)", highlight=False)
    console.print(f"[dim]{len(found.timeline)} audit events[/dim]")
    if link := found.trace_link(traces_url):
        console.print(f"[bold]trace[/bold]     {link}", highlight=False)
    elif found.trace_id:
        console.print(f"[dim]trace {found.trace_id} (set AGENTLEDGER_TRACES_URL to link it)[/dim]")


def _units(amount: int | None, unit: str | None, currency: str | None) -> str:
    """An amount as a person reads it: money in major units with its currency."""
    if amount is None:
        return "?"
    if unit == "amount" and currency:
        return f"{amount / 100:,.2f} {currency}"
    return f"{amount} {unit or ''}".strip()
