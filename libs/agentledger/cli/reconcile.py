"""``agentledger reconcile``: list and resolve commands whose outcome is unknown."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Annotated

import asyncpg
import typer
from rich.console import Console
from rich.markup import escape

from agentledger import db, errors, operators, settings
from agentledger.audit import explain as audit_explain
from agentledger.cli import approvals, group
from agentledger.executor import resolution
from agentledger.ledger import resolutions

app = typer.Typer(cls=group.Group, no_args_is_help=True,
                  help="Resolve commands whose outcome is unknown.")
console = Console()


async def _as_role(role: str) -> asyncpg.Connection:
    return await db.connect(settings.load().database_url, role=role)


async def _as_reconciler() -> asyncpg.Connection:
    return await _as_role("agentledger_reconciler")


@app.command("list")
def list_unknown(tenant: Annotated[uuid.UUID, typer.Option(help="Tenant id")]) -> None:
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


async def _already(token: str, tenant: uuid.UUID | None, operation_id: uuid.UUID, outcome: str,
                   receipt: str | None, cfg: operators.OperatorSettings) -> bool:
    """Whether the ledger already records this resolution (same outcome, same receipt): then
    the command says so and succeeds, as a replayed request does (R3.3); else it refuses."""
    session = operators.verify(token, cfg, tenant_id=tenant)
    conn = await _as_role("agentledger_auditor")
    try:
        found = await audit_explain.explain(conn, session.tenant_id, operation_id)
    finally:
        await conn.close()
    done = [r for r in found.known.reconciliations if r.outcome == outcome]
    if not done or found.known.state != outcome or (
            outcome == "succeeded" and found.known.receipt != receipt):
        return False
    console.print(f"already resolved: {operation_id} is {outcome} (receipt "
                  f"{escape(str(found.known.receipt))}), resolved by {escape(done[-1].resolved_by)}"
                  f" at {done[-1].resolved_at}; nothing changed", highlight=False)
    return True


@app.command("resolve")
def resolve(
    operation_id: uuid.UUID,
    outcome: Annotated[str, typer.Option(help="succeeded or failed")],
    reason: Annotated[str, typer.Option(help="Why: what the operator checked")],
    token: approvals.TokenOpt = "",
    tenant: Annotated[uuid.UUID | None, typer.Option(
        help="Tenant id (optional: the session's; refused if it is another)")] = None,
    receipt: Annotated[str | None, typer.Option(help="Provider receipt (for succeeded)")] = None,
    evidence: Annotated[str | None, typer.Option(help="Where the evidence is")] = None,
    override_acting_attempt: Annotated[bool, typer.Option(
        help="Resolve although an attempt sent less than 30 s ago may still act (its effect "
             "may land after this resolution; recorded in the reason and audit)")] = False,
    allow_unchecked: Annotated[bool, typer.Option(
        help="When the provider's lookup cannot answer (no answer, no credential, a key past "
             "its retention) or its fence cannot be advanced, record the resolution as "
             "unchecked (provisional) instead of refusing it; a lookup that contradicts the "
             "resolution always refuses it")] = False,
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
    except errors.InvalidTransition:
        # Typed again (a lost terminal, a pasted line): what it asks for may already be so.
        if not asyncio.run(_already(token, tenant, operation_id, outcome, receipt, cfg)):
            raise
        return
    console.print(f"resolved {operation_id} as {outcome} by {done.resolved_by}, "
                  f"{done.check.check}: {escape(done.check.detail)} "
                  f"(resolution {done.resolution_id})", highlight=False)
    if done.provisional:
        console.print(f"[yellow]provisional[/yellow]: {escape(done.provisional)}; if the "
                      "provider later answers otherwise the command is flagged contradicted "
                      "(docs/operations.md#contradicted-outcomes)", highlight=False)
