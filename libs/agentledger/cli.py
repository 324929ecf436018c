"""The ``agentledger`` command line: one front door for operators."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Annotated

import asyncpg
import typer
from rich.console import Console
from rich.markup import escape

from agentledger import (
    cli_approvals,
    cli_config,
    cli_connector,
    cli_eval,
    cli_mcp,
    cli_principals,
    errors,
    migrations,
    operators,
    settings,
)
from agentledger.audit import explain as audit_explain
from agentledger.executor import resolution
from agentledger.ledger import resolutions

app = typer.Typer(no_args_is_help=True, help="agentledger: crash-safe AI-agent side effects.")
console = Console()
_STACK = settings.REPO_ROOT / "deploy" / "local" / "stack.sh"


@app.command()
def migrate() -> None:
    """Apply pending database migrations."""
    cfg = settings.load()
    done = asyncio.run(migrations.migrate(cfg.database_url, cfg.migrations_dir))
    for m in done:
        console.print(f"applied [bold]{m.path.name}[/bold]")
    versions = asyncio.run(migrations.applied_versions(cfg.database_url))
    current = versions[-1][0] if versions else 0
    console.print(f"schema at version {current} ({len(done)} applied now)")


def _stack(verb: str) -> None:
    rc = subprocess.call(["bash", str(_STACK), verb])  # noqa: S603,S607 - our own script
    if rc:
        raise typer.Exit(rc)


@app.command()
def up() -> None:
    """Start Kafka and PostgreSQL as local processes (no Docker needed)."""
    _stack("up")


@app.command()
def down() -> None:
    """Stop the demo's services (if any), then the local Kafka and PostgreSQL."""
    from agentledger.demo import stack as demo_stack

    stopped = demo_stack.stop_all()
    if stopped:
        console.print(f"stopped the demo's services: {', '.join(stopped)}")
    _stack("down")


@app.command()
def status() -> None:
    """Show the demo's services, and whether the local Kafka and PostgreSQL answer."""
    from agentledger.demo import stack as demo_stack

    for name, pid, alive in demo_stack.running():
        console.print(f"demo {name:<17} pid {pid:<8} {'running' if alive else '[red]gone[/red]'}")
    _stack("status")


@app.command()
def demo(
    browser_hints: Annotated[bool, typer.Option(
        "--browser-hints/--no-browser-hints",
        help="Leave a refund pending and print the console sign-in")] = True,
    database: Annotated[str, typer.Option(
        envvar="AGENTLEDGER_DEMO_DATABASE", help="Demo ledger database (recreated)")
    ] = "agentledger_demo",
    namespace: Annotated[str, typer.Option(
        envvar="AGENTLEDGER_DEMO_NAMESPACE", help="Topic prefix of the demo")] = "demo",
    home: Annotated[Path, typer.Option(
        envvar="AGENTLEDGER_DEMO_HOME", help="Logs, pid files, keys and state")
    ] = settings.REPO_ROOT / ".local" / "demo",
) -> None:
    """Start every service as a real process and play eight narrated scenarios."""
    from agentledger.demo import launch, run

    run.main(launch.Options(home=home, database=database, prefix=namespace),
             browser_hints=browser_hints, console=console)


app.command("check-config")(cli_config.check_config)
app.add_typer(cli_connector.app, name="connector")
app.add_typer(cli_approvals.app, name="approvals")
app.add_typer(cli_principals.app, name="principals")
app.command("eval")(cli_eval.eval_command)
app.command("mcp")(cli_mcp.mcp)

reconcile_app = typer.Typer(no_args_is_help=True, help="Resolve commands whose outcome is unknown.")
app.add_typer(reconcile_app, name="reconcile")


async def _as_role(role: str) -> asyncpg.Connection:
    conn = await asyncpg.connect(settings.load().database_url)
    await conn.execute(f'SET ROLE "{role}"')
    return conn


async def _as_reconciler() -> asyncpg.Connection:
    return await _as_role("agentledger_reconciler")


@reconcile_app.command("list")
def reconcile_list(tenant: Annotated[uuid.UUID, typer.Option(help="Tenant id")]) -> None:
    """List a tenant's commands whose outcome is unknown."""

    async def run() -> list[dict[str, object]]:
        conn = await _as_reconciler()
        try:
            return await resolutions.unknown_commands(conn, tenant)
        finally:
            await conn.close()

    rows = asyncio.run(run())
    if not rows:
        console.print("no unknown commands")
    for r in rows:
        # One line per command, full ids: operators copy them into `reconcile resolve`.
        console.print(f"{r['operation_id']}  {r['action']}  connector={r['connector']}  "
                      f"target={r['resource_id']}  principal={r['principal_id']}  "
                      f"since={r['updated_at']:%Y-%m-%dT%H:%M:%SZ}  why={r['outcome_reason']}",
                      soft_wrap=True, highlight=False)


@reconcile_app.command("resolve")
def reconcile_resolve(
    operation_id: uuid.UUID,
    outcome: Annotated[str, typer.Option(help="succeeded or failed")],
    reason: Annotated[str, typer.Option(help="Why: what the operator checked")],
    token: cli_approvals.TokenOpt = "",
    tenant: Annotated[uuid.UUID | None, typer.Option(
        help="Tenant id (optional: the session's; refused if it is another)")] = None,
    receipt: Annotated[str | None, typer.Option(help="Provider receipt (for succeeded)")] = None,
    evidence: Annotated[str | None, typer.Option(help="Where the evidence is")] = None,
    override_acting_attempt: Annotated[bool, typer.Option(
        help="Resolve although an attempt sent less than 30 s ago may still act (its effect "
             "may land after this resolution; recorded in the reason and audit)")] = False,
    allow_unchecked: Annotated[bool, typer.Option(
        help="When the provider's lookup cannot answer (no answer, no credential, a key past "
             "its retention), record the resolution as unchecked instead of refusing it; a "
             "lookup that contradicts the resolution always refuses it")] = False,
) -> None:
    """Resolve an unknown command as succeeded (with the provider's receipt) or failed.

    You are the resolver: your session token's principal, a current operator in the principal
    directory. The outcome is checked with the connector's lookup where it has one and recorded
    as confirmed, or as unchecked where the provider cannot be asked.
    """
    if outcome not in ("succeeded", "failed"):
        raise typer.BadParameter("outcome is succeeded or failed")
    cfg = operators.OperatorSettings()

    async def run() -> resolution.Resolved:
        session = operators.verify(token, cfg, tenant_id=tenant)
        async with contextlib.AsyncExitStack() as stack:
            connectors = cfg.connectors()
            for connector in connectors.values():
                stack.push_async_callback(connector.aclose)
            conn = await _as_reconciler()
            stack.push_async_callback(conn.close)
            # The directory is read as the auditor: the reconciler role cannot read it.
            directory = await _as_role("agentledger_auditor")
            stack.push_async_callback(directory.close)
            return await resolution.resolve(
                conn, directory, session, operation_id, outcome=outcome,  # type: ignore[arg-type]
                reason=reason, receipt=receipt, evidence=evidence,
                connectors=connectors, credentials=cfg.credentials(),
                override_acting=override_acting_attempt, allow_unchecked=allow_unchecked)

    try:
        done = asyncio.run(run())
    except errors.AgentLedgerError as exc:
        console.print(f"[red]{exc.code}[/red]: {escape(exc.message)}", highlight=False)
        raise typer.Exit(2) from exc
    console.print(f"resolved {operation_id} as {outcome} by {done.resolved_by}, "
                  f"{done.check.check}: {escape(done.check.detail)} "
                  f"(resolution {done.resolution_id})", highlight=False)


@app.command("explain")
def explain_cmd(
    operation_id: uuid.UUID,
    tenant: Annotated[uuid.UUID, typer.Option(help="Tenant id")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """What was proposed, permitted, attempted and is known for one operation (audit ledger)."""

    async def run() -> audit_explain.Explanation:
        conn = await asyncpg.connect(settings.load().database_url)
        try:
            await conn.execute("SET ROLE agentledger_auditor")
            return await audit_explain.explain(conn, tenant, operation_id)
        finally:
            await conn.close()

    try:
        found = asyncio.run(run())
    except errors.AgentLedgerError as exc:
        console.print(f"[red]{exc.code}[/red]: {exc.message}")
        raise typer.Exit(2) from exc
    if as_json:
        console.print_json(found.model_dump_json())
        return
    render_explanation(found)


def render_explanation(found: audit_explain.Explanation) -> None:
    """The four answers, for a person."""
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
    console.print("[bold]attempted[/bold]")
    if not found.attempted:
        console.print("  nothing was attempted")
    for t in found.attempted:
        console.print(f"  {t.started_at}  {t.kind:<8} worker={t.worker_id} "
                      f"generation={t.fencing_generation} → {t.result} {t.detail or ''}",
                      highlight=False)
    console.print(f"[bold]known[/bold]     state={k.state} receipt={k.receipt} "
                  f"reason={k.reason}", highlight=False)
    for r in k.reconciliations:
        console.print(f"  reconciled {r.outcome} by {r.resolved_by} at {r.resolved_at}: "
                      f"{r.reason} (evidence: {r.evidence})", highlight=False)
    console.print(f"[dim]{len(found.timeline)} audit events[/dim]")


@app.command("bench")
def bench_cmd() -> None:
    """Run the benchmark (the repository's bench/ package) and write bench/results/latest.*."""
    if not (settings.REPO_ROOT / "bench" / "__main__.py").exists():
        console.print("[red]bench/ is not here[/red]: run this from a checkout of agentledger")
        raise typer.Exit(2)
    rc = subprocess.call([sys.executable, "-m", "bench"], cwd=settings.REPO_ROOT)
    raise typer.Exit(rc)


def main() -> None:
    app(prog_name="agentledger")


if __name__ == "__main__":
    main()
