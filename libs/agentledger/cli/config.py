"""``agentledger check-config``: the operator's allowlist, policies and connectors, together."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import TypeAdapter, ValidationError
from rich.console import Console
from rich.table import Table

from agentledger import settings
from agentledger.connectors import plugins
from agentledger.policy import check as check_mod

console = Console()
# The CRM stand-in's URL: the demo connectors' option when no connectors are configured.
DEMO_CRM_URL = "http://127.0.0.1:8090"
_OPTIONS = TypeAdapter(dict[str, dict[str, Any]])


class _Sources(settings.PolicySources):
    connectors: settings.ConnectorOptions = None


def check_config(
    allowlist: Annotated[Path | None, typer.Option(
        help="Allowlist file (default: AGENTLEDGER_ALLOWLIST, else the packaged one)")] = None,
    policies: Annotated[Path | None, typer.Option(
        help="Cedar policy directory (default: AGENTLEDGER_POLICY_DIR, else the packaged one)"
    )] = None,
    budgets: Annotated[Path | None, typer.Option(
        help="Budgets file (default: AGENTLEDGER_BUDGETS, else none)")] = None,
    approvals: Annotated[Path | None, typer.Option(
        help="N-of-M approval rules file (default: AGENTLEDGER_APPROVALS, else none)")] = None,
    connectors: Annotated[str | None, typer.Option(
        help="Connectors and their options as JSON (default: AGENTLEDGER_CONNECTORS, else "
             "the demo's crm and billing)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON")] = False,
) -> None:
    """Check an allowlist, a policy set and the connectors together; exit 1 on any problem."""
    found = _Sources()
    try:
        options = (_OPTIONS.validate_json(connectors) if connectors is not None
                   else found.connectors)
    except ValidationError as exc:
        console.print(f"[red]--connectors[/red] is not {{name: {{option: value}}}} JSON: "
                      f"{exc.errors()[0]['msg']}", highlight=False)
        raise typer.Exit(2) from exc
    report = check_mod.check(allowlist or found.allowlist, policies or found.policy_dir,
                             plugins.configured(options, DEMO_CRM_URL),
                             budgets or found.budgets, approvals or found.approvals)
    if as_json:
        print(json.dumps({"ok": report.ok, **vars(report)}, indent=2, default=str))
    else:
        _render(report)
    raise typer.Exit(0 if report.ok else 1)


def _render(report: check_mod.Report) -> None:
    console.print(f"allowlist {report.allowlist_version}\npolicies  {report.policy_version}",
                  highlight=False)
    for name, c in sorted(report.connectors.items()):
        console.print(f"connector [bold]{name}[/bold]: {c['idempotency']}"
                      f"{' + lookup' if c['lookup'] else ''}"
                      f"{', fencing' if c['fencing'] else ''}; actions {', '.join(c['actions'])}",
                      highlight=False)
    console.print(f"budgets   {report.budgets_version}", highlight=False)
    for b in report.budgets:
        money = (f" {b['currency']} from {b['amount_argument']}" if b["unit"] == "amount"
                 else "")
        console.print(f"budget [bold]{b['name']}[/bold]: {b['limit']} {b['unit']}{money} per "
                      f"{b['scope']} per {b['window']} on "
                      f"{', '.join(b.get('actions') or ['every action'])}", highlight=False)
    for q in report.quorum_rules:
        above = (f" with {q['argument']} above {q['above']}" if q.get("argument") else "")
        console.print(f"approval rule [bold]{q['name']}[/bold]: {q['action']}{above} needs "
                      f"{q['required']} of {len(q['members'])} approvers of role {q['role']} "
                      f"(group {q['group']})"
                      + (f", escalated to {q['escalate_to']} after {q['escalate_after']}"
                         if q.get("escalate_to") else ""), highlight=False)
    for action, fields in sorted(report.narrow_rules.items()):
        for name, how in sorted(fields.items()):
            console.print(f"narrow rule [bold]{action}.{name}[/bold]: an approver may "
                          f"{'lower it' if how == 'decrease' else 'drop items'} ({how})",
                          highlight=False)
    if report.roles:
        table = Table(title="What a principal with one role gets (arguments not applied)")
        actions = sorted(report.actions)
        table.add_column("role")
        for action in actions:
            table.add_column(action)
        for role, effects in sorted(report.roles.items()):
            table.add_row(role, *(effects[a] for a in actions))
        console.print(table)
    for problem in report.problems:
        console.print(f"[red]problem[/red]: {problem}", highlight=False)
    console.print("[green]ok[/green]" if report.ok else
                  f"[red]{len(report.problems)} problem(s)[/red]")
