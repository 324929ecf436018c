"""``agentledger demo``: bring the world up, play the scenarios, explain, leave it running."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import typer
from rich.console import Console
from rich.markup import escape

from agentledger import db, errors, settings
from agentledger.audit import explain as audit_explain
from agentledger.cli import explain as cli_explain
from demo import launch, scenarios, stack, stories_adoption

INTRO = (
    "A model may only PROPOSE an action. Ingress signs who asked, admission checks the "
    "allowlist, the tenant and the policy and admits the command once into the Postgres "
    "ledger, the relay carries it to Kafka, an executor performs it on the CRM. Below, eight "
    "stories on real processes (the last three: your own connector, e-mail to a real SMTP "
    "server; an MCP client; a REST API declared, not coded); after each, what the ledger, "
    "the CRM's effect log and the mail server say."
)


def _explain(world: launch.World, console: Console) -> None:
    ops = world.operations
    budget = ops.get("budget", {})
    shown = [("1 · note", ops.get("note")), ("2 · approved refund", ops.get("approved_refund")),
             ("3 · lost refund", ops.get("lost_refund")),
             ("5 · budget, admitted step", (budget.get("admitted") or [None])[0])]
    console.rule("[bold]What is known, per operation: agentledger explain")
    for title, op in shown:
        _explain_one(world, console, title, op)
    for op in budget.get("refused", [])[:1]:
        console.print(f"[bold]5 · budget, refused step[/bold] {op}: never admitted, so explain "
                      "shows only its audit event:", highlight=False)
        for event in asyncio.run(_audit(world, op)):
            console.print(f"  {event['type']}  {json.dumps(event['payload'])}", highlight=False,
                          markup=False)
    _explain_one(world, console, "6 · e-mail whose answer was lost", ops.get("email_lost"))
    console.print("[bold]4 · injection[/bold]: nothing to explain — all three were refused "
                  "before admission wrote anything (no command, no approval, no effect).")


def _explain_one(world: launch.World, console: Console, title: str, op: str | None) -> None:
    if op is None:
        return
    console.print(f"[bold]{title}[/bold]  $ agentledger explain {op} --tenant {world.tenant}",
                  highlight=False)
    try:
        found = asyncio.run(_explanation(world, op))
    except errors.AgentLedgerError as exc:
        console.print(f"[red]{exc.code}[/red]: {escape(exc.message)}", highlight=False)
        return
    cli_explain.render(found, console, settings.load().traces_url)


async def _explanation(world: launch.World, op: str) -> audit_explain.Explanation:
    """What ``agentledger explain`` answers, read the same way: as the auditor."""
    conn = await db.connect(world.database_url, role="agentledger_auditor")
    try:
        return await audit_explain.explain(conn, world.tenant, uuid.UUID(op))
    finally:
        await conn.close()


async def _audit(world: launch.World, op: str) -> list[dict[str, Any]]:
    conn = await asyncpg.connect(world.database_url)
    try:
        rows = await conn.fetch("SELECT type, payload FROM audit_event WHERE operation_id = $1"
                                " ORDER BY seq", uuid.UUID(op))
    finally:
        await conn.close()
    return [{"type": r["type"], "payload": json.loads(r["payload"])} for r in rows]


def _finish(world: launch.World, console: Console, started: float, browser_hints: bool
            ) -> None:
    console.rule("[bold]The stack is still running")
    home = world.home
    console.print(f"  ingress  {world.ingress_url}     console  {world.console_url}     "
                  f"CRM  {world.crm_url}", highlight=False)
    console.print(f"  ledger   {world.database_url}", highlight=False)
    console.print(f"  mailpit  {world.mailpit_url} (the e-mails sent)     "
                  f"mcp  {world.mcp_url}", highlight=False)
    console.print(f"  topics   {world.namespace}*  on {world.bootstrap}", highlight=False)
    console.print(f"  logs     {home}/logs/     state (ids, tokens): {home}/state.json",
                  highlight=False)
    if browser_hints:
        console.print(
            f"\n  [bold]Try the approval console[/bold]: open {world.console_url}/signin and "
            "paste bob's session token (an approver of tenant Acme); a 120.00 EUR refund is "
            f"waiting for you:\n\n{world.tokens['user:bob']}\n", highlight=False, soft_wrap=True)
        console.print(f"  or from a shell:  AGENTLEDGER_CONSOLE_URL={world.console_url} "
                      f"AGENTLEDGER_TOKEN=<that token> agentledger approvals list",
                      highlight=False)
    console.print("\n  Stop the demo's services:  [bold]agentledger down[/bold] (also stops "
                  "Kafka and PostgreSQL) or [bold]make down[/bold]", highlight=False)
    console.print(f"  demo finished in {time.monotonic() - started:.0f} s", highlight=False)


async def _play(world: launch.World, console: Console, browser_hints: bool) -> None:
    await scenarios.play(world, console, browser_hints=browser_hints)
    await stories_adoption.play(world, console)


def main(*, browser_hints: bool = True, database: str = "agentledger_demo",
         namespace: str = "demo", home: Path = stack.HOME, console: Console | None = None
         ) -> None:
    """Run the demo; exits non-zero with the fix to try when a step fails."""
    opts = launch.Options(home=home, database=database, prefix=namespace)
    out = console or Console()
    started = time.monotonic()
    out.rule("[bold]agentledger demo")
    out.print(INTRO, highlight=False)
    try:
        with out.status("starting…", spinner="dots") as status:
            def step(text: str) -> None:
                status.update(f"{text}…")
                out.print(f"  [dim]· {escape(text)}[/dim]", highlight=False)

            world = launch.launch(opts, step)
        out.print(f"  [dim]· everything up in {time.monotonic() - started:.0f} s[/dim]",
                  highlight=False)
        # The operator's steps (reconcile, explain) run in this process, on the demo ledger,
        # verifying sessions with the demo identity provider's keys.
        os.environ["AGENTLEDGER_DATABASE_URL"] = world.database_url
        os.environ.update(world.operator_env)
        asyncio.run(_play(world, out, browser_hints))
        _explain(world, out)
    except stack.DemoError as exc:
        out.print(f"[red]demo failed[/red]: {escape(str(exc))}", highlight=False)
        if exc.fix:
            out.print(f"[yellow]try[/yellow]: {escape(exc.fix)}", highlight=False)
        raise typer.Exit(1) from exc
    except (TimeoutError, RuntimeError, AssertionError, errors.AgentLedgerError) as exc:
        out.print(f"[red]demo failed[/red]: {escape(str(exc) or type(exc).__name__)}",
                  highlight=False)
        out.print(f"[yellow]try[/yellow]: read the service logs in {opts.home}/logs; "
                  "`agentledger status` shows what runs, `agentledger down` stops it",
                  highlight=False)
        raise typer.Exit(1) from exc
    _finish(world, out, started, browser_hints)
